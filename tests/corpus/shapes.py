"""One workflow that runs any *shape*: a tree of steps, waits, values and concurrency, given as its input.

A shape is JSON, so hypothesis can generate it and a run records it:

* ``{"step": "tag", "fails": k}``: a step whose first ``k`` attempts raise (3 attempts, no backoff:
  ``k >= 3`` makes it fail for good, raising ``StepFailedError`` into the workflow);
* ``{"wait": "go"}``: a signal wait; ``{"sleep": ms}``: a durable timer;
* ``{"value": "uuid" | "now" | "random"}`` and ``{"charge": n}``: recorded values;
* ``{"asleep": ms}``: ``asyncio.sleep`` (a durable timer too); ``{"within": ms, "do": shape}``: ``shape``
  under ``asyncio.wait_for`` (its timer is durable; a timeout cancels what is left of ``shape``);
* ``{"seq": [shape, ...]}``: one after another; ``{"gather": [shape, ...], "rx": bool}``: concurrently
  (``rx``: ``return_exceptions=True``); ``{"group": [shape, ...]}``: an ``asyncio.TaskGroup``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from runifold import RetryPolicy, WorkflowContext, WorkflowDefinition, WorkflowRegistry, step, workflow
from tests.corpus.patterns import attempt, seen


@step(retry=RetryPolicy(max_attempts=3, initial=timedelta(0)))
async def shape_step(run: str, tag: str, fails: int) -> str:
    seen(run, tag)
    n = attempt(run, tag)
    if n <= fails:
        raise RuntimeError(f"{tag} attempt {n} fails")
    return f"{tag}:{n > 1}"


async def perform(ctx: WorkflowContext, node: dict[str, Any], trace: list[str]) -> Any:
    """Run one node; every leaf that completes appends to ``trace``, so the interleaving of branches is the output."""
    if "step" in node:
        out = await shape_step(ctx.run_id, node["step"], node["fails"])
        trace.append(node["step"])
        return out
    if "wait" in node:
        payload = await ctx.wait_signal(node["wait"])
        trace.append(f"wait{len(trace)}")
        return payload
    if "sleep" in node:
        await ctx.sleep(timedelta(milliseconds=node["sleep"]))
        trace.append(f"sleep{node['sleep']}")
        return "slept"
    if "value" in node:
        match node["value"]:
            case "uuid":
                return len(str(ctx.uuid()))
            case "now":
                return ctx.now().year > 2000
            case _:
                return 0 <= ctx.random() < 1
    if "charge" in node:
        ctx.charge(node["charge"])
        return "charged"
    if "within" in node:
        try:
            return await asyncio.wait_for(perform(ctx, node["do"], trace), node["within"] / 1000)
        except TimeoutError:
            trace.append(f"timeout{node['within']}")
            return "timed out"
    if "asleep" in node:
        await asyncio.sleep(node["asleep"] / 1000)
        return "asleep"
    if "seq" in node:
        return [await perform(ctx, child, trace) for child in node["seq"]]
    if "gather" in node:
        results = await asyncio.gather(*(perform(ctx, child, trace) for child in node["gather"]),
                                       return_exceptions=node.get("rx", False))
        return [f"raised {type(r).__name__}" if isinstance(r, BaseException) else r for r in results]
    if "group" in node:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(perform(ctx, child, trace)) for child in node["group"]]
        return [t.result() for t in tasks]
    raise ValueError(f"unknown shape {node!r}")


@workflow("shape")
async def shaped(ctx: WorkflowContext, shape: dict[str, Any]) -> Any:
    trace: list[str] = []
    result = await perform(ctx, shape, trace)
    return {"result": result, "trace": trace}


registry = WorkflowRegistry(WorkflowDefinition(shaped, signals={"go": {"*"}}))
