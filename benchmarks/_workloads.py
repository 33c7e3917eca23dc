"""The five benchmarks of issue 8, each returning rows of (benchmark, result, ratio to the raw limit)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import msgspec

from benchmarks import _claims, bench_app
from benchmarks._limits import Limits, machine_busy, measure
from runifold import (
    HmacKeyRing,
    LeaseDuration,
    RunStatus,
    SignalEnvelope,
    SignalGateway,
    Supervisor,
    WorkerId,
    WorkflowTask,
    WorkflowWorker,
    open_store,
    sign,
)
from runifold.history import TimerStarted, decode_event
from runifold.stores.sqlite import SqliteWorkflowStore

ROOT = Path(__file__).resolve().parents[1]
APP = "benchmarks.bench_app:registry"
Row = tuple[str, str, str]


async def fresh_store(kind: str, folder: Path) -> tuple[Any, str]:
    if kind == "sqlite":
        url = f"sqlite:///{folder / f'bench-{time.monotonic_ns()}.db'}"
    else:
        url = os.environ["RUNIFOLD_TEST_POSTGRES"]
        conn = await asyncpg.connect(url)
        if await conn.fetchval("SELECT to_regclass('runifold_runs') IS NOT NULL"):
            await conn.execute("TRUNCATE runifold_runs, runifold_events, runifold_signals, runifold_signal_audit")
        await conn.close()
    return await open_store(url), url


def make_worker(store: Any, worker_id: str = "bench", lease: float = 30.0) -> WorkflowWorker:
    return WorkflowWorker(store, bench_app.registry, WorkerId.parse(worker_id), LeaseDuration(timedelta(seconds=lease)),
                          timedelta(seconds=lease / 3))


def spawn_worker(url: str, worker_id: str, env: dict[str, str] | None = None, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "runifold.cli", "--store", url, "--app", APP, "worker", "--worker-id", worker_id, *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )


def wait_ready(proc: subprocess.Popen[bytes]) -> None:
    """Block until a worker process prints its start line."""
    assert proc.stdout is not None
    proc.stdout.readline()


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 600, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        await asyncio.sleep(every)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _median(rounds: list[tuple[float, Row]]) -> Row:
    """The round with the median ratio to its raw limit, noting the spread of all rounds."""
    ordered = sorted(rounds, key=lambda r: r[0])
    name, result, detail = ordered[len(ordered) // 2][1]
    if len(ordered) > 1:
        detail += f"; median of {len(ordered)} rounds (ratios {ordered[0][0]:.0%} to {ordered[-1][0]:.0%})"
    return name, result, detail


async def sequential(kind: str, limits: Limits, folder: Path, scale: float) -> list[Row]:
    n = max(100, int(1000 * scale))
    rounds = 3 if scale >= 1 else 1
    rows = [_median([await _sequential_run(kind, folder, n) for _ in range(rounds)])]
    if kind == "sqlite":
        rows.append((await _sequential_run(kind, folder, n, durable=False))[1])
    return rows


async def _sequential_run(kind: str, folder: Path, n: int, durable: bool = True) -> tuple[float, Row]:
    if durable:
        store, _ = await fresh_store(kind, folder)
    else:
        store = await SqliteWorkflowStore.open(str(folder / f"normal-{time.monotonic_ns()}.db"), durable=False)
    try:
        await store.enqueue(WorkflowTask("seq", 1, {"n": n}))
        worker = make_worker(store)
        before = await measure(kind)  # the raw limits just before and just after: the machine drifts
        wall, cpu, on_loop = time.perf_counter(), time.process_time(), time.thread_time()
        await worker.run_once()
        wall, cpu, on_loop = time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - on_loop
        limits = before.averaged(await measure(kind))
    finally:
        await store.close()
    rate = n / wall
    result = f"{rate:,.0f} steps/s, {cpu / n * 1000:.3f} ms CPU/step"
    if kind == "sqlite":
        result += f" (event-loop thread {on_loop / n * 1000:.3f}, the store's threads {max(0.0, cpu - on_loop) / n * 1000:.3f})"
    if not durable:
        return rate / limits.one, (f"sequential, synchronous=NORMAL (not the durable default): 1 run of {n} steps",
                                   result, f"{rate / limits.one:.0%} of in-thread sqlite3 with synchronous=FULL "
                                   f"({limits.one:,.0f}/s)")
    ratio = f"{rate / limits.one:.0%} of 1-connection commits/s ({limits.one:,.0f}/s)"
    if "1 connection through aiosqlite" in limits.extra:
        aio = limits.extra["1 connection through aiosqlite"]
        ratio = (f"{rate / limits.one:.0%} of in-thread sqlite3 ({limits.one:,.0f}/s); "
                 f"{rate / aio:.0%} of aiosqlite ({aio:,.0f}/s)")
    raw_cpu = ", ".join(f"{k} {v * 1000:.3f} ms" for k, v in limits.cpu.items())
    return rate / limits.one, (f"sequential: 1 run of {n} steps", result, f"{ratio}; CPU of a raw insert+commit: {raw_cpu}")


async def _in_process(kind: str, folder: Path, runs: int, slots: int) -> tuple[float, Row]:
    """``runs`` runs of 5 steps under one ``Supervisor`` with ``slots`` runs at once."""
    store, _ = await fresh_store(kind, folder)
    try:
        for i in range(runs):
            await store.enqueue(WorkflowTask("five", 1, {"n": i}))
        supervisor = Supervisor(make_worker(store), slots, idle_wait=timedelta(seconds=0.05))
        transactions = getattr(store, "transactions", 0)
        before = await measure(kind)
        started, busy, cpu = time.perf_counter(), machine_busy(), time.process_time()
        task = asyncio.create_task(supervisor.run(handle_signals=False))
        await until(lambda: asyncio.sleep(0, supervisor.outcomes.get("Completed", 0) >= runs), every=0.002)
        elapsed, busy, cpu = time.perf_counter() - started, machine_busy() - busy, time.process_time() - cpu
        supervisor.stop()
        await task
        limits = before.averaged(await measure(kind))
    finally:
        await store.close()
    steps = runs * 5 / elapsed
    detail = f"{steps / limits.many:.0%} of 8-connection commits/s ({limits.many:,.0f}/s)"
    if kind == "sqlite":
        detail += f"; {(runs * 6) / max(1, store.transactions - transactions):.1f} commits per fsync (grouped)"
    else:
        detail += "; " + _machine_bound(runs * 5, elapsed, busy, cpu, limits)
    return steps / limits.many, (f"concurrent: {runs} runs x 5 steps, 1 process, {slots} at once",
                                 f"{runs / elapsed:,.0f} runs/s, {steps:,.0f} steps/s", detail)


async def neighbour(kind: str, limits: Limits, folder: Path, scale: float) -> list[Row]:
    """One run of sequential steps under a Supervisor, alone and beside a run that polls with sleep(0)."""
    n = max(50, int(200 * scale))
    alone = await _beside(kind, folder, n, polling=False)
    beside = await _beside(kind, folder, n, polling=True)
    return [(f"busy neighbour: 1 run of {n} steps beside a run polling with sleep(0), 1 process",
             f"{beside:,.0f} steps/s (alone: {alone:,.0f} steps/s)", f"{beside / alone:.0%} of its rate alone")]


async def _beside(kind: str, folder: Path, n: int, polling: bool) -> float:
    store, _ = await fresh_store(kind, folder)
    try:
        supervisor = Supervisor(make_worker(store), 4, idle_wait=timedelta(seconds=0.05))
        task = asyncio.create_task(supervisor.run(handle_signals=False))
        name = f"release-{time.monotonic_ns()}"
        if polling:
            poller = await store.enqueue(WorkflowTask("poller", 1, {"name": name}))
            await until(lambda: asyncio.sleep(0, supervisor.outcomes.get("Idle", 0) > 0), every=0.01)
        started = time.perf_counter()
        run = await store.enqueue(WorkflowTask("seq", 1, {"n": n}))
        await until(lambda: _finished(store, run.run_id), every=0.002)
        elapsed = time.perf_counter() - started
        bench_app.marks[name] = time.time()
        if polling:
            await until(lambda: _finished(store, poller.run_id), every=0.01)
        supervisor.stop()
        await task
    finally:
        await store.close()
    return n / elapsed


async def _finished(store: Any, run_id: str) -> bool:
    return bool((await store.get_run(run_id)).status.finished)


def _machine_bound(steps: int, elapsed: float, busy: float, cpu: float, limits: Limits) -> str:
    """Machine-wide CPU per step against a raw commit's, and the steps/s that all cores busy would allow."""
    cores = os.cpu_count() or 1
    per_step = busy / steps
    ceiling = cores / per_step
    return (f"machine CPU {per_step * 1000:.3f} ms per step (this process {cpu / steps * 1000:.3f}), "
            f"{busy / elapsed / cores:.0%} of {cores} cores busy; a raw 8-connection commit "
            f"{limits.many_machine * 1000:.3f} ms at {limits.many_busy:.0%} busy; at this cost every core busy "
            f"would allow {ceiling:,.0f} steps/s ({ceiling / limits.many:.0%} of the limit)")


