"""A run's history as a person reads it: one row per event, with durations and who acted and why."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, assert_never

import msgspec

from runifold.cli._text import clip, iso
from runifold.history import (
    AnyEvent,
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
    effect_attempts,
    type_tag,
)

#: how much of a recorded value a timeline row shows (the JSON endpoints have all of it)
VALUE_CHARS = 160


def value(data: Any) -> str:
    """A recorded value as compact JSON, cut to :data:`VALUE_CHARS`."""
    return clip(msgspec.json.encode(data).decode(), VALUE_CHARS)


def _retry(retry_at: float | None, *, final: str) -> str:
    return f"; next attempt at {iso(retry_at)}" if retry_at is not None else final


def describe(event: AnyEvent) -> tuple[str, str, str]:
    """``(what happened, who acted, why)`` for one event; ``who`` and ``why`` are empty where no one acted."""
    match event:
        case RunStarted(name=name, version=version, input=data):
            return f"{name} v{version} started with {value(data)}", "", ""
        case StepCompleted(attempt=attempt, output=output) | EffectCompleted(attempt=attempt, output=output):
            return f"attempt {attempt} returned {value(output)}", "", ""
        case StepFailed(attempt=attempt, error=error, retry_at=retry_at) | EffectFailed(
                attempt=attempt, error=error, retry_at=retry_at):
            return f"attempt {attempt} raised {error}{_retry(retry_at, final='; no attempts left')}", "", ""
        case EffectStarted(attempt=attempt, idempotency_key=idem):
            return f"attempt {attempt} started, idempotency key {idem}", "", ""
        case EffectUnknown(attempt=attempt, error=error, retry_at=retry_at):
            return f"attempt {attempt}: outcome unknown ({error}){_retry(retry_at, final='')}", "", ""
        case EffectReconciled(verdict=verdict, detail=detail, output=output, retry_at=retry_at):
            found = f"evidence: {verdict}" + (f" ({detail})" if detail else "")
            if output is not None:
                found += f", result {value(output)}"
            return found + _retry(retry_at, final=""), "", ""
        case EffectAmbiguous(reason=reason):
            return "ambiguous: parked for an operator to resolve", "", reason
        case EffectResolved(resolution=resolution, by=by, reason=reason, output=output):
            return f"resolved as {resolution}" + (f" with {value(output)}" if output is not None else ""), by, reason
        case ValueRecorded(value=recorded):
            return f"recorded {value(recorded)}", "", ""
        case UsageCharged(units=units):
            return f"charged {units:g} cost units", "", ""
        case TimerStarted():
            return ("timer that never fires" if event.due is None else f"timer set for {iso(event.due)}"), "", ""
        case TimerFired(fired_at=fired_at):
            return f"timer fired at {iso(fired_at)}", "", ""
        case SignalWaitStarted(name=name, deadline=deadline):
            return f"waits for signal {name!r}" + (f" until {iso(deadline)}" if deadline is not None else ""), "", ""
        case SignalReceived(name=name, signal_id=signal_id, payload=payload, sender=sender, reason=reason):
            return f"signal {name!r} ({signal_id}) received with {value(payload)}", sender, reason
        case SignalTimedOut(name=name):
            return f"wait for signal {name!r} timed out", "", ""
        case CallCancelled(kind="child", ran=True):
            return "cancelled by workflow code while the child run was being started: its start is recorded", "", ""
        case CallCancelled(attempt=attempt, ran=ran):
            return (f"cancelled by workflow code (attempt {attempt}{', its body stopped' if ran else ''}); "
                    "nothing more is recorded for it"), "", ""
        case ChildStarted(run_id=child, name=name, version=version):
            return f"started child run {child} ({name} v{version})", "", ""
        case RunCompleted(output=output):
            return f"completed with {value(output)}", "", ""
        case RunFailed(reason=reason, error_type=error_type):
            return f"failed{': ' + error_type if error_type else ''}", "", reason
        case RunRetried(by=by, reason=reason):
            return "retried by an operator", by, reason
        case RunCancelled(by=by, reason=reason):
            return "cancelled", by, reason
        case _ as unreachable:
            assert_never(unreachable)


def timeline(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    """One row per event: ``seq``, ``at``, ``type``, ``key``, ``what``, ``who``, ``why``, ``traceback``, and

    ``gap``: seconds since the previous event was committed (the time the
    workflow spent getting here: a step's body, a wait, a backoff), and
    ``took``: for an event of a call that recorded earlier events (an
    effect's outcome after its start, a fired timer, a received signal, a
    retried step's next attempt), seconds since the call's first event.
    """
    rows: list[dict[str, Any]] = []
    first_of: dict[str, float] = {}
    previous: float | None = None
    for entry in entries:
        event = entry.event
        what, who, why = describe(event)
        key = event.key
        took = entry.at - first_of[key] if key and key in first_of else None
        if key:
            first_of.setdefault(key, entry.at)
        rows.append({"seq": entry.seq, "at": entry.at, "type": type_tag(event), "key": key, "what": what,
                     "who": who, "why": why, "traceback": getattr(event, "traceback", ""),
                     "gap": None if previous is None else entry.at - previous, "took": took})
        previous = entry.at
    return rows


def effect_evidence(entries: Sequence[Entry], pending: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each pending effect (``running``, ``in doubt`` or ``ambiguous``) with its idempotency key and every event of
    its key."""
    effects = []
    for key, state in pending.items():
        events = [e for e in entries if e.event.key == key]
        idempotency_key, attempts = effect_attempts([e.event for e in events])
        effects.append({
            "key": key, "state": state,
            "idempotency_key": idempotency_key,
            "attempts": attempts,
            "evidence": [{"seq": e.seq, "at": e.at, "type": type_tag(e.event), "what": describe(e.event)[0],
                          "why": describe(e.event)[2]} for e in events],
        })
    return effects
