"""Async generators in workflow code, and calls made for a run from outside its workflow code, on every store."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
from collections import Counter
from typing import Any

from runifold import Completed, Suspended, WorkflowContext, WorkflowDefinition, WorkflowRegistry, WorkflowTask, step, workflow
from tests.corpus.check import replay_problems
from tests.support import keys, send_signal, worker

ran: Counter[str] = Counter()


@step()
async def tick(what: str) -> str:
    ran[what] += 1
    return what


async def pages(cleanup: list[str]) -> Any:
    try:
        for i in range(10):
            yield await tick(f"page-{i}")
    finally:
        cleanup.append(await tick("closed"))


@workflow("left-generator")
async def left_generator(ctx: WorkflowContext) -> list[Any]:
    cleanup: list[str] = []
    got = []
    async for page in pages(cleanup):
        got.append(page)
        if len(got) == 2:
            break  # the generator is left open: Python lets go of it here
    await ctx.wait_signal("go")
    return [got, cleanup, await tick("end")]


async def test_a_generator_left_open_is_closed_as_workflow_code_where_python_lets_go_of_it(store: Any) -> None:
    """``break`` out of ``async for``: the generator's ``finally`` runs its step once, as workflow code (a task of
    its own, recorded), before the run suspends, and the completed run replays to the same result. (It was closed
    by the worker's own loop after the run, where its step raised CancelledError and never ran.)"""
    ran.clear()
    definition = WorkflowDefinition(left_generator, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("left-generator", 1, {}, checkpoint_id="lg1"))
    suspended = await worker(store, definition).run_once()
    assert isinstance(suspended, Suspended)
    assert await keys(store, "lg1", "step_completed") == ["tick#1", "tick#2", "1/tick#1"]
    await send_signal(store, "lg1", "go", "g1")
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == [["page-0", "page-1"], ["closed"], "end"]
    assert ran == Counter({"page-0": 1, "page-1": 1, "closed": 1, "end": 1})
    assert not await replay_problems(store, WorkflowRegistry(definition), "lg1", done.output)


@workflow("foreign-loop")
async def foreign_loop(ctx: WorkflowContext) -> list[str]:
    context = contextvars.copy_context()  # carries the run's binding into a thread with a loop of its own
    seen: list[str] = []

    def elsewhere() -> None:
        try:
            seen.append(context.run(asyncio.run, tick("from-thread")))
        except Exception as exc:  # noqa: BLE001 - the test reports what was raised
            seen.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    return [*seen, await tick("after")]


async def test_a_call_made_from_another_event_loop_is_refused(store: Any) -> None:
    """A step called for a run from a task of another loop is refused with OutsideWorkflowError and recorded
    nowhere: the driver neither sees nor waits for that loop, so where the call fell would differ on replay."""
    ran.clear()
    await store.enqueue(WorkflowTask("foreign-loop", 1, {}, checkpoint_id="fl1"))
    done = await worker(store, WorkflowDefinition(foreign_loop)).run_once()
    assert isinstance(done, Completed)
    refused, after = done.output
    assert refused.startswith("OutsideWorkflowError: a step, effect, wait or recorded value was called for this run "
                              "from outside its workflow code")
    assert after == "after" and ran == Counter({"after": 1})
    assert len(await keys(store, "fl1", "step_completed")) == 1  # "after" only


async def cyclic_pages(cleanup: list[str]) -> Any:
    try:
        for i in range(5):
            yield await tick(f"cyclic-{i}")
    finally:
        cleanup.append(await tick("cyclic-closed"))


@step()
async def collects() -> str:
    gc.collect()  # stands for any body allocating enough to start Python's cyclic garbage collector
    return "collected"


@workflow("cyclic-generator")
async def cyclic_generator(ctx: WorkflowContext) -> list[Any]:
    cleanup: list[str] = []
    holder: list[Any] = []
    pages = cyclic_pages(cleanup)
    holder.append(pages)
    holder.append(holder)  # a reference cycle: only the cyclic collector frees the generator
    got = []
    async for page in pages:
        got.append(page)
        if len(got) == 2:
            break
    del pages, holder
    return [got, await collects(), await tick("end"), cleanup]


async def test_a_generator_freed_by_the_garbage_collector_is_not_closed(store: Any) -> None:
    """A generator left open in a reference cycle is freed when the cyclic collector runs, a moment that depends
    on allocations and so differs on replay: its finally ran its step outside any run's code, unrecorded, and the
    completed run did not replay to its live result (helper-29). It is not closed: nothing of it runs."""
    ran.clear()
    definition = WorkflowDefinition(cyclic_generator)
    await store.enqueue(WorkflowTask("cyclic-generator", 1, {}, checkpoint_id="cg1"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == [["cyclic-0", "cyclic-1"], "collected", "end", []]
    assert ran == Counter({"cyclic-0": 1, "cyclic-1": 1, "end": 1})
    assert not await replay_problems(store, WorkflowRegistry(definition), "cg1", done.output)
    assert ran == Counter({"cyclic-0": 1, "cyclic-1": 1, "end": 1})  # the replay ran no body either
