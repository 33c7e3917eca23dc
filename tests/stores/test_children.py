"""Child workflows on every store: a parent starts children, waits durably for their typed results or failures,
never starts a child twice however often it replays, and cancelling it cancels them."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from runifold import (
    RunNotFoundError,
    ChildFailedError,
    ConfigurationError,
    InvalidInputError,
    SignalGateway,
    SignalRejectedError,
    RunStatus,
    Supervisor,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    cancel_run,
    retry_run,
    step,
    workflow,
)
from runifold.history import ChildStarted, RunFailed, RunStarted, SignalReceived, fold
from runifold.stores import SignalDelivery
from runifold.worker import replay_run
from runifold.worker._admin import child_runs
from tests.stores.test_waits import envelope, keyring
from tests.support import entries, send_signal, worker

calls: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


class Invoice(msgspec.Struct, frozen=True):
    order_id: str
    total: int


@step()
async def bill(order_id: str, amount: int) -> Invoice:
    calls[f"bill-{order_id}"] += 1
    return Invoice(order_id, amount)


@workflow("billing")
async def billing(ctx: WorkflowContext, order_id: str, amount: int) -> Invoice:
    if amount < 0:
        raise ValueError("a negative amount")
    await ctx.sleep(timedelta(milliseconds=50))  # the parent waits durably meanwhile
    return await bill(order_id, amount)


@workflow("approved-billing")
async def approved_billing(ctx: WorkflowContext, order_id: str) -> str:
    await ctx.wait_signal("approve")
    return order_id


@workflow("orders")
async def orders(ctx: WorkflowContext, amounts: list[int]) -> dict[str, Any]:
    handles = [await ctx.start_child(billing, {"order_id": f"o{i}", "amount": a}) for i, a in enumerate(amounts)]
    results: list[Any] = []
    for handle in handles:
        try:
            invoice = await handle.result()
            results.append([type(invoice).__name__, invoice.total])
        except ChildFailedError as exc:
            results.append([exc.status, exc.error_type])
    together = await asyncio.gather(ctx.run_child(billing, {"order_id": "g1", "amount": 7}),
                                    ctx.run_child(billing, {"order_id": "g2", "amount": 8}))
    return {"results": results, "together": [i.total for i in together]}


@workflow("waits-on-a-child")
async def waits_on_a_child(ctx: WorkflowContext) -> str:
    return await ctx.run_child(approved_billing, {"order_id": "x"})


@workflow("outlives-its-child")
async def outlives_its_child(ctx: WorkflowContext) -> str:
    invoice = await ctx.run_child(billing, {"order_id": "p1", "amount": 3})
    await ctx.wait_signal("go")
    return invoice.order_id


@workflow("shares-a-child")
async def shares_a_child(ctx: WorkflowContext, n: int) -> str:
    invoice = await ctx.run_child(billing, {"order_id": "shared", "amount": 1}, checkpoint_id="shared-child")
    return invoice.order_id


@workflow("reads-a-child-often")
async def reads_a_child_often(ctx: WorkflowContext, amount: int) -> dict[str, Any]:
    handle = await ctx.start_child(billing, {"order_id": "often-a", "amount": amount})
    given_up = asyncio.create_task(handle.result())  # the first wait for the child's end, cancelled below
    await asyncio.sleep(0)
    sharing = asyncio.create_task(handle.result())  # waits with it, and on alone once it is cancelled
    await asyncio.sleep(0)
    given_up.cancel()
    first = await handle.result()
    second, third = await asyncio.gather(handle.result(), handle.result())
    fourth = await sharing
    # one checkpoint id twice: the same child run, two handles
    same = [await ctx.start_child(billing, {"order_id": "often-b", "amount": amount}, checkpoint_id="often-b")
            for _ in range(2)]
    fifth, sixth = await asyncio.gather(same[0].result(), same[1].result())
    seventh = await same[1].result()
    failing = await ctx.start_child(billing, {"order_id": "often-c", "amount": -1})
    errors = []
    for _ in range(2):
        try:
            await failing.result()
        except ChildFailedError as exc:
            errors.append(exc.error_type)
    invoices = [first, second, third, fourth, fifth, sixth, seventh]
    return {"totals": [i.total for i in invoices], "types": sorted({type(i).__name__ for i in invoices}),
            "same_run": same[0].run_id == same[1].run_id, "errors": errors}


@workflow("leaves-a-child")
async def leaves_a_child(ctx: WorkflowContext) -> str:
    child = await ctx.start_child(approved_billing, {"order_id": "left"})
    return child.run_id


@workflow("limited-parent")
async def limited_parent(ctx: WorkflowContext) -> str:
    return await ctx.run_child(approved_billing, {"order_id": "y"})


registry = WorkflowRegistry(WorkflowDefinition(billing), WorkflowDefinition(orders), WorkflowDefinition(limited_parent),
                            WorkflowDefinition(approved_billing, signals={"approve": {"*"}}),
                            WorkflowDefinition(waits_on_a_child, signals={"go": {"alice"}}),
                            WorkflowDefinition(outlives_its_child, signals={"go": {"*"}}),
                            WorkflowDefinition(shares_a_child), WorkflowDefinition(reads_a_child_often),
                            WorkflowDefinition(leaves_a_child))


async def run_until(store: Any, ref: str, status: RunStatus, timeout: float = 30) -> Any:
    supervisor = Supervisor(worker(store, *[registry.definition_for(n, v) for n, v in registry.versions()]), 4,
                            idle_wait=timedelta(seconds=0.02))
    running = asyncio.create_task(supervisor.run(handle_signals=False))
    try:
        async with asyncio.timeout(timeout):
            while (await store.get_run(ref)).status is not status:
                await asyncio.sleep(0.02)
    finally:
        supervisor.stop()
        await running
    return supervisor


async def test_a_parent_awaits_its_children_typed_results_and_failures(store: Any) -> None:
    """Children run as runs of their own; the parent gets their outputs (typed) or ChildFailedError, once each."""
    await store.enqueue(WorkflowTask("orders", 1, {"amounts": [5, -1, 9]}, checkpoint_id="p1"))
    await run_until(store, "p1", RunStatus.COMPLETED)
    history = await entries(store, "p1")
    done = [e.event for e in history][-1]
    assert msgspec.to_builtins(done)["output"] == {
        "results": [["Invoice", 5], ["failed", "ValueError"], ["Invoice", 9]], "together": [7, 8]}
    started = [e.event for e in history if isinstance(e.event, ChildStarted)]
    assert [s.name for s in started] == ["billing"] * 5
    assert sorted(s.key for s in started)[:3] == ["1/child.billing#1", "2/child.billing#1", "child.billing#1"]
    received = [e.event for e in history if isinstance(e.event, SignalReceived)]
    assert len(received) == 5 and all(r.sender == "runifold" for r in received)
    parent = (await store.get_run("p1")).run_id
    for child in started:
        info = await store.get_run(child.run_id)
        assert info.checkpoint_id == child.checkpoint_id and info.checkpoint_id.startswith(f"child:{parent}:")
        child_history = await entries(store, child.run_id)
        first = child_history[0].event
        assert isinstance(first, RunStarted) and first.parent_run_id == parent
    # however often the parent replayed (it waited five times), each child ran once
    assert await store.count_runs(name="billing") == 5
    assert all(v == 1 for v in calls.values()) and len(calls) == 4  # o1 failed before its step
    assert fold(history).children == {s.key: s.run_id for s in started}


async def test_retrying_a_failed_child_warns_that_its_parent_does_not_see_its_new_end(
        store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A child's end is posted to its parent once, when it first finishes: a failed child retried afterwards
    finishes unseen by its parent (helper-79). The retry says so, naming the parent; a run without one does not."""
    await store.enqueue(WorkflowTask("orders", 1, {"amounts": [-1]}, checkpoint_id="p1"))
    await run_until(store, "p1", RunStatus.COMPLETED)
    parent = (await store.get_run("p1")).run_id
    [failed] = await store.list_runs(status=RunStatus.FAILED, name="billing")
    with caplog.at_level("WARNING", logger="runifold.admin"):
        await retry_run(store, failed.run_id, by="ops", reason="amount fixed")
        await store.enqueue(WorkflowTask("billing", 1, {"order_id": "alone", "amount": -1}, checkpoint_id="b1"))
        await run_until(store, "b1", RunStatus.FAILED)
        await retry_run(store, "b1", by="ops", reason="amount fixed")
    warned = [r for r in caplog.records if r.name == "runifold.admin" and r.levelname == "WARNING"]
    unseen = [r for r in warned if r.event == "run_retried_unseen_by_its_parent"]  # type: ignore[attr-defined]
    assert [(r.run_ref, r.parent_run_id) for r in unseen] == [(failed.run_id, parent)]  # type: ignore[attr-defined]
    assert f"posted to its parent {parent} when it failed" in unseen[0].hint  # type: ignore[attr-defined]


