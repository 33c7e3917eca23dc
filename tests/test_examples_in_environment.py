"""The examples' workflows, tested the way docs/testing.md shows: in a WorkflowEnvironment, with time skipped."""

from __future__ import annotations

import asyncio
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


async def test_the_environment_step_by_step_with_an_operator_and_a_concurrency_key() -> None:
    """docs/testing.md's step-by-step helpers: run_once, run_until_idle, skip_time, resolve_effect, concurrency."""
    from datetime import timedelta

    from runifold import (
        Completed,
        EffectOutcomeUnknown,
        Idle,
        Resolution,
        ResumePolicy,
        Suspended,
        WorkflowContext,
        WorkflowDefinition,
        effect,
        resolve_effect,
        workflow,
    )

    @effect(resume=ResumePolicy.MANUAL)
    async def charge_card(key: str, cents: int) -> str:
        raise EffectOutcomeUnknown("the provider timed out")

    @workflow("pay-later")
    async def pay_later(ctx: WorkflowContext, cents: int) -> str:
        await ctx.sleep(timedelta(hours=1))
        return await charge_card(cents)

    async with WorkflowEnvironment(WorkflowDefinition(pay_later)) as env:
        run = await env.start(pay_later, {"cents": 500}, concurrency_key="cards", concurrency_limit=1)
        assert (await env.store.get_run(run.run_id)).concurrency_key == "cards"
        assert isinstance(await env.run_once(), Suspended)  # the sleep
        assert await env.run_until_idle() == []  # nothing due: no time passes
        assert await env.skip_time() is True  # to the timer
        [parked] = await env.run_until_idle()
        assert isinstance(parked, Suspended) and (await env.store.get_run(run.run_id)).status is RunStatus.PARKED
        await resolve_effect(env.store, env.registry, run.run_id, "charge_card#1", Resolution.APPLIED, by="test",
                             reason="seen in the console", output="ch_1")
        assert await env.result(run) == "ch_1"
        assert [type(o) for o in env.outcomes if not isinstance(o, Idle)][-1] is Completed
        assert isinstance(await env.run_once(), Idle)
        assert await env.skip_time() is False and await env.skip_time(by=timedelta(days=1)) is True
        await env.assert_replays()


async def test_skipping_exactly_a_sleeps_length_fires_its_timer() -> None:
    """Found by helper-16: the worker added real elapsed time to the fake clock, so a one-day sleep was due a
    fraction of a millisecond after a skip of exactly one day. Time moves only when the clock does."""
    from datetime import timedelta

    from runifold import WorkflowContext, WorkflowDefinition, workflow

    @workflow("nap")
    async def nap(ctx: WorkflowContext) -> str:
        started = ctx.now()
        await ctx.sleep(timedelta(days=1))
        return str(ctx.now() - started)

    async with WorkflowEnvironment(WorkflowDefinition(nap)) as env:
        run = await env.start(nap, {})
        await env.run_until_idle()  # runs what is due, skipping no time
        assert (await env.store.get_run(run.run_id)).status is RunStatus.WAITING
        assert await env.skip_time(by=timedelta(days=1)) is True
        await env.run_until_idle()
        assert (await env.store.get_run(run.run_id)).status is RunStatus.COMPLETED
        assert await env.result(run) == "1 day, 0:00:00"


async def test_a_workflow_that_sleeps_in_a_loop_for_ever_is_given_up_on() -> None:
    """Found by helper-91: env.result of a poller (a sleep in an endless loop) ran for hours (each of 100,000
    rounds replays the run). It gives up after skipping time as many times as testing.md says, or as
    ``max_time_skips`` says (helper-92: a finite run with more timers had no way past the limit)."""
    from datetime import timedelta
    from pathlib import Path

    from runifold import ConfigurationError, WorkflowContext, WorkflowDefinition, workflow
    from runifold.testing import _environment

    said = (Path(__file__).parents[1] / "docs" / "testing.md").read_text()
    assert f"after skipping time\n  {_environment._MAX_ROUNDS:,} times" in said

    @workflow("poller")
    async def poller(ctx: WorkflowContext, sleeps: int | None) -> int:
        done = 0
        while sleeps is None or done < sleeps:
            await ctx.sleep(timedelta(minutes=10))
            done += 1
        return done

    async with WorkflowEnvironment(WorkflowDefinition(poller), max_time_skips=100) as env:
        run = await env.start(poller, {"sleeps": None})
        with pytest.raises(AssertionError, match=r"did not finish after skipping time 100 times: does it loop "
                                                 r"forever\? \(if not, raise WorkflowEnvironment\(max_time_skips=\)\)"):
            await env.result(run)
        assert len(await env.store.history(run.run_id)) == 1 + 101 + 100  # run started; 101 timers started, 100 fired
        # a run that needs exactly as many skips as the limit finishes (helper-93: it needed one more)
        assert await env.result(await env.start(poller, {"sleeps": 100})) == 100
    with pytest.raises(ConfigurationError, match="max_time_skips"):
        WorkflowEnvironment(WorkflowDefinition(poller), max_time_skips=0)


