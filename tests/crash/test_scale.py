"""Many worker processes on one store, lease races, and a dropped LISTEN connection."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from runifold import (
    LeaseDuration,
    LeaseLostError,
    RunStatus,
    Supervisor,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
    open_store,
    step,
    workflow,
)
from runifold.stores import Continue
from runifold.stores.postgres import PostgresWorkflowStore
from runifold.testing._conformance import step_row
from tests.conftest import require_postgres, reset_postgres
from tests.crash.conftest import ROOT, CrashEnv
from tests.stores.test_waits import APPROVAL, envelope, gateway


def workers(env: CrashEnv, count: int, app: str = "tests.crash.load_app:registry") -> list[subprocess.Popen[str]]:
    env.uses(app)
    return [subprocess.Popen(
        [sys.executable, "-m", "runifold.cli", "--store", env.url, "--app", app, "worker", "--lease", "10",
         "--concurrency", "8", "--idle-wait", "0.2", "--worker-id", f"load-{i}"],
        cwd=ROOT, env=env.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    ) for i in range(count)]


async def run_load(env: CrashEnv, runs: int, processes: int) -> tuple[list[str], Counter[tuple[str, str]]]:
    store = await open_store(env.url)
    try:
        for i in range(runs):
            await store.enqueue(WorkflowTask("five-steps", 1, {"checkpoint": f"r{i}"}, checkpoint_id=f"r{i}"))
        procs = workers(env, processes)
        deadline = time.monotonic() + 600
        try:
            while len(await store.list_runs(status=RunStatus.COMPLETED, limit=runs)) < runs:
                assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
                await asyncio.sleep(0.2)
        finally:
            errors = []
            for p in procs:
                p.send_signal(signal.SIGTERM)
                errors.append(p.communicate(timeout=60)[1])
        for i in range(runs):
            keys = [e.key for e in await store.history(f"r{i}") if e.type == "step_completed"]
            assert keys == [f"work#{n}" for n in range(1, 6)], (i, keys)
    finally:
        await store.close()
    lines = (Path(env.tmp) / "counts").read_text().splitlines()
    return errors, Counter((line.split()[0], line.split()[1]) for line in lines)


@pytest.mark.parametrize("crash_env", ["postgres"], indirect=True)
async def test_four_processes_five_hundred_runs(crash_env: CrashEnv) -> None:
    """4 worker processes share 500 five-step runs on PostgreSQL: every run completes, every step completes and runs exactly once."""
    errors, executions = await run_load(crash_env, 500, 4)
    assert len(executions) == 2500 and set(executions.values()) == {1}
    assert not any("Error" in e for e in errors), errors


@pytest.mark.parametrize("crash_env", ["sqlite"], indirect=True)
async def test_sqlite_under_several_processes(crash_env: CrashEnv) -> None:
    """Several worker processes on one SQLite file (WAL): all runs complete and no 'database is locked' reaches anyone."""
    errors, executions = await run_load(crash_env, 200, 4)
    assert len(executions) == 1000 and set(executions.values()) == {1}
    assert not any("locked" in e or "Unavailable" in e for e in errors), errors


async def test_expired_lease_race_a_thousand_times(crash_env: CrashEnv) -> None:
    """1,000 races between a holder whose short lease expires and a taker: never two commits of one step, fenced commits change nothing."""
    store = await open_store(crash_env.url)
    rng = random.Random(7)
    fenced = both = 0
    try:
        for i in range(1000):
            ref, name = f"race{i}", f"wf{i}"  # one name per race, so each claim can only see this run
            await store.enqueue(WorkflowTask(name, 1, {}, checkpoint_id=ref))
            a = await store.claim("holder", {name}, 0.01)
            assert a is not None
            await asyncio.sleep(rng.uniform(0.0, 0.02))

            async def holder_commits() -> bool:
                try:
                    await store.commit(a.lease, 1, [step_row("s#1", "holder")], Continue())
                    return True
                except LeaseLostError:
                    return False

            async def taker_commits() -> bool:
                b = await store.claim("taker", {name}, 30.0)
                if b is None or any(e.key == "s#1" for e in b.history):
                    return False
                try:
                    await store.commit(b.lease, b.history[-1].seq, [step_row("s#1", "taker")], Continue())
                    return True
                except LeaseLostError:
                    return False

            before = await store.history(ref)
            results = await asyncio.gather(holder_commits(), taker_commits())
            history = await store.history(ref)
            assert [e.key for e in history].count("s#1") == sum(results) <= 1, (i, results)
            assert [e.seq for e in history] == list(range(1, len(history) + 1))
            if not results[0]:
                fenced += 1
                assert history[: len(before)] == before
            both += all(results)
        print(f"1000 races: holder fenced off {fenced} times, double commits {both}")
        assert both == 0 and fenced > 0
    finally:
        await store.close()


async def test_killed_listener_falls_back_to_polling() -> None:
    """With its LISTEN connection killed, an idle worker still picks up a signal after the fallback interval and re-listens."""
    dsn = require_postgres()
    await reset_postgres(dsn)
    worker_store = await PostgresWorkflowStore.open(dsn, poll_seconds=1.0)
    sender = await open_store(dsn)
    try:
        w = WorkflowWorker(worker_store, WorkflowRegistry(APPROVAL), WorkerId.parse("listener"),
                           LeaseDuration(timedelta(seconds=10)), timedelta(seconds=3))
        await sender.enqueue(WorkflowTask("approval", 1, {"order_id": "o1"}, checkpoint_id="o1"))
        supervisor = Supervisor(w, 2, idle_wait=timedelta(seconds=30))
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        deadline = time.monotonic() + 30
        while (await sender.get_run("o1")).status is not RunStatus.WAITING:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        while worker_store.listener is None:
            await asyncio.sleep(0.05)
        listener = worker_store.listener
        import asyncpg  # type: ignore[import-untyped]

        admin = await asyncpg.connect(dsn)
        await admin.execute("SELECT pg_terminate_backend($1)", listener.get_server_pid())
        await admin.close()
        sent_at = time.monotonic()
        await gateway(sender).send(envelope("o1", "after-kill", await sender.now()))
        while (await sender.get_run("o1")).status is not RunStatus.COMPLETED:
            assert time.monotonic() - sent_at < 15, "the signal was not picked up after the listener died"
            await asyncio.sleep(0.05)
        picked_up = time.monotonic() - sent_at
        relistening = worker_store.listener
        assert relistening is not None and relistening is not listener and not relistening.is_closed()
        print(f"signal picked up {picked_up:.2f} s after sending, with the listener killed (fallback poll 1 s)")
        supervisor.stop()
        await running
        assert supervisor.outcomes.get("Completed") == 1
    finally:
        await worker_store.close()
        await sender.close()


_hold = {"gate": asyncio.Event()}


@step()
async def held() -> int:
    await _hold["gate"].wait()
    return 1


@workflow("held-sleeper")
async def held_sleeper(ctx: WorkflowContext) -> str:
    await held()
    await ctx.sleep(timedelta(seconds=0.5))
    return "woke"


async def test_new_timers_wake_idle_workers_without_polling() -> None:
    """A timer committed by another worker while a supervisor sleeps wakes it at the timer's due time, not at its 60 s poll."""
    dsn = require_postgres()
    await reset_postgres(dsn)
    _hold["gate"] = asyncio.Event()
    idle_store = await PostgresWorkflowStore.open(dsn, poll_seconds=60.0)
    other = await open_store(dsn)
    registry = WorkflowRegistry(WorkflowDefinition(held_sleeper))
    try:
        await other.enqueue(WorkflowTask("held-sleeper", 1, {}, checkpoint_id="t1"))
        first = WorkflowWorker(other, registry, WorkerId.parse("first"), LeaseDuration(timedelta(seconds=30)),
                               timedelta(seconds=10))
        holding = asyncio.create_task(first.run_once())
        while (await other.get_run("t1")).status is not RunStatus.RUNNING:
            await asyncio.sleep(0.01)
        idle = WorkflowWorker(idle_store, registry, WorkerId.parse("idle"), LeaseDuration(timedelta(seconds=30)),
                              timedelta(seconds=10))
        supervisor = Supervisor(idle, 2, idle_wait=timedelta(seconds=60))
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        await asyncio.sleep(0.3)  # the supervisor sleeps until t1's lease expiry, 30 s away
        _hold["gate"].set()  # the other worker now commits the step and a 0.5 s timer
        assert type(await holding).__name__ == "Suspended"
        started = time.monotonic()
        while (await other.get_run("t1")).status is not RunStatus.COMPLETED:
            assert time.monotonic() - started < 10, "the idle supervisor overslept a timer it was not told of"
            await asyncio.sleep(0.05)
        supervisor.stop()
        await running
    finally:
        await idle_store.close()
        await other.close()