async def test_a_childs_result_can_be_awaited_again_by_several_tasks_and_handles(store: Any) -> None:
    """result() awaited again, by tasks at once, after another wait for it was cancelled, or through a second
    handle of the same child: each gets the child's output (or its failure); the parent takes the child's end once.
    Every wait after the first waited for ever (helper-69), the parent reported waiting for a finished child."""
    await store.enqueue(WorkflowTask("reads-a-child-often", 1, {"amount": 4}, checkpoint_id="ro1"))
    await run_until(store, "ro1", RunStatus.COMPLETED, timeout=20)
    history = await entries(store, "ro1")
    assert msgspec.to_builtins(history[-1].event)["output"] == {
        "totals": [4] * 7, "types": ["Invoice"], "same_run": True, "errors": ["ValueError", "ValueError"]}
    received = [e.event.key for e in history if isinstance(e.event, SignalReceived)]
    assert len(received) == 3, received  # one end taken per child run
    assert await store.count_runs(name="billing") == 3 and calls == {"bill-often-a": 1, "bill-often-b": 1}
    report = await replay_run(store, registry, "ro1")
    assert report.clean and report.finished


async def test_cancelling_a_parent_cancels_its_children(store: Any) -> None:
    """A parent waiting on a child is cancelled: the child is cancelled too, with the parent named in the reason."""
    await store.enqueue(WorkflowTask("waits-on-a-child", 1, {}, checkpoint_id="p2"))
    await run_until(store, "p2", RunStatus.WAITING)
    children = fold(await entries(store, "p2")).children
    assert len(children) == 1
    (child,) = children.values()
    await run_until(store, child, RunStatus.WAITING)
    await cancel_run(store, "p2", by="ops", reason="order withdrawn")
    info = await store.get_run(child)
    assert info.status is RunStatus.CANCELLED
    assert "was cancelled: order withdrawn" in fold(await entries(store, child)).failure  # type: ignore[operator]


