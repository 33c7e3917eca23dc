"""PostgreSQL-only behaviour: the claim's plan, vacuum of its index, claims handed back, retries that find their own write."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from runifold import RunStatus, WorkflowTask
from runifold.stores import Continue, Finish
from runifold.testing._conformance import step_row

pytestmark = pytest.mark.parametrize("open_store", ["postgres"], indirect=True)
CLAIM_ARGS = ("w", ["wf"], [], 30.0, "nonce", 1)


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan tree, the root first."""
    return [node, *(n for child in node.get("Plans", []) for n in _plan_nodes(child))]


async def test_postgres_claim_is_bounded_by_the_due_index(open_store: Any) -> None:
    """The claim's due_at bound is an index condition, so future timers are never scanned one by one."""
    import asyncpg  # type: ignore[import-untyped]

    from runifold.stores.postgres import Q

    store = await open_store()
    conn = await asyncpg.connect(store.dsn)
    try:
        await conn.execute(  # 5,000 runs sleeping on timers an hour away
            "INSERT INTO runifold_runs (run_id, name, version, input_json, status, revision, due_at, created_at, "
            "updated_at) SELECT 'run_sleep' || i, 'wf', 1, '{}', 'waiting', 2, runifold_now() + 3600, 0, 0 "
            "FROM generate_series(1, 5000) AS i")
        await conn.execute("ANALYZE runifold_runs")
        plan = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {Q['claim']}", *CLAIM_ARGS)
    finally:
        await conn.close()
    scans = [n for n in _plan_nodes(msgspec.json.decode(plan)[0]["Plan"]) if n.get("Index Name") == "runifold_runs_due"]
    assert scans and "due_at <=" in scans[0]["Index Cond"], scans
    assert scans[0].get("Rows Removed by Filter", 0) == 0 and scans[0]["Actual Rows"] == 0, scans


async def test_postgres_vacuum_cleans_the_claim_index_in_a_table_of_finished_runs(open_store: Any) -> None:
    """Dead due_at entries that runs leave behind are removed by VACUUM even when the table is mostly finished runs."""
    import asyncpg

    from runifold.stores.postgres import Q

    store = await open_store()
    conn = await asyncpg.connect(store.dsn)
    try:
        await conn.execute(
            "INSERT INTO runifold_runs (run_id, name, version, input_json, status, revision, due_at, created_at, "
            "updated_at) SELECT 'run_fin' || i, 'wf', 1, '{}', 'completed', 3, NULL, 0, 0 "
            "FROM generate_series(1, 200000) AS i")
        await conn.execute(
            "INSERT INTO runifold_runs (run_id, name, version, input_json, status, revision, due_at, created_at, "
            "updated_at) SELECT 'run_busy' || i, 'wf', 1, '{}', 'waiting', 2, runifold_now() + 3600, 0, 0 "
            "FROM generate_series(1, 150) AS i")
        # 150 runs move through due times in the past, as claims and renewals move them: their dead rows sit
        # on under 2 % of the table's pages, where VACUUM by default leaves the indexes as they are
        for k in range(20):
            await conn.execute("UPDATE runifold_runs SET due_at = runifold_now() - 1000 + $1 "
                               "WHERE run_id LIKE 'run_busy%'", k)
        await conn.execute("UPDATE runifold_runs SET due_at = runifold_now() + 3600 WHERE run_id LIKE 'run_busy%'")
        await conn.execute("VACUUM runifold_runs")
        plan = msgspec.json.decode(await conn.fetchval(  # nothing is due: the claim takes no run
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {Q['claim']}", *CLAIM_ARGS))
        options = await conn.fetchval("SELECT reloptions FROM pg_class WHERE relname = 'runifold_runs'")
    finally:
        await conn.close()
    scan = next(n for n in _plan_nodes(plan[0]["Plan"]) if n.get("Index Name") == "runifold_runs_due")
    # with its 3,000 dead entries left in place the scan reads over 200 pages (index and heap); a clean one, a few
    assert scan["Actual Rows"] == 0 and scan["Shared Hit Blocks"] + scan["Shared Read Blocks"] <= 8, scan
    assert {"autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_threshold=1000"} <= set(options), options


async def test_postgres_claim_whose_caller_went_away_is_handed_back(open_store: Any) -> None:
    """A caller cancelled while its claim is in flight: the run it got is released, ready for the next claim."""
    store = await open_store()
    await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="gone"))
    caller = asyncio.create_task(store.claim("w", {"wf"}, 30.0))
    while store._claims._sender is None or store._claims._queue:
        await asyncio.sleep(0)  # until the claim has left
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    for _ in range(500):
        info = await store.get_run("gone")
        if info.lease_token == 1 and info.status is RunStatus.READY:
            break
        await asyncio.sleep(0.01)
    assert info.status is RunStatus.READY and info.lease_owner is None and info.lease_token == 1
    again = await store.claim("w2", {"wf"}, 30.0)
    assert again is not None and again.checkpoint_id == "gone" and [e.type for e in again.history] == ["run_started"]