async def concurrent(kind: str, limits: Limits, folder: Path, scale: float) -> list[Row]:
    runs = max(100, int(1000 * scale))
    rows: list[Row] = []
    rounds = 3 if scale >= 1 else 1
    rows.append(_median([await _in_process(kind, folder, runs, 8) for _ in range(rounds)]))
    if kind == "postgres":
        rows.append((await _in_process(kind, folder, runs, 32))[1])
    if kind == "postgres":
        store, url = await fresh_store(kind, folder)
        try:
            procs = [spawn_worker(url, f"bench-{i}", None, "--concurrency", "8", "--idle-wait", "0.05") for i in range(4)]
            for proc in procs:
                wait_ready(proc)
                proc.send_signal(signal.SIGSTOP)  # started and listening, frozen while the runs are enqueued
            for i in range(runs):
                await store.enqueue(WorkflowTask("five", 1, {"n": i}))
            before = await measure(kind)
            started = time.perf_counter()
            for proc in procs:
                proc.send_signal(signal.SIGCONT)  # they wake on the queued NOTIFYs

            async def done() -> bool:
                return len(await store.list_runs(status=RunStatus.COMPLETED, limit=runs)) >= runs

            await until(done, every=0.1)
            elapsed = time.perf_counter() - started
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait()
            around = before.averaged(await measure(kind))
            steps = runs * 5 / elapsed
            rows.append((f"concurrent: {runs} runs x 5 steps, 4 processes x 8", f"{runs / elapsed:,.0f} runs/s, "
                         f"{steps:,.0f} steps/s (runs enqueued before the workers resume)",
                         f"{steps / around.many:.0%} of 8-connection commits/s ({around.many:,.0f}/s)"))
        finally:
            await store.close()
    return rows


