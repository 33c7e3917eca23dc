"""A schedule ticking every second, fired by three real ``runifold worker`` processes on one store."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime

from runifold import RunStatus, Schedule, open_store
from tests.crash.conftest import ROOT, CrashEnv

APP = "tests.crash.limits_app:registry"


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_three_workers_start_one_run_per_tick(crash_env: CrashEnv) -> None:
    """Three worker processes (one killed halfway) check a one-second schedule: each tick starts exactly one run, none is missed, checkpoint ids carry the ticks."""
    crash_env.uses(APP)
    store = await open_store(crash_env.url)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "runifold.cli", "--store", crash_env.url, "--app", APP, "worker", "--lease", "10",
         "--concurrency", "2", "--idle-wait", "0.2", "--schedule-every", "0.5", "--worker-id", f"sched-{i}",
         "--log-level", "info", "--log-format", "json"],
        cwd=ROOT, env=crash_env.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().startswith("worker sched-")
        added = await store.add_schedule(Schedule("every-second", "tick", 1, cron="* * * * * *"))
        await asyncio.sleep(3.2)
        procs[0].kill()  # one worker dies: the other two go on firing
        procs[0].wait()
        await asyncio.sleep(3.5)
        stopped = await store.now()
        await store.delete_schedule("every-second")
        deadline = time.monotonic() + 60
        while await store.count_runs(status=RunStatus.COMPLETED) < await store.count_runs():
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs[1:])
            await asyncio.sleep(0.1)
        runs = sorted(await store.list_runs(limit=1000), key=lambda r: r.checkpoint_id or "")
    finally:
        errors = []
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            errors.append(proc.communicate(timeout=60)[1])
        await store.close()
    ticks = [r.checkpoint_id for r in runs]
    expected = [f"schedule:every-second:{iso(t)}" for t in range(int(added.last_tick) + 1, int(stopped) + 1)]
    bodies = Counter(line.split()[0] for line in (crash_env.tmp / "counts").read_text().splitlines())
    ran_by = {line.split()[0]: line.split()[1] for line in (crash_env.tmp / "counts").read_text().splitlines()}
    fired: dict[str, list[str]] = {}
    for err in errors:
        for line in err.splitlines():
            record = json.loads(line) if line.startswith("{") else {}  # and the worker's plain "stopping" line
            if record.get("event") == "schedule_fired":
                verdict = "created" if record["created"] else "found"
                fired.setdefault(record["checkpoint_id"], []).append(f"{record['worker_id']} {verdict}")
    print(f"\nschedule every-second (cron '* * * * * *'), 3 worker processes (sched-0 killed after 3 s), "
          f"{crash_env.url.split(':')[0]}: "
          f"added {iso(added.last_tick)}, deleted {iso(stopped)}")
    for run in runs:
        print(f"  {run.checkpoint_id}  {run.run_id}  {run.status}, step ran in pid {ran_by.get(run.checkpoint_id or '')}"
              f"; enqueued by {', '.join(sorted(fired.get(run.checkpoint_id or '', [])))}")
    print(f"{len(set(ticks))} ticks, {len(runs)} runs, {sum(bodies.values())} step bodies; "
          f"missing {sorted(set(expected[:-1]) - set(ticks))}")
    assert not any('"level":"error"' in e for e in errors), errors
    creators = [sum(v.endswith("created") for v in fired[t]) for t in ticks]
    assert creators == [1] * len(ticks)  # each tick's run was created by one enqueue, whoever else tried
    assert len(ticks) == len(set(ticks)) >= 5  # one run per tick
    assert set(ticks) <= set(expected)  # nothing before the add or after the delete
    assert set(expected[:-1]) <= set(ticks)  # no tick missed while workers ran (the last may have met the delete)
    assert ticks == expected[:len(ticks)]  # contiguous: every second from the first tick on
    assert all(bodies[t] == 1 for t in ticks) and len(bodies) == len(ticks)  # each run's step ran once
