"""A five-step workflow for load tests; each body logs ``checkpoint key pid`` when it runs."""

from __future__ import annotations

import os

from runifold import WorkflowContext, WorkflowDefinition, WorkflowRegistry, step, workflow


@step()
async def work(checkpoint: str, i: int) -> int:
    with open(os.environ["RUNIFOLD_TEST_COUNTS"], "a") as f:
        f.write(f"{checkpoint} {i} {os.getpid()}\n")
    return i


@workflow("five-steps")
async def five_steps(ctx: WorkflowContext, checkpoint: str) -> int:
    total = 0
    for i in range(5):
        total += await work(checkpoint, i)
    return total


registry = WorkflowRegistry(WorkflowDefinition(five_steps))
