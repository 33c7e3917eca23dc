"""Timers and signals on every store: durable waits, authentication, deduplication, audit, no lost wakeups."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from runifold import (
    Budget,
    Completed,
    Failed,
    HmacKeyRing,
    Idle,
    ResumePolicy,
    Retried,
    RetryPolicy,
    RunStatus,
    SignalEnvelope,
    SignalGateway,
    SignalRejectedError,
    Suspended,
    SuspendReason,
    WaitTimeoutError,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    effect,
    sign,
    step,
    workflow,
)
from runifold.history import SignalReceived, SignalWaitStarted, TimerFired, TimerStarted
from runifold.testing import FakeClock
from tests.corpus.check import replay_problems
from tests.support import entries, send_signal, worker

ALICE = b"alice-secret-0123456789abcdef"
BOB = b"bob-secret-0123456789abcdef012"


@workflow("approval")
async def approval(ctx: WorkflowContext, order_id: str) -> dict[str, Any]:
    try:
        decision = await ctx.wait_signal("approval", timeout=timedelta(days=2))
    except WaitTimeoutError:
        return {"order_id": order_id, "approved": False, "why": "timed out"}
    return {"order_id": order_id, "approved": decision["approved"]}


APPROVAL = WorkflowDefinition(approval, signals={"approval": {"alice"}, "comment": {"alice", "bob"}})


def keyring() -> HmacKeyRing:
    ring = HmacKeyRing()
    ring.add("alice-1", "alice", ALICE)
    ring.add("bob-1", "bob", BOB)
    return ring


def envelope(target: str, signal_id: str, now: float, *, name: str = "approval", sender: str = "alice",
             key_id: str = "alice-1", secret: bytes = ALICE, payload: Any = None) -> SignalEnvelope:
    unsigned = SignalEnvelope(target=target, name=name, payload={"approved": True} if payload is None else payload,
                              signal_id=signal_id, sender=sender, reason="looks good", key_id=key_id, timestamp=now)
    return sign(unsigned, secret)


def gateway(store: Any, ring: HmacKeyRing | None = None) -> SignalGateway:
    return SignalGateway(store, WorkflowRegistry(APPROVAL), ring or keyring())


async def test_signal_resumes_a_suspended_run_and_history_explains_it(store: Any) -> None:
    """A waiting run holds no worker; the signal makes it claimable, and the history shows sender, signal id and reason."""
    await store.enqueue(WorkflowTask("approval", 1, {"order_id": "o1"}, checkpoint_id="o1"))
    outcome = await worker(store, APPROVAL).run_once()
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.SIGNAL
    assert outcome.signals == ("approval",) and outcome.until is not None
    assert (await store.get_run("o1")).status is RunStatus.WAITING
    assert isinstance(await worker(store, APPROVAL).run_once(), Idle)
    receipt = await gateway(store).send(envelope("o1", "sig-1", await store.now()))
    assert not receipt.duplicate
    done = await worker(store, APPROVAL, worker_id="w2").run_once()
    assert isinstance(done, Completed) and done.output == {"order_id": "o1", "approved": True}
    [received] = [e.event for e in await entries(store, "o1") if isinstance(e.event, SignalReceived)]
    assert (received.sender, received.signal_id, received.reason) == ("alice", "sig-1", "looks good")


async def test_signal_before_the_wait_is_delivered(store: Any) -> None:
    """A signal sent before the workflow reaches its wait is consumed when the wait starts."""
    await store.enqueue(WorkflowTask("approval", 1, {"order_id": "o1"}, checkpoint_id="o1"))
    await gateway(store).send(envelope("o1", "early", await store.now()))
    done = await worker(store, APPROVAL).run_once()
    assert isinstance(done, Completed) and done.output["approved"] is True


gates: dict[str, asyncio.Event] = {}


@step()
async def slow_step() -> int:
    gates["started"].set()
    await gates["release"].wait()
    return 1


@workflow("slow-then-wait")
async def slow_then_wait(ctx: WorkflowContext) -> Any:
    await slow_step()
    return await ctx.wait_signal("approval")


SLOW = WorkflowDefinition(slow_then_wait, signals={"approval": {"alice"}})


async def test_signal_during_a_run_is_not_lost(store: Any) -> None:
    """A signal that arrives while a worker runs (or replays) the run wakes it as soon as it suspends."""
    gates.update(started=asyncio.Event(), release=asyncio.Event())
    await store.enqueue(WorkflowTask("slow-then-wait", 1, {}, checkpoint_id="r1"))
    w = worker(store, SLOW)
    running = asyncio.create_task(w.run_once())
    await gates["started"].wait()
    await SignalGateway(store, WorkflowRegistry(SLOW), keyring()).send(envelope("r1", "mid", await store.now()))
    gates["release"].set()
    first = await running
    if isinstance(first, Suspended):  # the signal arrived after the claim's inbox was read
        first = await w.run_once()
    assert isinstance(first, Completed) and first.output == {"approved": True}


@workflow("no-wait")
async def no_wait(ctx: WorkflowContext) -> str:
    return "done"


async def test_signal_to_a_finished_run_is_recorded_unconsumed(store: Any) -> None:
    """A signal racing the run's completion is kept as unconsumed, never dropped."""
    definition = WorkflowDefinition(no_wait, signals={"approval": {"alice"}})
    await store.enqueue(WorkflowTask("no-wait", 1, {}, checkpoint_id="f1"))
    assert isinstance(await worker(store, definition).run_once(), Completed)
    receipt = await SignalGateway(store, WorkflowRegistry(definition), keyring()).send(envelope("f1", "late", await store.now()))
    assert receipt.run_status is RunStatus.COMPLETED
    [record] = await store.audit("f1")
    assert record.verdict == "accepted" and "unconsumed" in record.detail


