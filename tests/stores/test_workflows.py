"""Workflow behaviour on every store: replay, retries, versions, divergence, bad input, budgets."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from runifold import (
    Budget,
    CapabilitySet,
    Completed,
    ConfigurationError,
    DefinitionUnavailable,
    EffectOutcomeUnknown,
    Failed,
    Idle,
    InvalidInputError,
    LeaseDuration,
    LeaseLost,
    ResumePolicy,
    Retried,
    RetryPolicy,
    RunStatus,
    SerializationError,
    StepFailedError,
    Suspended,
    UnknownWorkflowError,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    effect,
    step,
    workflow,
)
from runifold.history import RunCancelled, fold
from runifold.stores import EventRow
from tests.support import NO_WAIT, SHORT_WAIT, entries, event_types, keys, send_signal, worker

calls: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


class Stock(msgspec.Struct):
    sku: str
    reserved: int


@step()
async def reserve(order_id: str) -> Stock:
    calls["reserve"] += 1
    return Stock(sku=f"sku-{order_id}", reserved=2)


@step(retry=RetryPolicy(max_attempts=3, initial=SHORT_WAIT, jitter=0))
async def flaky(n: int) -> int:
    calls["flaky"] += 1
    if calls["flaky"] == 1:
        raise RuntimeError("first attempt fails")
    return n * 10


@step()
async def double(n: int) -> int:
    calls[f"double{n}"] += 1
    return n * 2


@workflow("reserving")
async def reserving(ctx: WorkflowContext, order_id: str) -> int:
    stock = await reserve(order_id)
    return stock.reserved


@workflow("retrying")
async def retrying(ctx: WorkflowContext, order_id: str) -> dict[str, Any]:
    stock = await reserve(order_id)
    value = await flaky(4)
    return {"is_struct": isinstance(stock, Stock), "sku": stock.sku, "value": value}


async def test_completed_steps_are_not_run_again(store: Any) -> None:
    """After a retry reschedules the run, the replay returns recorded outputs without running bodies."""
    w = worker(store, WorkflowDefinition(retrying))
    await store.enqueue(WorkflowTask("retrying", 1, {"order_id": "o1"}, checkpoint_id="c1"))
    first = await w.run_once()
    assert isinstance(first, Retried) and first.key == "flaky#1" and first.attempt == 2
    await asyncio.sleep(SHORT_WAIT.total_seconds() + 0.05)
    second = await w.run_once()
    assert isinstance(second, Completed)
    assert second.output == {"is_struct": True, "sku": "sku-o1", "value": 40}
    assert calls == Counter(reserve=1, flaky=2)
    assert await event_types(store, "c1") == ["run_started", "step_completed", "step_failed", "step_completed", "run_completed"]


async def branch(n: int) -> int:
    return await double(n) + await double(n + 100)


@workflow("fan-out")
async def fan_out(ctx: WorkflowContext) -> list[int]:
    results = await asyncio.gather(branch(1), branch(2), branch(3))
    await ctx.wait_signal("go")
    return list(results)


async def test_gather_replays_identically(store: Any) -> None:
    """Concurrent branches get lineage keys, and a replay returns the same results without re-running."""
    from runifold.stores import SignalDelivery

    w = worker(store, WorkflowDefinition(fan_out, signals={"go": {"*"}}))
    await store.enqueue(WorkflowTask("fan-out", 1, {}, checkpoint_id="c1"))
    assert isinstance(await w.run_once(), Suspended)
    assert sorted(await keys(store, "c1", "step_completed")) == [
        "1/double#1", "1/double#2", "2/double#1", "2/double#2", "3/double#1", "3/double#2"]
    await store.deliver_signal(SignalDelivery("c1", (await store.get_run("c1")).run_id, "s1", "go", {}, "t", "k", "", "h"))
    done = await w.run_once()
    assert isinstance(done, Completed) and done.output == [2 + 202, 4 + 204, 6 + 206]
    assert all(v == 1 for v in calls.values()) and len(calls) == 6


@workflow("versioned", version=1)
async def versioned_v1(ctx: WorkflowContext) -> str:
    return "v1"


@workflow("versioned", version=2)
async def versioned_v2(ctx: WorkflowContext) -> str:
    return "v2"


async def test_versions_run_side_by_side(store: Any) -> None:
    """Versions 1 and 2 of one name, registered together, each run their own code."""
    w = worker(store, WorkflowDefinition(versioned_v1), WorkflowDefinition(versioned_v2))
    await store.enqueue(WorkflowTask("versioned", 1, {}, checkpoint_id="one"))
    await store.enqueue(WorkflowTask("versioned", 2, {}, checkpoint_id="two"))
    outputs = {}
    for _ in range(2):
        outcome = await w.run_once()
        assert isinstance(outcome, Completed)
        outputs[outcome.checkpoint_id] = outcome.output
    assert outputs == {"one": "v1", "two": "v2"}


async def test_definition_unavailable_leaves_the_run(store: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A worker without the exact version releases the run untouched, does not re-claim it, and a compatible worker
    finishes it. It warns once per version it lacks (it said nothing at the default level: helper-58)."""
    old = worker(store, WorkflowDefinition(versioned_v1), worker_id="old")
    await store.enqueue(WorkflowTask("versioned", 2, {}, checkpoint_id="c1"))
    await store.enqueue(WorkflowTask("versioned", 2, {}, checkpoint_id="c2"))
    with caplog.at_level("INFO", logger="runifold.worker"):
        outcome = await old.run_once()
        assert isinstance(await old.run_once(), DefinitionUnavailable)
    levels = [r.levelname for r in caplog.records if "definition_unavailable" in r.getMessage()]
    assert levels == ["WARNING", "INFO"], levels
    assert isinstance(outcome, DefinitionUnavailable) and outcome.version == 2
    info = await store.get_run("c1")
    assert info.status is RunStatus.READY and info.revision == 1 and info.lease_owner is None
    assert isinstance(await old.run_once(), Idle)
    new = worker(store, WorkflowDefinition(versioned_v2), worker_id="new")
    done = await new.run_once()
    assert isinstance(done, Completed) and done.output == "v2"


