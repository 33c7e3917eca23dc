"""`runifold drill` against real stores: every step passes, other runs are untouched, its own are purged."""

from __future__ import annotations

import os
import subprocess
import sys

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
