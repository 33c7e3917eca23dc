"""What a new user gets wrong is refused with a runifold error that says what to write (found by helper-17)."""

from __future__ import annotations

import math
import random
import sys
from datetime import timedelta
from typing import Any

import pytest

from runifold import (
    ConfigurationError,
    InvalidInputError,
    NondeterminismError,
    ResumePolicy,
    RetryPolicy,
    RunFailedError,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowTask,
    cancel_run,
    effect,
    step,
    workflow,
)
from runifold.history import StepFailed, decode_event
from runifold.testing import WorkflowEnvironment


async def body(n: int) -> int:
    return n


async def effect_body(key: str) -> str:
    return key


def test_a_step_option_of_the_wrong_type_is_refused_where_it_is_written() -> None:
    """@step(retry=3) was accepted and then crashed the worker at the first failure, again at every claim."""
    with pytest.raises(ConfigurationError, match=r"retry= takes a RetryPolicy \(e.g. RetryPolicy\(max_attempts=5\)\)"):
        step(retry=3)(body)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"timeout= takes a timedelta"):
        step(timeout=5)(body)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"effect timeout= takes a timedelta"):
        effect(resume=ResumePolicy.REPEAT, timeout=5)(effect_body)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"RetryPolicy.initial takes a timedelta"):
        RetryPolicy(initial=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"RetryPolicy.max_attempts takes an int"):
        RetryPolicy(max_attempts="3")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"RetryPolicy.factor takes a finite number"):
        RetryPolicy(factor=math.inf)


def test_a_decorator_used_without_its_parentheses_says_how_to_write_it() -> None:
    with pytest.raises(ConfigurationError, match=r"write @step\(\)"):
        step(body)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match=r"write @effect\(resume=ResumePolicy.REPEAT\)"):
        effect(effect_body)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match=r'write @workflow\("order-intake", version=1\)'):
        workflow(body)  # type: ignore[arg-type]


@pytest.mark.parametrize("units", [-5, math.nan, math.inf])
async def test_charging_a_negative_or_non_finite_cost_fails_the_run_saying_so(units: float) -> None:
    """ctx.charge(-5) lowered the run's usage (which only grows), and NaN failed it with advice about None."""

    @workflow("charges")
    async def charges(ctx: WorkflowContext) -> float:
        ctx.charge(10)
        ctx.charge(units)
        return 0.0

    async with WorkflowEnvironment(WorkflowDefinition(charges)) as env:
        run = await env.start(charges, {})
        with pytest.raises(RunFailedError, match=r"ctx.charge takes a finite number of cost units >= 0"):
            await env.result(run)
        await env.assert_replays()


async def test_a_child_input_that_is_not_a_dict_is_refused_saying_so() -> None:
    @workflow("child")
    async def child(ctx: WorkflowContext, n: int) -> int:
        return n

    @workflow("parent")
    async def parent(ctx: WorkflowContext) -> Any:
        return await ctx.run_child(child, 5)  # type: ignore[arg-type]

    async with WorkflowEnvironment(WorkflowDefinition(parent), WorkflowDefinition(child)) as env:
        run = await env.start(parent, {})
        with pytest.raises(RunFailedError, match=r"start_child takes the child's input as a dict"):
            await env.result(run)


def test_a_divergence_names_non_deterministic_code_as_a_cause() -> None:
    """Code that reads the clock or random numbers diverges from its own history; the error says what to use."""
    message = str(NondeterminismError("a#1", "timer call sleep#1", "step call a#1"))
    assert "register the change as a new version" in message
    assert "if the code did not change, it is not deterministic: use ctx.now(), ctx.uuid() and ctx.random()" in message


def test_a_step_timeout_must_still_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="step timeout must be positive"):
        step(timeout=timedelta(0))(body)


async def test_a_context_method_in_a_step_body_fails_the_step_at_once() -> None:
    """ctx.now() in a step body (ctx passed in as an argument) was retried by the step's policy before it failed:
    another attempt raises the same, so the first attempt's failure is final, and says where to call it."""
    attempts: list[int] = []

    @step()
    async def stamp(ctx: WorkflowContext) -> str:
        attempts.append(1)
        return ctx.now().isoformat()

    @workflow("stamps")
    async def stamps(ctx: WorkflowContext) -> str:
        return await stamp(ctx)

    async with WorkflowEnvironment(WorkflowDefinition(stamps)) as env:
        run = await env.start(stamps, {})
        outcomes = await env.run_until_idle()
        assert [type(o).__name__ for o in outcomes] == ["Failed"]
        with pytest.raises(RunFailedError, match=r"OutsideWorkflowError.*not from inside a step or effect body"):
            await env.result(run)
        history = [decode_event(e.body) for e in await env.store.history(run.run_id)]
        failures = [e for e in history if isinstance(e, StepFailed)]
        assert len(attempts) == 1 and len(failures) == 1 and failures[0].retry_at is None
        await env.assert_replays()


