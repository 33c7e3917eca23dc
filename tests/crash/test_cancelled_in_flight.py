"""A branch cancelled while its step is in flight, when the worker dies between the commit that decided the
cancellation and the commit that records it: the next worker records the cancellation, so the completed run's
history replays against its code (helper-48: it replayed as DIVERGED, "no such call before the completion").

The worker process kills itself (SIGKILL) right after the store accepted the winning branch's step: the
cancellation of its sibling, buffered for the next commit, is lost with the process.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from runifold import WorkflowContext, WorkflowDefinition, WorkflowRegistry, WorkflowTask, open_store, step, workflow
from runifold.history import CallCancelled
from runifold.stores.memory import MemoryWorkflowStore
from runifold.stores.postgres import PostgresWorkflowStore
from runifold.stores.sqlite import SqliteWorkflowStore
from tests.corpus.check import replay_problems
from tests.crash.conftest import CrashEnv
from tests.support import entries

APP = "tests.crash.test_cancelled_in_flight:registry"
#: set in the first worker's environment: the file whose absence lets it kill itself once
KILL_MARK = "RUNIFOLD_TEST_KILL_MARK"


@step()
async def quick(label: str) -> str:
    return label


@step()
async def hang(label: str) -> str:
    await asyncio.sleep(60)
    return label


@workflow("cancel-taskgroup", version=1)
async def cancel_taskgroup(ctx: WorkflowContext) -> list[str]:
    """A TaskGroup whose failing branch cancels its sibling's step."""
    out: list[str] = []

    async def bad() -> None:
        await quick("bad")
        raise ValueError("boom")

    async def good() -> None:
        out.append(await hang("good"))

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(bad())
            group.create_task(good())
    except* ValueError:
        out.append("caught")
    out.append(await quick("after"))
    return out


@workflow("cancel-race", version=1)
async def cancel_race(ctx: WorkflowContext) -> list[str]:
    """asyncio.wait(FIRST_COMPLETED), then the loser is cancelled."""
    fast = asyncio.create_task(quick("fast"))
    slow = asyncio.create_task(hang("slow"))
    done, pending = await asyncio.wait({fast, slow}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return [task.result() for task in done] + [await quick("after")]


@workflow("cancel-sibling", version=1)
async def cancel_sibling(ctx: WorkflowContext) -> list[str]:
    """A gather branch cancels a task its sibling awaits."""
    slow = asyncio.create_task(hang("slow"))

    async def canceller() -> str:
        value = await quick("first")
        slow.cancel()
        return value

    results = await asyncio.gather(canceller(), slow, return_exceptions=True)
    return [r if isinstance(r, str) else type(r).__name__ for r in results] + [await quick("after")]


registry = WorkflowRegistry(*(WorkflowDefinition(w) for w in (cancel_taskgroup, cancel_race, cancel_sibling)))


def _kill_after_a_branch_step(cls: Any) -> None:
    """The process dies right after the store accepted a branch's ``quick`` (a key like ``1/quick#1``)."""
    commit = cls.commit

    async def committed_then_killed(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await commit(self, *args, **kwargs)
        mark = Path(os.environ[KILL_MARK])
        rows = args[2] if len(args) > 2 else kwargs["events"]
        if not mark.exists() and any(r.type == "step_completed" and r.key.endswith("/quick#1") for r in rows):
            mark.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    cls.commit = committed_then_killed


if os.environ.get(KILL_MARK):
    for store_class in (MemoryWorkflowStore, SqliteWorkflowStore, PostgresWorkflowStore):
        _kill_after_a_branch_step(store_class)


@pytest.mark.parametrize("name", ["cancel-taskgroup", "cancel-race", "cancel-sibling"])
async def test_a_cancellation_lost_with_its_worker_is_recorded_by_the_next(crash_env: CrashEnv, name: str) -> None:
    store = await open_store(crash_env.url)
    try:
        await store.enqueue(WorkflowTask(name, 1, {}, checkpoint_id="r"))
        first = crash_env.spawn("worker-a", 1.0, APP, extra={KILL_MARK: str(crash_env.tmp / "killed")})
        first.communicate(timeout=60)
        assert first.returncode == -signal.SIGKILL and (crash_env.tmp / "killed").exists()
        second = crash_env.spawn("worker-b", 1.0, APP)
        out, _ = second.communicate(timeout=60)
        assert out.split()[-1] == "Completed", out
        cancelled = [e.event.key for e in await entries(store, "r") if isinstance(e.event, CallCancelled)]
        assert len(cancelled) == 1 and cancelled[0].endswith("/hang#1"), cancelled
        assert await replay_problems(store, registry, "r", compare_live=False) == []
    finally:
        await store.close()