async def test_killed_store_connection_loses_no_step() -> None:
    """The store's connections are killed again and again under load: every run completes, every step body runs once."""
    import asyncpg  # type: ignore[import-untyped]

    from runifold.stores._pg_pool import APPLICATION as application
    from tests.crash import load_app

    dsn = require_postgres()
    await reset_postgres(dsn)
    store = await PostgresWorkflowStore.open(dsn)
    admin = await asyncpg.connect(dsn)
    counts = Path(tempfile.mkdtemp(prefix="runifold-kill-commits-")) / "counts"
    os.environ["RUNIFOLD_TEST_COUNTS"] = str(counts)
    runs, killed = 100, 0
    try:
        for i in range(runs):
            await store.enqueue(WorkflowTask("five-steps", 1, {"checkpoint": f"k{i}"}, checkpoint_id=f"k{i}"))
        w = WorkflowWorker(store, load_app.registry, WorkerId.parse("killed-commits"),
                           LeaseDuration(timedelta(seconds=2)), timedelta(seconds=0.6))
        supervisor = Supervisor(w, 8, idle_wait=timedelta(seconds=0.1))
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        deadline = time.monotonic() + 120
        while len(await store.list_runs(status=RunStatus.COMPLETED, limit=runs)) < runs:
            assert time.monotonic() < deadline, f"runs did not complete after the {application} connection was killed"
            assert await store.list_runs(status=RunStatus.FAILED) == [], "a lost connection failed a run"
            if killed < 10:
                killed += await admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                    application)
            await asyncio.sleep(0.03)
        supervisor.stop()
        await running
        for i in range(runs):
            keys = [e.key for e in await store.history(f"k{i}") if e.type == "step_completed"]
            assert keys == [f"work#{n}" for n in range(1, 6)], (i, keys)
        executions = Counter(tuple(line.split()[:2]) for line in counts.read_text().splitlines())
        print(f"{application} connection killed {killed} times; {len(executions)} step bodies, each run once")
        assert killed >= 3 and len(executions) == runs * 5 and set(executions.values()) == {1}
    finally:
        os.environ.pop("RUNIFOLD_TEST_COUNTS", None)
        await admin.close()
        await store.close()
