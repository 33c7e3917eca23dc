"""The ``WorkflowStore`` protocol: the durable control plane every store implements.

Stores know events only as encoded rows (:class:`EventRow`) plus the few typed
fields they index (run id, sequence number, type tag, key). Invariants every
store keeps, checked by the conformance suite in ``runifold.testing``:

* ``revision`` of a run == ``seq`` of its last event; seqs are 1, 2, 3, ...
* a commit appends only if the committer's lease token is current, its lease
  has not expired on the store's clock, and the revision it read is current;
  otherwise nothing is written and :class:`LeaseLostError` is raised;
* lease tokens (fencing tokens) of a run only ever grow;
* a run is claimable when ``due_at <= now``: READY, WAITING and DIVERGED runs
  at their due time, RUNNING runs once their lease expired. PARKED and finished
  runs have no due time and are never claimed;
* a due run with a concurrency key is passed over while its key is at its
  limit (see :func:`runifold.stores._rule.holds_slot`); the claim takes the next
  one, and the run stays due;
* a run reference is a run id (``run_`` + 24 hex digits, see :func:`new_run_id`)
  or a checkpoint id, which may not start with ``run_``: the two namespaces
  never meet, and :func:`ref_column` says which one a reference names. Every
  operation resolves a reference once and acts on that run id.

What a commit, claim, delivery or operator action does to a run is stated
once, in :mod:`runifold.stores._rule`.
"""

from __future__ import annotations

import enum
import math
import secrets
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, final

import msgspec

from runifold.errors import InvalidInputError, SerializationError, SignalRejectedError
from runifold.history import (
    CHILD_SIGNAL_PREFIX,
    MAX_VERSION,
    RunStarted,
    canonical_json,
    encode_event,
    encode_value,
    is_version,
    to_plain,
    type_tag,
)

if TYPE_CHECKING:
    from runifold.stores._schedule import Schedule, ScheduleInfo


class RunStatus(enum.StrEnum):
    """A run's scheduling state in the store."""

    READY = "ready"
    RUNNING = "running"
    WAITING = "waiting"
    PARKED = "parked"
    DIVERGED = "diverged"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


#: the statuses of a run that has not finished, in the order above
UNFINISHED = tuple(s for s in RunStatus if not s.finished)


