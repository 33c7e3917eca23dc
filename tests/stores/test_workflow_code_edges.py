"""Workflow code at the edges of asyncio, on every store (found by helper-37): the loop's clock, SystemExit and
KeyboardInterrupt raised by workflow code, and a plain ``def`` step's thread that outlives its cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from runifold import (
    Completed,
    Failed,
    LeaseLost,
    RetryPolicy,
    StepFailedError,
    Suspended,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    step,
    workflow,
)
from runifold.history import CallCancelled, ChildStarted
from runifold.worker import replay_run
from tests.corpus.check import replay_problems
from tests.support import entries, until_completed, worker

ran: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


@step()
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slow"


@step()
async def quick(name: str) -> str:
    ran.append(name)
    return name


# -- the loop's clock is the run's recorded time ----------------------------------------------------


@workflow("deadline-idiom")
async def deadline_idiom(ctx: WorkflowContext) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + 0.1
    await slow(0.3)  # outlasts the deadline
    try:
        async with asyncio.timeout_at(deadline):
            await quick("in time")
        late = False
    except TimeoutError:
        late = True
    await asyncio.sleep(0.05)
    return {"late": late, "after_step": loop.time() - start, "ticks": [loop.time() - start for _ in range(3)]}


async def test_a_deadline_taken_from_the_loops_clock_passes_at_the_same_point_on_replay(store: Any) -> None:
    """``asyncio.timeout_at(loop.time() + d)`` across a step: the clock of workflow code is the time history
    records for what it was last handed (a commit, a timer's due time), so the deadline passed live has passed
    on replay too, and every reading of ``loop.time()`` replays to the same value (it read the worker's own
    clock: the live run saw the deadline pass, the replay did not, set a timer and diverged)."""
    await store.enqueue(WorkflowTask("deadline-idiom", 1, {}, checkpoint_id="d1"))
    done = await until_completed(store, WorkflowDefinition(deadline_idiom))
    assert isinstance(done, Completed), done
    assert done.output["late"] is True and ran == []
    assert done.output["after_step"] >= 0.3  # the step's commit came at least 0.3 s after the run started
    assert len(set(done.output["ticks"])) == 1  # it stands still while workflow code runs
    assert not await replay_problems(store, WorkflowRegistry(WorkflowDefinition(deadline_idiom)), "d1", done.output)


@workflow("clock-readings")
async def clock_readings(ctx: WorkflowContext) -> list[float]:
    loop = asyncio.get_running_loop()
    readings = [loop.time()]
    await asyncio.gather(quick("a"), quick("b"))
    readings.append(loop.time())
    await ctx.sleep(timedelta(seconds=0.2))  # suspends: the next execution replays the readings so far
    readings.append(loop.time())
    await quick("c")
    readings.append(loop.time())
    return readings


async def test_the_loops_clock_reads_the_same_live_and_replayed_across_a_suspension(store: Any) -> None:
    """Readings of ``loop.time()`` before a suspension are replayed by the next execution to the same values,
    and move forward with the run's recorded times (the run's start, commits, when a timer fired)."""
    definition = WorkflowDefinition(clock_readings)
    await store.enqueue(WorkflowTask("clock-readings", 1, {}, checkpoint_id="c1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await asyncio.sleep(0.25)
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed), done
    history = await entries(store, "c1")
    started = history[0].at
    fired = next(e.event.fired_at for e in history if e.event.key == "sleep#1" and hasattr(e.event, "fired_at"))
    assert [e.event.key for e in history if e.event.key.endswith("quick#1")] == ["1/quick#1", "2/quick#1", "quick#1"]
    readings = done.output
    assert readings[0] == started and readings == sorted(readings)
    assert readings[2] == fired  # when the timer fired: this worker's claim, not its due time 0.05 s before
    assert readings[3] == next(e.at for e in history if e.event.key == "quick#1")  # its commit
    assert not await replay_problems(store, WorkflowRegistry(definition), "c1", done.output)


@workflow("deadline-after-resume")
async def deadline_after_resume(ctx: WorkflowContext) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    await ctx.sleep(timedelta(seconds=0.1))  # the run suspends, and resumes a second late
    deadline = loop.time() + 0.5
    try:
        async with asyncio.timeout_at(deadline):
            await slow(0.2)
        timed_out = False
    except TimeoutError:
        timed_out = True
    return {"timed_out": timed_out, "past_deadline": loop.time() > deadline}


async def test_a_deadline_after_a_late_resume_counts_from_the_resume(store: Any) -> None:
    """After a timer that fired late (no worker was up), the clock reads when it fired, not its due time: a
    deadline taken then is honoured. Taken from the due time, it had passed a second before, yet the block ran to
    its end without TimeoutError, its timer set 0.5 s from the resume (helper-39)."""
    definition = WorkflowDefinition(deadline_after_resume)
    await store.enqueue(WorkflowTask("deadline-after-resume", 1, {}, checkpoint_id="r1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await asyncio.sleep(1.1)
    done = await until_completed(store, definition)
    assert done.output == {"timed_out": False, "past_deadline": False}, done.output
    assert not await replay_problems(store, WorkflowRegistry(definition), "r1", done.output)


# -- SystemExit and KeyboardInterrupt from workflow code fail the run, never the worker ------------


@workflow("exits")
async def exits(ctx: WorkflowContext, which: str) -> str:
    await quick("before")
    if which == "exit":
        raise SystemExit(2)  # a library calling sys.exit
    raise KeyboardInterrupt


@pytest.mark.parametrize("which, name", [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")])
async def test_system_exit_raised_by_workflow_code_fails_the_run_not_the_worker(
        store: Any, which: str, name: str, caplog: pytest.LogCaptureFixture) -> None:
    """asyncio lets SystemExit and KeyboardInterrupt out of a task: raised by workflow code they ended the worker
    (and every worker that claimed the run after it), and the debugger's caller. Now they fail the run like any
    exception of workflow code, and the debugger reports that failure, with no warning of its own (helper-95: each
    execution and each replay logged workflow_task_error besides)."""
    definition = WorkflowDefinition(exits)
    await store.enqueue(WorkflowTask("exits", 1, {"which": which}, checkpoint_id=f"x-{which}"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Failed) and f"workflow raised {name}" in done.reason, done
    report = await replay_run(store, WorkflowRegistry(definition), f"x-{which}")
    assert report.divergence is None and report.finished and name in (report.error or ""), report
    assert not [r for r in caplog.records if "workflow_task_error" in r.getMessage()], caplog.text


# -- a plain def step's thread keeps the run until it returns -------------------------------------------

threads: dict[str, float] = {}


@step()
def blocking(seconds: float) -> str:
    time.sleep(seconds)
    threads[threading.current_thread().name] = time.monotonic()
    return "late"


@workflow("thread-cut-short")
async def thread_cut_short(ctx: WorkflowContext) -> str:
    try:
        return await asyncio.wait_for(blocking(0.6), timeout=0.1)
    except TimeoutError:
        pass
    await ctx.sleep(timedelta(seconds=1))
    return "gave up"


async def test_a_plain_def_step_cut_short_holds_the_run_until_its_thread_returns(store: Any) -> None:
    """A thread cannot be interrupted: a plain ``def`` body that workflow code stopped waiting for is still in
    flight until its thread returns, so the run suspends only after that (it suspended at once, and was even
    completed by the next claim, while the thread ran on)."""
    threads.clear()
    definition = WorkflowDefinition(thread_cut_short)
    await store.enqueue(WorkflowTask("thread-cut-short", 1, {}, checkpoint_id="t1"))
    suspended = await worker(store, definition).run_once()
    returned = time.monotonic()
    assert isinstance(suspended, Suspended), suspended
    assert len(threads) == 1 and next(iter(threads.values())) <= returned
    done = await until_completed(store, definition)
    assert isinstance(done, Completed) and done.output == "gave up", done
    assert "call_cancelled" in [e.event.__struct_config__.tag for e in await entries(store, "t1")]


# -- a worker whose loop was held past its lease (found by helper-43) ------------------------------

attempts: list[float] = []


@step(retry=RetryPolicy(max_attempts=3, initial=timedelta(0)))
async def holds_the_loop(seconds: float) -> str:
    attempts.append(time.monotonic())
    if len(attempts) == 1:
        time.sleep(seconds)  # a blocking call in an async body: the worker's loop is held past its lease
        raise ConnectionError("the provider timed out")
    return "charged"


@workflow("held-loop")
async def held_loop(ctx: WorkflowContext, seconds: float) -> str:
    return await holds_the_loop(seconds)


async def test_a_worker_held_past_its_lease_starts_no_body(store: Any) -> None:
    """A worker whose event loop was held (or whose process was frozen) past its lease starts no body when it
    goes on: its renewal is overdue, so it renews before the next body starts, and the store refuses. Before,
    the retry (due at once) started in the worker that had lost the run, which on a real deployment another
    worker had taken over and completed, so a completed step's body ran again."""
    attempts.clear()
    await store.enqueue(WorkflowTask("held-loop", 1, {"seconds": 1.2}, checkpoint_id="h1"))
    definition = WorkflowDefinition(held_loop)
    lost = await worker(store, definition, lease=0.9).run_once()
    assert isinstance(lost, LeaseLost), lost
    # and says why, with what to do (helper-90: "the lease expired", with no word of the blocked loop)
    assert "this worker last renewed it 1." in lost.detail and "longer than the lease (0.9 s): its event loop was " \
                                                               "held up" in lost.detail, lost.detail
    assert len(attempts) == 1  # the retry did not start: the lease had run out while the loop was held
    done = await until_completed(store, definition)  # the next claim takes the run over and replays it
    assert done.output == "charged" and len(attempts) == 2