async def test_a_worker_of_many_slots_hands_back_a_run_it_cannot_run_once(store: Any) -> None:
    """Eight slots of a worker without the run's version: one claims it and hands it back; no other slot does."""
    from runifold import Supervisor

    await store.enqueue(WorkflowTask("versioned", 2, {}, checkpoint_id="c1"))
    supervisor = Supervisor(worker(store, WorkflowDefinition(versioned_v1)), 8, idle_wait=timedelta(seconds=0.02))
    running = asyncio.create_task(supervisor.run(handle_signals=False))
    await asyncio.sleep(0.5)
    supervisor.stop()
    await running
    assert supervisor.outcomes.get("DefinitionUnavailable") == 1
    info = await store.get_run("c1")
    assert info.status is RunStatus.READY and info.lease_owner is None and info.lease_token == 1


def test_registering_a_version_twice_is_an_error() -> None:
    """The same (name, version) cannot be registered twice."""
    from runifold import RegistrationError

    registry = WorkflowRegistry(WorkflowDefinition(versioned_v1))
    with pytest.raises(RegistrationError, match="already registered"):
        registry.register(WorkflowDefinition(versioned_v1))


@step()
async def a() -> int:
    calls["a"] += 1
    return 1


@step()
async def b() -> int:
    calls["b"] += 1
    return 2


@step()
async def b2() -> int:
    calls["b2"] += 1
    return 2


@step()
async def c() -> int:
    calls["c"] += 1
    return 3


@workflow("evolving")
async def evolving(ctx: WorkflowContext) -> int:
    total = await a() + await b() + await c()
    await ctx.wait_signal("go")
    return total


@workflow("evolving")
async def evolving_removed(ctx: WorkflowContext) -> int:
    total = await a() + await c()
    await ctx.wait_signal("go")
    return total


@workflow("evolving")
async def evolving_renamed(ctx: WorkflowContext) -> int:
    total = await a() + await b2() + await c()
    await ctx.wait_signal("go")
    return total


@workflow("evolving")
async def evolving_reordered(ctx: WorkflowContext) -> int:
    total = await b() + await a() + await c()
    await ctx.wait_signal("go")
    return total


