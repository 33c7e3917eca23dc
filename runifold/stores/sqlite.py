"""The embedded SQLite store: one machine, durable by default.

* WAL journal, ``synchronous=FULL``: a commit is on disk when it returns.
* One writer connection per store, owned by a writer thread that commits in
  groups: writes that arrive while a transaction is in progress are committed
  together in the next one, and each caller is answered only after that
  commit. Concurrent runs share an fsync; every guarantee holds per operation.
* While this store holds at most one run's lease and the writer thread is idle,
  a one-statement write (claim, step commit, renew, release) runs in the
  calling thread instead: there is nobody to group with, and the thread
  hand-off would cost more CPU than the statement. The event loop waits for
  that one fsync.
* ``BEGIN IMMEDIATE`` with a busy timeout and bounded retries, so several
  processes can share one file and ``database is locked`` never reaches a user
  (it becomes :class:`StoreUnavailableError` only after ``busy_seconds``).
  The in-caller write never waits for a lock: if another process holds it, the
  write goes to the writer thread.
* Reads use a second connection in its own thread and never wait for the writer.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, NamedTuple, TypeVar, final

import msgspec
from runifold._log import get_logger

from runifold.errors import (
    EnqueueConflictError,
    LeaseLostError,
    RunifoldError,
    RunNotFoundError,
    StoreError,
    StoreUnavailableError,
)
from runifold.stores._migrations import migrations
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
    new_run_id,
    not_allowed,
    not_finished,
    same_task,
    transition_columns,
)
from runifold.stores._thread import ConnectionThread, Outcome

T = TypeVar("T")
Op = Callable[[sqlite3.Connection], T]
log = get_logger("runifold.stores.sqlite")

_BUSY = {"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_BUSY_SNAPSHOT", "SQLITE_BUSY_RECOVERY", "SQLITE_LOCKED_SHAREDCACHE"}
_RUN_COLUMNS = (
    "run_id, checkpoint_id, name, version, status, revision, due_at, lease_owner, lease_token, "
    "lease_until, created_at, updated_at, reason"
)
_json = msgspec.json.encode


def _is_busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorname", "") in _BUSY


def _translate(exc: sqlite3.Error) -> StoreError:
    name = getattr(exc, "sqlite_errorname", type(exc).__name__)
    if _is_busy(exc):
        return StoreUnavailableError(
            f"the SQLite database stayed locked ({name}); another process holds a long write "
            "transaction. Retry later, or move many concurrent writers to PostgreSQL"
        )
    return StoreError(f"SQLite error {name}: {exc}")


def _run_info(row: Sequence[Any]) -> RunInfo:
    return RunInfo(row[0], row[1], row[2], row[3], RunStatus(row[4]), row[5], row[6], row[7], row[8],
                   row[9], row[10], row[11], row[12])


def _one(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    return conn.execute(sql, params).fetchone()


def _all(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def _find(conn: sqlite3.Connection, ref: str) -> Any:
    row = _one(conn, f"SELECT {_RUN_COLUMNS}, wait_signals FROM runs WHERE run_id = ? OR checkpoint_id = ?", (ref, ref))
    if row is None:
        raise RunNotFoundError(ref)
    return row


def _insert_events(conn: sqlite3.Connection, run_id: str, first_seq: int, events: Sequence[EventRow], now: float) -> None:
    conn.executemany(
        "INSERT INTO events (run_id, seq, type, key, at, body) VALUES (?, ?, ?, ?, ?, ?)",
        [(run_id, first_seq + i, e.type, e.key, now, e.body.decode()) for i, e in enumerate(events)],
    )


def _connect(path: str, busy_ms: int) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        conn.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        conn.close()
        raise
    return conn


class _Write(NamedTuple):
    op: Op[Any]
    single: bool  # one statement: alone, it runs in autocommit


@final
class SqliteWorkflowStore:
    """A :class:`WorkflowStore` in one SQLite file.

    Open it with ``await SqliteWorkflowStore.open(path)``; the schema is created
    or migrated on open.
    """

    def __init__(
        self,
        path: str,
        connections: tuple[sqlite3.Connection, sqlite3.Connection, sqlite3.Connection],
        clock: Callable[[], float],
        busy_seconds: float,
        direct_writes: bool,
    ) -> None:
        self.path = path
        self._direct_writes = direct_writes
        self._clock = clock
        self._busy_seconds = busy_seconds
        writer, reader, self._direct = connections
        self._writer = ConnectionThread(writer, self._apply, "runifold-sqlite-writer")
        self._reader = ConnectionThread(reader, _read_each, "runifold-sqlite-reader")
        #: the leases this store handed out and has not seen end: run id -> lease_until
        self._leases: dict[str, float] = {}
        self._work = asyncio.Event()
        # durable transactions (fsyncs) and write operations, counted by the thread that ran them
        self._counts = {"direct": [0, 0], "thread": [0, 0]}

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        clock: Callable[[], float] = time.time,
        durable: bool = True,
        busy_seconds: float = 30.0,
        direct_writes: bool = True,
    ) -> SqliteWorkflowStore:
        """Open (creating and migrating if needed) the store at ``path``.

        Args:
            path: the database file.
            clock: the store's clock; inject a fake one in tests.
            durable: ``synchronous=FULL`` (default) or ``NORMAL`` (faster, may lose
                the last commits on power loss, never corrupts).
            busy_seconds: how long a write waits for another process's lock.
            direct_writes: while the store holds at most one lease, run one-statement
                writes in the calling thread (default). ``False`` sends every write
                through the writer thread, so the event loop never waits for an fsync,
                at about 0.1 ms more CPU per step.
        """

        def connect() -> tuple[sqlite3.Connection, sqlite3.Connection, sqlite3.Connection]:
            opened: list[sqlite3.Connection] = []
            try:
                # the writer and reader wait for locks; the direct writer never does
                for busy_ms in (5000, 5000, 0):
                    opened.append(_connect(path, busy_ms))
                _with_busy_retry(lambda: opened[0].execute("PRAGMA journal_mode = WAL"), busy_seconds)
                for conn in (opened[0], opened[2]):
                    conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            except BaseException:
                for conn in opened:
                    conn.close()
                raise
            return opened[0], opened[1], opened[2]

        try:
            connections = await asyncio.to_thread(connect)
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        store = cls(path, connections, clock, busy_seconds, direct_writes)
        try:
            await store.migrate()
        except BaseException:
            await store.close()
            raise
        return store

    async def migrate(self) -> int:
        """Apply pending schema migrations; return the schema version."""

        def op(conn: sqlite3.Connection) -> int:
            conn.execute("CREATE TABLE IF NOT EXISTS runifold_schema (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
            current = int(_one(conn, "SELECT COALESCE(MAX(version), 0) FROM runifold_schema")[0])
            for version, sql in migrations("sqlite"):
                if version > current:
                    for statement in _statements(sql):
                        conn.execute(statement)
                    conn.execute("INSERT INTO runifold_schema VALUES (?, ?)", (version, self._clock()))
                    current = version
                    log.info("schema_migrated", path=self.path, version=version)
            return current

        return await self._write(op)

    @property
    def transactions(self) -> int:
        """Durable transactions (fsyncs) so far: grouped commits share one."""
        return self._counts["direct"][0] + self._counts["thread"][0]

    @property
    def operations(self) -> int:
        """Write operations so far."""
        return self._counts["direct"][1] + self._counts["thread"][1]

    @property
    def direct(self) -> int:
        """Writes that ran in the caller's thread because the store was alone."""
        return self._counts["direct"][1]

    # -- writes: in the caller when alone, else grouped in the writer thread ----------

    async def _write(self, op: Op[T], *, single: bool = False, wake: bool = False) -> T:
        """Run a write. ``single`` ops are one statement; ``wake`` tells idle workers to look again."""
        try:
            if single and self._alone():
                try:
                    value = op(self._direct)
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        raise
                    # another process holds the lock: wait for it in the writer thread, not here
                else:
                    self._count("direct", 1)
                    return value
            return await self._writer.submit(_Write(op, single))  # type: ignore[no-any-return]
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        finally:
            if wake:
                self._work.set()

    def _alone(self) -> bool:
        """At most one lease of ours is live and the writer thread has nothing to do."""
        if self._writer.in_flight or not self._direct_writes:
            return False
        if len(self._leases) > 1:
            now = self._clock()
            self._leases = {run_id: until for run_id, until in self._leases.items() if until > now}
        return len(self._leases) <= 1

    def _apply(self, conn: sqlite3.Connection, writes: Sequence[_Write]) -> list[Outcome]:
        """In the writer thread: one write alone in autocommit, several in one transaction."""
        if len(writes) == 1 and writes[0].single:
            try:
                value = _with_busy_retry(lambda: writes[0].op(conn), self._busy_seconds)
            except (RunifoldError, sqlite3.Error) as exc:
                return [(None, exc)]
            self._count("thread", 1)
            return [(value, None)]
        try:
            return self._transaction(conn, writes)
        except sqlite3.Error as exc:
            if len(writes) == 1:
                return [(None, exc)]
        # isolate the failing operation: retry each on its own
        outcomes: list[Outcome] = []
        for write in writes:
            try:
                outcomes += self._transaction(conn, [write])
            except sqlite3.Error as exc:
                outcomes.append((None, exc))
        return outcomes

    def _transaction(self, conn: sqlite3.Connection, writes: Sequence[_Write]) -> list[Outcome]:
        _with_busy_retry(lambda: conn.execute("BEGIN IMMEDIATE"), self._busy_seconds)
        outcomes: list[Outcome] = []
        try:
            for write in writes:
                try:
                    outcomes.append((write.op(conn), None))
                except RunifoldError as exc:
                    # invariant: an operation raises a RunifoldError only before it writes
                    # (or when a trigger aborted its one statement, which undoes that statement)
                    outcomes.append((None, exc))
            _with_busy_retry(lambda: conn.execute("COMMIT"), self._busy_seconds)
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        self._count("thread", len(writes))
        return outcomes

    def _count(self, where: str, operations: int) -> None:
        counts = self._counts[where]
        counts[0] += 1
        counts[1] += operations

    # -- protocol -----------------------------------------------------------------

    async def now(self) -> float:
        return self._clock()

    async def enqueue(self, task: WorkflowTask) -> EnqueueResult:
        input_json = task.input_json()
        first = task.first_event()

        def op(conn: sqlite3.Connection) -> EnqueueResult:
            if task.checkpoint_id is not None:
                row = _one(conn, "SELECT run_id, name, version, input_json FROM runs WHERE checkpoint_id = ?", (task.checkpoint_id,))
                if row is not None:
                    if same_task(task, row[1], row[2], row[3].encode()):
                        return EnqueueResult(row[0], False)
                    raise EnqueueConflictError(task.checkpoint_id, row[0])
            now = self._clock()
            run_id = new_run_id(now)
            conn.execute(
                "INSERT INTO runs (run_id, checkpoint_id, name, version, input_json, status, revision, due_at, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'ready', 1, ?, ?, ?)",
                (run_id, task.checkpoint_id, task.name, task.version, input_json.decode(), now, now, now),
            )
            _insert_events(conn, run_id, 1, [first], now)
            return EnqueueResult(run_id, True)

        return await self._write(op, wake=True)

    async def claim(
        self, owner: str, names: Collection[str], lease_seconds: float, exclude: Collection[str] = ()
    ) -> Claim | None:
        names_json = _json(sorted(names)).decode()
        exclude_json = _json(sorted(exclude)).decode()

        def op(conn: sqlite3.Connection) -> tuple[Any, float] | None:
            now = self._clock()
            until = now + lease_seconds
            row = _one(
                conn,
                "UPDATE runs SET status = 'running', lease_token = lease_token + 1, lease_owner = ?, "
                "lease_until = ?, due_at = ?, updated_at = ? WHERE run_id = ("
                "  SELECT run_id FROM runs WHERE due_at IS NOT NULL AND due_at <= ?"
                # '+name': never let the planner trade the small due-time index for the name index
                "  AND +name IN (SELECT value FROM json_each(?))"
                "  AND run_id NOT IN (SELECT value FROM json_each(?))"
                "  ORDER BY due_at LIMIT 1"
                ") RETURNING run_id, checkpoint_id, name, version, lease_token",
                (owner, until, until, now, now, names_json, exclude_json),
            )
            return None if row is None else (row, now)

        claimed = await self._write(op, single=True)
        if claimed is None:
            return None
        (run_id, checkpoint_id, name, version, token), now = claimed
        self._leases[run_id] = now + lease_seconds
        # invariant: while we hold the lease nobody else appends, so reading after the claim is consistent
        history, inbox = await self._read(lambda c: (self._history(c, run_id), self._inbox(c, run_id)))
        return Claim(run_id, checkpoint_id, name, version, Lease(run_id, owner, token, now + lease_seconds),
                     now, history, inbox)

    async def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        def op(conn: sqlite3.Connection) -> Lease:
            now = self._clock()
            until = now + lease_seconds
            changed = conn.execute(
                "UPDATE runs SET lease_until = ?, due_at = ? WHERE run_id = ? AND status = 'running' "
                "AND lease_token = ? AND lease_until > ?",
                (until, until, lease.run_id, lease.token, now),
            ).rowcount
            if not changed:
                raise LeaseLostError(lease.run_id)
            return Lease(lease.run_id, lease.owner, lease.token, until)

        renewed = await self._leased(lease, self._write(op, single=True), ends=False)
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
        events_json = _json([[e.type, e.key, e.body.decode()] for e in events]).decode()
        consumed_json = _json(list(consumed_signals)).decode()
        wait_json = "[]" if columns is None else _json(list(columns.wait_signals)).decode()

        def op(conn: sqlite3.Connection) -> CommitResult:
            now = self._clock()
            try:
                conn.execute(
                    "INSERT INTO commit_requests (run_id, token, expected, now, events, has_transition, status, "
                    "due_at, wait_signals, reason, consumed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (lease.run_id, lease.token, expected_revision, now, events_json, columns is not None,
                     None if columns is None else str(columns.status), None if columns is None else columns.due_at,
                     wait_json, "" if columns is None else columns.reason, consumed_json),
                )
            except sqlite3.IntegrityError as exc:
                if getattr(exc, "sqlite_errorname", "") == "SQLITE_CONSTRAINT_TRIGGER":
                    raise LeaseLostError(lease.run_id, "fenced off by a newer lease or revision") from None
                raise
            return CommitResult(expected_revision + len(events), now)

        # a transition changes the run's due time (idle slots re-check) and ends the lease
        ends = columns is not None
        return await self._leased(lease, self._write(op, single=True, wake=ends), ends=ends)

    async def release(self, lease: Lease) -> None:
        def op(conn: sqlite3.Connection) -> None:
            now = self._clock()
            conn.execute(
                "UPDATE runs SET status = 'ready', due_at = ?, lease_owner = NULL, lease_until = NULL "
                "WHERE run_id = ? AND status = 'running' AND lease_token = ?",
                (now, lease.run_id, lease.token),
            )

        await self._leased(lease, self._write(op, single=True, wake=True), ends=True)

    async def _leased(self, lease: Lease, write: Awaitable[T], *, ends: bool) -> T:
        """Await a write under ``lease``, forgetting the lease when it ends or is lost."""
        try:
            value = await write
        except LeaseLostError:
            self._leases.pop(lease.run_id, None)
            raise
        if ends:
            self._leases.pop(lease.run_id, None)
        return value

    async def intervene(
        self, run_ref: str, allowed: Collection[RunStatus], events: Sequence[EventRow], status: RunStatus
    ) -> CommitResult:
        def op(conn: sqlite3.Connection) -> CommitResult:
            info = _run_info(_find(conn, run_ref))
            if info.status not in allowed:
                raise not_allowed(info.run_id, info.status, allowed)
            now = self._clock()
            revision = info.revision + len(events)
            conn.execute(
                "UPDATE runs SET revision = ?, updated_at = ?, status = ?, due_at = ?, lease_token = lease_token + 1, "
                "lease_owner = NULL, lease_until = NULL WHERE run_id = ?",
                (revision, now, status, None if status.finished else now, info.run_id),
            )
            _insert_events(conn, info.run_id, info.revision + 1, events, now)
            return CommitResult(revision, now)

        return await self._write(op, wake=True)

    async def purge(self, run_ref: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            info = _run_info(_find(conn, run_ref))
            if not info.status.finished:
                raise not_finished(info.run_id, info.status)
            for table in ("events", "signals", "signal_audit", "runs"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (info.run_id,))

        await self._write(op)

    async def get_run(self, run_ref: str) -> RunInfo:
        return _run_info(await self._read(lambda c: _find(c, run_ref)))

    async def list_runs(
        self, *, status: RunStatus | None = None, name: str | None = None, version: int | None = None, limit: int = 100
    ) -> list[RunInfo]:
        clauses, params = [], []
        for column, value in (("status", status), ("name", name), ("version", version)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = await self._read(lambda c: _all(c, f"SELECT {_RUN_COLUMNS} FROM runs {where} ORDER BY run_id DESC LIMIT ?", (*params, limit)))
        return [_run_info(r) for r in rows]

    async def history(self, run_ref: str) -> list[StoredEvent]:
        def read(conn: sqlite3.Connection) -> list[StoredEvent]:
            run_id = _find(conn, run_ref)[0]
            return self._history(conn, run_id)

        return await self._read(read)

    @staticmethod
    def _history(conn: sqlite3.Connection, run_id: str) -> list[StoredEvent]:
        rows = _all(conn, "SELECT seq, at, type, key, body FROM events WHERE run_id = ? ORDER BY seq", (run_id,))
        return [StoredEvent(r[0], r[1], r[2], r[3], r[4].encode()) for r in rows]

    @staticmethod
    def _inbox(conn: sqlite3.Connection, run_id: str) -> list[InboxSignal]:
        rows = _all(
            conn,
            "SELECT signal_id, name, payload, sender, reason, received_at FROM signals "
            "WHERE run_id = ? AND consumed = 0 ORDER BY received_at, arrival",
            (run_id,),
        )
        return [InboxSignal(r[0], r[1], msgspec.json.decode(r[2]), r[3], r[4], r[5]) for r in rows]

    async def deliver_signal(self, delivery: SignalDelivery) -> SignalReceipt:
        payload = _json(delivery.payload).decode()

        def op(conn: sqlite3.Connection) -> SignalReceipt:
            info = _run_info(_find(conn, delivery.run_ref))
            now = self._clock()
            original = _one(conn, "SELECT received_at FROM signals WHERE run_id = ? AND signal_id = ?",
                            (info.run_id, delivery.signal_id))
            verdict, detail = ("duplicate", "") if original else ("accepted", "run finished; kept unconsumed" if info.status.finished else "")
            self._audit_insert(conn, AuditRecord(
                info.run_id, delivery.run_ref, delivery.signal_id, delivery.name, delivery.sender, delivery.key_id,
                verdict, delivery.payload_hash, delivery.reason, detail, now))
            if original:
                return SignalReceipt(info.run_id, delivery.signal_id, True, original[0], info.status)
            conn.execute(
                "INSERT INTO signals (run_id, signal_id, name, payload, sender, key_id, reason, received_at, arrival) "
                "SELECT ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(MAX(arrival), 0) + 1 FROM signals WHERE run_id = ?",
                (info.run_id, delivery.signal_id, delivery.name, payload, delivery.sender, delivery.key_id,
                 delivery.reason, now, info.run_id),
            )
            conn.execute(
                "UPDATE runs SET due_at = ? WHERE run_id = ? AND status = 'waiting' "
                "AND EXISTS (SELECT 1 FROM json_each(runs.wait_signals) WHERE value = ?)",
                (now, info.run_id, delivery.name),
            )
            return SignalReceipt(info.run_id, delivery.signal_id, False, now, info.status)

        return await self._write(op, wake=True)

    @staticmethod
    def _audit_insert(conn: sqlite3.Connection, r: AuditRecord) -> None:
        conn.execute(
            "INSERT INTO signal_audit (run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, "
            "reason, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.run_id, r.run_ref, r.signal_id, r.name, r.sender, r.key_id, r.verdict, r.payload_hash, r.reason, r.detail, r.at),
        )

    async def record_rejected(self, record: AuditRecord) -> None:
        await self._write(lambda conn: self._audit_insert(conn, record))

    async def audit(self, run_ref: str) -> list[AuditRecord]:
        def read(conn: sqlite3.Connection) -> list[AuditRecord]:
            try:
                run_id = _find(conn, run_ref)[0]
            except RunNotFoundError:
                run_id = None
            rows = _all(
                conn,
                "SELECT run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, reason, detail, at "
                "FROM signal_audit WHERE run_id = ? OR run_ref = ? ORDER BY id",
                (run_id, run_ref),
            )
            return [AuditRecord(*r) for r in rows]

        return await self._read(read)

    async def _read(self, fn: Op[T]) -> T:
        try:
            return await self._reader.submit(fn)  # type: ignore[no-any-return]
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    async def wait_for_work(self, timeout: float) -> None:
        # Writes from this process wake us at once, and we sleep no longer than
        # until the next due time (a timer, a retry, a lease expiry); other
        # processes' writes are seen at the next poll (SQLite has no notification).
        wait = timeout
        # only future due times: a run already due that we could not claim (another
        # workflow's, or skipped) must not make idle workers spin
        now = self._clock()
        row = await self._read(lambda c: _one(c, "SELECT MIN(due_at) FROM runs WHERE due_at > ?", (now,)))
        if row is not None and row[0] is not None:
            wait = max(0.0, min(wait, row[0] - now))
        try:
            await asyncio.wait_for(self._work.wait(), wait)
        except TimeoutError:
            pass
        self._work.clear()

    async def close(self) -> None:
        """Finish the queued writes, then close the connections."""
        for thread in (self._writer, self._reader):
            await thread.close()
        for conn in (thread.connection for thread in (self._writer, self._reader)):
            conn.close()
        self._direct.close()


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
        except (RunifoldError, sqlite3.Error) as exc:
            outcomes.append((None, exc))
    return outcomes


def _with_busy_retry(statement: Callable[[], T], budget: float) -> T:
    """In the writer thread: run ``statement``, retrying while another process holds the lock."""
    deadline = time.monotonic() + budget
    delay = 0.005
    while True:
        try:
            return statement()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
