"""The corpus of workflow shapes, on every store: suspended, interrupted and killed, every completed run replays exactly."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import pytest

from runifold import Failed, RunStatus, WorkflowTask, open_store
from runifold.history import RunCompleted
from tests.corpus import patterns
from tests.corpus.check import Watched, drive, replay_problems
from tests.crash.conftest import ROOT, CrashEnv
from tests.support import entries, send_signal

APP = "tests.corpus.patterns:registry"


@pytest.fixture(autouse=True)
def _clean_seen() -> Any:
    patterns.seen.runs.clear()
    patterns.seen.check = None
    yield
    patterns.seen.check = None


@pytest.mark.parametrize("interrupt", [0.0, 0.3], ids=["suspended", "interrupted"])
async def test_every_shape_replays_exactly(open_store: Any, interrupt: float) -> None:
    """Each shape runs to completion through its waits (and, interrupted, through executions cut at random moments).

    Every completed run replays cleanly, the replay returns what the live run returned with the same types,
    and no step body started while its run was suspended.
    """
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    store = Watched(await open_store())
    violations: list[str] = []
    patterns.seen.check = lambda run, what: violations.append(f"{what} ran while {run} was suspended") \
        if run in store.idle else None
    refs = []
    for name in patterns.NAMES:
        for i in range(2):
            await store.enqueue(WorkflowTask(name, 1, {"n": i}, checkpoint_id=f"{name}-{i}"))
            refs.append(f"{name}-{i}")
    ends = await drive(store, patterns.registry, refs, rng=rng, interrupt=interrupt)
    problems = [f"{ref} failed: {end.reason}" for ref, end in ends.items() if isinstance(end, Failed)]
    for ref, end in ends.items():
        problems += await replay_problems(store, patterns.registry, ref, getattr(end, "output", None),
                                          compare_live=end is not None)
    assert not problems + violations, f"seed {seed}: " + "\n".join(problems + violations)
    # a step in a finally block or an async-with exit ran once: when the block really ended (an interrupted
    # execution may run it again, as any step in flight)
    for i in range(2 if not interrupt else 0):
        run_id = (await store.get_run(f"try-finally-{i}")).run_id
        assert [w for r, w in patterns.seen.runs if r == run_id].count("cleanup") == 1
        run_id = (await store.get_run(f"async-with-{i}")).run_id
        assert [w for r, w in patterns.seen.runs if r == run_id].count("close") == 1


def spawn(env: CrashEnv, worker_id: str) -> subprocess.Popen[bytes]:
    env.uses(APP)
    return subprocess.Popen(
        [sys.executable, "-m", "runifold.cli", "--store", env.url, "--app", APP, "worker", "--lease", "1",
         "--concurrency", "6", "--idle-wait", "0.05", "--worker-id", worker_id],
        cwd=ROOT, env=env.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


async def test_every_shape_survives_sigkill(crash_env: CrashEnv) -> None:
    """Workers running every shape are SIGKILLed at random moments; every run completes, replays exactly, and no
    step body started after its run completed."""
    seed = int(os.environ.get("RUNIFOLD_CORPUS_SEED", str(random.randrange(2**32))))
    rng = random.Random(seed)
    store = await open_store(crash_env.url)
    try:
        refs = [f"{name}-{i}" for name in patterns.NAMES for i in range(3)]
        for ref in refs:
            name, _, i = ref.rpartition("-")
            await store.enqueue(WorkflowTask(name, 1, {"n": int(i)}, checkpoint_id=ref))
        # "go" reaches each run at a random moment: before its wait (kept in the inbox) or while it waits
        pending_signals = sorted((rng.uniform(0.1, 3.0), ref) for ref in refs)
        started = time.monotonic()
        deadline = started + 120
        generation, kills = 0, 0

        async def unfinished() -> int:
            return sum([len(await store.list_runs(status=s, limit=1000))
                        for s in (RunStatus.READY, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.DIVERGED)])

        while await unfinished():
            assert time.monotonic() < deadline, f"seed {seed}: runs unfinished"
            generation += 1
            proc = spawn(crash_env, f"corpus-{generation}")
            until = time.monotonic() + rng.uniform(0.3, 1.2)
            while time.monotonic() < until:
                while pending_signals and pending_signals[0][0] <= time.monotonic() - started:
                    _, ref = pending_signals.pop(0)
                    await send_signal(store, ref, "go", f"go-{ref}")
                await asyncio.sleep(0.02)
            if generation < 8:
                proc.send_signal(signal.SIGKILL)
                kills += 1
                proc.wait()
                continue
            while pending_signals:
                _, ref = pending_signals.pop(0)
                await send_signal(store, ref, "go", f"go-{ref}")
            while await unfinished() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        problems: list[str] = []
        starts: dict[str, list[float]] = defaultdict(list)
        counts = crash_env.tmp / "counts"
        for line in (counts.read_text().splitlines() if counts.exists() else []):
            run_id, _what, at, _pid = line.split()
            starts[run_id].append(float(at))
        for ref in refs:
            info = await store.get_run(ref)
            if info.status is not RunStatus.COMPLETED:
                problems.append(f"{ref}: {info.status} ({info.reason})")
                continue
            problems += await replay_problems(store, patterns.registry, ref, compare_live=False)
            finished = [e.at for e in await entries(store, ref) if isinstance(e.event, RunCompleted)][0]
            late = [t for t in starts[info.run_id] if t > finished + 0.001]
            if late:
                problems.append(f"{ref}: a step body started after the run completed")
        print(f"corpus under SIGKILL on {crash_env.url.split(':')[0]}: {len(refs)} runs, {kills} kills, seed {seed}")
        assert not problems, f"seed {seed}:\n" + "\n".join(problems)
    finally:
        await store.close()