@pytest.mark.parametrize(
    ("changed", "diverging_key"),
    [(evolving_removed, "b#1"), (evolving_renamed, "b#1"), (evolving_reordered, "a#1")],
    ids=["removed", "renamed", "reordered"],
)
async def test_changed_code_is_reported_not_run(store: Any, changed: Any, diverging_key: str) -> None:
    """Code that no longer matches the history names the first diverging key, runs nothing, and appends nothing."""
    from runifold.stores import SignalDelivery

    await store.enqueue(WorkflowTask("evolving", 1, {}, checkpoint_id="c1"))
    assert isinstance(await worker(store, WorkflowDefinition(evolving, signals={"go": {"*"}})).run_once(), Suspended)
    await store.deliver_signal(SignalDelivery("c1", (await store.get_run("c1")).run_id, "s1", "go", {}, "t", "k", "", "h"))
    before = await store.history("c1")
    calls.clear()
    outcome = await worker(store, WorkflowDefinition(changed, signals={"go": {"*"}}), worker_id="w2").run_once()
    assert isinstance(outcome, Failed) and not outcome.run_failed
    assert f"'{diverging_key}'" in outcome.reason
    assert await store.history("c1") == before
    assert calls["b2"] == 0 and calls["c"] == 0
    info = await store.get_run("c1")
    assert info.status is RunStatus.DIVERGED and info.due_at is not None


class Opaque:
    pass


@step()
async def opaque() -> Any:
    return Opaque()


@workflow("bad-output")
async def bad_output(ctx: WorkflowContext) -> None:
    await a()
    await opaque()


async def test_unserialisable_output_fails_clearly(store: Any) -> None:
    """A step output that cannot be recorded fails the step for good (no retry) with a message saying what to return.

    The workflow receives StepFailedError (here uncaught, so the run fails); earlier steps stay recorded.
    """
    await store.enqueue(WorkflowTask("bad-output", 1, {}, checkpoint_id="c1"))
    outcome = await worker(store, WorkflowDefinition(bad_output)).run_once()
    assert isinstance(outcome, Failed) and outcome.run_failed
    assert "opaque#1" in outcome.reason and "cannot be recorded" in outcome.reason and "JSON-compatible" in outcome.reason
    assert await event_types(store, "c1") == ["run_started", "step_completed", "step_failed", "run_failed"]
    failed = [e.event for e in await entries(store, "c1") if e.event.key == "opaque#1"]
    assert failed[0].error_type == "runifold.errors.SerializationError"  # type: ignore[union-attr]


@workflow("three-steps")
async def three_steps(ctx: WorkflowContext) -> int:
    return await a() + await b() + await c()


async def test_budget_limits_steps(store: Any) -> None:
    """Exceeding the step budget fails the run before the extra step's body runs."""
    await store.enqueue(WorkflowTask("three-steps", 1, {}, checkpoint_id="c1"))
    outcome = await worker(store, WorkflowDefinition(three_steps, Budget(max_steps=2))).run_once()
    assert isinstance(outcome, Failed) and "budget exceeded: steps" in outcome.reason
    assert calls == Counter(a=1, b=1)


@workflow("napping")
async def napping(ctx: WorkflowContext, seconds: float) -> str:
    await ctx.sleep(timedelta(seconds=seconds))
    return "rested"


@workflow("awaiting-go")
async def awaiting_go(ctx: WorkflowContext) -> str:
    return str(await ctx.wait_signal("go"))


