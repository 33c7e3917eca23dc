"""The embedded SQLite store: one machine, durable by default.

* WAL journal, ``synchronous=FULL``: a commit is on disk when it returns.
* Two connections, each owned by a thread of the store's (``_thread.py``):
  a writer and a reader. The writer commits in groups: every write queued
  while a transaction is in progress goes into the next one, and each caller
  is answered only after that commit. Concurrent runs share an fsync. A group
  in which one write fails is rolled back and its writes run again one
  transaction each, so one that fails fails alone.
* While the store holds at most one run's lease and the writer is idle, a
  write runs on the writer's connection in the calling thread instead
  (``direct_writes``): nobody could share its fsync, and the hand-off to the
  thread and back costs more than the write. It never waits for a lock there:
  if another process holds it, the write goes to the writer thread.
* Another process holding the write lock is waited for up to ``busy_seconds``
  of wall time per operation, then :class:`StoreUnavailableError`;
  ``database is locked`` never reaches a user.
* ``readonly=True`` opens an existing database for reading only: no
  migration, no WAL switch, no file created.

What an operation writes is decided by :mod:`runifold.stores._rule`; the
statements are in ``sql/sqlite/queries.sql``.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar, final

import msgspec
from runifold._log import get_logger

from runifold.errors import (
    EnqueueConflictError,
    LeaseLostError,
    RunifoldError,
    RunNotFoundError,
    SignalConflictError,
    StoreError,
    StoreUnavailableError,
)
from runifold.stores import _rule
from runifold.stores import _sqlite_schedules as schedules
from runifold.stores._protocol import (
    AuditRecord,
    Claim,
    CommitResult,
    EnqueueResult,
    EventRow,
    InboxSignal,
    Lease,
    RunInfo,
    RunStatus,
    SignalDelivery,
    SignalReceipt,
    StoredEvent,
    Transition,
    WorkflowTask,
    clean_audit,
    check_listing,
    listed_statuses,
    check_purge,
    clean_text,
    new_run_id,
    ref_column,
    transition_columns,
)
from runifold.stores._schedule import Schedule, ScheduleInfo, check_schedule_name
from runifold.stores._sqlite_errors import errorname as _errorname, is_busy as _is_busy, open_error as _open_error
from runifold.stores._sqlite_errors import translate as _translate
from runifold.stores._sql import by_ref, closed_store, migrations, newer_schema, numbered, queries
from runifold.stores._thread import ConnectionThread, Outcome

T = TypeVar("T")
Op = Callable[[sqlite3.Connection], T]
log = get_logger("runifold.stores.sqlite")

Q = queries("sqlite")
RUN = by_ref(Q["run"])
TASK_OF = by_ref(Q["task_of"])
SCHEMA_VERSION = migrations("sqlite")[-1][0]
_json = msgspec.json.encode


def _json_list(values: list[str] | None) -> str | None:
    return None if values is None else _json(values).decode()


#: a run committing alone, directly, lets the event loop run other tasks at least this often, and whenever this
#: long (seconds) has passed since it last did (a step that blocked the loop: see _write)
DIRECT_WRITES_PER_YIELD, DIRECT_YIELD_AFTER = 8, 0.02


def _run_info(row: Sequence[Any]) -> RunInfo:
    return RunInfo(row[0], row[1], row[2], row[3], RunStatus(row[4]), row[5], row[6], row[7], row[8],
                   row[9], row[10], row[11], row[12], row[13], row[15], row[16])


def _state(row: Sequence[Any]) -> _rule.RunState:
    return _rule.RunState(RunStatus(row[4]), row[5], row[8], row[9], tuple(msgspec.json.decode(row[14])), row[12])


def _find(conn: sqlite3.Connection, ref: str) -> Any:
    row = conn.execute(RUN[ref_column(ref)], (ref,)).fetchone()
    if row is None:
        raise RunNotFoundError(ref)
    return row


def _notify_parent(conn: sqlite3.Connection, run_id: str, status: RunStatus, events: Sequence[EventRow],
                   now: float) -> None:
    """Rule 6: a finished child posts its last event to its parent's inbox, waking the parent if it waits for it."""
    if not status.finished or not events:
        return
    row = conn.execute(Q["parent_of"], (run_id,)).fetchone()
    parent, last = None if row is None else row[0], events[-1].body.decode()
    if not _rule.child_notice(status, parent, last):
        return
    name = _rule.child_signal(run_id)
    conn.execute(Q["insert_child_signal"], numbered((parent, name, last, _rule.CHILD_SENDER, now)))
    conn.execute(Q["wake_waiter"], (now, parent, name))