async def test_a_child_the_environment_cannot_run_is_named() -> None:
    """Found by helper-17: a child workflow missing from the environment's registry made result() run 100,000
    rounds and ask whether the workflow loops forever. It names the child and says what to add."""
    from runifold import WorkflowContext, WorkflowDefinition, workflow

    @workflow("helper-child")
    async def helper_child(ctx: WorkflowContext) -> int:
        return 1

    @workflow("needs-a-child")
    async def needs_a_child(ctx: WorkflowContext) -> int:
        return await ctx.run_child(helper_child, {})

    async with WorkflowEnvironment(WorkflowDefinition(needs_a_child)) as env:
        run = await env.start(needs_a_child, {})
        with pytest.raises(AssertionError, match=r"'helper-child' v1\) is due, but this environment has no definition"):
            await env.result(run)


@pytest.mark.parametrize("budget", ["default", "a day"])
async def test_a_parent_waiting_on_a_parked_child_is_named_with_what_the_child_needs(budget: str) -> None:
    """Found by helper-68: env.result of a parent whose child is parked told the test to send a signal (which the
    child's `child:` wait refuses); with an elapsed budget it skipped a day and failed the parent on it. It names
    the parked child and resolve_effect, and skips no time; once resolved, the parent completes."""
    from datetime import timedelta

    from runifold import (
        Budget,
        EffectOutcomeUnknown,
        Resolution,
        ResumePolicy,
        WorkflowContext,
        WorkflowDefinition,
        effect,
        resolve_effect,
        workflow,
    )

    @effect(resume=ResumePolicy.MANUAL)
    async def pay_out(key: str, cents: int) -> str:
        raise EffectOutcomeUnknown("the bank timed out")

    @workflow("payout")
    async def payout(ctx: WorkflowContext, cents: int) -> str:
        return await pay_out(cents)

    @workflow("expense")
    async def expense(ctx: WorkflowContext, cents: int) -> str:
        return await ctx.run_child(payout, {"cents": cents})

    limits = Budget() if budget == "default" else Budget(max_elapsed=timedelta(days=1))
    async with WorkflowEnvironment(WorkflowDefinition(expense, limits), WorkflowDefinition(payout)) as env:
        run = await env.start(expense, {"cents": 700})
        with pytest.raises(AssertionError, match=r"is waiting .*: its child run run_\w+ is parked \(effect pay_out#1 is "
                                                 r"ambiguous: .*\): resolve its effect with resolve_effect\(env.store, "
                                                 r"env.registry, 'run_\w+', ...\) first"):
            await env.result(run)
        assert env.clock() - (await env.store.get_run(run.run_id)).created_at < 1  # no time was skipped
        [child] = [r for r in await env.store.list_runs(name="payout")]
        await resolve_effect(env.store, env.registry, child.run_id, "pay_out#1", Resolution.APPLIED, by="test",
                             reason="the bank confirms", output="paid")
        assert await env.result(run) == "paid"
        await env.assert_replays()