async def test_a_cancelled_child_is_a_child_failure_in_the_parent(store: Any) -> None:
    """An operator cancels the child: its parent wakes and receives ChildFailedError(status='cancelled')."""

    await store.enqueue(WorkflowTask("waits-on-a-child", 1, {}, checkpoint_id="p3"))
    await run_until(store, "p3", RunStatus.WAITING)
    (child,) = fold(await entries(store, "p3")).children.values()
    await run_until(store, child, RunStatus.WAITING)
    await cancel_run(store, child, by="ops", reason="not needed")
    await run_until(store, "p3", RunStatus.FAILED)
    assert "child run" in (await store.get_run("p3")).reason and "cancelled" in (await store.get_run("p3")).reason


async def test_a_child_signal_reaches_a_parent_that_did_not_wait_yet(store: Any) -> None:
    """The child finishes before its parent waits for it: the parent's inbox keeps it, and the parent finishes."""
    await store.enqueue(WorkflowTask("waits-on-a-child", 1, {}, checkpoint_id="p4"))
    await run_until(store, "p4", RunStatus.WAITING)
    (child,) = fold(await entries(store, "p4")).children.values()
    await send_signal(store, child, "approve", "a1")
    await run_until(store, "p4", RunStatus.COMPLETED)
    assert (await store.get_run(child)).status is RunStatus.COMPLETED


async def test_a_child_run_gets_its_definitions_concurrency_limit(store: Any) -> None:
    """A child whose registered definition names a concurrency limit is started with it, like any started run."""
    from runifold import ConcurrencyLimit

    limited = WorkflowRegistry(WorkflowDefinition(limited_parent),
                               WorkflowDefinition(approved_billing, signals={"approve": {"*"}},
                                                  concurrency=ConcurrencyLimit(1, key="billing-desk")))
    await store.enqueue(WorkflowTask("limited-parent", 1, {}, checkpoint_id="p5"))
    w = worker(store, *[limited.definition_for(n, v) for n, v in limited.versions()])
    await w.run_once()
    (child,) = fold(await entries(store, "p5")).children.values()
    info = await store.get_run(child)
    assert (info.concurrency_key, info.concurrency_limit) == ("billing-desk", 1)