def _insert_events(conn: sqlite3.Connection, run_id: str, first_seq: int, events: Sequence[EventRow], now: float) -> None:
    if len(events) == 1:  # most commits: one statement, without executemany's iteration
        e = events[0]
        conn.execute(Q["insert_event"], (run_id, first_seq, e.type, e.key, now, e.body.decode()))
        return
    conn.executemany(Q["insert_event"],
                     [(run_id, first_seq + i, e.type, e.key, now, e.body.decode()) for i, e in enumerate(events)])


def _delete(conn: sqlite3.Connection, run_id: str) -> None:
    for statement in ("delete_events", "delete_signals", "delete_audit", "delete_run"):
        conn.execute(Q[statement], (run_id,))


def _begin(conn: sqlite3.Connection, deadline: float) -> None:
    """``BEGIN IMMEDIATE``, waiting for another process's lock until ``deadline`` (monotonic), no longer."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        return
    except sqlite3.OperationalError as exc:
        remaining = deadline - time.monotonic()
        if not _is_busy(exc) or remaining <= 0:
            raise
    # invariant: the connection's own busy timeout is 0; this one wait is the operation's whole budget
    conn.execute(f"PRAGMA busy_timeout = {int(remaining * 1000)}")
    try:
        conn.execute("BEGIN IMMEDIATE")
    finally:
        conn.execute("PRAGMA busy_timeout = 0")


def _file_uri(path: str, **params: str) -> str:
    return f"file:{urllib.parse.quote(os.path.abspath(path))}?{urllib.parse.urlencode(params)}"


@final
class SqliteWorkflowStore:
    """A :class:`WorkflowStore` in one SQLite file.

    Open it with ``await SqliteWorkflowStore.open(path)``; the schema is created
    or migrated on open (unless ``readonly``).
    """

    def __init__(
        self,
        path: str,
        writer: sqlite3.Connection | None,
        reader: sqlite3.Connection,
        clock: Callable[[], float],
        busy_seconds: float,
        direct_writes: bool,
    ) -> None:
        self.path = path
        self._clock = clock
        self._busy_seconds = busy_seconds
        self._direct_writes = direct_writes
        self._writer = None if writer is None else ConnectionThread(writer, self._apply, "runifold-sqlite-writer")
        self._reader = ConnectionThread(reader, _read_each, "runifold-sqlite-reader")
        self._closed = False
        #: the leases this store handed out and has not seen end: run id -> lease_until
        self._leases: dict[str, float] = {}
        self._work = asyncio.Event()
        #: durable transactions (fsyncs) and the write operations they carried
        self.transactions = 0
        self.operations = 0
        #: writes that ran in the calling thread (``direct_writes``)
        self.direct, self._yielded = 0, time.monotonic()

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        clock: Callable[[], float] = time.time,
        durable: bool = True,
        busy_seconds: float = 30.0,
        readonly: bool = False,
        direct_writes: bool = True,
    ) -> SqliteWorkflowStore:
        """Open (creating and migrating if needed) the store at ``path``.

        Args:
            path: the database file.
            clock: the store's clock; inject a fake one in tests.
            durable: ``synchronous=FULL`` (default) or ``NORMAL`` (faster, may lose
                the last commits on power loss, never corrupts).
            busy_seconds: how long one operation waits, in all, for another process's lock.
            readonly: open an existing database for reading only (no migration, no
                file created; works on a read-only file system). Writes raise
                :class:`StoreError`.
            direct_writes: while the store holds at most one lease, run a write in the
                calling thread when the writer thread is idle (default). ``False``
                sends every write through the writer thread, so the event loop never
                waits for an fsync, at some CPU per step.

        Raises:
            StoreUnavailableError: the database cannot be opened (the message names the path).
            StoreError: its schema is newer than this runifold.
        """
        if readonly:
            reader = await asyncio.to_thread(_open_readonly, path, busy_seconds)
            return cls(path, None, reader, clock, busy_seconds, False)

        def connect() -> tuple[sqlite3.Connection, sqlite3.Connection]:
            writer = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
            try:
                deadline = time.monotonic() + busy_seconds
                _begin(writer, deadline)  # waits out a migrating process, within the budget
                writer.execute("COMMIT")
                if writer.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    writer.execute("PRAGMA journal_mode = WAL")
                writer.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
                reader = sqlite3.connect(path, timeout=busy_seconds, isolation_level=None, check_same_thread=False)
            except BaseException:
                writer.close()
                raise
            return writer, reader

        try:
            writer, reader = await asyncio.to_thread(connect)
        except sqlite3.Error as exc:
            raise _open_error(exc, path) from exc
        store = cls(path, writer, reader, clock, busy_seconds, direct_writes)
        try:
            await store.migrate()
        except BaseException:
            await store.close()
            raise
        return store

    async def migrate(self) -> int:
        """Apply pending schema migrations; return the schema version."""
        if self._writer is None:
            return await self._read(lambda conn: _schema_version(conn, self.path))

        def op(conn: sqlite3.Connection) -> int:
            conn.execute(Q["create_schema_table"])
            conn.execute(Q["probe_write"])  # a file it cannot write is refused here, not at a worker's every claim
            current = int(conn.execute(Q["schema_version"]).fetchone()[0] or 0)
            if current > SCHEMA_VERSION:
                raise newer_schema(self.path, current, SCHEMA_VERSION)
            for version, sql in migrations("sqlite"):
                if version > current:
                    for statement in _statements(sql):
                        conn.execute(statement)
                    conn.execute(Q["record_version"], (version, self._clock()))
                    current = version
                    log.info("schema_migrated", path=self.path, version=version)
            return current

        return await self._write(op)

    # -- writes ---------------------------------------------------------------------

    async def _write(self, op: Op[T], *, wake: bool = False, orphan: Callable[[T], None] | None = None) -> T:
        """Run a write, grouped with others in the writer thread or, alone, in the caller."""
        if self._closed:
            raise closed_store(f"the SQLite store {self.path}")
        if self._writer is None:
            raise StoreError(f"the SQLite store {self.path} was opened read-only; open it without readonly to write")
        try:
            if self._alone():
                # invariant: direct writes yield to the event loop, as I/O does, at least every
                # DIRECT_WRITES_PER_YIELD. A direct write never suspends, so without this a run whose steps are
                # quick would run to its end in one pass of the loop, other runs would never get to claim or
                # commit beside it, and it would always look alone: no grouping, and a supervisor's other slots
                # starved; nor would a SIGTERM's handler run while async steps block the loop (helper-98)
                if self.direct % DIRECT_WRITES_PER_YIELD == 0 or time.monotonic() - self._yielded > DIRECT_YIELD_AFTER:
                    await asyncio.sleep(0)
                    self._yielded = time.monotonic()
                    if not self._alone():
                        return await self._writer.submit(op, orphan)  # type: ignore[no-any-return]
                [(value, exc)] = self._apply(self._writer.connection, [op], budget=0.0)
                if exc is None:
                    self.direct += 1
                    return value  # type: ignore[no-any-return]
                if not _is_busy(exc):
                    raise exc
                # another process holds the lock: wait for it in the writer thread, not here
            return await self._writer.submit(op, orphan)  # type: ignore[no-any-return]
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        finally:
            if wake:
                self._work.set()

    def _alone(self) -> bool:
        """Direct writes are on, the writer thread has nothing to do, and at most one lease of ours is live."""
        if not self._direct_writes or self._writer is None or self._writer.in_flight:
            return False
        if len(self._leases) > 1:
            now = self._clock()
            self._leases = {run_id: until for run_id, until in self._leases.items() if until > now}
        return len(self._leases) <= 1

    def _apply(self, conn: sqlite3.Connection, ops: Sequence[Op[Any]], budget: float | None = None) -> list[Outcome]:
        """Run ``ops`` in one transaction. If it fails (an op raises, or it cannot begin or commit), it is rolled
        back and each op runs again in a transaction of its own, so one that fails fails alone (an op writes only
        through ``conn``: running it again after a rollback is running it once)."""
        deadline = time.monotonic() + (self._busy_seconds if budget is None else budget)
        outcomes = self._transaction(conn, ops, deadline)
        if len(ops) > 1 and any(exc is not None for _, exc in outcomes):
            outcomes = [self._transaction(conn, [op], deadline)[0] for op in ops]
        return outcomes

    def _transaction(self, conn: sqlite3.Connection, ops: Sequence[Op[Any]], deadline: float) -> list[Outcome]:
        """Run ``ops`` in one transaction: all commit, or (one raised) none does and every outcome is the error."""
        try:
            _begin(conn, deadline)
        except sqlite3.Error as exc:
            return [(None, exc)] * len(ops)
        try:
            values = [op(conn) for op in ops]
            conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [(None, exc)] * len(ops)
        self.transactions += 1
        self.operations += len(ops)
        return [(value, None) for value in values]

    async def _read(self, fn: Op[T]) -> T:
        if self._closed:  # (its thread has ended: a job queued now would never be answered)
            raise closed_store(f"the SQLite store {self.path}")
        try:
            return await self._reader.submit(fn)  # type: ignore[no-any-return]
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    # -- protocol -----------------------------------------------------------------

    async def now(self) -> float:
        return self._clock()

    async def enqueue(self, task: WorkflowTask) -> EnqueueResult:
        return (await self.enqueue_many([task]))[0]

    async def enqueue_many(self, tasks: Sequence[WorkflowTask]) -> list[EnqueueResult]:
        planned = [(task, task.input_json().decode(), task.first_event()) for task in tasks]

        def op(conn: sqlite3.Connection) -> list[EnqueueResult]:
            now = self._clock()
            results = []
            for task, input_json, first in planned:
                run_id = new_run_id(now)
                existing = None
                if task.checkpoint_id is not None:
                    existing = conn.execute(TASK_OF["checkpoint_id"], (task.checkpoint_id,)).fetchone()
                verdict = _rule.enqueue_verdict(existing, run_id, task.name, task.version, input_json,
                                                task.parent_run_id)
                if existing is not None and verdict == "conflict":
                    raise EnqueueConflictError(task.checkpoint_id or "", existing[0])
                if existing is not None and verdict == "existing":
                    results.append(EnqueueResult(existing[0], False))
                    continue
                conn.execute(Q["insert_run"], (run_id, task.checkpoint_id, task.name, task.version, input_json,
                                               now, now, now, task.parent_run_id, task.concurrency_key,
                                               task.concurrency_limit))
                _insert_events(conn, run_id, 1, [first], now)
                results.append(EnqueueResult(run_id, True))
            return results

        return await self._write(op, wake=True)

    async def claim(
        self, owner: str, names: Collection[str], lease_seconds: float, exclude: Collection[str] = ()
    ) -> Claim | None:
        names_json = _json(sorted(names)).decode()
        exclude_json = _json(sorted(exclude)).decode()

        def op(conn: sqlite3.Connection) -> Claim | None:
            sent, now = time.monotonic(), self._clock()
            until = now + lease_seconds
            row = conn.execute(Q["claim"], numbered((owner, until, now, names_json, exclude_json))).fetchone()
            if row is None:
                return None
            run_id, checkpoint_id, name, version, token, recoveries = row
            # invariant: read in the claim's transaction, so the history is the one the lease covers
            return Claim(run_id, checkpoint_id, name, version, Lease(run_id, owner, token, until), now,
                         _history(conn, run_id), _inbox(conn, run_id), sent=sent, recoveries=recoveries)

        claim = await self._write(op, orphan=self._hand_back)
        if claim is not None:
            self._leases[claim.run_id] = claim.lease.until
        return claim

    def _hand_back(self, claim: Claim | None) -> None:
        """A claim whose caller was cancelled while it ran: release the run at once rather than orphan its lease."""
        if claim is not None and self._writer is not None:
            self._writer.submit(lambda conn: conn.execute(Q["release"], (self._clock(), claim.run_id, claim.lease.token)))

    async def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        def op(conn: sqlite3.Connection) -> Lease:
            now = self._clock()
            row = conn.execute(RUN["run_id"], (lease.run_id,)).fetchone()
            run = None if row is None else _state(row)
            if _rule.fence(run, lease, row[5] if row else 0, now) is not None:
                raise LeaseLostError(lease.run_id, _rule.renewal_refused(None if run is None else run.status))
            until = now + lease_seconds
            conn.execute(Q["renew"], (until, until, lease.run_id))
            return Lease(lease.run_id, lease.owner, lease.token, until)

        try:
            renewed = await self._write(op)
        except LeaseLostError:
            self._leases.pop(lease.run_id, None)
            raise
        self._leases[lease.run_id] = renewed.until
        return renewed

    async def commit(
        self,
        lease: Lease,
        expected_revision: int,
        events: Sequence[EventRow],
        transition: Transition,
        consumed_signals: Sequence[str] = (),
    ) -> CommitResult:
        columns = transition_columns(transition)

        def op(conn: sqlite3.Connection) -> CommitResult:
            now = self._clock()
            revision = expected_revision + len(events)
            fence = (lease.run_id, lease.token, now, expected_revision)
            if columns is None:
                changed = conn.execute(Q["append"], (revision, now, *fence)).rowcount
            else:
                changed = conn.execute(Q["transition"], (
                    revision, now, columns.status, columns.due_at, _json(columns.wait_signals).decode(),
                    columns.reason, *fence)).rowcount
            if not changed:
                # fenced off: a retry of this very commit (its first attempt written, the answer lost) is
                # recognised; otherwise the rule says why
                row = conn.execute(RUN["run_id"], (lease.run_id,)).fetchone()
                run = None if row is None else _state(row)
                stored = conn.execute(Q["events_after"], (lease.run_id, expected_revision)).fetchall()
                if _rule.is_own_retry(run, lease, expected_revision, events, columns, stored):
                    return CommitResult(row[5], row[11])
                refused = _rule.fence(run, lease, expected_revision, now)
                assert refused is not None, "the commit's UPDATE and _rule.fence disagree"
                raise LeaseLostError(lease.run_id, refused)
            _insert_events(conn, lease.run_id, expected_revision + 1, events, now)
            if consumed_signals:
                conn.executemany(Q["consume"], [(lease.run_id, s) for s in consumed_signals])
            if columns is not None:
                if columns.status is RunStatus.WAITING and columns.wait_signals:
                    unconsumed = {r[0] for r in conn.execute(Q["unconsumed_names"], (lease.run_id,))}
                    due = _rule.commit_due(columns, now, unconsumed)
                    if due != columns.due_at:
                        conn.execute(Q["wake"], (due, lease.run_id))
                _notify_parent(conn, lease.run_id, columns.status, events, now)
            return CommitResult(revision, now)

        try:
            # a transition sets a due time (idle slots re-check) and ends the lease
            result = await self._write(op, wake=columns is not None)
        except LeaseLostError:
            self._leases.pop(lease.run_id, None)
            raise
        if columns is not None:
            self._leases.pop(lease.run_id, None)
        return result

    async def release(self, lease: Lease) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(Q["release"], (self._clock(), lease.run_id, lease.token))

        try:
            await self._write(op, wake=True)
        finally:
            self._leases.pop(lease.run_id, None)

    async def intervene(
        self, run_ref: str, allowed: Collection[RunStatus], events: Sequence[EventRow], status: RunStatus,
        reason: str = "", *, decided_at: int | None = None,
    ) -> CommitResult:
        def op(conn: sqlite3.Connection) -> CommitResult:
            info = _run_info(_find(conn, run_ref))
            refused = _rule.intervene_refusal(info.run_id, info.status, allowed, info.revision, decided_at)
            if refused is not None:
                raise refused
            now = self._clock()
            revision = info.revision + len(events)
            _insert_events(conn, info.run_id, info.revision + 1, events, now)
            conn.execute(Q["intervene"], (revision, now, status, _rule.intervene_due(status, now), clean_text(reason),
                                          info.run_id))
            _notify_parent(conn, info.run_id, status, events, now)
            return CommitResult(revision, now)

        return await self._write(op, wake=True)

    async def wake(self, run_ref: str) -> RunInfo:
        def op(conn: sqlite3.Connection) -> RunInfo:
            info = _run_info(_find(conn, run_ref))
            refused = _rule.wake_refusal(info.run_id, info.status)
            if refused is not None:
                raise refused
            conn.execute(Q["wake"], (self._clock(), info.run_id))
            return _run_info(_find(conn, info.run_id))

        return await self._write(op, wake=True)

    async def purge(self, run_ref: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            info = _run_info(_find(conn, run_ref))
            refused = _rule.purge_refusal(info.run_id, info.status)
            if refused is not None:
                raise refused
            _delete(conn, info.run_id)

        await self._write(op)

    async def purge_finished(self, before: float, *, limit: int = 1000) -> int:
        before, limit = check_purge(before, limit)
        def op(conn: sqlite3.Connection) -> int:
            doomed = [r[0] for r in conn.execute(Q["finished_before"], (before, limit))]
            for run_id in doomed:
                _delete(conn, run_id)
            return len(doomed)

        return await self._write(op)

    async def get_run(self, run_ref: str) -> RunInfo:
        return _run_info(await self._read(lambda c: _find(c, run_ref)))

    async def list_runs(
        self,
        *,
        status: RunStatus | Collection[RunStatus] | None = None,
        name: str | None = None,
        version: int | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[RunInfo]:
        limit = check_listing(status=status, name=name, after=after, limit=limit, version=version)
        params = (_json_list(listed_statuses(status)), name, version, after, limit)
        rows = await self._read(lambda c: c.execute(Q["list_runs"], numbered(params)).fetchall())
        return [_run_info(r) for r in rows]

    async def count_runs(
        self, *, status: RunStatus | Collection[RunStatus] | None = None, name: str | None = None,
        version: int | None = None, concurrency_key: str | None = None, holding_slot: bool = False,
    ) -> int:
        check_listing(status=status, name=name, version=version, concurrency_key=concurrency_key,
                      holding_slot=holding_slot)
        params = (_json_list(listed_statuses(status)), name, version, concurrency_key,
                  self._clock() if holding_slot else None)
        return int((await self._read(lambda c: c.execute(Q["count_runs"], numbered(params)).fetchone()))[0])

    async def history(self, run_ref: str) -> list[StoredEvent]:
        return await self._read(lambda conn: _history(conn, _find(conn, run_ref)[0]))

    async def inbox(self, run_id: str) -> list[InboxSignal]:
        return await self._read(lambda conn: _inbox(conn, run_id))

    async def deliver_signal(self, delivery: SignalDelivery) -> SignalReceipt:
        payload = delivery.payload_json()

        def op(conn: sqlite3.Connection) -> tuple[str, SignalReceipt]:
            row = _find(conn, delivery.run_id)
            info = _run_info(row)
            now = self._clock()
            found = conn.execute(Q["signal_of"], (info.run_id, delivery.signal_id)).fetchone()
            unconsumed = 0 if found else conn.execute(Q["unconsumed_count"], (info.run_id, delivery.name)).fetchone()[0]
            existing = None if found is None else (found[0], found[1], found[3], found[4])
            verdict, detail = _rule.signal_verdict(delivery, existing, unconsumed, info.status.finished)
            _insert_audit(conn, AuditRecord(
                info.run_id, delivery.run_ref, delivery.signal_id, delivery.name, delivery.sender, delivery.key_id,
                verdict, delivery.payload_hash, delivery.reason, detail, now))
            if verdict != "accepted":
                conn.execute(Q["trim_refused"], (info.run_id, info.run_id, delivery.max_refused))
                received = found[2] if found else now
                return verdict, SignalReceipt(info.run_id, delivery.signal_id, True, received, info.status)
            conn.execute(Q["insert_signal"], (info.run_id, delivery.signal_id, delivery.name, payload,
                                              delivery.payload_hash, delivery.sender, delivery.key_id, delivery.reason,
                                              now, info.run_id))
            if _rule.signal_wakes(info.status, msgspec.json.decode(row[14]), delivery.name):
                conn.execute(Q["wake"], (now, info.run_id))
            return verdict, SignalReceipt(info.run_id, delivery.signal_id, False, now, info.status)

        verdict, receipt = await self._write(op, wake=True)
        if verdict == "rejected:conflict":
            raise SignalConflictError(receipt.run_id, receipt.signal_id)
        if verdict == "rejected:inbox_full":
            raise _rule.inbox_full(receipt.run_id, delivery.name, delivery.max_unconsumed)
        return receipt

    async def record_rejected(self, record: AuditRecord, *, max_per_run: int = 1000) -> None:
        record = clean_audit(record)
        cap = _rule.refused_cap(record.run_id, max_per_run)

        def op(conn: sqlite3.Connection) -> None:
            _insert_audit(conn, record)
            conn.execute(Q["trim_refused"], (record.run_id, record.run_id, cap))

        await self._write(op)

    async def audit(self, run_ref: str) -> list[AuditRecord]:
        def read(conn: sqlite3.Connection) -> list[AuditRecord]:
            try:
                run_id = _find(conn, run_ref)[0]
            except RunNotFoundError:
                run_id = None
            return [AuditRecord(*r) for r in conn.execute(Q["audit"], (run_id, run_ref))]

        return await self._read(read)

    async def wait_for_work(self, timeout: float) -> None:
        # Writes from this process wake us at once, and we sleep no longer than
        # until the next due time (a timer, a retry, a lease expiry); other
        # processes' writes are seen at the next poll (SQLite has no notification).
        wait = timeout
        # only future due times: a run already due that we could not claim (another
        # workflow's, or skipped) must not make idle workers spin
        now = self._clock()
        row = await self._read(lambda c: c.execute(Q["next_due"], (now,)).fetchone())
        if row is not None and row[0] is not None:
            wait = max(0.0, min(wait, row[0] - now))
        try:
            await asyncio.wait_for(self._work.wait(), wait)
        except TimeoutError:
            pass
        self._work.clear()

    # -- schedules (the operations: _sqlite_schedules.py) ------------------------------

    async def add_schedule(self, schedule: Schedule) -> ScheduleInfo:
        return await self._write(lambda conn: schedules.add(conn, schedule, self._clock()))

    async def delete_schedule(self, name: str) -> None:
        check_schedule_name(name)
        await self._write(lambda conn: schedules.delete(conn, name))

    async def list_schedules(self) -> list[ScheduleInfo]:
        return await self._read(schedules.listing)

    async def pause_schedule(self, name: str, *, paused: bool = True) -> ScheduleInfo:
        check_schedule_name(name)
        return await self._write(lambda conn: schedules.pause(conn, name, paused, self._clock()))

    async def advance_schedules(self, ticks: Mapping[str, float]) -> None:
        await self._write(lambda conn: schedules.advance(conn, ticks))

    async def close(self) -> None:
        """Finish the queued writes, then close the connections; every later operation is refused."""
        self._closed = True
        threads = [t for t in (self._writer, self._reader) if t is not None]
        for thread in threads:
            await thread.close()
        for thread in threads:
            thread.connection.close()


def _history(conn: sqlite3.Connection, run_id: str) -> list[StoredEvent]:
    return [StoredEvent(r[0], r[1], r[2], r[3], r[4].encode()) for r in conn.execute(Q["history"], (run_id,))]


def _inbox(conn: sqlite3.Connection, run_id: str) -> list[InboxSignal]:
    return [InboxSignal(r[0], r[1], msgspec.json.decode(r[2]), r[3], r[4], r[5])
            for r in conn.execute(Q["inbox"], (run_id,))]


def _insert_audit(conn: sqlite3.Connection, r: AuditRecord) -> None:
    conn.execute(Q["insert_audit"], (r.run_id, r.run_ref, r.signal_id, r.name, r.sender, r.key_id, r.verdict,
                                     r.payload_hash, r.reason, r.detail, r.at))


def _schema_version(conn: sqlite3.Connection, path: str) -> int:
    """The schema version of a database opened read-only; refuse one that is not runifold's or is too new."""
    version = 0
    if conn.execute(Q["has_schema_table"]).fetchone() is not None:
        version = int(conn.execute(Q["schema_version"]).fetchone()[0] or 0)
    if version == 0:
        raise StoreError(f"{path} is not a runifold database (it has no runifold schema); check the path")
    if version > SCHEMA_VERSION:
        raise newer_schema(path, version, SCHEMA_VERSION)
    return version


