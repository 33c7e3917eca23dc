"""The types people use, on every store: pydantic models and dataclasses in and out, plain-def steps, step timeouts,
typed signal payloads, and the run id and call key on user code's log lines."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pydantic
import pytest
import structlog

from runifold import (
    Completed,
    Failed,
    InvalidInputError,
    RetryPolicy,
    SerializationError,
    StepFailedError,
    Suspended,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    step,
    workflow,
)
from tests.corpus.check import replay_problems
from tests.support import send_signal, worker

calls: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


class Order(pydantic.BaseModel):
    order_id: str
    quantity: int
    placed: dt.datetime


class Approval(pydantic.BaseModel):
    approved: bool
    by: str


@dataclasses.dataclass(frozen=True)
class Quote:
    order_id: str
    total: float


@step()
async def price(order: Order) -> Quote:
    calls["price"] += 1
    return Quote(order.order_id, 9.5 * order.quantity)


@step()
async def confirm(order: Order, quote: Quote) -> Order:
    return order.model_copy(update={"quantity": order.quantity + int(quote.total > 0)})


class Outcome(pydantic.BaseModel):
    quote: Quote
    approval: Approval
    confirmed: Order
    types: list[str]


@workflow("typed-order")
async def typed_order(ctx: WorkflowContext, order: Order) -> Outcome:
    quote = await price(order)
    approval = await ctx.wait_signal("approval", type=Approval)
    confirmed = await confirm(order, quote)
    return Outcome(quote=quote, approval=approval, confirmed=confirmed,
                   types=[type(quote).__name__, type(approval).__name__, type(confirmed).__name__])


@workflow("untyped-result")
async def untyped_result(ctx: WorkflowContext, order: Order) -> dict[str, Any]:
    return {"quote": await price(order)}  # a dataclass in a dict[str, Any] would come back a dict


async def test_pydantic_models_and_dataclasses_flow_through_a_run(store: Any) -> None:
    """A pydantic input, a dataclass step output and a pydantic signal payload keep their types, live and replayed."""
    definition = WorkflowDefinition(typed_order, signals={"approval": {"*"}})
    order = Order(order_id="o1", quantity=2, placed=dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    await store.enqueue(WorkflowTask("typed-order", 1, {"order": order}, checkpoint_id="t1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await send_signal(store, "t1", "approval", "a1", {"approved": True, "by": "alice"})
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed), done
    assert done.output.types == ["Quote", "Approval", "Order"]
    assert done.output.quote == Quote("o1", 19.0) and done.output.confirmed.quantity == 3
    assert calls["price"] == 1


async def test_a_result_that_would_not_come_back_the_same_is_refused(store: Any) -> None:
    """A workflow result whose objects its annotation does not describe fails the run with a message saying so."""
    order = Order(order_id="o1", quantity=2, placed=dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    await store.enqueue(WorkflowTask("untyped-result", 1, {"order": order}, checkpoint_id="u1"))
    failed = await worker(store, WorkflowDefinition(untyped_result)).run_once()
    assert isinstance(failed, Failed) and "would come back from the log as dict" in failed.reason


async def test_an_input_that_does_not_fit_names_the_parameter(store: Any) -> None:
    """A mistyped input is refused before it is enqueued, naming the parameter and the field."""
    registry = WorkflowRegistry(WorkflowDefinition(typed_order, signals={"approval": {"*"}}))
    task = WorkflowTask("typed-order", 1, {"order": {"order_id": "o1", "quantity": "two", "placed": "2026-12-01"}})
    with pytest.raises(InvalidInputError, match="parameter 'order'.*quantity"):
        registry.validate(task)


@workflow("typed-signal")
async def typed_signal(ctx: WorkflowContext) -> str:
    try:
        approval = await ctx.wait_signal("approval", type=Approval)
    except SerializationError as exc:
        return f"refused: {'does not fit' in str(exc) and 'the sender must send' in str(exc)}"
    return f"approved by {approval.by}"


async def test_a_signal_payload_that_does_not_fit_its_type_is_the_workflow_error(store: Any) -> None:
    """A payload that does not fit the wait's type raises SerializationError in the workflow, live and on replay."""
    definition = WorkflowDefinition(typed_signal, signals={"approval": {"*"}})
    await store.enqueue(WorkflowTask("typed-signal", 1, {}, checkpoint_id="s1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await send_signal(store, "s1", "approval", "a1", {"approved": "maybe"})
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == "refused: True"


@dataclasses.dataclass
class Decision:
    approved: bool
    votes: dict[int, str]


@workflow("strict-signal")
async def strict_signal(ctx: WorkflowContext, limit: float) -> list[str]:
    seen = []
    for _ in range(3):
        try:
            decision = await ctx.wait_signal("decision", type=Decision)
            seen.append(f"{decision.approved} {decision.votes}")
        except SerializationError as exc:
            seen.append(f"refused: {'Expected `bool`' in str(exc)}")
    return seen


async def test_data_from_outside_is_read_strictly_as_json_of_its_type(store: Any) -> None:
    """A payload or an input is the JSON data of its type: 1 or "true" is no bool, "1.5" no float; object keys
    may still name ints, and an int is a float. The same payloads give the same values on replay."""
    definition = WorkflowDefinition(strict_signal, signals={"decision": {"*"}})
    registry = WorkflowRegistry(definition)
    with pytest.raises(InvalidInputError, match="parameter 'limit'"):
        registry.validate(WorkflowTask("strict-signal", 1, {"limit": "1.5"}))
    await store.enqueue(registry.validate(WorkflowTask("strict-signal", 1, {"limit": 2}, checkpoint_id="s1")))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await send_signal(store, "s1", "decision", "d1", {"approved": 1, "votes": {}})
    await send_signal(store, "s1", "decision", "d2", {"approved": "true", "votes": {}})
    await send_signal(store, "s1", "decision", "d3", {"approved": True, "votes": {"7": "alice"}})
    done = await worker(store, definition).run_once()
    while isinstance(done, Suspended):
        done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == ["refused: True", "refused: True", "True {7: 'alice'}"]
    assert not await replay_problems(store, registry, "s1", done.output)


_threads: list[str] = []


@step(retry=RetryPolicy(max_attempts=1))
def blocking_io(n: int) -> int:
    """A plain def step: it runs in a worker thread, so it may block."""
    _threads.append(threading.current_thread().name)
    time.sleep(0.05)
    return n * 2


@step(timeout=timedelta(milliseconds=100), retry=RetryPolicy(max_attempts=2, initial=timedelta(0)))
async def sometimes_slow() -> str:
    calls["slow"] += 1
    if calls["slow"] == 1:
        await asyncio.sleep(5)
    return "fast enough"


@step(timeout=timedelta(milliseconds=50), retry=RetryPolicy(max_attempts=1))
async def always_slow() -> str:
    await asyncio.sleep(5)
    return "never"


@workflow("sync-and-timeouts")
async def sync_and_timeouts(ctx: WorkflowContext) -> list[Any]:
    results: list[Any] = list(await asyncio.gather(blocking_io(1), blocking_io(2)))
    results.append(await sometimes_slow())
    try:
        await always_slow()
    except StepFailedError as exc:
        results.append(exc.error_type)
    return results


async def test_plain_def_steps_run_in_threads_and_step_timeouts_retry(store: Any) -> None:
    """Plain def steps run off the event loop; a step's timeout fails the attempt, which is retried by its policy."""
    _threads.clear()
    await store.enqueue(WorkflowTask("sync-and-timeouts", 1, {}, checkpoint_id="p1"))
    done = await worker(store, WorkflowDefinition(sync_and_timeouts)).run_once()
    assert isinstance(done, Completed), done
    assert done.output == [2, 4, "fast enough", "TimeoutError"]
    assert len(_threads) == 2 and threading.main_thread().name not in _threads
    assert calls["slow"] == 2


_logged: list[dict[str, Any]] = []


@step()
async def logs() -> str:
    _logged.append(dict(structlog.contextvars.get_contextvars()))
    return "logged"


@workflow("logging-steps")
async def logging_steps(ctx: WorkflowContext) -> list[str]:
    _logged.append(dict(structlog.contextvars.get_contextvars()))
    return list(await asyncio.gather(logs(), logs()))


async def test_user_code_logs_carry_the_run_id_and_call_key(store: Any) -> None:
    """structlog contextvars give step bodies the run id and their call key, and workflow code the run id."""
    _logged.clear()
    await store.enqueue(WorkflowTask("logging-steps", 1, {}, checkpoint_id="l1"))
    done = await worker(store, WorkflowDefinition(logging_steps)).run_once()
    assert isinstance(done, Completed)
    run_id = (await store.get_run("l1")).run_id
    assert _logged[0] == {"run_id": run_id}
    assert sorted(entry["key"] for entry in _logged if "key" in entry) == ["1/logs#1", "2/logs#1"]
    assert all(entry["run_id"] == run_id for entry in _logged)
    assert "run_id" not in structlog.contextvars.get_contextvars()  # nothing leaks into the worker's own context
