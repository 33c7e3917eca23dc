"""The debugger judges how a run ended, not only its calls (helper-76): a completed run must complete again with an
equal result, a run whose code raised must raise again (an exception of the same type), and a run whose history
has no end yet is reported as unfinished, with what its code does after the last recorded call. On every store."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from runifold import (
    Budget,
    Failed,
    Resolution,
    ResumePolicy,
    RetryPolicy,
    Suspended,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    effect,
    replay_run,
    resolve_effect,
    step,
    workflow,
)
from runifold.cli._runs import verdict
from tests.support import until_completed, worker

change: dict[str, str] = {"to": ""}


@step()
async def fetch(order: str) -> str:
    return f"fetched-{order}"


@step()
async def audit(text: str) -> str:
    return f"audit-{text}"


@workflow("ends")
async def ends(ctx: WorkflowContext, order: str) -> str:
    got = await fetch(order)
    match change["to"]:
        case "raise":
            raise RuntimeError("new code raises after the last step")
        case "other error":
            raise ValueError("a different error")
        case "moved":
            raise MovedKeyError("missing")
        case "goes on":
            return await audit(got)
        case "returns":
            return got
    if order == "bad":
        raise KeyError("missing")
    return got


#: KeyError's name and text, defined in another module (a refactor moved the class)
MovedKeyError = type("KeyError", (LookupError,), {"__module__": "billing.errors", "__str__": lambda self: repr(self.args[0])})

REGISTRY = WorkflowRegistry(WorkflowDefinition(ends))


@workflow("ends")
async def ends_renamed(ctx: WorkflowContext, order_id: str) -> str:
    return await fetch(order_id)


async def test_a_completed_run_whose_code_now_raises_diverges(store: Any) -> None:
    """It was reported clean, "the workflow failed", exit 0: a change turning successes into failures passed the
    check before a deploy."""
    change["to"] = ""
    await store.enqueue(WorkflowTask("ends", 1, {"order": "a"}, checkpoint_id="c1"))
    await until_completed(store, WorkflowDefinition(ends))
    clean = await replay_run(store, REGISTRY, "c1")
    assert clean.clean and clean.finished and clean.ended and clean.result == "fetched-a"
    renamed = await replay_run(store, WorkflowRegistry(WorkflowDefinition(ends_renamed)), "c1")
    assert verdict(renamed).startswith(  # (it said: "recorded the recorded input; code called a signature ...")
        'DIVERGED at (input): history recorded the input {"order":"a"}; code called a signature it does not fit '
        "(input for workflow 'ends' v1 does not fit its parameters ['order_id']: missing ['order_id']"), verdict(renamed)
    change["to"] = "raise"
    report = await replay_run(store, REGISTRY, "c1")
    assert report.divergence is not None and report.divergence.key == "(result)", verdict(report)
    assert verdict(report) == (
        "DIVERGED at (result): history recorded the run's completion with result \"fetched-a\"; code called a "
        "workflow that raised RuntimeError: new code raises after the last step")


async def test_a_failed_run_replays_clean_only_against_code_that_fails_the_same_way(store: Any) -> None:
    """A run whose workflow raised KeyError: the same code is clean, with the error the code raised; code that goes
    on, returns or raises another exception diverges at its end, saying what the code does instead (it said
    clean, showing the recorded error as if the changed code raised it)."""
    change["to"] = ""
    await store.enqueue(WorkflowTask("ends", 1, {"order": "bad"}, checkpoint_id="f1"))
    failed = await worker(store, WorkflowDefinition(ends)).run_once()
    assert isinstance(failed, Failed) and "KeyError" in failed.reason
    same = await replay_run(store, REGISTRY, "f1")
    assert same.clean and same.finished and same.error == "KeyError: 'missing'", verdict(same)
    recorded = "history recorded that the workflow raised KeyError: 'missing'; code called "
    for to, called in [("goes on", "a workflow that goes on to audit#1"), ("returns", 'a workflow that returns "fetched-bad"'),
                       ("other error", "a workflow that raised ValueError: a different error")]:
        change["to"] = to
        report = await replay_run(store, REGISTRY, "f1")
        assert not report.clean and not report.finished, (to, verdict(report))
        assert verdict(report).endswith(recorded + called), (to, verdict(report))
    # the same name and text from a class in another module: the divergence names both classes (helper-95: it read
    # "raised KeyError: 'missing'" on both sides, and pointed at non-deterministic code)
    change["to"] = "moved"
    report = await replay_run(store, REGISTRY, "f1")
    assert not report.clean
    assert verdict(report).endswith(
        recorded + "a workflow that raised KeyError: 'missing' (the live run raised KeyError, the replay "
        "billing.errors.KeyError: an exception's class is compared by its module and qualified name, so a class "
        "moved elsewhere is another class; define it where it was, or register the change as a new version)"), (
        verdict(report))


@workflow("ends2")
async def ends2(ctx: WorkflowContext, how: str) -> Any:
    ctx.charge(3)
    got = await fetch(how)
    ctx.charge(1 if change["to"] == "goes on" else 3)  # (a second 3 is over the budget of 5)
    if change["to"] == "goes on":
        return await audit(got)
    if how == "cancel":
        raise asyncio.CancelledError()  # the workflow's own task ends cancelled
    return object()  # a result that cannot be recorded


async def test_a_run_its_own_code_or_a_refused_charge_failed_diverges_when_the_code_now_goes_on(store: Any) -> None:
    """helper-78: a run whose task was cancelled, or whose result could not be recorded, or that the budget failed
    at a charge, replayed against code that now goes on to a new call, said clean with the recorded failure."""
    change["to"] = ""
    roomy, tight = WorkflowDefinition(ends2, Budget(max_cost_units=10)), WorkflowDefinition(ends2, Budget(max_cost_units=5))
    for ref, how, definition, why in [("x1", "cancel", roomy, "the workflow's task was cancelled"),
                                      ("x2", "unrecordable", roomy, "workflow 'ends2' cannot be recorded"),
                                      ("x3", "charge", tight, "budget exceeded: cost units would reach 6")]:
        change["to"] = ""
        await store.enqueue(WorkflowTask("ends2", 1, {"how": how}, checkpoint_id=ref))
        failed = await worker(store, definition).run_once()
        assert isinstance(failed, Failed) and failed.reason.startswith(why), failed
        registry = WorkflowRegistry(definition)
        same = await replay_run(store, registry, ref)
        assert same.clean and same.finished, verdict(same)
        change["to"] = "goes on"
        report = await replay_run(store, registry, ref)
        assert verdict(report).startswith("DIVERGED at (result): history recorded ") and verdict(report).endswith(
            "code called a workflow that goes on to audit#1"), (how, verdict(report))
    change["to"] = ""


@effect(resume=ResumePolicy.MANUAL)
async def pay(key: str, amount: int) -> dict[str, int]:
    raise TimeoutError("the provider did not answer")


@workflow("pays")
async def pays(ctx: WorkflowContext) -> dict[str, int]:
    if change["to"] == "raise first":
        raise KeyError("zone")
    return await pay(1)


async def test_a_run_whose_history_has_no_end_is_not_reported_finished(store: Any) -> None:
    """A parked effect resolved as applied leaves the run ready, its history ending at effect_resolved: its code
    returns on replay, but the run has not ended (it was reported finished, "to the end"). Code that raises
    before the recorded call names the exception (it said "the workflow had finished")."""
    change["to"] = ""
    definition = WorkflowDefinition(pays)
    registry = WorkflowRegistry(definition)
    await store.enqueue(WorkflowTask("pays", 1, {}, checkpoint_id="p1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await resolve_effect(store, registry, "p1", "pay#1", Resolution.APPLIED, by="ops", reason="checked",
                         output={"paid": 1})
    report = await replay_run(store, registry, "p1")
    assert report.clean and not report.finished and report.ended and report.result == {"paid": 1}
    assert verdict(report) == 'clean: code and history agree as far as the history goes (then the workflow returns {"paid":1})'
    assert report.steps == [("pay#1", "resolved by ops (applied)")]  # (it said "replayed", as if the body had run)
    change["to"] = "raise first"
    report = await replay_run(store, registry, "p1")
    assert report.divergence is not None and report.divergence.key == "pay#1"
    # with where it was raised (helper-89: nothing said where, in replay, runs show or the worker's log)
    line = inspect.getsourcelines(pays)[1] + 3  # (the raise)
    assert report.divergence.called == ("no call to it: the workflow raised KeyError: 'zone' (at "
                                        f"test_debugger_ends.py:{line} in pays)"), verdict(report)
    change["to"] = ""


@step(retry=RetryPolicy(max_attempts=1))
async def slow_fails() -> str:
    await asyncio.sleep(0.1)
    raise RuntimeError("declined")


@step()
async def second() -> str:
    return "b"


@workflow("both")
async def both(ctx: WorkflowContext) -> list[str]:
    if change["to"] == "charges":
        ctx.charge(100)  # over the budget of 10: the run fails here
    return list(await asyncio.gather(slow_fails(), second()))


async def test_an_engine_failure_in_the_pass_the_code_ended_in_replays_clean_against_the_same_code(store: Any) -> None:
    """The step budget refuses one branch's step while the other branch's step fails and the workflow raises: the
    run's recorded end is the budget's. The same code replays clean (helper-80: it said DIVERGED); code that now
    fails at a charge over the budget diverges (it said clean, with the budget's failure)."""
    change["to"] = ""
    definition = WorkflowDefinition(both, Budget(max_steps=1, max_cost_units=10))
    registry = WorkflowRegistry(definition)
    await store.enqueue(WorkflowTask("both", 1, {}, checkpoint_id="b1"))
    failed = await worker(store, definition).run_once()
    assert isinstance(failed, Failed) and "steps would reach 2" in failed.reason, failed
    same = await replay_run(store, registry, "b1")
    assert same.clean and same.finished and "steps would reach 2" in str(same.error), verdict(same)
    change["to"] = "charges"
    report = await replay_run(store, registry, "b1")
    assert not report.clean and not report.finished, verdict(report)
    change["to"] = ""


@workflow("pays-then-charges")
async def pays_then_charges(ctx: WorkflowContext) -> dict[str, int]:
    paid = await pay(1)
    if change["to"] == "charges":
        ctx.charge(100)
    return paid


async def test_an_unfinished_run_whose_code_fails_at_a_charge_past_its_history_is_not_finished(store: Any) -> None:
    """helper-80: it said "agree to the end", finished, for a run whose history has no end; and an operator's
    FAIL followed by a retry whose attempt returned was listed as resolved by the operator."""
    change["to"] = ""
    definition = WorkflowDefinition(pays_then_charges, Budget(max_cost_units=10))
    registry = WorkflowRegistry(definition)
    await store.enqueue(WorkflowTask("pays-then-charges", 1, {}, checkpoint_id="pc1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await resolve_effect(store, registry, "pc1", "pay#1", Resolution.APPLIED, by="ops", reason="checked",
                         output={"paid": 1})
    change["to"] = "charges"
    report = await replay_run(store, registry, "pc1")
    assert report.clean and not report.finished and report.error is not None, verdict(report)
    assert verdict(report).startswith("clean: code and history agree as far as the history goes (then the run fails: "
                                      "budget exceeded: cost units"), verdict(report)
    change["to"] = ""


tries: dict[str, int] = {}


@effect(resume=ResumePolicy.MANUAL)
async def pays_on_the_second_try(key: str) -> str:
    tries[key] = tries.get(key, 0) + 1
    if tries[key] == 1:
        raise TimeoutError("no answer")
    return "paid by the body"


@workflow("settled-then-retried")
async def settled_then_retried(ctx: WorkflowContext) -> str:
    return await pays_on_the_second_try()


async def test_an_effect_an_operator_failed_and_a_retry_then_ran_is_listed_as_replayed(store: Any) -> None:
    """helper-80: the operator's FAIL was listed though a later attempt's body produced the outcome."""
    from runifold import Completed, retry_run

    tries.clear()
    definition = WorkflowDefinition(settled_then_retried)
    registry = WorkflowRegistry(definition)
    await store.enqueue(WorkflowTask("settled-then-retried", 1, {}, checkpoint_id="sr1"))
    assert isinstance(await worker(store, definition).run_once(), Suspended)
    await resolve_effect(store, registry, "sr1", "pays_on_the_second_try#1", Resolution.FAIL, by="ops", reason="no")
    assert isinstance(await worker(store, definition).run_once(), Failed)
    await retry_run(store, "sr1", by="ops", reason="the provider is back")
    done = await worker(store, definition).run_once()
    assert isinstance(done, Completed) and done.output == "paid by the body", done
    report = await replay_run(store, registry, "sr1")
    assert report.clean and report.steps == [("pays_on_the_second_try#1", "replayed")], report.steps


def test_a_divergence_verdict_gives_its_detail_once() -> None:
    """The verdict the CLI and the web view print gives the divergence's detail (why, e.g. that what cancelled a call
    no longer does), which it dropped, unless what the code called already says it."""
    from runifold.errors import NondeterminismError
    from runifold.worker._call import ReplayReport

    stuck = ReplayReport("r1", divergence=NondeterminismError(
        "wait#1", "that the workflow stopped waiting for wait#1 here (it cancelled the call)",
        "code that still waits for it and for nothing else", "whatever cancelled the call no longer does"))
    assert verdict(stuck).endswith("code called code that still waits for it and for nothing else (whatever "
                                   "cancelled the call no longer does)")
    said = ReplayReport("r1", divergence=NondeterminismError("(input)", "the input {}", "a signature (x)", "x"))
    assert verdict(said) == "DIVERGED at (input): history recorded the input {}; code called a signature (x)"