async def test_the_elapsed_budget_ends_a_run_that_waits_past_it(store: Any) -> None:
    """max_elapsed: a run sleeping or waiting for a signal past it is woken when it runs out and fails there; a
    signal that arrived in time still counts when the worker comes late."""
    budget = Budget(max_elapsed=timedelta(seconds=0.3))
    sleeper = WorkflowDefinition(napping, budget)
    await store.enqueue(WorkflowTask("napping", 1, {"seconds": 30}, checkpoint_id="long"))
    first = await worker(store, sleeper).run_once()
    started = (await store.history("long"))[0].at
    assert isinstance(first, Suspended) and first.until == pytest.approx(started + 0.3, abs=0.05)
    await asyncio.sleep(0.4)
    ended = await worker(store, sleeper).run_once()
    assert isinstance(ended, Failed) and "budget exceeded: elapsed seconds ran out: 0." in ended.reason
    assert "s since the run started, the budget allows 0.3" in ended.reason
    await store.enqueue(WorkflowTask("napping", 1, {"seconds": 0.1}, checkpoint_id="short"))  # within budget
    assert isinstance(await worker(store, sleeper).run_once(), Suspended)
    await asyncio.sleep(0.15)
    assert isinstance(await worker(store, sleeper).run_once(), Completed)

    waiter = WorkflowDefinition(awaiting_go, budget, signals={"go": {"*"}})
    for ref, signal_first in (("never", False), ("in-time", True)):
        await store.enqueue(WorkflowTask("awaiting-go", 1, {}, checkpoint_id=ref))
        waiting = await worker(store, waiter).run_once()
        assert isinstance(waiting, Suspended) and waiting.until is not None  # woken at the budget's end
        if signal_first:
            await send_signal(store, ref, "go", "g1", "yes")
        await asyncio.sleep(0.4)  # the worker comes after the budget ran out
        outcome = await worker(store, waiter).run_once()
        if signal_first:
            assert isinstance(outcome, Completed) and outcome.output == "yes"
        else:
            assert isinstance(outcome, Failed) and "elapsed seconds" in outcome.reason


@step(retry=RetryPolicy(max_attempts=5, initial=timedelta(0)))
async def fails_every_time() -> str:
    calls["always"] += 1
    raise ValueError("nope")


@workflow("retry-budget")
async def retry_budget(ctx: WorkflowContext) -> str:
    try:
        return await fails_every_time()
    except StepFailedError:
        return "caught"  # a budget is not the workflow's to catch


async def test_the_retry_budget_fails_the_run(store: Any) -> None:
    """max_retries spent: the run fails with BudgetExceededError (workflow code cannot catch it); usage says so."""
    await store.enqueue(WorkflowTask("retry-budget", 1, {}, checkpoint_id="r1"))
    outcome = await worker(store, WorkflowDefinition(retry_budget, Budget(max_retries=1))).run_once()
    assert isinstance(outcome, Failed) and "budget exceeded: retries would reach 2" in outcome.reason
    assert calls["always"] == 2
    checkpoint = fold(await entries(store, "r1"))
    assert checkpoint.usage.retries == 1 and checkpoint.usage.steps == 2
    # the replay fails there too: it handed the last failure to the workflow, which returned 'caught'
    from runifold import WorkflowRegistry
    from runifold.worker import replay_run

    report = await replay_run(store, WorkflowRegistry(WorkflowDefinition(retry_budget, Budget(max_retries=1))), "r1")
    assert report.finished and report.result is None and "retries would reach 2" in str(report.error), report


@step(requires="payments")
async def pay() -> str:
    calls["pay"] += 1
    return "paid"


@workflow("paying")
async def paying(ctx: WorkflowContext) -> str:
    return await pay()


async def test_missing_capability_fails_before_the_body(store: Any) -> None:
    """A step requiring an ungranted capability fails the run and its body never runs; with the grant it runs."""
    await store.enqueue(WorkflowTask("paying", 1, {}, checkpoint_id="c1"))
    outcome = await worker(store, WorkflowDefinition(paying, Budget(), CapabilitySet())).run_once()
    assert isinstance(outcome, Failed) and "'payments'" in outcome.reason and calls["pay"] == 0
    await store.enqueue(WorkflowTask("paying", 1, {}, checkpoint_id="c2"))
    granted = await worker(store, WorkflowDefinition(paying, Budget(), CapabilitySet("payments"))).run_once()
    assert isinstance(granted, Completed) and calls["pay"] == 1


@workflow("charging")
async def charging(ctx: WorkflowContext) -> float:
    ctx.charge(5)
    await ctx.wait_signal("go")
    ctx.charge(2)
    return 0.0


async def test_charges_count_once_and_usage_only_grows(store: Any) -> None:
    """Cost units are charged once per call even though replay runs the charging code again."""
    from runifold.stores import SignalDelivery

    definition = WorkflowDefinition(charging, Budget(max_cost_units=10), signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("charging", 1, {}, checkpoint_id="c1"))
    await worker(store, definition).run_once()
    first = fold(await entries(store, "c1")).usage
    await store.deliver_signal(SignalDelivery("c1", (await store.get_run("c1")).run_id, "s1", "go", {}, "t", "k", "", "h"))
    assert isinstance(await worker(store, definition).run_once(), Completed)
    second = fold(await entries(store, "c1")).usage
    assert (first.cost_units, second.cost_units) == (5.0, 7.0)