async def test_postgres_a_retried_claim_gets_the_run_its_first_attempt_leased(open_store: Any) -> None:
    """The claim statement run twice with one nonce (a retry after a lost answer) leases one run, not two."""
    from runifold.stores.postgres import Q

    store = await open_store()
    for i in range(2):
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id=f"c{i}"))
    rows = [await store._call(lambda conn: conn.fetchrow(Q["claim"], *CLAIM_ARGS)) for _ in range(2)]
    assert rows[0]["run_id"] == rows[1]["run_id"] and rows[0]["lease_token"] == rows[1]["lease_token"]
    assert await store.count_runs(status=RunStatus.RUNNING) == 1


async def test_postgres_a_retried_enqueue_creates_one_run(open_store: Any) -> None:
    """The enqueue function run twice with the same run id and no checkpoint id creates one run, reported created."""
    from runifold.stores.postgres import Q

    store = await open_store()
    args = (["run_0123456789ab0123456789ab"], [None], ["wf"], [1], ["{}"], ["run_started"], [""],
            ['{"type":"run_started","name":"wf","version":1,"input":{}}'], [None], [None], [None])
    first = await store._call(lambda conn: conn.fetch(Q["enqueue"], *args))
    again = await store._call(lambda conn: conn.fetch(Q["enqueue"], *args))
    assert [tuple(r) for r in first] == [tuple(r) for r in again] == [("run_0123456789ab0123456789ab", True)]
    assert await store.count_runs() == 1


async def test_postgres_a_retried_commit_recognises_its_own_write(open_store: Any) -> None:
    """The commit function run twice with the same arguments (a lost answer) succeeds twice and writes once."""
    from runifold.stores._protocol import transition_columns
    from runifold.stores.postgres import Q, _commit_arrays, _CommitAsk

    store = await open_store()
    await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
    claim = await store.claim("w", {"wf"}, 30.0)

    async def send(expected: int, rows: list[Any], transition: Any) -> Any:
        args = _commit_arrays([_CommitAsk(claim.lease, expected, rows, transition_columns(transition), [])])
        return await store._call(lambda conn: conn.fetchrow(Q["commit"], *args))

    first = await send(1, [step_row("a#1", 1)], Continue())
    again = await send(1, [step_row("a#1", 1)], Continue())
    assert first["ok"] and again["ok"] and first["new_revision"] == again["new_revision"] == 2
    assert [e.key for e in await store.history("c1")] == ["", "a#1"]
    # the same for a final commit with no event: recognised by the transition it applied
    assert [(await send(2, [], Finish(RunStatus.COMPLETED)))["ok"] for _ in range(2)] == [True, True]
    # a different commit at that revision is still refused
    refused = await send(2, [step_row("b#1", 2)], Finish(RunStatus.COMPLETED))
    assert not refused["ok"] and "lease" in refused["detail"]
    assert not (await send(1, [step_row("a#1", 99)], Continue()))["ok"]