async def test_a_thousand_deliveries_of_one_signal_id_record_one(open_store: Any) -> None:
    """1,000 concurrent deliveries of one signal id from several store handles: one recorded, 999 duplicates."""
    handles = [await open_store() for _ in range(4)]
    await handles[0].enqueue(WorkflowTask("approval", 1, {"order_id": "o1"}, checkpoint_id="o1"))
    now = await handles[0].now()
    signed = envelope("o1", "same-id", now)
    receipts = await asyncio.gather(*[gateway(handles[i % 4]).send(signed) for i in range(1000)])
    assert sum(not r.duplicate for r in receipts) == 1
    assert len({r.received_at for r in receipts}) == 1
    verdicts = [a.verdict for a in await handles[0].audit("o1")]
    assert verdicts.count("accepted") == 1 and verdicts.count("duplicate") == 999
    done = await worker(handles[0], APPROVAL).run_once()
    assert isinstance(done, Completed)
    assert sum(isinstance(e.event, SignalReceived) for e in await entries(handles[0], "o1")) == 1


async def test_tampered_and_unauthorised_signals_change_nothing(store: Any) -> None:
    """Tampered, expired, future-dated, wrong-key, revoked-key, unknown and out-of-scope envelopes: none accepted, no state change, all audited."""
    ring = keyring()
    ring.add("alice-old", "alice", b"alice-old-secret-0123456789")
    ring.revoke("alice-old")
    await store.enqueue(WorkflowTask("approval", 1, {"order_id": "o1"}, checkpoint_id="o1"))
    await store.enqueue(WorkflowTask("approval", 1, {"order_id": "o2"}, checkpoint_id="o2"))
    await worker(store, APPROVAL).run_once()
    await worker(store, APPROVAL).run_once()
    now = await store.now()
    good = envelope("o1", "s1", now)
    corpus = {
        "tampered payload": msgspec.structs.replace(good, payload={"approved": False}),
        "tampered reason": msgspec.structs.replace(good, reason="forged"),
        "tampered signal id": msgspec.structs.replace(good, signal_id="s2"),
        "tampered target": msgspec.structs.replace(good, target="o2"),
        "tampered timestamp": msgspec.structs.replace(good, timestamp=now + 1),
        "forged sender": msgspec.structs.replace(good, sender="bob"),
        "expired": envelope("o1", "s3", now - 400),
        "future-dated": envelope("o1", "s4", now + 400),
        "wrong key": envelope("o1", "s5", now, secret=BOB),
        "revoked key": envelope("o1", "s6", now, key_id="alice-old", secret=b"alice-old-secret-0123456789"),
        "unknown key": envelope("o1", "s7", now, key_id="nobody-1"),
        "out of scope": envelope("o1", "s8", now, sender="bob", key_id="bob-1", secret=BOB),
        "unknown signal name": envelope("o1", "s9", now, name="cancel"),
    }
    before = {ref: (await store.get_run(ref), await store.history(ref)) for ref in ("o1", "o2")}
    verdicts: dict[str, str] = {}
    for label, env in corpus.items():
        with pytest.raises(SignalRejectedError) as caught:
            await gateway(store, ring).send(env)
        verdicts[label] = caught.value.verdict
        assert {ref: (await store.get_run(ref), await store.history(ref)) for ref in ("o1", "o2")} == before, label
        if label == "out of scope":  # the refusal names the workflow and version whose declaration refused it
            assert "may not send 'approval' to workflow 'approval' v1" in str(caught.value)
    assert verdicts == {
        **{label: "bad_signature" for label in corpus if label.startswith("tampered") or label == "wrong key"},
        "forged sender": "wrong_sender", "expired": "stale", "future-dated": "future", "revoked key": "revoked_key",
        "unknown key": "unknown_key", "out of scope": "out_of_scope", "unknown signal name": "unknown_signal",
    }
    audit = await store.audit("o1") + await store.audit("o2")
    assert len(audit) == len(corpus) and all(a.verdict.startswith("rejected:") for a in audit)
    assert all("secret" not in msgspec.json.encode(a).decode() for a in audit)
    assert isinstance(await worker(store, APPROVAL).run_once(), Idle)
    await gateway(store, ring).send(good)
    assert isinstance(await worker(store, APPROVAL).run_once(), Completed)


