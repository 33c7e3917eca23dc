"""The checkpoint: a fold of a run's log into its current state.

The log is the source of truth; the checkpoint is derived from it and can be
recomputed at any time (stores may cache parts of it for listing).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, assert_never

import msgspec

from runifold.history._calls import Ambiguous, Done, InDoubt, effect_state
from runifold.history._events import (
    CallCancelled,
    ChildStarted,
    EffectAmbiguous,
    EffectCompleted,
    EffectFailed,
    EffectReconciled,
    EffectResolved,
    EffectStarted,
    EffectUnknown,
    Entry,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunRetried,
    RunStarted,
    SignalReceived,
    SignalTimedOut,
    SignalWaitStarted,
    StepCompleted,
    StepFailed,
    TimerFired,
    TimerStarted,
    UsageCharged,
    ValueRecorded,
    Verdict,
)


class Phase(enum.StrEnum):
    """Where a run stands according to its log."""

    RUNNING = "running"
    WAITING = "waiting"
    PARKED = "parked"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Usage(msgspec.Struct, frozen=True):
    """What a run has consumed. Every field only ever grows along the log."""

    steps: int = 0
    effect_attempts: int = 0
    retries: int = 0
    cost_units: float = 0.0


class Wait(msgspec.Struct, frozen=True):
    """An open timer or signal wait."""

    key: str
    kind: str
    until: float | None
    signal: str | None = None


class Checkpoint(msgspec.Struct, frozen=True):
    """The state of a run, folded from its log."""

    name: str
    version: int
    checkpoint_id: str | None
    input: dict[str, Any]
    phase: Phase
    revision: int
    started_at: float
    updated_at: float
    outputs: dict[str, Any]
    usage: Usage
    attempts: dict[str, int]
    pending_effects: dict[str, str]
    waits: list[Wait]
    result: Any = None
    failure: str | None = None
    parent_run_id: str | None = None
    children: dict[str, str] = msgspec.field(default_factory=dict)  # call key -> child run id


def fold(entries: Sequence[Entry]) -> Checkpoint:
    """Fold a run's history into its checkpoint."""
    first = entries[0].event
    assert isinstance(first, RunStarted), "history must begin with run_started"
    outputs: dict[str, Any] = {}
    children: dict[str, str] = {}
    attempts: dict[str, int] = {}
    effect_events: dict[str, list[Any]] = {}
    waits: dict[str, Wait] = {}
    steps = effect_attempts = retries = 0
    units = 0.0
    phase = Phase.RUNNING
    result: Any = None
    failure: str | None = None
    for entry in entries:
        event = entry.event
        match event:
            case StepCompleted(key=key, output=output, attempt=attempt):
                steps += 1
                outputs[key] = output
                attempts[key] = attempt
            case StepFailed(key=key, attempt=attempt, retry_at=retry_at):
                steps += 1
                attempts[key] = attempt
                retries += retry_at is not None
            case EffectStarted(key=key, attempt=attempt):
                effect_attempts += 1
                attempts[key] = attempt
                effect_events.setdefault(key, []).append(event)
            case EffectFailed(key=key, retry_at=retry_at) | EffectUnknown(key=key, retry_at=retry_at):
                retries += retry_at is not None
                effect_events.setdefault(key, []).append(event)
            case EffectCompleted(key=key):
                effect_events.setdefault(key, []).append(event)
            case EffectReconciled(key=key, verdict=Verdict.NOT_APPLIED):
                retries += 1  # the body runs again: another attempt
                effect_events.setdefault(key, []).append(event)
            case EffectReconciled(key=key) | EffectAmbiguous(key=key) | EffectResolved(key=key):
                effect_events.setdefault(key, []).append(event)
            case CallCancelled(key=key, kind="effect"):
                effect_events.setdefault(key, []).append(event)
            case CallCancelled(key=key, kind="timer" | "signal"):
                waits.pop(key, None)
            case CallCancelled(kind=kind, ran=ran):
                steps += ran and kind == "step"  # (a child's start that was cancelled is no step: nor is it live)
            case UsageCharged(units=charged):
                units += charged
            case ValueRecorded():
                pass
            case ChildStarted(key=key, run_id=child):
                children[key] = child
            case TimerStarted(key=key):
                waits[key] = Wait(key, "timer", event.due)
            case SignalWaitStarted(key=key, name=name, deadline=deadline):
                waits[key] = Wait(key, "signal", deadline, name)
            case TimerFired(key=key) | SignalReceived(key=key) | SignalTimedOut(key=key):
                waits.pop(key, None)
            case RunStarted():
                pass
            case RunCompleted(output=output):
                phase, result = Phase.COMPLETED, output
            case RunFailed(reason=reason):
                phase, failure = Phase.FAILED, reason
            case RunRetried():
                phase, failure = Phase.RUNNING, None
            case RunCancelled(reason=reason, by=by):
                phase, failure = Phase.CANCELLED, f"cancelled by {by}: {reason}"
            case _ as unreachable:
                assert_never(unreachable)
    pending: dict[str, str] = {}
    for key, events in effect_events.items():
        state = effect_state(events)
        if isinstance(state, Ambiguous):
            pending[key] = "ambiguous"
        elif isinstance(state, InDoubt):
            pending[key] = "in doubt"
        elif isinstance(state, Done):
            outputs[key] = state.output
    if phase in (Phase.COMPLETED, Phase.FAILED, Phase.CANCELLED):
        waits.clear()  # a finished run waits for nothing (a wait its code abandoned stays open in the log)
    if phase is Phase.RUNNING:
        if any(status == "ambiguous" for status in pending.values()):
            phase = Phase.PARKED
        elif waits:
            phase = Phase.WAITING
    return Checkpoint(
        name=first.name,
        version=first.version,
        checkpoint_id=first.checkpoint_id,
        input=first.input,
        phase=phase,
        revision=entries[-1].seq,
        started_at=entries[0].at,
        updated_at=entries[-1].at,
        outputs=outputs,
        usage=Usage(steps, effect_attempts, retries, units),
        attempts=attempts,
        pending_effects=pending,
        waits=sorted(waits.values(), key=lambda w: w.key),
        result=result,
        failure=failure,
        parent_run_id=first.parent_run_id,
        children=children,
    )