class _TimedClaims:
    """Wraps a store to time its claims (a measuring proxy, not a stand-in)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.claim_started = self.claim_ended = 0.0

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claim_started = time.time()
        result = await self._store.claim(*args, **kwargs)
        self.claim_ended = time.time()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def recovery(kind: str, limits: Limits, folder: Path, scale: float) -> list[Row]:
    n = max(100, int(1000 * scale))
    rounds = sorted([await _recover_once(kind, folder, n) for _ in range(3 if scale >= 1 else 1)])
    replay, claim_ms, load, total = rounds[len(rounds) // 2]  # the round with the median replay
    spread = "" if len(rounds) == 1 else (f"; median of {len(rounds)} rounds (replay {n / rounds[-1][0]:,.0f} to "
                                          f"{n / rounds[0][0]:,.0f} steps/s)")
    return [(f"recovery: run killed after {n} steps",
             f"claim+history {claim_ms:.1f} ms (history read alone {load * 1000:.1f} ms), replay to first live step "
             f"{replay * 1000:.1f} ms, worker start to completion {total * 1000:.0f} ms",
             f"replay {n / replay:,.0f} steps/s; first live step {replay * 1000:.0f} ms after the claim{spread}")]


async def _recover_once(kind: str, folder: Path, n: int) -> tuple[float, float, float, float]:
    """Kill a worker after ``n`` steps and recover the run: (replay s, claim ms, history read s, total s)."""
    store, url = await fresh_store(kind, folder)
    gate = folder / "gate"
    gate.touch()
    Path(f"{gate}.reached").unlink(missing_ok=True)
    try:
        await store.enqueue(WorkflowTask("recover", 1, {"n": n, "name": "first-live"}, checkpoint_id="rec"))
        proc = spawn_worker(url, "doomed", {"RUNIFOLD_BENCH_GATE": str(gate)}, "--lease", "1")
        await until(lambda: asyncio.sleep(0, Path(f"{gate}.reached").exists()), timeout=300)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        gate.unlink()
        lease_until = (await store.get_run("rec")).lease_until or 0.0

        async def expired() -> bool:
            return bool(await store.now() > lease_until)

        await until(expired)
        gc.collect()  # measure recovery, not the collection of earlier benchmarks' garbage
        load = time.perf_counter()
        await store.history("rec")
        load = time.perf_counter() - load
        timed = _TimedClaims(store)
        worker = make_worker(timed, "rescuer")
        started = time.time()
        outcome = await worker.run_once()
        finished = time.time()
        assert type(outcome).__name__ == "Completed", outcome
        claim_ms = (timed.claim_ended - timed.claim_started) * 1000
        replay = bench_app.marks["first-live"] - timed.claim_ended
    finally:
        await store.close()
    return replay, claim_ms, load, finished - started


async def wake_latency(kind: str, limits: Limits, folder: Path, scale: float) -> list[Row]:
    count = max(20, int(100 * scale))
    store, url = await fresh_store(kind, folder)
    sender = await open_store(url)
    idle = 0.05 if kind == "sqlite" else 30.0
    keys = HmacKeyRing()
    keys.add("bench-1", "bench", b"bench-secret-0123456789abcdef")
    gateway = SignalGateway(sender, bench_app.registry, keys)
    supervisor = Supervisor(make_worker(store), 8, idle_wait=timedelta(seconds=idle))
    task = asyncio.create_task(supervisor.run(handle_signals=False))
    latencies: list[float] = []
    lateness: list[float] = []
    try:
        for i in range(count):
            await sender.enqueue(WorkflowTask("waiter", 1, {"name": f"w{i}"}, checkpoint_id=f"w{i}"))

        async def all_waiting() -> bool:
            return len(await sender.list_runs(status=RunStatus.WAITING, limit=count)) >= count

        await until(all_waiting)
        await asyncio.sleep(idle * 2)
        pauses = random.Random(8)
        for i in range(count):
            # a pause of up to one poll period: the signal arrives at a random point of the receiver's poll,
            # not just after the wake-up that the previous run's final commit gave it
            await asyncio.sleep(pauses.uniform(0, 0.05))
            sent = time.time()
            await gateway.send(sign(SignalEnvelope(target=f"w{i}", name="go", payload={}, signal_id=f"s{i}",
                                                   sender="bench", reason="bench", key_id="bench-1", timestamp=sent),
                                    keys.secret_of("bench-1")))

            async def resumed(name: str = f"w{i}") -> bool:
                return name in bench_app.marks

            await until(resumed, every=0.001)
            latencies.append(bench_app.marks[f"w{i}"] - sent)
        for i in range(count):
            await sender.enqueue(WorkflowTask("sleeper", 1, {"name": f"t{i}", "seconds": 0.5}, checkpoint_id=f"t{i}"))

        async def all_fired() -> bool:
            return all(f"t{i}" in bench_app.marks for i in range(count))

        await until(all_fired)
        for i in range(count):
            started = next(decode_event(e.body) for e in await sender.history(f"t{i}") if e.type == "timer_started")
            assert isinstance(started, TimerStarted)
            lateness.append(bench_app.marks[f"t{i}"] - started.fire_at)
    finally:
        supervisor.stop()
        await task
        await sender.close()
        await store.close()
    how = ("sender on another connection; idle poll 50 ms (SQLite has no cross-process notification)" if kind == "sqlite"
           else "LISTEN/NOTIFY; idle poll 30 s, so no busy polling") + "; each signal sent after a random pause of 0-50 ms"
    return [(f"wake latency: {count} signals", f"p50 {pct(latencies, 0.5) * 1000:.1f} ms, p99 {pct(latencies, 0.99) * 1000:.1f} ms", how),
            (f"timer lateness: {count} timers of 0.5 s", f"p50 {pct(lateness, 0.5) * 1000:.1f} ms, p99 {pct(lateness, 0.99) * 1000:.1f} ms",
             "store clock; never early (lateness >= 0)" if min(lateness) >= 0 else "EARLY TIMER SEEN")]


def _proc_usage(pid: int) -> tuple[float, float]:
    """Return (cpu seconds, RSS MiB) of a process from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS")) / 1024
    return cpu, rss


