"""The PostgreSQL store (asyncpg): many workers on many hosts share one database.

* Claims pick due runs with ``FOR UPDATE SKIP LOCKED`` and take the leases in
  the same statement: concurrent workers never wait on each other's claims.
  The claims a process makes on one pass of its event loop, or while another
  claim is in flight, share that statement.
* Every time (lease expiry, timers, signal freshness) is judged on the database
  clock, ``clock_timestamp()``, never on a worker's.
* A durable step is one round trip: ``runifold_commit_arrays`` (a function
  created by the migrations) fences, appends, consumes signals and applies the
  transition. The concurrent commits of a process share that round trip, one
  transaction and one WAL flush, each fenced on its own: a commit waits one
  pass of the event loop, so the commits of runs that became ready together
  leave together, unless its run was alone in the last batch. A lone commit
  that only appends (the sequential case) is one plain statement with the
  same fence.
* ``LISTEN runifold_work``: idle workers wake at once when a run becomes due;
  a due timer wakes them through the next-due-time they sleep until; polling
  remains only as a fallback, and a dropped listening connection is reopened.
* Connection loss is retried with bounded backoff. A retried commit can never
  be applied twice: the revision fence refuses the second attempt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, final

import asyncpg  # type: ignore[import-untyped]
import msgspec
from runifold._log import get_logger

from runifold.errors import (
    EnqueueConflictError,
    LeaseLostError,
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
    RunColumns,
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
log = get_logger("runifold.stores.postgres")

CHANNEL = "runifold_work"
#: the application_name of the connection that sends commit batches (see pg_stat_activity)
COMMIT_APPLICATION = "runifold-commits"
#: the application_name of the connection that claims runs
CLAIM_APPLICATION = "runifold-claims"
_MIGRATION_LOCK = 0x72756E69  # "runi": one advisory lock id for schema migrations
_RUN_COLUMNS = (
    "run_id, checkpoint_id, name, version, status, revision, due_at, lease_owner, lease_token, "
    "lease_until, created_at, updated_at, reason"
)
_json = msgspec.json.encode
# SQLSTATE classes that mean "the connection or server went away; try again".
_TRANSIENT_CLASSES = ("08", "57", "53")
_TRANSIENT_CODES = {"40001", "40P01"}

# One round trip: pick and lease up to {limit} runs, and return each one's history and inbox
# (the subqueries see the events and signals as they were; the UPDATE touches neither).
# invariant: the limit is a literal, so the cached generic plan is as cheap as a custom one
# and PostgreSQL reuses it (with LIMIT $n it estimates a tenth of the rows, finds the
# generic plan dearer and plans the statement again on every call).
# invariant: "now" is a subquery, evaluated once, so it bounds the due_at index scan;
# runifold_now() is volatile, and as a plain filter the scan would walk every future timer.
_CLAIM = (
    "WITH pick AS ("
    "  SELECT run_id FROM runifold_runs"
    "  WHERE due_at IS NOT NULL AND due_at <= (SELECT runifold_now()) AND name = ANY($2::text[])"
    "  AND NOT (run_id = ANY($3::text[]))"
    "  ORDER BY due_at LIMIT {limit} FOR UPDATE SKIP LOCKED"
    "), claimed AS ("
    "  UPDATE runifold_runs r SET status = 'running', lease_token = r.lease_token + 1, lease_owner = $1,"
    "  lease_until = runifold_now() + $4, due_at = runifold_now() + $4, updated_at = runifold_now()"
    "  FROM pick WHERE r.run_id = pick.run_id"
    "  RETURNING r.run_id, r.checkpoint_id, r.name, r.version, r.lease_token, r.lease_until"
    ") SELECT c.*,"
    " (SELECT coalesce(json_agg(json_build_array(e.seq, e.at, e.type, e.key, e.body::text) ORDER BY e.seq), '[]')"
    "  FROM runifold_events e WHERE e.run_id = c.run_id)::text AS history,"
    " (SELECT coalesce(json_agg(json_build_array(s.signal_id, s.name, s.payload, s.sender, s.reason, s.received_at)"
    "  ORDER BY s.received_at, s.arrival), '[]') FROM runifold_signals s"
    "  WHERE s.run_id = c.run_id AND NOT s.consumed)::text AS inbox"
    " FROM claimed c"
)
#: the most claims one round trip makes; more waiting callers go in the next
_CLAIMS_PER_TRIP = 64
_CLAIMS = [_CLAIM.format(limit=n) for n in range(_CLAIMS_PER_TRIP + 1)]


# A commit that only appends (no transition, no signal consumed), sent alone: the same
# fence as runifold_commit_arrays, in one statement. ok is false when the fence refused it.
_STEP = (
    "WITH n AS (SELECT runifold_now() AS now), u AS ("
    "  UPDATE runifold_runs SET revision = $3 + cardinality($4::text[]), updated_at = n.now FROM n"
    "  WHERE run_id = $1 AND status = 'running' AND lease_token = $2 AND lease_until > n.now AND revision = $3"
    "  RETURNING revision, updated_at"
    "), e AS ("
    "  INSERT INTO runifold_events (run_id, seq, type, key, at, body)"
    "  SELECT $1, $3 + x.ord, x.type, x.key, u.updated_at, x.body::jsonb"
    "  FROM u, unnest($4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS x(type, key, body, ord)"
    ") SELECT 0 AS item, u.revision IS NOT NULL AS ok, coalesce(u.revision, 0) AS new_revision,"
    " coalesce(u.updated_at, n.now) AS at FROM n LEFT JOIN u ON true"
)


# Many commits in one round trip (migration 0005 documents the arguments).
_BATCH = (
    "SELECT item, ok, new_revision, at FROM runifold_commit_arrays("
    "$1::text[], $2::bigint[], $3::bigint[], $4::integer[], $5::text[], $6::double precision[], $7::text[],"
    " $8::text[], $9::text[], $10::integer[], $11::bigint[], $12::text[], $13::text[], $14::text[])"
)


def _run_info(row: asyncpg.Record) -> RunInfo:
    return RunInfo(row["run_id"], row["checkpoint_id"], row["name"], row["version"], RunStatus(row["status"]),
                   row["revision"], row["due_at"], row["lease_owner"], row["lease_token"], row["lease_until"],
                   row["created_at"], row["updated_at"], row["reason"])


# Errors of the connection rather than of the statement. InternalClientError comes
# from a connection whose server went away between calls (the protocol is still
# consuming the server's last error): like a lost connection, it is dropped and
# the call retried.
_CONNECTION_ERRORS = (OSError, asyncpg.exceptions.ConnectionDoesNotExistError, asyncpg.exceptions.InterfaceError,
                      asyncpg.exceptions.InternalClientError)
# What a driver call can raise.
_DRIVER_ERRORS = (*_CONNECTION_ERRORS, asyncpg.PostgresError)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, _CONNECTION_ERRORS):
        return True
    code = getattr(exc, "sqlstate", None) or ""
    return code in _TRANSIENT_CODES or code[:2] in _TRANSIENT_CLASSES


def _claim_of(row: asyncpg.Record, owner: str, lease_seconds: float) -> Claim:
    run_id = row["run_id"]
    until = row["lease_until"]
    history = [StoredEvent(seq, at, type_, key, body.encode())
               for seq, at, type_, key, body in msgspec.json.decode(row["history"])]
    inbox = [InboxSignal(*signal) for signal in msgspec.json.decode(row["inbox"])]
    return Claim(run_id, row["checkpoint_id"], row["name"], row["version"],
                 Lease(run_id, owner, row["lease_token"], until), until - lease_seconds, history, inbox)


def _release_done(task: asyncio.Future[None]) -> None:
    """Log a failed hand-back; the run's lease then expires on its own and another claim takes it."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("claim_not_released", error=str(task.exception()))


