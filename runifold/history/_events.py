"""The event types of a run's append-only log.

Each event is a frozen ``msgspec.Struct`` in one tagged union. Tags are stable
snake_case strings stored in every row, so renaming a class never breaks a
stored history. New fields get defaults; existing fields never change type. A
field at its default is left out of the stored JSON (it reads back as the default).

Times are seconds since the epoch on the *store's* clock.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec


class Event(msgspec.Struct, frozen=True, tag_field="type", kw_only=True, omit_defaults=True):
    """Base of every event. ``key`` names the workflow call an event belongs to."""

    key: str = ""


#: the prefix of the signal (name and id) a finished child run posts to its parent: reserved for the store,
#: so no sender's signal and no workflow's own wait can take a child's result or its place in the inbox
CHILD_SIGNAL_PREFIX = "child:"


def child_signal(run_id: str) -> str:
    """The name (and signal id) of the signal the child run ``run_id`` posts to its parent when it finishes."""
    return f"{CHILD_SIGNAL_PREFIX}{run_id}"


#: the highest workflow version: every store keeps versions in a 32-bit integer column
MAX_VERSION = 2**31 - 1


def is_version(value: object) -> bool:
    """Whether ``value`` is a workflow version: a whole number (not a bool) from 1 to :data:`MAX_VERSION`."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_VERSION


class RunStarted(Event, frozen=True, tag="run_started", kw_only=True):
    name: str
    version: int
    input: dict[str, Any]
    checkpoint_id: str | None = None
    parent_run_id: str | None = None  # a child workflow's parent run


class StepCompleted(Event, frozen=True, tag="step_completed", kw_only=True):
    output: Any
    attempt: int = 1


class StepFailed(Event, frozen=True, tag="step_failed", kw_only=True):
    error: str
    attempt: int
    retry_at: float | None = None  # None: retries exhausted, the failure is final
    error_type: str = ""  # the exception's qualified class name
    traceback: str = ""  # bounded: the last frames of the body's traceback


class EffectStarted(Event, frozen=True, tag="effect_started", kw_only=True):
    idempotency_key: str
    attempt: int


class EffectCompleted(Event, frozen=True, tag="effect_completed", kw_only=True):
    output: Any
    attempt: int


class EffectFailed(Event, frozen=True, tag="effect_failed", kw_only=True):
    error: str
    attempt: int
    retry_at: float | None = None
    error_type: str = ""
    traceback: str = ""


class EffectUnknown(Event, frozen=True, tag="effect_unknown", kw_only=True):
    """An attempt's outcome is unknown (a timeout, a lost connection, ``EffectOutcomeUnknown``).

    ``retry_at`` is set when the policy (``REPEAT``) tries the same key again then.
    """

    error: str
    attempt: int
    retry_at: float | None = None
    error_type: str = ""


class Verdict(enum.StrEnum):
    """What a reconcile function found out about an effect in doubt."""

    APPLIED = "applied"
    NOT_APPLIED = "not_applied"
    UNKNOWN = "unknown"


class EffectReconciled(Event, frozen=True, tag="effect_reconciled", kw_only=True):
    verdict: Verdict
    output: Any = None
    detail: str = ""
    retry_at: float | None = None  # NOT_APPLIED: when the next attempt may run (None: at once)


class EffectAmbiguous(Event, frozen=True, tag="effect_ambiguous", kw_only=True):
    reason: str


class Resolution(enum.StrEnum):
    """How an operator settled an ambiguous effect."""

    APPLIED = "applied"
    RETRY = "retry"
    FAIL = "fail"


class EffectResolved(Event, frozen=True, tag="effect_resolved", kw_only=True):
    resolution: Resolution
    by: str
    reason: str
    output: Any = None


class ValueRecorded(Event, frozen=True, tag="value_recorded", kw_only=True):
    """A ``ctx.now()``, ``ctx.uuid()`` or ``ctx.random()`` result."""

    value: Any


class UsageCharged(Event, frozen=True, tag="usage_charged", kw_only=True):
    units: float