async def test_postgres_claims_from_many_connections_never_exceed_a_limit(open_store: Any) -> None:
    """Six store handles (six pools) claiming at once, round after round: never more than the limit's runs of a key hold a lease."""
    import asyncpg

    handles = [await open_store() for _ in range(6)]
    await handles[0].enqueue_many(
        [WorkflowTask("wf", 1, {"i": i}, concurrency_key="pay", concurrency_limit=3) for i in range(40)]
        + [WorkflowTask("wf", 1, {"u": i}) for i in range(20)])
    conn = await asyncpg.connect(handles[0].dsn)
    per_round: list[int] = []
    try:
        while await handles[0].count_runs(status=RunStatus.COMPLETED) < 60:
            claims = await asyncio.gather(*(h.claim(f"w{i}", {"wf"}, 30.0) for i, h in enumerate(handles)
                                            for _ in range(3)))
            running = await conn.fetchval(
                "SELECT count(*) FROM runifold_runs WHERE concurrency_key = 'pay' AND status = 'running' "
                "AND lease_until > runifold_now()")
            per_round.append(running)
            assert running <= 3, per_round
            got = [c for c in claims if c is not None]
            assert got, "a round claimed nothing while runs were due"
            for claim in got:
                await handles[0].commit(claim.lease, claim.history[-1].seq, [], Finish(RunStatus.COMPLETED))
    finally:
        await conn.close()
    print(f"runs of the key running after each round of 18 concurrent claims: {per_round}")
    assert max(per_round) == 3


async def test_postgres_a_batch_of_claims_counts_the_runs_it_took(open_store: Any) -> None:
    """One claim statement for several claims that passes over a run and takes the next of the same key stops at the limit."""
    from runifold.stores.postgres import Q

    store = await open_store()
    for i in range(6):
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id=f"k{i}", concurrency_key="pay", concurrency_limit=2))
    await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="u0"))
    rows = await store._call(lambda conn: conn.fetch(Q["claim"], "w", ["wf"], [], 30.0, "batch", 3))
    # k0 and k1 fill the key; k2 is passed over and replaced by the next due run that may run: u0, not k3
    assert sorted(r["checkpoint_id"] for r in rows) == ["k0", "k1", "u0"]
    assert await store.count_runs(status=RunStatus.RUNNING) == 3


async def test_postgres_a_mistake_in_a_statement_is_reported_at_once_not_retried(open_store: Any) -> None:
    """A statement the driver refuses (a wrong count of arguments) is the statement's error, not an outage:
    it is raised at once as a StoreError naming it, while the pool keeps working."""
    from runifold.errors import StoreError, StoreUnavailableError

    store = await open_store()
    with pytest.raises(StoreError, match="expects 1 argument") as caught:
        await store._call(lambda conn: conn.fetchval("SELECT $1::int", 1, 2), budget=30.0)
    assert not isinstance(caught.value, StoreUnavailableError)  # what a retried error ends in
    assert await store._call(lambda conn: conn.fetchval("SELECT 1")) == 1


async def test_a_database_that_refuses_connections_is_unreachable_until_it_takes_them_again(open_store: Any) -> None:
    """helper-90: with the database closed to connections (ALTER DATABASE ... ALLOW_CONNECTIONS false, as for
    maintenance), a call raised a bare StoreError (55000) at once; it is an outage like any other: retried within
    the budget, then StoreUnavailableError, and the store works again once the database takes connections."""
    import os

    import asyncpg

    from runifold.errors import StoreError, StoreUnavailableError
    from runifold.stores.postgres import PostgresWorkflowStore
    from tests.conftest import empty_postgres_database

    dsn = (await open_store()).dsn
    name = f"runifold_outage_{os.getpid()}"
    async with empty_postgres_database(dsn, name) as url:
        store = await PostgresWorkflowStore.open(url, retry_seconds=1.0)
        admin = await asyncpg.connect(dsn)
        try:
            await admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
            with pytest.raises(StoreUnavailableError, match="stayed unreachable for 1 s"):
                await store.now()
            await admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
            assert await store.now() > 0
            # an invalid database (what an interrupted DROP DATABASE leaves) refuses with 55000 too, and stays so:
            # an error at once, not an outage waited out (helper-92)
            await admin.execute("UPDATE pg_database SET datconnlimit = -2 WHERE datname = $1", name)
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
            with pytest.raises(StoreError, match="invalid database") as caught:
                await store.now()
            assert not isinstance(caught.value, StoreUnavailableError)
            await admin.execute("UPDATE pg_database SET datconnlimit = -1 WHERE datname = $1", name)
        finally:
            await admin.execute("UPDATE pg_database SET datconnlimit = -1 WHERE datname = $1", name)
            await admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
            await admin.close()
            await store.close()


