"""Effects on every store: timeouts are unknown (never failures), definite failures retry, grants, operator actions."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runifold import (
    Budget,
    CapabilitySet,
    Completed,
    ConfigurationError,
    EffectFailedError,
    EffectOutcomeUnknown,
    Evidence,
    Failed,
    Idle,
    InvalidStateError,
    LeaseLost,
    Resolution,
    ResumePolicy,
    RetryPolicy,
    RunStatus,
    SerializationError,
    StepFailedError,
    Suspended,
    SuspendReason,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    cancel_run,
    effect,
    resolve_effect,
    step,
    workflow,
)
from runifold.history import EffectStarted, fold
from runifold.stores import Continue, EventRow
from tests.support import entries, event_types, until_completed, worker

calls: Counter[str] = Counter()
seen_keys: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()
    seen_keys.clear()


@effect(resume=ResumePolicy.MANUAL, timeout=timedelta(seconds=0.2))
async def hangs_manual(key: str) -> str:
    calls["hangs"] += 1
    await asyncio.sleep(5)
    return "never"


@effect(resume=ResumePolicy.REPEAT, timeout=timedelta(seconds=0.2), retry=RetryPolicy(max_attempts=2, initial=timedelta(0)))
async def hangs_repeat(key: str) -> str:
    calls["hangs"] += 1
    seen_keys.append(key)
    await asyncio.sleep(5)
    return "never"


async def unknown_evidence(key: str) -> Evidence:
    calls["reconcile"] += 1
    return Evidence.unknown("provider did not answer")


@effect(resume=ResumePolicy.RECONCILE, reconcile=unknown_evidence)
async def lost_connection(key: str) -> str:
    calls["lost"] += 1
    raise ConnectionError("connection reset")


def single(fn: Any, name: str) -> WorkflowDefinition:
    @workflow(name)
    async def wf(ctx: WorkflowContext) -> Any:
        try:
            return await fn()
        except EffectFailedError as exc:
            return f"failed: {exc.reason} [{exc.error_type or 'no exception'}]"

    return WorkflowDefinition(wf)


async def test_a_timeout_is_unknown_not_failed(store: Any) -> None:
    """A body that times out is never recorded as failed: MANUAL parks it as ambiguous."""
    await store.enqueue(WorkflowTask("hang-manual", 1, {}, checkpoint_id="e1"))
    outcome = await worker(store, single(hangs_manual, "hang-manual")).run_once()
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS
    types = await event_types(store, "e1")
    assert types == ["run_started", "effect_started", "effect_unknown", "effect_ambiguous"]
    assert (await store.get_run("e1")).status is RunStatus.PARKED


async def test_repeated_timeouts_with_repeat_reuse_the_key_then_park(store: Any) -> None:
    """REPEAT retries a timed-out call with the same key (at once: its backoff is zero) and parks it when attempts run out; nothing is marked failed."""
    definition = single(hangs_repeat, "hang-repeat")
    await store.enqueue(WorkflowTask("hang-repeat", 1, {}, checkpoint_id="e1"))
    parked = await worker(store, definition).run_once()
    assert isinstance(parked, Suspended) and parked.reason is SuspendReason.AMBIGUOUS
    assert calls["hangs"] == 2 and len(set(seen_keys)) == 1
    types = await event_types(store, "e1")
    assert "effect_failed" not in types and types.count("effect_unknown") == 2


async def test_a_lost_connection_goes_through_reconcile(store: Any) -> None:
    """A ConnectionError is an unknown outcome: reconcile is asked, and no evidence parks the run."""
    await store.enqueue(WorkflowTask("lost", 1, {}, checkpoint_id="e1"))
    outcome = await worker(store, single(lost_connection, "lost")).run_once()
    assert isinstance(outcome, Suspended) and calls == Counter(lost=1, reconcile=1)
    types = await event_types(store, "e1")
    assert types[-2:] == ["effect_reconciled", "effect_ambiguous"]


@effect(resume=ResumePolicy.MANUAL, retry=RetryPolicy(max_attempts=2, initial=timedelta(0)))
async def declined(key: str) -> str:
    calls["declined"] += 1
    raise ValueError("card declined")


async def test_a_definite_failure_follows_the_retry_policy(store: Any) -> None:
    """An exception the body raises on purpose is a failure: retried by policy (at once: no backoff), then EffectFailedError in the workflow."""
    definition = single(declined, "declining")
    await store.enqueue(WorkflowTask("declining", 1, {}, checkpoint_id="e1"))
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == "failed: ValueError: card declined [ValueError]"
    assert calls["declined"] == 2
    starts = [e.event for e in await entries(store, "e1") if isinstance(e.event, EffectStarted)]
    assert [s.attempt for s in starts] == [1, 2] and len({s.idempotency_key for s in starts}) == 1


@effect(resume=ResumePolicy.MANUAL, requires="payments")
async def guarded(key: str) -> str:
    calls["guarded"] += 1
    return "ok"


async def test_missing_capability_fails_before_the_effect(store: Any) -> None:
    """An effect requiring an ungranted capability fails the run before effect_started; granted, it runs."""
    await store.enqueue(WorkflowTask("guarded", 1, {}, checkpoint_id="e1"))
    outcome = await worker(store, single(guarded, "guarded")).run_once()
    assert isinstance(outcome, Failed) and "'payments'" in outcome.reason and calls["guarded"] == 0
    assert "effect_started" not in await event_types(store, "e1")
    granted = WorkflowDefinition(single(guarded, "guarded").fn, capabilities=CapabilitySet("payments"))
    await store.enqueue(WorkflowTask("guarded", 1, {}, checkpoint_id="e2"))
    assert isinstance(await worker(store, granted).run_once(), Completed)


@effect(resume=ResumePolicy.MANUAL)
async def unsure(key: str) -> str:
    calls["unsure"] += 1
    if calls["unsure"] == 1:
        raise EffectOutcomeUnknown("gateway returned 504")
    return "sent"


@pytest.mark.parametrize(("resolution", "expected"), [
    (Resolution.APPLIED, "sent by hand"), (Resolution.RETRY, "sent"),
    (Resolution.FAIL, "failed: resolved as failed by an operator: checked [no exception]"),
])
async def test_operator_resolution(store: Any, resolution: Resolution, expected: str) -> None:
    """Each resolution of an ambiguous effect resumes the run as its kind says, recorded with who and why."""
    definition = single(unsure, "unsure")
    registry = WorkflowRegistry(definition)
    await store.enqueue(WorkflowTask("unsure", 1, {}, checkpoint_id="e1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    assert isinstance(await worker(store, definition).run_once(), Idle)
    with pytest.raises(InvalidStateError, match="ambiguous effects: \\['unsure#1'\\]"):
        await resolve_effect(store, registry, "e1", "nope#1", resolution, by="ops", reason="x")
    await resolve_effect(store, registry, "e1", "unsure#1", resolution, by="ops", reason="checked", output="sent by hand")
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == expected
    # a finished run says so, whatever its effects were (it said "'unsure#1' is not an ambiguous effect ...
    # ambiguous effects: none": helper-33)
    with pytest.raises(InvalidStateError, match="has finished \\(completed\\): only a run that has not finished"):
        await resolve_effect(store, registry, "e1", "unsure#1", resolution, by="ops", reason="again")


async def test_resolving_an_effect_still_in_doubt_says_a_worker_reconciles_it_first(store: Any) -> None:
    """An effect whose worker died in flight is in doubt, not ambiguous: resolve refuses it and says that the next
    worker reconciles it first (helper-89: "ambiguous effects: none", with no word of what comes next)."""
    registry = WorkflowRegistry(single(unsure, "unsure"))
    await store.enqueue(WorkflowTask("unsure", 1, {}, checkpoint_id="d1"))
    claim = await store.claim("w0", {"unsure"}, 30.0)
    assert claim is not None
    await store.commit(claim.lease, 1, [EventRow.of(EffectStarted(
        key="unsure#1", idempotency_key=f"{claim.run_id}:unsure#1", attempt=1))], Continue())
    with pytest.raises(InvalidStateError, match=r"'unsure#1' is not an ambiguous effect of run d1 \(it is in doubt: "
                                                r"the next worker that takes the run reconciles it"):
        await resolve_effect(store, registry, "d1", "unsure#1", Resolution.RETRY, by="ops", reason="x")


async def test_an_applied_resolution_must_fit_the_effect_return_type(store: Any) -> None:
    """An operator's APPLIED output is checked against the effect's annotation: a wrong type is refused and nothing is appended."""
    definition = single(unsure, "unsure")
    registry = WorkflowRegistry(definition)
    await store.enqueue(WorkflowTask("unsure", 1, {}, checkpoint_id="e1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    before = await store.history("e1")
    with pytest.raises(SerializationError, match="does not fit its annotated type str .*give JSON data of type str"):
        await resolve_effect(store, registry, "e1", "unsure#1", Resolution.APPLIED, by="ops", reason="x",
                             output={"not": "a string"})
    assert await store.history("e1") == before and (await store.get_run("e1")).status is RunStatus.PARKED
    await resolve_effect(store, registry, "e1", "unsure#1", Resolution.APPLIED, by="ops", reason="x", output="sent")
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == "sent"


async def test_two_operators_resolving_one_effect_at_once_one_is_refused(store: Any) -> None:
    """helper-97: on PostgreSQL, two `runifold resolve` at once were both accepted (FAIL, then RETRY): the first
    operator was told the run would fail, and the run went on with the second's RETRY and charged. A resolution is
    decided on the history it read, and refused if the run moved on before it was written."""
    definition = single(unsure, "unsure")
    registry = WorkflowRegistry(definition)
    await store.enqueue(WorkflowTask("unsure", 1, {}, checkpoint_id="r1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    # each reads the history, then writes: the two reads come before either write
    read = asyncio.Event()
    history = store.history
    readers = 0

    async def both_read_first(ref: str) -> Any:
        nonlocal readers
        rows = await history(ref)
        readers += 1
        if readers == 2:
            read.set()
        await read.wait()
        return rows

    store.history = both_read_first
    try:
        outcomes = await asyncio.gather(
            resolve_effect(store, registry, "r1", "unsure#1", Resolution.FAIL, by="opA", reason="declined"),
            resolve_effect(store, registry, "r1", "unsure#1", Resolution.RETRY, by="opB", reason="try again"),
            return_exceptions=True)
    finally:
        del store.history
    accepted = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(accepted) == 1 and len(refused) == 1, outcomes
    assert isinstance(refused[0], InvalidStateError) and "changed while this action was decided" in str(refused[0])
    assert "runifold runs show" in str(refused[0])
    assert (await event_types(store, "r1")).count("effect_resolved") == 1
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed)
    assert done.output == ("failed: resolved as failed by an operator: declined [no exception]"
                           if outcomes[0] is accepted[0] else "sent")


@pytest.mark.parametrize(("resolution", "by", "reason", "refusal"), [
    ("bogus", "ops", "x", "resolution takes a Resolution (Resolution.APPLIED, Resolution.RETRY, Resolution.FAIL), "
                          "got 'bogus'"),
    (None, "ops", "x", "resolution takes a Resolution"),
    (Resolution.RETRY, 123, "x", "needs `by` (who) and `reason` (why), as text; both go into the history (got "
                                 "by=123, reason='x')"),
    (Resolution.RETRY, "ops", b"x", "needs `by` (who) and `reason` (why), as text"),
])
async def test_an_operator_action_with_values_of_the_wrong_type_is_refused_and_writes_nothing(
        store: Any, resolution: Any, by: Any, reason: Any, refusal: str) -> None:
    """helper-97: resolve_effect("bogus") and by=123 (resolve or cancel) were written into the history, which no
    command could read again: runs show, replay, worker claims and `replay --all` failed on the row for good."""
    definition = single(unsure, "unsure")
    await store.enqueue(WorkflowTask("unsure", 1, {}, checkpoint_id="v1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    before = await store.history("v1")
    with pytest.raises((ConfigurationError, InvalidStateError)) as caught:
        await resolve_effect(store, WorkflowRegistry(definition), "v1", "unsure#1", resolution, by=by, reason=reason)
    assert refusal in str(caught.value)
    with pytest.raises(InvalidStateError, match="cancelling a run needs `by` .* as text"):
        await cancel_run(store, "v1", by=by if not isinstance(by, str) else "ops", reason=7)
    assert await store.history("v1") == before and (await store.get_run("v1")).status is RunStatus.PARKED
    # its value, as text, names a resolution too
    await resolve_effect(store, None, "v1", "unsure#1", "retry", by="ops", reason="checked")
    assert (await entries(store, "v1"))[-1].event.resolution is Resolution.RETRY


async def test_cancel_fences_and_finishes(store: Any, tmp_path: Path) -> None:
    """Cancelling records who and why and ends the run; cancelling it again changes nothing."""
    await store.enqueue(WorkflowTask("unsure", 1, {}, checkpoint_id="e1"))
    first = await cancel_run(store, "e1", by="ops", reason="customer withdrew")
    assert (await store.get_run("e1")).status is RunStatus.CANCELLED
    assert await event_types(store, "e1") == ["run_started", "run_cancelled"]
    again = await cancel_run(store, "e1", by="ops", reason="again")
    assert again.revision == first.revision
    assert await event_types(store, "e1") == ["run_started", "run_cancelled"]


async def _nothing_found(key: str) -> Evidence:
    return Evidence.not_applied("no charge with this key")


@effect(resume=ResumePolicy.RECONCILE, reconcile=_nothing_found, retry=RetryPolicy(max_attempts=3, initial=timedelta(0)))
async def unsure_then_fine(key: str) -> str:
    calls["unsure_then_fine"] += 1
    if calls["unsure_then_fine"] <= 2:
        raise EffectOutcomeUnknown("the gateway timed out")
    return "charged"


@workflow("reconciled-again")
async def reconciled_again(ctx: WorkflowContext) -> str:
    return await unsure_then_fine()


async def test_an_effect_run_again_after_reconcile_counts_as_a_retry(store: Any) -> None:
    """Reconcile finds it not applied, so the body runs again: a retry, counted in usage and against the budget."""
    await store.enqueue(WorkflowTask("reconciled-again", 1, {}, checkpoint_id="e1"))
    done = await worker(store, WorkflowDefinition(reconciled_again)).run_once()
    assert isinstance(done, Completed) and done.output == "charged" and calls["unsure_then_fine"] == 3
    assert fold(await entries(store, "e1")).usage.retries == 2
    calls.clear()
    await store.enqueue(WorkflowTask("reconciled-again", 1, {}, checkpoint_id="e2"))
    spent = await worker(store, WorkflowDefinition(reconciled_again, Budget(max_retries=1))).run_once()
    assert isinstance(spent, Failed) and "budget exceeded: retries would reach 2" in spent.reason
    assert calls["unsure_then_fine"] == 2


@effect(resume=ResumePolicy.REPEAT, retry=RetryPolicy(max_attempts=5, initial=timedelta(0)))
async def never_sure(key: str) -> str:
    calls["never_sure"] += 1
    raise EffectOutcomeUnknown("the provider did not answer")


@workflow("never-sure")
async def never_sure_flow(ctx: WorkflowContext) -> str:
    return await never_sure()


async def test_an_unknown_outcome_with_the_retry_budget_spent_is_parked_not_failed(store: Any) -> None:
    """REPEAT would try again, but the run's retry budget is spent: the outcome is unknown, so the effect is
    parked for an operator (failing the run could hide a charge that took place)."""
    await store.enqueue(WorkflowTask("never-sure", 1, {}, checkpoint_id="n1"))
    outcome = await worker(store, WorkflowDefinition(never_sure_flow, Budget(max_retries=1))).run_once()
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS
    assert "retry budget (1) is spent" in outcome.detail and calls["never_sure"] == 2
    assert (await store.get_run("n1")).status is RunStatus.PARKED


@effect(resume=ResumePolicy.REPEAT, retry=RetryPolicy(max_attempts=5, initial=timedelta(seconds=0.3), jitter=0))
async def never_sure_later(key: str) -> str:
    calls["never_sure_later"] += 1
    raise EffectOutcomeUnknown("the provider did not answer")


@workflow("never-sure-later")
async def never_sure_later_flow(ctx: WorkflowContext) -> str:
    return await never_sure_later()


@pytest.mark.parametrize("limit", ["effect attempts", "elapsed seconds"])
async def test_an_unknown_outcome_whose_next_attempt_the_budget_refuses_is_parked_not_failed(
        store: Any, limit: str) -> None:
    """REPEAT would try again after an unknown outcome, but the budget refuses the next attempt (the effect-attempt
    budget is spent, or the run's time ran out during the backoff): the effect is parked for an operator, who
    settles it, and the run goes on. It failed the run with the effect in doubt (helper-70)."""
    if limit == "effect attempts":
        definition = WorkflowDefinition(never_sure_flow, Budget(max_effect_attempts=3))
        await store.enqueue(WorkflowTask("never-sure", 1, {}, checkpoint_id="n2"))
        outcome = await worker(store, definition).run_once()
        bodies = ("never_sure", 3)
    else:
        definition = WorkflowDefinition(never_sure_later_flow, Budget(max_elapsed=timedelta(seconds=0.2)))
        await store.enqueue(WorkflowTask("never-sure-later", 1, {}, checkpoint_id="n2"))
        outcome = await worker(store, definition).run_once()
        assert not isinstance(outcome, Failed), outcome  # waits for the backoff
        await asyncio.sleep(0.35)
        outcome = await worker(store, definition).run_once()
        bodies = ("never_sure_later", 1)
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS, outcome
    assert f"outcome unknown after {bodies[1]} attempt(s), and the run's budget allows no more" in outcome.detail
    assert f"budget exceeded: {limit}" in outcome.detail and calls[bodies[0]] == bodies[1]
    assert (await store.get_run("n2")).status is RunStatus.PARKED
    # an operator's RETRY that the budget still refuses leaves it in doubt, so parked again, not failed (helper-71)
    await resolve_effect(store, WorkflowRegistry(definition), "n2", f"{bodies[0]}#1", Resolution.RETRY,
                         by="ops", reason="try once more")
    again = await worker(store, definition).run_once()
    assert isinstance(again, Suspended) and again.reason is SuspendReason.AMBIGUOUS, again
    assert "the run's budget allows no more" in again.detail and calls[bodies[0]] == bodies[1]
    await resolve_effect(store, WorkflowRegistry(definition), "n2", f"{bodies[0]}#1", Resolution.APPLIED,
                         by="ops", reason="the provider confirms the charge", output="charged")
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == "charged" and calls[bodies[0]] == bodies[1]


async def test_a_repeat_after_a_crash_past_the_runs_elapsed_budget_is_parked_not_failed(store: Any) -> None:
    """An attempt left in doubt by a stopped worker, taken up after the run's elapsed budget ran out: the repeat
    the budget refuses leaves it in doubt, so it is parked, not failed (helper-72: it failed the run)."""
    definition = WorkflowDefinition(blocked_payment, Budget(max_elapsed=timedelta(milliseconds=300)))
    await store.enqueue(WorkflowTask("blocked-payment", 1, {}, checkpoint_id="b2"))
    running = asyncio.ensure_future(worker(store, definition).run_once())
    while calls["blocks"] == 0:
        await asyncio.sleep(0.01)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    await asyncio.sleep(0.35)
    outcome = await worker(store, definition).run_once()
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS, outcome
    assert "budget exceeded: elapsed seconds ran out" in outcome.detail and calls["blocks"] == 1


@step()
async def counted(i: int) -> int:
    calls["counted"] += 1
    return i


@workflow("spends-beside-an-unknown")
async def spends_beside_an_unknown(ctx: WorkflowContext) -> list[Any]:
    async def steps() -> list[int]:
        return [await counted(i) for i in range(3)]

    return list(await asyncio.gather(never_sure_later(), steps()))


async def test_a_run_a_siblings_budget_fails_parks_an_effect_in_doubt_first(store: Any) -> None:
    """A REPEAT effect waits to try again after an unknown outcome while another branch's step exceeds max_steps:
    the run does not fail with the effect in doubt; it parks it, and once an operator settles it, the budget fails
    the run (helper-75: it failed at once)."""
    definition = WorkflowDefinition(spends_beside_an_unknown, Budget(max_steps=2))
    await store.enqueue(WorkflowTask("spends-beside-an-unknown", 1, {}, checkpoint_id="sb1"))
    outcome = await worker(store, definition).run_once()
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS, outcome
    assert "its outcome is unknown and the run cannot go on (budget exceeded: steps would reach 3" in outcome.detail
    await resolve_effect(store, WorkflowRegistry(definition), "sb1", "1/never_sure_later#1", Resolution.APPLIED,
                         by="ops", reason="the provider confirms it", output="charged")
    failed = await worker(store, definition).run_once()
    assert isinstance(failed, Failed) and "steps would reach 3" in failed.reason, failed
    assert calls["never_sure_later"] == 1 and calls["counted"] == 2


async def test_a_takeover_over_the_recovery_budget_parks_an_effect_in_doubt_first(store: Any) -> None:
    """The recovery budget is spent at a takeover while an effect's attempt is in doubt (its worker died in it):
    the effect is parked, not the run failed (helper-75)."""
    definition = WorkflowDefinition(blocked_payment, Budget(max_recoveries=1))
    await store.enqueue(WorkflowTask("blocked-payment", 1, {}, checkpoint_id="rb1"))
    first = await store.claim("w0", {"blocked-payment"}, 0.1)
    await store.commit(first.lease, 1, [EventRow.of(EffectStarted(
        key="blocks#1", idempotency_key=f"{first.run_id}:blocks#1", attempt=1))], Continue())
    await asyncio.sleep(0.15)
    assert (await store.claim("w1", {"blocked-payment"}, 0.1)).recoveries == 1  # (a worker that died at once)
    await asyncio.sleep(0.15)
    outcome = await worker(store, definition).run_once()  # the second takeover: over the budget
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS, outcome
    assert "recoveries would reach 2" in outcome.detail and calls["blocks"] == 0
    assert (await store.get_run("rb1")).status is RunStatus.PARKED


@effect(resume=ResumePolicy.REPEAT, requires="bank")
async def wires(key: str) -> str:
    calls["wires"] += 1
    return "wired"


@workflow("wires-money")
async def wires_money(ctx: WorkflowContext) -> str:
    return await wires()


async def test_an_effect_in_doubt_whose_capability_a_deploy_withdrew_is_parked_not_failed(store: Any) -> None:
    """A worker stopped in the middle of an effect; the next deploy's definition lacks the capability it requires.
    Its attempt's outcome is unknown, so it is parked, not the run failed (the rule of _park_in_doubt)."""
    await store.enqueue(WorkflowTask("wires-money", 1, {}, checkpoint_id="cw1"))
    claim = await store.claim("w0", {"wires-money"}, 30.0)
    await store.commit(claim.lease, 1, [EventRow.of(EffectStarted(
        key="wires#1", idempotency_key=f"{claim.run_id}:wires#1", attempt=1))], Continue())
    await store.release(claim.lease)  # the worker stopped mid-attempt
    outcome = await worker(store, WorkflowDefinition(wires_money)).run_once()  # no CapabilitySet("bank")
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS, outcome
    assert "requires capability 'bank'" in outcome.detail and calls["wires"] == 0


async def test_a_run_failed_with_an_effect_in_doubt_and_retried_parks_it_when_the_budget_refuses(
        store: Any) -> None:
    """A run an older release failed on its effect-attempt budget with the effect's outcome unknown (history:
    effect_unknown, run_failed), retried by an operator as it is: the refused repeat parks the effect (its
    outcome is still unknown) instead of failing the run again (helper-72)."""
    from runifold import retry_run
    from runifold.history import EffectStarted, EffectUnknown, RunFailed
    from runifold.stores import Finish

    definition = WorkflowDefinition(never_sure_flow, Budget(max_effect_attempts=1))
    await store.enqueue(WorkflowTask("never-sure", 1, {}, checkpoint_id="old1"))
    claim = await store.claim("w0", {"never-sure"}, 30.0)
    run_id = claim.run_id
    await store.commit(claim.lease, 1, [
        EventRow.of(EffectStarted(key="never_sure#1", idempotency_key=f"{run_id}:never_sure#1", attempt=1)),
        EventRow.of(EffectUnknown(key="never_sure#1", error="EffectOutcomeUnknown: no answer", attempt=1,
                                  error_type="runifold.errors.EffectOutcomeUnknown", retry_at=0.0)),
        EventRow.of(RunFailed(reason="budget exceeded: effect attempts would reach 2, the budget allows 1",
                              key="never_sure#1", error_type="runifold.errors.BudgetExceededError"))],
        Finish(RunStatus.FAILED, "budget exceeded"))
    await retry_run(store, "old1", by="ops", reason="after the upgrade")
    outcome = await worker(store, definition).run_once()
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS, outcome
    assert calls["never_sure"] == 0 and (await store.get_run("old1")).status is RunStatus.PARKED


@step(retry=RetryPolicy(max_attempts=1))
async def refuse_order() -> str:
    await asyncio.sleep(0.05)  # the effect has started by now
    raise RuntimeError("the order was withdrawn")


@workflow("abandon-hanging")
async def abandon_hanging(ctx: WorkflowContext) -> str:
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(hangs_repeat())
            group.create_task(refuse_order())
    except* StepFailedError:
        pass
    return "withdrawn"


async def test_an_abandoned_effect_whose_outcome_is_unknown_is_repeated_then_parked_before_the_run_ends(store: Any) -> None:
    """A task group cancels an effect whose body has started; its attempt times out (outcome unknown). Nobody
    waits for it, but it may have touched the world: REPEAT tries again with the same key, and with its
    attempts spent it is parked for an operator. The run must not complete with the effect's outcome unknown."""
    await store.enqueue(WorkflowTask("abandon-hanging", 1, {}, checkpoint_id="e1"))
    outcome = await worker(store, WorkflowDefinition(abandon_hanging)).run_once()
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS, outcome
    assert calls["hangs"] == 2 and len(set(seen_keys)) == 1
    types = await event_types(store, "e1")
    assert types.count("effect_unknown") == 2 and types[-1] == "effect_ambiguous" and "run_completed" not in types
    info = await store.get_run("e1")
    assert info.status is RunStatus.PARKED and "1/hangs_repeat#1 is ambiguous" in info.reason


@effect(resume=ResumePolicy.REPEAT)
async def slow_notice(key: str) -> str:
    calls["notice"] += 1
    await asyncio.sleep(0.4)
    return "sent"


@workflow("leaves-work-behind")
async def leaves_work_behind(ctx: WorkflowContext) -> str:
    asyncio.ensure_future(slow_notice())  # an effect nobody awaits
    asyncio.ensure_future(ctx.sleep(timedelta(hours=1)))  # and a timer nobody awaits
    await ctx.sleep(timedelta(milliseconds=50))  # meanwhile the effect starts
    return "done"


async def test_a_finished_workflow_waits_for_its_effect_not_its_budget_or_abandoned_timers(store: Any) -> None:
    """The workflow returns while an effect it never awaited runs and a timer it never awaited is open, and its
    elapsed budget runs out meanwhile: the run completes once the effect has its outcome (the timer and the
    budget concern workflow code, which has finished)."""
    definition = WorkflowDefinition(leaves_work_behind, Budget(max_elapsed=timedelta(seconds=0.1)))
    await store.enqueue(WorkflowTask("leaves-work-behind", 1, {}, checkpoint_id="e1"))
    outcome = await worker(store, definition).run_once()
    assert isinstance(outcome, Completed) and outcome.output == "done", outcome
    assert calls["notice"] == 1
    types = await event_types(store, "e1")
    assert types.index("effect_completed") < types.index("run_completed")


@effect(resume=ResumePolicy.REPEAT)
async def blocks(key: str) -> str:
    calls["blocks"] += 1
    await asyncio.sleep(30)
    return "never"


@workflow("blocked-payment")
async def blocked_payment(ctx: WorkflowContext) -> str:
    return await blocks()


async def test_a_repeat_after_a_crash_with_the_effect_attempt_budget_spent_is_parked_not_failed(store: Any) -> None:
    """Found by helper-16: an attempt left in doubt by a stopped worker, with REPEAT and no effect attempts left
    in the run's budget, failed the run with the effect still in doubt. Its outcome is unknown: it is parked."""
    definition = WorkflowDefinition(blocked_payment, Budget(max_effect_attempts=1))
    await store.enqueue(WorkflowTask("blocked-payment", 1, {}, checkpoint_id="b1"))
    running = asyncio.ensure_future(worker(store, definition).run_once())
    while calls["blocks"] == 0:
        await asyncio.sleep(0.01)
    running.cancel()  # the worker stops mid-attempt and hands the run back: the attempt's outcome is unknown
    await asyncio.gather(running, return_exceptions=True)
    outcome = await worker(store, definition).run_once()
    assert isinstance(outcome, Suspended) and outcome.reason is SuspendReason.AMBIGUOUS, outcome
    assert "effect-attempt budget (1) is spent" in outcome.detail and calls["blocks"] == 1
    assert (await store.get_run("b1")).status is RunStatus.PARKED


@step()
async def long_step(name: str) -> str:
    calls[f"{name} started"] += 1
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        calls[f"{name} stopped"] += 1
        raise
    return name


@workflow("long-steps")
async def long_steps(ctx: WorkflowContext, n: int) -> list[str]:
    return list(await asyncio.gather(*(long_step(f"s{i}") for i in range(n))))


@pytest.mark.parametrize("n", [1, 2], ids=["awaited-by-the-driver", "as-tasks"])
async def test_cancelling_a_run_stops_its_step_bodies_in_flight(store: Any, n: int) -> None:
    """The worker learns of the cancellation at its next renewal and stops the bodies in flight then: a lone body
    (which the driver awaits itself) ran on to its end, holding the worker's slot (helper-23). The worker says the
    run was cancelled, not that another worker may continue it."""
    await store.enqueue(WorkflowTask("long-steps", 1, {"n": n}, checkpoint_id="l1"))
    running = asyncio.ensure_future(worker(store, WorkflowDefinition(long_steps), lease=1.5).run_once())
    await asyncio.sleep(0.2)
    await cancel_run(store, "l1", by="ops", reason="no longer needed")
    started = time.monotonic()
    lost = await asyncio.wait_for(running, 10)
    assert time.monotonic() - started < 2.0  # the next renewal (every 0.5 s), not the body's 30 s
    assert isinstance(lost, LeaseLost) and "the run was cancelled; nothing was written" in lost.detail
    assert calls == Counter({**{f"s{i} started": 1 for i in range(n)}, **{f"s{i} stopped": 1 for i in range(n)}})
    assert await event_types(store, "l1") == ["run_started", "run_cancelled"]


@effect(resume=ResumePolicy.MANUAL)
async def answers_nothing(key: str) -> int:
    calls["answers-nothing"] += 1
    raise TimeoutError("the provider did not answer")


@step()
async def takes_its_time() -> int:
    await asyncio.sleep(1.5)
    return 2


@workflow("ambiguous-beside-a-step")
async def ambiguous_beside_a_step(ctx: WorkflowContext) -> list[int]:
    return list(await asyncio.gather(answers_nothing(), takes_its_time()))


async def test_an_ambiguous_effect_is_recorded_at_once_while_a_sibling_step_runs(store: Any) -> None:
    """An effect whose outcome is unknown is parked, and that is committed at once, so an operator can resolve it
    while a sibling's body still runs (it waited for the sibling's outcome: `resolve` said the run had no ambiguous
    effect, and a crash meanwhile lost the record: helper-55)."""
    definition = WorkflowDefinition(ambiguous_beside_a_step)
    await store.enqueue(WorkflowTask("ambiguous-beside-a-step", 1, {}, checkpoint_id="ab1"))
    running = asyncio.ensure_future(worker(store, definition).run_once())
    deadline = time.monotonic() + 1.0  # well before the sibling's 1.5 s body ends
    while "effect_ambiguous" not in await event_types(store, "ab1"):
        assert time.monotonic() < deadline, await event_types(store, "ab1")
        await asyncio.sleep(0.02)
    assert "step_completed" not in await event_types(store, "ab1")
    # the operator resolves it at once: the worker holding the run is fenced (its step runs again), as by a cancel
    await resolve_effect(store, WorkflowRegistry(definition), "ab1", "1/answers_nothing#1", Resolution.APPLIED,
                         output=7, by="ops", reason="seen in the provider's console")
    assert isinstance(await running, LeaseLost)
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == [7, 2] and calls["answers-nothing"] == 1


# -- failures a retry cannot mend --------------------------------------------------------------------------------


class CardDeclined(Exception):
    """The provider answered: no. Another attempt would be answered the same."""


@step(retry=RetryPolicy(max_attempts=5, initial=timedelta(0), non_retryable=(CardDeclined, TypeError)))
async def check_card(outcome: str) -> str:
    calls[f"check_card {outcome}"] += 1
    if calls[f"check_card {outcome}"] < 3:
        raise {"declined": CardDeclined("card declined"), "bug": TypeError("bad"), "flaky": ConnectionError("reset")}[outcome]
    return "accepted"


@effect(resume=ResumePolicy.MANUAL, retry=RetryPolicy(max_attempts=5, initial=timedelta(0), non_retryable=CardDeclined))
async def charge_declined(key: str) -> str:
    calls["charge_declined"] += 1
    raise CardDeclined(f"card declined for {key}")


@workflow("checks-cards")
async def checks_cards(ctx: WorkflowContext) -> list[str]:
    said = []
    for outcome in ("declined", "bug", "flaky"):
        try:
            said.append(await check_card(outcome))
        except StepFailedError as exc:
            said.append(f"{exc.error_type} after {exc.attempts}")
    try:
        said.append(await charge_declined())
    except EffectFailedError as exc:
        said.append(f"{exc.error_type}: {exc.reason}")
    return said


async def test_a_non_retryable_failure_fails_the_call_at_its_first_attempt(store: Any) -> None:
    """helper-97: nothing told a card decline (or a bug) from a flaky network: each was tried max_attempts times
    against the provider. RetryPolicy(non_retryable=...) names the exceptions another attempt cannot mend."""
    await store.enqueue(WorkflowTask("checks-cards", 1, {}, checkpoint_id="nr1"))
    done = await until_completed(store, WorkflowDefinition(checks_cards))
    here = "tests.stores.test_effects"
    assert done.output[:3] == [f"{here}.CardDeclined after 1", "TypeError after 1", "accepted"], done.output
    assert done.output[3].startswith(f"{here}.CardDeclined: ") and "card declined" in done.output[3]
    assert dict(calls) == {"check_card declined": 1, "check_card bug": 1, "check_card flaky": 3,
                           "charge_declined": 1}


@pytest.mark.parametrize("given", ["CardDeclined", (CardDeclined, 3), [int]])
def test_non_retryable_takes_exception_classes(given: Any) -> None:
    with pytest.raises(ConfigurationError, match="RetryPolicy.non_retryable takes exception classes"):
        RetryPolicy(non_retryable=given)