#: the latest time a timer fires at: the end of the year 9999 UTC, the last moment a ``datetime`` (``ctx.now()``)
#: holds. A timer due later (an endless ``asyncio.sleep(math.inf)``, a sleep of 1e20 s) never fires
LATEST_FIRE = 253402300799.0
#: the ``fire_at`` a timer that never fires records
NEVER_FIRES = 1e308


def fire_time(at: float) -> float | None:
    """When a timer due ``at`` (store clock) fires: ``at``, or None (never) past :data:`LATEST_FIRE` (or NaN)."""
    return at if at <= LATEST_FIRE else None


class TimerStarted(Event, frozen=True, tag="timer_started", kw_only=True):
    fire_at: float

    @property
    def due(self) -> float | None:
        """When the timer fires (store clock); None: never."""
        return fire_time(self.fire_at)


class TimerFired(Event, frozen=True, tag="timer_fired", kw_only=True):
    fired_at: float


class SignalWaitStarted(Event, frozen=True, tag="signal_wait_started", kw_only=True):
    name: str
    deadline: float | None = None


class SignalReceived(Event, frozen=True, tag="signal_received", kw_only=True):
    name: str
    payload: Any
    signal_id: str
    sender: str
    reason: str
    received_at: float
    consumed_at: float | None = None  # when the wait took it (store clock); None in histories before it was kept


class SignalTimedOut(Event, frozen=True, tag="signal_timed_out", kw_only=True):
    name: str
    timed_out_at: float | None = None  # when the wait was judged timed out (store clock); None before it was kept


class CallCancelled(Event, frozen=True, tag="call_cancelled", kw_only=True):
    """Workflow code stopped waiting for a call before its outcome was known, e.g. under ``asyncio.timeout``:
    a step's body was cancelled, an effect or a child run had not started, a timer or a signal wait ends
    unfired, and nothing more is recorded for the call. ``kind``: the call's kind (``step``, ``effect``,
    ``timer``, ``signal``, ``child``); ``ran``: the attempt's body had started (a step's counts as a step; a
    child's start, whose enqueue was under way, runs on and its ``child_started`` follows)."""

    kind: str
    attempt: int
    ran: bool


class ChildStarted(Event, frozen=True, tag="child_started", kw_only=True):
    """The workflow started a child run (``ctx.start_child``); its last event will come back as a signal."""

    run_id: str
    name: str
    version: int
    checkpoint_id: str


class RunCompleted(Event, frozen=True, tag="run_completed", kw_only=True):
    output: Any


class RunFailed(Event, frozen=True, tag="run_failed", kw_only=True):
    """The run failed. ``key`` names the call whose failure ended it, if one did. ``handled``: workflow code
    made calls after that failure reached it (a compensation, a cleanup in ``finally``, siblings it cancelled)
    before the run failed, or while handling the exception that failed the run, so a retry cannot replay it."""

    reason: str
    error_type: str = ""
    traceback: str = ""
    handled: bool = False


class RunRetried(Event, frozen=True, tag="run_retried", kw_only=True):
    """An operator continued a failed run. ``key``: the failed call that gets another attempt, if any."""

    by: str
    reason: str


class RunCancelled(Event, frozen=True, tag="run_cancelled", kw_only=True):
    by: str
    reason: str


AnyEvent = (
    RunStarted
    | StepCompleted
    | StepFailed
    | EffectStarted
    | EffectCompleted
    | EffectFailed
    | EffectUnknown
    | EffectReconciled
    | EffectAmbiguous
    | EffectResolved
    | ValueRecorded
    | UsageCharged
    | TimerStarted
    | TimerFired
    | SignalWaitStarted
    | SignalReceived
    | SignalTimedOut
    | CallCancelled
    | ChildStarted
    | RunCompleted
    | RunFailed
    | RunRetried
    | RunCancelled
)

TERMINAL_EVENTS = (RunCompleted, RunFailed, RunCancelled)


class Entry(msgspec.Struct, frozen=True):
    """One stored event: its sequence number, commit time and body."""

    seq: int
    at: float
    event: AnyEvent


def type_tag(event: Event) -> str:
    """Return the stable tag stored with ``event``."""
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag
