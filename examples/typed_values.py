"""The types people use: a pydantic model as a workflow's input, dataclasses and Structs as step results and
signal payloads, a plain ``def`` step that blocks (it runs in a worker thread), a step with a timeout that is
retried, and log lines from step code that carry the run id and the call key.

Run with ``.venv/bin/python examples/typed_values.py [STORE_URL]`` (default: a SQLite file in the current
directory; needs pydantic: ``pip install 'runifold[pydantic]'``). An application starts a ``quote-order``
run with a client; an input that does not fit the model is refused before anything is stored. A
``Supervisor`` in the same process plays the worker fleet, and alice approves with a signed signal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import msgspec
import pydantic
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runifold import (  # noqa: E402
    HmacKeyRing,
    InvalidInputError,
    LeaseDuration,
    RetryPolicy,
    SignalEnvelope,
    SignalGateway,
    Supervisor,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowWorker,
    connect,
    sign,
    step,
    workflow,
)


class Order(pydantic.BaseModel):
    """The workflow's input: validated by pydantic when the run is started, and on every replay."""

    order_id: str
    quantity: int = pydantic.Field(gt=0)
    placed: datetime


@dataclasses.dataclass(frozen=True)
class Quote:
    order_id: str
    cents: int
    valid_until: datetime


class Approval(msgspec.Struct, frozen=True):
    approved: bool
    by: str


class Outcome(msgspec.Struct, frozen=True):
    quote: Quote
    reservation: str
    approved_by: str | None


attempts: Counter[str] = Counter()
log = structlog.get_logger("shop")


@step()
def price(order: Order) -> Quote:
    """A plain def: it runs in a worker thread, so blocking I/O is fine (the run's lease is renewed meanwhile)."""
    log.info("pricing", quantity=order.quantity)  # carries run_id and key: see the output
    time.sleep(0.05)
    return Quote(order.order_id, 1250 * order.quantity, order.placed + timedelta(days=7))


@step(timeout=timedelta(milliseconds=200), retry=RetryPolicy(max_attempts=3, initial=timedelta(0)))
async def reserve(order_id: str) -> str:
    attempts["reserve"] += 1
    if attempts["reserve"] == 1:
        await asyncio.sleep(5)  # the first attempt hangs: its timeout fails it, and the policy retries it
    return f"res-{order_id}"


@workflow("quote-order")
async def quote_order(ctx: WorkflowContext, order: Order) -> Outcome:
    quote = await price(order)  # a Quote, live and on replay alike
    reservation = await reserve(order.order_id)
    approval = await ctx.wait_signal("approval", type=Approval, timeout=timedelta(days=1))
    return Outcome(quote, reservation, approval.by if approval.approved else None)


registry = WorkflowRegistry(WorkflowDefinition(quote_order, signals={"approval": {"alice"}}))

# alice's key: in a deployment, `runifold keys new` writes her file and the workers' ring trusts it
alice = HmacKeyRing()
alice.add("alice-1", "alice", HmacKeyRing.new_secret())


async def main(url: str) -> None:
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                                    structlog.processors.JSONRenderer(sort_keys=True)],
                        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    async with await connect(url, registry) as client:
        try:
            await client.start(quote_order, {"order": {"order_id": "q-0", "quantity": 0, "placed": "2026-12-01T09:00:00Z"}})
        except InvalidInputError as exc:
            print(f"refused: {exc}")
        worker = WorkflowWorker(client.store, registry, WorkerId.parse("worker-1"),
                                LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10))
        fleet = Supervisor(worker, concurrency=2, idle_wait=timedelta(milliseconds=50))
        running = asyncio.create_task(fleet.run(handle_signals=False))
        try:
            order = {"order_id": "q-1", "quantity": 3, "placed": "2026-12-01T09:00:00Z"}
            run = await client.start(quote_order, {"order": order}, checkpoint_id="q-1")
            while (await run.status()).status != "waiting":  # suspended on the approval: no process holds it
                await asyncio.sleep(0.05)
            envelope = SignalEnvelope(target="q-1", name="approval", payload=Approval(approved=True, by="alice"),
                                      signal_id="approve-q-1", sender="alice", reason="price checked",
                                      key_id="alice-1", timestamp=time.time())
            await SignalGateway(client.store, registry, alice).send(sign(envelope, alice.secret_of("alice-1")))
            result = await run.result(timeout=30)
            print(f"quote-order q-1 -> {result}")
            print("types:", type(result).__name__, type(result.quote).__name__, type(result.quote.valid_until).__name__)
            history = [(e.type, e.key) for e in await client.store.history(run.run_id) if e.key.startswith("reserve")]
            print("reserve:", history)
        finally:
            fleet.stop()
            await running


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "sqlite:///runifold-types.db"
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        for suffix in ("", "-wal", "-shm"):
            Path(url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
    asyncio.run(main(url))
