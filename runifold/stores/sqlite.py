"""The embedded SQLite store (aiosqlite): one machine, durable by default.

* WAL journal, ``synchronous=FULL``: a commit is on disk when it returns.
* One writer connection per store, fed by a group-commit queue: writes that
  arrive while a transaction is in progress are committed together in the next
  one, and each caller is answered only after that commit. Concurrent runs
  share an fsync; every guarantee holds per operation.
* ``BEGIN IMMEDIATE`` with a busy timeout and bounded retries, so several
  processes can share one file and ``database is locked`` never reaches a user
  (it becomes :class:`StoreUnavailableError` only after ``busy_seconds``).
* Reads use a second connection and never wait for the writer.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar, final

import aiosqlite
import msgspec
import structlog

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

T = TypeVar("T")
Op = Callable[[aiosqlite.Connection], Awaitable[T]]
log = structlog.get_logger("runifold.stores.sqlite")

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


async def _one(conn: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    async with conn.execute(sql, params) as cur:
        return await cur.fetchone()


async def _all(conn: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    async with conn.execute(sql, params) as cur:
        return list(await cur.fetchall())


async def _run(conn: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> int:
    async with conn.execute(sql, params) as cur:
        return cur.rowcount


async def _find(conn: aiosqlite.Connection, ref: str) -> Any:
    row = await _one(conn, f"SELECT {_RUN_COLUMNS}, wait_signals FROM runs WHERE run_id = ? OR checkpoint_id = ?", (ref, ref))
    if row is None:
        raise RunNotFoundError(ref)
    return row


async def _insert_events(conn: aiosqlite.Connection, run_id: str, first_seq: int, events: Sequence[EventRow], now: float) -> None:
    await conn.executemany(
        "INSERT INTO events (run_id, seq, type, key, at, body) VALUES (?, ?, ?, ?, ?, ?)",
        [(run_id, first_seq + i, e.type, e.key, now, e.body.decode()) for i, e in enumerate(events)],
    )


@final
class SqliteWorkflowStore:
    """A :class:`WorkflowStore` in one SQLite file.

    Open it with ``await SqliteWorkflowStore.open(path)``; the schema is created
    or migrated on open.
    """

    def __init__(
        self,
        path: str,
        writer: aiosqlite.Connection,
        reader: aiosqlite.Connection,
        clock: Callable[[], float],
        busy_seconds: float,
    ) -> None:
        self.path = path
        self._writer = writer
        self._reader = reader
        self._clock = clock
        self._busy_seconds = busy_seconds
        self._queue: list[tuple[Op[Any], asyncio.Future[Any], bool]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._inline = False  # a caller runs its own one-statement write
        self._work = asyncio.Event()
        #: durable transactions (fsyncs) and write operations so far: grouped commits share a transaction
        self.transactions = 0
        self.operations = 0

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        clock: Callable[[], float] = time.time,
        durable: bool = True,
        busy_seconds: float = 30.0,
    ) -> SqliteWorkflowStore:
        """Open (creating and migrating if needed) the store at ``path``.

        Args:
            path: the database file.
            clock: the store's clock; inject a fake one in tests.
            durable: ``synchronous=FULL`` (default) or ``NORMAL`` (faster, may lose
                the last commits on power loss, never corrupts).
            busy_seconds: how long a write waits for another process's lock.
        """
        connections = []
        try:
            for _ in range(2):
                conn = await aiosqlite.connect(path, isolation_level=None)
                connections.append(conn)
                await conn.execute("PRAGMA busy_timeout = 5000")
                await conn.execute("PRAGMA foreign_keys = ON")
            writer, reader = connections
            await _with_busy_retry(lambda: writer.execute("PRAGMA journal_mode = WAL"), busy_seconds)
            await writer.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            store = cls(path, writer, reader, clock, busy_seconds)
            await store.migrate()
        except sqlite3.Error as exc:
            for conn in connections:
                await conn.close()
            raise _translate(exc) from exc
        return store

    async def migrate(self) -> int:
        """Apply pending schema migrations; return the schema version."""

        async def op(conn: aiosqlite.Connection) -> int:
            await conn.execute("CREATE TABLE IF NOT EXISTS runifold_schema (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
            row = await _one(conn, "SELECT COALESCE(MAX(version), 0) FROM runifold_schema")
            current = int(row[0])
            for version, sql in migrations("sqlite"):
                if version > current:
                    for statement in _statements(sql):
                        await conn.execute(statement)
                    await conn.execute("INSERT INTO runifold_schema VALUES (?, ?)", (version, self._clock()))
                    current = version
                    log.info("schema_migrated", path=self.path, version=version)
            return current

        return await self._write(op)

    # -- the group-commit writer -------------------------------------------------

    async def _write(self, op: Op[T], *, single: bool = False) -> T:
        """Queue a write. ``single`` ops are one statement: alone, they run in autocommit (one hop)."""
        if single and not self._queue and not self._inline and (self._flusher is None or self._flusher.done()):
            # nothing queued or in flight: run it at once, from this task
            self._inline = True
            try:
                return await self._autocommit(op)
            except sqlite3.Error as exc:
                raise _translate(exc) from exc
            finally:
                self._inline = False
                self._start_flusher()
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append((op, future, single))
        self._start_flusher()
        return await future

    def _start_flusher(self) -> None:
        if self._queue and not self._inline and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                if len(batch) == 1 and batch[0][2]:
                    try:
                        _settle(batch[0][1], await self._autocommit(batch[0][0]))
                    except RunifoldError as exc:
                        _settle(batch[0][1], exc=exc)
                else:
                    await self._transaction(batch)
            except sqlite3.Error as exc:
                if len(batch) == 1:
                    _settle(batch[0][1], exc=_translate(exc))
                    continue
                # isolate the failing operation: retry each on its own
                for op, future, _ in batch:
                    try:
                        await self._transaction([(op, future, False)])
                    except sqlite3.Error as single:
                        _settle(future, exc=_translate(single))
            except BaseException as exc:  # pragma: no cover - cancellation or a bug
                for _, future, _ in batch:
                    _settle(future, exc=exc)
                raise

    async def _autocommit(self, op: Op[T]) -> T:
        # one statement outside BEGIN/COMMIT is its own durable transaction: one thread hop
        result: list[T] = []

        async def attempt() -> None:
            result.append(await op(self._writer))

        await _with_busy_retry(attempt, self._busy_seconds)
        self.transactions += 1
        self.operations += 1
        return result[-1]

    async def _transaction(self, batch: list[tuple[Op[Any], asyncio.Future[Any], bool]]) -> None:
        conn = self._writer
        await _with_busy_retry(lambda: conn.execute("BEGIN IMMEDIATE"), self._busy_seconds)
        results: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        try:
            for op, future, _ in batch:
                try:
                    results.append((future, await op(conn), None))
                except RunifoldError as exc:
                    # invariant: an operation raises a RunifoldError only before it writes
                    # (or when a trigger aborted its one statement, which undoes that statement)
                    results.append((future, None, exc))
            await _with_busy_retry(lambda: conn.execute("COMMIT"), self._busy_seconds)
            self.transactions += 1
            self.operations += len(batch)
        except BaseException:
            try:
                await conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        for future, value, error in results:
            _settle(future, value, error)

    # -- protocol -----------------------------------------------------------------

    async def now(self) -> float:
        return self._clock()

    async def enqueue(self, task: WorkflowTask) -> EnqueueResult:
        input_json = task.input_json()
        first = task.first_event()

        async def op(conn: aiosqlite.Connection) -> EnqueueResult:
            if task.checkpoint_id is not None:
                row = await _one(conn, "SELECT run_id, name, version, input_json FROM runs WHERE checkpoint_id = ?", (task.checkpoint_id,))
                if row is not None:
                    if same_task(task, row[1], row[2], row[3].encode()):
                        return EnqueueResult(row[0], False)
                    raise EnqueueConflictError(task.checkpoint_id, row[0])
            now = self._clock()
            run_id = new_run_id(now)
            await conn.execute(
                "INSERT INTO runs (run_id, checkpoint_id, name, version, input_json, status, revision, due_at, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'ready', 1, ?, ?, ?)",
                (run_id, task.checkpoint_id, task.name, task.version, input_json.decode(), now, now, now),
            )
            await _insert_events(conn, run_id, 1, [first], now)
            self._work.set()
            return EnqueueResult(run_id, True)

        return await self._write(op)

    async def claim(
        self, owner: str, names: Collection[str], lease_seconds: float, exclude: Collection[str] = ()
    ) -> Claim | None:
        names_json = _json(sorted(names)).decode()
        exclude_json = _json(sorted(exclude)).decode()

        async def op(conn: aiosqlite.Connection) -> tuple[Any, float] | None:
            now = self._clock()
            until = now + lease_seconds
            row = await _one(
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
        # invariant: while we hold the lease nobody else appends, so reading after the claim is consistent
        history = await self._history(self._reader, run_id)
        inbox = await self._inbox(self._reader, run_id)
        return Claim(run_id, checkpoint_id, name, version, Lease(run_id, owner, token, now + lease_seconds),
                     now, history, inbox)

    async def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        async def op(conn: aiosqlite.Connection) -> Lease:
            now = self._clock()
            until = now + lease_seconds
            changed = await _run(
                conn,
                "UPDATE runs SET lease_until = ?, due_at = ? WHERE run_id = ? AND status = 'running' "
                "AND lease_token = ? AND lease_until > ?",
                (until, until, lease.run_id, lease.token, now),
            )
            if not changed:
                raise LeaseLostError(lease.run_id)
            return Lease(lease.run_id, lease.owner, lease.token, until)

        return await self._write(op, single=True)

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

        async def op(conn: aiosqlite.Connection) -> CommitResult:
            now = self._clock()
            try:
                await conn.execute(
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
            if columns is not None:
                self._work.set()  # the run's due time changed: idle slots re-check
            return CommitResult(expected_revision + len(events), now)

        return await self._write(op, single=True)

    async def release(self, lease: Lease) -> None:
        async def op(conn: aiosqlite.Connection) -> None:
            now = self._clock()
            await conn.execute(
                "UPDATE runs SET status = 'ready', due_at = ?, lease_owner = NULL, lease_until = NULL "
                "WHERE run_id = ? AND status = 'running' AND lease_token = ?",
                (now, lease.run_id, lease.token),
            )
            self._work.set()

        await self._write(op, single=True)

    async def intervene(
        self, run_ref: str, allowed: Collection[RunStatus], events: Sequence[EventRow], status: RunStatus
    ) -> CommitResult:
        async def op(conn: aiosqlite.Connection) -> CommitResult:
            info = _run_info(await _find(conn, run_ref))
            if info.status not in allowed:
                raise not_allowed(info.run_id, info.status, allowed)
            now = self._clock()
            revision = info.revision + len(events)
            await conn.execute(
                "UPDATE runs SET revision = ?, updated_at = ?, status = ?, due_at = ?, lease_token = lease_token + 1, "
                "lease_owner = NULL, lease_until = NULL WHERE run_id = ?",
                (revision, now, status, None if status.finished else now, info.run_id),
            )
            await _insert_events(conn, info.run_id, info.revision + 1, events, now)
            self._work.set()
            return CommitResult(revision, now)

        return await self._write(op)

    async def purge(self, run_ref: str) -> None:
        async def op(conn: aiosqlite.Connection) -> None:
            info = _run_info(await _find(conn, run_ref))
            if not info.status.finished:
                raise not_finished(info.run_id, info.status)
            for table in ("events", "signals", "signal_audit", "runs"):
                await conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (info.run_id,))

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
        async def read(conn: aiosqlite.Connection) -> list[StoredEvent]:
            run_id = (await _find(conn, run_ref))[0]
            return await self._history(conn, run_id)

        return await self._read(read)

    @staticmethod
    async def _history(conn: aiosqlite.Connection, run_id: str) -> list[StoredEvent]:
        rows = await _all(conn, "SELECT seq, at, type, key, body FROM events WHERE run_id = ? ORDER BY seq", (run_id,))
        return [StoredEvent(r[0], r[1], r[2], r[3], r[4].encode()) for r in rows]

    @staticmethod
    async def _inbox(conn: aiosqlite.Connection, run_id: str) -> list[InboxSignal]:
        rows = await _all(
            conn,
            "SELECT signal_id, name, payload, sender, reason, received_at FROM signals "
            "WHERE run_id = ? AND consumed = 0 ORDER BY received_at, arrival",
            (run_id,),
        )
        return [InboxSignal(r[0], r[1], msgspec.json.decode(r[2]), r[3], r[4], r[5]) for r in rows]

    async def deliver_signal(self, delivery: SignalDelivery) -> SignalReceipt:
        payload = _json(delivery.payload).decode()

        async def op(conn: aiosqlite.Connection) -> SignalReceipt:
            info = _run_info(await _find(conn, delivery.run_ref))
            now = self._clock()
            original = await _one(conn, "SELECT received_at FROM signals WHERE run_id = ? AND signal_id = ?",
                                  (info.run_id, delivery.signal_id))
            verdict, detail = ("duplicate", "") if original else ("accepted", "run finished; kept unconsumed" if info.status.finished else "")
            await self._audit_insert(conn, AuditRecord(
                info.run_id, delivery.run_ref, delivery.signal_id, delivery.name, delivery.sender, delivery.key_id,
                verdict, delivery.payload_hash, delivery.reason, detail, now))
            if original:
                return SignalReceipt(info.run_id, delivery.signal_id, True, original[0], info.status)
            await conn.execute(
                "INSERT INTO signals (run_id, signal_id, name, payload, sender, key_id, reason, received_at, arrival) "
                "SELECT ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(MAX(arrival), 0) + 1 FROM signals WHERE run_id = ?",
                (info.run_id, delivery.signal_id, delivery.name, payload, delivery.sender, delivery.key_id,
                 delivery.reason, now, info.run_id),
            )
            await conn.execute(
                "UPDATE runs SET due_at = ? WHERE run_id = ? AND status = 'waiting' "
                "AND EXISTS (SELECT 1 FROM json_each(runs.wait_signals) WHERE value = ?)",
                (now, info.run_id, delivery.name),
            )
            self._work.set()
            return SignalReceipt(info.run_id, delivery.signal_id, False, now, info.status)

        return await self._write(op)

    @staticmethod
    async def _audit_insert(conn: aiosqlite.Connection, r: AuditRecord) -> None:
        await conn.execute(
            "INSERT INTO signal_audit (run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, "
            "reason, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.run_id, r.run_ref, r.signal_id, r.name, r.sender, r.key_id, r.verdict, r.payload_hash, r.reason, r.detail, r.at),
        )

    async def record_rejected(self, record: AuditRecord) -> None:
        await self._write(lambda conn: self._audit_insert(conn, record))

    async def audit(self, run_ref: str) -> list[AuditRecord]:
        async def read(conn: aiosqlite.Connection) -> list[AuditRecord]:
            try:
                run_id = (await _find(conn, run_ref))[0]
            except RunNotFoundError:
                run_id = None
            rows = await _all(
                conn,
                "SELECT run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, reason, detail, at "
                "FROM signal_audit WHERE run_id = ? OR run_ref = ? ORDER BY id",
                (run_id, run_ref),
            )
            return [AuditRecord(*r) for r in rows]

        return await self._read(read)

    async def _read(self, fn: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
        try:
            return await fn(self._reader)
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
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._writer.close()
        await self._reader.close()


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


def _settle(future: asyncio.Future[Any], value: Any = None, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


async def _with_busy_retry(statement: Callable[[], Awaitable[Any]], budget: float) -> None:
    """Run ``statement``, retrying while another process holds the lock."""
    deadline = time.monotonic() + budget
    delay = 0.005
    while True:
        try:
            await statement()
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)
