"""The replay debugger: re-run a stored history against today's code, with no writes and no live bodies.

Every call is answered from the history alone. Where the history ends (a wait
not yet resolved, a step in flight), replay stops; where code and history part,
the report names the first diverging key. This is what ``runifold replay`` runs,
and the compatibility check before a deploy.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runifold.dsl import WorkflowContext, WorkflowDefinition
from runifold.dsl._context import Binding, Scope, current
from runifold.dsl._definition import EffectSpec, StepSpec
from runifold.errors import (
    EffectFailedError,
    NondeterminismError,
    RunifoldError,
    SerializationError,
    StepFailedError,
    WaitTimeoutError,
)
from runifold.history import (
    CallKind,
    Done,
    Entry,
    Failed,
    Replayer,
    RunCompleted,
    TimerDone,
    ValueRecorded,
    WaitReceived,
    WaitTimedOut,
    convert,
    decode_event,
    effect_state,
    step_state,
    timer_state,
    to_plain,
    wait_state,
)
from runifold.stores import RunStatus, WorkflowStore
from runifold.worker._registry import WorkflowRegistry, bind_input
from runifold.worker._scope import install_scoped_task_factory


class _EndOfHistory(BaseException):
    """The code reached a call the history has no outcome for."""

    def __init__(self, key: str) -> None:
        self.key = key


@dataclass
class ReplayReport:
    """What a debug replay found."""

    run_id: str
    steps: list[tuple[str, str]] = field(default_factory=list)  # (key, what history answered)
    stopped_at: str | None = None
    finished: bool = False
    result: Any = None
    divergence: NondeterminismError | None = None

    @property
    def clean(self) -> bool:
        """True when code and history agree as far as the history goes."""
        return self.divergence is None

    def raise_for_divergence(self) -> None:
        """Raise the :class:`NondeterminismError` found, if any."""
        if self.divergence is not None:
            raise self.divergence


class _DebugDriver:
    def __init__(self, run_id: str, checkpoint_id: str | None, replayer: Replayer, report: ReplayReport) -> None:
        self.run_id = run_id
        self.checkpoint_id = checkpoint_id
        self.replayer = replayer
        self.report = report
        self.tasks: set[asyncio.Future[Any]] = set()
        self.time = replayer.started_at

    def track(self, task: asyncio.Future[Any]) -> None:
        self.tasks.add(task)

    def store_time(self) -> float:
        return self.time

    def _visit(self, key: str, kind: CallKind, scope: Scope) -> list[Any]:
        try:
            return self.replayer.visit(key, kind)
        except NondeterminismError as exc:
            if self.report.divergence is None:
                self.report.divergence = exc
            raise _EndOfHistory(key) from None

    def _end(self, key: str) -> _EndOfHistory:
        if self.report.stopped_at is None:
            self.report.stopped_at = key
        return _EndOfHistory(key)

    def _value(self, key: str, value: Any, type_: Any) -> Any:
        try:
            out = convert(value, type_, what=key)
        except SerializationError as exc:
            self.report.divergence = NondeterminismError(key, "a value of another type", repr(type_), str(exc))
            raise _EndOfHistory(key) from None
        self.report.steps.append((key, "replayed"))
        return out

    async def call_step(self, spec: StepSpec, scope: Scope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = scope.key(spec.id)
        match step_state(self._visit(key, CallKind.STEP, scope)):
            case Done(output=output):
                return self._value(key, output, spec.returns.get())
            case Failed(error=error, attempts=attempts):
                self.report.steps.append((key, "failed"))
                raise StepFailedError(key, error, attempts)
            case _:
                raise self._end(key)

    async def call_effect(self, spec: EffectSpec, scope: Scope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = scope.key(spec.id)
        match effect_state(self._visit(key, CallKind.EFFECT, scope)):
            case Done(output=output):
                return self._value(key, output, spec.returns.get())
            case Failed(error=error):
                self.report.steps.append((key, "failed"))
                raise EffectFailedError(key, error)
            case _:
                raise self._end(key)

    def record_value(self, scope: Scope, kind: str, make: Callable[[], Any]) -> Any:
        key = scope.key(kind)
        events = self._visit(key, CallKind.VALUE, scope)
        if not events or not isinstance(events[0], ValueRecorded):
            raise self._end(key)
        return events[0].value

    def charge(self, scope: Scope, units: float) -> None:
        key = scope.key("charge")
        if not self._visit(key, CallKind.CHARGE, scope):
            raise self._end(key)

    async def sleep(self, scope: Scope, delay: float | None, until: float | None) -> None:
        key = scope.key("sleep")
        if not isinstance(timer_state(self._visit(key, CallKind.TIMER, scope)), TimerDone):
            raise self._end(key)
        self.report.steps.append((key, "timer fired"))

    async def wait_signal(self, scope: Scope, name: str, timeout: float | None) -> Any:
        key = scope.key(f"wait.{name}")
        match wait_state(self._visit(key, CallKind.SIGNAL, scope)):
            case WaitReceived(payload=payload):
                self.report.steps.append((key, "signal received"))
                return payload
            case WaitTimedOut():
                self.report.steps.append((key, "wait timed out"))
                raise WaitTimeoutError(key, name)
            case _:
                raise self._end(key)


async def _call(definition: WorkflowDefinition, ctx: WorkflowContext, kwargs: dict[str, Any]) -> Any:
    return await definition.fn(ctx, **kwargs)


async def replay(definition: WorkflowDefinition, run_id: str, history: Sequence[Entry]) -> ReplayReport:
    """Replay ``history`` against ``definition``'s code; never writes, never runs a body."""
    install_scoped_task_factory(asyncio.get_running_loop())
    replayer = Replayer(history)
    report = ReplayReport(run_id)
    driver = _DebugDriver(run_id, replayer.started.checkpoint_id, replayer, report)
    try:
        kwargs = bind_input(definition, dict(replayer.started.input))
    except RunifoldError as exc:
        report.divergence = NondeterminismError("(input)", "the recorded input", "a signature it does not fit", str(exc))
        return report
    root_ctx = contextvars.copy_context()
    root_ctx.run(current.set, Binding(driver, Scope()))
    root: asyncio.Task[Any] = asyncio.Task(_call(definition, WorkflowContext(driver), kwargs), context=root_ctx)
    driver.track(root)
    await asyncio.wait({root})
    for _ in range(64):  # let concurrent branches replay what they can
        await asyncio.sleep(0)
    for task in driver.tasks:
        task.cancel()
    await asyncio.gather(*driver.tasks, return_exceptions=True)
    raised = None if root.cancelled() else root.exception()
    if report.divergence is None:
        try:
            replayer.check_all_visited(f"the end of replay at {report.stopped_at or 'the return'}")
        except NondeterminismError as err:
            report.divergence = err
    if report.divergence is None and raised is None and not root.cancelled():
        report.finished = True
        report.result = root.result()
        recorded = [e.event for e in history if isinstance(e.event, RunCompleted)]
        if recorded and recorded[0].output != to_plain(report.result, what="the workflow's return value"):
            report.divergence = NondeterminismError(
                "(result)", f"result {recorded[0].output!r}", f"result {report.result!r}")
    return report