@step(retry=RetryPolicy(max_attempts=2, initial=NO_WAIT))
async def always_fails() -> int:
    calls["always"] += 1
    raise ValueError("nope")


@workflow("catching")
async def catching(ctx: WorkflowContext) -> str:
    try:
        await always_fails()
    except StepFailedError as exc:
        return f"caught after {exc.attempts}"
    return "unreachable"


async def test_exhausted_retries_raise_into_the_workflow(store: Any) -> None:
    """When a step's retry policy is exhausted, the workflow receives StepFailedError and may handle it.

    The backoff is zero, so the retry is due at once and runs in the same execution.
    """
    w = worker(store, WorkflowDefinition(catching))
    await store.enqueue(WorkflowTask("catching", 1, {}, checkpoint_id="c1"))
    done = await w.run_once()
    assert isinstance(done, Completed) and done.output == "caught after 2" and calls["always"] == 2


gates: dict[str, asyncio.Event] = {}


@step()
async def blocked() -> int:
    calls["blocked"] += 1
    await gates["gate"].wait()
    return 1


@workflow("blocking")
async def blocking(ctx: WorkflowContext) -> int:
    return await blocked()


async def test_fenced_worker_gets_lease_lost_and_writes_nothing(store: Any) -> None:
    """A worker whose lease was taken away cannot commit: it reports LeaseLost and the log is unchanged."""
    gates["gate"] = asyncio.Event()
    await store.enqueue(WorkflowTask("blocking", 1, {}, checkpoint_id="c1"))
    running = asyncio.create_task(worker(store, WorkflowDefinition(blocking)).run_once())
    while calls["blocked"] == 0:
        await asyncio.sleep(0.01)
    await store.intervene("c1", {RunStatus.RUNNING}, [EventRow.of(RunCancelled(by="test", reason="fence"))], RunStatus.CANCELLED)
    before = await store.history("c1")
    gates["gate"].set()
    outcome = await running
    assert isinstance(outcome, LeaseLost)
    assert await store.history("c1") == before


async def test_enqueue_validation(store: Any) -> None:
    """Unknown workflows and ill-fitting input are refused with clear errors before anything is stored."""
    registry = WorkflowRegistry(WorkflowDefinition(retrying))
    with pytest.raises(UnknownWorkflowError, match="register its WorkflowDefinition"):
        registry.validate(WorkflowTask("nope", 1, {}))
    with pytest.raises(InvalidInputError, match="missing \\['order_id'\\]"):
        registry.validate(WorkflowTask("retrying", 1, {}))
    with pytest.raises(SerializationError, match="the task input cannot be recorded"):  # as any unrecordable value
        WorkflowTask("retrying", 1, {"order_id": object()})
    assert await store.list_runs() == []


def test_value_types_validate() -> None:
    """Invalid worker ids, lease durations and renewal intervals raise ConfigurationError at construction."""
    for bad in ["", "has space", "-leading", "x" * 200]:
        with pytest.raises(ConfigurationError):
            WorkerId.parse(bad)
    for bad_lease in [timedelta(0), timedelta(seconds=-1), timedelta(milliseconds=10)]:
        with pytest.raises(ConfigurationError):
            LeaseDuration(bad_lease)
    from runifold.stores.memory import MemoryWorkflowStore

    with pytest.raises(ConfigurationError, match="shorter than the lease"):
        from runifold import WorkflowWorker

        WorkflowWorker(MemoryWorkflowStore(), WorkflowRegistry(), WorkerId.parse("w"),
                       LeaseDuration(timedelta(seconds=1)), timedelta(seconds=2))