async def test_postgres_read_only_open_never_creates_or_migrates_and_refuses_writes(
    open_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``readonly=True`` (what the commands that only read use) needs the schema at this version, creates
    nothing, and turns every write into a StoreError that says so; reads work."""
    import os

    import asyncpg

    from runifold.errors import StoreError
    from runifold.stores import open_store as open_url
    from tests.conftest import empty_postgres_database
    from runifold.stores import postgres

    store = await open_store()
    run = (await store.enqueue(WorkflowTask("wf", 1, {"x": 1}))).run_id
    dsn = store.dsn
    reader = await open_url(dsn, readonly=True)
    try:
        assert (await reader.get_run(run)).name == "wf"
        assert [e.key for e in await reader.history(run)] == [""]
        with pytest.raises(StoreError, match="opened read-only"):
            await reader.enqueue(WorkflowTask("wf", 1, {}))
    finally:
        await reader.close()
    assert await store.count_runs() == 1
    # a session the server keeps read-only: the error names that too, not only readonly=True (helper-41)
    forced = await open_url(dsn + ("&" if "?" in dsn else "?") + "options=-c%20default_transaction_read_only%3Don",
                            readonly=True)
    try:
        with pytest.raises(StoreError, match="or the server, database or role sets default_transaction_read_only"):
            await forced.enqueue(WorkflowTask("wf", 1, {}))
    finally:
        await forced.close()

    # an empty database: refused, and left empty; a schema behind this runifold's: refused, left as it is
    async with empty_postgres_database(dsn, f"runifold_readonly_{os.getpid()}") as empty:
        with pytest.raises(StoreError, match="has no runifold schema.*runifold migrate"):
            await open_url(empty, readonly=True)
        probe = await asyncpg.connect(empty)
        assert await probe.fetchval("SELECT to_regclass('runifold_schema')") is None
        await (await postgres.PostgresWorkflowStore.open(empty)).close()
        behind = await probe.fetchval("SELECT max(version) FROM runifold_schema")
        monkeypatch.setattr(postgres, "SCHEMA_VERSION", behind + 1)  # as a newer runifold would see it
        with pytest.raises(StoreError, match=f"version {behind}, older.*runifold migrate"):
            await open_url(empty, readonly=True)
        assert await probe.fetchval("SELECT max(version) FROM runifold_schema") == behind
        # a schema ahead of this runifold's (a newer one migrated it): refused, writable or read-only
        monkeypatch.setattr(postgres, "SCHEMA_VERSION", behind - 1)
        for readonly in (False, True):
            with pytest.raises(StoreError, match=f"version {behind}, newer"):
                await open_url(empty, readonly=readonly)
        await probe.close()


async def test_a_role_that_may_only_read_gets_an_error_that_says_so(open_store: Any) -> None:
    """With a SELECT-only role, reads work and a write is refused with what to do (a role that may write)."""
    import os

    import asyncpg

    from runifold.errors import StoreError
    from runifold.stores import open_store as open_url

    store = await open_store()
    await store.enqueue(WorkflowTask("wf", 1, {"x": 1}, checkpoint_id="r1"))
    role = f"runifold_reader_{os.getpid()}"
    admin = await asyncpg.connect(store.dsn)
    await admin.execute(f"DROP ROLE IF EXISTS {role}")
    await admin.execute(f"CREATE ROLE {role} LOGIN")
    await admin.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
    await admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    scheme, rest = store.dsn.split("://", 1)
    as_reader = f"{scheme}://{role}@{rest.split('@', 1)[1]}"
    try:
        reader = await open_url(as_reader, readonly=True)
        try:
            assert (await reader.get_run("r1")).name == "wf"
        finally:
            await reader.close()
        with pytest.raises(StoreError, match="42501.*needs a role that may write the runifold tables"):
            writer = await open_url(as_reader)
            try:
                await writer.enqueue(WorkflowTask("wf", 1, {"x": 2}))
            finally:
                await writer.close()
    finally:
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE {role}")
        await admin.close()


async def test_postgres_schema_is_made_again_after_its_tables_were_dropped(open_store: Any) -> None:
    """Dropping the runifold tables by hand (a reset) left the functions, and the next open failed with
    `PostgreSQL error 42723: function "runifold_now" already exists` (helper-41): the baseline now replaces them."""
    import asyncpg

    from runifold.stores import open_store as open_url

    store = await open_store()
    dsn = store.dsn
    conn = await asyncpg.connect(dsn)
    try:
        tables = [r["tablename"] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'runifold%'")]
        assert "runifold_runs" in tables and "runifold_schema" in tables
        await conn.execute(f"DROP TABLE {', '.join(tables)} CASCADE")
    finally:
        await conn.close()
    again = await open_url(dsn)
    try:
        run_id = (await again.enqueue(WorkflowTask("wf", 1, {}))).run_id
        assert (await again.get_run(run_id)).status is RunStatus.READY
    finally:
        await again.close()


async def test_postgres_a_claim_whose_answer_came_late_is_renewed_before_anything_runs(open_store: Any) -> None:
    """A claim's lease counts from when the claim was sent: one whose answer arrived after its lease ran out
    (a slow network, a frozen worker) starts no body. It counted from the answer, so the worker ran the step
    without renewing, while another worker could hold the run (found by helper-44 through a delaying proxy)."""
    from runifold import LeaseLost, WorkflowContext, WorkflowDefinition, step, workflow
    from tests.support import worker

    ran: list[str] = []

    @step()
    async def charge(order: str) -> str:
        ran.append(order)
        return order

    @workflow("late-claim")
    async def late_claim(ctx: WorkflowContext, order: str) -> str:
        return await charge(order)

    store = await open_store()
    await store.enqueue(WorkflowTask("late-claim", 1, {"order": "o1"}))
    real_call, delayed = store._call, [False]

    async def answer_late(op: Any, **kwargs: Any) -> Any:
        value = await real_call(op, **kwargs)
        if not delayed[0]:
            delayed[0] = True  # the claim, the first statement of run_once: its answer comes 1.2 s late
            await asyncio.sleep(1.2)
        return value

    store._call = answer_late
    outcome = await worker(store, WorkflowDefinition(late_claim), lease=0.9).run_once()
    assert delayed[0] and isinstance(outcome, LeaseLost), outcome
    assert ran == []  # refused at the renewal before the run started


async def test_a_database_at_the_baseline_is_migrated_and_keeps_its_runs(open_store: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A database made by a runifold at schema version 1 (the baseline alone) is migrated on open to this
    runifold's version, once; its runs and signals are kept, and delivery follows the migrated functions."""
    import os

    import asyncpg

    from runifold import SignalConflictError
    from runifold.stores import SignalDelivery, _sql, postgres
    from tests.conftest import empty_postgres_database

    baseline = _sql.migrations("postgres")[:1]
    dsn = (await open_store()).dsn
    async with empty_postgres_database(dsn, f"runifold_upgrade_{os.getpid()}") as url:
        with monkeypatch.context() as old:
            old.setattr(postgres, "migrations", lambda dialect: baseline)
            old.setattr(postgres, "SCHEMA_VERSION", 1)
            first = await postgres.PostgresWorkflowStore.open(url)
            run_id = (await first.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="u1"))).run_id
            await first.close()
        conn = await asyncpg.connect(url)  # a delivery as the baseline's function made it
        await conn.fetch("SELECT * FROM runifold_deliver($1, 'u1', 's1', 'go', '1', 'sha256:a', 'alice', 'k', 'r', 10)",
                         run_id)
        await conn.close()
        for _ in range(2):
            store = await postgres.PostgresWorkflowStore.open(url)
            try:
                assert await store.migrate() == postgres.SCHEMA_VERSION > 1
                assert (await store.get_run("u1")).run_id == run_id
                assert [s.signal_id for s in await store.inbox(run_id)] == ["s1"]
            finally:
                await store.close()
        store = await postgres.PostgresWorkflowStore.open(url)
        try:
            with pytest.raises(SignalConflictError):
                await store.deliver_signal(SignalDelivery("u1", run_id, "s1", "go", 2, "alice", "k", "r", "sha256:b"))
            assert (await store.audit("u1"))[-1].detail == "the signal id names another signal (it differs in: payload)"
        finally:
            await store.close()
        # a process of the previous runifold still running delivers with the baseline's form (a rolling upgrade)
        conn = await asyncpg.connect(url)
        row = await conn.fetchrow(
            "SELECT * FROM runifold_deliver($1, 'u1', 's2', 'go', '2', 'sha256:c', 'alice', 'k', 'r', 10)", run_id)
        # and cancels with the form before version 4 (helper-99: version 4 dropped it, and an old `runifold cancel`
        # raised "function runifold_intervene(...) does not exist")
        cancelled = await conn.fetchrow(
            "SELECT * FROM runifold_intervene('checkpoint_id', 'u1', ARRAY['ready'], ARRAY['run_cancelled'], "
            "ARRAY[''], ARRAY['{\"type\":\"run_cancelled\",\"by\":\"ops\",\"reason\":\"old\"}'], 'cancelled', 'old')")
        await conn.close()
        assert row["verdict"] == "accepted"
        assert (cancelled["run_id"], cancelled["status"], cancelled["new_revision"]) == (run_id, "ready", 2)


