"""Workflows the CLI tests drive through real ``runifold`` processes."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from runifold import (
    Budget,
    EffectOutcomeUnknown,
    ResumePolicy,
    RetryPolicy,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    effect,
    step,
    workflow,
)


def _dir() -> Path:
    return Path(os.environ.get("RUNIFOLD_TEST_DIR", "."))


@step()
async def a(n: int) -> int:
    return n + 1


@step()
async def b(n: int) -> int:
    return n * 2


@step()
async def slow(tag: str) -> str:
    (_dir() / f"started-{tag}-{os.getpid()}").touch()
    await asyncio.sleep(float(os.environ.get("RUNIFOLD_TEST_SLOW", "0")))
    return tag


@workflow("steps")
async def steps(ctx: WorkflowContext, n: int) -> int:
    return await b(await a(n))


@workflow("gated")
async def gated(ctx: WorkflowContext, n: int) -> Any:
    first = await a(n)
    approval = await ctx.wait_signal("approval")
    return {"first": await b(first), "approval": approval}


@workflow("slow")
async def slow_wf(ctx: WorkflowContext, tag: str) -> str:
    return await slow(tag)


@step()
def slow_in_a_thread(tag: str) -> str:
    (_dir() / f"started-{tag}-{os.getpid()}").touch()
    time.sleep(float(os.environ.get("RUNIFOLD_TEST_SLOW", "0")))  # a plain def: nothing can interrupt it
    return tag


@workflow("slow-thread")
async def slow_thread_wf(ctx: WorkflowContext, tag: str) -> str:
    return await slow_in_a_thread(tag)


@effect(resume=ResumePolicy.MANUAL)
async def notify(key: str, n: int) -> str:
    marker = _dir() / "notify-called"
    if not marker.exists():
        marker.touch()
        raise EffectOutcomeUnknown("smtp server hung up")
    return f"sent {n}"


@workflow("notifying")
async def notifying(ctx: WorkflowContext, n: int) -> str:
    return await notify(n)


@step(retry=RetryPolicy(max_attempts=1))
async def fragile(n: int) -> int:
    if not (_dir() / "fixed").exists():
        raise ValueError(f"cannot handle {n} yet")
    return n * 10


@workflow("fragile")
async def fragile_wf(ctx: WorkflowContext, n: int) -> int:
    return await fragile(n)


@workflow("timeboxed")
async def timeboxed(ctx: WorkflowContext, n: int) -> int:
    return n


@step()
async def blocks_the_loop(tag: str) -> str:
    (_dir() / f"blocking-{tag}-{time.monotonic_ns()}").touch()
    time.sleep(float(os.environ.get("RUNIFOLD_TEST_BLOCK", "0")))  # a mistake: blocking in an async def
    return tag


@workflow("blocking")
async def blocking_wf(ctx: WorkflowContext, tag: str) -> list[str]:
    return [await blocks_the_loop(f"{tag}-{i}") for i in range(3)]


DEFINITIONS = [
    WorkflowDefinition(steps),
    WorkflowDefinition(gated, signals={"approval": {"alice"}}),
    WorkflowDefinition(slow_wf),
    WorkflowDefinition(notifying),
    WorkflowDefinition(fragile_wf),
    WorkflowDefinition(slow_thread_wf),
    WorkflowDefinition(timeboxed, Budget(max_elapsed=timedelta(hours=1))),
    WorkflowDefinition(blocking_wf),
]
registry = WorkflowRegistry(*DEFINITIONS)


@workflow("gated")
async def gated_changed(ctx: WorkflowContext, n: int) -> Any:
    first = await b(n)  # a step was replaced: histories recorded with `a` diverge
    approval = await ctx.wait_signal("approval")
    return {"first": first, "approval": approval}


changed = WorkflowRegistry(DEFINITIONS[0], WorkflowDefinition(gated_changed, signals={"approval": {"alice"}}),
                           *DEFINITIONS[2:])