def test_a_call_without_await_is_reported_by_mypy(tmp_path: Any) -> None:
    """A step or effect called without ``await`` runs nothing (a coroutine is made and dropped); mypy's default
    ``unused-coroutine`` check says so, because the decorated functions are typed as returning coroutines."""
    api = pytest.importorskip("mypy.api")
    module = tmp_path / "forgot.py"
    module.write_text(
        "from runifold import ResumePolicy, WorkflowContext, effect, step, workflow\n"
        "@step()\nasync def reserve(n: int) -> int:\n    return n\n"
        "@step()\ndef plain(n: int) -> int:\n    return n\n"
        "@effect(resume=ResumePolicy.REPEAT)\nasync def charge(key: str, cents: int) -> str:\n    return key\n"
        "@workflow('forgot')\nasync def forgot(ctx: WorkflowContext) -> int:\n"
        "    reserve(1)\n    plain(2)\n    charge(3)\n    return await reserve(4) + await plain(5)\n"
    )
    limit = sys.getrecursionlimit()
    try:
        out, _, status = api.run([str(module), "--strict", "--cache-dir", str(tmp_path / "cache"), "--no-error-summary"])
    finally:
        sys.setrecursionlimit(limit)  # mypy raises it for the process: a later test of deep values would not see 1,000
    lines = [line for line in out.splitlines() if "error:" in line]
    assert status == 1 and [line.split(":")[1] for line in lines] == ["13", "14", "15"], out
    assert all("must be used  [unused-coroutine]" in line for line in lines), out


def test_a_generator_step_is_refused_saying_what_to_return() -> None:
    def numbers(n: int) -> Any:
        yield n

    async def stream(n: int) -> Any:
        yield n

    for fn in (numbers, stream):
        with pytest.raises(ConfigurationError, match=r"is a generator function .* return a list of the items instead"):
            step()(fn)


def test_a_workflow_whose_first_parameter_is_not_the_context_is_refused() -> None:
    """@workflow accepted `async def f(order_id: str)`; starting it then said its parameters were [] (helper-18)."""

    async def no_ctx(order_id: str) -> str:
        return order_id

    with pytest.raises(ConfigurationError, match=r"must take the WorkflowContext as its first parameter, then its "
                                                 r"input, e.g. async def no_ctx\(ctx: WorkflowContext, order_id: str\)"):
        workflow("no-ctx")(no_ctx)

    async def unannotated(ctx, order_id: str) -> str:  # type: ignore[no-untyped-def]
        return order_id

    async def annotated(ctx: WorkflowContext, order_id: str) -> str:
        return order_id

    assert workflow("unannotated")(unannotated) is unannotated
    assert workflow("annotated")(annotated) is annotated


async def test_returning_a_call_without_await_says_await_is_missing() -> None:
    """The un-awaited step's coroutine returned as the result was 'not JSON-serialisable' (helper-18)."""

    @step()
    async def ship(order_id: str) -> str:
        return order_id

    @workflow("forgets")
    async def forgets(ctx: WorkflowContext) -> Any:
        return ship("o1")

    async with WorkflowEnvironment(WorkflowDefinition(forgets)) as env:
        run = await env.start(forgets, {})
        with pytest.raises(RunFailedError, match=r"it is a coroutine, .* add the missing `await`"):
            await env.result(run)


async def test_assert_replays_checks_cancelled_runs_too() -> None:
    """A cancelled run is finished too: assert_replays skipped it, so code that no longer matches its history
    went unreported (helper-38)."""
    changed = [False]

    @step()
    async def first() -> str:
        return "first"

    @step()
    async def other() -> str:
        return "other"

    @workflow("cancelled-later")
    async def cancelled_later(ctx: WorkflowContext) -> str:
        await (other() if changed[0] else first())
        return str(await ctx.wait_signal("go", timeout=timedelta(days=1)))

    async with WorkflowEnvironment(WorkflowDefinition(cancelled_later, signals={"go": {"*"}})) as env:
        run = await env.start(cancelled_later, {})
        await env.run_until_suspended(run)
        await cancel_run(env.store, run.run_id, by="test", reason="no longer needed")
        await env.assert_replays()
        changed[0] = True
        with pytest.raises(AssertionError, match="other"):
            await env.assert_replays()


def test_a_workflow_version_beyond_what_stores_keep_is_refused_where_it_is_written() -> None:
    """Version 2,147,483,648 was accepted, ran on SQLite and the memory store, and failed on PostgreSQL with the
    driver's "value out of int32 range" (helper-36); every place a version is written now refuses it."""
    with pytest.raises(ConfigurationError, match="workflow version must be a whole number from 1 to 2,147,483,647"):
        workflow("big", version=2**31)
    with pytest.raises(InvalidInputError, match="version must be a whole number from 1 to 2,147,483,647"):
        WorkflowTask("big", 2**31, {})
    assert WorkflowTask("big", 2**31 - 1, {}).version == 2**31 - 1