async def _find(conn: asyncpg.Connection, ref: str, *, lock: bool = False) -> asyncpg.Record:
    row = await conn.fetchrow(
        f"SELECT {_RUN_COLUMNS}, wait_signals FROM runifold_runs WHERE run_id = $1 OR checkpoint_id = $1"
        + (" FOR UPDATE" if lock else ""),
        ref,
    )
    if row is None:
        raise RunNotFoundError(ref)
    return row


@final
class PostgresWorkflowStore:
    """A :class:`WorkflowStore` on PostgreSQL. Open with ``await PostgresWorkflowStore.open(dsn)``."""

    def __init__(self, dsn: str, pool: asyncpg.Pool, retry_seconds: float, poll_seconds: float) -> None:
        self.dsn = dsn
        self._pool = pool
        self._retry_seconds = retry_seconds
        self._poll_seconds = poll_seconds
        self._listener: asyncpg.Connection | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._due_query: asyncio.Future[float | None] | None = None
        # commits that arrive while a batch is in flight wait here for the next one;
        # batches go one at a time over the store's own connection
        self._commits: list[_PendingCommit] = []
        self._lane = _Lane(dsn, COMMIT_APPLICATION)
        self._lane_busy = False  # the batcher holds it: a batch is in flight or about to leave
        self._alone: str | None = None  # the run whose commit was the last batch's only one
        self._batcher: asyncio.Future[None] | None = None
        #: commit batches sent and the commits they carried (how well commits are grouped)
        self.batches = 0
        self.batched_commits = 0
        # claims that arrive while one is in flight wait here; the next round trip claims
        # for all of them at once, over the store's own claiming connection
        self._claims: list[_PendingClaim] = []
        self._claim_lane = _Lane(dsn, CLAIM_APPLICATION)
        self._claiming = False
        self._claimer: asyncio.Future[None] | None = None
        self._releasing: set[asyncio.Future[None]] = set()
        #: claim round trips made (each claims for every caller waiting at that moment)
        self.claim_batches = 0
        self._work = asyncio.Event()

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        retry_seconds: float = 15.0,
        poll_seconds: float = 5.0,
    ) -> PostgresWorkflowStore:
        """Connect, then create or migrate the schema (safe when many workers start at once).

        Args:
            dsn: ``postgresql://user:password@host:port/database``.
            min_size: connections kept open in the pool.
            max_size: the pool's upper bound.
            retry_seconds: how long an operation retries a lost connection before
                raising :class:`StoreUnavailableError`.
            poll_seconds: the fallback poll interval of :meth:`wait_for_work`.
        """
        try:
            pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, reset=_keep_session)
        except (OSError, asyncpg.PostgresError) as exc:
            raise StoreUnavailableError(
                f"cannot connect to PostgreSQL at {_redact(dsn)}: {exc}; check that the server runs "
                "and the URL, user and password are right"
            ) from exc
        store = cls(dsn, pool, retry_seconds, poll_seconds)
        try:
            await store.migrate()
        except BaseException:
            await pool.close()
            raise
        return store

    async def migrate(self) -> int:
        """Apply pending schema migrations under an advisory lock; return the schema version."""

        async def op(conn: asyncpg.Connection) -> int:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS runifold_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                )
                current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM runifold_schema")
                for version, sql in migrations("postgres"):
                    if version > current:
                        await conn.execute(sql)
                        await conn.execute("INSERT INTO runifold_schema (version) VALUES ($1)", version)
                        current = version
                        log.info("schema_migrated", version=version)
                return int(current)

        return await self._call(op)

    async def _call(self, op: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run ``op`` on a pooled connection, retrying lost connections with bounded backoff."""

        async def attempt() -> T:
            async with self._pool.acquire() as conn:
                try:
                    return await op(conn)
                except _DRIVER_ERRORS as exc:
                    if _transient(exc):
                        conn.terminate()  # the pool replaces it rather than hand it out again
                    raise

        return await self._retrying(attempt)

    async def _retrying(self, attempt: Callable[[], Awaitable[T]], lost: Callable[[], None] = lambda: None) -> T:
        """Translate driver errors; retry transient ones (calling ``lost`` first) for ``retry_seconds``."""
        deadline = time.monotonic() + self._retry_seconds
        delay = 0.05
        while True:
            try:
                return await attempt()
            except _DRIVER_ERRORS as exc:
                if not _transient(exc):
                    if isinstance(exc, asyncpg.PostgresError):
                        raise StoreError(f"PostgreSQL error {exc.sqlstate}: {exc}") from exc
                    raise StoreError(f"PostgreSQL driver error: {exc}") from exc
                lost()
                if time.monotonic() > deadline:
                    raise StoreUnavailableError(
                        f"PostgreSQL stayed unreachable for {self._retry_seconds:g} s ({exc}); "
                        "check the server, then retry"
                    ) from exc
                log.warning("postgres_retry", error=str(exc), delay=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    # -- protocol -------------------------------------------------------------------

    async def now(self) -> float:
        value: float = await self._call(lambda c: c.fetchval("SELECT runifold_now()"))
        return value

    async def enqueue(self, task: WorkflowTask) -> EnqueueResult:
        input_json = task.input_json().decode()
        first = task.first_event()

        async def op(conn: asyncpg.Connection) -> EnqueueResult:
            async with conn.transaction():
                now = await conn.fetchval("SELECT runifold_now()")
                run_id = new_run_id(now)
                inserted = await conn.fetchval(
                    "INSERT INTO runifold_runs (run_id, checkpoint_id, name, version, input_json, status, revision, "
                    "due_at, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 'ready', 1, $6, $6, $6) "
                    "ON CONFLICT (checkpoint_id) DO NOTHING RETURNING run_id",
                    run_id, task.checkpoint_id, task.name, task.version, input_json, now,
                )
                if inserted is None:
                    row = await conn.fetchrow(
                        "SELECT run_id, name, version, input_json FROM runifold_runs WHERE checkpoint_id = $1",
                        task.checkpoint_id,
                    )
                    if same_task(task, row["name"], row["version"], row["input_json"].encode()):
                        return EnqueueResult(row["run_id"], False)
                    raise EnqueueConflictError(task.checkpoint_id or "", row["run_id"])
                await conn.execute(
                    "INSERT INTO runifold_events (run_id, seq, type, key, at, body) VALUES ($1, 1, $2, $3, $4, $5::jsonb)",
                    run_id, first.type, first.key, now, first.body.decode(),
                )
                await conn.execute("SELECT pg_notify($1, '')", CHANNEL)
                return EnqueueResult(run_id, True)

        return await self._call(op)

    async def claim(
        self, owner: str, names: Collection[str], lease_seconds: float, exclude: Collection[str] = ()
    ) -> Claim | None:
        pending = _PendingClaim((owner, sorted(names), sorted(exclude), lease_seconds),
                                asyncio.get_running_loop().create_future())
        self._claims.append(pending)
        # the claimer runs on the loop's next pass: claims made on this pass (runs that
        # ended together) share its round trip
        self._start_claimer()
        return await pending.done

    def _start_claimer(self) -> None:
        if self._claims and not self._claiming:
            self._claiming = True
            # owned by the store: a cancelled caller never cancels a claim made for others
            self._claimer = asyncio.ensure_future(self._claim_batches())

    async def _claim_batches(self) -> None:
        """Send the queued claims, those that ask alike in one round trip each time."""
        try:
            while self._claims:
                await self._claim_batch()
        finally:
            self._claiming = False

    async def _claim_batch(self) -> None:
        """Claim for the first queued caller and every other one that asks alike (same owner and filters)."""
        key = self._claims[0].key
        # a caller cancelled before its claim was sent is left out
        alike = [p for p in self._claims if p.key == key and not p.done.done()]
        batch, later = alike[:_CLAIMS_PER_TRIP], alike[_CLAIMS_PER_TRIP:]
        self._claims = later + [p for p in self._claims if p.key != key]
        if not batch:
            return
        owner, names, exclude, lease_seconds = key
        try:
            rows = await self._retrying(
                lambda: self._claim_lane.fetch(_CLAIMS[len(batch)], owner, names, exclude, lease_seconds),
                self._claim_lane.lose)
            claims = iter([_claim_of(row, owner, lease_seconds) for row in rows])
        except asyncio.CancelledError:
            self._claim_lane.lose()  # the query may still be running on its connection
            for pending in batch:
                pending.done.cancel()
            raise
        except Exception as exc:
            # invariant: no caller waits forever, whatever went wrong; each gets the error
            error = exc if isinstance(exc, StoreError) else StoreError(f"claim failed: {exc!r}")
            for pending in batch:
                if not pending.done.done():
                    pending.done.set_exception(error)
            return
        self.claim_batches += 1
        for pending in batch:
            claim = next(claims, None)
            if not pending.done.done():
                pending.done.set_result(claim)
            elif claim is not None:
                # its caller went away while the claim was in flight: hand the run back
                release = asyncio.ensure_future(self.release(claim.lease))
                release.add_done_callback(_release_done)
                self._releasing.add(release)
        self._releasing = {task for task in self._releasing if not task.done()}

    async def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        async def op(conn: asyncpg.Connection) -> Lease:
            until = await conn.fetchval(
                "UPDATE runifold_runs SET lease_until = runifold_now() + $3, due_at = runifold_now() + $3 "
                "WHERE run_id = $1 AND status = 'running' AND lease_token = $2 AND lease_until > runifold_now() "
                "RETURNING lease_until",
                lease.run_id, lease.token, lease_seconds,
            )
            if until is None:
                raise LeaseLostError(lease.run_id)
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
        pending = _PendingCommit(lease, expected_revision, events, transition_columns(transition), consumed_signals,
                                 asyncio.get_running_loop().create_future())
        if lease.run_id == self._alone and not self._commits and not self._lane_busy:
            # the last batch carried only this run's commit: no other run commits here, so
            # there is no one to wait a pass for; send it at once, from this task
            self._lane_busy = True
            try:
                await self._send_batch([pending])
            finally:
                self._lane_busy = False
                self._start_batcher()
        else:
            self._commits.append(pending)  # the next batch takes it
            self._start_batcher()
        ok, revision, at = await pending.done
        if not ok:
            raise LeaseLostError(lease.run_id, "fenced off by a newer lease or revision")
        if pending.columns is not None and pending.columns.due_at is not None:
            self._work.set()  # local idle slots recompute their sleep at once
        return CommitResult(revision, at)

    def _start_batcher(self) -> None:
        if self._commits and not self._lane_busy:
            self._lane_busy = True
            # owned by the store: a cancelled caller never cancels a batch of others' commits
            self._batcher = asyncio.ensure_future(self._commit_batches())

    async def _commit_batches(self) -> None:
        """Send the queued commits, as many as are waiting, in one round trip each time.

        Every batch leaves one pass of the event loop after the batcher starts
        or after the batch before it is answered. Runs that become ready together
        (the runs a batch just answered, or runs that ended a wait together)
        reach their next commits on that pass and share one round trip; commits
        that arrive while a batch is in flight wait for the next one. A lone
        commit leaves after that one pass; the next commit of a run that was
        alone in the last batch skips the batcher (see :meth:`commit`).
        """
        try:
            while True:
                # let runs that became ready together reach their commits: they join this batch
                await asyncio.sleep(0)
                batch: list[_PendingCommit] = []
                later: list[_PendingCommit] = []
                seen: set[str] = set()
                for pending in self._commits:
                    if pending.done.done():
                        continue  # its caller was cancelled before it was sent
                    # a run appears once per batch: the revision fence judges its commits in order
                    (later if pending.lease.run_id in seen else batch).append(pending)
                    seen.add(pending.lease.run_id)
                self._commits = later
                if not batch:
                    break
                await self._send_batch(batch)
        finally:
            self._lane_busy = False

    async def _send_batch(self, batch: list[_PendingCommit]) -> None:
        try:
            rows = await self._retrying(lambda: self._lane.run(batch), self._lane.lose)
        except asyncio.CancelledError:
            self._lane.lose()  # the query may still be running on its connection
            for pending in batch:
                pending.done.cancel()
            raise
        except Exception as exc:
            if not isinstance(exc, StoreError):
                # invariant: no caller waits forever, whatever went wrong
                exc = StoreError(f"commit batch failed: {exc!r}")
            if len(batch) > 1 and not isinstance(exc, StoreUnavailableError):
                for pending in batch:  # find the commit at fault; the others land on their own
                    await self._send_batch([pending])
                return
            for pending in batch:
                if not pending.done.done():
                    pending.done.set_exception(exc)
            return
        self.batches += 1
        self.batched_commits += len(batch)
        self._alone = batch[0].lease.run_id if len(batch) == 1 else None
        for row in rows:
            pending = batch[row["item"]]
            if not pending.done.done():
                pending.done.set_result((row["ok"], row["new_revision"], row["at"]))

    async def release(self, lease: Lease) -> None:
        await self._call(lambda conn: conn.execute(
            "WITH r AS (UPDATE runifold_runs SET status = 'ready', due_at = runifold_now(), lease_owner = NULL, "
            "lease_until = NULL WHERE run_id = $1 AND status = 'running' AND lease_token = $2 RETURNING 1) "
            "SELECT pg_notify($3, '') FROM r",
            lease.run_id, lease.token, CHANNEL,
        ))

    async def intervene(
        self, run_ref: str, allowed: Collection[RunStatus], events: Sequence[EventRow], status: RunStatus
    ) -> CommitResult:
        async def op(conn: asyncpg.Connection) -> CommitResult:
            async with conn.transaction():
                info = _run_info(await _find(conn, run_ref, lock=True))
                if info.status not in allowed:
                    raise not_allowed(info.run_id, info.status, allowed)
                now = await conn.fetchval("SELECT runifold_now()")
                await conn.executemany(
                    "INSERT INTO runifold_events (run_id, seq, type, key, at, body) VALUES ($1, $2, $3, $4, $5, $6::jsonb)",
                    [(info.run_id, info.revision + i + 1, e.type, e.key, now, e.body.decode()) for i, e in enumerate(events)],
                )
                revision = info.revision + len(events)
                await conn.execute(
                    "UPDATE runifold_runs SET revision = $2, updated_at = $3, status = $4, due_at = $5, "
                    "lease_token = lease_token + 1, lease_owner = NULL, lease_until = NULL WHERE run_id = $1",
                    info.run_id, revision, now, str(status), None if status.finished else now,
                )
                await conn.execute("SELECT pg_notify($1, '')", CHANNEL)
                return CommitResult(revision, now)

        return await self._call(op)

    async def purge(self, run_ref: str) -> None:
        async def op(conn: asyncpg.Connection) -> None:
            async with conn.transaction():
                info = _run_info(await _find(conn, run_ref, lock=True))
                if not info.status.finished:
                    raise not_finished(info.run_id, info.status)
                for table in ("runifold_events", "runifold_signals", "runifold_signal_audit", "runifold_runs"):
                    await conn.execute(f"DELETE FROM {table} WHERE run_id = $1", info.run_id)

        await self._call(op)

    async def get_run(self, run_ref: str) -> RunInfo:
        return _run_info(await self._call(lambda c: _find(c, run_ref)))

    async def list_runs(
        self, *, status: RunStatus | None = None, name: str | None = None, version: int | None = None, limit: int = 100
    ) -> list[RunInfo]:
        rows = await self._call(lambda c: c.fetch(
            f"SELECT {_RUN_COLUMNS} FROM runifold_runs WHERE ($1::text IS NULL OR status = $1) "
            "AND ($2::text IS NULL OR name = $2) AND ($3::int IS NULL OR version = $3) ORDER BY run_id DESC LIMIT $4",
            None if status is None else str(status), name, version, limit,
        ))
        return [_run_info(r) for r in rows]

    async def history(self, run_ref: str) -> list[StoredEvent]:
        async def op(conn: asyncpg.Connection) -> list[StoredEvent]:
            return await self._history(conn, (await _find(conn, run_ref))["run_id"])

        return await self._call(op)

    @staticmethod
    async def _history(conn: asyncpg.Connection, run_id: str) -> list[StoredEvent]:
        rows = await conn.fetch(
            "SELECT seq, at, type, key, body::text AS body FROM runifold_events WHERE run_id = $1 ORDER BY seq", run_id
        )
        return [StoredEvent(r["seq"], r["at"], r["type"], r["key"], r["body"].encode()) for r in rows]

    async def deliver_signal(self, delivery: SignalDelivery) -> SignalReceipt:
        payload = _json(delivery.payload).decode()

        async def op(conn: asyncpg.Connection) -> SignalReceipt:
            async with conn.transaction():
                # invariant: the run row is locked, so a concurrent commit sees this signal or we see its wait
                info = _run_info(await _find(conn, delivery.run_ref, lock=True))
                now = await conn.fetchval("SELECT runifold_now()")
                original = await conn.fetchval(
                    "INSERT INTO runifold_signals (run_id, signal_id, name, payload, sender, key_id, reason, received_at) "
                    "VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8) ON CONFLICT (run_id, signal_id) DO NOTHING "
                    "RETURNING received_at",
                    info.run_id, delivery.signal_id, delivery.name, payload, delivery.sender, delivery.key_id,
                    delivery.reason, now,
                )
                duplicate = original is None
                received_at = now
                if duplicate:
                    received_at = await conn.fetchval(
                        "SELECT received_at FROM runifold_signals WHERE run_id = $1 AND signal_id = $2",
                        info.run_id, delivery.signal_id,
                    )
                verdict = "duplicate" if duplicate else "accepted"
                detail = "run finished; kept unconsumed" if info.status.finished and not duplicate else ""
                await _insert_audit(conn, AuditRecord(
                    info.run_id, delivery.run_ref, delivery.signal_id, delivery.name, delivery.sender,
                    delivery.key_id, verdict, delivery.payload_hash, delivery.reason, detail, now))
                if not duplicate:
                    await conn.execute(
                        "WITH r AS (UPDATE runifold_runs SET due_at = $2 WHERE run_id = $1 AND status = 'waiting' "
                        "AND $3 = ANY (wait_signals) RETURNING 1) SELECT pg_notify($4, '') FROM r",
                        info.run_id, now, delivery.name, CHANNEL,
                    )
                return SignalReceipt(info.run_id, delivery.signal_id, duplicate, received_at, info.status)

        return await self._call(op)

    async def record_rejected(self, record: AuditRecord) -> None:
        await self._call(lambda conn: _insert_audit(conn, record))

    async def audit(self, run_ref: str) -> list[AuditRecord]:
        async def op(conn: asyncpg.Connection) -> list[AuditRecord]:
            try:
                run_id = (await _find(conn, run_ref))["run_id"]
            except RunNotFoundError:
                run_id = None
            rows = await conn.fetch(
                "SELECT run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, reason, detail, at "
                "FROM runifold_signal_audit WHERE run_id = $1 OR run_ref = $2 ORDER BY id",
                run_id, run_ref,
            )
            return [AuditRecord(*r) for r in rows]

        return await self._call(op)

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
            conn = await asyncpg.connect(self.dsn)
            await conn.add_listener(CHANNEL, self._notified)
            conn.add_termination_listener(self._listener_lost)
            self._listener = conn
        except _DRIVER_ERRORS as exc:
            log.warning("listen_failed", error=str(exc))
            self._listener = None

    def _notified(self, *_: Any) -> None:
        self._work.set()

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
            value: float | None = await self._call(lambda c: c.fetchval(
                "SELECT min(due_at) - runifold_now() FROM runifold_runs WHERE due_at > (SELECT runifold_now())"))
        except StoreError:
            return None
        return value

    @property
    def listener(self) -> asyncpg.Connection | None:
        """The connection that LISTENs for work, or None while there is none."""
        return self._listener

    async def close(self) -> None:
        for pending in (self._batcher, self._claimer, self._connecting, self._due_query, *self._releasing):
            if pending is not None:
                await asyncio.gather(pending, return_exceptions=True)
        await self._lane.close()
        await self._claim_lane.close()
        if self._listener is not None and not self._listener.is_closed():
            await self._listener.close()
        await self._pool.close()


@dataclass(slots=True)
class _PendingCommit:
    """A commit waiting for the next batch; ``done`` gets (ok, new revision, at)."""

    lease: Lease
    expected: int
    events: Sequence[EventRow]
    columns: RunColumns | None
    consumed: Sequence[str]
    done: asyncio.Future[tuple[bool, int, float]]


@dataclass(slots=True)
class _PendingClaim:
    """A claim waiting for the next claiming round trip; ``key`` is (owner, names, exclude, lease seconds)."""

    key: tuple[str, list[str], list[str], float]
    done: asyncio.Future[Claim | None]


class _Lane:
    """A connection of the store's own that sends one statement at a time; opened on first use."""

    def __init__(self, dsn: str, application: str) -> None:
        self._dsn = dsn
        self._application = application
        self._conn: asyncpg.Connection | None = None

    async def _connect(self) -> asyncpg.Connection:
        self._conn = await asyncpg.connect(self._dsn, server_settings={"application_name": self._application})
        return self._conn

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        conn = self._conn
        if conn is None or conn.is_closed():
            conn = await self._connect()
        rows: list[asyncpg.Record] = await conn.fetch(sql, *args)
        return rows

    async def run(self, batch: Sequence[_PendingCommit]) -> list[asyncpg.Record]:
        """Send the commits of ``batch``; one row (item, ok, new_revision, at) per commit."""
        if len(batch) == 1 and batch[0].columns is None and not batch[0].consumed:
            # a lone step: one plain statement costs the server less than the batch function
            p = batch[0]
            conn = self._conn
            if conn is None or conn.is_closed():
                conn = await self._connect()
            row = await conn.fetchrow(
                _STEP, p.lease.run_id, p.lease.token, p.expected,
                [e.type for e in p.events], [e.key for e in p.events], [e.body.decode() for e in p.events])
            return [row]
        return await self.fetch(_BATCH, *_batch_arrays(batch))

    def lose(self) -> None:
        """Drop the connection (lost, or a query may still run on it); the next batch opens another."""
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None

    async def close(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()


def _batch_arrays(batch: Sequence[_PendingCommit]) -> tuple[list[Any] | None, ...]:
    """The arguments of ``runifold_commit_arrays`` (its migration documents them).

    When no commit of the batch changes the run's status or consumes a signal
    (steps only, the usual batch), the five arrays that would hold nothing but
    NULLs go as NULL: the function reads a NULL array's elements as NULL, and
    the client encodes 5 arrays fewer (about a tenth of a batch's client CPU).
    """
    run: list[str] = []
    token: list[int] = []
    expected: list[int] = []
    count: list[int] = []
    status: list[str | None] = []
    due: list[float | None] = []
    reason: list[str | None] = []
    waits: list[str | None] = []
    consumed: list[str | None] = []
    item: list[int] = []
    seq: list[int] = []
    types: list[str] = []
    keys: list[str] = []
    bodies: list[str] = []
    for i, p in enumerate(batch, 1):
        run.append(p.lease.run_id)
        token.append(p.lease.token)
        expected.append(p.expected)
        count.append(len(p.events))
        columns = p.columns
        if columns is None:
            status.append(None)
            due.append(None)
            reason.append(None)
            waits.append(None)
        else:
            status.append(str(columns.status))
            due.append(columns.due_at)
            reason.append(columns.reason)
            waits.append(_json(columns.wait_signals).decode() if columns.wait_signals else None)
        consumed.append(_json(p.consumed).decode() if p.consumed else None)
        for j, e in enumerate(p.events, 1):
            item.append(i)
            seq.append(p.expected + j)
            types.append(e.type)
            keys.append(e.key)
            bodies.append(e.body.decode())
    if all(p.columns is None and not p.consumed for p in batch):
        return run, token, expected, count, None, None, None, None, None, item, seq, types, keys, bodies
    return run, token, expected, count, status, due, reason, waits, consumed, item, seq, types, keys, bodies


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: skip the default reset round trip on every release.

    Pooled connections never change session state: no SET, no LISTEN (the
    listener has its own connection), and the migration lock is transaction-scoped.
    """


async def _insert_audit(conn: asyncpg.Connection, r: AuditRecord) -> None:
    await conn.execute(
        "INSERT INTO runifold_signal_audit (run_id, run_ref, signal_id, name, sender, key_id, verdict, payload_hash, "
        "reason, detail, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        r.run_id, r.run_ref, r.signal_id, r.name, r.sender, r.key_id, r.verdict, r.payload_hash, r.reason, r.detail,
        r.at,
    )


def _redact(dsn: str) -> str:
    """Hide a password in a DSN for error messages."""
    if "@" not in dsn or "://" not in dsn:
        return dsn
    scheme, rest = dsn.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else dsn
