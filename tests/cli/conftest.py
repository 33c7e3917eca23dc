"""The CLI tests' harness: ``runifold`` as a subprocess against a real SQLite file or PostgreSQL database."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runifold import RunStatus, open_store
from tests.conftest import require_postgres, reset_postgres

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.cli.app:registry"


class Cli:
    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNIFOLD_STORE": url, "RUNIFOLD_APP": APP,
                    "RUNIFOLD_TEST_DIR": str(tmp)}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "runifold.cli", *args]

    def __call__(self, *args: str, env: dict[str, str] | None = None,
                 cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), cwd=cwd, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=120)

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), cwd=ROOT, env={**self.env, **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def wait_status(self, ref: str, status: RunStatus, timeout: float = 60) -> None:
        store = await open_store(self.url)
        try:
            deadline = time.monotonic() + timeout
            while (await store.get_run(ref)).status is not status:
                assert time.monotonic() < deadline, f"{ref} never became {status}"
                await asyncio.sleep(0.05)
        finally:
            await store.close()


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(f"sqlite:///{tmp_path / 'cli.db'}", tmp_path)


@pytest.fixture(params=["sqlite", "postgres"])
async def any_cli(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cli]:
    if request.param == "sqlite":
        yield Cli(f"sqlite:///{tmp_path / 'cli.db'}", tmp_path)
        return
    dsn = require_postgres()
    await reset_postgres(dsn)
    yield Cli(dsn, tmp_path)


def run_worker_until(cli: Cli, ref: str, status: RunStatus, *extra: str,
                     timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Start ``runifold worker``, wait for the run to reach ``status``, SIGTERM it, return its result."""
    proc = cli.spawn("worker", "--concurrency", "2", "--idle-wait", "0.1", *extra)
    try:
        asyncio.run(cli.wait_status(ref, status, timeout))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def key_file(tmp: Path, name: str, entries: list[dict[str, Any]]) -> str:
    """Write a private key file of ``entries`` (raw ``secret`` bytes) and return its path."""
    path = tmp / name
    path.write_text(json.dumps([{**e, "secret": base64.b64encode(e["secret"]).decode()} for e in entries]))
    path.chmod(0o600)
    return str(path)