@step()
async def after_it(order: str) -> str:
    attempts.append(-time.monotonic())
    return f"notified {order}"


@step()
async def holds_once(seconds: float) -> str:
    attempts.append(time.monotonic())
    if len(attempts) == 1:
        time.sleep(seconds)  # holds the loop: the body beside it starts on a later pass, past the lease
    return "held"


@workflow("held-gather")
async def held_gather(ctx: WorkflowContext, seconds: float) -> list[str]:
    return list(await asyncio.gather(holds_once(seconds), after_it("o1")))


async def test_a_body_that_starts_after_a_sibling_held_the_loop_past_the_lease_does_not_start(store: Any) -> None:
    """Bodies started together run as tasks, which start on a later pass of the worker's loop: the lease is
    checked as each starts, so one whose sibling held the loop past the lease does not start (it was checked
    once for both, and ran in the worker that had lost the run: found by helper-44)."""
    attempts.clear()
    await store.enqueue(WorkflowTask("held-gather", 1, {"seconds": 1.2}, checkpoint_id="hg1"))
    definition = WorkflowDefinition(held_gather)
    lost = await worker(store, definition, lease=0.9).run_once()
    assert isinstance(lost, LeaseLost), lost
    assert len(attempts) == 1 and attempts[0] > 0  # only the body that held the loop had started
    done = await until_completed(store, definition)
    assert done.output == ["held", "notified o1"] and sum(1 for a in attempts if a < 0) == 1


