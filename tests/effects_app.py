"""Workflows with effects against a fake payment provider that lives outside the worker process.

The provider is a SQLite file: it applies each idempotency key at most once and
counts real applications and body calls, so tests can check exactly-once
application across real process crashes. Files in ``RUNIFOLD_TEST_DIR`` steer
the body: ``block-before-apply`` / ``block-after-apply`` make it wait (after
touching ``inflight`` / ``applied``), ``provider-down`` makes reconcile find
no evidence either way, ``timeout`` makes the body hang past its timeout.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

from runifold import (
    CapabilitySet,
    EffectFailedError,
    Evidence,
    ResumePolicy,
    RetryPolicy,
    StepFailedError,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    effect,
    step,
    workflow,
)


def _dir() -> Path:
    return Path(os.environ["RUNIFOLD_TEST_DIR"])


def provider() -> sqlite3.Connection:
    conn = sqlite3.connect(_dir() / "provider.db", timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, order_id TEXT, amount INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT)")
    return conn


def provider_counts() -> tuple[int, int]:
    """Return (real applications, body calls) seen by the provider."""
    with provider() as conn:
        applied = conn.execute("SELECT count(*) FROM charges").fetchone()[0]
        calls = conn.execute("SELECT count(*) FROM calls").fetchone()[0]
    return applied, calls


async def _hold(name: str) -> None:
    while (_dir() / name).exists():
        await asyncio.sleep(0.02)


async def _charge(key: str, order_id: str, amount: int) -> dict[str, Any]:
    conn = provider()
    conn.execute("INSERT INTO calls VALUES (?)", (key,))
    (_dir() / "inflight").touch()
    await _hold("block-before-apply")
    if (_dir() / "timeout").exists():
        await asyncio.sleep(30)
    conn.execute("INSERT OR IGNORE INTO charges VALUES (?, ?, ?)", (key, order_id, amount))  # idempotent by key
    conn.close()
    (_dir() / "applied").touch()
    await _hold("block-after-apply")
    return {"charge_id": f"ch_{key}", "amount": amount}


async def find_charge(key: str, order_id: str, amount: int) -> Evidence:
    if (_dir() / "provider-down").exists():
        return Evidence.unknown("payment provider unreachable")
    with provider() as conn:
        row = conn.execute("SELECT amount FROM charges WHERE key = ?", (key,)).fetchone()
    if row is None:
        return Evidence.not_applied("no charge with this idempotency key")
    return Evidence.applied({"charge_id": f"ch_{key}", "amount": row[0]}, "charge found by idempotency key")


@effect(id="charge_card", resume=ResumePolicy.RECONCILE, reconcile=find_charge, requires="payments",
        timeout=timedelta(seconds=1), retry=RetryPolicy(max_attempts=3, initial=timedelta(0)))
async def charge_reconcile(key: str, order_id: str, amount: int) -> dict[str, Any]:
    return await _charge(key, order_id, amount)


@effect(id="charge_card", resume=ResumePolicy.REPEAT, requires="payments", timeout=timedelta(seconds=1),
        retry=RetryPolicy(max_attempts=3, initial=timedelta(0)))
async def charge_repeat(key: str, order_id: str, amount: int) -> dict[str, Any]:
    return await _charge(key, order_id, amount)


@effect(id="charge_card", resume=ResumePolicy.MANUAL, requires="payments", timeout=timedelta(seconds=1))
async def charge_manual(key: str, order_id: str, amount: int) -> dict[str, Any]:
    return await _charge(key, order_id, amount)


@step()
async def prepare(order_id: str) -> str:
    (_dir() / "preparing").touch()
    await _hold("block-prepare")
    return order_id


def _payment_workflow(name: str, charge: Any) -> WorkflowDefinition:
    @workflow(name)
    async def pay(ctx: WorkflowContext, order_id: str, amount: int) -> dict[str, Any]:
        await prepare(order_id)
        try:
            receipt = await charge(order_id, amount)
        except EffectFailedError as exc:
            return {"status": "payment failed", "why": exc.reason}
        return {"status": "paid", "receipt": receipt}

    return WorkflowDefinition(pay, capabilities=CapabilitySet("payments"))


@step(retry=RetryPolicy(max_attempts=1))
async def withdraw(order_id: str) -> str:
    while not (_dir() / "applied").exists():  # the charge goes through before the order is withdrawn
        await asyncio.sleep(0.02)
    raise RuntimeError(f"order {order_id} was withdrawn")


@step()
async def note_withdrawal(order_id: str) -> str:
    (_dir() / "noted").touch()
    await _hold("block-noted")
    return order_id


def _abandoning_workflow(name: str, charge: Any) -> WorkflowDefinition:
    """The charge is abandoned: a sibling fails, the task group cancels it while its body runs, and the run
    goes on to note the withdrawal and finish; the charge must still get its outcome."""

    @workflow(name)
    async def withdrawn(ctx: WorkflowContext, order_id: str, amount: int) -> str:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(charge(order_id, amount))
                group.create_task(withdraw(order_id))
        except* StepFailedError:
            pass
        return await note_withdrawal(order_id)

    return WorkflowDefinition(withdrawn, capabilities=CapabilitySet("payments"))


PAY_RECONCILE = _payment_workflow("pay-reconcile", charge_reconcile)
PAY_REPEAT = _payment_workflow("pay-repeat", charge_repeat)
PAY_MANUAL = _payment_workflow("pay-manual", charge_manual)
PAY_UNGRANTED = WorkflowDefinition(_payment_workflow("pay-ungranted", charge_reconcile).fn)

ABANDON = [_abandoning_workflow(f"abandon-{policy}", charge)
           for policy, charge in (("reconcile", charge_reconcile), ("repeat", charge_repeat), ("manual", charge_manual))]

registry = WorkflowRegistry(PAY_RECONCILE, PAY_REPEAT, PAY_MANUAL, PAY_UNGRANTED, *ABANDON)
