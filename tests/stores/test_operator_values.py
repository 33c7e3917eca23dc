"""What operators and senders hand in as data, on every store: resolutions and evidence as the JSON data of an
effect's type, model payloads, and the reasons a run row shows after an operator acted."""

from __future__ import annotations

import sys
from collections import Counter
from datetime import timedelta
from typing import Any

import msgspec
import pydantic
import pytest

from runifold import (
    Completed,
    EffectOutcomeUnknown,
    Evidence,
    Resolution,
    ResumePolicy,
    RunStatus,
    Suspended,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    cancel_run,
    effect,
    resolve_effect,
    workflow,
)
from runifold.history import fold
from runifold.testing import WorkflowEnvironment
from tests.support import entries, worker

calls: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


class Receipt(msgspec.Struct, frozen=True):
    charge_id: str
    amount: int


@effect(resume=ResumePolicy.MANUAL)
async def charge(key: str) -> Receipt:
    raise EffectOutcomeUnknown("the gateway timed out")


async def found(key: str) -> Evidence:
    return Evidence.applied({"charge_id": "ch_found", "amount": 7})  # evidence arrives as data


@effect(resume=ResumePolicy.RECONCILE, reconcile=found)
async def reconciled_charge(key: str) -> Receipt:
    raise EffectOutcomeUnknown("the gateway timed out")


@workflow("charging-receipt")
async def charging_receipt(ctx: WorkflowContext) -> Receipt:
    return await charge()


@workflow("reconciled-receipt")
async def reconciled_receipt(ctx: WorkflowContext) -> Receipt:
    return await reconciled_charge()


