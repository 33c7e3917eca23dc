"""A Supervisor's slots survive whatever a run or the store raises, and a second stop ends in-flight runs at once."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from runifold import (
    Budget,
    Failed,
    RetryPolicy,
    RunStatus,
    StoreUnavailableError,
    Supervisor,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowTask,
    step,
    workflow,
)
from runifold.stores.memory import MemoryWorkflowStore
from tests.support import worker


@workflow("self-referencing")
async def self_referencing(ctx: WorkflowContext) -> list[Any]:
    value: list[Any] = []
    value.append(value)  # cannot be encoded: serialising it never ends
    return value


@step()
async def add(n: int) -> int:
    return n + 1


@workflow("good")
async def good(ctx: WorkflowContext, n: int) -> int:
    return await add(n)


@step()
async def forever() -> None:
    await asyncio.sleep(3600)


@workflow("endless")
async def endless(ctx: WorkflowContext) -> None:
    await forever()


async def wait_status(store: Any, ref: str, status: RunStatus) -> None:
    while (await store.get_run(ref)).status is not status:
        await asyncio.sleep(0.01)


async def supervise_until(supervisor: Supervisor, store: Any, ref: str, status: RunStatus) -> None:
    """Run ``supervisor`` until run ``ref`` reaches ``status`` (at most 10 s), then stop it."""
    running = asyncio.create_task(supervisor.run(handle_signals=False))
    try:
        await asyncio.wait_for(wait_status(store, ref, status), 10)
    finally:
        supervisor.stop()
        await asyncio.wait_for(running, 10)


class _BuggyCommit:
    """A store whose first commit raises an exception that is not a runifold error (a bug in a driver, say)."""

    def __init__(self, store: MemoryWorkflowStore) -> None:
        self._store = store
        self.raised = False

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        if not self.raised:
            self.raised = True
            raise RuntimeError("a bug in the store driver")
        return await self._store.commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_slot_survives_an_exception_that_is_not_a_runifold_error(caplog: pytest.LogCaptureFixture) -> None:
    """A run whose execution raises a non-runifold exception is logged with its traceback and counted; the slot
    goes on. The run is not handed back: as after a crash its lease expires and a claim takes it over as a
    recovery, counted against its budget (handed back at once, a run failing this way every time was claimed
    again and again, its bodies run again uncounted: found by helper-17). Both runs complete."""
    store = MemoryWorkflowStore()
    first = await store.enqueue(WorkflowTask("good", 1, {"n": 1}, checkpoint_id="first"))
    await store.enqueue(WorkflowTask("good", 1, {"n": 2}, checkpoint_id="second"))
    supervisor = Supervisor(worker(_BuggyCommit(store), WorkflowDefinition(good), lease=0.6), 1,
                            idle_wait=timedelta(seconds=0.05))
    with caplog.at_level(logging.ERROR, logger="runifold"):
        # one slot: the runs complete only if the slot outlived the exception
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        try:
            for ref in ("first", "second"):
                await asyncio.wait_for(wait_status(store, ref, RunStatus.COMPLETED), 10)
        finally:
            supervisor.stop()
            await asyncio.wait_for(running, 10)
    assert supervisor.outcomes.get("UnexpectedError") == 1 and supervisor.outcomes.get("Completed") == 2
    assert (await store.get_run("first")).recoveries == 1 and (await store.get_run("second")).recoveries == 0
    record = next(r for r in caplog.records if getattr(r, "event", "") == "slot_unexpected_error")
    assert record.levelno == logging.ERROR and record.run_id == first.run_id  # type: ignore[attr-defined]
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


async def test_a_self_referencing_result_fails_its_run() -> None:
    """A result that refers to itself cannot be encoded: the run fails saying so, once (it is not run again)."""
    store = MemoryWorkflowStore()
    await store.enqueue(WorkflowTask("self-referencing", 1, {}, checkpoint_id="poison"))
    outcome = await worker(store, WorkflowDefinition(self_referencing)).run_once()
    assert isinstance(outcome, Failed) and "nested too deeply" in outcome.reason
    assert (await store.get_run("poison")).status is RunStatus.FAILED


class _FlakyClaims:
    """A store whose first claim fails as if the database were unreachable."""

    def __init__(self, store: MemoryWorkflowStore) -> None:
        self._store = store
        self.failed = False

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise StoreUnavailableError("database is down")
        return await self._store.claim(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_store_error_is_counted_and_the_slot_claims_again(caplog: pytest.LogCaptureFixture) -> None:
    """A runifold error from the store is logged at error, counted as Error, and the slot claims again after a pause."""
    store = MemoryWorkflowStore()
    await store.enqueue(WorkflowTask("good", 1, {"n": 1}, checkpoint_id="fine"))
    flaky = _FlakyClaims(store)
    supervisor = Supervisor(worker(flaky, WorkflowDefinition(good)), 1, idle_wait=timedelta(seconds=0.05))
    with caplog.at_level(logging.ERROR, logger="runifold"):
        await supervise_until(supervisor, store, "fine", RunStatus.COMPLETED)
    assert supervisor.outcomes.get("Error") == 1 and supervisor.outcomes.get("Completed") == 1
    assert [getattr(r, "event", "") for r in caplog.records] == ["slot_error"]


async def test_stop_now_cancels_in_flight_runs_and_releases_them() -> None:
    """After a graceful stop, stop(now=True) ends runs in flight at once (not after the grace) and releases their leases."""
    store = MemoryWorkflowStore()
    await store.enqueue(WorkflowTask("endless", 1, {}, checkpoint_id="e1"))
    supervisor = Supervisor(worker(store, WorkflowDefinition(endless), lease=600), 2,
                            idle_wait=timedelta(seconds=0.05), grace=timedelta(hours=1))
    running = asyncio.create_task(supervisor.run(handle_signals=False))
    await asyncio.wait_for(wait_status(store, "e1", RunStatus.RUNNING), 10)
    supervisor.stop()
    await asyncio.sleep(0.1)
    assert not running.done()  # the first stop waits for the run, up to the hour of grace
    supervisor.stop(now=True)
    await asyncio.wait_for(running, 10)
    run = await store.get_run("e1")
    assert run.status is RunStatus.READY and run.lease_owner is None


bodies: list[str] = []


@step(retry=RetryPolicy(max_attempts=2))
async def trips_the_engine() -> None:
    bodies.append("ran")
    raise ValueError("the body fails, and the engine trips over its retry policy")


# an engine bug, made on purpose: the step's policy is no RetryPolicy (the decorator refuses that; this bypasses it)
object.__setattr__(getattr(trips_the_engine, "__runifold_step__"), "retry", 3)


@workflow("trips")
async def trips(ctx: WorkflowContext) -> None:
    await trips_the_engine()


async def test_a_run_that_trips_the_engine_every_time_ends_with_its_recovery_budget() -> None:
    """Found by helper-17: an exception escaping the driver handed the run back, to be claimed again at once,
    its body run again each time and counted nowhere, without end. Now each is a crash: the lease expires, the
    takeover is a recovery, and the recovery budget ends the run."""
    bodies.clear()
    store = MemoryWorkflowStore()
    await store.enqueue(WorkflowTask("trips", 1, {}, checkpoint_id="t1"))
    definition = WorkflowDefinition(trips, Budget(max_recoveries=2))
    supervisor = Supervisor(worker(store, definition, lease=0.3), 1, idle_wait=timedelta(seconds=0.05))
    await supervise_until(supervisor, store, "t1", RunStatus.FAILED)
    info = await store.get_run("t1")
    assert "recoveries" in info.reason and info.recoveries == 3, info
    assert supervisor.outcomes.get("UnexpectedError") == 3 and len(bodies) == 3
