"""Workflows for the ui tests, and a store filled by running them: a run in every status, signal attempts.

``registry`` is today's code (what ``runifold ui --app`` loads); ``yesterday``
differs in one workflow, ``evolving``, whose run recorded with it diverges
from today's code.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from runifold import (
    EffectOutcomeUnknown,
    Evidence,
    HmacKeyRing,
    Idle,
    LeaseDuration,
    ResumePolicy,
    RetryPolicy,
    RunStatus,
    SignalEnvelope,
    SignalGateway,
    SignalRejectedError,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
    cancel_run,
    effect,
    sign,
    step,
    workflow,
)

#: a sender and reason chosen to break a page that interprets what it shows: an ANSI escape, HTML, a script
HOSTILE_SENDER = "mallory\x1b[31m<script>document.title='pwned'</script>"
HOSTILE_REASON = "<img src=x onerror=\"document.title='pwned'\">\x1b[2J\x1b[H urgent"
ALICE_SECRET, WRONG_SECRET = b"a" * 32, b"f" * 32
BULK = 1_000
#: a checkpoint id no run has: a signal sent to it is rejected and audited under this reference
GHOST = "ghost-order"


@step()
async def add(n: int) -> int:
    return n + 1


@step()
async def double(n: int) -> int:
    return n * 2


@workflow("steps")
async def steps(ctx: WorkflowContext, n: int) -> int:
    return await double(await add(n))


@workflow("bulk")
async def bulk(ctx: WorkflowContext, n: int) -> int:
    return await add(n)


@workflow("approval")
async def approval(ctx: WorkflowContext, n: int) -> Any:
    first = await add(n)
    decision = await ctx.wait_signal("approval", timeout=timedelta(days=2))
    return {"first": first, "decision": decision}


@step(retry=RetryPolicy(max_attempts=2, initial=timedelta(milliseconds=1), jitter=0))
async def parse_amount(text: str) -> int:
    return int(text)  # "12 EUR" raises ValueError: the run fails with this traceback


@workflow("parsing")
async def parsing(ctx: WorkflowContext, text: str) -> int:
    return await parse_amount(text)


async def find_charge(key: str, order_id: str, amount: int) -> Evidence:
    return Evidence.unknown("the provider's search API timed out")


@effect(resume=ResumePolicy.RECONCILE, reconcile=find_charge)
async def charge_card(key: str, order_id: str, amount: int) -> dict[str, Any]:
    raise EffectOutcomeUnknown("connection reset after the charge request was sent")


@workflow("payment")
async def payment(ctx: WorkflowContext, order_id: str, amount: int) -> Any:
    return await charge_card(order_id, amount)


@workflow("evolving")
async def evolving_v1(ctx: WorkflowContext, n: int) -> int:
    first = await add(n)
    await ctx.sleep(timedelta(days=1))
    return first


@workflow("evolving")
async def evolving_today(ctx: WorkflowContext, n: int) -> int:
    first = await double(n)  # `add` was replaced: a history recorded with it diverges at add#1
    await ctx.sleep(timedelta(days=1))
    return first


@workflow("family")
async def family(ctx: WorkflowContext, n: int) -> int:
    return await ctx.run_child(steps, {"n": n})


COMMON = [WorkflowDefinition(steps), WorkflowDefinition(bulk), WorkflowDefinition(parsing), WorkflowDefinition(family),
          WorkflowDefinition(payment), WorkflowDefinition(approval, signals={"approval": {"alice"}})]
registry = WorkflowRegistry(*COMMON, WorkflowDefinition(evolving_today))
yesterday = WorkflowRegistry(*COMMON, WorkflowDefinition(evolving_v1))


@dataclass
class Filled:
    """What :func:`fill` made: checkpoint ids by the status they reached, and the audit it caused."""

    refs: dict[RunStatus, str] = field(default_factory=dict)
    approved: str = "approve-1"  # a completed run resumed by alice's signal
    rejections: list[str] = field(default_factory=list)


def _worker(store: WorkflowStore, workflows: WorkflowRegistry) -> WorkflowWorker:
    return WorkflowWorker(store, workflows, WorkerId.parse("ui-test-worker"), LeaseDuration(timedelta(seconds=30)),
                          timedelta(seconds=10))


async def _enqueue(store: WorkflowStore, name: str, checkpoint_id: str, key: str | None = None,
                   **data: Any) -> None:
    await store.enqueue(registry.validate(WorkflowTask(name, 1, data, checkpoint_id, concurrency_key=key,
                                                       concurrency_limit=2 if key else None)))


async def _until(store: WorkflowStore, worker: WorkflowWorker, targets: dict[str, RunStatus]) -> None:
    """Run ``worker`` until every run of ``targets`` has its status (retries are due within milliseconds)."""
    deadline = time.monotonic() + 60
    while True:
        now = {ref: (await store.get_run(ref)).status for ref in targets}
        if now == targets:
            return
        assert time.monotonic() < deadline, now
        if isinstance(await worker.run_once(), Idle):
            await asyncio.sleep(0.01)


def _envelope(target: str, signal_id: str, *, sender: str = "alice", reason: str = "stock checked by phone",
              secret: bytes = ALICE_SECRET) -> SignalEnvelope:
    return sign(SignalEnvelope(target=target, name="approval", payload={"approved": True}, signal_id=signal_id,
                               sender=sender, reason=reason, key_id="alice-1", timestamp=time.time()), secret)


async def fill(store: WorkflowStore, *, bulk_runs: int = BULK) -> Filled:
    """Fill ``store`` by running the workflows: every status, signal attempts, and ``bulk_runs`` ready runs."""
    filled = Filled()
    await _enqueue(store, "steps", "order-done", n=1)
    await _enqueue(store, "approval", "approve-waiting", n=2)
    await _enqueue(store, "approval", filled.approved, n=3)
    await _enqueue(store, "parsing", "parse-failed", text="12 EUR")
    await _enqueue(store, "payment", "pay-parked", order_id="ord_7", amount=1250)
    await _enqueue(store, "payment", "pay-cancelled", order_id="ord_8", amount=990)
    await _enqueue(store, "evolving", "evolving-diverged", n=4)
    await _enqueue(store, "family", "family-done", n=8)  # a parent with a child run
    await _enqueue(store, "steps", "order-cancelled", n=5)
    await cancel_run(store, "order-cancelled", by="ops-carol", reason="customer withdrew the order")
    await _until(store, _worker(store, yesterday), {
        "order-done": RunStatus.COMPLETED, "family-done": RunStatus.COMPLETED,
        "approve-waiting": RunStatus.WAITING, filled.approved: RunStatus.WAITING,
        "parse-failed": RunStatus.FAILED, "pay-parked": RunStatus.PARKED, "pay-cancelled": RunStatus.PARKED,
        "evolving-diverged": RunStatus.WAITING})
    await cancel_run(store, "pay-cancelled", by="ops-carol", reason="order withdrawn")  # its effect stays in doubt

    ring = HmacKeyRing()
    ring.add("alice-1", "alice", ALICE_SECRET)
    gateway = SignalGateway(store, registry, ring)
    for envelope in (_envelope(filled.approved, "sig-forged", secret=WRONG_SECRET),
                     _envelope(filled.approved, "sig-hostile", sender=HOSTILE_SENDER, reason=HOSTILE_REASON),
                     _envelope(GHOST, "sig-ghost")):
        try:
            await gateway.send(envelope)
        except SignalRejectedError as exc:
            filled.rejections.append(exc.verdict)
    await gateway.send(_envelope(filled.approved, "sig-ok"))
    assert (await gateway.send(_envelope(filled.approved, "sig-ok"))).duplicate

    await store.wake("evolving-diverged")  # its timer is due now: today's code claims it and diverges
    await _until(store, _worker(store, registry), {filled.approved: RunStatus.COMPLETED,
                                                   "evolving-diverged": RunStatus.DIVERGED})
    await _enqueue(store, "steps", "order-running", n=7)  # after the workers: nobody drives it
    claim = await store.claim("ui-test-holder", {"steps"}, 3_600)  # held, never driven: running
    assert claim is not None and claim.checkpoint_id == "order-running"
    await _enqueue(store, "steps", "order-stalled", n=8)  # held by a worker that died: its lease runs out
    stalled = await store.claim("ui-dead-worker", {"steps"}, 0.01)
    assert stalled is not None and stalled.checkpoint_id == "order-stalled"
    await _enqueue(store, "steps", "order-ready", key="orders", n=6)  # after the claim: nobody claims it
    filled.refs = {RunStatus.COMPLETED: "order-done", RunStatus.WAITING: "approve-waiting",
                   RunStatus.FAILED: "parse-failed", RunStatus.PARKED: "pay-parked",
                   RunStatus.DIVERGED: "evolving-diverged", RunStatus.CANCELLED: "order-cancelled",
                   RunStatus.RUNNING: "order-running", RunStatus.READY: "order-ready"}
    await store.enqueue_many([WorkflowTask("bulk", 1, {"n": i}, f"bulk-{i:04d}") for i in range(bulk_runs)])
    return filled