async def test_an_applied_resolution_is_given_as_the_data_of_the_effects_type(store: Any) -> None:
    """An operator resolves an effect returning a Struct with a dict (as the CLI's --applied JSON does)."""
    definition = WorkflowDefinition(charging_receipt)
    await store.enqueue(WorkflowTask("charging-receipt", 1, {}, checkpoint_id="r1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await resolve_effect(store, WorkflowRegistry(definition), "r1", "charge#1", Resolution.APPLIED, by="ops",
                         reason="seen in the ledger", output={"charge_id": "ch_1", "amount": 5})
    assert (await store.get_run("r1")).reason == "effect charge#1 resolved as applied by ops: seen in the ledger"
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == Receipt("ch_1", 5)


async def test_evidence_of_an_applied_effect_may_be_data(store: Any) -> None:
    """A reconcile function that finds the effect applied may return its result as data of the effect's type."""
    await store.enqueue(WorkflowTask("reconciled-receipt", 1, {}, checkpoint_id="r2"))
    done = await worker(store, WorkflowDefinition(reconciled_receipt)).run_once()
    assert isinstance(done, Completed) and done.output == Receipt("ch_found", 7)


async def test_a_cancelled_run_shows_who_cancelled_it_and_waits_for_nothing(store: Any) -> None:
    """After a cancel, the run's reason says who and why, and its checkpoint lists no open wait."""
    definition = WorkflowDefinition(waiting, signals={"go": {"*"}})
    await store.enqueue(WorkflowTask("waiting", 1, {}, checkpoint_id="c1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    assert fold(await entries(store, "c1")).waits  # waiting for "go"
    await cancel_run(store, "c1", by="ops-carol", reason="customer withdrew")
    info = await store.get_run("c1")
    assert info.status is RunStatus.CANCELLED and info.reason == "cancelled by ops-carol: customer withdrew"
    assert fold(await entries(store, "c1")).waits == []


@workflow("waiting")
async def waiting(ctx: WorkflowContext) -> str:
    return str(await ctx.wait_signal("go", timeout=timedelta(days=1)))


class Decision(pydantic.BaseModel):
    approved: bool
    by: str


@workflow("deciding")
async def deciding(ctx: WorkflowContext) -> str:
    decision = await ctx.wait_signal("decision", type=Decision)
    return f"{type(decision).__name__} approved={decision.approved} by {decision.by}"


async def test_a_model_payload_travels_as_its_data_and_arrives_typed() -> None:
    """A sender passes a pydantic model as the payload; the wait with type= gets it back as that model."""
    async with WorkflowEnvironment(WorkflowDefinition(deciding, signals={"decision": {"alice"}})) as env:
        run = await env.start(deciding)
        await env.run_until_suspended(run)
        await env.signal(run, "decision", Decision(approved=True, by="alice"), sender="alice")
        assert await env.result(run) == "Decision approved=True by alice"
        await env.assert_replays()


def test_a_pydantic_result_prints_in_the_cli() -> None:
    """The CLI's compact rendering of a value goes through the codec: a pydantic model prints as its JSON."""
    from runifold.cli._common import compact

    assert compact(Decision(approved=True, by="bob")) == '{"approved":true,"by":"bob"}'


async def test_operator_arguments_no_store_could_answer_alike_are_refused_on_every_store(store: Any) -> None:
    """A NaN cutoff or a limit below 1 for purge_finished, and a run reference or list filter holding NUL, are
    refused at the call, the same on every store, with nothing deleted (a NaN cutoff deleted every finished run
    on PostgreSQL and none elsewhere; limit=-1 deleted every one on SQLite; a NUL reference was "not found" on
    SQLite and a StoreError on PostgreSQL: helper-33)."""
    from runifold import InvalidInputError, ScheduleNotFoundError, SerializationError

    for i in range(3):
        await store.enqueue(WorkflowTask("w", 1, {}, checkpoint_id=f"c{i}"))
        await cancel_run(store, f"c{i}", by="ops", reason="finished")
    for before, limit in ((float("nan"), 1000), (float("inf"), 1000), (await store.now() + 10, -1),
                          (await store.now() + 10, 0)):
        with pytest.raises(InvalidInputError, match="purge_finished needs"):
            await store.purge_finished(before, limit=limit)
    assert await store.count_runs() == 3
    for call in (lambda: store.get_run("c\x000"), lambda: store.history("c\x000"), lambda: store.audit("c\x000"),
                 lambda: cancel_run(store, "c\x000", by="ops", reason="r"), lambda: store.list_runs(name="w\x00"),
                 lambda: store.count_runs(name="w\x00"), lambda: store.list_runs(after="run_\x00")):
        with pytest.raises(SerializationError, match="holds a NUL character"):
            await call()
    with pytest.raises(InvalidInputError, match="limit must be"):
        await store.list_runs(limit=-1)
    for call in (lambda: store.list_runs(version=2**31), lambda: store.count_runs(version=0),
                 lambda: store.purge_finished(10**400), lambda: store.list_runs(status="bogus"),
                 lambda: store.count_runs(status="bogus"), lambda: store.list_runs(limit=None),
                 lambda: store.count_runs(holding_slot="x"), lambda: store.count_runs(holding_slot=None)):
        # PostgreSQL's integer, SQLite's, a float: StoreError, OverflowError; an unknown status, no limit or a
        # holding_slot of None: no runs, or another count on PostgreSQL (helper-35)
        with pytest.raises(InvalidInputError):
            await call()
    with pytest.raises(SerializationError, match="holds a NUL character"):
        await store.count_runs(concurrency_key="k\x00")
    for name in ("a\x00", "\ud800", "no such"):  # StoreError on PostgreSQL, UnicodeEncodeError on SQLite (helper-34)
        with pytest.raises(ScheduleNotFoundError):
            await store.pause_schedule(name)
        with pytest.raises(ScheduleNotFoundError):
            await store.delete_schedule(name)
    # a limit above any store's integer is all of them, as it is (PostgreSQL raised StoreError: helper-34)
    assert len(await store.list_runs(limit=sys.maxsize)) == 3
    assert await store.purge_finished(await store.now() + 10, limit=2) == 2
    assert await store.purge_finished(2**63, limit=sys.maxsize) == 1
    assert await store.count_runs() == 0
