"""The state of one run's execution that both halves of the driver share: its calls, usage and lease."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runifold.dsl._definition import EffectSpec, StepSpec
from runifold.errors import EffectFailedError, NondeterminismError, StepFailedError
from runifold.history import CHILD_SIGNAL_PREFIX, AnyEvent, CallCancelled, CallKind, ChildStarted
from runifold.stores import Lease, WorkflowStore


@dataclass(eq=False, slots=True)
class Call:
    """One durable call of the workflow, from its registration until workflow code has its outcome."""

    key: str
    kind: CallKind
    future: asyncio.Future[Any]
    returns: Any = Any
    spec: StepSpec | EffectSpec | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = ""  # the signal a wait is for
    attempt: int = 1
    #: not before (a retry, a timer) or the deadline (a signal wait), on the store's clock
    due: float | None = None
    parked: str | None = None  # an ambiguous effect: why
    in_doubt: bool = False  # an effect started and its outcome is unknown
    recovering: bool = False  # ... and the attempt was made before this execution
    busy: bool = False  # a body, a reconcile or the commit of effect_started is under way
    body: asyncio.Task[Any] | None = None  # the task running the body, when it runs as one
    began: bool = False  # the body of this attempt began (the lease held when it was about to run)
    cancelled: bool = False  # workflow code stopped waiting for it: its outcome is dropped, never recorded
    error: str = ""  # the last failed attempt's error, while a retry waits
    unknown: bool = False  # an effect's last attempt had an unknown outcome (a REPEAT waits to try again)


@dataclass
class Usage:
    steps: int
    effect_attempts: int
    retries: int
    cost_units: float


@dataclass
class ReplayReport:
    """What a debug replay found.

    ``steps`` lists each recorded outcome in the order it was handed to the
    workflow: ``(key, what)``, with ``what`` one of ``replayed``, ``failed``,
    ``resolved by <who> (applied|fail)`` (an effect an operator settled),
    ``timer fired``, ``signal received``, ``wait timed out``, ``child <run id> started``.
    """

    run_id: str
    steps: list[tuple[str, str]] = field(default_factory=list)
    stopped_at: str | None = None
    finished: bool = False
    result: Any = None
    error: str | None = None
    divergence: NondeterminismError | None = None
    #: an operator cancelled the run: the replay ends where its history does (``error`` says by whom and why)
    cancelled: bool = False
    #: the replayed workflow function returned (``result``) or raised (``error``); for a run whose history has
    #: no end yet (``finished`` false), it did so after the last recorded call
    ended: bool = False

    @property
    def clean(self) -> bool:
        """True when code and history agree as far as the history goes."""
        return self.divergence is None

    def raise_for_divergence(self) -> None:
        """Raise the :class:`NondeterminismError` found, if any."""
        if self.divergence is not None:
            raise self.divergence


@dataclass
class Live:
    """What only a live execution has: the store, the lease and its renewal."""

    store: WorkflowStore
    lease: Lease
    lease_seconds: float
    renew_every: float
    claimed_at: float  # the worker's monotonic clock when the claim came back (Claim.received): see store_now
    store_now: float  # the store's clock at the claim
    recoveries: int
    #: the worker's monotonic clock when the lease's last renewal (or the claim) was sent: the lease counts from it
    renewed_at: float
    #: the store's clock when this process can read it directly (the memory store), else None
    local_clock: Callable[[], float] | None = None


def why(call: Call) -> str:
    """One open call, as a suspension's reason shows it."""
    if call.parked is not None:
        return f"effect {call.key} is ambiguous: {call.parked}"
    match call.kind:
        case CallKind.SIGNAL if call.name.startswith(CHILD_SIGNAL_PREFIX):
            return f"child run {call.name.removeprefix(CHILD_SIGNAL_PREFIX)} to finish"
        case CallKind.SIGNAL:
            return f"signal {call.name!r} ({call.key})"
        case CallKind.TIMER:
            return f"timer {call.key}" + ("" if call.due is not None else ", which never fires")
        case _:
            return f"{call.kind} {call.key} attempt {call.attempt} waits for its retry: {call.error}"


def failed_call(exc: BaseException) -> str:
    """The key of the call whose failure the workflow raised: the error itself, or the only error of an
    ExceptionGroup (a TaskGroup's); "" when the run failed otherwise."""
    if isinstance(exc, BaseExceptionGroup):
        errors = exc.exceptions
        return failed_call(errors[0]) if len(errors) == 1 else ""
    return exc.key if isinstance(exc, (StepFailedError, EffectFailedError)) else ""


def child_start_under_way(events: list[AnyEvent]) -> bool:
    """A child's start that workflow code cancelled while its enqueue was under way (``call_cancelled`` with
    ``ran``), whose ``child_started`` is not recorded yet: the child run may exist, so the start runs on to its
    ``child_started``, also after a crash (the enqueue is idempotent by the child's checkpoint id)."""
    return any(isinstance(e, CallCancelled) and e.ran for e in events) and not any(
        isinstance(e, ChildStarted) for e in events)