async def test_a_parent_whose_finished_child_was_purged_can_still_be_shown_and_cancelled(store: Any) -> None:
    """Found by helper-16: after purge deleted a finished child, runs show and cancel of its unfinished parent
    failed with "no run" naming the child, and cancel had already written run_cancelled."""
    await store.enqueue(WorkflowTask("outlives-its-child", 1, {}, checkpoint_id="p1"))
    supervisor = Supervisor(worker(store, *[registry.definition_for(n, v) for n, v in registry.versions()]), 4,
                            idle_wait=timedelta(seconds=0.02))
    running = asyncio.create_task(supervisor.run(handle_signals=False))
    try:
        async with asyncio.timeout(30):
            while "signal 'go'" not in (await store.get_run("p1")).reason:  # the child is done, the parent waits
                await asyncio.sleep(0.02)
    finally:
        supervisor.stop()
        await running
    [child] = fold(await entries(store, "p1")).children.values()
    assert (await store.get_run(child)).status is RunStatus.COMPLETED
    assert await store.purge_finished(await store.now() + 1) == 1
    checkpoint = fold(await entries(store, "p1"))
    assert checkpoint.children and await child_runs(store, checkpoint) == {}
    await cancel_run(store, "p1", by="ops", reason="no longer needed")
    assert (await store.get_run("p1")).status is RunStatus.CANCELLED


async def test_a_checkpoint_id_names_the_child_of_one_parent_only(store: Any) -> None:
    """Found by helper-16: a second parent calling start_child with the first's checkpoint id adopted its child,
    then waited forever (the child tells only its own parent). The second parent fails, saying why, at the call
    (nothing records a refused start, so workflow code could not be handed the error the same way on replay)."""
    await store.enqueue(WorkflowTask("shares-a-child", 1, {"n": 1}, checkpoint_id="a"))
    await run_until(store, "a", RunStatus.COMPLETED)
    await store.enqueue(WorkflowTask("shares-a-child", 1, {"n": 2}, checkpoint_id="b"))
    await run_until(store, "b", RunStatus.FAILED)
    assert fold(await entries(store, "a")).result == "shared"
    failed = (await entries(store, "b"))[-1].event
    assert isinstance(failed, RunFailed) and failed.key == "child.billing#1"
    assert failed.error_type == "runifold.errors.EnqueueConflictError" and "shared-child" in failed.reason


async def test_no_sender_can_take_a_childs_signal_id_or_name(store: Any) -> None:
    """A sender allowed to signal a parent sends it a signal under the id (or the name) of its child's result,
    ``child:<child run id>``: it is refused (``invalid``) and audited; the child's result still reaches the
    parent, which completes. Before, the store kept the sender's signal under that id and dropped the child's
    result (an insert that ignores a duplicate id): the parent waited for ever (helper-57, every store)."""
    await store.enqueue(WorkflowTask("waits-on-a-child", 1, {}, checkpoint_id="p9"))
    await run_until(store, "p9", RunStatus.WAITING)
    (child,) = fold(await entries(store, "p9")).children.values()
    gateway = SignalGateway(store, registry, keyring())
    for signal_id, name in ((f"child:{child}", "go"), ("g1", f"child:{child}"), ("g2", "child:x")):
        with pytest.raises(SignalRejectedError, match="reserved for the results of child runs") as caught:
            await gateway.send(envelope("p9", signal_id, await store.now(), name=name))
        assert caught.value.verdict == "invalid"
    assert [a.verdict for a in await store.audit("p9")] == ["rejected:invalid"] * 3
    parent = await store.get_run("p9")
    with pytest.raises(SignalRejectedError, match="reserved"):  # the store's own input refuses it too
        SignalDelivery("p9", parent.run_id, f"child:{child}", "go", {}, "alice", "alice-1", "r", "sha256:x")
    assert await store.inbox(parent.run_id) == []
    await send_signal(store, child, "approve", "a1")
    await run_until(store, "p9", RunStatus.COMPLETED)
    # nor may a workflow declare or wait for such a name, or a task outside a parent take a child's checkpoint id
    with pytest.raises(ConfigurationError, match="reserved for the results of child runs"):
        WorkflowDefinition(approved_billing, signals={"child:x": {"*"}})
    with pytest.raises(InvalidInputError, match="reserved for the child runs a workflow starts"):
        WorkflowTask("billing", 1, {"order_id": "o", "amount": 1}, checkpoint_id=f"child:{parent.run_id}:x")


async def test_a_child_that_finishes_after_its_parent_was_purged_posts_nothing(store: Any) -> None:
    """A parent that never waits for its child finishes and is purged; the child finishes later. Its end went
    into a signal row addressed to the purged parent, which no purge ever deleted (helper-73)."""
    await store.enqueue(WorkflowTask("leaves-a-child", 1, {}, checkpoint_id="lp1"))
    await run_until(store, "lp1", RunStatus.COMPLETED)
    parent = (await store.get_run("lp1")).run_id
    [child] = fold(await entries(store, "lp1")).children.values()
    await run_until(store, child, RunStatus.WAITING)
    assert await store.purge_finished(await store.now() + 1) == 1
    await send_signal(store, child, "approve", "a1")
    await run_until(store, child, RunStatus.COMPLETED)
    try:
        left = await store.inbox(parent)
    except RunNotFoundError:
        left = []  # (the memory store keeps no inbox without its run)
    assert left == []
    assert await store.purge_finished(await store.now() + 1) == 1  # the child, and nothing is left of either


