"""Crash tests run real worker processes against real SQLite files and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runifold import open_store
from tests.conftest import require_postgres, reset_postgres

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_APP = "tests.crash.app:registry"


@dataclass
class CrashEnv:
    """A store URL plus the files the crash app uses to talk to the test.

    ``apps`` are the registries worker processes ran (``module:attribute``): when the test ends, every
    run they completed is replayed against that code and must replay exactly.
    """

    url: str
    tmp: Path
    apps: set[str] = field(default_factory=lambda: {DEFAULT_APP})

    def uses(self, app: str) -> str:
        """Note that worker processes run ``app``; return it."""
        self.apps.add(app)
        return app

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

    def spawn(self, worker_id: str, lease: float, *app: str, exit_idle: bool = False,
              extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
        env = {**self.env, "RUNIFOLD_TEST_EXIT_IDLE": "1"} if exit_idle else self.env
        env = {**env, **(extra or {})}
        for name in app:
            self.uses(name)
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
    env = CrashEnv(url, tmp_path)
    yield env
    await replay_completed(env.url, env.apps)


async def replay_completed(url: str, apps: set[str]) -> None:
    """Replay every completed or failed run in the store against the code that ran it; fail on any divergence
    (a completed run's replay must also reach its end)."""
    import importlib

    from runifold import RunStatus, WorkflowRegistry
    from runifold.history import Entry, decode_event
    from runifold.worker._debug import replay

    registries: list[WorkflowRegistry] = []
    for app in sorted(apps):
        module, _, attribute = app.partition(":")
        registries.append(getattr(importlib.import_module(module), attribute))
    store = await open_store(url)
    problems: list[str] = []
    try:
        finished = [*await store.list_runs(status=RunStatus.COMPLETED, limit=100_000),
                    *await store.list_runs(status=RunStatus.FAILED, limit=100_000)]
        for info in finished:
            definition = next((d for r in registries if (d := r.get(info.name, info.version)) is not None), None)
            if definition is None:
                continue  # finished by a worker this test started in-process, with its own code
            history = [Entry(e.seq, e.at, decode_event(e.body)) for e in await store.history(info.run_id)]
            report = await replay(definition, info.run_id, history)
            if not report.clean or (info.status is RunStatus.COMPLETED and not report.finished):
                problems.append(f"{info.checkpoint_id or info.run_id} ({info.name}): {report.divergence or report.stopped_at}")
    finally:
        await store.close()
    assert not problems, "finished runs that do not replay against their code:\n" + "\n".join(problems)
