"""Approval: a run waits for a signed ``approval`` signal, with a timeout.

Run with ``.venv/bin/python examples/approval.py``. It enqueues an order,
runs a worker until the run suspends (no process waits for the signal),
signs and sends the approval as ``alice``, shows that a forged copy is
refused, runs a worker again to finish, and prints the audit.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runifold import (  # noqa: E402
    HmacKeyRing,
    LeaseDuration,
    SignalEnvelope,
    SignalGateway,
    SignalRejectedError,
    WaitTimeoutError,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
    open_store,
    sign,
    step,
    workflow,
)


@step()
async def ship(order_id: str) -> str:
    return f"shipment for {order_id}"


@workflow("order-approval", version=1)
async def order_approval(ctx: WorkflowContext, order_id: str) -> dict[str, Any]:
    try:
        decision = await ctx.wait_signal("approval", timeout=timedelta(days=2))
    except WaitTimeoutError:
        return {"order_id": order_id, "status": "expired"}
    if not decision.get("approved"):
        return {"order_id": order_id, "status": "rejected"}
    return {"order_id": order_id, "status": "shipped", "shipment": await ship(order_id)}


# Only alice may approve; the key ring maps key ids to senders and secrets.
registry = WorkflowRegistry(WorkflowDefinition(order_approval, signals={"approval": {"alice"}}))
keys = HmacKeyRing()
keys.add("alice-2026", "alice", b"alice-demo-secret-change-me!")


async def main(url: str = "sqlite:///runifold-approval.db") -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    store = await open_store(url)
    try:
        await store.enqueue(WorkflowTask("order-approval", 1, {"order_id": "ord_7"}, checkpoint_id="ord_7"))
        worker = WorkflowWorker(store, registry, WorkerId.parse("worker-1"), LeaseDuration(timedelta(seconds=30)),
                                timedelta(seconds=10))
        print("worker:", await worker.run_once())

        approval = sign(SignalEnvelope(target="ord_7", name="approval", payload={"approved": True},
                                       signal_id="approve-ord_7", sender="alice", reason="stock checked",
                                       key_id="alice-2026", timestamp=time.time()), keys.secret_of("alice-2026"))
        gateway = SignalGateway(store, registry, keys)
        print("signal:", await gateway.send(approval))
        print("again: ", await gateway.send(approval))  # same signal_id: a duplicate, recorded once
        forged = SignalEnvelope(target="ord_7", name="approval", payload={"approved": True}, signal_id="forged-1",
                                sender="alice", reason="trust me", key_id="alice-2026", timestamp=time.time(),
                                signature="AAAA")
        try:
            await gateway.send(forged)
        except SignalRejectedError as exc:
            print("forged:", exc)

        print("worker:", await worker.run_once())
        print("\naudit of ord_7:")
        for record in await store.audit("ord_7"):
            print(f"  {record.verdict:<24} sender={record.sender:<6} signal_id={record.signal_id:<14} "
                  f"reason={record.reason!r} {record.detail}")
    finally:
        await store.close()


if __name__ == "__main__":
    for suffix in ("", "-wal", "-shm"):
        Path(f"runifold-approval.db{suffix}").unlink(missing_ok=True)
    asyncio.run(main(*sys.argv[1:]))
