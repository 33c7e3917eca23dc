"""Concurrency limits: at most N runs of a key at once, across every worker, enforced by the claim.

Run with ``.venv/bin/python examples/concurrency.py [STORE_URL]`` (default: a
SQLite file in the current folder). Payouts run at most two at once (the key
is the workflow's name); a customer's syncs run one at a time (the key comes
from the input). Two workers with six slots each take twelve runs; each step
notes when it starts and ends, and the example prints the most runs of each
key that were inside their step at the same time.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runifold import (  # noqa: E402
    Client,
    ConcurrencyLimit,
    LeaseDuration,
    Supervisor,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowWorker,
    open_store,
    step,
    workflow,
)

spans: list[tuple[str, str, float]] = []  # (key, "start" | "end", time)


@step()
async def work(key: str) -> str:
    spans.append((key, "start", time.monotonic()))
    await asyncio.sleep(0.2)
    spans.append((key, "end", time.monotonic()))
    return key


@workflow("payout", version=1)
async def payout(ctx: WorkflowContext, amount: int) -> str:
    return await work("payout")


@workflow("customer-sync", version=1)
async def customer_sync(ctx: WorkflowContext, customer_id: str) -> str:
    return await work(f"customer:{customer_id}")


registry = WorkflowRegistry(
    WorkflowDefinition(payout, concurrency=ConcurrencyLimit(2)),
    WorkflowDefinition(customer_sync, concurrency=ConcurrencyLimit(1, key=lambda input: f"customer:{input['customer_id']}")),
)


def most_at_once() -> dict[str, int]:
    now: dict[str, int] = defaultdict(int)
    most: dict[str, int] = defaultdict(int)
    for key, edge, _ in sorted(spans, key=lambda s: (s[2], s[1] == "start")):
        now[key] += 1 if edge == "start" else -1
        most[key] = max(most[key], now[key])
    return dict(most)


async def main(url: str) -> None:
    stores = [await open_store(url), await open_store(url)]
    try:
        client = Client(stores[0], registry)
        handles = [await client.start(payout, {"amount": 100 + i}) for i in range(6)]
        handles += [await client.start(customer_sync, {"customer_id": customer})
                    for customer in ("alice", "alice", "alice", "bob", "bob", "bob")]
        info = await handles[-1].status()
        print(f"a sync of bob carries key {info.concurrency_key!r} with limit {info.concurrency_limit}")
        supervisors = [Supervisor(WorkflowWorker(store, registry, WorkerId.parse(f"worker-{i}"),
                                                 LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10)),
                                  6, idle_wait=timedelta(seconds=0.05))
                       for i, store in enumerate(stores)]
        running = [asyncio.create_task(s.run(handle_signals=False)) for s in supervisors]
        started = time.monotonic()
        await asyncio.gather(*(handle.result(timeout=60) for handle in handles))
        elapsed = time.monotonic() - started
        for s in supervisors:
            s.stop()
        await asyncio.gather(*running)
        most = most_at_once()
        print(f"12 runs on 2 workers x 6 slots in {elapsed:.1f} s; most at once: " + ", ".join(
            f"{key} {count}" for key, count in sorted(most.items())) + " (limits: payout 2, each customer 1)")
    finally:
        for store in stores:
            await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///concurrency-example.db"))