async def _idle_worker(url: str, seconds: float) -> tuple[float, float]:
    proc = spawn_worker(url, f"idle-{time.monotonic_ns()}", None, "--concurrency", "8")
    await asyncio.sleep(3)  # start-up
    cpu0, _ = _proc_usage(proc.pid)
    await asyncio.sleep(seconds)
    cpu1, rss = _proc_usage(proc.pid)
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    return (cpu1 - cpu0) / seconds, rss


async def idle_cost(kind: str, limits: Limits, folder: Path, scale: float) -> list[Row]:
    suspended = max(1000, int(10_000 * scale))
    finished = max(100_000, int(1_000_000 * scale))
    churned = max(100, int(2000 * scale))
    store, url = await fresh_store(kind, folder)
    rows: list[Row] = []
    try:
        empty_cpu, empty_rss = await _idle_worker(url, 5)
        # half wait for a signal, half sleep on a timer an hour away
        await _drive_all(store, [WorkflowTask("waiter", 1, {"name": f"i{i}"}) if i % 2 else
                                 WorkflowTask("sleeper", 1, {"name": f"i{i}", "seconds": 3600.0})
                                 for i in range(suspended)], "Suspended")
        busy_cpu, busy_rss = await _idle_worker(url, 5)
        rows.append((f"idle cost: {suspended:,} suspended runs (half on signals, half on timers)", f"idle worker RSS {busy_rss:.0f} MiB, CPU {busy_cpu:.2%}",
                     f"vs empty store: RSS {busy_rss / empty_rss:.2f}x, CPU {busy_cpu * 100:.2f} vs {empty_cpu * 100:.2f} %"))
        await _vacuum(kind, url)  # both measurements see the table as autovacuum leaves it
        claim_small, trip_small = await _claim_cost(kind, store, 1000)
        pages_small, _ = await _claim_plan(kind, url)
        await _add_finished(kind, url, finished)
        claim_large, trip_large = await _claim_cost(kind, store, 1000)
        pages_large, _ = await _claim_plan(kind, url)
        # runs going through a large table leave dead entries in the claim's index: does VACUUM remove them?
        await _drive_all(store, [WorkflowTask("five", 1, {"n": i}) for i in range(churned)], "Completed")
        await _vacuum(kind, url)
        claim_churned, trip_churned = await _claim_cost(kind, store, 1000)
        pages_churned, plan = await _claim_plan(kind, url)
        growth = f"{claim_large / claim_small:.2f}x"
        after = f"{claim_churned / claim_small:.2f}x"
        if trip_small:  # the machine's speed drifts between the two: also judge against a round trip timed alongside
            growth = (f"{(claim_large / trip_large) / (claim_small / trip_small):.2f}x against a trivial round trip "
                      f"timed alongside ({trip_small * 1000:.2f} then {trip_large * 1000:.2f} ms), {growth} in time; "
                      f"the claim read {pages_small} then {pages_large} pages")
            after = (f"{(claim_churned / trip_churned) / (claim_small / trip_small):.2f}x against the round trip, "
                     f"{after} in time, {pages_churned} pages")
        rows.append((f"claim cost: {suspended:,} suspended + {finished:,} finished runs",
                     f"{claim_large * 1000:.2f} ms per claim (was {claim_small * 1000:.2f} ms without the finished runs; "
                     f"{claim_churned * 1000:.2f} ms after {churned:,} more runs went through and a VACUUM)",
                     f"{growth}; after the {churned:,} runs {after}; plan: {plan}"))
    finally:
        await store.close()
    return rows