@pytest.mark.parametrize("decorate", [lambda: step(id=""), lambda: effect(id="", resume=ResumePolicy.REPEAT)])
def test_an_empty_id_is_refused_not_replaced_by_the_function_name(decorate: Any) -> None:
    """`id=""` fell back to the function's name, silently (helper-54)."""
    with pytest.raises(ConfigurationError, match="id '' is invalid"):
        @decorate()
        async def body(*args: Any) -> None:
            return None


def test_a_backoff_never_exceeds_its_maximum_even_far_past_it() -> None:
    """Jitter applied after the cap made backoffs of up to maximum + 20 % (358 s of a 300 s cap: helper-56); an
    attempt far past the cap (1,100 at factor 2) raised OverflowError. Every backoff is within [0, maximum]."""
    rng = random.Random(7)
    policy = RetryPolicy(max_attempts=5000, initial=timedelta(minutes=10), maximum=timedelta(minutes=5))
    delays = [policy.backoff(n, rng) for n in range(2, 5000)]
    assert max(delays) <= 300 and min(delays) >= 300 * 0.8
    assert sum(d == 300 for d in delays) < 10  # spread below the cap, not piled up on it (review)
    assert RetryPolicy(max_attempts=5000, initial=timedelta(0)).backoff(2000, rng) == 0.0
    growing = RetryPolicy(max_attempts=5000, initial=timedelta(seconds=1), factor=2)
    assert 0.8 <= growing.backoff(2, rng) <= 1.2 and growing.backoff(4000, rng) <= 300


def test_a_workflow_function_decorated_twice_is_refused_not_relabelled() -> None:
    """The spec lives on the function: a second @workflow relabelled the first (v1 became v2, and registering
    both said 'version 2 is already registered') (helper-61)."""
    async def order(ctx: WorkflowContext) -> int:
        return 1

    first = workflow("order", version=1)(order)
    with pytest.raises(ConfigurationError, match="is workflow 'order' version 1 already.*decorate another function"):
        workflow("order", version=2)(order)
    assert WorkflowDefinition(first).spec.version == 1

    import functools

    @workflow("order", version=2)  # another function wrapping the first (functools.wraps copies its spec): allowed
    @functools.wraps(order)
    async def order_v2(ctx: WorkflowContext) -> int:
        return 10 * await order(ctx)

    assert (WorkflowDefinition(first).spec.version, WorkflowDefinition(order_v2).spec.version) == (1, 2)


async def test_the_testing_kit_refuses_what_it_cannot_take_saying_what_it_takes() -> None:
    """A registry with definitions beside it dropped the definitions; a bare workflow function or a number for
    start= gave an AttributeError later; a negative skip moved the clock back (helper-61)."""
    from datetime import UTC, datetime

    from runifold import WorkflowRegistry
    from runifold.testing import FakeClock

    @workflow("kit-args")
    async def kit_args(ctx: WorkflowContext) -> int:
        return 1

    definition = WorkflowDefinition(kit_args)
    for args, kwargs in [((WorkflowRegistry(definition), definition), {}), ((kit_args,), {}), (([definition],), {}),
                         ((definition,), {"start": 1e9})]:
        with pytest.raises(ConfigurationError, match="WorkflowEnvironment"):
            WorkflowEnvironment(*args, **kwargs)
    async with WorkflowEnvironment(definition, start=datetime(2030, 1, 1, tzinfo=UTC)) as env:
        before = env.clock()
        for back in (timedelta(hours=-2), -1.0, math.nan):
            with pytest.raises(ConfigurationError, match="only moves forward"):
                env.clock.advance(back)
        with pytest.raises(ConfigurationError, match="only moves forward"):
            await env.skip_time(by=timedelta(seconds=-1))
        assert env.clock() == before
        assert await env.skip_time(by=timedelta(hours=1)) and env.clock() == before + 3600
        assert await env.skip_time(by=5) and env.clock() == before + 3605  # seconds, as FakeClock.advance takes
    clock = FakeClock(0)
    clock.advance(2.5)
    assert clock() == 2.5


def test_evidence_and_a_reconcile_the_effect_would_never_ask_are_refused_where_they_are_written() -> None:
    """helper-97: Evidence("APPLIED", ...) was taken, and read as no evidence (the effect parked saying "reconcile
    found no evidence either way", no word of the verdict); a reconcile= beside REPEAT or MANUAL was never called."""
    from runifold import Evidence

    with pytest.raises(ConfigurationError, match=r"Evidence takes the verdict 'applied', 'not_applied' or 'unknown' "
                                                 r"\(make it with Evidence.applied\(result\).*got 'APPLIED'"):
        Evidence("APPLIED", {"charge_id": "ch_1"})
    assert Evidence.applied({"charge_id": "ch_1"}).verdict == "applied"

    async def found(key: str) -> Evidence:
        return Evidence.unknown("no idea")

    for resume in (ResumePolicy.REPEAT, ResumePolicy.MANUAL):
        with pytest.raises(ConfigurationError, match=f"reconcile= is asked only by ResumePolicy.RECONCILE; with "
                                                     f"{resume} it would never be called"):
            effect(resume=resume, reconcile=found)(effect_body)
    effect(resume=ResumePolicy.RECONCILE, reconcile=found)(effect_body)
