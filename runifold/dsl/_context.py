"""The workflow context and the binding between workflow code and its driver.

Workflow code receives a :class:`WorkflowContext`. Steps and effects find the
run they belong to through a context variable (an internal detail) holding a
*binding*: the driver executing the run plus the *scope* of the calling task.

A scope is a task's lineage in the workflow: the root task has scope ``""``,
and the i-th task created from scope ``s`` has scope ``f"{s}{i}/"``. Call keys
are ``f"{scope}{id}#{occurrence}"``, so concurrent branches (``asyncio.gather``)
get the same keys on every replay however their I/O interleaves.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import random
import uuid as uuid_module
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, NoReturn, Protocol, TypeVar, final

import msgspec

from runifold.dsl._definition import WORKFLOW_ATTR, EffectSpec, StepSpec, WorkflowSpec, check_signal_name
from runifold.errors import ChildFailedError, ConfigurationError, OutsideWorkflowError, SerializationError
from runifold.history import RunCancelled, RunCompleted, RunFailed, child_signal, convert, decode_event

R = TypeVar("R")


class Scope:
    """A task lineage with its own occurrence counters."""

    __slots__ = ("_children", "_counters", "path")

    def __init__(self, path: str = "") -> None:
        self.path = path
        self._children = 0
        self._counters: dict[str, int] = {}

    def peek(self, call_id: str) -> str:
        """Return the key the next call of ``call_id`` in this scope will get (without taking it)."""
        return f"{self.path}{call_id}#{self._counters.get(call_id, 0) + 1}"

    def key(self, call_id: str) -> str:
        """Return the next key for ``call_id`` in this scope."""
        n = self._counters.get(call_id, 0) + 1
        self._counters[call_id] = n
        return f"{self.path}{call_id}#{n}"

    def child(self) -> Scope:
        """Return the scope of the next task created from this one."""
        self._children += 1
        return Scope(f"{self.path}{self._children}/")

    def reserve(self, count: int) -> int:
        """Take the numbers of the next ``count`` tasks created from this one at once; return the last one before."""
        base = self._children
        self._children += count
        return base

    def child_at(self, number: int) -> Scope:
        """Return the scope of the task numbered ``number`` (one that :meth:`reserve` took)."""
        return Scope(f"{self.path}{number}/")


class Driver(Protocol):
    """What executes a run's calls: the live worker or the debug replayer."""

    run_id: str
    checkpoint_id: str | None

    def call_step(self, spec: StepSpec, scope: Scope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Awaitable[Any]: ...

    def call_effect(self, spec: EffectSpec, scope: Scope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Awaitable[Any]: ...

    def record_value(self, scope: Scope, kind: str, make: Callable[[], Any]) -> Any: ...

    def charge(self, scope: Scope, units: float) -> None: ...

    async def sleep(self, scope: Scope, delay: float | None, until: float | None) -> None: ...

    def timer(self, scope: Scope, delay: float, fire: Callable[[], None]) -> Callable[[], None]: ...

    async def wait_signal(self, scope: Scope, name: str, timeout: float | None, type_: Any) -> Any: ...

    async def start_child(self, scope: Scope, workflow: Any, input: Mapping[str, Any], version: int | None,
                          checkpoint_id: str | None) -> tuple[str, str]: ...

    def store_time(self) -> float: ...

    async def unfit(self, what: str, plain: Any, returns: Any, exc: SerializationError) -> NoReturn: ...

    #: per child run id, the end of the child (the last event the store posted) as ``result()`` calls share it
    child_ends: dict[str, asyncio.Future[Any]]


class Binding:
    """The driver and scope of the task running workflow code."""

    __slots__ = ("driver", "scope")

    def __init__(self, driver: Driver, scope: Scope) -> None:
        self.driver = driver
        self.scope = scope


current: contextvars.ContextVar[Binding | None] = contextvars.ContextVar("runifold_binding", default=None)


def _binding() -> Binding:
    binding = current.get()
    if binding is None:
        raise OutsideWorkflowError(
            "this WorkflowContext method was called outside the workflow's own tasks; call it "
            "from workflow code, not from inside a step or effect body"
        )
    return here(binding)


def here(binding: Binding) -> Binding:
    """The binding a call made now uses: a callback's calls (a done callback, a timer's) get a scope of their own.

    invariant: a scope is one task's sequence of calls; a callback runs between the steps of the task whose
    context it carries, so its calls in that task's scope would interleave with the task's. It gets the next
    child scope instead, as a task created there would, at the same point on every replay.
    """
    if asyncio.current_task() is None:
        return Binding(binding.driver, binding.scope.child())
    return binding


@final
class WorkflowContext:
    """Passed to every workflow as its first argument.

    Everything here is deterministic on replay: ``now()``, ``uuid()`` and
    ``random()`` return the values recorded the first time, and waits resume
    from the log rather than from a sleeping process.
    """

    __slots__ = ("_driver",)

    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self._driver.run_id

    @property
    def checkpoint_id(self) -> str | None:
        """The caller's durable identity of the run, if it gave one."""
        return self._driver.checkpoint_id

    def now(self) -> datetime:
        """Return the current time (store clock, UTC), recorded for replay."""
        b = _binding()
        value = b.driver.record_value(b.scope, "now", b.driver.store_time)
        return datetime.fromtimestamp(float(value), UTC)

    def uuid(self) -> uuid_module.UUID:
        """Return a random UUID, recorded for replay."""
        b = _binding()
        return uuid_module.UUID(b.driver.record_value(b.scope, "uuid", lambda: str(uuid_module.uuid4())))

    def random(self) -> float:
        """Return a random float in [0, 1), recorded for replay."""
        b = _binding()
        return float(b.driver.record_value(b.scope, "random", random.random))

    def charge(self, units: float) -> None:
        """Charge ``units`` of cost to the run's budget (counted once, never on replay).

        A charge that would exceed the budget's ``max_cost_units`` fails the run there: nothing is raised into
        workflow code, and nothing it calls after the charge runs or is recorded.

        Raises:
            ConfigurationError: ``units`` is not a finite number >= 0 (usage only grows).
        """
        if isinstance(units, bool) or not isinstance(units, (int, float)) or not math.isfinite(units) or units < 0:
            raise ConfigurationError(f"ctx.charge takes a finite number of cost units >= 0 (usage only grows), "
                                     f"got {units!r}")
        b = _binding()
        b.driver.charge(b.scope, float(units))

    async def sleep(self, delay: timedelta) -> None:
        """Suspend the run for ``delay``; no process waits meanwhile."""
        if not isinstance(delay, timedelta):
            raise ConfigurationError(f"ctx.sleep takes a timedelta (e.g. timedelta(seconds=5)), got {delay!r}")
        b = _binding()
        await b.driver.sleep(b.scope, delay.total_seconds(), None)

    async def sleep_until(self, when: datetime) -> None:
        """Suspend the run until ``when`` (an aware datetime) on the store's clock."""
        if when.tzinfo is None:
            raise ConfigurationError("sleep_until needs an aware datetime, e.g. datetime.now(UTC)")
        b = _binding()
        await b.driver.sleep(b.scope, None, when.timestamp())

    async def wait_signal(self, name: str, timeout: timedelta | None = None, *, type: Any = Any) -> Any:
        """Suspend until signal ``name`` arrives; return its payload, converted to ``type`` if given.

        ``type`` may be anything a step may return (a msgspec Struct, a dataclass,
        a pydantic model, ``dict[str, int]``...); without it the payload is plain JSON.

        Raises:
            WaitTimeoutError: when ``timeout`` passes first (also on replay).
            SerializationError: the payload does not fit ``type`` (also on replay);
                the signal is consumed.
        """
        check_signal_name(name)
        if timeout is not None and not isinstance(timeout, timedelta):
            raise ConfigurationError(f"wait_signal's timeout is a timedelta (e.g. timedelta(days=2)), got {timeout!r}")
        b = _binding()
        seconds = None if timeout is None else timeout.total_seconds()
        return await b.driver.wait_signal(b.scope, name, seconds, type)

    async def start_child(
        self, workflow: Callable[..., Awaitable[R]] | str, input: Mapping[str, Any] | None = None, *,
        version: int | None = None, checkpoint_id: str | None = None,
    ) -> ChildHandle[R]:
        """Start ``workflow`` as a child run of this one; return a handle to await its result.

        The child is a run of its own (any worker may run it), pinned to the
        workflow's version (or ``version``, with a name). Its checkpoint id is
        derived from this run and the call, so a replay never starts a second
        child; pass ``checkpoint_id`` to choose it yourself. Cancelling this run
        cancels its unfinished children.

        A ``checkpoint_id`` that names another run fails this run with ``EnqueueConflictError`` (not raised here:
        nothing records a refused start, so a replay could not raise it again at this call).

        Raises:
            InvalidInputError: the input does not fit the child workflow's parameters.
            SerializationError: the input holds a value that cannot be recorded.
        """
        if input is not None and not isinstance(input, Mapping):
            raise ConfigurationError(f"start_child takes the child's input as a dict of its parameters, got {input!r}")
        b = _binding()
        spec = getattr(workflow, WORKFLOW_ATTR, None)
        # before the start: a result no value could be decoded to is refused before the child exists (helper-99)
        returns = spec.returns.get() if isinstance(spec, WorkflowSpec) else Any
        run_id, child_checkpoint = await b.driver.start_child(b.scope, workflow, dict(input or {}), version,
                                                              checkpoint_id)
        return ChildHandle(run_id, child_checkpoint, returns)

    async def run_child(
        self, workflow: Callable[..., Awaitable[R]] | str, input: Mapping[str, Any] | None = None, *,
        version: int | None = None, checkpoint_id: str | None = None,
    ) -> R:
        """Start ``workflow`` as a child run and wait for its result (see :meth:`start_child`).

        Raises:
            ChildFailedError: the child failed or was cancelled.
        """
        handle = await self.start_child(workflow, input, version=version, checkpoint_id=checkpoint_id)
        return await handle.result()


class _WaitAgain(Exception):
    """The wait for a child's end that other ``result()`` calls shared was cancelled before the end came."""


@final
class ChildHandle(Generic[R]):
    """A child run started with ``ctx.start_child``."""

    __slots__ = ("_returns", "checkpoint_id", "run_id")

    def __init__(self, run_id: str, checkpoint_id: str, returns: Any) -> None:
        self.run_id = run_id
        self.checkpoint_id = checkpoint_id
        self._returns = returns

    def __repr__(self) -> str:
        return f"ChildHandle({self.run_id!r})"

    async def result(self) -> R:
        """Wait (durably: the run suspends) until the child finishes; return its output, typed.

        Awaited again, by several tasks at once, or through another handle of the same child (started twice with
        one ``checkpoint_id``), it returns the same output or raises the same error: a run takes its child's end
        once, and every ``result()`` shares it.

        A result that does not fit the type this code annotates (the child workflow's return type changed
        while the child ran) makes the run diverge, as a step's recorded result that no longer fits does.

        Raises:
            ChildFailedError: the child failed or was cancelled.
        """
        b = _binding()
        ends = b.driver.child_ends
        while True:
            shared = ends.get(self.run_id)
            if shared is not None:  # another result() waits for this child, or got its end
                try:
                    last = await asyncio.shield(shared)
                except _WaitAgain:  # that wait was cancelled before the end came: wait afresh
                    continue
                break
            # invariant: one wait per child run is open at a time and its end is taken once: a second wait for
            # the child's end would wait for ever, since the store posts that end to the parent once
            shared = ends[self.run_id] = asyncio.get_running_loop().create_future()
            try:
                last = await b.driver.wait_signal(b.scope, child_signal(self.run_id), None, Any)
            except BaseException:
                del ends[self.run_id]
                shared.set_exception(_WaitAgain())
                shared.exception()  # (retrieved: nobody need be waiting on it)
                raise
            shared.set_result(last)
            break
        event = decode_event(msgspec.json.encode(last), where=f"the last event of child run {self.run_id}")
        match event:
            case RunCompleted(output=output):
                what = f"the result of child run {self.run_id}"
                try:
                    value: R = convert(output, self._returns, what=what)
                except SerializationError as exc:
                    # the child's code recorded it, so it fitted the child's return type: today's annotation differs
                    # (the child's workflow changed under the parent); the run diverges, it does not fail
                    await b.driver.unfit(what, output, self._returns, exc)
                return value
            case RunFailed(reason=reason, error_type=error_type):
                raise ChildFailedError(self.run_id, "failed", reason, error_type)
            case RunCancelled(by=by, reason=reason):
                raise ChildFailedError(self.run_id, "cancelled", f"cancelled by {by}: {reason}")
            case _:
                raise ChildFailedError(self.run_id, "ended", f"unexpected last event {type(event).__name__}")