# -- a child's start under a deadline that has passed already -------------------------------------------


@workflow("tiny-child")
async def tiny_child(ctx: WorkflowContext) -> str:
    return "child done"


@workflow("expired-deadline-child")
async def expired_deadline_child(ctx: WorkflowContext, how: str, call: str) -> dict[str, str]:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(0) if how == "zero" else asyncio.timeout_at(loop.time() - 1):
            if call == "run_child":
                await ctx.run_child(tiny_child, {})
            else:
                await (await ctx.start_child(tiny_child, {})).result()
        outcome = "in time"
    except TimeoutError:
        outcome = "timed out"
    await ctx.sleep(timedelta(seconds=0.05))  # suspends: the next execution replays the cancelled start
    return {"outcome": outcome, "after": await quick("after")}


@pytest.mark.parametrize("call", ["run_child", "start_child"])
@pytest.mark.parametrize("how", ["zero", "past"])
async def test_a_childs_start_cancelled_by_a_deadline_already_passed_replays(store: Any, how: str, call: str) -> None:
    """Found by helper-88: under ``asyncio.timeout(0)`` (or ``timeout_at`` a passed deadline) a child's start is
    cancelled before it starts. Live, nothing was recorded of it; replay made the call, so unchanged code
    diverged (the run stuck at its next wait, a completed run's replay unclean). The start is recorded as
    cancelled, as a step's is, and no child run exists."""
    definitions = (WorkflowDefinition(expired_deadline_child), WorkflowDefinition(tiny_child))
    await store.enqueue(WorkflowTask("expired-deadline-child", 1, {"how": how, "call": call}, checkpoint_id="x1"))
    done = await until_completed(store, *definitions)
    assert done.output == {"outcome": "timed out", "after": "after"}
    assert await store.list_runs(name="tiny-child") == []
    cancelled = [e.event for e in await entries(store, done.run_id) if isinstance(e.event, CallCancelled)]
    assert [(c.kind, c.ran) for c in cancelled] == [("child", False)]
    assert not await replay_problems(store, WorkflowRegistry(*definitions), "x1", done.output)


