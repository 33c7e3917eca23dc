"""Exact replay, finding by finding (issue 18), on every store.

The corpus (tests/corpus) runs these shapes under suspension, interruption and SIGKILL; the tests here
pin each finding down with its own assertions.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import sys
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from runifold import (
    Budget,
    Completed,
    Failed,
    Idle,
    InvalidInputError,
    ResumePolicy,
    Retried,
    RetryPolicy,
    RunStatus,
    SerializationError,
    StepFailedError,
    StoreError,
    StoreUnavailableError,
    Supervisor,
    Suspended,
    WaitTimeoutError,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    effect,
    step,
    workflow,
)
from runifold.history import CallCancelled, SignalReceived, StepFailed, fold
from runifold.worker import check_compatibility, replay_run
from runifold.worker._debug import replay
from tests.corpus.check import replay_problems
from tests.support import entries, event_types, keys, send_signal, until_completed, until_waiting_for_signal, worker

calls: Counter[str] = Counter()


def wait_for_keys(call: str, before: int = 0) -> tuple[str, str]:
    """The key of ``call`` made under the workflow task's first ``asyncio.wait_for`` after ``before`` such calls,
    and of the next one made without it: 3.11's wait_for runs its awaitable in a task of its own (scope ``1/``),
    3.12's in the caller's task."""
    if sys.version_info < (3, 12):
        return f"1/{call}#1", f"{call}#{before + 1}"
    return f"{call}#{before + 1}", f"{call}#{before + 2}"


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


@step()
async def count(name: str) -> int:
    calls[name] += 1
    return calls[name]


# -- 1. values buffered by one branch while another commits are never dropped ------------------------


@workflow("uuid-gather")
async def uuid_gather(ctx: WorkflowContext, n: int) -> list[Any]:
    async def drawing() -> list[str]:
        await count(f"{n}-a1")
        token = str(ctx.uuid())  # recorded while the other branch commits
        await count(f"{n}-a2")
        return [token, str(ctx.uuid())]

    async def committing() -> int:
        return await count(f"{n}-b1") + await count(f"{n}-b2")

    return list(await asyncio.gather(drawing(), committing()))


async def test_sixty_concurrent_runs_with_uuids_in_gather_all_replay(open_store: Any) -> None:
    """60 runs of a gather whose branches draw ctx.uuid() while siblings commit, under two supervisors of 8: all replay."""
    stores = [await open_store(), await open_store()]
    for i in range(60):
        await stores[0].enqueue(WorkflowTask("uuid-gather", 1, {"n": i}, checkpoint_id=f"u{i}"))
    supervisors = [Supervisor(worker(s, WorkflowDefinition(uuid_gather), worker_id=f"w{j}"), 8,
                              idle_wait=timedelta(seconds=0.05)) for j, s in enumerate(stores)]
    running = [asyncio.create_task(s.run(handle_signals=False)) for s in supervisors]
    try:
        async with asyncio.timeout(60):
            while len(await stores[0].list_runs(status=RunStatus.COMPLETED, limit=100)) < 60:
                await asyncio.sleep(0.05)
    finally:
        for s in supervisors:
            s.stop()
        await asyncio.gather(*running)
    registry = WorkflowRegistry(WorkflowDefinition(uuid_gather))
    problems = []
    for i in range(60):
        problems += await replay_problems(stores[0], registry, f"u{i}", compare_live=False)
        assert len(await keys(stores[0], f"u{i}", "value_recorded")) == 2
    assert not problems, "\n".join(problems)


# -- 2. a suspension runs no code live: finally blocks and async-with exits -------------------------


@workflow("cleanup")
async def cleanup(ctx: WorkflowContext) -> str:
    try:
        await ctx.wait_signal("go")
    finally:
        await count("cleanup")
    return "done"


async def test_a_finally_block_does_not_run_its_step_when_the_run_suspends(store: Any) -> None:
    """A step in a finally block around a wait runs once, when the wait really ends: not at the suspension."""
    definition = WorkflowDefinition(cleanup, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("cleanup", 1, {}, checkpoint_id="c1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    assert calls["cleanup"] == 0 and await event_types(store, "c1") == ["run_started", "signal_wait_started"]
    await send_signal(store, "c1", "go", "s1")
    assert isinstance(await worker(store, definition).run_once(), Completed)
    assert calls["cleanup"] == 1


@workflow("swallows-cancellation")
async def swallows_cancellation(ctx: WorkflowContext) -> list[str]:
    done: list[str] = []
    while len(done) < 2:  # a retry loop that catches everything, the cancellation of a suspension too
        try:
            ctx.now()  # a value drawn while the run unwinds records nothing and raises nothing
            if done:
                await asyncio.sleep(0.05)
                done.append("napped")
            else:
                await ctx.sleep(timedelta(milliseconds=50))
                done.append("slept")
        except BaseException:
            calls["swallowed"] += 1
            continue
    return done


async def test_a_task_that_swallows_the_cancellation_of_a_suspension_does_not_hold_the_worker(store: Any) -> None:
    """Workflow code that catches the CancelledError of a suspension and waits again, forever: each wait it
    makes meanwhile cancels it again at its await (no step runs, nothing is recorded), the teardown gives up
    after a bounded number of passes, and the execution returns; it spun in one loop pass, holding the worker's
    event loop (SIGTERM ignored; helper-18)."""
    definition = WorkflowDefinition(swallows_cancellation)
    await store.enqueue(WorkflowTask("swallows-cancellation", 1, {}, checkpoint_id="sw1"))
    outcome = await asyncio.wait_for(worker(store, definition).run_once(), 10)
    assert isinstance(outcome, Suspended) and calls["swallowed"] > 1
    assert await event_types(store, "sw1") == ["run_started", "value_recorded", "timer_started"]
    outcome = await until_completed(store, definition, each=10)
    assert outcome.output == ["slept", "napped"]


@step()
async def fetched_slowly() -> int:
    await asyncio.sleep(0.2)
    return 42


@workflow("polls")
async def polls(ctx: WorkflowContext, delay: float) -> int:
    task = asyncio.create_task(fetched_slowly())
    while not task.done():  # busy-waiting, as ordinary asyncio allows
        await asyncio.sleep(delay)
    return task.result()


@pytest.mark.parametrize("delay", [0, 1e-6])
async def test_workflow_code_polling_a_task_does_not_hold_the_worker(store: Any, delay: float) -> None:
    """A loop around sleep(0), or around sleeps so short their timers are due at once, while a step runs: the
    driver ran workflow code (and fired timers) without ever letting the worker's loop run, so the step's body
    never ran, nor a renewal or a stop (helper-20)."""
    definition = WorkflowDefinition(polls)
    await store.enqueue(WorkflowTask("polls", 1, {"delay": delay}, checkpoint_id="p1"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == 42
    assert not await replay_problems(store, WorkflowRegistry(definition), "p1", done.output)


@step()
async def fetched_soon() -> int:
    await asyncio.sleep(0.05)
    return 42


@workflow("polls-the-clock")
async def polls_the_clock(ctx: WorkflowContext) -> list[Any]:
    task = asyncio.create_task(fetched_soon())
    start, passes = ctx.now(), 0
    while not task.done():  # a deadline checked on every pass: a value recorded on each
        await asyncio.sleep(0)
        passes += 1
        if ctx.now() - start > timedelta(seconds=30):
            return ["gave up"]
    return [task.result(), passes > 1000]


async def test_a_busy_loop_recording_values_replays(store: Any) -> None:
    """A sleep(0) loop checking ctx.now() records a value per pass, thousands before the step ends; the replay ran
    1,000 callbacks, took the still-running code for blocked and reported a divergence at now#1000 (helper-26)."""
    definition = WorkflowDefinition(polls_the_clock)
    await store.enqueue(WorkflowTask("polls-the-clock", 1, {}, checkpoint_id="pc1"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == [42, True]
    assert not await replay_problems(store, WorkflowRegistry(definition), "pc1", done.output)


@workflow("extends-its-timeout")
async def extends_its_timeout(ctx: WorkflowContext) -> str:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(10) as cm:
        helper = asyncio.create_task(count("helper"))
        helper.add_done_callback(lambda _: cm.reschedule(loop.time() + 20))  # a timer set from a callback
        main = await runs_for(0.3, "main")
    await asyncio.sleep(0.05)  # the run suspends: the rest replays from another execution
    return f"{main}+{await helper}"


async def test_a_timer_set_from_a_callback_replays(store: Any) -> None:
    """asyncio.timeout rescheduled from a done callback while the task awaits a step: the callback's timer went
    into the task's scope, logged before the task's step (which is logged when it completes), and unchanged
    code diverged on replay (helper-20). A callback's calls get a scope of their own."""
    definition = WorkflowDefinition(extends_its_timeout)
    await store.enqueue(WorkflowTask("extends-its-timeout", 1, {}, checkpoint_id="x1"))
    done = await until_completed(store, definition)
    assert done.output == "main+1"
    assert not await replay_problems(store, WorkflowRegistry(definition), "x1", done.output)


@workflow("cut-short")
async def cut_short(ctx: WorkflowContext) -> str:
    try:
        await asyncio.wait_for(runs_for(30, "cut"), 0.05)
    except TimeoutError:
        pass
    forever = asyncio.create_task(asyncio.sleep(math.inf))  # an endless timer: it never fires
    result = await runs_for(0.5, "after")
    forever.cancel()
    return result


async def test_a_step_cut_short_is_committed_at_once_and_an_endless_sleep_never_fires(store: Any) -> None:
    """A step body stopped by a timeout: its call_cancelled is committed before the next step's body ends, so a
    crash meanwhile does not run it again as if it had been in flight; it waited in the buffer for the next
    outcome. asyncio.sleep(math.inf) failed the run (an infinite due time cannot be recorded) (helper-20)."""
    definition = WorkflowDefinition(cut_short)
    await store.enqueue(WorkflowTask("cut-short", 1, {}, checkpoint_id="cs1"))
    running = asyncio.create_task(worker(store, definition).run_once())
    seen: list[str] = []
    while not running.done() and "call_cancelled" not in seen:
        seen = await event_types(store, "cs1")
        await asyncio.sleep(0.02)
    assert "call_cancelled" in seen and "step_completed" not in seen, seen
    done = await running
    assert isinstance(done, Completed) and done.output == "after"
    assert calls == Counter({"cut": 1, "after": 1})
    assert not await replay_problems(store, WorkflowRegistry(definition), "cs1", done.output)


@workflow("sleeps-long")
async def sleeps_long(ctx: WorkflowContext, seconds: float | None) -> str:
    await asyncio.sleep(math.inf if seconds is None else seconds)
    return "woke"


@pytest.mark.parametrize("seconds", [None, 2e9, 1e20])
async def test_an_endless_sleep_never_fires_and_a_long_one_keeps_its_whole_delay(store: Any, seconds: float | None) -> None:
    """asyncio.sleep(math.inf) is a timer with no due time: the run waits with none (no worker ever wakes it for
    the timer); asyncio.sleep(2e9) is due 2e9 s later. Both were cut to 1e9 s, so an endless sleep fired after
    about 31 years, and a 63-year one after 31 (helper-56). A timer due after the year 9999 never fires either:
    at 1e20 s, the testing kit's clock jumped so far that no lease could be represented, and it looped (helper-60)."""
    definition = WorkflowDefinition(sleeps_long)
    await store.enqueue(WorkflowTask("sleeps-long", 1, {"seconds": seconds}, checkpoint_id="sl1"))
    before = await store.now()
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    info = await store.get_run("sl1")
    assert info.status is RunStatus.WAITING
    if seconds is None or seconds > 1e10:
        assert info.due_at is None
    else:
        assert info.due_at is not None and before + seconds - 5 < info.due_at < before + seconds + 5
    report = await replay(definition, info.run_id, await entries(store, "sl1"))
    assert report.divergence is None and report.stopped_at == "timer#1" and not report.finished


@workflow("waits-long")
async def waits_long(ctx: WorkflowContext, days: int) -> str:
    try:
        return str(await ctx.wait_signal("go", timeout=timedelta(days=days)))
    except WaitTimeoutError:
        return "timed out"


@pytest.mark.parametrize("days", [365 * 8000, timedelta.max.days])
async def test_a_signal_wait_whose_deadline_is_after_the_year_9999_never_times_out(store: Any, days: int) -> None:
    """As a timer due after the year 9999 never fires, a wait whose deadline falls after it has none: the run
    waits with no due time. Its deadline was kept: the testing kit skipped to it and the run then failed on
    ctx.now(), or timed out at once with timedelta.max (helper-61)."""
    definition = WorkflowDefinition(waits_long, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("waits-long", 1, {"days": days}, checkpoint_id="wl1"))
    suspended = await worker(store, definition).run_once()
    assert isinstance(suspended, Suspended) and suspended.signals, suspended
    assert (await store.get_run("wl1")).due_at is None
    await send_signal(store, "wl1", "go", "s1", "late")
    done = await until_completed(store, definition)
    assert done.output == "late"


async def test_an_endless_sleep_is_woken_to_fail_when_the_elapsed_budget_runs_out(store: Any) -> None:
    """A run asleep for ever under ``Budget(max_elapsed=...)`` is due when its budget runs out, and fails then;
    with no due time of its own it was never woken (review of the endless-sleep fix)."""
    definition = WorkflowDefinition(sleeps_long, Budget(max_elapsed=timedelta(seconds=0.3)))
    await store.enqueue(WorkflowTask("sleeps-long", 1, {"seconds": None}, checkpoint_id="sl2"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    info = await store.get_run("sl2")
    assert info.due_at is not None and info.reason == "timer timer#1, which never fires"
    await asyncio.sleep(0.4)
    failed = await worker(store, definition).run_once()
    assert isinstance(failed, Failed) and "elapsed seconds ran out" in failed.reason


@workflow("late-for-its-timeout")
async def late_for_its_timeout(ctx: WorkflowContext) -> str:
    try:
        async with asyncio.timeout(0.3):
            await asyncio.sleep(0.1)
            return str(await count("late"))
    except TimeoutError:
        return "timed out"


async def test_a_step_cancelled_before_its_body_started_did_not_run(store: Any) -> None:
    """No worker runs the run until both its sleep and the timeout around it are due: the sleep fires, the step
    it calls is queued, and the timeout cancels it before its body starts. Its ``call_cancelled`` says it did
    not run, and it counts as no step execution; it said ``ran: true`` and counted one (helper-56)."""
    definition = WorkflowDefinition(late_for_its_timeout)
    await store.enqueue(WorkflowTask("late-for-its-timeout", 1, {}, checkpoint_id="lt1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await asyncio.sleep(0.4)  # an outage: both timers are due when a worker comes back
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == "timed out"
    assert calls["late"] == 0
    history = [e.event for e in await entries(store, "lt1")]
    assert [(e.kind, e.ran) for e in history if isinstance(e, CallCancelled)] == [("step", False)]
    assert fold(await entries(store, "lt1")).usage.steps == 0
    assert not await replay_problems(store, WorkflowRegistry(definition), "lt1", done.output)


# -- 3. return_exceptions=True sees only the workflow's own exceptions ------------------------------


@step(retry=RetryPolicy(max_attempts=1))
async def refuses() -> int:
    raise ValueError("no")


@workflow("gathering-exceptions")
async def gathering_exceptions(ctx: WorkflowContext) -> list[str]:
    async def waits() -> str:
        return str(await ctx.wait_signal("go"))

    results = await asyncio.gather(refuses(), waits(), count("sibling"), return_exceptions=True)
    after = await count("after")
    return [type(r).__name__ if isinstance(r, BaseException) else str(r) for r in results] + [str(after)]


async def test_gather_with_return_exceptions_never_sees_a_suspension(store: Any) -> None:
    """A branch that waits suspends the run without handing anything to gather; the results are the real ones."""
    definition = WorkflowDefinition(gathering_exceptions, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("gathering-exceptions", 1, {}, checkpoint_id="g1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    assert calls["after"] == 0
    await send_signal(store, "g1", "go", "s1", {"ok": 1})
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == ["StepFailedError", "{'ok': 1}", "1", "1"]


# -- 4. siblings awaiting asyncio's timers never make unchanged code diverge --------------------------


@workflow("real-time")
async def real_time(ctx: WorkflowContext) -> list[int]:
    gate = asyncio.Event()

    async def a() -> int:
        first = await count("a1")
        await asyncio.sleep(0.01)
        gate.set()
        return first + await count("a2")

    async def b() -> int:
        first = await count("b1")
        await asyncio.sleep(0.02)
        await gate.wait()
        return first + await count("b2")

    results = list(await asyncio.gather(a(), b()))
    await ctx.wait_signal("go")
    return results


async def test_siblings_awaiting_real_time_replay_without_divergence(store: Any) -> None:
    """Branches that await asyncio.sleep or an Event between recorded calls replay cleanly, every time."""
    definition = WorkflowDefinition(real_time, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("real-time", 1, {}, checkpoint_id="r1"))
    await until_waiting_for_signal(store, definition)
    await send_signal(store, "r1", "go", "s1")
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == [2, 2]
    for _ in range(5):
        assert not await replay_problems(store, WorkflowRegistry(definition), "r1", done.output)


@step()
async def runs_for(seconds: float, name: str) -> str:
    calls[name] += 1
    await asyncio.sleep(seconds)
    return name


@workflow("timers-race-steps")
async def timers_race_steps(ctx: WorkflowContext) -> list[str]:
    out: list[str] = []
    task = asyncio.create_task(runs_for(0.3, "outlives"))
    done, _ = await asyncio.wait([task], timeout=0.05)  # never cancels: the step runs on, and is recorded
    out.append(await task)
    if not done:
        out.append(await runs_for(0, "late"))

    async def timer_branch() -> None:
        await asyncio.sleep(0.05)
        out.append("timer")

    async def step_branch() -> None:
        out.append(await runs_for(0.3, "slow"))

    await asyncio.gather(timer_branch(), step_branch())
    inner = asyncio.ensure_future(runs_for(0.3, "shielded"))
    try:
        await asyncio.wait_for(asyncio.shield(inner), 0.05)
    except TimeoutError:
        out.append("shield timed out")
    out.append(await inner)
    await ctx.wait_signal("go")  # the rest replays, from another execution
    return out


async def test_asyncio_timers_are_durable_and_replay_in_their_recorded_place(store: Any) -> None:
    """asyncio's timers (wait's timeout, sleep, wait_for around a shield) fire live while steps run on, and a
    replay fires each at its recorded place among the steps' outcomes: the run continues from another execution
    down the same branches, each step ran once, and the completed run replays to the same result (found by
    helper-19: as real-time waits, the replay handed the steps' outcomes over first and took other branches)."""
    definition = WorkflowDefinition(timers_race_steps, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("timers-race-steps", 1, {}, checkpoint_id="tr1"))
    await until_waiting_for_signal(store, definition)
    expected = ["outlives", "late", "timer", "slow", "shield timed out", "shielded"]
    assert set(await keys(store, "tr1", "timer_fired")) == {"timer#1", "2/timer#1", "timer#2"}
    await send_signal(store, "tr1", "go", "g1")
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == expected
    assert calls == Counter({"outlives": 1, "late": 1, "slow": 1, "shielded": 1})
    for _ in range(3):
        assert not await replay_problems(store, WorkflowRegistry(definition), "tr1", done.output)


@workflow("threaded")
async def threaded(ctx: WorkflowContext) -> str:
    try:
        return await asyncio.to_thread(lambda: "computed")
    except NotImplementedError as exc:
        return str(exc)


async def test_asyncio_to_thread_is_refused_in_workflow_code(store: Any) -> None:
    """Neither the result of asyncio.to_thread nor when it ends is recorded, so workflow code cannot use it: the
    error says to do blocking work in a step."""
    await store.enqueue(WorkflowTask("threaded", 1, {}, checkpoint_id="th1"))
    done = await worker(store, WorkflowDefinition(threaded)).run_once()
    assert isinstance(done, Completed)
    assert "asyncio.to_thread (run_in_executor) is not available in workflow code" in done.output
    assert "do blocking work in a @step" in done.output


# -- 5. live values equal replayed values; what cannot round-trip is refused at the call -------------


@step()
async def unannotated_time():  # type: ignore[no-untyped-def]
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@step()
async def not_a_number() -> float:
    return float("nan")


@step()
async def annotated_time() -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@workflow("odd-values")
async def odd_values(ctx: WorkflowContext, which: str) -> str:
    fn = {"unannotated": unannotated_time, "nan": not_a_number, "annotated": annotated_time}[which]
    try:
        value = await fn()
    except StepFailedError as exc:
        return f"refused: {exc.error_type}: {exc.error}"
    await ctx.wait_signal("go")
    return type(value).__name__


@pytest.mark.parametrize(("which", "expected"), [
    ("unannotated", "refused: runifold.errors.SerializationError"),
    ("nan", "refused: runifold.errors.SerializationError"),
    ("annotated", "datetime"),
])
async def test_a_value_that_cannot_round_trip_is_refused_at_the_call(store: Any, which: str, expected: str) -> None:
    """A step output that would come back different is refused (the step fails for good, naming why); others keep their type."""
    definition = WorkflowDefinition(odd_values, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("odd-values", 1, {"which": which}, checkpoint_id="v1"))
    first = await worker(store, definition).run_once()
    if isinstance(first, Suspended):
        await send_signal(store, "v1", "go", "s1")
        first = await worker(store, definition).run_once()  # a replay: the recorded datetime comes back a datetime
    assert isinstance(first, Completed) and first.output.startswith(expected)
    if which == "unannotated":
        assert "annotate the return type" in first.output
    if which == "nan":
        assert "NaN" in first.output


@pytest.mark.parametrize(("value", "message"), [(float("inf"), "NaN or an infinity"),
                                                 ("a\ud800", "not valid Unicode")])
def test_a_task_input_that_cannot_be_recorded_is_refused_with_serialization_error(value: Any, message: str) -> None:
    """NaN or an infinity in an enqueued input is refused, never stored as null; invalid Unicode too. Both are
    SerializationError, as everywhere a value is recorded (found by helper-15: a lone surrogate was an
    InvalidInputError)."""
    with pytest.raises(SerializationError, match=message):
        WorkflowTask("odd-values", 1, {"which": value})


@pytest.mark.parametrize("leaf", [1.0, None])
@pytest.mark.parametrize("depth", [600, 900])
def test_a_deep_task_input_the_encoder_takes_is_accepted_and_one_deeper_is_refused(depth: int, leaf: Any) -> None:
    """An input nested as deeply as the encoder takes is one a task may hold; comparing it with a re-enqueued task's
    raised a bare RecursionError from depth 500 (helper-53). Deeper still, SerializationError says why."""
    def nested(levels: int) -> list[Any]:
        top = inner = []
        for _ in range(levels):
            inner.append([])
            inner = inner[0]
        inner.append(leaf)  # (a null made the NaN check walk the value, recursively: refused from depth 500)
        return top

    task = WorkflowTask("deep", 1, {"x": nested(depth)})
    written = b"1" if leaf is not None else b"null"
    assert task.input_json() == b'{"x":' + b"[" * (depth + 1) + written + b"]" * (depth + 1) + b"}"
    with pytest.raises(SerializationError, match="nested too deeply"):
        WorkflowTask("deep", 1, {"x": nested(depth + 1000)})


@workflow("changes-its-payload")
async def changes_its_payload(ctx: WorkflowContext) -> list[Any]:
    payload = await ctx.wait_signal("go")
    first = "seen" not in payload
    payload["seen"] = True  # workflow code changes what it was given
    if first:
        await count("first")  # commits the signal's receipt with this step
    await ctx.sleep(timedelta(milliseconds=50))  # the next execution replays the receipt
    return [first, payload]


async def test_workflow_code_that_changes_a_signal_payload_does_not_change_what_is_recorded(store: Any) -> None:
    """The receipt records the payload as it came, and a replay hands the code what it got live. The code changed
    the very dict the receipt held, which was committed later with the change, so the replay took another branch
    and the run diverged (helper-53)."""
    definition = WorkflowDefinition(changes_its_payload, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("changes-its-payload", 1, {}, checkpoint_id="cp1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await send_signal(store, "cp1", "go", "g1", {"n": 1})
    done = await until_completed(store, definition)
    assert done.output == [True, {"n": 1, "seen": True}]
    assert [e.event.payload for e in await entries(store, "cp1") if isinstance(e.event, SignalReceived)] == [{"n": 1}]
    assert not await replay_problems(store, WorkflowRegistry(definition), "cp1", done.output)


change: dict[str, str] = {"to": ""}  # how the code of "grows" differs from the code that ran it


@step()
async def outlives(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "outlived"


@workflow("grows")
async def grows(ctx: WorkflowContext) -> list[int]:
    # a task never awaited, whose step is still running when the workflow returns: the run waits for the body,
    # so the call is recorded, and it replays clean
    asyncio.get_running_loop().create_task(outlives(0.2))
    branches = [count("a"), count("b")] + ([count("c")] if change["to"] == "a branch" else [])
    parts = list(await asyncio.gather(*branches))
    if change["to"] == "a value":
        ctx.now()
    if change["to"] == "a step":
        parts.append(await count("d"))

    async def left_running() -> None:
        await asyncio.sleep(0)
        await count("late")  # called after the workflow returned: never started, never recorded

    asyncio.get_running_loop().create_task(left_running())
    return parts


@pytest.mark.parametrize("to, key", [("a branch", "4/count#1"), ("a value", "now#1"), ("a step", "count#1")])
async def test_code_that_adds_a_call_before_a_completed_run_returned_diverges(store: Any, to: str, key: str) -> None:
    """A completed run recorded every call its workflow made before it returned, so replaying it against code
    that makes one more (a gather branch, a ctx.now(), a step before the return) reports where they part; it
    said "clean" (found by helper-45), while the same change was a divergence on every run not yet finished.
    A call of a task the workflow left running, made after it returned, is not recorded, and replays clean."""
    change["to"] = ""
    await store.enqueue(WorkflowTask("grows", 1, {}, checkpoint_id="g1"))
    done = await until_completed(store, WorkflowDefinition(grows))
    registry = WorkflowRegistry(WorkflowDefinition(grows))
    assert "1/outlives#1" in [e.event.key for e in await entries(store, "g1")]  # waited for, so recorded
    report = await replay_run(store, registry, "g1")
    assert report.clean and report.finished and report.result == done.output
    change["to"] = to
    report = await replay_run(store, registry, "g1")
    assert report.divergence is not None and report.divergence.key == key, report.divergence
    assert "the run's completion" in str(report.divergence)


@workflow("bad-result")
async def bad_result(ctx: WorkflowContext, n: int) -> dict[str, Any]:
    await count("bad-result")
    return {"ratio": float("nan") if n else 1.0}


@pytest.mark.parametrize("n", [1, 0])
async def test_a_result_that_cannot_be_recorded_fails_the_run_and_replays_as_that_failure(store: Any, n: int) -> None:
    """A workflow result NaN cannot be recorded: the run fails, and the debugger replays that failure cleanly."""
    await store.enqueue(WorkflowTask("bad-result", 1, {"n": n}, checkpoint_id="r1"))
    outcome = await worker(store, WorkflowDefinition(bad_result)).run_once()
    report = await replay_run(store, WorkflowRegistry(WorkflowDefinition(bad_result)), "r1")
    assert report.clean and report.finished
    if n:
        assert isinstance(outcome, Failed) and "NaN" in outcome.reason
        assert outcome.reason.startswith("workflow 'bad-result' cannot be recorded: it holds NaN")
        assert report.error is not None and "NaN" in report.error
    else:
        assert isinstance(outcome, Completed) and report.error is None and report.result == {"ratio": 1.0}


@step()
async def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        value = {"k": value}
    return value


@workflow("deep-output")
async def deep_output(ctx: WorkflowContext, depth: int) -> int:
    await nested(depth)
    return depth


async def test_an_output_nested_too_deeply_fails_the_run_once(store: Any) -> None:
    """Outputs nested deeper and deeper: each run completes or fails for good naming the nesting, whether the
    step's output or the event carrying it is what cannot be encoded; none raises, none runs its step again."""
    definition = WorkflowDefinition(deep_output)
    seen = set()
    for depth in [*range(700, 1200), *range(1200, 30000, 400)]:  # where encoding gives up depends on Python
        if seen == {"completed", "failed"}:
            break
        ref = f"d{depth}"
        await store.enqueue(WorkflowTask("deep-output", 1, {"depth": depth}, checkpoint_id=ref))
        outcome = await worker(store, definition).run_once()
        if isinstance(outcome, Failed):
            assert "nested too deeply" in outcome.reason, outcome.reason
            assert (await store.get_run(ref)).status is RunStatus.FAILED
            seen.add("failed")
        else:
            assert isinstance(outcome, Completed) and outcome.output == depth
            seen.add("completed")
    assert seen == {"completed", "failed"}


# -- 6. a retry waits for its own backoff, whatever a sibling's timer says ---------------------------


@step(retry=RetryPolicy(max_attempts=2, initial=timedelta(seconds=30), jitter=0))
async def slow_retry() -> str:
    calls["slow_retry"] += 1
    if calls["slow_retry"] == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


@workflow("retry-beside-timer")
async def retry_beside_timer(ctx: WorkflowContext) -> list[Any]:
    async def ticks() -> int:
        await ctx.sleep(timedelta(milliseconds=100))
        return await count("ticked")

    return list(await asyncio.gather(slow_retry(), ticks()))


async def test_a_retry_backoff_is_honoured_when_a_sibling_timer_wakes_the_run(store: Any) -> None:
    """The sibling's timer wakes the run early; the failed step still waits for its own 30 s backoff."""
    definition = WorkflowDefinition(retry_beside_timer)
    await store.enqueue(WorkflowTask("retry-beside-timer", 1, {}, checkpoint_id="t1"))
    first = await worker(store, definition).run_once()
    assert isinstance(first, Suspended) and first.until is not None
    retry_at = [e.event for e in await entries(store, "t1") if isinstance(e.event, StepFailed)][0].retry_at
    assert retry_at is not None and retry_at - first.until > 25
    await asyncio.sleep(0.15)
    second = await worker(store, definition).run_once()
    assert isinstance(second, Retried) and second.retry_at == pytest.approx(retry_at)
    assert calls["slow_retry"] == 1 and calls["ticked"] == 1


# -- 7. a signal that arrived after the deadline is not delivered as on time ------------------------


@workflow("timeout-around-a-wait")
async def timeout_around_a_wait(ctx: WorkflowContext) -> str:
    try:
        return f"in time: {await asyncio.wait_for(ctx.wait_signal('go'), 0.3)}"
    except TimeoutError:
        pass
    return f"late, then: {await ctx.wait_signal('go', timeout=timedelta(seconds=30))}"


@pytest.mark.parametrize("arrives", ["before", "after"])
async def test_a_timeout_around_a_wait_is_judged_by_when_the_signal_came(store: Any, arrives: str) -> None:
    """A wait_for around a signal wait, and a worker that looks only after the timeout's timer is due: a signal
    that came before it is taken by the wait, one that came after goes to the next wait. The timer fired first
    and the cancelled wait still consumed the signal, which no later wait saw (helper-20)."""
    definition = WorkflowDefinition(timeout_around_a_wait, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("timeout-around-a-wait", 1, {}, checkpoint_id="ta1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    if arrives == "after":
        await asyncio.sleep(0.5)
    await send_signal(store, "ta1", "go", "g1", "yes")
    await asyncio.sleep(0.5)  # the worker looks after the timer is due
    done = await until_completed(store, definition)
    assert done.output == ("in time: yes" if arrives == "before" else "late, then: yes")
    assert not await replay_problems(store, WorkflowRegistry(definition), "ta1", done.output)


@workflow("deadline")
async def deadline(ctx: WorkflowContext) -> str:
    try:
        return str(await ctx.wait_signal("go", timeout=timedelta(milliseconds=200)))
    except WaitTimeoutError:
        return "timed out"


@pytest.mark.parametrize("late", [True, False], ids=["signal-after-deadline", "signal-before-deadline"])
async def test_a_wait_judges_a_signal_by_when_it_arrived_not_by_when_the_worker_looks(store: Any, late: bool) -> None:
    """The worker runs after the deadline either way: a signal that arrived late times out, one on time is received."""
    definition = WorkflowDefinition(deadline, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("deadline", 1, {}, checkpoint_id="d1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    if late:
        await asyncio.sleep(0.3)
        await send_signal(store, "d1", "go", "s1", "hello")
    else:
        await send_signal(store, "d1", "go", "s1", "hello")
        await asyncio.sleep(0.3)
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == ("timed out" if late else "hello")
    received = [e for e in await entries(store, "d1") if isinstance(e.event, SignalReceived)]
    assert len(received) == (0 if late else 1)


# -- 8. a sibling's finished step is committed, never thrown away, when another branch waits ---------


@step()
async def takes_a_while() -> str:
    calls["while"] += 1
    await asyncio.sleep(0.2)
    return "finished"


@workflow("slow-sibling")
async def slow_sibling(ctx: WorkflowContext) -> list[Any]:
    return list(await asyncio.gather(takes_a_while(), ctx.wait_signal("go")))


async def test_a_finished_sibling_step_is_committed_before_the_run_suspends(store: Any) -> None:
    """One branch waits for a signal while another's step is in flight: the step finishes and is recorded, once."""
    definition = WorkflowDefinition(slow_sibling, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("slow-sibling", 1, {}, checkpoint_id="s1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    assert await keys(store, "s1", "step_completed") == ["1/takes_a_while#1"]
    await send_signal(store, "s1", "go", "g1", 7)
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == ["finished", 7] and calls["while"] == 1


# -- 9. CancelledError raised by a step body is a failure like any other -----------------------------


@step(retry=RetryPolicy(max_attempts=2, initial=timedelta(0)))
async def cancels_once() -> str:
    calls["cancels"] += 1
    if calls["cancels"] == 1:
        raise asyncio.CancelledError("a library cancelled itself")
    return "second attempt"


@workflow("cancelling-body")
async def cancelling_body(ctx: WorkflowContext) -> str:
    return await cancels_once()


async def test_a_body_raising_cancelled_error_is_retried(store: Any) -> None:
    """A step body that raises CancelledError (nobody cancelled it) follows its retry policy; the run completes."""
    await store.enqueue(WorkflowTask("cancelling-body", 1, {}, checkpoint_id="x1"))
    done = await worker(store, WorkflowDefinition(cancelling_body)).run_once()
    assert isinstance(done, Completed) and done.output == "second attempt"
    failed = [e.event for e in await entries(store, "x1") if isinstance(e.event, StepFailed)]
    assert [f.error_type for f in failed] == ["asyncio.exceptions.CancelledError"]


# -- 10. lease renewal is anchored to the claim -------------------------------------------------------


@step()
async def outlasts_the_lease() -> str:
    await asyncio.sleep(1.3)
    return "done"


@workflow("long-step")
async def long_step(ctx: WorkflowContext) -> str:
    return await outlasts_the_lease()


async def test_a_claim_that_waited_is_renewed_on_time(store: Any) -> None:
    """A claim driven 0.8 s into a 1 s lease renews at once (the lease is anchored to the claim) and completes."""
    await store.enqueue(WorkflowTask("long-step", 1, {}, checkpoint_id="l1"))
    w = worker(store, WorkflowDefinition(long_step), lease=1.0)
    claim = await w._claim()
    assert claim is not None
    await asyncio.sleep(0.8)
    done = await w._drive(claim)
    assert isinstance(done, Completed), done


class FailingRenewals:
    """A real store whose next ``failures`` renewals raise StoreUnavailableError (the store out of reach)."""

    def __init__(self, store: Any, failures: int) -> None:
        self._store = store
        self.failures = failures
        self.renewed = 0

    async def renew(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailableError("PostgreSQL at test stayed unreachable for 0 s")
        self.renewed += 1
        return await self._store.renew(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_renewal_that_fails_is_tried_again_while_a_body_outlasts_the_lease(store: Any) -> None:
    """A 1.3 s step under a 1 s lease: the first renewal fails, the next ones hold the lease, the run completes."""
    failing = FailingRenewals(store, failures=1)
    await store.enqueue(WorkflowTask("long-step", 1, {}, checkpoint_id="l2"))
    done = await worker(failing, WorkflowDefinition(long_step), lease=1.0).run_once()
    assert isinstance(done, Completed), done
    assert failing.failures == 0 and failing.renewed >= 2, failing.renewed
    info = await store.get_run("l2")
    assert info.status is RunStatus.COMPLETED and info.lease_owner is None


# -- 11. store errors never reach workflow code --------------------------------------------------------


class FailingCommits:
    """A real store whose next ``failures`` commits raise a non-transient StoreError (a full disk, a data error)."""

    def __init__(self, store: Any, failures: int) -> None:
        self._store = store
        self.failures = failures

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise StoreError("SQLite error SQLITE_FULL: database or disk is full")
        return await self._store.commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@workflow("guarded")
async def guarded(ctx: WorkflowContext) -> str:
    try:
        return f"step {await count('guarded')}"
    except Exception as exc:  # a workflow's catch-all must never see the store's troubles
        return f"fallback after {type(exc).__name__}"


async def test_a_store_error_on_commit_is_not_raised_into_the_workflow(store: Any) -> None:
    """The commit fails: nothing is recorded, the worker gets the StoreError, and the next attempt completes."""
    failing = FailingCommits(store, failures=1)
    await store.enqueue(WorkflowTask("guarded", 1, {}, checkpoint_id="f1"))
    with pytest.raises(StoreError):
        await worker(failing, WorkflowDefinition(guarded)).run_once()
    assert await event_types(store, "f1") == ["run_started"]
    done = await worker(failing, WorkflowDefinition(guarded)).run_once()
    assert isinstance(done, Completed) and done.output == "step 2"  # the step ran again: its result was never recorded


class LostAnswers:
    """A real store whose next ``losses`` commits are written but answered with StoreUnavailableError (a lost answer)."""

    def __init__(self, store: Any, losses: int) -> None:
        self._store = store
        self.losses = losses

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        result = await self._store.commit(*args, **kwargs)
        if self.losses:
            self.losses -= 1
            raise StoreUnavailableError("the connection dropped before the answer came back")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_commit_whose_answer_was_lost_is_sent_again_and_recognised(store: Any) -> None:
    """The store wrote the commit but its answer was lost: the worker resends it, the store recognises its own write."""
    await store.enqueue(WorkflowTask("guarded", 1, {}, checkpoint_id="f2"))
    done = await worker(LostAnswers(store, losses=2), WorkflowDefinition(guarded)).run_once()
    assert isinstance(done, Completed) and done.output == "step 1"
    assert await event_types(store, "f2") == ["run_started", "step_completed", "run_completed"]


@workflow("cancelled-behind-a-crowd")
async def cancelled_behind_a_crowd(ctx: WorkflowContext) -> int:
    async def spin() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    first = await count("crowd-first")
    doomed = asyncio.create_task(count("crowd-doomed"))
    await asyncio.sleep(0)  # the doomed branch makes its call
    spinners = [asyncio.create_task(spin()) for _ in range(1200)]
    doomed.cancel()  # its task runs on behind 1200 others: past what one pass of the driver runs
    await asyncio.gather(*spinners)
    await asyncio.gather(doomed, return_exceptions=True)
    return first + await count("crowd-after")


async def test_a_cancellation_whose_task_runs_late_is_recorded_where_the_code_made_it(store: Any) -> None:
    """The driver dropped a call whose awaiting task was cancelled but not yet run on (queued behind more than
    one pass of workflow code), so its cancellation was never recorded live (helper-50)."""
    await store.enqueue(WorkflowTask("cancelled-behind-a-crowd", 1, {}, checkpoint_id="crowd"))
    done = await worker(store, WorkflowDefinition(cancelled_behind_a_crowd)).run_once()
    assert isinstance(done, Completed), done
    history = [(e.type, e.key) for e in await store.history("crowd")]
    assert history[1:4] == [("step_completed", "count#1"), ("call_cancelled", "1/count#1"),
                            ("step_completed", "count#2")], history


class UnreachableCommits:
    """A real store whose commits all raise StoreUnavailableError while its renewals go through."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.sent = 0

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        raise StoreUnavailableError("the statement timed out")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_commit_that_keeps_failing_is_resent_only_while_the_lease_it_began_under_holds(store: Any) -> None:
    """Renewals that go through pushed the resend's end forward: a commit the store never took was sent again
    every half second for as long as the worker lived, holding the run (helper-49). It now gives up once the
    lease it was first sent under has run out; the run is handed back and another attempt takes it."""
    failing = UnreachableCommits(store)
    await store.enqueue(WorkflowTask("guarded", 1, {}, checkpoint_id="f3"))
    with pytest.raises(StoreUnavailableError):
        await asyncio.wait_for(worker(failing, WorkflowDefinition(guarded), lease=1.2).run_once(), timeout=10)
    assert 1 < failing.sent <= 4, failing.sent
    info = await store.get_run("f3")
    assert info.status is RunStatus.READY and info.lease_owner is None, info
    done = await worker(store, WorkflowDefinition(guarded)).run_once()
    assert isinstance(done, Completed) and done.output == "step 2"


# -- 12. budgets count what ran ----------------------------------------------------------------------


@workflow("charges-in-branches")
async def charges_in_branches(ctx: WorkflowContext) -> int:
    async def charged() -> int:
        ctx.charge(6)
        return await count("charged")

    return sum(await asyncio.gather(charged(), charged()))


async def test_charges_in_concurrent_branches_are_all_counted(store: Any) -> None:
    """Two branches charge while steps commit: both charges are recorded and the second exceeds the budget."""
    definition = WorkflowDefinition(charges_in_branches, Budget(max_cost_units=10))
    await store.enqueue(WorkflowTask("charges-in-branches", 1, {}, checkpoint_id="b1"))
    failed = await worker(store, definition).run_once()
    assert isinstance(failed, Failed) and failed.run_failed and "cost units" in failed.reason
    assert calls["charged"] <= 1


@workflow("charges-then-waits")
async def charges_then_waits(ctx: WorkflowContext) -> int:
    for _ in range(3):
        ctx.charge(4)
        ctx.uuid()  # a value drawn right after the charge, recorded with the timer's commit
        await asyncio.sleep(0.01)  # a durable timer, recorded when set
    return 12


async def test_a_run_failed_by_its_cost_budget_replays_and_goes_on_once_the_budget_is_raised(store: Any) -> None:
    """The third charge is refused: the run fails there, and what its code calls after the charge (a value, a
    timer) is not recorded, so its history replays against its code; retried with a larger budget, it completes."""
    from runifold import retry_run

    tight = WorkflowDefinition(charges_then_waits, Budget(max_cost_units=10))
    await store.enqueue(WorkflowTask("charges-then-waits", 1, {}, checkpoint_id="cb1"))
    for _ in range(20):
        outcome = await worker(store, tight).run_once()
        if isinstance(outcome, Failed):
            break
        await asyncio.sleep(0.02)
    assert isinstance(outcome, Failed) and outcome.run_failed and "cost units would reach 12" in outcome.reason
    assert await keys(store, "cb1", "timer_started") == ["timer#1", "timer#2"]
    assert await keys(store, "cb1", "value_recorded") == ["uuid#1", "uuid#2"]
    report = await replay_run(store, WorkflowRegistry(tight), "cb1")
    assert report.clean and report.finished and "cost units would reach 12" in str(report.error), report
    await retry_run(store, "cb1", by="test", reason="raised the budget")
    done = await until_completed(store, WorkflowDefinition(charges_then_waits, Budget(max_cost_units=100)))
    assert done.output == 12 and fold(await entries(store, "cb1")).usage.cost_units == 12


# -- 13. a deploy check names runs whose definition the new code lacks ----------------------------------


async def test_replay_all_reports_runs_of_unregistered_workflows(store: Any) -> None:
    """The compatibility check covers every unfinished run, and reports those no registered definition can continue."""
    await store.enqueue(WorkflowTask("retired-workflow", 3, {}, checkpoint_id="old1"))
    await store.enqueue(WorkflowTask("deadline", 1, {}, checkpoint_id="d1"))
    reports = await check_compatibility(store, WorkflowRegistry(WorkflowDefinition(deadline, signals={"go": {"*"}})))
    by_run = {r.run_id: r for r in reports}
    old = by_run[(await store.get_run("old1")).run_id]
    assert not old.clean and old.divergence is not None and "retired-workflow v3" in str(old.divergence)
    assert by_run[(await store.get_run("d1")).run_id].clean


async def test_replay_all_checks_each_run_once_while_runs_change_status(store: Any) -> None:
    """The check before a deploy runs beside live workers: a run that moves from waiting to ready while the check
    reads the store is checked once. Listed status by status, it was missed (ready had been listed already), and
    a run moving ahead was counted twice (helper-63)."""
    definition = WorkflowDefinition(waits_long, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("waits-long", 1, {"days": 1}, checkpoint_id="m1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await store.enqueue(WorkflowTask("waits-long", 1, {"days": 1}, checkpoint_id="m2"))

    class Moving:
        """The store, where runs move right after the check's first listing."""

        def __init__(self) -> None:
            self.listings = 0

        async def list_runs(self, **kwargs: Any) -> Any:
            page = await store.list_runs(**kwargs)
            self.listings += 1
            if self.listings == 1:  # a worker claims m2 (ready to running) and m1's signal comes
                assert await store.claim("w9", {"waits-long"}, 30.0) is not None
                await send_signal(store, "m1", "go", "s1", "now")
            return page

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

    for bad in ({"limit": -1}, {"limit": 2.5}, {"statuses": ["bogus"]}):  # refused, as list_runs refuses them
        with pytest.raises(InvalidInputError):
            await check_compatibility(store, WorkflowRegistry(definition), **bad)  # type: ignore[arg-type]
    reports = await check_compatibility(Moving(), WorkflowRegistry(definition))  # type: ignore[arg-type]
    ids = [r.run_id for r in reports]
    assert sorted(ids) == sorted([(await store.get_run("m1")).run_id, (await store.get_run("m2")).run_id]), ids
    assert all(r.clean for r in reports)


async def test_replay_all_reads_only_the_runs_it_checks(store: Any) -> None:
    """The check before a deploy asks the store for the statuses it checks: finished runs, however many the store
    keeps, are not read (it read every run of the store, a page at a time, and kept the unfinished ones)."""
    definition = WorkflowDefinition(waits_long, signals={"go": {"*"}})
    for i in range(3):
        await store.enqueue(WorkflowTask("waits-long", 1, {"days": 1}, checkpoint_id=f"f{i}"))
        assert isinstance(await worker(store, definition).run_once(), Suspended)
        await send_signal(store, f"f{i}", "go", f"s{i}", "now")
        assert isinstance(await worker(store, definition).run_once(), Completed)
    await store.enqueue(WorkflowTask("waits-long", 1, {"days": 1}, checkpoint_id="open"))
    read: list[RunStatus] = []

    class Counting:
        async def list_runs(self, **kwargs: Any) -> Any:
            page = await store.list_runs(**kwargs)
            read.extend(info.status for info in page)
            return page

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

    reports = await check_compatibility(Counting(), WorkflowRegistry(definition))  # type: ignore[arg-type]
    assert [r.run_id for r in reports] == [(await store.get_run("open")).run_id] and reports[0].clean
    assert read == [RunStatus.READY]
    read.clear()
    finished = await check_compatibility(Counting(), WorkflowRegistry(definition),  # type: ignore[arg-type]
                                         statuses={RunStatus.COMPLETED})
    assert len(finished) == 3 and all(r.clean for r in finished) and read == [RunStatus.COMPLETED] * 3


async def test_replay_all_checks_every_unfinished_run_page_after_page(store: Any, monkeypatch: Any) -> None:
    """The check before a deploy has no cap: it read at most 100,000 runs and said nothing, so a diverging run
    older than a backlog of 100,000 ready ones passed (helper-73). Here pages of 2 stand for pages of 1,000;
    ``limit`` still checks only the newest ones, and the reports come one at a time."""
    from runifold.worker import _debug, compatibility_reports

    monkeypatch.setattr(_debug, "_PAGE", 2)
    definition = WorkflowDefinition(waits_long, signals={"go": {"*"}})
    ids = [(await store.enqueue(WorkflowTask("waits-long", 1, {"days": 1}, checkpoint_id=f"pg{i}"))).run_id
           for i in range(5)]
    reports = await check_compatibility(store, WorkflowRegistry(definition))
    assert [r.run_id for r in reports] == sorted(ids, reverse=True) and all(r.clean for r in reports)
    assert [r.run_id for r in await check_compatibility(store, WorkflowRegistry(definition), limit=3)] == \
        sorted(ids, reverse=True)[:3]
    assert await check_compatibility(store, WorkflowRegistry(definition), limit=0) == []
    streamed = [r.run_id async for r in compatibility_reports(store, WorkflowRegistry(definition))]
    assert streamed == sorted(ids, reverse=True)


@workflow("takes-days")
async def takes_days(ctx: WorkflowContext, days: str) -> str:
    return days


async def test_an_input_the_code_does_not_fit_diverges_unless_the_live_run_failed_on_it(store: Any) -> None:
    """A waiting run whose input today's code no longer takes diverges at (input); a run whose input its own
    code refused failed there, and its replay says so, cleanly (it was reported as diverging)."""
    await store.enqueue(WorkflowTask("takes-days", 1, {"days": 3}, checkpoint_id="in1"))
    failed = await worker(store, WorkflowDefinition(takes_days)).run_once()
    assert isinstance(failed, Failed) and failed.run_failed
    report = await replay_run(store, WorkflowRegistry(WorkflowDefinition(takes_days)), "in1")
    assert report.clean and report.finished and "expects 'str'" in str(report.error), report
    from runifold import retry_run

    await retry_run(store, "in1", by="test", reason="retried with the same code")  # ready: it would fail again
    report = await replay_run(store, WorkflowRegistry(WorkflowDefinition(takes_days)), "in1")
    assert report.divergence is not None and report.divergence.key == "(input)", report  # (review: it was clean)
    await store.enqueue(WorkflowTask("waits-long", 1, {"days": 3}, checkpoint_id="in2"))
    assert isinstance(await worker(store, WorkflowDefinition(waits_long, signals={"go": {"*"}})).run_once(), Suspended)

    @workflow("waits-long")
    async def waits_long_by_name(ctx: WorkflowContext, days: str) -> str:
        return days

    report = await replay_run(store, WorkflowRegistry(WorkflowDefinition(waits_long_by_name)), "in2")
    assert report.divergence is not None and report.divergence.key == "(input)", report


@workflow("two-counts")
async def two_counts(ctx: WorkflowContext) -> int:
    return await count("one") + await count("two")


async def test_the_debugger_reports_why_the_engine_failed_a_run(store: Any) -> None:
    """A run the engine failed where its replay stops (a step over the budget) is reported finished, with the
    recorded reason; it was reported unfinished and without error, stopped at the refused step (review)."""
    definition = WorkflowDefinition(two_counts, Budget(max_steps=1))
    await store.enqueue(WorkflowTask("two-counts", 1, {}, checkpoint_id="ef1"))
    failed = await worker(store, definition).run_once()
    assert isinstance(failed, Failed) and failed.run_failed
    report = await replay_run(store, WorkflowRegistry(definition), "ef1")
    assert report.clean and report.finished and report.stopped_at is None, report
    assert "steps would reach 2" in str(report.error), report


@workflow("leaves-a-call-unstarted")
async def leaves_a_call_unstarted(ctx: WorkflowContext) -> str:
    await count("main")
    asyncio.create_task(count("background"))  # a task the workflow leaves running: its step never starts
    await asyncio.sleep(0)  # (the task makes its call before the workflow returns)
    return "returned"


async def test_a_step_a_left_task_called_but_never_started_does_not_fail_the_replay(store: Any) -> None:
    """A call a task left running made before the workflow returned, and that never started, is dropped
    unrecorded (concepts.md); the completed run's replay called it 'added' and diverged, so the check before a
    deploy and assert_replays failed on fire-and-forget code (helper-66)."""
    definition = WorkflowDefinition(leaves_a_call_unstarted)
    await store.enqueue(WorkflowTask("leaves-a-call-unstarted", 1, {}, checkpoint_id="lt1"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == "returned" and calls == Counter({"main": 1})
    report = await replay_run(store, WorkflowRegistry(definition), "lt1")
    assert report.clean and report.finished and report.result == "returned", report


@workflow("gathers-two")
async def gathers_two(ctx: WorkflowContext) -> list[int]:
    background = asyncio.create_task(count("fire"))  # left running; its step starts before the workflow returns
    done = list(await asyncio.gather(count("a"), count("b")))
    await background
    return done


async def test_a_completed_run_replayed_against_code_that_added_a_call_in_a_task_diverges(store: Any) -> None:
    """Review of the fix above (helper-67): a call another task makes while the workflow still runs (a step
    gather gained, an effect a left task gained) would have started live, so a completed run without it diverges;
    the exemption is only for calls made in the pass in which the workflow returned."""
    definition = WorkflowDefinition(gathers_two)
    await store.enqueue(WorkflowTask("gathers-two", 1, {}, checkpoint_id="gt1"))
    assert isinstance(await worker(store, definition).run_once(), Completed)

    @workflow("gathers-two")
    async def gathers_three(ctx: WorkflowContext) -> list[int]:
        background = asyncio.create_task(count("fire"))
        done = list(await asyncio.gather(count("a"), count("b"), count("c")))  # a step added to the gather
        await background
        return done

    @workflow("gathers-two")
    async def fires_twice(ctx: WorkflowContext) -> list[int]:
        asyncio.create_task(count("fire again"))  # a new task, never awaited, made while the workflow runs on
        background = asyncio.create_task(count("fire"))
        done = list(await asyncio.gather(count("a"), count("b")))
        await background
        return done

    for changed in (gathers_three, fires_twice):
        report = await replay_run(store, WorkflowRegistry(WorkflowDefinition(changed)), "gt1")
        assert report.divergence is not None, (changed.__name__, report)


async def test_the_debugger_reports_a_cancelled_run_as_cancelled(store: Any) -> None:
    """A run an operator cancelled replays up to its cancellation and is reported finished and cancelled, by whom
    and why, with the call its code waited at; it read like a run still waiting (helper-70)."""
    from runifold import cancel_run
    from runifold.worker import replay_run

    definition = WorkflowDefinition(deadline, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("deadline", 1, {}, checkpoint_id="c1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await cancel_run(store, "c1", by="ops", reason="not needed")
    report = await replay_run(store, WorkflowRegistry(definition), "c1")
    assert report.clean and report.finished and report.cancelled
    assert report.error == "cancelled by ops: not needed" and report.stopped_at == "wait.go#1"
    waiting = WorkflowTask("deadline", 1, {}, checkpoint_id="w2")
    await store.enqueue(waiting)
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    assert not (await replay_run(store, WorkflowRegistry(definition), "w2")).cancelled


async def test_the_debugger_reports_where_an_unfinished_run_waits(store: Any) -> None:
    """Replaying a waiting run stops at its wait: not finished, no error, stopped at the wait's key."""
    from runifold.worker import replay_run

    definition = WorkflowDefinition(deadline, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("deadline", 1, {}, checkpoint_id="w1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    report = await replay_run(store, WorkflowRegistry(definition), "w1")
    assert report.clean and not report.finished and report.error is None
    assert report.stopped_at == "wait.go#1"


# -- calls the code stops waiting for, and real-time branches beside recorded outcomes --------------


@step()
async def lingering(name: str) -> str:
    calls[f"{name} started"] += 1
    await asyncio.sleep(30)
    calls[f"{name} finished"] += 1
    return name


@workflow("timeouts-around-steps")
async def timeouts_around_steps(ctx: WorkflowContext) -> list[Any]:
    out: list[Any] = []
    try:
        async with asyncio.timeout(0.05):
            out.append(await lingering("under-timeout"))
    except TimeoutError:
        out.append("timeout")
    out.append(await count("next-in-the-same-task"))
    try:
        out.append(await asyncio.wait_for(lingering("under-wait-for"), 0.05))
    except TimeoutError:
        out.append("wait_for timeout")
    out.append(ctx.uuid().version)
    await ctx.wait_signal("go")
    return out


async def test_a_step_the_code_stops_waiting_for_is_cancelled_and_replays(store: Any) -> None:
    """asyncio.timeout and wait_for around a step: its body is cancelled, call_cancelled is recorded before
    the task's next call, nothing of the step is recorded later, and the run replays exactly (also after it
    suspended, from another execution)."""
    from runifold.history import CallCancelled

    definition = WorkflowDefinition(timeouts_around_steps, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("timeouts-around-steps", 1, {}, checkpoint_id="t1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    history = await entries(store, "t1")
    cancelled = [e.event for e in history if isinstance(e.event, CallCancelled)]
    under_wait_for, _ = wait_for_keys("lingering", before=1)
    assert [(c.key, c.kind, c.ran) for c in cancelled] == [("lingering#1", "step", True),
                                                            (under_wait_for, "step", True)]
    order = [e.event.key for e in history if e.event.key]
    assert order.index("lingering#1") < order.index("count#1") < order.index(under_wait_for)
    assert calls["under-timeout started"] == calls["under-wait-for started"] == 1
    assert calls["under-timeout finished"] == calls["under-wait-for finished"] == 0
    await send_signal(store, "t1", "go", "g1")
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == ["timeout", 1, "wait_for timeout", 4]
    assert calls["under-timeout started"] == 1 and calls["next-in-the-same-task"] == 1  # replayed, not rerun
    assert not await replay_problems(store, WorkflowRegistry(definition), "t1", done.output)


@step(retry=RetryPolicy(max_attempts=3, initial=timedelta(milliseconds=100), jitter=0))
async def fails_slowly(name: str) -> int:
    calls[name] += 1
    raise RuntimeError(f"{name} fails")


@workflow("thread-beside-a-failure")
async def thread_beside_a_failure(ctx: WorkflowContext) -> list[Any]:
    async def threaded_then_timer() -> None:
        await asyncio.sleep(0.05)  # a durable timer: the sibling's first attempt fails meanwhile
        await ctx.sleep(timedelta(hours=1))  # recorded as started before the sibling's failure

    failed: list[Any] = []
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(threaded_then_timer())
            tg.create_task(fails_slowly("sibling"))
    except* StepFailedError as group:
        failed = [type(e).__name__ for e in group.exceptions]
    return failed


async def test_an_outcome_waits_for_calls_the_live_run_made_before_it(store: Any) -> None:
    """A branch behind an asyncio timer reached a durable sleep before its sibling failed for good; a replay
    hands the failure over only once that branch has made the call, so the TaskGroup cancels it at the same
    point."""
    definition = WorkflowDefinition(thread_beside_a_failure)
    await store.enqueue(WorkflowTask("thread-beside-a-failure", 1, {}, checkpoint_id="f1"))
    done = await until_completed(store, definition)  # the run suspends while the step's retries back off
    assert done.output == ["StepFailedError"] and calls["sibling"] == 3
    assert "1/sleep#1" in await keys(store, "f1", "timer_started")
    for _ in range(3):
        problems = await asyncio.wait_for(replay_problems(store, WorkflowRegistry(definition), "f1", done.output), 10)
        assert not problems


@workflow("abandoned-waits")
async def abandoned_waits(ctx: WorkflowContext) -> list[Any]:
    out: list[Any] = []
    try:
        out.append(await asyncio.wait_for(ctx.wait_signal("go"), 0.05))
    except TimeoutError:
        out.append("no signal in time")
    try:
        async with asyncio.timeout(0.05):
            await ctx.sleep(timedelta(seconds=0.3))  # due long before the run resumes
        out.append("slept")
    except TimeoutError:
        out.append("sleep cut short")
    out.append(await ctx.wait_signal("go"))
    return out


async def test_timers_and_waits_the_code_stops_waiting_for_are_cancelled(store: Any) -> None:
    """A signal wait under wait_for and a durable sleep under asyncio.timeout: call_cancelled is recorded for
    each, the checkpoint lists only the wait still open, the cancelled timer never fires (even once its time
    has passed), the next signal goes to the live wait, and the run replays exactly."""
    from runifold.history import CallCancelled, fold

    definition = WorkflowDefinition(abandoned_waits, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("abandoned-waits", 1, {}, checkpoint_id="a1"))
    for _ in range(100):  # the timeouts are durable timers: the run suspends until each is due
        assert isinstance(await worker(store, definition).run_once(), (Suspended, Idle))
        history = await entries(store, "a1")
        cancelled = [(e.event.key, e.event.kind) for e in history if isinstance(e.event, CallCancelled)]
        if len(cancelled) == 2:
            break
        await asyncio.sleep(0.02)
    under_wait_for, later = wait_for_keys("wait.go")
    assert cancelled == [(under_wait_for, "signal"), ("sleep#1", "timer")]
    assert await keys(store, "a1", "timer_fired") == ["timer#1", "timer#2"]  # the timeouts' timers
    assert [w.key for w in fold(history).waits] == [later]
    await asyncio.sleep(0.4)  # the abandoned timer's time passes
    assert isinstance(await worker(store, definition).run_once(), Idle)  # nothing is due: the timer does not wake it
    await send_signal(store, "a1", "go", "g1", "approved")
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == ["no signal in time", "sleep cut short", "approved"]
    assert "sleep#1" not in await keys(store, "a1", "timer_fired")
    assert not await replay_problems(store, WorkflowRegistry(definition), "a1", done.output)
    report = await replay_run(store, WorkflowRegistry(definition), "a1")  # the debugger lists what was cancelled
    assert report.steps == [("timer#1", "timer fired"), (under_wait_for, "cancelled"), ("timer#2", "timer fired"),
                            ("sleep#1", "cancelled"), (later, "signal received")]


@workflow("as-completed-unordered")
async def as_completed_unordered(ctx: WorkflowContext) -> list[int]:
    made = [count("g1"), count("g2"), count("g3")]
    try:
        return [await f for f in asyncio.as_completed(set(made))]
    finally:
        for coroutine in made:
            coroutine.close()  # the ones as_completed never started


async def test_as_completed_over_coroutines_in_no_order_is_refused(store: Any) -> None:
    """as_completed starts the coroutines of a set (or an iterator) in an arbitrary order and there is no list of
    them: the run fails saying to pass a list (a list is numbered by its places; the corpus runs that shape)."""
    await store.enqueue(WorkflowTask("as-completed-unordered", 1, {}, checkpoint_id="g1"))
    outcome = await worker(store, WorkflowDefinition(as_completed_unordered)).run_once()
    assert isinstance(outcome, Failed) and "as_completed" in outcome.reason and "list or tuple" in outcome.reason


@step()
async def takes(name: str, seconds: float) -> str:
    calls[f"{name} started"] += 1
    await asyncio.sleep(seconds)
    return name


@workflow("timer-beside-a-slow-step")
async def timer_beside_a_slow_step(ctx: WorkflowContext) -> list[str]:
    async def after_a_nap() -> str:
        await ctx.sleep(timedelta(seconds=0.3))
        return await takes("after-the-timer", 0)

    return list(await asyncio.gather(takes("slow", 1.0), after_a_nap(), takes("quick", 0.05)))


async def test_a_timer_due_at_a_recovery_fires_beside_a_step_run_again(store: Any) -> None:
    """An execution ends (its worker stopped) with a slow step in flight and a timer started; the next one finds the
    timer due: it fires and its branch carries on while the slow step runs again, not after it."""
    definition = WorkflowDefinition(timer_beside_a_slow_step)
    await store.enqueue(WorkflowTask("timer-beside-a-slow-step", 1, {}, checkpoint_id="t1"))
    first = asyncio.create_task(worker(store, definition).run_once())
    while "3/takes#1" not in await keys(store, "t1", "step_completed"):  # quick's step is committed
        await asyncio.sleep(0.02)
    first.cancel()  # the worker stops: the lease is released, the slow step was never recorded
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.sleep(0.35)  # the timer is due now
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == ["slow", "after-the-timer", "quick"]
    completed = await keys(store, "t1", "step_completed")
    assert completed.index("2/takes#1") < completed.index("1/takes#1"), completed


@step()
async def briefly() -> str:
    await asyncio.sleep(0.03)
    return "done"


@workflow("polls-a-step")
async def polls_a_step(ctx: WorkflowContext) -> list[Any]:
    task = asyncio.create_task(briefly())
    passes = 0
    while not task.done():
        passes += 1
        ctx.now()
        await asyncio.sleep(0)
    await ctx.sleep(timedelta(milliseconds=10))  # the rest replays from another execution
    return [task.result(), passes]


async def test_a_step_polled_by_a_busy_loop_is_seen_at_the_same_pass_on_replay(store: Any) -> None:
    """Live, a step's committed outcome is handed over before workflow code runs on; the replay ran another
    1,000 callbacks first, so the loop counted 1,000 more passes and made 1,000 unrecorded ctx.now() calls, and a
    run resumed from another execution diverged (helper-29)."""
    definition = WorkflowDefinition(polls_a_step)
    await store.enqueue(WorkflowTask("polls-a-step", 1, {}, checkpoint_id="ps1"))
    done = await until_completed(store, definition)
    assert done.output[0] == "done" and done.output[1] > 1000
    assert not await replay_problems(store, WorkflowRegistry(definition), "ps1", done.output)


@step()
async def instant(tag: str) -> str:
    return tag


@workflow("cancels-a-finished-sibling")
async def cancels_a_finished_sibling(ctx: WorkflowContext) -> list[Any]:
    ta, tb, tc = (asyncio.create_task(instant(t)) for t in "abc")
    marks: dict[str, int] = {}

    async def busy() -> dict[str, int]:
        i = 0
        while not tc.done():
            ctx.random()  # a recorded value on every pass pins how far the code ran between hand-overs
            i += 1
            if ta.done() and "a" not in marks:
                marks["a"] = i
            await asyncio.sleep(0)
        marks["c"] = i
        return marks

    counting = asyncio.create_task(busy())
    await ta
    tb.cancel()  # b's outcome is committed with a's and c's, not yet handed over
    await tc
    m = await counting
    return [m["c"] - m["a"], tb.cancelled()]


async def test_an_outcome_the_code_cancelled_costs_the_replay_the_pass_it_cost_live(store: Any) -> None:
    """Outcomes committed together are handed over one per pass of workflow code; one the code had cancelled
    was a no-op pass live, but the replay skipped it, handed the next over a pass early and diverged (helper-30)."""
    definition = WorkflowDefinition(cancels_a_finished_sibling)
    await store.enqueue(WorkflowTask("cancels-a-finished-sibling", 1, {}, checkpoint_id="cf1"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output[1] is True
    assert not await replay_problems(store, WorkflowRegistry(definition), "cf1", done.output)


@workflow("leaves-a-busy-task")
async def leaves_a_busy_task(ctx: WorkflowContext) -> str:
    async def forever() -> None:
        while True:
            await asyncio.sleep(0)

    asyncio.create_task(forever())
    return await instant("done")


async def test_a_task_left_busy_when_the_workflow_returns_does_not_hold_the_run(store: Any) -> None:
    """The workflow returned while a task it left ran a sleep(0) loop: the driver ran that task forever and the
    run never completed (helper-30). Tasks left running are cancelled when the workflow returns."""
    definition = WorkflowDefinition(leaves_a_busy_task)
    await store.enqueue(WorkflowTask("leaves-a-busy-task", 1, {}, checkpoint_id="lb1"))
    done = await asyncio.wait_for(worker(store, definition).run_once(), 10)
    assert isinstance(done, Completed) and done.output == "done"
    assert not await replay_problems(store, WorkflowRegistry(definition), "lb1", done.output)


@effect(resume=ResumePolicy.REPEAT)
async def pays(key: str, tag: str) -> str:
    return tag


@workflow("abandons-an-effect-beside-a-busy-branch")
async def abandons_an_effect_beside_a_busy_branch(ctx: WorkflowContext) -> list[Any]:
    async def timed() -> str:
        try:
            return await asyncio.wait_for(pays("e1"), 0.0001)
        except TimeoutError:
            return "timed out"

    async def late() -> str:
        for _ in range(5):
            await asyncio.sleep(0)
        return await pays("e2")

    t1, t2 = asyncio.create_task(timed()), asyncio.create_task(late())
    passes = 0
    while not t2.done():
        ctx.now()
        passes += 1
        await asyncio.sleep(0)
    return [await t1, await t2, passes > 0]


async def test_an_abandoned_effects_outcome_is_passed_at_its_place_on_replay(store: Any) -> None:
    """An effect abandoned by its timeout runs on; its outcome, committed with a sibling's, was skipped by the
    replay before the calls recorded ahead of it were made again, so the sibling's came too early (helper-30)."""
    definition = WorkflowDefinition(abandons_an_effect_beside_a_busy_branch)
    await store.enqueue(WorkflowTask("abandons-an-effect-beside-a-busy-branch", 1, {}, checkpoint_id="ae1"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == ["timed out", "e2", True]
    assert not await replay_problems(store, WorkflowRegistry(definition), "ae1", done.output)