@pytest.mark.parametrize("open_store", ["postgres"], indirect=True)
async def test_postgres_returns_every_pooled_connection(open_store: Any) -> None:
    """Pooled connections go back to the pool whether a run completes, suspends, retries, is fenced or released."""
    store = await open_store()
    from runifold.stores import SignalDelivery

    gates["gate"] = asyncio.Event()
    await store.enqueue(WorkflowTask("retrying", 1, {"order_id": "o1"}, checkpoint_id="retry"))
    await store.enqueue(WorkflowTask("fan-out", 1, {}, checkpoint_id="suspend"))
    await store.enqueue(WorkflowTask("versioned", 2, {}, checkpoint_id="unavailable"))
    w = worker(store, WorkflowDefinition(retrying), WorkflowDefinition(fan_out, signals={"go": {"*"}}),
               WorkflowDefinition(versioned_v1))
    outcomes = set()
    for _ in range(4):
        outcome = await w.run_once()
        outcomes.add(type(outcome).__name__)
        if isinstance(outcome, Retried):
            await asyncio.sleep(SHORT_WAIT.total_seconds() + 0.05)  # its next attempt is due then
    assert outcomes == {"Retried", "Suspended", "DefinitionUnavailable", "Completed"}
    await store.enqueue(WorkflowTask("blocking", 1, {}, checkpoint_id="fenced"))
    running = asyncio.create_task(worker(store, WorkflowDefinition(blocking)).run_once())
    while calls["blocked"] == 0:
        await asyncio.sleep(0.01)
    await store.intervene("fenced", {RunStatus.RUNNING}, [EventRow.of(RunCancelled(by="t", reason="fence"))], RunStatus.CANCELLED)
    gates["gate"].set()
    assert isinstance(await running, LeaseLost)
    await store.deliver_signal(SignalDelivery("suspend", (await store.get_run("suspend")).run_id, "s1", "go", {}, "t", "k", "", "h"))
    assert isinstance(await w.run_once(), Completed)
    assert store._pool.get_idle_size() == store._pool.get_size()


async def test_a_claim_that_waited_past_its_lease_runs_no_step_once_another_worker_took_the_run(store: Any) -> None:
    """A run claimed ahead waits for its slot; when its lease ran out and another worker finished the run, it runs nothing."""
    definition = WorkflowDefinition(reserving)
    await store.enqueue(WorkflowTask("reserving", 1, {"order_id": "o1"}, checkpoint_id="o1"))
    slow = worker(store, definition, worker_id="slow", lease=0.3)
    claim = await slow._claim()  # as a supervisor's slot claims ahead of its current run's end
    assert claim is not None
    await asyncio.sleep(0.45)  # the slot's current run takes longer than the lease
    assert isinstance(await worker(store, definition, worker_id="taker").run_once(), Completed)
    assert calls["reserve"] == 1

    outcome = await slow._drive(claim)

    assert isinstance(outcome, LeaseLost), outcome
    assert calls["reserve"] == 1  # no body ran under the stale lease
    assert (await store.get_run("o1")).status is RunStatus.COMPLETED


async def test_a_claim_that_waited_within_its_lease_is_renewed_and_runs(store: Any) -> None:
    """A claim that waited longer than the renewal interval, but not its lease, is renewed before it runs, and completes."""
    definition = WorkflowDefinition(reserving)
    await store.enqueue(WorkflowTask("reserving", 1, {"order_id": "o2"}, checkpoint_id="o2"))
    slow = worker(store, definition, worker_id="slow", lease=0.9)
    claim = await slow._claim()
    assert claim is not None
    await asyncio.sleep(0.4)  # past renew_every (0.3 s), within the lease

    outcome = await slow._drive(claim)

    assert isinstance(outcome, Completed), outcome
    assert calls["reserve"] == 1


