"""`runifold drill` against real stores: every step passes, other runs are untouched, its own are purged."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from runifold import WorkflowTask, open_store
from tests.crash.conftest import ROOT, CrashEnv


async def test_drill_passes_and_cleans_up(crash_env: CrashEnv) -> None:
    """The drill's six steps pass on this store; a run that is not the drill's keeps its state, and the drill's runs are gone."""
    store = await open_store(crash_env.url)
    try:
        await store.enqueue(WorkflowTask("someone-elses", 1, {"x": 1}, checkpoint_id="bystander"))
        before = (await store.get_run("bystander"), await store.history("bystander"))
        result = subprocess.run([sys.executable, "-m", "runifold.cli", "--store", crash_env.url, "drill"], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
        print(result.stdout)
        assert result.returncode == 0, result.stdout + result.stderr
        assert [line.split()[1] for line in result.stdout.splitlines() if line.startswith("PASS")] == \
            ["1.", "2.", "3.", "4.", "5.", "6."]
        assert "drill passed: 6/6 steps" in result.stdout
        assert (await store.get_run("bystander"), await store.history("bystander")) == before
        assert [r.checkpoint_id for r in await store.list_runs()] == ["bystander"]
    finally:
        await store.close()


async def test_a_drill_stopped_by_sigterm_stops_its_workers_and_purges_its_runs(crash_env: CrashEnv) -> None:
    """SIGTERM (a `kill`, systemd, a CI timeout) ended the drill at once: its worker processes ran on, orphaned,
    and its runs stayed in the store (helper-41). It now cleans up as Ctrl-C does, says so, and exits 143."""
    drill = subprocess.Popen([sys.executable, "-m", "runifold.cli", "--store", crash_env.url, "drill"], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    store = await open_store(crash_env.url)
    try:
        # (its first step enqueues before any worker starts: wait for both, or a loaded machine reads between them)
        deadline = time.monotonic() + 60
        while not ([r for r in await store.list_runs() if (r.checkpoint_id or "").startswith("drill-")]
                   and _children(drill.pid)):
            assert drill.poll() is None, drill.communicate()
            assert time.monotonic() < deadline, "the drill started no worker process"
            await asyncio.sleep(0.05)
        workers = _children(drill.pid)
        drill.send_signal(signal.SIGTERM)
        _, err = drill.communicate(timeout=60)
        assert drill.returncode == 143, err
        assert "drill interrupted; its workers were stopped and its runs purged" in err
        assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}") and _alive(pid)]
        assert await store.list_runs() == []
    finally:
        if drill.poll() is None:
            drill.kill()
        await store.close()


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _alive(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