# -- an int too long to read back ------------------------------------------------------------------------


@step()
async def factorial_sized(digits: int) -> int:
    ran.append("factorial_sized")
    return 10**digits


@workflow("huge-int")
async def huge_int(ctx: WorkflowContext, digits: int) -> str:
    try:
        return str(await factorial_sized(digits))[:5]
    except StepFailedError as exc:
        return exc.error


@pytest.mark.parametrize("limit", [4300, 0])
async def test_an_int_too_long_to_read_back_is_refused_at_the_call(store: Any, limit: int) -> None:
    """Found by helper-89: an int of more than 4,300 digits, with Python's digit limit raised (as Python's own
    message advised), was written but could not be read back: a raw msgspec error crashed the executor and the
    step ran again at every recovery until the recovery budget failed the run. It is refused at the call,
    whatever the limit, saying to record it as a str; 4,300 digits still round-trip."""
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        too_long = "it is an int of more than 4,300 characters (digits and sign)"
        for digits, expected in ((4_299, "10000"), (5_000, too_long)):
            ran.clear()
            await store.enqueue(WorkflowTask("huge-int", 1, {"digits": digits}, checkpoint_id=f"h{digits}"))
            done = await until_completed(store, WorkflowDefinition(huge_int))
            assert expected in done.output and ran == ["factorial_sized"], (done.output, ran)
            assert not await replay_problems(store, WorkflowRegistry(WorkflowDefinition(huge_int)), f"h{digits}",
                                             done.output)
    finally:
        sys.set_int_max_str_digits(old)


@workflow("slow-start-parent")
async def slow_start_parent(ctx: WorkflowContext) -> dict[str, str]:
    try:
        async with asyncio.timeout(0.2):
            await ctx.start_child(tiny_child, {})  # (its enqueue takes longer, below)
        outcome = "in time"
    except TimeoutError:
        outcome = "timed out"
    return {"outcome": outcome, "after": await quick("after")}


def slow_child_enqueue(store: Any, monkeypatch: pytest.MonkeyPatch, *, hang: bool = False) -> None:
    """The store's enqueue of a child run takes 0.6 s (a slow round trip); with ``hang``, it enqueues the child,
    then never answers (the worker is stopped there, as by a crash)."""
    enqueue = store.enqueue

    async def slow(task: WorkflowTask) -> Any:
        if task.parent_run_id is None:
            return await enqueue(task)
        await asyncio.sleep(0.6)
        result = await enqueue(task)
        if hang:
            await asyncio.Event().wait()
        return result

    monkeypatch.setattr(store, "enqueue", slow)


