"""The drill's own workflows. Their names start with ``runifold-drill-``, so only drill workers claim them.

The drill steers them through files in ``RUNIFOLD_DRILL_DIR``: bodies record
each execution in ``counts``, touch a marker when in flight, and wait while a
``block-*`` file exists; the effect applies to a ledger (a SQLite file, at most
once per idempotency key) that its reconcile function reads as evidence.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

from runifold.dsl import Evidence, ResumePolicy, WorkflowContext, WorkflowDefinition, effect, step, workflow
from runifold.worker import WorkflowRegistry

STEPS = "runifold-drill-steps"
EFFECT = "runifold-drill-effect"
DEPLOY = "runifold-drill-deploy"


def _dir() -> Path:
    return Path(os.environ["RUNIFOLD_DRILL_DIR"])


def _count(name: str, checkpoint: str) -> None:
    with open(_dir() / "counts", "a") as f:
        f.write(f"{checkpoint} {name}\n")
        f.flush()
        os.fsync(f.fileno())


async def _hold(name: str) -> None:
    while (_dir() / name).exists():
        await asyncio.sleep(0.02)


def ledger() -> sqlite3.Connection:
    conn = sqlite3.connect(_dir() / "ledger.db", timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS writes (key TEXT PRIMARY KEY)")
    return conn


@step(id="drill_prepare")
async def prepare(checkpoint: str) -> int:
    _count("prepare", checkpoint)
    return 1


@step(id="drill_in_flight")
async def in_flight(checkpoint: str) -> int:
    _count("in_flight", checkpoint)
    (_dir() / f"in-flight-{checkpoint}").touch()
    await _hold(f"block-{checkpoint}")
    return 2


@step(id="drill_finish")
async def finish(checkpoint: str) -> int:
    _count("finish", checkpoint)
    return 3


@workflow(STEPS)
async def steps(ctx: WorkflowContext, checkpoint: str) -> int:
    return await prepare(checkpoint) + await in_flight(checkpoint) + await finish(checkpoint)


async def find_write(key: str, checkpoint: str) -> Evidence:
    if (_dir() / f"evidence-down-{checkpoint}").exists():
        return Evidence.unknown("the drill's ledger is marked unreachable")
    with ledger() as conn:
        found = conn.execute("SELECT 1 FROM writes WHERE key = ?", (key,)).fetchone()
    return Evidence.applied({"ledger_key": key}, "write found in the ledger") if found else Evidence.not_applied()


@effect(id="drill_write", resume=ResumePolicy.RECONCILE, reconcile=find_write)
async def write(key: str, checkpoint: str) -> dict[str, Any]:
    _count("write", checkpoint)
    with ledger() as conn:
        conn.execute("INSERT OR IGNORE INTO writes VALUES (?)", (key,))
    (_dir() / f"in-flight-{checkpoint}").touch()
    await _hold(f"block-{checkpoint}")
    return {"ledger_key": key}


@workflow(EFFECT)
async def effect_workflow(ctx: WorkflowContext, checkpoint: str) -> dict[str, Any]:
    return await write(checkpoint)


@workflow(DEPLOY, version=1)
async def deploy_v1(ctx: WorkflowContext, checkpoint: str) -> dict[str, Any]:
    await ctx.sleep(timedelta(seconds=2))
    return {"code": "v1"}


@workflow(DEPLOY, version=2)
async def deploy_v2(ctx: WorkflowContext, checkpoint: str) -> dict[str, Any]:
    return {"code": "v2"}


V1 = [WorkflowDefinition(steps), WorkflowDefinition(effect_workflow), WorkflowDefinition(deploy_v1)]
registry = WorkflowRegistry(*V1)
registry_v2 = WorkflowRegistry(*V1, WorkflowDefinition(deploy_v2))
