"""Randomized crash soak: workers SIGKILLed at random moments, invariants checked on every history.

``RUNIFOLD_SOAK_RUNS`` (default 200) sets the number of runs per store and
``RUNIFOLD_SOAK_SEED`` replays a failing schedule; the test prints both.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict

from runifold import RunStatus, WorkflowTask, open_store
from runifold.history import TERMINAL_EVENTS, Entry, StepCompleted, decode_event, fold
from tests.crash.conftest import ROOT, CrashEnv

RUNS = int(os.environ.get("RUNIFOLD_SOAK_RUNS", "200"))
APP = "tests.crash.soak_app:registry"


def spawn(env: CrashEnv, worker_id: str) -> subprocess.Popen[bytes]:
    env.uses(APP)
    return subprocess.Popen(
        [sys.executable, "-m", "runifold.cli", "--store", env.url, "--app", APP, "worker", "--lease", "1",
         "--concurrency", "8", "--idle-wait", "0.1", "--worker-id", worker_id],
        cwd=ROOT, env=env.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def check_history(checkpoint: str, entries: list[Entry], starts: list[tuple[str, float]]) -> list[str]:
    """Return every invariant the run's history breaks."""
    problems = []
    seqs = [e.seq for e in entries]
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"seqs not contiguous: {seqs}")
    terminal = [i for i, e in enumerate(entries) if isinstance(e.event, TERMINAL_EVENTS)]
    if len(terminal) != 1 or terminal[0] != len(entries) - 1:
        problems.append(f"terminal events at {terminal} of {len(entries)}")
    completed = [e for e in entries if isinstance(e.event, StepCompleted)]
    keys = [e.event.key for e in completed]
    if len(keys) != len(set(keys)) or len(keys) != 5:
        problems.append(f"step completions {keys}")
    for e in completed:
        late = [t for key, t in starts if key == e.event.key and t > e.at]
        if late:
            problems.append(f"{e.event.key} ran again after its completion was committed at {e.at}: {late}")
    previous = None
    for i in range(1, len(entries) + 1):
        usage = asdict_usage(fold(entries[:i]).usage)
        if previous and any(usage[k] < previous[k] for k in usage):
            problems.append(f"usage decreased at seq {i}: {previous} -> {usage}")
        previous = usage
    return [f"{checkpoint}: {p}" for p in problems]


def asdict_usage(usage: object) -> dict[str, float]:
    return {k: getattr(usage, k) for k in ("steps", "effect_attempts", "retries", "cost_units")}


async def test_randomized_crash_soak(crash_env: CrashEnv) -> None:
    """Every run finishes with a clean history although its workers are killed at random moments, some twice in a row."""
    seed = int(os.environ.get("RUNIFOLD_SOAK_SEED", str(random.randrange(2**32))))
    rng = random.Random(seed)
    store = await open_store(crash_env.url)
    kills = recovery_kills = 0
    try:
        for i in range(RUNS):
            await store.enqueue(WorkflowTask("soak", 1, {"checkpoint": f"k{i}"}, checkpoint_id=f"k{i}"))
        deadline = time.monotonic() + 300
        generation = 0

        async def unfinished() -> int:
            total = 0
            for status in (RunStatus.READY, RunStatus.RUNNING, RunStatus.WAITING):
                total += len(await store.list_runs(status=status, name="soak", limit=RUNS))
            return total

        while await unfinished() and generation < 12:
            generation += 1
            worker = spawn(crash_env, f"soak-{generation}")
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kills += 1
            if rng.random() < 0.4:  # kill the next worker too, while it recovers the expired leases
                generation += 1
                await asyncio.sleep(1.0)
                worker = spawn(crash_env, f"soak-{generation}")
                await asyncio.sleep(rng.uniform(0.8, 1.6))
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                kills += 1
                recovery_kills += 1
        final = spawn(crash_env, "soak-final")
        try:
            while await unfinished():
                assert time.monotonic() < deadline, f"runs still unfinished (seed {seed})"
                await asyncio.sleep(0.1)
        finally:
            final.send_signal(signal.SIGTERM)
            final.wait(timeout=60)
        starts: dict[str, list[tuple[str, float]]] = defaultdict(list)
        for line in (crash_env.tmp / "counts").read_text().splitlines():
            checkpoint, key, started, _pid = line.split()
            starts[checkpoint].append((key, float(started)))
        failures: list[str] = []
        for i in range(RUNS):
            info = await store.get_run(f"k{i}")
            if info.status not in (RunStatus.COMPLETED, RunStatus.PARKED):
                failures.append(f"k{i}: ended {info.status}")
            entries = [Entry(e.seq, e.at, decode_event(e.body)) for e in await store.history(f"k{i}")]
            failures.extend(check_history(f"k{i}", entries, starts[f"k{i}"]))
        repeated = sum(len(v) for v in starts.values()) - 5 * RUNS
        print(f"soak on {crash_env.url.split(':')[0]}: N={RUNS} runs, {kills} SIGKILLs ({recovery_kills} during "
              f"recovery), {repeated} step bodies re-run after crashes, failures={len(failures)}, seed={seed}")
        assert not failures, f"seed {seed}: " + "; ".join(failures[:10])
    finally:
        await store.close()
