"""Workflows the benchmarks run. Step bodies are trivial: what is measured is the engine."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from runifold import WorkflowContext, WorkflowDefinition, WorkflowRegistry, step, workflow

#: wall-clock times recorded by step bodies, read by the benchmark in the same process
marks: dict[str, float] = {}


@step()
async def tiny(i: int) -> dict[str, int]:
    return {"i": i}


@step()
async def mark(name: str) -> str:
    marks[name] = time.time()
    return name


@step()
async def block_then_mark(name: str) -> str:
    marks[name] = time.time()
    gate = Path(os.environ.get("RUNIFOLD_BENCH_GATE", "/nonexistent"))
    if gate.exists():
        Path(f"{gate}.reached").touch()
    while gate.exists():
        time.sleep(0.01)
    return name


@step()
async def hold(name: str) -> str:
    """Wait until the benchmark sets ``marks[name]``."""
    while name not in marks:
        await asyncio.sleep(0.005)
    return name


@workflow("poller")
async def poller(ctx: WorkflowContext, name: str) -> int:
    """Poll with ``asyncio.sleep(0)`` until a step is done, the way the docs advise against."""
    task = asyncio.create_task(hold(name))
    polls = 0
    while not task.done():
        await asyncio.sleep(0)
        polls += 1
    await task
    return polls


@workflow("seq")
async def seq(ctx: WorkflowContext, n: int) -> int:
    for i in range(n):
        await tiny(i)
    return n


@workflow("five")
async def five(ctx: WorkflowContext, n: int) -> int:
    for i in range(5):
        await tiny(i)
    return n


@workflow("recover")
async def recover(ctx: WorkflowContext, n: int, name: str) -> str:
    for i in range(n):
        await tiny(i)
    return await block_then_mark(name)


@workflow("waiter")
async def waiter(ctx: WorkflowContext, name: str) -> Any:
    await ctx.wait_signal("go")
    return await mark(name)


@workflow("sleeper")
async def sleeper(ctx: WorkflowContext, name: str, seconds: float) -> Any:
    await ctx.sleep(timedelta(seconds=seconds))
    return await mark(name)


registry = WorkflowRegistry(
    WorkflowDefinition(seq), WorkflowDefinition(five), WorkflowDefinition(recover),
    WorkflowDefinition(waiter, signals={"go": {"*"}}), WorkflowDefinition(sleeper),
    WorkflowDefinition(poller),
)
