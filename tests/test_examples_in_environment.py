"""The examples' workflows, tested the way docs/testing.md shows: in a WorkflowEnvironment, with time skipped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runifold import RunStatus, SignalRejectedError
from runifold.testing import WorkflowEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import approval  # noqa: E402
import children  # noqa: E402
import order_intake  # noqa: E402


async def test_order_intake_completes_and_replays() -> None:
    """The demo workflow reserves, prices and confirms an order."""
    async with WorkflowEnvironment(order_intake.registry) as env:
        run = await env.start(order_intake.order_intake, {"order_id": "ord_1"})
        result = await env.result(run)
        assert result["order_id"] == "ord_1" and result["total"] == 2999
        await env.assert_replays()


async def test_approval_waits_for_alice_and_expires_without_her() -> None:
    """Only alice may approve; without an answer the two-day wait expires, in no time."""
    async with WorkflowEnvironment(approval.registry) as env:
        approved = await env.start(approval.order_approval, {"order_id": "o1"})
        assert (await env.run_until_suspended(approved)).status is RunStatus.WAITING
        with pytest.raises(SignalRejectedError):
            await env.signal(approved, "approval", {"approved": True}, sender="mallory")
        await env.signal(approved, "approval", {"approved": True}, sender="alice")
        assert (await env.result(approved))["status"] == "shipped"
        expired = await env.start(approval.order_approval, {"order_id": "o2"})
        assert await env.result(expired) == {"order_id": "o2", "status": "expired"}
        await env.assert_replays()


async def test_children_return_typed_results() -> None:
    """The parent gets its two children's results, typed, and nothing runs twice."""
    async with WorkflowEnvironment(children.registry) as env:
        run = await env.start(children.fulfil, {"order_id": "ord_9", "cents": 4200, "items": 3})
        result = await env.result(run)
        assert result == children.Fulfilment(children.Invoice("ord_9", 4200), children.Parcel("ord_9", 3))
        assert await env.store.count_runs(name="bill") == 1 and await env.store.count_runs(name="pack") == 1
        await env.assert_replays()