class _StopOnSecondClaim:
    """Wraps a store (a real one): logs claims and commits, and asks the supervisor to stop at the second claim."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.log: list[str] = []
        self.supervisor: Any = None

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.log.append("claim")
        if self.log.count("claim") == 2:
            self.supervisor.stop()
        return await self._store.claim(*args, **kwargs)

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        self.log.append("commit")
        try:
            return await self._store.commit(*args, **kwargs)
        finally:
            self.log.append("committed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.mark.parametrize("open_store", ["sqlite", "postgres"], indirect=True)
async def test_supervisor_hands_back_a_run_claimed_as_it_stops(open_store: Any) -> None:
    """A run a slot claims while the supervisor is stopping is released untouched, for another worker."""
    from runifold import Supervisor

    store = await open_store()
    await store.enqueue(WorkflowTask("retrying", 1, {"order_id": "o1"}, checkpoint_id="first"))
    await store.enqueue(WorkflowTask("retrying", 1, {"order_id": "o2"}, checkpoint_id="second"))
    wrapped = _StopOnSecondClaim(store)
    supervisor = Supervisor(worker(wrapped, WorkflowDefinition(retrying)), 1, idle_wait=timedelta(seconds=0.05))
    wrapped.supervisor = supervisor
    calls["flaky"] = 1  # the flaky step succeeds at once: one pass, then the final commit
    await asyncio.wait_for(supervisor.run(handle_signals=False), 30)
    # reserve, flaky, the final commit, then the claim during which the stop came
    assert wrapped.log == ["claim", "commit", "committed", "commit", "committed", "commit", "committed", "claim"]
    assert supervisor.outcomes == {"Completed": 1}
    first, second = await store.get_run("first"), await store.get_run("second")
    assert first.status is RunStatus.COMPLETED
    # the second run was claimed, then handed back as it was: ready, no owner, nothing appended
    assert second.status is RunStatus.READY and second.lease_owner is None and second.lease_token == 1
    assert await event_types(store, "second") == ["run_started"]
    assert calls["reserve"] == 1


_together: dict[str, Any] = {}


@step()
async def meet() -> int:
    """Returns only once every run of the burst is inside this step at the same time."""
    _together["inside"] += 1
    if _together["inside"] == _together["expected"]:
        _together["all"].set()
    await _together["all"].wait()
    return 1


@workflow("meeting")
async def meeting(ctx: WorkflowContext) -> int:
    return await meet()


@pytest.mark.parametrize("open_store", ["memory"], indirect=True)
async def test_a_burst_of_runs_fans_out_over_idle_slots_at_once(open_store: Any) -> None:
    """Runs enqueued while every slot idles start together: a slot that claims one wakes the next idle slot at once.

    The memory store's enqueue never yields, so the four enqueues leave one wake-up for the one slot waiting
    on the store: the case of a burst another process enqueued (one poll, or NOTIFYs that arrive together).
    The other stores' enqueues yield, and each wakes a slot itself, which would hide a broken chain.
    """
    from runifold import Supervisor

    store = await open_store()
    _together.update(inside=0, expected=4, all=asyncio.Event())
    # a poll of 30 s: only the wake-up chain between slots can start the four runs within the test's time
    supervisor = Supervisor(worker(store, WorkflowDefinition(meeting)), 4, idle_wait=timedelta(seconds=30))
    running = asyncio.create_task(supervisor.run(handle_signals=False))
    try:
        await asyncio.sleep(0.2)  # every slot has found nothing and idles
        for i in range(4):
            await store.enqueue(WorkflowTask("meeting", 1, {}, checkpoint_id=f"m{i}"))
        # each run waits inside its step for the other three: they finish only if all four ran at once
        await asyncio.wait_for(_together["all"].wait(), 10)
    finally:
        supervisor.stop()
        await asyncio.wait_for(running, 30)
    assert supervisor.outcomes.get("Completed") == 4


@effect(resume=ResumePolicy.MANUAL)
async def unsure_charge(key: str) -> str:
    raise EffectOutcomeUnknown("the gateway timed out")


@workflow("parked-and-waiting")
async def parked_and_waiting(ctx: WorkflowContext) -> list[str]:
    return list(await asyncio.gather(unsure_charge(), ctx.wait_signal("go")))


async def test_a_run_parked_on_an_effect_waits_for_its_operator_past_its_elapsed_budget(store: Any) -> None:
    """An ambiguous effect beside a signal wait, past max_elapsed: the run is not failed (that would strand the
    effect) and not woken again and again; it waits for its operator and its signal."""
    definition = WorkflowDefinition(parked_and_waiting, Budget(max_elapsed=timedelta(seconds=0.2)),
                                    signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("parked-and-waiting", 1, {}, checkpoint_id="p1"))
    first = await worker(store, definition).run_once()
    assert isinstance(first, Suspended) and first.until is None
    await asyncio.sleep(0.3)
    assert isinstance(await worker(store, definition).run_once(), Idle)  # not due: nothing to do until someone acts
    assert (await store.get_run("p1")).status is RunStatus.WAITING
