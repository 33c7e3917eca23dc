"""Concurrency limits under load: several ``runifold worker`` processes with several slots each, on one store."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from runifold import RunStatus, WorkflowTask, open_store
from tests.crash.conftest import ROOT, CrashEnv
from tests.crash.limits_app import registry

APP = "tests.crash.limits_app:registry"


def most_at_once(spans: list[str]) -> dict[str, int]:
    """For each key, the most runs that were inside their step at the same time (from start/end lines)."""
    edges: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for line in spans:
        key, _, edge, at = line.split()
        edges[key].append((float(at), 1 if edge == "start" else -1))
    most = {}
    for key, points in edges.items():
        now = peak = 0
        for _, step in sorted(points, key=lambda p: (p[0], p[1])):  # an end before a start at the same instant
            now += step
            peak = max(peak, now)
        most[key] = peak
    return most


@pytest.mark.parametrize("processes", [4])
async def test_limits_hold_across_worker_processes(crash_env: CrashEnv, processes: int) -> None:
    """4 processes x 4 slots run 60 payments (at most 3 at once), 5 customers x 6 syncs (1 each) and 30 free runs: no key ever runs over its limit, and all complete."""
    crash_env.uses(APP)
    store = await open_store(crash_env.url)
    tasks = [registry.validate(WorkflowTask("payment", 1, {"n": i})) for i in range(60)]
    tasks += [registry.validate(WorkflowTask("customer-sync", 1, {"customer_id": f"c{i % 5}", "n": i}))
              for i in range(30)]
    tasks += [registry.validate(WorkflowTask("free", 1, {"n": i})) for i in range(30)]
    await store.enqueue_many(tasks)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "runifold.cli", "--store", crash_env.url, "--app", APP, "worker", "--lease", "10",
         "--concurrency", "4", "--idle-wait", "0.1", "--worker-id", f"limits-{i}"],
        cwd=ROOT, env=crash_env.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for i in range(processes)]
    started = time.monotonic()
    try:
        while await store.count_runs(status=RunStatus.COMPLETED) < len(tasks):
            assert time.monotonic() - started < 300 and all(p.poll() is None for p in procs)
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - started
    finally:
        errors = []
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            errors.append(proc.communicate(timeout=60)[1])
        await store.close()
    spans = (crash_env.tmp / "spans").read_text().splitlines()
    most = most_at_once(spans)
    customers = {k: v for k, v in most.items() if k.startswith("customer:")}
    print(f"\n{processes} worker processes x 4 slots on {crash_env.url.split(':')[0]}, {len(tasks)} runs done in "
          f"{elapsed:.1f} s; most runs inside their step at once: payments {most['payments']} (limit 3), "
          f"customers {customers} (limit 1 each), free {most['free']} (no limit)")
    assert not any("Error" in e for e in errors), errors
    assert len(spans) == 2 * len(tasks)  # every run's step ran once
    assert most["payments"] <= 3 and all(v <= 1 for v in customers.values())
    assert most["payments"] == 3  # the limit was reached, so it is the limit that held the rest back
    assert most["free"] > 3  # runs without a key are not held back