async def _drive_all(store: Any, tasks: list[WorkflowTask], outcome: str) -> None:
    """Enqueue ``tasks`` and drive them under a ``Supervisor`` with 8 at once until each ends with ``outcome``."""
    for t in tasks:
        await store.enqueue(t)
    supervisor = Supervisor(make_worker(store), 8, idle_wait=timedelta(seconds=0.05))
    task = asyncio.create_task(supervisor.run(handle_signals=False))
    await until(lambda: asyncio.sleep(0, supervisor.outcomes.get(outcome, 0) >= len(tasks)))
    supervisor.stop()
    await task


async def _claim_cost(kind: str, store: Any, count: int) -> tuple[float, float]:
    """Seconds per empty claim, and on PostgreSQL per trivial round trip (``store.now()``; 0 on SQLite,
    whose clock is local); each the median of five rounds of ``count // 5``, the two kinds taking turns,
    after one untimed round of each (after ``VACUUM ANALYZE`` the first claims plan the statement again:
    the steady cost is what is compared)."""
    claims, trips = [], []
    for timed in (False, True, True, True, True, True):
        started = time.perf_counter()
        for _ in range(count // 5):
            assert await store.claim("probe", {"waiter", "sleeper", "seq"}, 30.0) is None
        if timed:
            claims.append((time.perf_counter() - started) / (count // 5))
        if kind == "postgres":
            started = time.perf_counter()
            for _ in range(count // 5):
                await store.now()
            if timed:
                trips.append((time.perf_counter() - started) / (count // 5))
    return sorted(claims)[2], sorted(trips)[2] if trips else 0.0


async def _add_finished(kind: str, url: str, count: int) -> None:
    if kind == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=60)
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
            "INSERT INTO runs (run_id, name, version, input_json, status, revision, due_at, created_at, updated_at) "
            "SELECT 'fin' || i, 'seq', 1, '{}', 'completed', 3, NULL, 0, 0 FROM n", (count,))
        conn.commit()
        conn.execute("ANALYZE")
        conn.close()
    else:
        conn = await asyncpg.connect(url)
        await conn.execute(
            "INSERT INTO runifold_runs (run_id, name, version, input_json, status, revision, due_at, created_at, updated_at) "
            "SELECT 'fin' || i, 'seq', 1, '{}', 'completed', 3, NULL, 0, 0 FROM generate_series(1, $1) AS i", count)
        await conn.close()
        await _vacuum(kind, url)


async def _vacuum(kind: str, url: str) -> None:
    """On PostgreSQL, ``VACUUM ANALYZE`` the runs table: as autovacuum would leave it, and not left running
    beside the measurement; then a checkpoint, so that writing out what the load and the vacuum dirtied does
    not run beside it either. (SQLite deletes index entries in place: nothing to do.)"""
    if kind == "postgres":
        conn = await asyncpg.connect(url)
        await conn.execute("VACUUM ANALYZE runifold_runs")
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):  # needs pg_checkpoint or a superuser
            await conn.execute("CHECKPOINT")
        await conn.close()


async def _claim_plan(kind: str, url: str) -> tuple[int, str]:
    """The plan of the store's claim statement and, on PostgreSQL, the pages (index and heap, from shared
    buffers or not) one empty claim reads: its work, which the machine's speed does not move (SQLite does
    not count them: 0)."""
    if kind == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        rows = conn.execute(
            "EXPLAIN QUERY PLAN SELECT run_id FROM runs WHERE due_at IS NOT NULL AND due_at <= 0 "
            "AND +name IN (SELECT value FROM json_each('[\"seq\"]')) ORDER BY due_at LIMIT 1").fetchall()
        conn.close()
        return 0, "; ".join(r[-1] for r in rows if "runs" in r[-1])
    from runifold.stores.postgres import Q  # the store's own claim statement

    conn = await asyncpg.connect(url)
    plan = msgspec.json.decode(await conn.fetchval(
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {Q['claim']}", "probe", ["waiter", "sleeper", "seq"], [], 30.0, "probe", 1))
    await conn.close()
    top = plan[0]["Plan"]

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    scan = next((n for n in nodes(top) if n.get("Relation Name") == "runifold_runs" and "Index Cond" in n
                 and "due_at" in n["Index Cond"]), None)
    text = "?" if scan is None else f"{scan['Node Type']} using {scan['Index Name']}, Index Cond: {scan['Index Cond']}"
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"]), text


BENCHMARKS = {"sequential": sequential, "concurrent": concurrent, "neighbour": neighbour, "recovery": recovery,
              "wake": wake_latency, "idle": idle_cost, "claims": _claims.claims}


async def run_all(kind: str, limits: Limits, scale: float, only: list[str] | None = None) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="runifold-bench-") as folder:
        for name, bench in BENCHMARKS.items():
            if only and name not in only:
                continue
            bench_app.marks.clear()
            for row in await bench(kind, limits, Path(folder), scale):
                print(f"[{kind}] {row[0]}: {row[1]} | {row[2]}", flush=True)
                rows.append(row)
    return rows
