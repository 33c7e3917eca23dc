"""The SQLite store's two write paths: in the caller's thread when alone, grouped in the writer thread otherwise."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from runifold import RunStatus, StoreError, WorkflowTask
from runifold.stores import Continue, Finish, Lease
from runifold.stores.sqlite import SqliteWorkflowStore
from runifold.testing._conformance import step_row


async def _open(tmp_path: Path, **options: Any) -> SqliteWorkflowStore:
    return await SqliteWorkflowStore.open(str(tmp_path / "runifold.db"), **options)


async def _leases(store: SqliteWorkflowStore, prefix: str, count: int) -> list[Lease]:
    """Enqueue and claim ``count`` runs named ``prefix0``.. and return their leases."""
    leases = []
    for i in range(count):
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id=f"{prefix}{i}"))
        claim = await store.claim("w", {"wf"}, 30.0)
        assert claim is not None
        leases.append(claim.lease)
    return leases


async def test_a_lone_run_writes_in_the_callers_thread(tmp_path: Path) -> None:
    """One lease: the claim and every step commit run directly, each its own durable transaction."""
    store = await _open(tmp_path)
    try:
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="alone"))
        before = store.direct
        claim = await store.claim("w", {"wf"}, 30.0)
        assert claim is not None
        revision = 1
        for i in range(3):
            revision = (await store.commit(claim.lease, revision, [step_row(f"s#{i}", i)], Continue())).revision
        await store.commit(claim.lease, revision, [step_row("end", None)], Finish(RunStatus.COMPLETED))
        assert store.direct - before == 5  # the claim and four commits
    finally:
        await store.close()
    reopened = await _open(tmp_path)  # on disk, read by a fresh connection
    try:
        info = await reopened.get_run("alone")
        assert info.status is RunStatus.COMPLETED and info.revision == 5
        assert [e.key for e in await reopened.history("alone")][1:] == ["s#0", "s#1", "s#2", "end"]
    finally:
        await reopened.close()


async def test_a_lone_run_whose_steps_block_the_loop_lets_it_run_at_each_commit(tmp_path: Path) -> None:
    """helper-98: async steps that block the event loop (time.sleep in an async def) between direct commits gave
    the loop a pass only every eighth commit, so a worker's SIGTERM handler ran seconds late (its grace went by
    before it began) and other tasks starved. A direct write after the loop was held up yields to it first."""
    store = await _open(tmp_path)
    passes = 0

    async def count_passes() -> None:
        nonlocal passes
        while True:
            await asyncio.sleep(0)
            passes += 1

    try:
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="blocked"))
        claim = await store.claim("w", {"wf"}, 30.0)
        assert claim is not None
        counter = asyncio.ensure_future(count_passes())
        await asyncio.sleep(0)
        revision, start = 1, passes
        for i in range(6):
            time.sleep(0.05)  # a step that blocks the loop
            revision = (await store.commit(claim.lease, revision, [step_row(f"s#{i}", i)], Continue())).revision
        assert passes - start >= 6, (passes, start)
        assert store.direct >= 7  # direct writes still (the claim and six commits)
        counter.cancel()
    finally:
        await store.close()


async def test_direct_writes_can_be_turned_off(tmp_path: Path) -> None:
    """direct_writes=False: every write goes through the writer thread."""
    store = await _open(tmp_path, direct_writes=False)
    try:
        await store.enqueue(WorkflowTask("wf", 1, {}))
        claim = await store.claim("w", {"wf"}, 30.0)
        assert claim is not None
        await store.commit(claim.lease, 1, [step_row("s", 1)], Continue())
        assert store.direct == 0 and store.operations >= 3
    finally:
        await store.close()


async def test_concurrent_runs_share_transactions(tmp_path: Path) -> None:
    """Six leases: their commits go to the writer thread and share fsyncs; each lands."""
    store = await _open(tmp_path)
    try:
        leases = await _leases(store, "c", 6)
        direct, transactions = store.direct, store.transactions
        results = await asyncio.gather(*(store.commit(lease, 1, [step_row("s", i)], Continue())
                                         for i, lease in enumerate(leases)))
        assert [r.revision for r in results] == [2] * 6
        assert store.direct == direct  # never in the caller: another run could share the fsync
        assert store.transactions - transactions < 6, "the writer thread committed each one alone"
        for i in range(6):
            assert (await store.get_run(f"c{i}")).revision == 2
    finally:
        await store.close()


async def test_a_lock_held_elsewhere_never_blocks_the_event_loop(tmp_path: Path) -> None:
    """Alone, but another connection holds the write lock: the commit waits in the writer thread, the loop runs on."""
    store = await _open(tmp_path)
    other = sqlite3.connect(str(tmp_path / "runifold.db"), isolation_level=None)
    try:
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="locked"))
        claim = await store.claim("w", {"wf"}, 30.0)
        assert claim is not None
        direct = store.direct
        other.execute("BEGIN IMMEDIATE")
        commit = asyncio.create_task(store.commit(claim.lease, 1, [step_row("s", 1)], Continue()))
        loop = asyncio.get_running_loop()
        gaps, last = [], loop.time()
        for _ in range(20):  # 0.2 s with the lock held
            await asyncio.sleep(0.01)
            gaps.append(loop.time() - last)
            last = loop.time()
        assert not commit.done()
        other.execute("COMMIT")
        result = await asyncio.wait_for(commit, 10)
        assert result.revision == 2
        # a write waiting on the lock in the loop's thread would stall it for the 5 s busy timeout
        assert max(gaps) < 1.0, gaps
        assert store.direct == direct  # it went to the writer thread
        assert (await store.get_run("locked")).revision == 2
    finally:
        other.close()
        await store.close()


async def test_a_failing_write_fails_alone_and_its_group_lands(tmp_path: Path) -> None:
    """Writes queued together share a transaction; one that SQLite refuses is retried alone and fails alone."""
    store = await _open(tmp_path, direct_writes=False)
    try:
        leases = await _leases(store, "g", 3)

        def broken(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO no_such_table VALUES (1)")

        def half_done(conn: sqlite3.Connection) -> None:  # writes, then fails: its write must not land
            assert conn.execute("UPDATE runs SET reason = 'half done' WHERE checkpoint_id = 'g0'").rowcount == 1
            raise RuntimeError("gave up half way")

        busy = asyncio.ensure_future(store._write(lambda conn: time.sleep(0.2)))  # the writer thread is busy...
        await asyncio.sleep(0.05)
        results = await asyncio.gather(  # ...so these four queue up and are taken as one group
            *(store.commit(lease, 1, [step_row("s", i)], Continue()) for i, lease in enumerate(leases)),
            store._write(broken), store._write(half_done), return_exceptions=True)
        await busy
        assert [getattr(r, "revision", None) for r in results[:3]] == [2, 2, 2]
        assert isinstance(results[3], StoreError) and "no_such_table" in str(results[3])
        assert isinstance(results[4], RuntimeError)
        assert (await store.get_run("g0")).reason != "half done"
        for i in range(3):
            assert [e.key for e in await store.history(f"g{i}")] == ["", "s"]
    finally:
        await store.close()


@pytest.mark.parametrize("closes", [1, 2])
async def test_a_claim_cancelled_in_flight_as_the_store_closes_is_handed_back(tmp_path: Path, closes: int) -> None:
    """A claim whose caller was cancelled (a stopping worker) is released when it lands; if the store was being
    closed meanwhile, that release was queued behind the writer's end and never ran: the run stayed leased to
    nobody for a whole lease, and the writer counted a job in flight forever (helper-49). Closed twice at once,
    the second close must not close the connection under the first one's release (helper-50)."""
    store = await _open(tmp_path, direct_writes=False)
    await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="r"))
    writer = store._writer
    assert writer is not None
    batch = writer._batch

    def slow(conn: Any, jobs: Any) -> Any:
        time.sleep(0.3)  # the claim's transaction is still under way when the caller gives up and closes the store
        return batch(conn, jobs)

    writer._batch = slow
    claiming = asyncio.ensure_future(store.claim("w", {"wf"}, 30.0))
    await asyncio.sleep(0.1)
    claiming.cancel()
    await asyncio.gather(*(store.close() for _ in range(closes)))
    assert writer.in_flight == 0
    reopened = await _open(tmp_path)
    try:
        info = await reopened.get_run("r")
        assert info.status is RunStatus.READY and info.lease_owner is None, info
    finally:
        await reopened.close()