async def replay_run(store: WorkflowStore, registry: WorkflowRegistry, run_ref: str) -> ReplayReport:
    """Replay one stored run against the registry's definition of its exact version.

    Raises:
        UnknownWorkflowError: the registry lacks the run's ``(name, version)``.
    """
    info = await store.get_run(run_ref)
    definition = registry.definition_for(info.name, info.version)
    history = [Entry(e.seq, e.at, decode_event(e.body, where=f"{info.run_id}#{e.seq}")) for e in await store.history(info.run_id)]
    return await replay(definition, info.run_id, history)


async def check_compatibility(
    store: WorkflowStore, registry: WorkflowRegistry, *, name: str | None = None, limit: int = 100_000
) -> list[ReplayReport]:
    """Replay every unfinished run (of ``name``, or of every registered name) against today's code.

    The check before a deploy: a report that is not ``clean`` names a run whose
    history the new code cannot continue. A run whose version is not
    registered is reported as diverging at ``(definition)``.
    """
    names = [name] if name else sorted(registry.names())
    reports = []
    for workflow_name in names:
        for status in (RunStatus.READY, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.PARKED):
            for info in await store.list_runs(status=status, name=workflow_name, limit=limit):
                if registry.get(info.name, info.version) is None:
                    report = ReplayReport(info.run_id)
                    report.divergence = NondeterminismError(
                        "(definition)", f"version {info.version}", f"registered versions {registry.versions()}")
                    reports.append(report)
                    continue
                reports.append(await replay_run(store, registry, info.run_id))
    return reports