@step()
async def after_sleep() -> str:
    return "woke"


@workflow("sleeper")
async def sleeper(ctx: WorkflowContext) -> str:
    await ctx.sleep(timedelta(hours=1))
    return await after_sleep()


@pytest.mark.parametrize("open_store", ["memory", "sqlite"], indirect=True)  # PostgreSQL: the real-clock test below
async def test_timer_fires_once_never_early_across_a_restart(open_store: Any) -> None:
    """A timer fires exactly once, not before its deadline on the store's clock, with a different worker after a restart."""
    clock = FakeClock()
    store = await open_store(clock=clock)
    await store.enqueue(WorkflowTask("sleeper", 1, {}, checkpoint_id="t1"))
    suspended = await worker(store, WorkflowDefinition(sleeper)).run_once()
    assert isinstance(suspended, Suspended) and suspended.reason is SuspendReason.TIMER
    assert suspended.until == pytest.approx(clock() + 3600, abs=1)
    clock.advance(3590)
    assert isinstance(await worker(store, WorkflowDefinition(sleeper), worker_id="w2").run_once(), Idle)
    clock.advance(11)
    done = await worker(store, WorkflowDefinition(sleeper), worker_id="w3").run_once()
    assert isinstance(done, Completed) and done.output == "woke"
    history = await entries(store, "t1")
    [started] = [e.event for e in history if isinstance(e.event, TimerStarted)]
    fired = [e.event for e in history if isinstance(e.event, TimerFired)]
    assert len(fired) == 1 and fired[0].fired_at >= started.fire_at
    clock.advance(7200)
    assert isinstance(await worker(store, WorkflowDefinition(sleeper)).run_once(), Idle)


@pytest.mark.parametrize("open_store", ["memory", "sqlite"], indirect=True)  # PostgreSQL: the real-clock test below
async def test_wait_timeout_raises_inside_the_workflow_identically_on_replay(open_store: Any) -> None:
    """A wait that times out raises WaitTimeoutError in the workflow; a later replay takes the same path."""
    from runifold.worker._debug import replay

    clock = FakeClock()
    store = await open_store(clock=clock)
    await store.enqueue(WorkflowTask("approval", 1, {"order_id": "o1"}, checkpoint_id="o1"))
    assert isinstance(await worker(store, APPROVAL).run_once(), Suspended)
    clock.advance(timedelta(days=2, seconds=1))
    done = await worker(store, APPROVAL).run_once()
    assert isinstance(done, Completed) and done.output["why"] == "timed out"
    report = await replay(APPROVAL, "o1", await entries(store, "o1"))
    assert report.clean and report.result == done.output


