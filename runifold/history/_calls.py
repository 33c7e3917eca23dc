"""What the recorded events of one call key mean: a small state machine per kind.

Pure functions over the events a key has in the log, in log order. The worker
asks them what to do next; the debug replayer asks the same questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, assert_never

from runifold.history._events import (
    AnyEvent,
    CallCancelled,
    EffectAmbiguous,
    EffectCompleted,
    EffectFailed,
    EffectReconciled,
    EffectResolved,
    EffectStarted,
    EffectUnknown,
    Resolution,
    RunRetried,
    SignalReceived,
    SignalTimedOut,
    SignalWaitStarted,
    StepCompleted,
    StepFailed,
    TimerFired,
    TimerStarted,
    Verdict,
)


@dataclass(frozen=True)
class Fresh:
    """Nothing decided yet: run the call live as ``attempt``; ``unknown``: an operator chose to run an ambiguous
    effect again, so the outcome before this attempt is unknown."""

    attempt: int = 1
    unknown: bool = False


@dataclass(frozen=True)
class Done:
    """The call's outcome is recorded; return ``output`` without running anything. ``by``: the operator whose
    resolution decided it (an effect's), else empty."""

    output: Any
    by: str = ""


@dataclass(frozen=True)
class Failed:
    """The call failed for good; raise into the workflow. ``by``: as for :class:`Done`."""

    error: str
    attempts: int
    by: str = ""


@dataclass(frozen=True)
class RetryDue:
    """A failed attempt was rescheduled; the next attempt may run from ``retry_at``. ``error``: why the attempt
    before failed; ``unknown``: that attempt's outcome is unknown (an effect's)."""

    attempt: int
    retry_at: float
    error: str = ""
    unknown: bool = False


@dataclass(frozen=True)
class InDoubt:
    """An effect started and nothing after it was recorded: outcome unknown."""

    attempt: int
    idempotency_key: str


@dataclass(frozen=True)
class Ambiguous:
    """An effect is parked until an operator resolves it."""

    reason: str
    attempt: int


@dataclass(frozen=True)
class Cancelled:
    """Workflow code stopped waiting for the call before its outcome was known; nothing more runs for it."""


StepState = Fresh | Done | Failed | RetryDue | Cancelled
EffectState = Fresh | Done | Failed | RetryDue | InDoubt | Ambiguous | Cancelled


def step_state(events: Sequence[AnyEvent]) -> StepState:
    """Fold the events of one step key."""
    state: StepState = Fresh()
    for event in events:
        match event:
            case StepCompleted(output=output):
                state = Done(output)
            case StepFailed(error=error, attempt=attempt, retry_at=None):
                state = Failed(error, attempt)
            case StepFailed(error=error, attempt=attempt, retry_at=float() as retry_at):
                state = RetryDue(attempt + 1, retry_at, error)
            case RunRetried() if isinstance(state, Failed):
                state = Fresh(state.attempts + 1)  # an operator gave the failed call another attempt
            case CallCancelled():
                state = Cancelled()
            case _:
                pass
    return state


def not_applied(detail: str) -> str:
    """Why an effect's attempt is tried again after ``reconcile`` found it not applied (a retry's error)."""
    return f"reconciled as not applied: {detail}"


def effect_attempts(events: Sequence[AnyEvent]) -> tuple[str | None, int]:
    """An effect's idempotency key (its last attempt's; None if none started) and how many attempts started."""
    started = [e for e in events if isinstance(e, EffectStarted)]
    return (started[-1].idempotency_key if started else None), len(started)


def effect_state(events: Sequence[AnyEvent]) -> EffectState:
    """Fold the events of one effect key."""
    state: EffectState = Fresh()
    attempt = 0
    idempotency_key = ""
    for event in events:
        match event:
            case EffectStarted(attempt=a, idempotency_key=idem):
                attempt, idempotency_key = a, idem
                state = InDoubt(a, idem)
            case EffectCompleted(output=output):
                state = Done(output)
            case EffectFailed(error=error, attempt=a, retry_at=None):
                state = Failed(error, a)
            case EffectFailed(error=error, attempt=a, retry_at=float() as retry_at):
                state = RetryDue(a + 1, retry_at, error)
            case EffectUnknown(attempt=a, retry_at=None):
                state = InDoubt(a, idempotency_key)
            case EffectUnknown(error=error, attempt=a, retry_at=float() as retry_at):
                state = RetryDue(a + 1, retry_at, error, unknown=True)
            case EffectReconciled(verdict=Verdict.APPLIED, output=output):
                state = Done(output)
            case EffectReconciled(verdict=Verdict.NOT_APPLIED, retry_at=None):
                state = Fresh(attempt + 1)
            case EffectReconciled(verdict=Verdict.NOT_APPLIED, detail=detail, retry_at=float() as retry_at):
                state = RetryDue(attempt + 1, retry_at, not_applied(detail))
            case EffectReconciled(verdict=Verdict.UNKNOWN):
                pass  # an EffectAmbiguous follows in the same commit
            case EffectAmbiguous(reason=reason):
                state = Ambiguous(reason, attempt)
            case EffectResolved(resolution=resolution, output=output, reason=reason, by=by):
                match resolution:
                    case Resolution.APPLIED:
                        state = Done(output, by)
                    case Resolution.RETRY:
                        state = Fresh(attempt + 1, unknown=True)
                    case Resolution.FAIL:
                        state = Failed(f"resolved as failed by an operator: {reason}", attempt, by)
                    case _ as unreachable:
                        assert_never(unreachable)
            case RunRetried() if isinstance(state, Failed):
                state = Fresh(attempt + 1)
            case CallCancelled():
                state = Cancelled()
            case _:
                pass
    return state


@dataclass(frozen=True)
class TimerPending:
    fire_at: float | None  # None: never


@dataclass(frozen=True)
class TimerDone:
    pass


def timer_state(events: Sequence[AnyEvent]) -> Fresh | TimerPending | TimerDone | Cancelled:
    """Fold the events of one timer key."""
    state: Fresh | TimerPending | TimerDone | Cancelled = Fresh()
    for event in events:
        match event:
            case TimerStarted():
                state = TimerPending(event.due)
            case TimerFired():
                state = TimerDone()
            case CallCancelled():
                state = Cancelled()
            case _:
                pass
    return state


@dataclass(frozen=True)
class WaitPending:
    name: str
    deadline: float | None


@dataclass(frozen=True)
class WaitReceived:
    payload: Any


@dataclass(frozen=True)
class WaitTimedOut:
    name: str


WaitState = Fresh | WaitPending | WaitReceived | WaitTimedOut | Cancelled


def wait_state(events: Sequence[AnyEvent]) -> WaitState:
    """Fold the events of one signal-wait key."""
    state: WaitState = Fresh()
    for event in events:
        match event:
            case SignalWaitStarted(name=name, deadline=deadline):
                state = WaitPending(name, deadline)
            case SignalReceived(payload=payload):
                state = WaitReceived(payload)
            case SignalTimedOut(name=name):
                state = WaitTimedOut(name)
            case CallCancelled():
                state = Cancelled()
            case _:
                pass
    return state


def holds_deadline(events: Sequence[AnyEvent]) -> bool:
    """``events`` start a timer or a signal wait with a deadline: a live run commits them before it waits for a
    body, so a worker that stops while the body runs leaves the deadline recorded, where the next worker finds it
    (else that worker would start the wait again, due its whole timeout after its own claim: helper-96)."""
    return any(isinstance(e, TimerStarted) and e.due is not None or isinstance(e, SignalWaitStarted)
               and e.deadline is not None for e in events)
