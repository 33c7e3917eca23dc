"""A workflow for crash tests: steps count their executions in a file outside the worker."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from runifold import Budget, WorkflowContext, WorkflowDefinition, WorkflowRegistry, step, workflow


def record(name: str) -> None:
    """Append one execution of ``name`` to the counts file, durably."""
    with open(os.environ["RUNIFOLD_TEST_COUNTS"], "a") as f:
        f.write(f"{name} {os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())


@step()
async def prepare(order_id: str) -> dict[str, str]:
    record("prepare")
    return {"order": order_id}


@step()
async def slow(order_id: str) -> dict[str, str]:
    record("slow")
    Path(os.environ["RUNIFOLD_TEST_INFLIGHT"]).touch()
    block = Path(os.environ["RUNIFOLD_TEST_BLOCK"])
    while block.exists():
        await asyncio.sleep(0.02)
    return {"slow": order_id}


@step()
async def finish(order_id: str) -> str:
    record("finish")
    return f"done {order_id}"


@workflow("crashy")
async def crashy(ctx: WorkflowContext, order_id: str) -> str:
    await prepare(order_id)
    await slow(order_id)
    return await finish(order_id)


@workflow("crash-loop")
async def crash_loop(ctx: WorkflowContext, order_id: str) -> str:
    """Its only step hangs until the test kills the worker: a step that takes its worker down every time."""
    await slow(order_id)
    return await finish(order_id)


@workflow("crash-loop-recoveries")
async def crash_loop_recoveries(ctx: WorkflowContext, order_id: str) -> str:
    await slow(order_id)
    return await finish(order_id)


registry = WorkflowRegistry(
    WorkflowDefinition(crashy),
    WorkflowDefinition(crash_loop, Budget(max_steps=1)),
    WorkflowDefinition(crash_loop_recoveries, Budget(max_steps=None, max_recoveries=2)),
)