async def test_ten_thousand_suspended_runs_hold_nothing_in_the_worker() -> None:
    """10,000 suspended runs leave no task, coroutine or execution state in the worker process."""
    from runifold.stores.memory import MemoryWorkflowStore
    from runifold.worker._execution import Execution

    def executions() -> int:
        gc.collect()
        return sum(isinstance(o, Execution) for o in gc.get_objects())

    # an execution whose workflow task swallowed every cancellation stays with that task (see WorkflowLoop.close),
    # so count from what earlier tests in this process left behind
    before = executions()
    store = MemoryWorkflowStore()
    w = worker(store, APPROVAL)
    for i in range(10_000):
        await store.enqueue(WorkflowTask("approval", 1, {"order_id": f"o{i}"}, checkpoint_id=f"o{i}"))
    baseline_tasks = len(asyncio.all_tasks())
    started = time.perf_counter()
    for _ in range(10_000):
        assert isinstance(await w.run_once(), Suspended)
    elapsed = time.perf_counter() - started
    assert isinstance(await w.run_once(), Idle)
    for _ in range(3):  # let the loop run pending done-callbacks
        await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == baseline_tasks
    assert executions() == before
    assert len(await store.list_runs(status=RunStatus.WAITING, limit=20_000)) == 10_000
    print(f"10,000 runs suspended in {elapsed:.2f} s; tasks after: {len(asyncio.all_tasks())} (baseline {baseline_tasks})")


@workflow("short-sleeper")
async def short_sleeper(ctx: WorkflowContext) -> str:
    await ctx.sleep(timedelta(seconds=0.5))
    return await after_sleep()


async def test_timer_on_the_real_store_clock(store: Any) -> None:
    """On every store's own clock (PostgreSQL's included) a timer is not claimable before its deadline and fires once after."""
    definition = WorkflowDefinition(short_sleeper)
    await store.enqueue(WorkflowTask("short-sleeper", 1, {}, checkpoint_id="t1"))
    suspended = await worker(store, definition).run_once()
    assert isinstance(suspended, Suspended) and suspended.until is not None
    assert isinstance(await worker(store, definition).run_once(), Idle)
    while await store.now() < suspended.until:
        await asyncio.sleep(0.05)
    done = await worker(store, definition, worker_id="w2").run_once()
    assert isinstance(done, Completed)
    history = await entries(store, "t1")
    [started] = [e.event for e in history if isinstance(e.event, TimerStarted)]
    [fired] = [e.event for e in history if isinstance(e.event, TimerFired)]
    assert fired.fired_at >= started.fire_at


@workflow("short-approval")
async def short_approval(ctx: WorkflowContext) -> str:
    try:
        await ctx.wait_signal("approval", timeout=timedelta(seconds=0.4))
    except WaitTimeoutError:
        return "timed out"
    return "approved"


async def test_wait_timeout_on_the_real_store_clock(store: Any) -> None:
    """A signal wait with a timeout wakes by itself on the store's clock and raises WaitTimeoutError in the workflow."""
    definition = WorkflowDefinition(short_approval, signals={"approval": {"alice"}})
    await store.enqueue(WorkflowTask("short-approval", 1, {}, checkpoint_id="a1"))
    suspended = await worker(store, definition).run_once()
    assert isinstance(suspended, Suspended) and suspended.until is not None
    while await store.now() < suspended.until:
        await asyncio.sleep(0.05)
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == "timed out"


# -- signals that arrive while the run executes -------------------------------------------------------


@step()
async def process(i: int) -> int:
    await asyncio.sleep(0.05)
    return i


