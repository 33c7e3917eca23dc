"""Crash tests run real worker processes against real SQLite files and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runifold import open_store
from tests.conftest import require_postgres, reset_postgres

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CrashEnv:
    """A store URL plus the files the crash app uses to talk to the test."""

    url: str
    tmp: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RUNIFOLD_TEST_COUNTS": str(self.tmp / "counts"),
            "RUNIFOLD_TEST_INFLIGHT": str(self.tmp / "inflight"),
            "RUNIFOLD_TEST_BLOCK": str(self.tmp / "block"),
            "RUNIFOLD_TEST_DIR": str(self.tmp),
        }

    def spawn(self, worker_id: str, lease: float, *app: str, exit_idle: bool = False) -> subprocess.Popen[str]:
        env = {**self.env, "RUNIFOLD_TEST_EXIT_IDLE": "1"} if exit_idle else self.env
        return subprocess.Popen(
            [sys.executable, "-m", "tests.crash.proc_worker", self.url, worker_id, str(lease), *app],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )

    def counts(self) -> Counter[str]:
        path = self.tmp / "counts"
        lines = path.read_text().split("\n") if path.exists() else []
        return Counter(line.split()[0] for line in lines if line)

    def wait_for(self, name: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not (self.tmp / name).exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not appear within {timeout} s")
            time.sleep(0.01)


@pytest.fixture(params=["sqlite", "postgres"])
async def crash_env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CrashEnv]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'crash.db'}"
    else:
        url = require_postgres()
        await reset_postgres(url)
    store = await open_store(url)  # creates the schema before workers race for it
    await store.close()
    yield CrashEnv(url, tmp_path)
