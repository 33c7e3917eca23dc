"""The client on every store: start a run idempotently, await its typed result or its failure, cancel it."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from runifold import (
    Client,
    ConfigurationError,
    EnqueueConflictError,
    InvalidInputError,
    SerializationError,
    RunFailedError,
    RunStatus,
    Supervisor,
    UnknownWorkflowError,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    step,
    workflow,
)
from runifold.testing import WorkflowEnvironment
from tests.conftest import StoreFactory, require_postgres
from tests.support import worker


@step()
async def stamp(n: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + timedelta(days=n)


@workflow("stamping")
async def stamping(ctx: WorkflowContext, n: int) -> dt.datetime:
    if n < 0:
        raise ValueError("n must not be negative")
    return await stamp(n)


@workflow("parked-forever")
async def parked_forever(ctx: WorkflowContext) -> None:
    await ctx.wait_signal("never")


registry = WorkflowRegistry(WorkflowDefinition(stamping), WorkflowDefinition(parked_forever, signals={"never": {"*"}}))


ENQUEUE_A_SET = """
import asyncio, sys
from runifold import WorkflowTask, open_store

async def main() -> None:
    store = await open_store(sys.argv[1])
    try:
        tags = {"alpha", "beta", "gamma", "delta", "epsilon"}
        result = await store.enqueue(WorkflowTask("stamping", 1, {"n": 1, "tags": tags}, checkpoint_id="tags-1"))
        print(result.run_id, ",".join(tags))
    finally:
        await store.close()