async def test_postgres_a_childs_end_wakes_a_parent_whose_suspending_commit_is_in_flight(open_store: Any) -> None:
    """The parent's commit that suspends it on its child has read its inbox and is not yet committed when the child
    finishes: the child's commit waits for it and then wakes the parent. It found the parent still running and
    posted its end unseen, and the parent waited for ever (helper-79: 2 of 60 fan-outs on two worker processes)."""
    import asyncpg

    from runifold.history import RunCompleted
    from runifold.stores import EventRow, Suspend
    from runifold.stores._protocol import transition_columns
    from runifold.stores.postgres import Q, _commit_arrays, _CommitAsk
    from tests.conftest import require_postgres

    store = await open_store()
    await store.enqueue(WorkflowTask("parent", 1, {}, checkpoint_id="p1"))
    parent = await store.claim("w", {"parent"}, 30.0)
    await store.enqueue(WorkflowTask("kid", 1, {}, checkpoint_id="k1", parent_run_id=parent.run_id))
    kid = await store.claim("w", {"kid"}, 30.0)
    suspend = Suspend(RunStatus.WAITING, None, (f"child:{kid.run_id}",), f"child run {kid.run_id} to finish")
    suspending = await asyncpg.connect(require_postgres())
    try:
        transaction = suspending.transaction()
        await transaction.start()
        args = _commit_arrays([_CommitAsk(parent.lease, 1, [], transition_columns(suspend), [])])
        assert (await suspending.fetchrow(Q["commit"], *args))["ok"]  # its inbox read: nothing there yet
        finishing = asyncio.ensure_future(
            store.commit(kid.lease, 1, [EventRow.of(RunCompleted(output="done"))], Finish(RunStatus.COMPLETED)))
        await asyncio.sleep(0.5)
        assert not finishing.done()  # the child's commit waits for the parent's
        await transaction.commit()
        await finishing
    finally:
        await suspending.close()
    waiting = await store.get_run("p1")
    assert waiting.status is RunStatus.WAITING and waiting.due_at is not None, waiting  # woken: due now
    again = await store.claim("w", {"parent"}, 30.0)
    assert again is not None and again.run_id == parent.run_id and [s.name for s in again.inbox] == [f"child:{kid.run_id}"]
