"""The replayer, as a property: recorded histories replay cleanly, and every change is caught at the right key."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runifold import Completed, WorkflowContext, WorkflowDefinition, WorkflowTask, step, workflow
from runifold.stores.memory import MemoryWorkflowStore
from runifold.worker._debug import replay
from tests.support import entries, worker

executed: Counter[str] = Counter()


def _make_step(name: str) -> Any:
    @step(id=name)
    async def body(i: int) -> int:
        executed[name] += 1
        return i * 3 + len(name)

    return body


STEPS = {name: _make_step(name) for name in ["a", "b", "c"]}


def make_workflow(plan: list[str]) -> WorkflowDefinition:
    @workflow("prop")
    async def wf(ctx: WorkflowContext) -> list[int]:
        out: list[int] = []
        for name in plan:
            out.append(await STEPS[name](len(out)))
        return out

    return WorkflowDefinition(wf)


def plan_keys(plan: list[str]) -> list[str]:
    seen: Counter[str] = Counter()
    keys = []
    for name in plan:
        seen[name] += 1
        keys.append(f"{name}#{seen[name]}")
    return keys


async def record(plan: list[str]) -> tuple[Any, list[Any]]:
    store = MemoryWorkflowStore()
    await store.enqueue(WorkflowTask("prop", 1, {}, checkpoint_id="p"))
    outcome = await worker(store, make_workflow(plan)).run_once()
    assert isinstance(outcome, Completed)
    return outcome.output, await entries(store, "p")


plans = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=8)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(plan=plans)
def test_recorded_history_replays_cleanly_without_running_bodies(plan: list[str]) -> None:
    """Replaying a run's history against the code that wrote it gives the same result and runs no body."""

    async def check() -> None:
        output, history = await record(plan)
        executed.clear()
        report = await replay(make_workflow(plan), "p", history)
        assert report.clean and report.finished and report.result == output
        assert sum(executed.values()) == 0
        assert [k for k, _ in report.steps] == plan_keys(plan)

    asyncio.run(check())


@st.composite
def plan_and_change(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    plan = draw(plans)
    kind = draw(st.sampled_from(["drop", "swap", "rename"]))
    i = draw(st.integers(0, len(plan) - 1))
    changed = list(plan)
    if kind == "drop":
        del changed[i]
    elif kind == "rename":
        changed[i] = draw(st.sampled_from([n for n in ["a", "b", "c"] if n != plan[i]]))
    else:
        j = draw(st.integers(0, len(plan) - 1))
        changed[i], changed[j] = changed[j], changed[i]
    return plan, changed


@settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(case=plan_and_change())
def test_changed_code_is_caught_at_the_first_diverging_key(case: tuple[list[str], list[str]]) -> None:
    """Dropping, swapping or renaming a call is reported at the first key where code and history differ."""
    plan, changed = case
    original, mutated = plan_keys(plan), plan_keys(changed)

    async def check() -> None:
        _, history = await record(plan)
        report = await replay(make_workflow(changed), "p", history)
        if original == mutated:
            assert report.clean
            return
        first = next((i for i, (x, y) in enumerate(zip(original, mutated, strict=False)) if x != y), len(mutated))
        assert report.divergence is not None, (plan, changed)
        assert report.divergence.key == original[first], (plan, changed, report.divergence)

    asyncio.run(check())


async def test_a_call_that_moved_to_another_task_is_named_in_the_divergence() -> None:
    """A call made in a task of its own live and in the workflow's own task now (as 3.11's wait_for and 3.12's
    differ) named only the next recorded key, or said the workflow had finished (helper-19)."""

    @workflow("moves")
    async def in_a_task(ctx: WorkflowContext) -> int:
        return int(await asyncio.create_task(STEPS["a"](1)))

    @workflow("moves")
    async def inline(ctx: WorkflowContext) -> int:
        return int(await STEPS["a"](1))

    store = MemoryWorkflowStore()
    await store.enqueue(WorkflowTask("moves", 1, {}, checkpoint_id="m1"))
    assert isinstance(await worker(store, WorkflowDefinition(in_a_task)).run_once(), Completed)
    report = await replay(WorkflowDefinition(inline), "m1", await entries(store, "m1"))
    assert report.divergence is not None
    assert "the live run made this call as 1/a#1 and the code now makes it as a#1, in another task" in str(
        report.divergence), report.divergence


async def test_two_calls_swapped_are_named_a_reorder_not_a_move() -> None:
    """Two calls of one task made in the other order are a reorder; a call of the same name in a gather branch
    was taken for the call itself, "moved to another task" (found by helper-45)."""

    @workflow("swaps")
    async def before(ctx: WorkflowContext) -> list[int]:
        first, second = await STEPS["a"](1), await STEPS["b"](2)
        return [first, second, *await asyncio.gather(STEPS["a"](3), STEPS["b"](4))]

    @workflow("swaps")
    async def after(ctx: WorkflowContext) -> list[int]:
        second, first = await STEPS["b"](2), await STEPS["a"](1)
        return [first, second, *await asyncio.gather(STEPS["a"](3), STEPS["b"](4))]

    store = MemoryWorkflowStore()
    await store.enqueue(WorkflowTask("swaps", 1, {}, checkpoint_id="s1"))
    assert isinstance(await worker(store, WorkflowDefinition(before)).run_once(), Completed)
    report = await replay(WorkflowDefinition(after), "s1", await entries(store, "s1"))
    assert report.divergence is not None and report.divergence.key == "a#1"
    text = str(report.divergence)
    assert "calls were reordered: the live run made a#1 before b#1" in text and "another task" not in text, text


async def test_a_recorded_value_of_another_type_is_shown_with_the_type_code_now_returns() -> None:
    """A step whose annotation changed: the divergence shows the recorded value and the type as code writes it
    (it said "a value of another type" and "<class 'int'>": helper-45)."""

    @step(id="label")
    async def as_text(i: int) -> str:
        return f"c{i}"

    @step(id="label")
    async def as_number(i: int) -> int:
        return i

    @workflow("retyped")
    async def old(ctx: WorkflowContext) -> str:
        return str(await as_text(8))

    @workflow("retyped")
    async def new(ctx: WorkflowContext) -> str:
        return str(await as_number(8))

    store = MemoryWorkflowStore()
    await store.enqueue(WorkflowTask("retyped", 1, {}, checkpoint_id="t1"))
    assert isinstance(await worker(store, WorkflowDefinition(old)).run_once(), Completed)
    report = await replay(WorkflowDefinition(new), "t1", await entries(store, "t1"))
    assert report.divergence is not None and report.divergence.key == "label#1"
    assert 'history recorded the value "c8", code called a call returning int' in str(report.divergence)


def test_usage_counts_cancelled_step_bodies_that_ran_and_nothing_else() -> None:
    """A cancelled call counts as a step execution only if it is a step whose body ran: the live counter never
    counts a child's start, so the fold (what a worker counts after a restart) must not either (review)."""
    from runifold.history import CallCancelled, Entry, RunStarted, fold

    history = [Entry(1, 0.0, RunStarted(name="wf", version=1, input={})),
               Entry(2, 1.0, CallCancelled(key="a#1", kind="step", attempt=1, ran=True)),
               Entry(3, 1.0, CallCancelled(key="b#1", kind="step", attempt=1, ran=False)),
               Entry(4, 1.0, CallCancelled(key="child.c#1", kind="child", attempt=1, ran=True))]
    assert fold(history).usage.steps == 1