@workflow("until-stopped")
async def until_stopped(ctx: WorkflowContext, poll: bool) -> list[Any]:
    stop = asyncio.ensure_future(ctx.wait_signal("stop"))
    done: list[int] = []
    if poll:
        while not stop.done():  # busy-waiting, as ordinary asyncio allows: the run never suspends
            await asyncio.sleep(0)
    else:
        while not stop.done() and len(done) < 200:  # 10 s of steps: the run never suspends
            done.append(await process(len(done)))
    return [await stop, len(done) < 200]


@pytest.mark.parametrize("poll", [False, True], ids=["steps", "busy-polling"])
async def test_a_signal_sent_while_the_run_executes_is_seen_without_a_suspension(store: Any, poll: bool) -> None:
    """A "stop" signal for a run busy with a long series of steps (or polling with sleep(0)) is seen by the
    execution under way, within about a second: the run never suspended, so it was seen only after all 200 steps
    (or never) and then stayed unconsumed."""
    definition = WorkflowDefinition(until_stopped, signals={"stop": {"*"}})
    await store.enqueue(WorkflowTask("until-stopped", 1, {"poll": poll}, checkpoint_id="u1"))
    running = asyncio.ensure_future(worker(store, definition, lease=30).run_once())
    await asyncio.sleep(0.3)
    await send_signal(store, "u1", "stop", "s1", "now")
    done = await asyncio.wait_for(running, 5)
    assert isinstance(done, Completed) and done.output == ["now", True]
    assert [e.event.signal_id for e in await entries(store, "u1") if isinstance(e.event, SignalReceived)] == ["s1"]
    assert not await replay_problems(store, WorkflowRegistry(definition), "u1", done.output)


@step()
async def runs_one_second() -> str:
    await asyncio.sleep(1.0)
    return "ran"


async def go_or_timed_out(ctx: WorkflowContext) -> str:
    """The "go" signal's payload if it came within 400 ms, else "timed out"."""
    try:
        return str(await ctx.wait_signal("go", timeout=timedelta(milliseconds=400)))
    except WaitTimeoutError:
        return "timed out"


@workflow("deadline-beside-a-body")
async def deadline_beside_a_body(ctx: WorkflowContext) -> list[str]:
    return list(await asyncio.gather(go_or_timed_out(ctx), runs_one_second()))


@pytest.mark.parametrize("at", [0.1, 0.6], ids=["before-the-deadline", "after-the-deadline"])
async def test_a_wait_deadline_passing_while_a_body_runs_is_judged_by_when_the_signal_came(
        store: Any, at: float) -> None:
    """A signal wait's deadline passes while a sibling's step body runs: a signal the store received before the
    deadline is taken (it was judged "timed out": the execution had not looked at its inbox since its claim), one
    received after it is not, and stays for a later wait."""
    definition = WorkflowDefinition(deadline_beside_a_body, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("deadline-beside-a-body", 1, {}, checkpoint_id="d1"))
    running = asyncio.ensure_future(worker(store, definition, lease=30).run_once())
    await asyncio.sleep(at)
    await send_signal(store, "d1", "go", "g1", "yes")
    done = await asyncio.wait_for(running, 5)
    assert isinstance(done, Completed) and done.output == ["yes" if at < 0.4 else "timed out", "ran"]
    assert not await replay_problems(store, WorkflowRegistry(definition), "d1", done.output)


held = {"first": True}


@step()
async def held_the_first_time() -> str:
    if held["first"]:
        held["first"] = False
        await asyncio.sleep(30)  # the worker stops meanwhile
    return "ran"


@workflow("deadline-beside-a-held-body")
async def deadline_beside_a_held_body(ctx: WorkflowContext) -> list[str]:
    return list(await asyncio.gather(go_or_timed_out(ctx), held_the_first_time()))


