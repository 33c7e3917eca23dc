"""Retrying a failed run (``retry_run``, ``runifold retry``) on every store, around the shapes workflow code takes.

A retry gives the call whose failure ended the run another attempt, and the replay returns everything else as
recorded. That is sound only if workflow code made no call after the failure reached it: a compensation, a
cleanup in ``finally`` or a sibling a TaskGroup cancelled would not be made again by a replay in which the call
succeeds, so such a run is refused, with nothing appended to its history. Every retried run that completes
replays cleanly against its code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from runifold import (
    Budget,
    Completed,
    Failed,
    InvalidStateError,
    RetryPolicy,
    RunStatus,
    StepFailedError,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    retry_run,
    step,
    workflow,
)
from runifold.history import RunFailed
from runifold.worker import replay_run
from tests.support import NO_WAIT, entries, event_types, until_completed, worker

#: while set, book_flight fails; the "deploy" of a fix clears it
broken = {"flight": True}
ran: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    broken["flight"] = True
    ran.clear()


@step(retry=RetryPolicy(max_attempts=2, initial=NO_WAIT))
async def book_flight(trip: str) -> str:
    ran.append("book_flight")
    if broken["flight"]:
        raise ConnectionError("the airline is down")
    return f"flight for {trip}"


@step()
async def book_hotel(trip: str) -> str:
    ran.append("book_hotel")
    return f"hotel for {trip}"


@step()
async def cancel_hotel(booking: str) -> str:
    ran.append("cancel_hotel")
    return f"cancelled {booking}"


@step()
async def pack(trip: str) -> str:
    ran.append("pack")
    await asyncio.sleep(0.2)  # still running when the flight fails
    return f"packed for {trip}"


@step()
async def quick(trip: str) -> str:
    ran.append("quick")
    return f"quick {trip}"


@workflow("plain-trip")
async def plain_trip(ctx: WorkflowContext, trip: str) -> list[str]:
    hotel = await book_hotel(trip)
    return [hotel, await book_flight(trip)]


@workflow("saga-trip")
async def saga_trip(ctx: WorkflowContext, trip: str) -> list[str]:
    hotel = await book_hotel(trip)
    try:
        return [hotel, await book_flight(trip)]
    except StepFailedError:
        await cancel_hotel(hotel)  # compensate, then fail
        raise


@workflow("finally-trip")
async def finally_trip(ctx: WorkflowContext, trip: str) -> str:
    try:
        return await book_flight(trip)
    finally:
        await cancel_hotel("cleanup")


@workflow("taskgroup-trip")
async def taskgroup_trip(ctx: WorkflowContext, trip: str) -> list[str]:
    async with asyncio.TaskGroup() as group:
        packing = group.create_task(pack(trip))  # cancelled by the group when the flight fails
        flight = group.create_task(book_flight(trip))
    return [packing.result(), flight.result()]


@workflow("taskgroup-done-trip")
async def taskgroup_done_trip(ctx: WorkflowContext, trip: str) -> list[str]:
    async with asyncio.TaskGroup() as group:
        first = group.create_task(quick(trip))
        await first  # finished before the flight is tried: the group cancels nothing
        flight = group.create_task(book_flight(trip))
    return [first.result(), flight.result()]


@workflow("timeout-trip")
async def timeout_trip(ctx: WorkflowContext, trip: str) -> str:
    return await asyncio.wait_for(book_flight(trip), 60)  # the failure cancels the timeout's timer


@workflow("gather-trip")
async def gather_trip(ctx: WorkflowContext, trip: str) -> list[str]:
    return list(await asyncio.gather(pack(trip), book_flight(trip)))


DEFINITIONS = {fn.__name__: WorkflowDefinition(fn) for fn in
               (plain_trip, saga_trip, finally_trip, taskgroup_trip, taskgroup_done_trip, timeout_trip, gather_trip)}


async def _fail(store: Any, definition: WorkflowDefinition, ref: str) -> RunFailed:
    await store.enqueue(WorkflowTask(definition.name, 1, {"trip": "rome"}, checkpoint_id=ref))
    for _ in range(5):
        outcome = await worker(store, definition).run_once()
        if isinstance(outcome, Failed):
            break
    assert (await store.get_run(ref)).status is RunStatus.FAILED
    last = (await entries(store, ref))[-1].event
    assert isinstance(last, RunFailed)
    return last


async def _completes_and_replays(store: Any, definition: WorkflowDefinition, ref: str) -> Any:
    done = await until_completed(store, definition)
    assert isinstance(done, Completed)
    registry = WorkflowRegistry()
    registry.register(definition)
    report = await replay_run(store, registry, ref)
    assert report.divergence is None and report.finished and report.error is None
    return done.output


@pytest.mark.parametrize("name", ["plain_trip", "taskgroup_done_trip", "gather_trip"])
async def test_a_failure_the_code_let_through_gets_another_attempt(store: Any, name: str) -> None:
    """The failed call's error went straight out of the workflow (a TaskGroup's ExceptionGroup of one error
    included): a retry after the fix gives that call another attempt, the run completes and replays."""
    definition = DEFINITIONS[name]
    failed = await _fail(store, definition, "t1")
    assert failed.key.endswith("book_flight#1") and not failed.handled
    broken["flight"] = False
    await retry_run(store, "t1", by="ops", reason="the airline is back")
    ran.clear()
    output = await _completes_and_replays(store, definition, "t1")
    assert output[-1] == "flight for rome" and ran == ["book_flight"]  # nothing else ran again


@pytest.mark.parametrize("name", ["saga_trip", "finally_trip", "taskgroup_trip", "timeout_trip"])
async def test_a_failure_the_code_went_on_from_is_refused(store: Any, name: str) -> None:
    """Workflow code made calls after the failure reached it (a compensation, a cleanup in finally, a sibling the
    TaskGroup cancelled, the timer of a wait_for it cancelled): the retry is refused, saying why and what to do, and the history is untouched."""
    definition = DEFINITIONS[name]
    failed = await _fail(store, definition, "t1")
    assert failed.handled
    before = await event_types(store, "t1")
    with pytest.raises(InvalidStateError, match="cannot be retried: after .*book_flight#1 failed, or while handling "
                                                "an error its failure came from, its workflow code made more calls .* "
                                                "start a new run instead"):
        await retry_run(store, "t1", by="ops", reason="the airline is back")
    assert await event_types(store, "t1") == before
    assert (await store.get_run("t1")).status is RunStatus.FAILED


@workflow("spender")
async def spender(ctx: WorkflowContext) -> str:
    for trip in ("a", "b", "c"):
        await quick(trip)
    return "spent"


async def test_retrying_a_run_failed_on_its_budget_warns_that_it_fails_again(
        store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Usage only grows, so a run the engine failed on its budget fails again at once when retried as it is: the
    retry says so (helper-40: it printed `retried ...: ready` and the run failed again without a word). With the
    workers' definition allowing more, the retried run completes."""
    tight = WorkflowDefinition(spender, Budget(max_steps=2))
    await store.enqueue(WorkflowTask("spender", 1, {}, checkpoint_id="b1"))
    failed = await worker(store, tight).run_once()
    assert isinstance(failed, Failed) and "budget exceeded" in failed.reason
    with caplog.at_level("WARNING", logger="runifold.admin"):
        await retry_run(store, "b1", by="ops", reason="more budget")
    warned = [r for r in caplog.records if r.name == "runifold.admin" and r.levelname == "WARNING"]
    assert [r.event for r in warned] == ["run_retried_over_budget"]  # type: ignore[attr-defined]
    assert "it fails again at once unless" in warned[0].hint  # type: ignore[attr-defined]
    again = await worker(store, tight).run_once()
    assert isinstance(again, Failed) and "steps would reach" in again.reason
    await retry_run(store, "b1", by="ops", reason="more budget")
    done = await until_completed(store, WorkflowDefinition(spender, Budget(max_steps=10)))
    assert done.output == "spent"