@final
@dataclass(frozen=True)
class WorkflowTask:
    """A request to run one workflow definition.

    Args:
        name: the workflow's name.
        version: the exact version to run; the run stays pinned to it.
        input: keyword arguments for the workflow function (JSON-compatible).
        checkpoint_id: the caller's durable identity of the run. Enqueueing the
            same id again returns the existing run (same task) or raises
            :class:`EnqueueConflictError` (different task: another name, version,
            input or parent).
        parent_run_id: the run whose child this run is (set by ``ctx.start_child``):
            when this run finishes, its last event goes to the parent's inbox.
        concurrency_key: runs sharing a key share its limit: a claim takes a run
            only while fewer than ``concurrency_limit`` runs of its key are
            running (claimed under an unexpired lease). Both or neither.
        concurrency_limit: how many runs of ``concurrency_key`` may run at once.

    Raises:
        InvalidInputError: a field is malformed (the message says which).
        SerializationError: the input holds a value that cannot be recorded (NaN or an
            infinity, invalid Unicode, an object JSON cannot hold).
    """

    name: str
    version: int
    input: Mapping[str, Any]
    checkpoint_id: str | None = None
    parent_run_id: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    #: the input as the JSON builtins the history records (set from ``input``)
    _plain: dict[str, Any] = field(init=False, repr=False, compare=False)
    _canonical: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInputError(f"WorkflowTask.name must be a non-empty string, got {self.name!r}")
        if not is_version(self.version):
            raise InvalidInputError(
                f"WorkflowTask.version must be a whole number from 1 to {MAX_VERSION:,}, got {self.version!r}")
        if not isinstance(self.input, Mapping):
            raise InvalidInputError(f"WorkflowTask.input must be a mapping of argument names, got {type(self.input).__name__}")
        if self.checkpoint_id is not None and (not isinstance(self.checkpoint_id, str) or not self.checkpoint_id):
            raise InvalidInputError(f"checkpoint_id must be a non-empty string or None, got {self.checkpoint_id!r}")
        if self.checkpoint_id is not None and self.checkpoint_id.startswith(RUN_ID_PREFIX):
            raise InvalidInputError(
                f"checkpoint_id {self.checkpoint_id!r} starts with {RUN_ID_PREFIX!r}, which is reserved for run ids "
                "(a reference starting with it always names a run id); choose a checkpoint id without that prefix"
            )
        if self.checkpoint_id is not None and self.checkpoint_id.startswith(CHILD_SIGNAL_PREFIX) \
                and self.parent_run_id is None:
            raise InvalidInputError(
                f"checkpoint_id {self.checkpoint_id!r} starts with {CHILD_SIGNAL_PREFIX!r}, which is reserved for the "
                "child runs a workflow starts (ctx.start_child); choose a checkpoint id without that prefix")
        if self.parent_run_id is not None and ref_column(self.parent_run_id) != "run_id":
            raise InvalidInputError(f"parent_run_id must be a run id, got {self.parent_run_id!r}")
        try:
            check_text(self.name, what="the workflow name")
            if self.checkpoint_id is not None:
                check_text(self.checkpoint_id, what="the checkpoint id")
        except SerializationError as exc:
            raise InvalidInputError(str(exc)) from exc
        check_concurrency(self.concurrency_key, self.concurrency_limit)
        # a value that cannot be recorded (NaN, invalid Unicode, an object JSON cannot hold) is refused here as
        # everywhere else a value is recorded: SerializationError. Encoded once: what the history records
        object.__setattr__(self, "_plain", to_plain(dict(self.input), what="the task input"))
        # (and its canonical form taken now, as the history's: an input the caller changes after is neither)
        object.__setattr__(self, "_canonical", canonical_json(dict(self.input), what="the task input",
                                                              one_number=True))

    def first_event(self) -> EventRow:
        """Return the ``run_started`` row that opens this task's history."""
        return EventRow.of(RunStarted(name=self.name, version=self.version, input=self._plain,
                                      checkpoint_id=self.checkpoint_id, parent_run_id=self.parent_run_id))

    def input_json(self) -> bytes:
        """Return the input as canonical JSON, used to compare re-enqueued tasks.

        Inputs compare as JSON values: key order does not matter, nor the order of a set's members (sorted,
        as the process's hash seed orders them), and a float with an integral value is the same number as
        that int (``1.0`` and ``1``, ``-0.0`` and ``0``: JSON has one kind of number).
        """
        return self._canonical


class EventRow(msgspec.Struct, frozen=True):
    """An encoded event as a store writes it."""

    type: str
    key: str
    body: bytes

    @classmethod
    def of(cls, event: Any) -> EventRow:
        key: str = event.key
        if not key.isascii() or "\x00" in key:
            check_text(key, what="an event key")
        return cls(type_tag(event), key, encode_event(event))


class StoredEvent(msgspec.Struct, frozen=True):
    """An encoded event as a store returns it."""

    seq: int
    at: float
    type: str
    key: str
    body: bytes


class Lease(msgspec.Struct, frozen=True):
    """A worker's claim on a run; ``token`` is the fencing token."""

    run_id: str
    owner: str
    token: int
    until: float


class InboxSignal(msgspec.Struct, frozen=True):
    """An accepted signal not yet consumed by a wait."""

    signal_id: str
    name: str
    payload: Any
    sender: str
    reason: str
    received_at: float


class Claim(msgspec.Struct, frozen=True):
    """What a worker gets when it claims a run.

    ``now`` is the store's clock at the claim; ``received`` the worker's monotonic clock when the claim
    came back (no earlier than ``now`` was read: the worker's estimate of the store's clock counts from it,
    so it is never ahead); ``sent`` the worker's monotonic clock when the claim was sent, no later than when
    the store granted the lease (None: ``received``). The worker counts the lease from ``sent``, so a claim
    whose answer came late (a slow network, a frozen process) is renewed before anything of it runs.
    """

    run_id: str
    checkpoint_id: str | None
    name: str
    version: int
    lease: Lease
    now: float
    history: list[StoredEvent]
    inbox: list[InboxSignal]
    received: float = msgspec.field(default_factory=time.monotonic)
    sent: float | None = None
    #: how many times a claim took this run over from a worker whose lease had expired
    recoveries: int = 0


class Continue(msgspec.Struct, frozen=True, tag="continue"):
    """Keep running under the current lease."""


class Finish(msgspec.Struct, frozen=True, tag="finish"):
    """The run ended; release the lease."""

    status: RunStatus
    reason: str = ""