async def test_a_wait_deadline_is_recorded_before_a_body_beside_it_is_waited_for(store: Any) -> None:
    """helper-96: signal_wait_started went with the sibling step's completion, so a worker stopped (SIGKILL, or
    SIGTERM in a deploy) while the step ran left no deadline: the next worker started the wait again, due its whole
    timeout after its own claim, and took an approval the store received after the deadline. The wait's start is
    committed before the worker waits for the body, and the next worker keeps its deadline."""
    held["first"] = True
    definition = WorkflowDefinition(deadline_beside_a_held_body, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("deadline-beside-a-held-body", 1, {}, checkpoint_id="h1"))
    started = time.time()
    first = asyncio.ensure_future(worker(store, definition, worker_id="w1", lease=0.5).run_once())
    await asyncio.sleep(0.2)
    waits = [e.event for e in await entries(store, "h1") if isinstance(e.event, SignalWaitStarted)]
    assert len(waits) == 1 and waits[0].deadline is not None, waits
    assert waits[0].deadline - started < 0.4 + 0.3
    first.cancel()  # the worker stops while the step runs
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await first
    await asyncio.sleep(0.7 - (time.time() - started))
    await send_signal(store, "h1", "go", "g1", "yes")  # received after the deadline
    for _ in range(50):
        done = await worker(store, definition, worker_id="w2").run_once()
        if isinstance(done, Completed):
            break
        await asyncio.sleep(0.1)
    assert isinstance(done, Completed) and done.output == ["timed out", "ran"], done
    assert not await replay_problems(store, WorkflowRegistry(definition), "h1", done.output)


# -- the elapsed budget running out during a retry's backoff --------------------------------------------


@step(retry=RetryPolicy(max_attempts=3, initial=timedelta(seconds=30), jitter=0))
async def provider_down() -> str:
    raise ConnectionError("provider down")


@effect(resume=ResumePolicy.REPEAT, retry=RetryPolicy(max_attempts=3, initial=timedelta(seconds=30), jitter=0))
async def unsure(key: str) -> str:
    raise TimeoutError("the gateway did not answer")


@effect(resume=ResumePolicy.REPEAT, retry=RetryPolicy(max_attempts=3, initial=timedelta(seconds=0.5), jitter=0))
async def declines(key: str) -> str:
    raise ValueError("card declined")


@workflow("backs-off")
async def backs_off(ctx: WorkflowContext, kind: str) -> str:
    return await {"step": provider_down, "effect": unsure, "declined effect": declines}[kind]()


@pytest.mark.parametrize("late", [False, True])
async def test_an_effect_whose_last_attempt_failed_fails_the_run_when_its_time_runs_out_in_the_backoff(
        store: Any, late: bool) -> None:
    """Its last attempt failed, so nothing of it is in doubt: when the elapsed budget runs out during its backoff
    the run fails, whether a worker takes it up at the budget's end or after the retry was due. It was parked
    at the budget's end and failed when taken up later (helper-72)."""
    definition = WorkflowDefinition(backs_off, Budget(max_elapsed=timedelta(milliseconds=300)))
    await store.enqueue(WorkflowTask("backs-off", 1, {"kind": "declined effect"}, checkpoint_id="d1"))
    assert isinstance(await worker(store, definition).run_once(), Retried)
    await asyncio.sleep(0.6 if late else 0.35)  # late: its retry (0.5 s) is due too when the worker comes
    outcome = await worker(store, definition).run_once()
    assert isinstance(outcome, Failed) and "budget exceeded: elapsed seconds ran out" in outcome.reason, outcome
    assert (await store.get_run("d1")).status is RunStatus.FAILED


@pytest.mark.parametrize("kind", ["step", "effect"])
async def test_the_elapsed_budget_running_out_during_a_retry_backoff_ends_the_wait(store: Any, kind: str) -> None:
    """A retry due after the run's elapsed budget: the run was woken at the budget's end and rescheduled for
    that same moment again and again, claimed about 1,000 times a second until the retry was due, and the
    testing kit hung (helper-28). A step's retry now fails the run at the budget's end; an effect waiting for
    its next attempt (its outcome unknown) is parked for an operator, never failed."""
    definition = WorkflowDefinition(backs_off, Budget(max_elapsed=timedelta(milliseconds=300)))
    await store.enqueue(WorkflowTask("backs-off", 1, {"kind": kind}, checkpoint_id="b1"))
    first = await worker(store, definition).run_once()
    assert isinstance(first, Retried)
    await asyncio.sleep(0.35)
    outcomes = [await worker(store, definition).run_once() for _ in range(3)]
    if kind == "step":
        assert isinstance(outcomes[0], Failed) and "budget exceeded: elapsed seconds ran out" in outcomes[0].reason
    else:
        assert isinstance(outcomes[0], Suspended) and outcomes[0].reason is SuspendReason.AMBIGUOUS
        assert "outcome unknown after 1 attempt(s), and the run's elapsed budget ran out while it waited for " \
               "attempt 2" in outcomes[0].detail
        assert (await store.get_run("b1")).status is RunStatus.PARKED
    assert all(isinstance(o, Idle) for o in outcomes[1:])  # not claimed again and again


