"""Child workflows, started and awaited from an application with the client.

Run with ``.venv/bin/python examples/children.py [STORE_URL]`` (default: a SQLite
file in the current directory). An application starts a ``fulfil`` run and awaits
its result with the client; the run starts two child runs, ``bill`` and ``pack``,
waits for both (durably: it suspends meanwhile, and any worker may run the
children), and returns what they returned, typed. A ``Supervisor`` in the same
process plays the worker fleet.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runifold import (  # noqa: E402
    LeaseDuration,
    RunInfo,
    Supervisor,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowWorker,
    connect,
    step,
    workflow,
)


class Invoice(msgspec.Struct, frozen=True):
    order_id: str
    total_cents: int


class Parcel(msgspec.Struct, frozen=True):
    order_id: str
    items: int


class Fulfilment(msgspec.Struct, frozen=True):
    invoice: Invoice
    parcel: Parcel


@step()
async def charge(order_id: str, cents: int) -> Invoice:
    return Invoice(order_id, cents)


@step()
async def pick(order_id: str, items: int) -> Parcel:
    return Parcel(order_id, items)


@workflow("bill", version=1)
async def bill(ctx: WorkflowContext, order_id: str, cents: int) -> Invoice:
    return await charge(order_id, cents)


@workflow("pack", version=1)
async def pack(ctx: WorkflowContext, order_id: str, items: int) -> Parcel:
    await ctx.sleep(timedelta(milliseconds=200))  # the parent waits meanwhile, holding no worker
    return await pick(order_id, items)


@workflow("fulfil", version=1)
async def fulfil(ctx: WorkflowContext, order_id: str, cents: int, items: int) -> Fulfilment:
    billing = await ctx.start_child(bill, {"order_id": order_id, "cents": cents})
    packing = await ctx.start_child(pack, {"order_id": order_id, "items": items})
    invoice, parcel = await asyncio.gather(billing.result(), packing.result())
    return Fulfilment(invoice, parcel)


registry = WorkflowRegistry(WorkflowDefinition(bill), WorkflowDefinition(pack), WorkflowDefinition(fulfil))


async def main(url: str) -> None:
    async with await connect(url, registry) as client:
        worker = WorkflowWorker(client.store, registry, WorkerId.parse("worker-1"),
                                LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10))
        fleet = Supervisor(worker, concurrency=4, idle_wait=timedelta(milliseconds=50))
        running = asyncio.create_task(fleet.run(handle_signals=False))
        try:
            run = await client.start(fulfil, {"order_id": "ord_9", "cents": 4200, "items": 3}, checkpoint_id="ord_9")
            result = await run.result(timeout=30)
            print(f"fulfil ord_9 -> {result}")
            history = [e.type for e in await client.store.history(run.run_id)]
            print("parent history:", history)
            for key, child in (await _children(client.store, run.run_id)).items():
                print(f"child {key}: {child.name} v{child.version} {child.status} (parent {run.run_id})")
        finally:
            fleet.stop()
            await running


async def _children(store: WorkflowStore, run_id: str) -> dict[str, RunInfo]:
    from runifold.history import Entry, decode_event, fold

    entries = [Entry(e.seq, e.at, decode_event(e.body)) for e in await store.history(run_id)]
    return {key: await store.get_run(child) for key, child in fold(entries).children.items()}


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "sqlite:///runifold-children.db"
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        for suffix in ("", "-wal", "-shm"):
            Path(url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
    asyncio.run(main(url))