class Suspend(msgspec.Struct, frozen=True, tag="suspend"):
    """The run waits (WAITING: for ``wake_at`` or ``signals``), is PARKED, or DIVERGED (tried again at ``wake_at``)."""

    status: RunStatus
    wake_at: float | None = None
    signals: tuple[str, ...] = ()
    reason: str = ""


class Reschedule(msgspec.Struct, frozen=True, tag="reschedule"):
    """Make the run claimable again from ``at`` (a retry backoff)."""

    at: float
    reason: str = ""


Transition = Continue | Finish | Suspend | Reschedule


class CommitResult(msgspec.Struct, frozen=True):
    revision: int
    at: float


class EnqueueResult(msgspec.Struct, frozen=True):
    run_id: str
    created: bool


class RunInfo(msgspec.Struct, frozen=True):
    """A run's row: identity, scheduling state and lease."""

    run_id: str
    checkpoint_id: str | None
    name: str
    version: int
    status: RunStatus
    revision: int
    due_at: float | None
    lease_owner: str | None
    lease_token: int
    lease_until: float | None
    created_at: float
    updated_at: float
    reason: str
    #: how many times a claim took this run over from a worker whose lease had expired
    recoveries: int = 0
    #: the run's concurrency key and limit (see :class:`WorkflowTask`), or None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None


def check_unreserved(field: str, value: str) -> None:
    """Refuse a signal name or id that takes the form of a child run's result (``child:...``): only a store posts
    those, so a sender cannot pose as a child that finished, or take its signal id and leave the parent waiting.

    Raises:
        SignalRejectedError: ``invalid``.
    """
    if value.startswith(CHILD_SIGNAL_PREFIX):
        raise SignalRejectedError(
            "invalid", f"{field} {value[:40]!r} starts with {CHILD_SIGNAL_PREFIX!r}, which is reserved for the results "
            "of child runs; choose another")


class SignalDelivery(msgspec.Struct, frozen=True):
    """An authenticated signal for a store to deliver.

    ``run_id`` is the run the gateway resolved ``run_ref`` to (and authorised
    against); the store delivers to exactly that run. ``run_ref`` is kept for
    the audit. A run holds at most ``max_unconsumed`` unconsumed signals of each name, and
    the audit keeps its newest ``max_refused`` attempts that were not accepted
    (duplicates and rejections).
    """

    run_ref: str
    run_id: str
    signal_id: str
    name: str
    payload: Any
    sender: str
    key_id: str
    reason: str
    payload_hash: str
    max_unconsumed: int = 1000
    max_refused: int = 1000

    def __post_init__(self) -> None:
        for value, what in ((self.signal_id, "the signal id"), (self.name, "the signal name"),
                            (self.sender, "the sender"), (self.key_id, "the key id"), (self.reason, "the reason")):
            check_text(value, what=what)
        check_unreserved("signal_id", self.signal_id)
        check_unreserved("name", self.name)

    def payload_json(self) -> str:
        """The payload as the JSON text stores keep (any valid Unicode, NUL included)."""
        return encode_value(self.payload, what="the signal payload").decode()


class SignalReceipt(msgspec.Struct, frozen=True):
    """The store's answer to a delivery; for a duplicate, ``received_at`` is the original's and ``run_status`` the
    run's status now."""

    run_id: str
    signal_id: str
    duplicate: bool
    received_at: float
    run_status: RunStatus


class AuditRecord(msgspec.Struct, frozen=True):
    """One signal attempt: accepted, duplicate or rejected. Never holds a secret."""

    run_id: str | None
    run_ref: str
    signal_id: str
    name: str
    sender: str
    key_id: str
    verdict: str
    payload_hash: str
    reason: str
    detail: str
    at: float