@step(retry=RetryPolicy(max_attempts=5, initial=NO_WAIT))
async def book_train(trip: str) -> str:
    ran.append("book_train")
    if broken["flight"]:
        raise ConnectionError("the railway is down")
    return f"train for {trip}"


@workflow("train_trip")
async def train_trip(ctx: WorkflowContext, trip: str) -> str:
    return await book_train(trip)


async def test_a_run_failed_on_its_retry_budget_gets_one_more_attempt_when_retried(
        store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """An operator's retry is not one of the automatic retries ``max_retries`` counts: a run failed on its retry
    budget, retried as it is, gives the call one more attempt, and fails on the budget again only if that attempt
    fails. The warning says so (helper-67: it said the run fails again at once, and the run completed)."""
    tight = WorkflowDefinition(train_trip, Budget(max_retries=1))
    failed = await _fail(store, tight, "r1")
    assert "retries would reach 2" in failed.reason and ran == ["book_train"] * 2
    with caplog.at_level("WARNING", logger="runifold.admin"):
        await retry_run(store, "r1", by="ops", reason="one more try")
    warned = [r for r in caplog.records if r.name == "runifold.admin" and r.levelname == "WARNING"]
    assert [r.event for r in warned] == ["run_retried_over_budget"]  # type: ignore[attr-defined]
    assert "book_train#1 gets one more attempt; if it fails, the run fails again" in warned[0].hint  # type: ignore[attr-defined]
    again = await worker(store, tight).run_once()  # still down: the one attempt fails, and the budget ends the run
    assert isinstance(again, Failed) and "retries would reach 2" in again.reason and ran == ["book_train"] * 3
    broken["flight"] = False
    await retry_run(store, "r1", by="ops", reason="the railway is back")
    done = await until_completed(store, tight)
    assert done.output == "train for rome" and ran == ["book_train"] * 4
    report = await replay_run(store, WorkflowRegistry(tight), "r1")
    assert report.clean and report.finished


@step(retry=RetryPolicy(max_attempts=3, initial=timedelta(hours=1)))
async def slow_to_recover(trip: str) -> str:
    raise ConnectionError("the provider is down")


@workflow("backs_off")
async def backs_off(ctx: WorkflowContext, trip: str) -> str:
    return await slow_to_recover(trip)


async def test_a_run_waiting_for_a_retry_keeps_the_error_in_its_reason_when_a_worker_takes_it_again(
        store: Any) -> None:
    """The reason of a run waiting for a retry names the failed attempt's error, and still does after another
    execution suspended it again (woken early, say): it lost the error text (helper-70)."""
    definition = WorkflowDefinition(backs_off)
    await store.enqueue(WorkflowTask("backs_off", 1, {"trip": "rome"}, checkpoint_id="w1"))
    await worker(store, definition).run_once()
    expected = "step slow_to_recover#1 attempt 2 waits for its retry: ConnectionError: the provider is down"
    assert (await store.get_run("w1")).reason == expected
    await store.wake("w1")
    await worker(store, definition).run_once()
    info = await store.get_run("w1")
    assert info.status is RunStatus.READY and info.due_at is not None and info.reason == expected
    # and after an operator's retry of the run failed during the backoff (its run_retried comes last: helper-71)
    timed = WorkflowDefinition(backs_off, Budget(max_elapsed=timedelta(seconds=0.3)))
    await store.enqueue(WorkflowTask("backs_off", 1, {"trip": "oslo"}, checkpoint_id="w2"))
    await worker(store, timed).run_once()
    await asyncio.sleep(0.35)
    await worker(store, timed).run_once()
    assert (await store.get_run("w2")).status is RunStatus.FAILED
    await retry_run(store, "w2", by="ops", reason="more time")
    await worker(store, definition).run_once()
    assert (await store.get_run("w2")).reason == expected


@workflow("refuses_itself")
async def refuses_itself(ctx: WorkflowContext, trip: str) -> str:
    await book_hotel(trip)
    raise ValueError(f"{trip} is not a city we serve")


async def test_retrying_a_run_that_failed_in_its_own_code_warns_that_no_call_gets_another_attempt(
        store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A run whose code failed on what its history holds (its own error, a signal payload that does not fit) fails
    again the same way when retried under the same code: the retry says so (helper-74: it printed `ready`, and the
    run failed again at once). A run a step's failure ended gets that step's attempt, with no such warning."""
    definition = WorkflowDefinition(refuses_itself)
    await _fail(store, definition, "own1")
    with caplog.at_level("WARNING", logger="runifold.admin"):
        await retry_run(store, "own1", by="ops", reason="try again")
    warned = [r for r in caplog.records if r.name == "runifold.admin" and r.levelname == "WARNING"]
    assert [r.event for r in warned] == ["run_retried_without_a_new_attempt"]  # type: ignore[attr-defined]
    again = await worker(store, definition).run_once()
    assert isinstance(again, Failed) and "not a city we serve" in again.reason
    caplog.clear()
    step_failed = await _fail(store, WorkflowDefinition(train_trip), "own2")
    assert step_failed.key == "book_train#1"
    with caplog.at_level("WARNING", logger="runifold.admin"):
        await retry_run(store, "own2", by="ops", reason="the railway is back")
    assert not [r for r in caplog.records if r.name == "runifold.admin" and r.levelname == "WARNING"]


# -- a failure of the workflow's own code, and calls made while handling it (helper-82) ---------------------------

#: while set, the workflow's own code raises KeyError (a payload read with the wrong key); the "deploy" clears it
code_broken = {"read": True}


@pytest.fixture(autouse=True)
def _reset_code() -> None:
    code_broken["read"] = True


def read_status(order: dict[str, Any]) -> str:
    return order["approved"] if code_broken["read"] else order.get("status", "declined")


@workflow("receipt-in-finally")
async def receipt_in_finally(ctx: WorkflowContext, trip: str) -> str:
    status = "pending"
    try:
        await book_hotel(trip)
        status = read_status({"status": "declined"})
        return status
    finally:
        await quick(status)  # the receipt: sent with the status of the code that ran


@workflow("compensate-and-raise")
async def compensate_and_raise(ctx: WorkflowContext, trip: str) -> str:
    hotel = await book_hotel(trip)
    try:
        return read_status({"status": "declined"})
    except KeyError:
        await cancel_hotel(hotel)
        raise


@workflow("gather-in-finally")
async def gather_in_finally(ctx: WorkflowContext, trip: str) -> str:
    status = "pending"
    try:
        status = read_status({"status": "declined"})
        return status
    finally:
        await asyncio.gather(quick(status), cancel_hotel(status))  # tasks created while the error is handled


@workflow("now-while-handling")
async def now_while_handling(ctx: WorkflowContext, trip: str) -> str:
    try:
        return read_status({"status": "declined"})
    except KeyError as exc:
        raise ValueError(f"unreadable at {ctx.now()}") from exc  # a value drawn while handling, then another error


@workflow("handled-then-own-error")
async def handled_then_own_error(ctx: WorkflowContext, trip: str) -> str:
    try:
        raise LookupError("no cached quote")
    except LookupError:
        await quick("fallback")  # handled: the code goes on from it
    await book_hotel(trip)
    return read_status({"status": "declined"})  # an error unrelated to the one handled above


@workflow("nested-except-in-finally")
async def nested_except_in_finally(ctx: WorkflowContext, trip: str) -> str:
    status = "pending"
    try:
        status = read_status({"status": "declined"})
        return status
    finally:
        try:
            {}["receipt"]  # a lookup that misses, handled here while the failing error passes through
        except KeyError:
            await quick(status)


@workflow("except-star-compensates")
async def except_star_compensates(ctx: WorkflowContext, trip: str) -> str:
    async def reader() -> str:
        return read_status({"status": "declined"})

    try:
        async with asyncio.TaskGroup() as group:
            task = group.create_task(reader())
        return task.result()
    except* KeyError:
        await quick("pending")  # except* handles a copy of the group, with the same members
        raise


class Receipt:
    def __init__(self, box: dict[str, str]) -> None:
        self.box = box

    async def __aenter__(self) -> Receipt:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await quick(self.box["status"])


@workflow("receipt-in-aexit")
async def receipt_in_aexit(ctx: WorkflowContext, trip: str) -> str:
    box = {"status": "pending"}
    async with Receipt(box):
        box["status"] = read_status({"status": "declined"})
    return box["status"]


@contextlib.asynccontextmanager
async def receipted(box: dict[str, str]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await quick(box["status"])


@workflow("receipt-in-a-context-manager")
async def receipt_in_a_context_manager(ctx: WorkflowContext, trip: str) -> str:
    box = {"status": "pending"}
    async with receipted(box):
        box["status"] = read_status({"status": "declined"})
    return box["status"]


@workflow("large-group-compensates")
async def large_group_compensates(ctx: WorkflowContext, trip: str) -> str:
    try:
        read_status({"status": "declined"})
        raise ExceptionGroup("every line unreadable", [KeyError(line) for line in range(150)])
    except* KeyError:
        await quick("pending")  # (helper-85: a chain walk that stopped at 100 exceptions missed the members)
        raise


OWN_ERRORS = {fn.__name__: WorkflowDefinition(fn) for fn in
              (receipt_in_finally, compensate_and_raise, gather_in_finally, now_while_handling, handled_then_own_error,
               nested_except_in_finally, except_star_compensates, receipt_in_aexit, receipt_in_a_context_manager,
               large_group_compensates)}


@pytest.mark.parametrize("name", ["receipt_in_finally", "compensate_and_raise", "gather_in_finally",
                                  "now_while_handling", "nested_except_in_finally", "except_star_compensates",
                                  "receipt_in_aexit", "receipt_in_a_context_manager", "large_group_compensates"])
async def test_a_failure_of_the_codes_own_that_it_made_calls_handling_is_refused(store: Any, name: str) -> None:
    """helper-82: the workflow's own code raised, and a finally sent a receipt with the failing code's values. The
    retry was accepted; after the fix the replay handed the receipt call its recorded result, so the run completed
    "declined" while the only receipt sent said "pending", and replay called it clean. Calls made while handling the
    error (in except or finally, in tasks created there, a value drawn) make the failure handled: refused, history
    untouched."""
    failed = await _fail(store, OWN_ERRORS[name], "h1")
    assert failed.key == "" and failed.handled, failed
    before = await event_types(store, "h1")
    with pytest.raises(InvalidStateError, match="cannot be retried: its workflow code made calls while handling the "
                                                "error that failed it .* start a new run instead"):
        await retry_run(store, "h1", by="ops", reason="read fixed")
    assert await event_types(store, "h1") == before


async def test_a_failure_of_the_codes_own_after_an_error_it_handled_is_retried(store: Any) -> None:
    """Calls made while handling an error the code went on from do not refuse a later, unrelated failure: the
    retried run completes with the fix and replays clean."""
    definition = OWN_ERRORS["handled_then_own_error"]
    failed = await _fail(store, definition, "h2")
    assert failed.key == "" and not failed.handled, failed
    await retry_run(store, "h2", by="ops", reason="read fixed")
    code_broken["read"] = False
    assert await _completes_and_replays(store, definition, "h2") == "declined"


@step(retry=RetryPolicy(max_attempts=1))
async def fetch_rate(currency: str) -> float:
    ran.append("fetch_rate")
    if broken["flight"]:
        raise ConnectionError("the rates provider is down")
    return 1.25


@workflow("cached-rate")
async def cached_rate(ctx: WorkflowContext, trip: str) -> float:
    try:
        return {"USD": 1.0}["EUR"]
    except KeyError:  # a cache miss: the step is the fallback, and its failure fails the run
        return await fetch_rate("EUR")


async def test_a_step_that_fails_while_the_code_handles_another_error_gets_its_attempt(store: Any) -> None:
    """helper-84: a step called in an except block (a fallback) failed for good. Its failure carries the handled
    error as its context, which the first version of the rule took for a call made because of the failure: the retry
    was refused, saying the code made calls after the step failed. It gets the step another attempt."""
    definition = WorkflowDefinition(cached_rate)
    failed = await _fail(store, definition, "f1")
    assert failed.key == "fetch_rate#1" and not failed.handled
    broken["flight"] = False
    await retry_run(store, "f1", by="ops", reason="rates are back")
    assert await _completes_and_replays(store, definition, "f1") == 1.25


class CheckFailed(Exception):
    def __init__(self, field: str) -> None:
        super().__init__(field)
        self.field = field


#: one exception instance, raised by every run (a module-level constant, as some libraries keep)
SHARED = CheckFailed("zip")


@workflow("reads-its-error")
async def reads_its_error(ctx: WorkflowContext, trip: str) -> str:
    try:
        raise CheckFailed("zip")
    except CheckFailed as exc:
        await quick("logged")  # a call while handling: the error's attributes stay what the code set
        return await quick(json.dumps(vars(exc)))


@workflow("raises-a-shared-error")
async def raises_a_shared_error(ctx: WorkflowContext, trip: str) -> str:
    try:
        raise SHARED
    finally:
        if trip == "with-receipt":
            await quick("pending")


async def test_what_a_run_handles_is_its_own_and_never_written_on_the_error(store: Any) -> None:
    """helper-84: the first version marked the exception object itself: workflow code reading vars(exc) got the mark
    (json.dumps failed, the run with it), and two runs raising one shared instance overwrote each other's mark. The
    execution holds what its code handled; the error is left as it is, and each run is judged by its own calls."""
    await store.enqueue(WorkflowTask("reads-its-error", 1, {"trip": "x"}, checkpoint_id="v1"))
    done = await until_completed(store, WorkflowDefinition(reads_its_error))
    assert isinstance(done, Completed) and done.output == 'quick {"field": "zip"}'
    assert vars(SHARED) == {"field": "zip"}
    definition = WorkflowDefinition(raises_a_shared_error)
    await store.enqueue(WorkflowTask("raises-a-shared-error", 1, {"trip": "with-receipt"}, checkpoint_id="s1"))
    await store.enqueue(WorkflowTask("raises-a-shared-error", 1, {"trip": "plain"}, checkpoint_id="s2"))
    for _ in range(2):
        assert isinstance(await worker(store, definition).run_once(), Failed)
    assert [(await entries(store, ref))[-1].event.handled for ref in ("s1", "s2")] == [True, False]  # type: ignore[attr-defined]
    assert vars(SHARED) == {"field": "zip"}


@workflow("notify-in-finally")
async def notify_in_finally(ctx: WorkflowContext, trip: str) -> str:
    status = "pending"
    try:
        status = read_status({"status": "declined"})
        return status
    finally:
        sent = await quick(status)  # the receipt, with the failing code's status
        await book_flight(sent)  # fails for good: its failure, not the KeyError, fails the run


async def test_a_step_failing_in_a_finally_after_other_calls_made_handling_the_codes_error_is_refused(
        store: Any) -> None:
    """helper-85: the run failed on a step's failure (so the first rule applied: no call after it), but the step was
    called in a finally the code's own KeyError passed through, after a receipt sent with the failing status. A retry
    with the fix replayed that receipt. Calls other than the failing one made while handling its chain refuse it."""
    failed = await _fail(store, WorkflowDefinition(notify_in_finally), "k1")
    assert failed.key == "book_flight#1" and failed.handled, failed
    with pytest.raises(InvalidStateError, match="cannot be retried: after book_flight#1 failed, or while handling an "
                                                "error its failure came from"):
        await retry_run(store, "k1", by="ops", reason="read fixed")


@workflow("lets-go-of-a-feed")
async def lets_go_of_a_feed(ctx: WorkflowContext, trip: str) -> str:
    async def lines() -> AsyncIterator[str]:
        try:
            yield "a"
            yield "b"
        finally:
            await quick("feed closed")  # run where workflow code lets go of the generator

    async def first_price() -> str:
        feed = lines()
        async for _ in feed:
            break  # left unclosed: a local of this frame, which the KeyError's traceback holds
        return {"a": "1"}["price"]

    try:
        price = await first_price()
    except KeyError:
        price = await quick("default price")  # a call made while handling the KeyError
    for _ in range(3):
        await asyncio.sleep(0)
    await quick("done")
    return price


async def test_noting_what_the_code_handles_holds_nothing_of_it(store: Any) -> None:
    """helper-85: the second version held each exception the code made calls while handling, and with it its
    traceback's frames: an async generator such a frame held was then never closed where workflow code let go of
    it (its finally's step never ran), and runs recorded before diverged. Nothing is held: it closes as before."""
    await store.enqueue(WorkflowTask("lets-go-of-a-feed", 1, {"trip": "x"}, checkpoint_id="g1"))
    done = await until_completed(store, WorkflowDefinition(lets_go_of_a_feed))
    assert done.output == "quick default price"
    assert ran == ["quick", "quick", "quick"]  # the fallback, the feed's finally, done
    assert sorted(e.event.key for e in await entries(store, "g1") if "quick" in e.event.key) == [
        "1/quick#1", "quick#1", "quick#2"]


class Unhashable(type):
    def __eq__(cls, other: object) -> bool:
        return cls is other

    __hash__ = None  # type: ignore[assignment]


class OddError(Exception, metaclass=Unhashable):
    pass


class GuardsItsCause(Exception):
    def __getattribute__(self, name: str) -> Any:
        if name == "__cause__":
            raise asyncio.CancelledError("reading __cause__")  # (a BaseException, raised synchronously)
        return super().__getattribute__(name)


@workflow("odd-errors")
async def odd_errors(ctx: WorkflowContext, trip: str) -> str:
    try:
        raise OddError("a class that cannot be hashed")
    except OddError:
        await quick("handled")
    if trip == "fail":
        try:
            raise GuardsItsCause("attributes that raise")
        finally:
            await quick("cleanup")
    return trip


@pytest.mark.parametrize("trip", ["go-on", "fail"])
async def test_odd_exception_classes_never_take_the_worker_down(store: Any, trip: str) -> None:
    """helper-86: noting an exception whose class cannot be hashed raised TypeError out of the driver (a run that
    never fails was recovered lease after lease until its budget failed it); an exception whose attributes raise
    crashed the worker as its traceback was recorded. Each run ends as its code says, once."""
    await store.enqueue(WorkflowTask("odd-errors", 1, {"trip": trip}, checkpoint_id="o1"))
    outcome = await worker(store, WorkflowDefinition(odd_errors)).run_once()
    if trip == "go-on":
        assert isinstance(outcome, Completed) and outcome.output == "go-on", outcome
        return
    assert isinstance(outcome, Failed) and "GuardsItsCause" in outcome.reason, outcome
    last = (await entries(store, "o1"))[-1].event
    assert isinstance(last, RunFailed) and last.handled and last.traceback.startswith("<its traceback could not be read")
