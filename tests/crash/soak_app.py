"""The soak workflow: five steps (two of them concurrent), a recorded time and a charge.

Every step body appends ``checkpoint key start_time pid`` to the counts file
when it starts, so the test can check, outside the workers, that no step ran
again after its completion was committed.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

from runifold import WorkflowContext, WorkflowDefinition, WorkflowRegistry, step, workflow


def _record(checkpoint: str, key: str) -> None:
    with open(os.environ["RUNIFOLD_TEST_COUNTS"], "a") as f:
        f.write(f"{checkpoint} {key} {time.time():.6f} {os.getpid()}\n")


async def _work(checkpoint: str, key: str) -> str:
    _record(checkpoint, key)
    await asyncio.sleep(random.uniform(0, 0.03))
    return f"{key}:{checkpoint}"


@step()
async def s1(checkpoint: str) -> str:
    return await _work(checkpoint, "s1#1")


@step()
async def s2(checkpoint: str, branch: int) -> str:
    return await _work(checkpoint, f"{branch}/s2#1")


@step()
async def s3(checkpoint: str) -> str:
    return await _work(checkpoint, "s3#1")


@step()
async def s4(checkpoint: str) -> str:
    return await _work(checkpoint, "s4#1")


@workflow("soak")
async def soak(ctx: WorkflowContext, checkpoint: str) -> list[str]:
    first = await s1(checkpoint)
    ctx.now()
    branches = await asyncio.gather(s2(checkpoint, 1), s2(checkpoint, 2))
    ctx.charge(1)
    return [first, *branches, await s3(checkpoint), await s4(checkpoint)]


registry = WorkflowRegistry(WorkflowDefinition(soak))
