"""Concurrency limits on definitions: the key and limit a run gets from the code that knows its definition."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from runifold import (
    Client,
    ConcurrencyLimit,
    ConfigurationError,
    InvalidInputError,
    RunStatus,
    Supervisor,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    step,
    workflow,
)
from runifold.stores.memory import MemoryWorkflowStore
from tests.support import worker


@workflow("charge")
async def charge(ctx: WorkflowContext, customer_id: str, amount: int = 1) -> int:
    return amount


@workflow("payout")
async def payout(ctx: WorkflowContext, n: int) -> int:
    return n


PER_CUSTOMER = WorkflowDefinition(charge, concurrency=ConcurrencyLimit(1, key=lambda i: f"customer:{i['customer_id']}"))
BY_NAME = WorkflowDefinition(payout, concurrency=ConcurrencyLimit(3))


def test_a_limit_is_checked_when_it_is_made() -> None:
    """A limit below one, a key that is neither a string nor a function, or something else as concurrency= is refused."""
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigurationError, match="limit"):
            ConcurrencyLimit(bad)  # type: ignore[arg-type]
    for key in ("", 3):
        with pytest.raises(ConfigurationError, match="key"):
            ConcurrencyLimit(1, key=key)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="ConcurrencyLimit"):
        WorkflowDefinition(payout, concurrency=3)  # type: ignore[arg-type]


def test_validate_gives_a_task_its_definitions_key() -> None:
    """registry.validate fills the definition's key (its name, a fixed key, or the key function's) unless the task names one."""
    registry = WorkflowRegistry(PER_CUSTOMER, BY_NAME)
    task = registry.validate(WorkflowTask("charge", 1, {"customer_id": "c7"}))
    assert (task.concurrency_key, task.concurrency_limit) == ("customer:c7", 1)
    task = registry.validate(WorkflowTask("payout", 1, {"n": 1}, checkpoint_id="p1"))
    assert (task.concurrency_key, task.concurrency_limit, task.checkpoint_id) == ("payout", 3, "p1")
    own = registry.validate(WorkflowTask("payout", 1, {"n": 1}, concurrency_key="vip", concurrency_limit=10))
    assert (own.concurrency_key, own.concurrency_limit) == ("vip", 10)
    shared = WorkflowRegistry(WorkflowDefinition(payout, concurrency=ConcurrencyLimit(2, key="payments")))
    assert shared.validate(WorkflowTask("payout", 1, {"n": 1})).concurrency_key == "payments"
    plain = WorkflowRegistry(WorkflowDefinition(payout))
    assert plain.validate(WorkflowTask("payout", 1, {"n": 1})).concurrency_key is None


def test_a_key_function_that_fails_is_a_clear_input_error() -> None:
    """A key function that raises or returns no string refuses the task, naming the workflow."""
    broken = WorkflowRegistry(WorkflowDefinition(charge, concurrency=ConcurrencyLimit(1, key=lambda i: i["tenant"])))
    with pytest.raises(InvalidInputError, match="concurrency key function of workflow 'charge' raised KeyError"):
        broken.validate(WorkflowTask("charge", 1, {"customer_id": "c1"}))
    empty = WorkflowRegistry(WorkflowDefinition(charge, concurrency=ConcurrencyLimit(1, key=lambda i: "")))
    with pytest.raises(InvalidInputError, match="non-empty string"):
        empty.validate(WorkflowTask("charge", 1, {"customer_id": "c1"}))


async def test_client_start_gives_the_run_its_key() -> None:
    """Client.start stores the definition's key on the run, or the key it is given."""
    store = MemoryWorkflowStore()
    client = Client(store, WorkflowRegistry(PER_CUSTOMER))
    handle = await client.start(PER_CUSTOMER, {"customer_id": "c9"})
    info = await handle.status()
    assert (info.concurrency_key, info.concurrency_limit) == ("customer:c9", 1)
    named = await client.start("charge", {"customer_id": "c1"}, version=1)
    assert (await named.status()).concurrency_key == "customer:c1"
    own = await client.start(charge, {"customer_id": "c2"}, concurrency_key="batch", concurrency_limit=5)
    assert ((await own.status()).concurrency_key, (await own.status()).concurrency_limit) == ("batch", 5)


_running: dict[str, int] = {"now": 0, "most": 0}


@step()
async def occupy(customer_id: str) -> str:
    _running["now"] += 1
    _running["most"] = max(_running["most"], _running["now"])
    await asyncio.sleep(0.02)
    _running["now"] -= 1
    return customer_id


@workflow("occupy")
async def occupying(ctx: WorkflowContext, customer_id: str) -> str:
    return await occupy(customer_id)


async def test_a_supervisor_runs_one_run_of_a_key_at_a_time() -> None:
    """With eight slots and a limit of one, the runs of one key run one after another, and all complete."""
    definition = WorkflowDefinition(occupying, concurrency=ConcurrencyLimit(1, key="one"))
    store = MemoryWorkflowStore()
    registry = WorkflowRegistry(definition)
    for i in range(12):
        await store.enqueue(registry.validate(WorkflowTask("occupy", 1, {"customer_id": f"c{i}"})))
    _running.update(now=0, most=0)
    supervisor = Supervisor(worker(store, definition), 8, idle_wait=timedelta(seconds=0.02), schedule_every=None)
    running: Any = asyncio.create_task(supervisor.run(handle_signals=False))
    try:
        while await store.count_runs(status=RunStatus.COMPLETED) < 12:
            await asyncio.sleep(0.02)
    finally:
        supervisor.stop()
        await asyncio.wait_for(running, 10)
    assert _running["most"] == 1