@step()
async def takes(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@workflow("budget-beside-a-wait")
async def budget_beside_a_wait(ctx: WorkflowContext) -> list[Any]:
    return list(await asyncio.gather(ctx.wait_signal("go"), takes(0.7), takes(0.3)))


async def test_a_signal_received_before_the_elapsed_budget_ran_out_counts_however_late_the_worker_reads(
        store: Any) -> None:
    """The run's elapsed budget runs out while a body runs; a signal the store received before then counts, as
    the README says, even when the execution had not read its inbox since: the budget was judged before the
    inbox was read, and the run failed or completed depending on when it was claimed (helper-29)."""
    definition = WorkflowDefinition(budget_beside_a_wait, Budget(max_elapsed=timedelta(seconds=1)),
                                    signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("budget-beside-a-wait", 1, {}, checkpoint_id="bw1"))
    await asyncio.sleep(0.45)  # claimed late: the inbox reads come at about +0.45 and +1.45 s
    running = asyncio.ensure_future(worker(store, definition).run_once())
    await asyncio.sleep(0.45)
    await send_signal(store, "bw1", "go", "g1", "yes")  # at about +0.9 s, before the budget's end
    done = await asyncio.wait_for(running, 10)
    assert isinstance(done, Completed) and done.output == ["yes", 0.7, 0.3]
    assert not await replay_problems(store, WorkflowRegistry(definition), "bw1", done.output)


@workflow("approval-beside-work")
async def approval_beside_work(ctx: WorkflowContext, shape: str) -> list[Any]:
    async def work() -> list[float]:
        return [await takes(0.4) for _ in range(4)]

    busy = asyncio.ensure_future(work())
    if shape == "wait_for":
        try:
            answer = await asyncio.wait_for(ctx.wait_signal("go"), 0.8)
        except TimeoutError:
            answer = "timed out"
    else:  # a reminder beside the wait
        waiting = asyncio.ensure_future(ctx.wait_signal("go"))
        reminder = asyncio.ensure_future(ctx.sleep(timedelta(seconds=0.8)))
        done, _ = await asyncio.wait({waiting, reminder}, return_when=asyncio.FIRST_COMPLETED)
        answer = waiting.result() if waiting in done else "reminded"
        waiting.cancel()
        reminder.cancel()
    return [answer, await busy]


@pytest.mark.parametrize("shape", ["wait_for", "reminder"])
async def test_a_signal_received_before_a_timer_racing_its_wait_wins_while_the_run_is_busy(
        store: Any, shape: str) -> None:
    """An asyncio timeout around wait_signal, or a reminder sleep beside it, races the wait; a step runs all the
    while, so the execution reads its inbox only every second. A signal the store received before the timer was
    due ends the wait first, as when the run was idle: the timer fired first (helper-74)."""
    definition = WorkflowDefinition(approval_beside_work, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("approval-beside-work", 1, {"shape": shape}, checkpoint_id="ab1"))
    running = asyncio.ensure_future(worker(store, definition).run_once())  # inbox read at the claim, then +1 s
    await asyncio.sleep(0.5)
    await send_signal(store, "ab1", "go", "g1", "yes")  # at about +0.5 s; the timer is due at about +0.8 s
    done = await asyncio.wait_for(running, 10)
    assert isinstance(done, Completed) and done.output == ["yes", [0.4] * 4], done
    assert not await replay_problems(store, WorkflowRegistry(definition), "ab1", done.output)
