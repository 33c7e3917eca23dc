"""Approval: a run waits for a signed ``approval`` signal, with a timeout.

Run with ``.venv/bin/python examples/approval.py``. It enqueues an order,
runs a worker until the run suspends (no process waits for the signal),
signs the approval with alice's own key and delivers it through the gateway,
which verifies it against the deployment's key ring; shows that a copy with
a forged signature and a key file with a made-up secret under alice's name
are both refused; runs a worker again to finish, and prints the audit.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runifold import (  # noqa: E402
    HmacKeyRing,
    LeaseDuration,
    Outcome,
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


# Only alice may approve. Her key signs (in a deployment: the file `runifold keys new` writes,
# which only she holds); the deployment's key ring is what the gateway verifies against
# (in a deployment: the file the operator keeps, `runifold keys add --keys RING alice.key`).
registry = WorkflowRegistry(WorkflowDefinition(order_approval, signals={"approval": {"alice"}}))
alice_key = HmacKeyRing()
alice_key.add("alice-2026", "alice", b"alice-demo-secret-change-me!")
keys = HmacKeyRing()
keys.merge(alice_key)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def show(outcome: Outcome) -> str:
    """An outcome with its times as ISO-8601 UTC."""
    parts = []
    for f in fields(outcome):
        value = getattr(outcome, f.name)
        parts.append(f"{f.name}={iso(value) if f.name in ('until', 'retry_at') and value else value!r}")
    return f"{type(outcome).__name__}({', '.join(parts)})"


async def main(url: str = "sqlite:///runifold-approval.db") -> None:
    store = await open_store(url)
    try:
        await store.enqueue(WorkflowTask("order-approval", 1, {"order_id": "ord_7"}, checkpoint_id="ord_7"))
        worker = WorkflowWorker(store, registry, WorkerId.parse("worker-1"), LeaseDuration(timedelta(seconds=30)),
                                timedelta(seconds=10))
        print("worker:", show(await worker.run_once()))

        def envelope(signal_id: str, reason: str) -> SignalEnvelope:
            return SignalEnvelope(target="ord_7", name="approval", payload={"approved": True}, signal_id=signal_id,
                                  sender="alice", reason=reason, key_id="alice-2026", timestamp=time.time())

        approval = sign(envelope("approve-ord_7", "stock checked"), alice_key.secret_of("alice-2026"))
        gateway = SignalGateway(store, registry, keys)
        for label in ("signal:", "again: "):  # the same signal_id twice: a duplicate, recorded once
            receipt = await gateway.send(approval)
            print(label, f"{receipt.signal_id} to {receipt.run_id} at {iso(receipt.received_at)}, "
                         f"duplicate={receipt.duplicate}, run is {receipt.run_status}")
        made_up = HmacKeyRing()  # someone's own key file claiming alice's key id with a secret of their choosing
        made_up.add("alice-2026", "alice", b"not-alices-secret-at-all")
        attempts = {
            "forged:": msgspec.structs.replace(envelope("forged-1", "trust me"), signature="AAAA"),
            "made-up key:": sign(envelope("forged-2", "trust me too"), made_up.secret_of("alice-2026")),
        }
        for label, attempt in attempts.items():
            try:
                await gateway.send(attempt)
            except SignalRejectedError as exc:
                print(label, exc)

        print("worker:", show(await worker.run_once()))
        print("\naudit of ord_7:")
        for record in await store.audit("ord_7"):
            print(f"  {iso(record.at)} {record.verdict:<24} sender={record.sender:<6} signal_id={record.signal_id:<14} "
                  f"reason={record.reason!r} {record.detail}")
    finally:
        await store.close()


if __name__ == "__main__":
    for suffix in ("", "-wal", "-shm"):
        Path(f"runifold-approval.db{suffix}").unlink(missing_ok=True)
    asyncio.run(main(*sys.argv[1:]))