async def test_of_two_children_the_parked_one_is_named() -> None:
    """A parent waits on two children, one waiting for a signal and one parked: the message names the parked one,
    which stops the run (helper-72: it named the first child it found)."""
    from runifold import EffectOutcomeUnknown, ResumePolicy, WorkflowContext, WorkflowDefinition, effect, workflow

    @effect(resume=ResumePolicy.MANUAL)
    async def transfer(key: str) -> str:
        raise EffectOutcomeUnknown("the bank timed out")

    @workflow("asks")
    async def asks(ctx: WorkflowContext) -> str:
        return str(await ctx.wait_signal("ok"))

    @workflow("transfers")
    async def transfers(ctx: WorkflowContext) -> str:
        return await transfer()

    @workflow("both")
    async def both(ctx: WorkflowContext) -> list[str]:
        first = await ctx.start_child(asks, {})
        second = await ctx.start_child(transfers, {})
        return list(await asyncio.gather(first.result(), second.result()))

    async with WorkflowEnvironment(WorkflowDefinition(both), WorkflowDefinition(asks, signals={"ok": {"*"}}),
                                   WorkflowDefinition(transfers)) as env:
        run = await env.start(both, {})
        with pytest.raises(AssertionError, match=r"its child run run_\w+ is parked \(effect transfer#1 is ambiguous"):
            await env.result(run)


async def test_the_environment_refuses_what_production_refuses() -> None:
    """An empty signal id, which the gateway refuses, got a generated one here; a naive start was read in the
    machine's time zone, so a test's dates depended on where it ran (helper-28)."""
    import datetime as dt

    from runifold import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"takes an aware datetime"):
        WorkflowEnvironment(approval.registry, start=dt.datetime(2030, 1, 1))
    async with WorkflowEnvironment(approval.registry, start=dt.datetime(2030, 1, 1, tzinfo=dt.UTC)) as env:
        run = await env.start(approval.order_approval, {"order_id": "o1"})
        await env.run_until_suspended(run)
        with pytest.raises(SignalRejectedError, match=r"signal_id must be a non-empty string"):
            await env.signal(run, "approval", {"approved": True}, sender="alice", signal_id="")


def test_a_fake_clock_reads_seconds_however_it_was_started() -> None:
    """FakeClock(datetime) returned that datetime when called, and a store then kept a schedule's last tick as a
    datetime (helper-34); an aware datetime now starts it at its instant, a naive one or a NaN is refused."""
    import datetime as dt

    from runifold import ConfigurationError
    from runifold.testing import FakeClock

    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    clock = FakeClock(start)
    assert clock() == start.timestamp() and isinstance(clock(), float)
    clock.advance(dt.timedelta(seconds=90))
    assert clock() == start.timestamp() + 90
    for bad in (dt.datetime(2030, 1, 1), float("nan"), "2030-01-01"):
        with pytest.raises(ConfigurationError, match=r"FakeClock\(start=\) takes seconds since the epoch"):
            FakeClock(bad)  # type: ignore[arg-type]


async def test_a_run_that_waits_only_for_a_timer_that_never_fires_is_named() -> None:
    """``env.result`` of a run asleep for ever (or past the year 9999) says so, instead of asking for a signal;
    one waiting for a signal is still told to send it."""
    import asyncio
    import math

    from runifold import WorkflowContext, WorkflowDefinition, workflow

    @workflow("asleep")
    async def asleep(ctx: WorkflowContext, seconds: float | None) -> str:
        await asyncio.sleep(math.inf if seconds is None else seconds)
        return "woke"

    @workflow("awaits")
    async def awaits(ctx: WorkflowContext) -> str:
        return str(await ctx.wait_signal("go"))

    @workflow("misnamed")
    async def misnamed(ctx: WorkflowContext) -> str:
        return str(await ctx.wait_signal("og"))

    async with WorkflowEnvironment(WorkflowDefinition(asleep), WorkflowDefinition(awaits, signals={"go": {"*"}}),
                                   WorkflowDefinition(misnamed, signals={"go": {"*"}})) as env:
        for seconds in (None, 1e20):
            with pytest.raises(AssertionError, match=r"\(timer timer#1, which never fires\): it waits only for a "
                                                     r"timer that never fires"):
                await env.result(await env.start(asleep, {"seconds": seconds}))
        assert await env.result(await env.start(asleep, {"seconds": 3600.0})) == "woke"
        with pytest.raises(AssertionError, match=r"send what it waits for with env.signal"):
            await env.result(await env.start(awaits, {}))
        # a wait for a signal the definition does not declare: sending it would be refused (helper-91: the
        # message said to send it)
        with pytest.raises(AssertionError, match=r"it waits for signal 'og', which its definition does not declare "
                                                 r"\(it declares \['go'\]\), so no sender may send it: fix the name"):
            await env.result(await env.start(misnamed, {}))
