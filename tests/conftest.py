"""Fixtures shared by every test layer: one store fixture parametrised over every store."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from runifold.stores.memory import MemoryWorkflowStore
from runifold.stores.sqlite import SqliteWorkflowStore
from runifold.testing import FakeClock

PG_DSN = os.environ.get("RUNIFOLD_TEST_POSTGRES", "")
STORE_KINDS = ["memory", "sqlite", "postgres"]


def require_postgres() -> str:
    """Return the test server's DSN; skip locally without one, fail in CI."""
    if not PG_DSN:
        if os.environ.get("CI"):
            pytest.fail("RUNIFOLD_TEST_POSTGRES is not set in CI; run the tests through `make test`")
        pytest.skip("no PostgreSQL test server (set RUNIFOLD_TEST_POSTGRES or run `make test`)")
    return PG_DSN


async def reset_postgres(dsn: str) -> None:
    """Empty every runifold table of the test database (schema kept)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        exists = await conn.fetchval("SELECT to_regclass('runifold_runs') IS NOT NULL")
        if exists:
            await conn.execute("TRUNCATE runifold_runs, runifold_events, runifold_signals, runifold_signal_audit, "
                               "runifold_schedules")
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def empty_postgres_database(dsn: str, name: str) -> AsyncIterator[str]:
    """A new, empty database ``name`` on the test server, dropped after: its URL."""
    import asyncpg

    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name}")
        await admin.execute(f"CREATE DATABASE {name}")
        yield f"{dsn.rsplit('/', 1)[0]}/{name}"  # the test server's URL, another database
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


StoreFactory = Callable[..., Awaitable[Any]]


@pytest.fixture(params=STORE_KINDS)
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """A factory opening more handles on one fresh store of each kind (``clock=`` where supported).

    Keyword options beyond ``clock`` go to :meth:`SqliteWorkflowStore.open` and are ignored by the other kinds.
    """
    kind = request.param
    opened: list[Any] = []
    memory: dict[str, MemoryWorkflowStore] = {}
    if kind == "postgres":
        dsn = require_postgres()
        await reset_postgres(dsn)

    async def factory(clock: FakeClock | None = None, **sqlite_options: Any) -> Any:
        if kind == "memory":
            if "store" not in memory:
                memory["store"] = MemoryWorkflowStore(clock) if clock else MemoryWorkflowStore()
            return memory["store"]
        if kind == "sqlite":
            kwargs: dict[str, Any] = {"clock": clock} if clock else {}
            kwargs.update(sqlite_options)
            store: Any = await SqliteWorkflowStore.open(str(tmp_path / "runifold.db"), **kwargs)
        else:
            assert clock is None, "PostgreSQL judges time on the database clock; it takes no fake clock"
            from runifold.stores.postgres import PostgresWorkflowStore

            store = await PostgresWorkflowStore.open(dsn)
        opened.append(store)
        return store

    factory.kind = kind  # type: ignore[attr-defined]
    yield factory
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_store: StoreFactory) -> Any:
    """One fresh store of each kind."""
    return await open_store()


def pytest_configure(config: pytest.Config) -> None:
    """Replay every run a worker completes in this process (logs: the library's records reach pytest's capture)."""
    _replay_every_completed_run()


#: runs that completed in this process and did not replay exactly against their code (see the fixture below)
REPLAY_FAILURES: list[str] = []


def _replay_every_completed_run() -> None:
    """Make every worker in this test process replay each run it completes or fails, as the debugger would.

    The replay must be clean, reach the end, and return a value equal to the live output, of the same
    types all the way down; a failed run's must be clean. Crash tests do the same for runs completed by worker processes.
    """
    from runifold import Completed, Failed
    from runifold.worker._worker import WorkflowWorker

    original = WorkflowWorker._drive

    async def drive(self: WorkflowWorker, claim: Any) -> Any:
        outcome = await original(self, claim)
        if isinstance(outcome, Completed):
            from tests.corpus.check import replay_problems

            REPLAY_FAILURES.extend(await replay_problems(self.store, self.registry, outcome.run_id, outcome.output))
        elif isinstance(outcome, Failed) and outcome.run_failed:
            from tests.corpus.check import replay_problems

            # a failed run's history replays too (where the engine refused a call, the replay may stop there)
            REPLAY_FAILURES.extend(await replay_problems(self.store, self.registry, outcome.run_id, failed=True))
        return outcome

    WorkflowWorker._drive = drive  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _completed_runs_replay() -> Any:
    """Fail a test in which a run completed by a worker of this process does not replay exactly."""
    REPLAY_FAILURES.clear()
    yield
    failures, REPLAY_FAILURES[:] = list(REPLAY_FAILURES), []
    assert not failures, "finished runs that do not replay exactly:\n" + "\n".join(failures)