asyncio.run(main())
"""


async def test_an_equal_set_in_the_input_is_the_same_task_whatever_its_order(open_store: StoreFactory,
                                                                            tmp_path: Any) -> None:
    """Inputs compare as JSON values, a set's members in one order: enqueueing an equal set iterated in another
    order (as another process's hash seed orders a set of strings) returns the same run (helper-91: a retried
    start from another process raised EnqueueConflictError)."""
    store = await open_store()
    one, other = {9, 1}, {1, 9}
    assert one == other and list(one) != list(other)  # equal sets, iterated in two orders
    first = await store.enqueue(WorkflowTask("stamping", 1, {"n": 1, "seen": one}, checkpoint_id="set-1"))
    again = await store.enqueue(WorkflowTask("stamping", 1, {"n": 1, "seen": other}, checkpoint_id="set-1"))
    assert again.run_id == first.run_id and not again.created
    with pytest.raises(EnqueueConflictError):
        await store.enqueue(WorkflowTask("stamping", 1, {"n": 1, "seen": {1, 8}}, checkpoint_id="set-1"))
    # a task is compared as it was made, as its history records it: an input changed after is neither (helper-92)
    given: dict[str, Any] = {"n": 1}
    task = WorkflowTask("stamping", 1, given, checkpoint_id="set-2")
    made = await store.enqueue(task)
    given["n"] = 2
    assert (await store.enqueue(task)).run_id == made.run_id
    if open_store.kind == "memory":  # type: ignore[attr-defined]
        return
    url = f"sqlite:///{tmp_path / 'runifold.db'}" if open_store.kind == "sqlite" else require_postgres()  # type: ignore[attr-defined]
    printed = []
    for seed in "1234":
        done = subprocess.run([sys.executable, "-c", ENQUEUE_A_SET, url], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        printed.append(done.stdout.split())
    assert len({run_id for run_id, _ in printed}) == 1
    assert len({order for _, order in printed}) > 1  # the processes did iterate the set in different orders


async def test_start_and_await_a_typed_result(store: Any) -> None:
    """start() is idempotent by checkpoint id; result() waits for a worker and returns the output with its type."""
    client = Client(store)
    handle = await client.start(stamping, {"n": 3}, checkpoint_id="s1")
    again = await client.start(stamping, {"n": 3}, checkpoint_id="s1")
    assert again.run_id == handle.run_id
    with pytest.raises(EnqueueConflictError):
        await client.start(stamping, {"n": 4}, checkpoint_id="s1")
    with pytest.raises(InvalidInputError, match="parameter 'n'"):
        await client.start(stamping, {"n": "three"})
    with pytest.raises(SerializationError, match="not valid Unicode"):  # a value that cannot be recorded, as anywhere
        await client.start(stamping, {"n": "\ud800"})
    supervisor = Supervisor(worker(store, *[registry.definition_for(n, v) for n, v in registry.versions()]), 2,
                            idle_wait=timedelta(seconds=0.05))
    running = asyncio.create_task(supervisor.run(handle_signals=False))
    try:
        assert await handle.result(timeout=30) == dt.datetime(2026, 1, 4, tzinfo=dt.UTC)
        by_name = await Client(store, registry).get_handle("s1")
        assert isinstance(await by_name.result(), dt.datetime)  # the registry gives a run found by name its type
        assert await (await Client(store).get_handle("s1")).result() == "2026-01-04T00:00:00Z"  # no code: plain JSON
        failing = await client.start("stamping", {"n": -1}, version=1)
        with pytest.raises(RunFailedError) as failed:
            await failing.result(timeout=30)
        assert failed.value.status == RunStatus.FAILED and failed.value.error_type == "ValueError"
        assert "n must not be negative" in failed.value.reason and "Traceback" in failed.value.traceback
    finally:
        supervisor.stop()
        await running


async def test_result_times_out_and_cancel_ends_the_run(store: Any) -> None:
    """result(timeout=) gives up without touching the run; cancel() ends it, and result() then raises."""
    client = Client(store, registry)
    handle = await client.start(parked_forever)
    with pytest.raises(TimeoutError):
        await handle.result(timeout=0.2)
    with pytest.raises(TimeoutError):
        await handle.result(timeout=dt.timedelta(milliseconds=100))  # a timedelta, like every other duration
    assert (await handle.status()).status is RunStatus.READY
    await handle.cancel(by="test", reason="not needed")
    await handle.cancel(by="test", reason="twice is fine")
    with pytest.raises(RunFailedError) as cancelled:
        await handle.result(timeout=5)
    assert cancelled.value.status == RunStatus.CANCELLED and "not needed" in cancelled.value.reason
    assert cancelled.value.error_type == "" and cancelled.value.traceback == ""


async def test_start_by_a_name_the_registry_lacks_is_refused(store: Any) -> None:
    """Given a registry, start() by name refuses a (name, version) it does not hold, and enqueues nothing."""
    client = Client(store, registry)
    with pytest.raises(UnknownWorkflowError, match="no workflow 'no-such-flow' version 1"):
        await client.start("no-such-flow", {}, version=1, checkpoint_id="x1")
    assert await store.list_runs() == []
    handle = await Client(store).start("no-such-flow", {}, version=1, checkpoint_id="x1")  # no registry: enqueued
    assert (await handle.status()).name == "no-such-flow"


async def test_misused_start_and_get_handle_are_runifold_errors(store: Any) -> None:
    """An input that is no mapping (Temporal's positional style) is InvalidInputError, as the docs say, not a bare
    ValueError or TypeError; a handle typed by another workflow than the run's is refused; the testing kit refuses
    to start what its worker could never run (helper-54). Nothing is enqueued by a refusal."""
    client = Client(store, registry)
    for given in ("ord_42", 1, ["n", 1]):
        with pytest.raises(InvalidInputError, match="WorkflowTask.input must be a mapping of argument names"):
            await client.start(stamping, given)  # type: ignore[arg-type]
    assert await store.list_runs() == []
    await client.start(stamping, {"n": 1}, checkpoint_id="s1")
    with pytest.raises(ConfigurationError, match="was given parked-forever v1, but the run is of stamping v1"):
        await client.get_handle("s1", parked_forever)
    assert (await client.get_handle("s1", stamping)).run_id == (await client.get_handle("s1")).run_id
    # a reference or a timeout of the wrong type is a runifold error, not a bare TypeError (helper-56)
    for ref in (123, None, b"s1"):
        with pytest.raises(InvalidInputError, match="the run reference must be a string, got"):
            await client.get_handle(ref)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="the run reference must be a string, got"):
            await store.history(ref)
    for timeout in ("1", float("nan"), True):
        with pytest.raises(ConfigurationError, match="takes seconds as a number, a timedelta or None"):
            await (await client.get_handle("s1")).result(timeout=timeout)  # type: ignore[arg-type]
    # a status given as its string finds the same runs on every store (the memory store found none: helper-56)
    assert [r.checkpoint_id for r in await store.list_runs(status="ready")] == ["s1"]  # type: ignore[arg-type]
    async with WorkflowEnvironment(WorkflowDefinition(stamping)) as env:
        with pytest.raises(UnknownWorkflowError, match="no workflow 'parked-forever' version 1"):
            await env.start(parked_forever, {})
        with pytest.raises(InvalidInputError, match="must be a mapping"):
            await env.start(stamping, 1)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="version"):
            await env.start(stamping, {"n": 1}, version="1")  # type: ignore[arg-type]
        assert await env.result(await env.start(stamping, {"n": 2})) == dt.datetime(2026, 1, 3, tzinfo=dt.UTC)


@pytest.mark.parametrize("open_store", ["memory", "postgres"], indirect=True)
async def test_result_wakes_when_the_run_finishes(open_store: Any) -> None:
    """On stores that can notify, a waiting result() is woken by the run's end, not by its timeout."""
    store = await open_store()
    handle = await Client(store, registry).start(stamping, {"n": 1})
    waiting = asyncio.create_task(handle.result(timeout=120))
    await asyncio.sleep(0.3)  # result() is waiting now
    assert not waiting.done()
    await worker(store, WorkflowDefinition(stamping)).run_once()
    # well inside PostgreSQL's 5 s fallback poll (the memory store has none): only the notification wakes it
    assert await asyncio.wait_for(waiting, 3) == dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
