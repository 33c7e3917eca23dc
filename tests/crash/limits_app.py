"""Workflows for the schedule and concurrency-limit process tests.

``tick`` is what a schedule starts: its step appends ``<checkpoint id> <pid>`` to
``RUNIFOLD_TEST_COUNTS``. The limited workflows' step appends ``<key> <run id>
start|end <time>`` to ``$RUNIFOLD_TEST_DIR/spans`` around a short sleep, so the
test can count how many runs of a key were inside their step at once.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from runifold import ConcurrencyLimit, WorkflowContext, WorkflowDefinition, WorkflowRegistry, step, workflow


@step()
async def record_tick(checkpoint_id: str) -> int:
    with open(os.environ["RUNIFOLD_TEST_COUNTS"], "a") as f:
        f.write(f"{checkpoint_id} {os.getpid()}\n")
    return os.getpid()


@workflow("tick")
async def tick(ctx: WorkflowContext) -> int:
    return await record_tick(ctx.checkpoint_id or "")


def _span(key: str, run_id: str, edge: str) -> None:
    with open(Path(os.environ["RUNIFOLD_TEST_DIR"]) / "spans", "a") as f:
        f.write(f"{key} {run_id} {edge} {time.time():.6f}\n")


@step()
async def occupy(key: str, run_id: str) -> str:
    _span(key, run_id, "start")
    await asyncio.sleep(0.2)
    _span(key, run_id, "end")
    return key


@workflow("payment")
async def payment(ctx: WorkflowContext, n: int) -> str:
    return await occupy("payments", ctx.run_id)


@workflow("customer-sync")
async def customer_sync(ctx: WorkflowContext, customer_id: str, n: int) -> str:
    return await occupy(f"customer:{customer_id}", ctx.run_id)


@workflow("free")
async def free(ctx: WorkflowContext, n: int) -> str:
    return await occupy("free", ctx.run_id)


registry = WorkflowRegistry(
    WorkflowDefinition(tick),
    WorkflowDefinition(payment, concurrency=ConcurrencyLimit(3, key="payments")),
    WorkflowDefinition(customer_sync, concurrency=ConcurrencyLimit(1, key=lambda i: f"customer:{i['customer_id']}")),
    WorkflowDefinition(free),
)
