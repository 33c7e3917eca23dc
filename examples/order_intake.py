"""Order intake: the README's demo, on the embedded SQLite store.

Run it with ``make demo`` (or ``python examples/order_intake.py``). It enqueues
one order, runs one worker claim cycle, prints the outcome and the run's
history, then runs the worker again on the same checkpoint id to show that a
finished run is not repeated.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runifold import (  # noqa: E402
    Budget,
    CapabilitySet,
    LeaseDuration,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
    step,
    workflow,
)
from runifold.stores.sqlite import SqliteWorkflowStore  # noqa: E402


class Stock(msgspec.Struct):
    sku: str
    reserved: int


@step()
async def reserve_stock(order_id: str) -> Stock:
    return Stock(sku=f"sku-{order_id}", reserved=2)


@step()
async def price_order(stock: dict[str, object]) -> dict[str, int]:
    return {"subtotal": 2 * 1250, "shipping": 499}


@step(requires="email")
async def send_confirmation(order_id: str, total: int) -> str:
    return f"confirmation for {order_id}: {total / 100:.2f} EUR"


@workflow("order-intake", version=1)
async def order_intake(ctx: WorkflowContext, order_id: str) -> dict[str, object]:
    stock = await reserve_stock(order_id)
    price = await price_order(msgspec.to_builtins(stock))
    total = price["subtotal"] + price["shipping"]
    note = await send_confirmation(order_id, total)
    return {"order_id": order_id, "sku": stock.sku, "total": total, "note": note, "accepted_at": ctx.now().isoformat()}


registry = WorkflowRegistry(WorkflowDefinition(order_intake, Budget(max_steps=20), CapabilitySet("email")))


def print_history(rows: list) -> None:  # type: ignore[type-arg]
    print(f"{'seq':>3}  {'at (UTC)':<12}  {'event':<16}  {'key':<22}  data")
    for row in rows:
        at = datetime.fromtimestamp(row.at, UTC).strftime("%H:%M:%S.%f")[:12]
        body = msgspec.json.decode(row.body)
        data = {k: v for k, v in body.items() if k not in ("type", "key")}
        print(f"{row.seq:>3}  {at:<12}  {row.type:<16}  {row.key:<22}  {msgspec.json.encode(data).decode()[:70]}")


async def main(path: str = "runifold-workflows.db") -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    store = await SqliteWorkflowStore.open(path)
    try:
        await store.enqueue(WorkflowTask("order-intake", 1, {"order_id": "ord_42"}, checkpoint_id="ord_42"))
        worker = WorkflowWorker(store, registry, WorkerId.parse("worker-local-1"),
                                LeaseDuration(timedelta(seconds=30)), renew_every=timedelta(seconds=10))
        print(await worker.run_once())
        print()
        print_history(await store.history("ord_42"))
        print()
        again = await store.enqueue(WorkflowTask("order-intake", 1, {"order_id": "ord_42"}, checkpoint_id="ord_42"))
        print(f"enqueue ord_42 again -> same run {again.run_id}, created={again.created}")
        print(f"next claim -> {await worker.run_once()}")
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
