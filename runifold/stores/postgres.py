"""The PostgreSQL store (asyncpg): many workers on many hosts share one database.

* Every operation that changes a run is one call of one function of
  ``sql/postgres/schema.sql`` (the rule of :mod:`runifold.stores._rule` in SQL),
  or one statement of ``sql/postgres/queries.sql``: one round trip each.
* Claims pick due runs with ``FOR UPDATE SKIP LOCKED`` and take the lease in
  the same statement, which also returns the history and the inbox.
* Every time (lease expiry, timers, signal freshness) is judged on the database
  clock, ``clock_timestamp()``, never on a worker's.
* ``LISTEN runifold_work``: idle workers wake at once when a run becomes due;
  polling remains only as a fallback, and a dropped listening connection is reopened.
* Waits are bounded: each attempt of an operation is bounded by
  ``command_timeout`` and by what is left of the operation's ``retry_seconds``
  (wall time, the attempt in flight included); TCP keepalives and
  ``TCP_USER_TIMEOUT`` find a silent peer; a cancelled operation returns at
  once and drops its connection.
* Retries are safe: a retried commit recognises its own write, a retried
  claim finds the run its first attempt leased (by a nonce), a retried
  enqueue finds the runs it created (the client chooses the run ids).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar, final

import asyncpg  # type: ignore[import-untyped]
import msgspec
from runifold._log import get_logger

from runifold.errors import (
    EnqueueConflictError,
    LeaseLostError,
    RunNotFoundError,
    ScheduleNotFoundError,
    SignalConflictError,
    StoreError,
    StoreUnavailableError,
)
from runifold.stores import _rule
from runifold.stores._batch import Batcher
from runifold.stores._deadlines import Deadlines
from runifold.stores._open import redacted
from runifold.stores._pg_pool import _CONNECTION_ERRORS, _DRIVER_ERRORS, _keepalive, _Pool
from runifold.stores._protocol import (
    AuditRecord,
    Claim,
    CommitResult,
    EnqueueResult,
    EventRow,
    InboxSignal,
    Lease,
    RunColumns,
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
from runifold.stores._sql import by_ref, closed_store, migrations, newer_schema, queries

T = TypeVar("T")
log = get_logger("runifold.stores.postgres")

CHANNEL = "runifold_work"
#: notified with a run id whenever that run finishes (what ``RunHandle.result`` waits for)
FINISHED_CHANNEL = "runifold_finished"
LISTEN_APPLICATION = "runifold-listen"  # the application_name of its listening connection
#: the longest a lease release waits (it is best effort)
RELEASE_SECONDS = 1.0
Q = queries("postgres")
RUN, HISTORY, AUDIT = by_ref(Q["run"]), by_ref(Q["history"]), by_ref(Q["audit"])
SCHEMA_VERSION = migrations("postgres")[-1][0]
_ENQUEUE_CONFLICT = "RF001"  # raised by runifold_enqueue
# SQLSTATE classes and codes that mean "the connection or server went away, or try again"
_TRANSIENT_CLASSES = ("08", "57", "53")
_TRANSIENT_CODES = {"40001", "40P01"}


def _transient(exc: BaseException, conn: asyncpg.Connection | None) -> bool:
    if isinstance(exc, _CONNECTION_ERRORS):
        return True
    if isinstance(exc, asyncpg.exceptions.InterfaceError):
        # "connection is closed" is the connection's; the rest (a wrong count of arguments, say)
        # is the statement's, and retrying it would only hide the mistake for the whole budget
        return conn is not None and conn.is_closed()
    code = getattr(exc, "sqlstate", None) or ""
    if conn is None and code == "55000" and "not currently accepting connections" in str(exc):
        # refused while connecting: the database takes no connections for now (ALLOW_CONNECTIONS false, during
        # maintenance); not another 55000 of a connection (an invalid database), which stays so. (The server's
        # message is matched: with lc_messages in another language, the refusal is an error at once)
        return True
    return code in _TRANSIENT_CODES or code[:2] in _TRANSIENT_CLASSES


def _translate(exc: BaseException) -> StoreError:
    """The one place driver errors become runifold errors, by SQLSTATE."""
    if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):
        return StoreError("PostgreSQL refused a write: the store was opened read-only (readonly=True), or the "
                          "server, database or role sets default_transaction_read_only, or this is a standby; open "
                          "it without readonly, on a primary, with a role and settings that allow writes")
    if isinstance(exc, asyncpg.exceptions.InsufficientPrivilegeError):
        return StoreError(f"PostgreSQL error {exc.sqlstate}: {exc}; this needs a role that may write the runifold "
                          "tables (a role with SELECT rights only can run the read-only commands)")
    if isinstance(exc, asyncpg.PostgresError):
        return StoreError(f"PostgreSQL error {exc.sqlstate}: {exc}")
    return StoreError(f"PostgreSQL driver error: {exc!r}")


def _run_info(row: asyncpg.Record) -> RunInfo:
    return RunInfo(row["run_id"], row["checkpoint_id"], row["name"], row["version"], RunStatus(row["status"]),
                   row["revision"], row["due_at"], row["lease_owner"], row["lease_token"], row["lease_until"],
                   row["created_at"], row["updated_at"], row["reason"], row["recoveries"], row["concurrency_key"],
                   row["concurrency_limit"])


def _schedule_info(row: asyncpg.Record) -> ScheduleInfo:
    return ScheduleInfo(Schedule.from_row(*list(row.values())[:8]), row["paused"], row["last_tick"],
                        row["created_at"], row["updated_at"])


def _claim_of(row: asyncpg.Record, owner: str, sent: float) -> Claim:
    run_id = row["run_id"]
    history = [StoredEvent(*e) for e in zip(row["seqs"], row["ats"], row["types"], row["keys"],
                                             [b.encode() for b in row["bodies"]], strict=True)]
    inbox = [InboxSignal(i, n, msgspec.json.decode(p), s, r, at) for i, n, p, s, r, at in zip(
        row["ids"] or (), row["names"] or (), row["payloads"] or (), row["senders"] or (), row["reasons"] or (),
        row["received"] or (), strict=True)]
    return Claim(run_id, row["checkpoint_id"], row["name"], row["version"],
                 Lease(run_id, owner, row["lease_token"], row["lease_until"]), row["now"], history, inbox,
                 sent=sent, recoveries=row["recoveries"])


@final
class PostgresWorkflowStore:
    """A :class:`WorkflowStore` on PostgreSQL. Open with ``await PostgresWorkflowStore.open(dsn)``."""

    def __init__(self, dsn: str, pool: _Pool, *, retry_seconds: float, poll_seconds: float,
                 command_timeout: float, keepalive_seconds: float) -> None:
        self.dsn = dsn
        self._pool = pool
        self._retry_seconds = retry_seconds
        self._poll_seconds = poll_seconds
        self._command_timeout = command_timeout
        self._deadlines = Deadlines()  # bounds each attempt of _call
        self._keepalive_seconds = keepalive_seconds
        self._listener: asyncpg.Connection | None = None
        self._finish_waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._connecting: asyncio.Future[None] | None = None
        self._due_query: asyncio.Future[float | None] | None = None
        self._work = asyncio.Event()
        self._closed = False  # close() was called: every operation is refused
        # group commit: the commits (and the claims) of this process that meet in flight share a round trip
        self._commits: Batcher[_CommitAsk, CommitResult | str] = Batcher(
            self._send_commits, limit=_BATCH_LIMIT, apart=lambda ask: ask.lease.run_id)
        self._claims: Batcher[_ClaimAsk, Claim | None] = Batcher(
            self._send_claims, limit=_BATCH_LIMIT, alike=lambda ask: ask, orphan=self._hand_back)

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        retry_seconds: float = 15.0,
        poll_seconds: float = 5.0,
        command_timeout: float = 10.0,
        keepalive_seconds: float = 10.0,
        readonly: bool = False,
        create: bool = True,
    ) -> PostgresWorkflowStore:
        """Connect, then create or migrate the schema (safe when many workers start at once).

        Args:
            dsn: ``postgresql://user:password@host:port/database``.
            min_size: connections opened at once.
            max_size: the most connections the store opens (the listener aside).
            retry_seconds: the wall time an operation may take in all, its attempts and
                their backoff included, before it raises :class:`StoreUnavailableError`.
            poll_seconds: the fallback poll interval of :meth:`wait_for_work`.
            command_timeout: the longest one attempt may take (also the server's
                ``statement_timeout``); checked every 50 ms.
            keepalive_seconds: a connection silent this long is probed, and data
                unacknowledged this long drops it.
            readonly: read only: the schema must exist at this runifold's version and
                is never created or migrated, every transaction is read-only (a role
                with SELECT rights suffices), and writes raise :class:`StoreError`.
            create: ``False``: a database with no runifold schema is refused, not given
                one (for commands that change an existing store); an older schema is migrated.

        Raises:
            StoreUnavailableError: the server cannot be reached.
            StoreError: its schema is newer than this runifold.
        """
        pool = _Pool(dsn, max_size, command_timeout, keepalive_seconds, readonly)
        try:
            for conn in [await asyncio.wait_for(pool.acquire(), retry_seconds) for _ in range(max(1, min_size))]:
                pool.release(conn)
        except (*_DRIVER_ERRORS, asyncio.TimeoutError) as exc:
            await pool.close()
            raise StoreUnavailableError(
                f"cannot connect to PostgreSQL at {redacted(dsn)}: {exc!r}; check that the server runs "
                "and the URL, user and password are right"
            ) from exc
        store = cls(dsn, pool, retry_seconds=retry_seconds, poll_seconds=poll_seconds,
                    command_timeout=command_timeout, keepalive_seconds=keepalive_seconds)
        try:
            if readonly or not create:
                await store._check_schema(migrating=not readonly)
            if not readonly:
                await store.migrate()
        except BaseException:
            await pool.close()
            raise
        return store

    async def _check_schema(self, *, migrating: bool = False) -> None:
        """The schema is there, at the version this runifold writes (``migrating``: or older, to be migrated)."""
        where = f"PostgreSQL at {redacted(self.dsn)}"

        async def version(conn: asyncpg.Connection) -> int:
            if await conn.fetchval(Q["has_schema_table"]) is None:
                return 0
            return int(await conn.fetchval(Q["schema_version"]))

        current = await self._call(version)
        if current == 0:
            raise StoreError(f"{where} has no runifold schema; check the URL, or run `runifold migrate` "
                             "(or start a worker) with a role that may create tables")
        if current > SCHEMA_VERSION:
            raise newer_schema(where, current, SCHEMA_VERSION)
        if current < SCHEMA_VERSION and not migrating:
            raise StoreError(f"the runifold schema of {where} is version {current}, older than this runifold's "
                             f"({SCHEMA_VERSION}); run `runifold migrate` (or start a worker) to migrate it")

    async def migrate(self) -> int:
        """Apply pending schema migrations under an advisory lock; return the schema version."""

        async def op(conn: asyncpg.Connection) -> int:
            async with conn.transaction():
                await conn.execute(Q["migration_lock"])
                await conn.execute(Q["create_schema_table"])
                current = int(await conn.fetchval(Q["schema_version"]))
                if current > SCHEMA_VERSION:
                    raise newer_schema(f"PostgreSQL at {redacted(self.dsn)}", current, SCHEMA_VERSION)
                for version, sql in migrations("postgres"):
                    if version > current:
                        await conn.execute(sql)
                        await conn.execute(Q["record_version"], version)
                        current = version
                        log.info("schema_migrated", version=version)
                return current

        return await self._call(op)

    async def _call(self, op: Callable[[asyncpg.Connection], Awaitable[T]], *, budget: float | None = None) -> T:
        """Run ``op`` on a pooled connection, retrying transient failures within the wall-time budget.

        Each attempt is bounded by ``command_timeout`` and by what is left of the
        budget. An attempt that fails, times out or is cancelled drops its
        connection: a statement may still run on it.
        """
        if self._closed:
            raise closed_store(f"PostgreSQL at {redacted(self.dsn)}")
        loop = asyncio.get_running_loop()
        budget = self._retry_seconds if budget is None else budget
        deadline = loop.time() + budget
        delay = 0.05
        while True:
            remaining = deadline - loop.time()
            conn: asyncpg.Connection | None = None
            bound = max(0.001, min(self._command_timeout, remaining))
            attempt = self._deadlines.begin(bound)
            try:
                conn = await self._pool.acquire()
                value = await op(conn)
            except BaseException as caught:
                exc = (TimeoutError(f"no answer within {bound:g} s") if self._deadlines.timed_out(attempt, caught)
                       else caught)
                lost = isinstance(exc, asyncio.CancelledError) or _transient(exc, conn)
                if conn is not None:
                    if lost:
                        conn.terminate()  # a statement may still run on it: never hand it out again
                    self._pool.release(conn)
                if not isinstance(exc, _DRIVER_ERRORS):
                    raise
                if not lost:
                    raise _translate(exc) from exc
                if loop.time() + delay >= deadline:
                    raise StoreUnavailableError(
                        f"PostgreSQL at {redacted(self.dsn)} stayed unreachable for {budget:g} s "
                        f"({exc!r}); check the server and the network, then retry"
                    ) from exc
                log.warning("postgres_retry", error=repr(exc), delay=delay)
            else:
                self._pool.release(conn)
                return value
            finally:
                self._deadlines.end(attempt)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- protocol -------------------------------------------------------------------

    async def now(self) -> float:
        value: float = await self._call(lambda c: c.fetchval(Q["now"]))
        return value

    async def enqueue(self, task: WorkflowTask) -> EnqueueResult:
        return (await self.enqueue_many([task]))[0]

    async def enqueue_many(self, tasks: Sequence[WorkflowTask]) -> list[EnqueueResult]:
        if not tasks:
            return []
        now = time.time()
        firsts = [task.first_event() for task in tasks]
        # invariant: the run ids are chosen once, before the first attempt: a retry finds its own runs
        args = ([new_run_id(now) for _ in tasks], [t.checkpoint_id for t in tasks], [t.name for t in tasks],
                [t.version for t in tasks], [t.input_json().decode() for t in tasks], [f.type for f in firsts],
                [f.key for f in firsts], [f.body.decode() for f in firsts], [t.parent_run_id for t in tasks],
                [t.concurrency_key for t in tasks], [t.concurrency_limit for t in tasks])

        async def op(conn: asyncpg.Connection) -> list[EnqueueResult]:
            try:
                rows = await conn.fetch(Q["enqueue"], *args)
            except asyncpg.PostgresError as exc:
                if exc.sqlstate == _ENQUEUE_CONFLICT:
                    raise EnqueueConflictError(exc.hint or "", exc.detail or "") from None
                raise
            return [EnqueueResult(r["run_id"], r["created"]) for r in rows]

        return await self._call(op)

    async def claim(
        self, owner: str, names: Collection[str], lease_seconds: float, exclude: Collection[str] = ()
    ) -> Claim | None:
        return await self._claims.submit(_ClaimAsk(owner, tuple(sorted(names)), tuple(sorted(exclude)), lease_seconds))

    async def _send_claims(self, asks: list[_ClaimAsk]) -> list[Claim | None]:
        """One statement leases a run for each ask (all alike), or as many as are due."""
        ask = asks[0]
        nonce = secrets.token_hex(8)  # the same for every attempt: a retry finds what its first attempt leased
        sent = time.monotonic()  # (the lease counts from here: see Claim)
        rows = await self._call(lambda conn: conn.fetch(
            Q["claim"], ask.owner, list(ask.names), list(ask.exclude), ask.lease_seconds, nonce, len(asks)))
        claims: list[Claim | None] = [_claim_of(row, ask.owner, sent) for row in rows]
        return claims + [None] * (len(asks) - len(claims))

    def _hand_back(self, claim: Claim | None) -> None:
        """A claim whose caller stopped waiting: release its run at once rather than orphan the lease."""
        if claim is not None:
            asyncio.ensure_future(self.release(claim.lease)).add_done_callback(_logged)

    async def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        async def op(conn: asyncpg.Connection) -> Lease:
            until, status = await conn.fetchrow(Q["renew"], lease.run_id, lease.token, lease_seconds)
            if until is None:
                raise LeaseLostError(lease.run_id, _rule.renewal_refused(status and RunStatus(status)))
            return Lease(lease.run_id, lease.owner, lease.token, until)

        return await self._call(op)

    async def commit(
        self,
        lease: Lease,
        expected_revision: int,
        events: Sequence[EventRow],
        transition: Transition,
        consumed_signals: Sequence[str] = (),
    ) -> CommitResult:
        columns = transition_columns(transition)
        result = await self._commits.submit(_CommitAsk(lease, expected_revision, events, columns, consumed_signals))
        if isinstance(result, str):
            raise LeaseLostError(lease.run_id, result)
        if columns is not None:
            self._work.set()  # local idle slots recompute their sleep at once
        return result

    async def _send_commits(self, asks: list[_CommitAsk]) -> list[CommitResult | str | BaseException]:
        """One call of ``runifold_commit`` for the batch; each commit is fenced on its own."""
        # invariant: a batch goes in run_id order, so its rows are locked in that order and
        # concurrent batches never deadlock
        order = sorted(range(len(asks)), key=lambda i: asks[i].lease.run_id) if len(asks) > 1 else [0]
        try:
            rows = await self._call(lambda conn: conn.fetch(Q["commit"], *_commit_arrays([asks[i] for i in order])))
        except StoreUnavailableError:
            raise
        except StoreError:
            if len(asks) == 1:
                raise
            # a commit the database refuses fails alone: the others are sent again one by one
            return [await _answer(self._send_commits([ask])) for ask in asks]
        answers: list[CommitResult | str | BaseException] = [""] * len(asks)
        for row in rows:
            answers[order[row["item"]]] = CommitResult(row["new_revision"], row["at"]) if row["ok"] else row["detail"]
        return answers

    async def release(self, lease: Lease) -> None:
        # best effort, bounded by RELEASE_SECONDS: a worker releases its leases as it stops, and its
        # shutdown grace must hold in a network stall; a lease not released expires on its own
        await self._call(lambda conn: conn.execute(Q["release"], lease.run_id, lease.token),
                         budget=min(self._retry_seconds, self._command_timeout, RELEASE_SECONDS))

    async def intervene(
        self, run_ref: str, allowed: Collection[RunStatus], events: Sequence[EventRow], status: RunStatus,
        reason: str = "", *, decided_at: int | None = None,
    ) -> CommitResult:
        row = await self._call(lambda conn: conn.fetchrow(
            Q["intervene"], ref_column(run_ref), run_ref, sorted(str(s) for s in allowed), [e.type for e in events],
            [e.key for e in events], [e.body.decode() for e in events], str(status), clean_text(reason), decided_at))
        if row is None:
            raise RunNotFoundError(run_ref)
        if row["new_revision"] is None:
            refused = _rule.intervene_refusal(row["run_id"], RunStatus(row["status"]), allowed, row["revision"],
                                              decided_at)
            assert refused is not None
            raise refused
        return CommitResult(row["new_revision"], row["at"])

    async def wake(self, run_ref: str) -> RunInfo:
        row = await self._call(lambda conn: conn.fetchrow(Q["wake"], ref_column(run_ref), run_ref))
        if row is None:
            raise RunNotFoundError(run_ref)
        refused = _rule.wake_refusal(row["run_id"], RunStatus(row["status"]))
        if refused is not None:
            raise refused
        return await self.get_run(row["run_id"])

    async def purge(self, run_ref: str) -> None:
        row = await self._call(lambda conn: conn.fetchrow(Q["purge"], ref_column(run_ref), run_ref))
        if row is None:
            raise RunNotFoundError(run_ref)
        refused = _rule.purge_refusal(row["run_id"], RunStatus(row["status"]))
        if refused is not None:
            raise refused

    async def purge_finished(self, before: float, *, limit: int = 1000) -> int:
        before, limit = check_purge(before, limit)
        return int(await self._call(lambda conn: conn.fetchval(Q["purge_finished"], before, limit)))

    async def get_run(self, run_ref: str) -> RunInfo:
        row = await self._call(lambda conn: conn.fetchrow(RUN[ref_column(run_ref)], run_ref))
        if row is None:
            raise RunNotFoundError(run_ref)
        return _run_info(row)

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
        rows = await self._call(lambda conn: conn.fetch(
            Q["list_runs"], listed_statuses(status), name, version, after, limit))
        return [_run_info(r) for r in rows]

    async def count_runs(
        self, *, status: RunStatus | Collection[RunStatus] | None = None, name: str | None = None,
        version: int | None = None, concurrency_key: str | None = None, holding_slot: bool = False,
    ) -> int:
        check_listing(status=status, name=name, version=version, concurrency_key=concurrency_key,
                      holding_slot=holding_slot)
        return int(await self._call(lambda conn: conn.fetchval(
            Q["count_runs"], listed_statuses(status), name, version, concurrency_key, holding_slot)))

    async def history(self, run_ref: str) -> list[StoredEvent]:
        rows = await self._call(lambda conn: conn.fetch(HISTORY[ref_column(run_ref)], run_ref))
        if not rows:  # every run has its run_started event
            raise RunNotFoundError(run_ref)
        return [StoredEvent(r["seq"], r["at"], r["type"], r["key"], r["body"].encode()) for r in rows]

    async def inbox(self, run_id: str) -> list[InboxSignal]:
        rows = await self._call(lambda conn: conn.fetch(Q["inbox"], run_id))
        return [InboxSignal(r[0], r[1], msgspec.json.decode(r[2]), r[3], r[4], r[5]) for r in rows]

    async def deliver_signal(self, delivery: SignalDelivery) -> SignalReceipt:
        d = delivery
        args = (d.run_id, d.run_ref, d.signal_id, d.name, d.payload_json(), d.payload_hash, d.sender, d.key_id,
                d.reason, d.max_unconsumed, d.max_refused)
        row = await self._call(lambda conn: conn.fetchrow(Q["deliver"], *args))
        if row is None:
            raise RunNotFoundError(d.run_id)
        verdict = row["verdict"]
        if verdict == "rejected:conflict":
            raise SignalConflictError(d.run_id, d.signal_id)
        if verdict == "rejected:inbox_full":
            raise _rule.inbox_full(d.run_id, d.name, d.max_unconsumed)
        return SignalReceipt(d.run_id, d.signal_id, verdict == "duplicate", row["received_at"],
                             RunStatus(row["run_status"]))

    async def record_rejected(self, record: AuditRecord, *, max_per_run: int = 1000) -> None:
        r = clean_audit(record)
        cap = _rule.refused_cap(r.run_id, max_per_run)
        await self._call(lambda conn: conn.execute(
            Q["record_rejected"], r.run_id, r.run_ref, r.signal_id, r.name, r.sender, r.key_id, r.verdict,
            r.payload_hash, r.reason, r.detail, r.at, cap))

    async def audit(self, run_ref: str) -> list[AuditRecord]:
        rows = await self._call(lambda conn: conn.fetch(AUDIT[ref_column(run_ref)], run_ref))
        return [AuditRecord(*r) for r in rows]

    # -- schedules --------------------------------------------------------------------

    async def add_schedule(self, schedule: Schedule) -> ScheduleInfo:
        row = await self._call(lambda conn: conn.fetchrow(Q["add_schedule"], schedule.name, *schedule.definition()))
        return _schedule_info(row)

    async def delete_schedule(self, name: str) -> None:
        check_schedule_name(name)
        if await self._call(lambda conn: conn.fetchval(Q["delete_schedule"], name)) is None:
            raise ScheduleNotFoundError(name)

    async def list_schedules(self) -> list[ScheduleInfo]:
        return [_schedule_info(row) for row in await self._call(lambda conn: conn.fetch(Q["schedules"]))]

    async def pause_schedule(self, name: str, *, paused: bool = True) -> ScheduleInfo:
        check_schedule_name(name)
        row = await self._call(lambda conn: conn.fetchrow(Q["pause_schedule"], name, paused))
        if row is None:
            raise ScheduleNotFoundError(name)
        return _schedule_info(row)

    async def advance_schedules(self, ticks: Mapping[str, float]) -> None:
        names = sorted(ticks)
        await self._call(lambda conn: conn.execute(Q["advance_schedules"], names, [ticks[n] for n in names]))

    # -- waking idle workers ---------------------------------------------------------

    async def _ensure_listener(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            return
        if self._connecting is None or self._connecting.done():
            # owned by the store, not by the waiter: a cancelled wait never abandons a half-open connection
            self._connecting = asyncio.ensure_future(self._connect_listener())
        await asyncio.shield(self._connecting)

    async def _connect_listener(self) -> None:
        try:
            async with asyncio.timeout(self._command_timeout):
                conn = await asyncpg.connect(self.dsn, timeout=self._command_timeout,
                                             server_settings={"application_name": LISTEN_APPLICATION})
                await _keepalive(self._keepalive_seconds)(conn)
                await conn.add_listener(CHANNEL, self._notified)
                await conn.add_listener(FINISHED_CHANNEL, self._finished)
            conn.add_termination_listener(self._listener_lost)
            self._listener = conn
        except (*_DRIVER_ERRORS, asyncio.TimeoutError) as exc:
            log.warning("listen_failed", error=repr(exc))
            self._listener = None

    def _notified(self, *_: Any) -> None:
        self._work.set()

    def _finished(self, _conn: Any, _pid: int, _channel: str, run_id: str) -> None:
        for waiter in self._finish_waiters.pop(run_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for_finish(self, run_id: str, timeout: float | None) -> None:
        """Return when ``run_id`` may have finished (notified), after ``timeout``, or after the fallback poll."""
        await self._ensure_listener()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._finish_waiters.setdefault(run_id, set()).add(waiter)
        wait = self._poll_seconds if timeout is None else min(timeout, self._poll_seconds)
        try:
            await asyncio.wait_for(waiter, wait)
        except TimeoutError:
            pass
        finally:
            waiters = self._finish_waiters.get(run_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._finish_waiters[run_id]

    def _listener_lost(self, *_: Any) -> None:
        # the next wait reopens it; until then the fallback poll keeps runs moving
        self._listener = None
        self._work.set()

    async def wait_for_work(self, timeout: float) -> None:
        """Sleep until notified, until the next due time, or ``timeout`` (capped by the fallback poll)."""
        await self._ensure_listener()
        if self._due_query is None or self._due_query.done():
            # owned by the store and shielded: cancelling a waiter never cancels a query mid-flight
            self._due_query = asyncio.ensure_future(self._next_due())
        next_due = await asyncio.shield(self._due_query)
        wait = min(timeout, self._poll_seconds)
        if next_due is not None:
            wait = max(0.0, min(wait, next_due))
        try:
            await asyncio.wait_for(self._work.wait(), wait)
        except TimeoutError:
            pass
        self._work.clear()

    async def _next_due(self) -> float | None:
        """Seconds until the next *future* due time (a due run we could not claim must not make us spin)."""
        try:
            value: float | None = await self._call(lambda c: c.fetchval(Q["next_due"]),
                                                   budget=self._command_timeout)
        except StoreError:
            return None
        return value

    @property
    def listener(self) -> asyncpg.Connection | None:
        """The connection that LISTENs for work, or None while there is none."""
        return self._listener

    @property
    def batches(self) -> tuple[int, int, int, int]:
        """(commit round trips, commits they carried, claim round trips, claims they carried)."""
        return self._commits.batches, self._commits.items, self._claims.batches, self._claims.items

    async def close(self) -> None:
        """Close every connection; every later operation is refused."""
        self._closed = True
        await self._commits.close()
        await self._claims.close()
        for pending in (self._connecting, self._due_query):
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
        if self._listener is not None and not self._listener.is_closed():
            self._listener.terminate()
        await self._pool.close()
        self._deadlines.close()


_BATCH_LIMIT = 64  # the most commits (or claims) one round trip carries


class _ClaimAsk(NamedTuple):
    owner: str
    names: tuple[str, ...]
    exclude: tuple[str, ...]
    lease_seconds: float


class _CommitAsk(NamedTuple):
    lease: Lease
    expected: int
    events: Sequence[EventRow]
    columns: RunColumns | None
    consumed: Sequence[str]


def _commit_arrays(asks: Sequence[_CommitAsk]) -> tuple[list[Any], ...]:
    """The arguments of ``runifold_commit`` (``schema.sql`` documents them)."""
    events = [e for ask in asks for e in ask.events]
    return (
        [ask.lease.run_id for ask in asks], [ask.lease.token for ask in asks], [ask.expected for ask in asks],
        [len(ask.events) for ask in asks], [_change(ask) for ask in asks],
        [e.type for e in events], [e.key for e in events], [e.body.decode() for e in events],
    )


def _change(ask: _CommitAsk) -> str | None:
    """A commit's transition and consumed signals as ``runifold_commit`` reads them; None: it only appends."""
    c = ask.columns
    if c is None and not ask.consumed:
        return None
    change: dict[str, Any] = {} if c is None else {
        "status": str(c.status), "due": c.due_at, "reason": c.reason, "waits": c.wait_signals}
    if ask.consumed:
        change["consumed"] = list(ask.consumed)
    return msgspec.json.encode(change).decode()


async def _answer(sent: Awaitable[list[T]]) -> T | BaseException:
    """The one answer of a batch of one, or its error."""
    try:
        return (await sent)[0]
    except Exception as exc:
        return exc


def _logged(task: asyncio.Future[None]) -> None:
    """Log a failed hand-back; the run's lease then expires on its own and another claim takes it."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("claim_not_released", error=repr(task.exception()))