class WorkflowStore(Protocol):
    """The durable control plane. Every method is safe to call concurrently.

    A ``run_ref`` is a run id or a checkpoint id (see :func:`ref_column`).
    """

    async def now(self) -> float:
        """Return the store clock's current time (seconds since the epoch)."""
        ...

    async def migrate(self) -> int:
        """Apply pending schema migrations (stores also do this on open); return the schema version."""
        ...

    async def enqueue(self, task: WorkflowTask) -> EnqueueResult:
        """Create a run for ``task`` (idempotent by ``checkpoint_id``; a retried call never creates two)."""
        ...

    async def enqueue_many(self, tasks: Sequence[WorkflowTask]) -> list[EnqueueResult]:
        """Enqueue ``tasks`` in one transaction, one result each, in order.

        Raises:
            EnqueueConflictError: a checkpoint id names a different task; nothing was enqueued.
        """
        ...

    async def claim(
        self, owner: str, names: Collection[str], lease_seconds: float, exclude: Collection[str] = ()
    ) -> Claim | None:
        """Claim the most overdue claimable run of one of ``names``, if any.

        A run whose concurrency key is at its limit is passed over (it stays due).
        """
        ...

    async def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        """Extend a held lease; raise :class:`LeaseLostError` if it is not held."""
        ...

    async def commit(
        self,
        lease: Lease,
        expected_revision: int,
        events: Sequence[EventRow],
        transition: Transition,
        consumed_signals: Sequence[str] = (),
    ) -> CommitResult:
        """Append ``events`` and apply ``transition``, fenced by lease and revision.

        A retried commit whose first attempt was written (its answer lost)
        is recognised and answered with that attempt's result.
        """
        ...

    async def release(self, lease: Lease) -> None:
        """Give a claimed run back untouched, claimable at once."""
        ...

    async def intervene(
        self, run_ref: str, allowed: Collection[RunStatus], events: Sequence[EventRow], status: RunStatus,
        reason: str = "", *, decided_at: int | None = None,
    ) -> CommitResult:
        """An operator's append (cancel, resolve, retry): fences off any lease holder; ``reason`` becomes the run's.

        Raises:
            InvalidStateError: the run's status is not in ``allowed``, or its revision is no longer ``decided_at``
                (the revision the action was decided on), see :func:`runifold.stores._rule.intervene_refusal`.
        """
        ...

    async def wake(self, run_ref: str) -> RunInfo:
        """Make a READY, WAITING or DIVERGED run due now (no event appended).

        Raises:
            InvalidStateError: the run has another status (the message says what to do instead).
        """
        ...

    async def purge(self, run_ref: str) -> None:
        """Delete a *finished* run with its history, signals and audit (retention, drill clean-up).

        Raises:
            InvalidStateError: the run has not finished.
        """
        ...

    async def purge_finished(self, before: float, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` finished runs last updated before ``before``; return how many (loop until 0)."""
        ...

    async def get_run(self, run_ref: str) -> RunInfo:
        """Return a run by run id or checkpoint id."""
        ...

    async def list_runs(
        self,
        *,
        status: RunStatus | Collection[RunStatus] | None = None,
        name: str | None = None,
        version: int | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[RunInfo]:
        """List runs, newest first; ``after`` (a run id) returns the runs strictly older than it. ``status`` is one
        status or several (the runs in any of them: ``UNFINISHED``, say); the store filters, so a listing of a few
        unfinished runs among millions of finished ones reads only those (see :func:`listed_statuses`)."""
        ...

    async def count_runs(
        self, *, status: RunStatus | Collection[RunStatus] | None = None, name: str | None = None,
        version: int | None = None, concurrency_key: str | None = None, holding_slot: bool = False,
    ) -> int:
        """Count runs (of a concurrency key too: how many of its runs are running, say); ``status`` as in
        :meth:`list_runs`.

        ``holding_slot`` counts only runs that hold a slot of their concurrency key: running under a
        lease that has not expired on the store's clock (a run whose worker died holds none).
        """
        ...

    async def history(self, run_ref: str) -> list[StoredEvent]:
        """Return a run's whole log in order."""
        ...

    async def inbox(self, run_id: str) -> list[InboxSignal]:
        """Return the signals of run ``run_id`` that no wait has consumed, oldest first (what a claim returns as
        its inbox): a worker executing the run reads it to see the signals that arrived since its claim."""
        ...

    async def deliver_signal(self, delivery: SignalDelivery) -> SignalReceipt:
        """Store a signal once per ``(run_id, signal_id)`` and wake the run if it waits for it.

        Raises:
            RunNotFoundError: no run ``delivery.run_id`` (any more).
            SignalConflictError: the signal id names another signal of that run (audited).
            SignalRejectedError: the run holds ``max_unconsumed`` unconsumed signals (audited).
        """
        ...

    async def record_rejected(self, record: AuditRecord, *, max_per_run: int = 1000) -> None:
        """Keep a rejected signal attempt in the audit log (no run state changes).

        Only the newest ``max_per_run`` rejected attempts of a run are kept
        (of attempts against no known run, the newest ``10 * max_per_run``).
        """
        ...

    async def audit(self, run_ref: str) -> list[AuditRecord]:
        """Return every signal attempt against a run, oldest first."""
        ...

    async def wait_for_work(self, timeout: float) -> None:
        """Return when new work may be claimable, or after ``timeout`` seconds."""
        ...

    async def add_schedule(self, schedule: Schedule) -> ScheduleInfo:
        """Keep ``schedule``, replacing the one of its name (see :func:`runifold.stores._rule.schedule_added`).

        Adding a schedule identical to the stored one changes nothing. A new or
        changed one starts with its first tick after now; a replaced one keeps
        its paused state.
        """
        ...

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule (runs it started stay).

        Raises:
            ScheduleNotFoundError: no schedule of that name.
        """
        ...

    async def list_schedules(self) -> list[ScheduleInfo]:
        """Every schedule, by name."""
        ...

    async def pause_schedule(self, name: str, *, paused: bool = True) -> ScheduleInfo:
        """Pause a schedule (no tick starts while paused), or resume it (``paused=False``): ticks due while it
        was paused are never started.

        Raises:
            ScheduleNotFoundError: no schedule of that name.
        """
        ...

    async def advance_schedules(self, ticks: Mapping[str, float]) -> None:
        """Record that each named schedule started its ticks up to ``ticks[name]`` (``last_tick`` only grows;
        names no longer stored are ignored)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


#: every run id starts with this; no checkpoint id may
RUN_ID_PREFIX = "run_"


def new_run_id(now: float) -> str:
    """Return a new run id that sorts by creation time: ``run_`` + 24 lowercase hex digits."""
    return f"{RUN_ID_PREFIX}{int(now * 1000):012x}{secrets.token_hex(6)}"


def ref_column(run_ref: str) -> Literal["run_id", "checkpoint_id"]:
    """Say which column a run reference names: ``run_`` starts a run id, anything else is a checkpoint id.

    Raises:
        SerializationError: the reference holds NUL or invalid Unicode, which no id can (every store the same).
    """
    check_text(run_ref, what="the run reference")
    return "run_id" if run_ref.startswith(RUN_ID_PREFIX) else "checkpoint_id"


#: the largest count or limit a store takes: the bound of its integer columns, which bounds versions too
#: (:data:`runifold.history.MAX_VERSION`); a larger limit means "all of them"
MAX_INT = MAX_VERSION


#: ``count_runs`` takes no limit
_NO_LIMIT: Any = object()


def check_listing(*, status: RunStatus | Collection[RunStatus] | None = None, name: str | None = None,
                  after: str | None = None, limit: int = _NO_LIMIT, version: int | None = None,
                  concurrency_key: str | None = None, holding_slot: bool = False) -> int:
    """Refuse filters of ``list_runs`` and ``count_runs`` that no store could answer the same way; return the
    limit a store is given (``list_runs``'s: one above :data:`MAX_INT` is all runs, as it is; 0 when none)."""
    listed_statuses(status)
    for value, what in ((name, "the workflow name"), (after, "the run id to list after"),
                        (concurrency_key, "the concurrency key")):
        if value is not None:
            check_text(value, what=what)
    if version is not None and not is_version(version):
        raise InvalidInputError(f"version must be a whole number from 1 to {MAX_VERSION:,}, got {version!r}")
    if not isinstance(holding_slot, bool):
        raise InvalidInputError(f"holding_slot must be True or False, got {holding_slot!r}")
    if limit is _NO_LIMIT:
        return 0
    if not _whole(limit) or limit < 0:
        raise InvalidInputError(f"limit must be a whole number from 0, got {limit!r}")
    return min(limit, MAX_INT)


def listed_statuses(status: RunStatus | Collection[RunStatus] | None) -> list[str] | None:
    """The statuses a ``status`` filter of ``list_runs`` or ``count_runs`` lets through, as a store's query takes
    them (None: every status; an empty collection: none)."""
    if status is None:
        return None
    many = not isinstance(status, str) and isinstance(status, Collection)
    listed = []
    every: Collection[Any] = status if many else [status]
    for one in every:
        try:
            listed.append(RunStatus(one).value)
        except ValueError:
            raise InvalidInputError(f"status must be one of {', '.join(s.value for s in RunStatus)}"
                                    f"{' (or a collection of them)' if many else ''}, got {one!r}") from None
    return sorted(set(listed))


def check_purge(before: float, limit: int) -> tuple[float, int]:
    """Refuse arguments of ``purge_finished`` that are no time or no count, so every store deletes the same runs;
    return them as a store takes them (a limit above :data:`MAX_INT` is all runs, as it is)."""
    try:
        cutoff = float(before) if isinstance(before, (int, float)) and not isinstance(before, bool) else math.nan
    except OverflowError:  # an int too large for any clock
        cutoff = math.nan
    if not math.isfinite(cutoff):
        raise InvalidInputError(f"purge_finished needs before= as a finite time (seconds since the epoch), "
                                f"got {before!r}")
    if not _whole(limit) or limit < 1:
        raise InvalidInputError(f"purge_finished needs limit= of at least 1, got {limit!r}")
    return cutoff, min(limit, MAX_INT)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_text(value: str, *, what: str) -> None:
    """Refuse text a store cannot keep in a text column the same way everywhere: NUL, or invalid Unicode.

    Values (inputs, outputs, payloads) are JSON and may hold any valid Unicode,
    NUL included; identifiers and reasons are plain text columns.

    Raises:
        InvalidInputError: ``value`` is not a string.
        SerializationError: it holds NUL or invalid Unicode.
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__} {value!r}")
    if "\x00" in value:
        raise SerializationError(f"{what} {value!r} holds a NUL character, which a store cannot keep in a text "
                                 "column; remove it (values may hold NUL: they are stored as JSON)")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise SerializationError(f"{what} {value!r} is not valid Unicode ({exc.reason}); "
                                 "decode bytes with errors='replace'") from exc


#: the longest concurrency key a task may name
MAX_CONCURRENCY_KEY = 200


def check_concurrency(key: str | None, limit: int | None) -> None:
    """Refuse a concurrency key without a limit (or the reverse), an empty or unkeepable key, a limit below 1."""
    if key is None and limit is None:
        return
    if key is None or limit is None:
        raise InvalidInputError(
            f"concurrency_key and concurrency_limit go together, got key {key!r} and limit {limit!r}; "
            "give both (at most `limit` runs of `key` at once) or neither"
        )
    if not isinstance(key, str) or not key or len(key) > MAX_CONCURRENCY_KEY:
        raise InvalidInputError(
            f"concurrency_key must be a string of 1 to {MAX_CONCURRENCY_KEY} characters, got {key!r:.80}"
        )
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidInputError(f"concurrency_limit must be an integer >= 1, got {limit!r}")
    try:
        check_text(key, what="the concurrency key")
    except SerializationError as exc:
        raise InvalidInputError(str(exc)) from exc


def clean_text(value: str) -> str:
    """Return ``value`` with NUL and lone surrogates replaced by U+FFFD: for display-only text (reasons, audits)."""
    if value.isascii() and "\x00" not in value:
        return value
    return "".join("\ufffd" if c == "\x00" or "\ud800" <= c <= "\udfff" else c for c in value)


def clean_audit(record: AuditRecord) -> AuditRecord:
    """``record`` with its free text made safe for every store (see :func:`clean_text`)."""
    return AuditRecord(
        record.run_id, clean_text(record.run_ref), clean_text(record.signal_id), clean_text(record.name),
        clean_text(record.sender), clean_text(record.key_id), record.verdict, clean_text(record.payload_hash),
        clean_text(record.reason), clean_text(record.detail), record.at,
    )


class RunColumns(msgspec.Struct, frozen=True):
    """The scheduling columns a transition writes (it also clears the lease)."""

    status: RunStatus
    due_at: float | None
    wait_signals: tuple[str, ...]
    reason: str


def transition_columns(transition: Transition) -> RunColumns | None:
    """Return what ``transition`` writes to the run row; None for ``Continue``."""
    match transition:
        case Continue():
            return None
        case Finish(status=status, reason=reason):
            return RunColumns(status, None, (), clean_text(reason))
        case Suspend(status=status, wake_at=wake_at, signals=signals, reason=reason):
            timed = status in (RunStatus.WAITING, RunStatus.DIVERGED)
            return RunColumns(status, wake_at if timed else None, signals, clean_text(reason))
        case Reschedule(at=at, reason=reason):
            return RunColumns(RunStatus.READY, at, (), clean_text(reason))
    raise AssertionError(f"unknown transition {transition!r}")