async def test_a_childs_start_cancelled_while_its_enqueue_is_under_way_keeps_its_place(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by helper-92: a child's start cancelled (by a timeout) while its enqueue was under way ran on to
    child_started, which the log recorded after the calls the task made next: the replay called them reordered.
    Its cancellation is recorded where the code made it (call_cancelled with ran), then child_started; the child
    run exists and the parent's history knows it."""
    definitions = (WorkflowDefinition(slow_start_parent), WorkflowDefinition(tiny_child))
    slow_child_enqueue(store, monkeypatch)
    await store.enqueue(WorkflowTask("slow-start-parent", 1, {}, checkpoint_id="s1"))
    done = await until_completed(store, *definitions)
    if done.checkpoint_id != "s1":  # (the child, which may complete first)
        done = await until_completed(store, *definitions)
    assert done.output == {"outcome": "timed out", "after": "after"}
    events = [e.event for e in await entries(store, done.run_id)]
    kinds = [(type(e).__name__, getattr(e, "key", "")) for e in events]
    cancelled = kinds.index(("CallCancelled", "child.tiny-child#1"))
    assert cancelled < kinds.index(("StepCompleted", "quick#1")) < kinds.index(("ChildStarted", "child.tiny-child#1"))
    assert [c.ran for c in events if isinstance(c, CallCancelled)] == [True]
    assert len(await store.list_runs(name="tiny-child")) == 1
    assert not await replay_problems(store, WorkflowRegistry(*definitions), "s1", done.output)


async def test_a_childs_start_cancelled_under_way_is_recorded_after_a_crash(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by helper-92: a worker that stopped (a crash) after the child run was enqueued but before its
    child_started was committed left the child unknown to its parent (an orphan), or the parent diverged. The
    next worker enqueues it again (the same run: its checkpoint id) and records child_started."""
    definitions = (WorkflowDefinition(slow_start_parent), WorkflowDefinition(tiny_child))
    slow_child_enqueue(store, monkeypatch, hang=True)
    await store.enqueue(WorkflowTask("slow-start-parent", 1, {}, checkpoint_id="s2"))
    execution = asyncio.ensure_future(worker(store, *definitions, lease=1.0).run_once())
    for _ in range(200):  # until the step after the cancelled start is committed and the child run exists
        keys = [e.event.key for e in await entries(store, "s2")]
        if "quick#1" in keys and await store.list_runs(name="tiny-child"):
            break
        await asyncio.sleep(0.02)
    execution.cancel()  # the worker stops there, child_started never committed
    await asyncio.gather(execution, return_exceptions=True)
    assert "child.tiny-child#1" in [e.event.key for e in await entries(store, "s2")]  # (its call_cancelled)
    assert not any(isinstance(e.event, ChildStarted) for e in await entries(store, "s2"))
    monkeypatch.undo()
    await asyncio.sleep(1.1)  # the lease runs out
    done = await until_completed(store, *definitions)
    if done.checkpoint_id != "s2":  # (the child, which the next worker may complete first)
        done = await until_completed(store, *definitions)
    assert done.output == {"outcome": "timed out", "after": "after"}
    [child] = await store.list_runs(name="tiny-child")
    started = [e.event for e in await entries(store, "s2") if isinstance(e.event, ChildStarted)]
    assert [s.run_id for s in started] == [child.run_id]
    assert not await replay_problems(store, WorkflowRegistry(*definitions), "s2", done.output)


@workflow("cancels-a-start")
async def cancels_a_start(ctx: WorkflowContext) -> str:
    task = asyncio.ensure_future(ctx.start_child(tiny_child, {}))
    await quick("first")
    task.cancel()  # while its enqueue is under way
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await ctx.start_child(tiny_child, {}, checkpoint_id="second-child")  # nothing is committed before it
    return "done"


async def test_a_childs_start_cancelled_under_way_is_committed_at_once(store: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by helper-93: the cancellation of a start under way waited in the buffer for the task's next commit;
    when the next call committed nothing either (another child's start), a crash after the first child's enqueue
    left that child unknown to its parent. It is committed at once."""
    definitions = (WorkflowDefinition(cancels_a_start), WorkflowDefinition(tiny_child))
    slow_child_enqueue(store, monkeypatch, hang=True)
    await store.enqueue(WorkflowTask("cancels-a-start", 1, {}, checkpoint_id="c1"))
    execution = asyncio.ensure_future(worker(store, *definitions, lease=1.0).run_once())
    for _ in range(300):  # until both children's runs exist: the first's start was cancelled, the second waits
        if len(await store.list_runs(name="tiny-child")) == 2:
            break
        await asyncio.sleep(0.02)
    execution.cancel()  # the worker stops there
    await asyncio.gather(execution, return_exceptions=True)
    monkeypatch.undo()
    await asyncio.sleep(1.1)  # the lease runs out
    for _ in range(3):  # (the children may complete first)
        done = await until_completed(store, *definitions)
        if done.checkpoint_id == "c1":
            break
    assert done.output == "done"
    children = {r.run_id for r in await store.list_runs(name="tiny-child")}
    named = {e.event.run_id for e in await entries(store, "c1") if isinstance(e.event, ChildStarted)}
    assert len(children) == 2 and named == children  # no child run its parent does not name
    assert not await replay_problems(store, WorkflowRegistry(*definitions), "c1", done.output)
