"""The replayer: matches workflow calls against a recorded history.

A workflow run is re-executed from the top on every claim. Each call the code
makes (a step, an effect, a wait, ``ctx.now()``...) carries a deterministic key:
its id, its occurrence, and the lineage of the task that made it. The replayer
answers, for each key, what history recorded, and notices where code and history
part. It performs no I/O and knows nothing of asyncio.

Divergence rules:

* a key recorded as one kind of call and called as another diverges;
* within one task lineage (*scope*, the part of a key before its last ``/``)
  calls happen one after another and their first events are logged in call
  order (a step the code stops waiting for before it finished is recorded as
  cancelled at that moment), so each scope must call exactly its next recorded
  key: anything else means a call was removed, renamed, reordered or inserted;
* recorded outcomes are handed to workflow code in the order they were
  recorded (:attr:`Replayer.resolutions`), each once every call recorded
  before it has been made (:meth:`Replayer.made_before`); before anything runs live every
  recorded key must have been called, and a recorded key the code cannot
  reach once it is idle was removed, renamed or moved to another path.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence
from typing import assert_never

from runifold.errors import NondeterminismError, SerializationError
from runifold.history._calls import (
    Cancelled,
    Done,
    Failed,
    TimerDone,
    WaitReceived,
    WaitTimedOut,
    effect_state,
    step_state,
    timer_state,
    wait_state,
)
from runifold.history._events import (
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
)


class CallKind(enum.StrEnum):
    """The kind of workflow call a key belongs to."""

    STEP = "step"
    EFFECT = "effect"
    VALUE = "value"
    CHARGE = "charge"
    TIMER = "timer"
    SIGNAL = "signal"
    CHILD = "child"


def kind_of(event: AnyEvent) -> CallKind | None:
    """Return the call kind an event records, or None for run-level events."""
    match event:
        case StepCompleted() | StepFailed():
            return CallKind.STEP
        case (
            EffectStarted()
            | EffectCompleted()
            | EffectFailed()
            | EffectUnknown()
            | EffectReconciled()
            | EffectAmbiguous()
            | EffectResolved()
        ):
            return CallKind.EFFECT
        case ValueRecorded():
            return CallKind.VALUE
        case UsageCharged():
            return CallKind.CHARGE
        case TimerStarted() | TimerFired():
            return CallKind.TIMER
        case SignalWaitStarted() | SignalReceived() | SignalTimedOut():
            return CallKind.SIGNAL
        case ChildStarted():
            return CallKind.CHILD
        case CallCancelled(kind=kind):
            return CallKind(kind)
        case _:
            return None


def scope_of(key: str) -> str:
    """Return the scope (task lineage) part of a call key."""
    head, sep, _ = key.rpartition("/")
    return head + sep


def _resolved(kind: CallKind, events: Sequence[AnyEvent]) -> bool:
    """Tell whether the recorded events of one key settle its call (its outcome is known)."""
    match kind:
        case CallKind.STEP:
            return isinstance(step_state(events), (Done, Failed, Cancelled))
        case CallKind.EFFECT:
            return isinstance(effect_state(events), (Done, Failed, Cancelled))
        case CallKind.TIMER:
            return isinstance(timer_state(events), (TimerDone, Cancelled))
        case CallKind.SIGNAL:
            return isinstance(wait_state(events), (WaitReceived, WaitTimedOut, Cancelled))
        case CallKind.CHILD:
            return True  # its only event, child_started, is its outcome (the child's end comes as a signal)
        case CallKind.VALUE | CallKind.CHARGE:
            return False  # answered at the call, synchronously: never awaited, never ordered
        case _ as unreachable:
            assert_never(unreachable)


class Replayer:
    """Index of a run's history by call key, with divergence checks."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        if not entries or not isinstance(entries[0].event, RunStarted):
            raise SerializationError(
                "history does not begin with run_started; the run's rows are corrupt or "
                "incomplete: restore them from a backup"
            )
        self.started: RunStarted = entries[0].event
        self.started_at: float = entries[0].at
        self.revision: int = entries[-1].seq
        self._events: dict[str, list[AnyEvent]] = {}
        self._kind: dict[str, CallKind] = {}
        self._last_seq: dict[str, int] = {}
        self._last_at: dict[str, float] = {}
        self._first_seq: dict[str, int] = {}
        self._recorded_order: list[str] = []
        # invariant: every key of _recorded_order before _cursor has been visited
        self._cursor = 0
        self._visited: set[str] = set()
        self._scope_queue: dict[str, deque[str]] = {}
        for entry in entries:
            event = entry.event
            key = event.key
            if isinstance(event, RunRetried) and key in self._events:
                self._events[key].append(event)  # reopens the failed call it names
                self._last_seq[key] = entry.seq
                self._last_at[key] = entry.at
                continue
            kind = kind_of(event)
            if kind is None or not key:
                continue
            if key not in self._events:
                self._events[key] = []
                self._kind[key] = kind
                self._first_seq[key] = entry.seq
                self._recorded_order.append(key)
                self._scope_queue.setdefault(scope_of(key), deque()).append(key)
            self._events[key].append(event)
            self._last_seq[key] = entry.seq
            self._last_at[key] = entry.at
        self._unvisited = len(self._recorded_order)  # recorded keys the code has not called yet
        #: keys whose outcome history records, in the order those outcomes were recorded: a
        #: replay hands them to workflow code in exactly this order, as the live run did
        self.resolutions: list[str] = sorted(
            (k for k in self._recorded_order if _resolved(self._kind[k], self._events[k])),
            key=self._last_seq.__getitem__,
        )

    # -- queries ------------------------------------------------------------

    def events(self, key: str) -> list[AnyEvent]:
        """Return the events recorded for ``key`` (empty when it is new)."""
        return list(self._events.get(key, ()))

    def committed_at(self, key: str) -> float:
        """When the last event recorded for ``key`` was committed (store clock)."""
        return self._last_at[key]

    def kind(self, key: str) -> CallKind | None:
        """Return the kind of call history recorded under ``key``, if any."""
        return self._kind.get(key)

    def is_recorded(self, key: str) -> bool:
        """Tell whether history holds any event for ``key``."""
        return key in self._events

    def visit(self, key: str, kind: CallKind) -> list[AnyEvent]:
        """Record that the code called ``key``; return its recorded events.

        Raises:
            NondeterminismError: the key was recorded as another kind of call,
                or its scope's next recorded call is a different key.
        """
        recorded_kind = self._kind.get(key)
        if recorded_kind is None and self._unvisited == 0:
            self._visited.add(key)  # a new call after every recorded one was made: nothing to check
            return []
        if recorded_kind is not None and recorded_kind is not kind:
            raise NondeterminismError(
                key, recorded=f"{_a(recorded_kind)} call", called=f"{_a(kind)} call"
            )
        queue = self._scope_queue.get(scope_of(key))
        while queue and queue[0] in self._visited:
            queue.popleft()
        expected = queue[0] if queue else None
        if expected is not None and expected != key:
            if recorded_kind is not None:
                # the key is recorded in this scope too, later: the same calls, made in another order
                detail = f"calls were reordered: the live run made {expected} before {key}"
            else:
                detail = self._new_call_hint(key, "a call was removed, renamed, reordered or inserted")
            raise NondeterminismError(
                expected,
                recorded=f"{self._kind[expected]} call {expected}",
                called=f"{kind} call {key}",
                detail=detail,
            )
        if recorded_kind is not None and key not in self._visited:
            self._unvisited -= 1
        self._visited.add(key)
        return self._events.get(key, [])

    def first_unvisited(self) -> str | None:
        """Return the earliest recorded key the code has not called, if any."""
        order = self._recorded_order
        while self._cursor < len(order) and order[self._cursor] in self._visited:
            self._cursor += 1
        return order[self._cursor] if self._cursor < len(order) else None

    def made_before(self, key: str) -> bool:
        """Tell whether every call whose first event was recorded before ``key``'s outcome has been made.

        The live run made each of those calls before it learned ``key``'s outcome (a call's first
        event is recorded after the call), so a replay hands the outcome over only after them.
        """
        first = self.first_unvisited()
        return first is None or self._first_seq[first] > self._last_seq[key]

    def added(self, key: str, kind: CallKind, recorded: str) -> NondeterminismError:
        """The error for a call ``key`` that history does not hold where it holds ``recorded`` instead."""
        return NondeterminismError(key, recorded=recorded, called=f"{kind} call {key}",
                                   detail=self._new_call_hint(key, "a call was added, or the code took another path"))

    def _new_call_hint(self, key: str, otherwise: str) -> str:
        """Why the code made ``key``, which history lacks: a recorded call it is in another task, if any."""
        moved = _in_another_task(key, (k for k in self._kind if k not in self._visited))
        return _moved(moved, key) if moved else otherwise

    def missing(self, key: str, called: str) -> NondeterminismError:
        """The error for recorded ``key`` that the code did not reach; ``called`` says what it did instead."""
        made = _in_another_task(key, (k for k in self._visited if k not in self._kind))
        return NondeterminismError(
            key, recorded=f"{self._kind[key]} call {key}", called=called,
            detail=_moved(key, made) if made else "a call was removed or renamed, or the code took another path",
        )


def _a(kind: object) -> str:
    """``kind`` with its article: "a step", "an effect"."""
    text = str(kind)
    return f"an {text}" if text[:1] in "aeiou" else f"a {text}"


def _in_another_task(key: str, keys: Iterable[str]) -> str | None:
    """A key among ``keys`` for the same call as ``key`` (name and number) in another task's scope, if any."""
    call = key.rpartition("/")[2]
    return next((k for k in keys if k != key and k.rpartition("/")[2] == call), None)


def _moved(recorded: str, made: str) -> str:
    return (f"the live run made this call as {recorded} and the code now makes it as {made}, in another task: a "
            "change of code moved it, or a change of Python version (asyncio creates tasks differently from one "
            "version to the next; 3.11's wait_for runs its awaitable in a task of its own, 3.12's does not)")