def _open_readonly(path: str, busy_seconds: float) -> sqlite3.Connection:
    """Open ``path`` for reading only; never create it, never migrate it."""
    if os.path.isdir(path):
        raise _open_error(sqlite3.OperationalError("is a directory"), path)
    if not os.path.isfile(path):
        raise StoreUnavailableError(
            f"no SQLite database at {os.path.abspath(path)}; check the path (or the folder you run in), "
            "or open it writable to create it"
        )
    last: sqlite3.Error | None = None
    # immutable=1: on a read-only file system SQLite cannot create the WAL index; nobody can write there either
    for params in ({"mode": "ro"}, {"mode": "ro", "immutable": "1"}):
        conn = sqlite3.connect(_file_uri(path, **params), uri=True, timeout=busy_seconds, isolation_level=None,
                               check_same_thread=False)
        try:
            _schema_version(conn, path)
            return conn
        except sqlite3.Error as exc:
            conn.close()
            if _errorname(exc) not in ("SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_READONLY_RECOVERY",
                                       "SQLITE_CANTOPEN_NOTEMPDIR", "SQLITE_IOERR"):
                raise _translate(exc, path) from exc
            last = exc
        except RunifoldError:
            conn.close()
            raise
    assert last is not None
    raise _open_error(last, path) from last


def _statements(script: str) -> list[str]:
    """Split a migration into statements (``sqlite3.complete_statement`` keeps triggers whole)."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--") and not buffer.strip():
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements


def _read_each(conn: sqlite3.Connection, reads: Sequence[Op[Any]]) -> list[Outcome]:
    """In the reader thread: run each read on its own."""
    outcomes: list[Outcome] = []
    for read in reads:
        try:
            outcomes.append((read(conn), None))
        except Exception as exc:
            outcomes.append((None, exc))
    return outcomes
