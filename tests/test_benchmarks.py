"""The benchmarks' smoke run: every benchmark runs end to end at the smallest sizes (no timing is judged)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_postgres

ROOT = Path(__file__).resolve().parents[1]
ROWS = ["sequential: 1 run of", "concurrent: 100 runs x 5 steps", "busy neighbour: 1 run of 50 steps", "recovery: run killed after",
        "wake latency:", "timer lateness:", "idle cost:", "claim cost:", "claims: 100 due runs without a key",
        "claims: 100 due runs with a key"]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_benchmarks_smoke_run(kind: str) -> None:
    """`benchmarks/run.py --smoke` reports every benchmark's row for the store and leaves the results table alone."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if kind == "postgres":
        env["RUNIFOLD_TEST_POSTGRES"] = require_postgres()
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    done = subprocess.run([sys.executable, "benchmarks/run.py", "--smoke", "--only", kind], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith(f"| {kind} |")]
    for row in ROWS:
        assert any(row in line for line in table), (row, done.stdout[-3000:])
    assert "EARLY TIMER SEEN" not in done.stdout
    assert (ROOT / "benchmarks" / "README.md").read_text() == readme
