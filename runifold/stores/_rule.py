"""What every store operation does to a run, stated once, with no I/O.

The memory and SQLite stores read a run's row, ask these functions what to
write, and write it; PostgreSQL's functions in ``sql/postgres/schema.sql`` are
the same rules in SQL, held to these by the differential test
(``tests/stores/test_differential.py``).

The commit rule: a commit from ``lease`` that read ``expected`` revision

1. is *fenced*: it applies only if the run is RUNNING under that lease token,
   the lease has not expired on the store's clock, and the revision is still
   ``expected`` — otherwise nothing is written, unless
2. it is a *retry of itself*: the same token, the run at ``expected + n``
   and the same ``n`` events at those seqs (or, for a commit of no events, the
   run already in the transition's state): its first attempt was written and
   its answer lost, so it succeeds again, writing nothing;
3. it *appends* its events at ``expected + 1 ..``, marks the consumed signals,
   and applies the transition (status, due time, waited signals, reason, the
   lease cleared);
4. a run that starts waiting for a signal already in its inbox is *due now*:
   no wake-up is lost to a signal that beat the wait;
5. idle workers are *woken* whenever a due time was set;
6. a run that *finishes* (by a commit or an operator) and has a parent posts
   its last event to the parent's inbox as signal ``child:<run id>`` (see
   :func:`child_notice`), waking the parent if it waits for it.

The claim rule: the most overdue due run of the asked names is claimed, except
that a run with a concurrency key is *passed over* while as many runs of its
key as its limit hold a slot (:func:`holds_slot`: running under an unexpired
lease). A passed-over run stays due; the claim takes the next one. Idle workers
are woken when a run with a key leaves RUNNING, since that frees a slot.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from runifold.errors import RUN_CANCELLED, RUN_GONE, InvalidStateError, SignalRejectedError
from runifold.history import child_signal as child_signal
from runifold.stores._protocol import EventRow, Lease, RunColumns, RunStatus, SignalDelivery

#: the statuses :meth:`WorkflowStore.wake` makes due now
WAKEABLE = frozenset({RunStatus.READY, RunStatus.WAITING, RunStatus.DIVERGED})


@dataclass(frozen=True, slots=True)
class RunState:
    """The columns of a run row the rules read."""

    status: RunStatus
    revision: int
    lease_token: int
    lease_until: float | None
    wait_signals: tuple[str, ...]
    reason: str


def fence(run: RunState | None, lease: Lease, expected: int, now: float) -> str | None:
    """Return why a commit from ``lease`` at revision ``expected`` is refused, or None if it may write."""
    if run is None:
        return RUN_GONE
    if run.status is RunStatus.CANCELLED:
        return RUN_CANCELLED
    if run.status is not RunStatus.RUNNING or run.lease_token != lease.token:
        return "fenced off by a newer lease"
    if run.lease_until is None or run.lease_until <= now:
        return "the lease expired"
    if run.revision != expected:
        return f"revision {run.revision} is not the expected {expected}"
    return None


def renewal_refused(status: RunStatus | None) -> str:
    """Why a lease could not be renewed, as every store says it (``status``: the run's, None if it is gone)."""
    if status is None:
        return RUN_GONE
    if status is RunStatus.CANCELLED:
        return RUN_CANCELLED
    return "fenced off by a newer lease, or the lease expired"


def is_own_retry(
    run: RunState | None,
    lease: Lease,
    expected: int,
    events: Sequence[EventRow],
    columns: RunColumns | None,
    stored: Sequence[tuple[str, str, str]],
) -> bool:
    """Tell whether a fenced commit was already written by an earlier attempt of itself.

    ``stored`` holds (type, key, body) of the run's events after ``expected``, in order.
    """
    if run is None or run.lease_token != lease.token or run.revision != expected + len(events):
        return False
    if events:
        return [(e.type, e.key, e.body.decode()) for e in events] == list(stored)
    return (
        columns is not None
        and run.status is columns.status
        and run.lease_until is None
        and run.wait_signals == columns.wait_signals
        and run.reason == columns.reason
    )


def commit_due(columns: RunColumns, now: float, unconsumed: Collection[str]) -> float | None:
    """The due time a transition writes: now if the run starts waiting for a signal it already holds."""
    if columns.status is RunStatus.WAITING and any(name in unconsumed for name in columns.wait_signals):
        return now  # invariant: a signal that beat the wait wakes the run at once
    return columns.due_at


def holds_slot(status: RunStatus, lease_until: float | None, now: float) -> bool:
    """A run holds a slot of its concurrency key while it runs under an unexpired lease.

    A waiting, parked or rescheduled run holds none, and neither does a running
    run whose lease expired (its worker is gone; the claim that recovers it takes
    a slot again).
    """
    return status is RunStatus.RUNNING and lease_until is not None and lease_until > now


def passed_over(limit: int | None, running: int) -> bool:
    """A due run is passed over by the claim while ``running`` runs of its key hold a slot and that reaches its limit.

    The limit is the claimed run's own (runs of one key should carry one limit).
    """
    return limit is not None and running >= limit


def recovered(run: RunState) -> bool:
    """A claim of a RUNNING run takes it over from a worker whose lease expired."""
    return run.status is RunStatus.RUNNING


def wake_refusal(run_id: str, status: RunStatus) -> InvalidStateError | None:
    """Why ``wake`` does not apply to a run in ``status``, or None if it does."""
    if status in WAKEABLE:
        return None
    if status is RunStatus.PARKED:
        why = "it waits for an operator to resolve an ambiguous effect: use `runifold resolve`"
    elif status is RunStatus.RUNNING:
        why = "a worker is running it already"
    elif status is RunStatus.FAILED:
        why = "it failed: use `runifold retry` to run it again"
    else:
        why = "it has finished, so nothing of it waits"
    return InvalidStateError(f"run {run_id} is {status}, so it cannot be woken: {why}")


def intervene_refusal(run_id: str, status: RunStatus, allowed: Collection[RunStatus], revision: int = 0,
                      decided_at: int | None = None) -> InvalidStateError | None:
    """Why an operator action needing ``allowed`` does not fit a run in ``status`` at ``revision``, or None.

    ``decided_at``: the revision whose history the action was decided on (an effect found ambiguous there); the
    run must not have moved on since, or two operators resolving one effect at once would both be accepted.
    """
    if status in allowed:
        if decided_at is None or revision == decided_at:
            return None
        return InvalidStateError(
            f"run {run_id} changed while this action was decided (it was decided on revision {decided_at}; the run "
            f"is at revision {revision} now: another operator or a worker acted first); look at the run again "
            f"(`runifold runs show {run_id}`) and repeat the action if it still applies")
    if status.finished and not any(a.finished for a in allowed):
        retry = "; `runifold retry` runs a failed run again" if status is RunStatus.FAILED else ""
        return InvalidStateError(f"run {run_id} has finished ({status}): only a run that has not finished "
                                 f"can be changed this way{retry}")
    return InvalidStateError(
        f"run {run_id} is {status}; this operation needs it to be {' or '.join(sorted(allowed))}"
    )


def intervene_due(status: RunStatus, now: float) -> float | None:
    """An operator's transition makes an unfinished run due at once."""
    return None if status.finished else now


def purge_refusal(run_id: str, status: RunStatus) -> InvalidStateError | None:
    """Why a run in ``status`` cannot be purged, or None."""
    if status.finished:
        return None
    return InvalidStateError(f"run {run_id} is {status}; only finished runs can be purged: cancel it first")


def signal_verdict(delivery: SignalDelivery, existing: tuple[str, str, str, str] | None, unconsumed: int,
                   finished: bool) -> tuple[str, str]:
    """The verdict on ``delivery`` (``accepted``, ``duplicate``, ``rejected:conflict`` or
    ``rejected:inbox_full``) and what the audit says of it beside the verdict.

    ``existing`` is the (name, payload hash, sender, reason) already stored under the signal id, if any: a
    signal id names one signal, so only the same signal again (a resend) is a duplicate; the same id from
    another sender, or with another name, payload or reason, is a conflict. ``unconsumed`` counts the run's
    unconsumed signals of the delivery's name (a limit per name: senders of one signal cannot fill the inbox
    against another's, helper-96); ``finished``: the run has finished.
    """
    sent = (delivery.name, delivery.payload_hash, delivery.sender, delivery.reason)
    if existing is not None and existing == sent:
        return "duplicate", ""
    if existing is not None:
        differ = [what for what, was, now in zip(("name", "payload", "sender", "reason"), existing, sent, strict=True)
                  if was != now]
        return "rejected:conflict", f"the signal id names another signal (it differs in: {', '.join(differ)})"
    if unconsumed >= delivery.max_unconsumed:
        return "rejected:inbox_full", (f"the run's inbox is full (at most {delivery.max_unconsumed} unconsumed signals "
                                       f"named {delivery.name!r})")
    return "accepted", "run finished; kept unconsumed" if finished else ""


def refused_cap(run_id: str | None, max_per_run: int) -> int:
    """How many attempts that were not accepted (duplicates and rejections) the audit keeps of one run: the
    newest ``max_per_run``; of attempts against no known run (``run_id`` None), ten times as many."""
    return max_per_run if run_id is not None else 10 * max_per_run


def inbox_full(run_id: str, name: str, limit: int) -> SignalRejectedError:
    """The error for a delivery to a run whose inbox holds ``limit`` unconsumed signals named ``name``."""
    return SignalRejectedError(
        "inbox_full", f"run {run_id} already holds {limit} unconsumed signals named {name!r}; an unfinished run makes "
                      f"room as its waits for {name!r} consume them (send again after that), a finished run takes "
                      "no more; if none of its waits will, cancel it"
    )


def signal_wakes(status: RunStatus, wait_signals: Collection[str], name: str) -> bool:
    """A delivered signal makes a run that waits for it due now."""
    return status is RunStatus.WAITING and name in wait_signals


def enqueue_verdict(
    existing: tuple[str, str, int, str, str | None] | None, run_id: str, name: str, version: int, input_json: str,
    parent_run_id: str | None,
) -> str:
    """``created``, ``retried`` (our own earlier attempt), ``existing`` or ``conflict``.

    ``existing`` is the (run id, name, version, input, parent run id) of the run already under the task's
    checkpoint id or its run id, if any. The same task is the same workflow, version and input (compared as
    :meth:`WorkflowTask.input_json`) with the same parent: a checkpoint id never names another parent's child.
    """
    if existing is None:
        return "created"
    same = existing[1:] == (name, version, input_json, parent_run_id)
    if not same:
        return "conflict"
    return "retried" if existing[0] == run_id else "existing"


#: the sender of the signals a finished child run posts to its parent
CHILD_SENDER = "runifold"


def child_notice(status: RunStatus, parent_run_id: str | None, last_body: str | None) -> bool:
    """Tell whether a transition to ``status`` posts the run's last event (``last_body``) to its parent."""
    return status.finished and parent_run_id is not None and last_body is not None


def schedule_added(existing: tuple[object, ...] | None, definition: tuple[object, ...]) -> str:
    """``created``, ``unchanged`` or ``replaced``: what adding a schedule with ``definition`` does.

    ``existing`` is the definition stored under the name, if any. A created or
    replaced schedule's ``last_tick`` becomes now (its ticks start after the
    add) and a replaced one keeps its paused state; an unchanged one is not
    written at all, so re-adding a schedule on every deploy loses no tick.
    """
    if existing is None:
        return "created"
    return "unchanged" if tuple(existing) == tuple(definition) else "replaced"


def resumed_last_tick(paused: bool, last_tick: float, now: float) -> float:
    """The ``last_tick`` of a schedule resumed now: the ticks due while it was paused never start."""
    return max(last_tick, now) if paused else last_tick
