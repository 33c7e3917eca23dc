"""Payment: an effect that reconciles against a (local, fake) payment provider.

Run with ``.venv/bin/python examples/payment.py``. Three orders:

* ``ord_1`` charges normally;
* ``ord_2``'s charge times out at the gateway after the provider applied it:
  the outcome is unknown, reconcile finds the charge by idempotency key, and the
  effect is *replayed* (the card is not charged twice);
* ``ord_3``'s charge times out and the provider cannot be asked: the effect is
  *ambiguous*, the run is parked, and an operator resolves it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runifold import (  # noqa: E402
    CapabilitySet,
    EffectOutcomeUnknown,
    Evidence,
    LeaseDuration,
    Resolution,
    ResumePolicy,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
    effect,
    open_store,
    resolve_effect,
    step,
    workflow,
)


class Receipt(msgspec.Struct):
    charge_id: str
    amount: int


def charge_id(key: str) -> str:
    return f"ch_{zlib.crc32(key.encode()):08x}"


class FakeProvider:
    """Applies each idempotency key at most once; can lose answers or be unreachable."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.applications = 0
        self.lose_answer_for: set[str] = set()
        self.unreachable_for: set[str] = set()

    def charge(self, key: str, order_id: str, amount: int) -> Receipt:
        if key not in self.charges:
            self.charges[key] = amount
            self.applications += 1
        if order_id in self.lose_answer_for:
            self.lose_answer_for.discard(order_id)
            raise TimeoutError("gateway timed out after the provider applied the charge")
        return Receipt(charge_id(key), amount)

    def find(self, key: str, order_id: str) -> Evidence:
        if order_id in self.unreachable_for:
            return Evidence.unknown("provider status API unreachable")
        if key in self.charges:
            return Evidence.applied(Receipt(charge_id(key), self.charges[key]), "found by idempotency key")
        return Evidence.not_applied("no charge with this key")


provider = FakeProvider()


async def find_charge(key: str, order_id: str, amount: int) -> Evidence:
    return provider.find(key, order_id)


@effect(resume=ResumePolicy.RECONCILE, reconcile=find_charge, requires="payments", timeout=timedelta(seconds=10))
async def charge_card(key: str, order_id: str, amount: int) -> Receipt:
    if order_id in provider.unreachable_for:
        raise EffectOutcomeUnknown("connection dropped mid-request")
    return provider.charge(key, order_id, amount)


@step()
async def send_receipt(order_id: str, charge_id: str) -> str:
    return f"receipt {charge_id} sent for {order_id}"


@workflow("payment", version=1)
async def payment(ctx: WorkflowContext, order_id: str, amount: int) -> dict[str, Any]:
    receipt = await charge_card(order_id, amount)
    note = await send_receipt(order_id, receipt.charge_id)
    return {"order_id": order_id, "charge_id": receipt.charge_id, "note": note}


registry = WorkflowRegistry(WorkflowDefinition(payment, capabilities=CapabilitySet("payments")))


async def main(url: str = "sqlite:///runifold-payment.db") -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    store = await open_store(url)
    worker = WorkflowWorker(store, registry, WorkerId.parse("worker-1"), LeaseDuration(timedelta(seconds=30)),
                            timedelta(seconds=10))
    try:
        provider.lose_answer_for.add("ord_2")
        provider.unreachable_for.add("ord_3")
        for order in ("ord_1", "ord_2", "ord_3"):
            await store.enqueue(WorkflowTask("payment", 1, {"order_id": order, "amount": 1250}, checkpoint_id=order))
            print(f"{order}: {await worker.run_once()}")
        print(f"\nprovider applied {provider.applications} charge(s) for 2 settled orders")
        print("\nord_2 history:", [e.type for e in await store.history("ord_2")])
        print("ord_3 history:", [e.type for e in await store.history("ord_3")])

        # The operator checks the provider's console and finds no charge: retry it with the same key.
        provider.unreachable_for.discard("ord_3")
        await resolve_effect(store, registry, "ord_3", "charge_card#1", Resolution.RETRY, by="ops-alice",
                             reason="no charge in the provider console at 14:02")
        print(f"\nord_3 after resolution: {await worker.run_once()}")
        print(f"provider applied {provider.applications} charge(s) in total")
    finally:
        await store.close()


if __name__ == "__main__":
    for suffix in ("", "-wal", "-shm"):
        Path(f"runifold-payment.db{suffix}").unlink(missing_ok=True)
    asyncio.run(main(*sys.argv[1:]))