async def test_a_child_finishing_while_its_parents_purge_is_in_flight_posts_nothing(store: Any) -> None:
    """PostgreSQL: the purge of the parent is in a transaction not yet committed when the child finishes. The
    child's commit waits for it and then finds no parent; it read the parent as still there and left a row no
    purge deleted (helper-75). (SQLite has one writer, the memory store one loop: no such moment.)"""
    from runifold.stores.postgres import PostgresWorkflowStore
    from tests.conftest import require_postgres

    if not isinstance(store, PostgresWorkflowStore):
        pytest.skip("a race between two PostgreSQL transactions")
    import asyncpg  # type: ignore[import-untyped]

    await store.enqueue(WorkflowTask("leaves-a-child", 1, {}, checkpoint_id="lp2"))
    await run_until(store, "lp2", RunStatus.COMPLETED)
    parent = (await store.get_run("lp2")).run_id
    [child] = fold(await entries(store, "lp2")).children.values()
    await run_until(store, child, RunStatus.WAITING)
    purging = await asyncpg.connect(require_postgres())
    try:
        transaction = purging.transaction()
        await transaction.start()
        assert await purging.fetchval("SELECT runifold_purge_finished($1, $2)", await store.now() + 1, 1000) == 1
        await send_signal(store, child, "approve", "a1")
        finishing = asyncio.ensure_future(run_until(store, child, RunStatus.COMPLETED))
        await asyncio.sleep(0.5)  # the child's commit waits for the purge
        await transaction.commit()
        await finishing
    finally:
        await purging.close()
    assert await store.inbox(parent) == []


# -- a child's result type changed while the child ran --------------------------------------------------


class QuoteV1(msgspec.Struct, frozen=True):
    amount: int


class QuoteV2(msgspec.Struct, frozen=True):
    total: int
    currency: str


@workflow("quote", version=1)
async def quote_v1(ctx: WorkflowContext) -> QuoteV1:
    await ctx.sleep(timedelta(seconds=0.3))  # the parent waits for it across a deploy
    return QuoteV1(5)


@workflow("quote", version=2)
async def quote_v2(ctx: WorkflowContext) -> QuoteV2:
    return QuoteV2(5, "EUR")


def checkout_calling(child: Any) -> WorkflowDefinition:
    @workflow("checkout")
    async def checkout(ctx: WorkflowContext) -> str:
        return repr(await ctx.run_child(child, {}))

    return WorkflowDefinition(checkout)


async def test_a_childs_result_that_no_longer_fits_the_parents_code_is_a_divergence(store: Any) -> None:
    """Found by helper-88: a deploy changed the child workflow a parent awaits (v1 returning QuoteV1, now v2
    returning QuoteV2) while its v1 child ran; the child's result did not fit and the parent failed for good
    with SerializationError. A recorded value that no longer fits is a divergence, which code that fits it again
    and a wake recover."""
    await store.enqueue(WorkflowTask("checkout", 1, {}, checkpoint_id="co-1"))
    before = (checkout_calling(quote_v1), WorkflowDefinition(quote_v1))
    await worker(store, *before).run_once()  # the parent starts its child, and waits
    deployed = (checkout_calling(quote_v2), WorkflowDefinition(quote_v1), WorkflowDefinition(quote_v2))
    for _ in range(100):
        await worker(store, *deployed).run_once()
        if (await store.get_run("co-1")).status is not RunStatus.WAITING:
            break
        await asyncio.sleep(0.05)
    info = await store.get_run("co-1")
    assert info.status is RunStatus.DIVERGED, (info.status, info.reason)
    assert "the result of child run" in info.reason and "result() expecting QuoteV2" in info.reason, info.reason
    # (the child's end is still the parent's to take: the deploy check cannot see it before it is taken)
    await store.wake("co-1")
    for _ in range(20):
        await worker(store, *before).run_once()
        if (await store.get_run("co-1")).status is RunStatus.COMPLETED:
            break
    assert (await store.get_run("co-1")).status is RunStatus.COMPLETED
    assert not (await replay_run(store, WorkflowRegistry(*before), "co-1")).divergence
