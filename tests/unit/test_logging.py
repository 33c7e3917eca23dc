"""runifold logs through standard logging unless the application configured structlog, and is silent by default."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from runifold._log import get_logger

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def unconfigured_structlog() -> Iterator[None]:
    """structlog as a fresh process has it (not configured), restored afterwards."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def test_library_prints_nothing_unless_logging_is_configured() -> None:
    """A process that runs workflows without configuring logging prints nothing, not even failures."""
    script = textwrap.dedent("""
        import asyncio
        from datetime import timedelta
        from runifold import (LeaseDuration, RetryPolicy, WorkerId, WorkflowContext, WorkflowDefinition,
                              WorkflowRegistry, WorkflowTask, WorkflowWorker, step, workflow)
        from runifold.stores.memory import MemoryWorkflowStore

        @step()
        async def fine(n: int) -> int:
            return n + 1

        @step(retry=RetryPolicy(max_attempts=1))
        async def broken(n: int) -> int:
            raise ValueError("no")

        @workflow("quiet")
        async def quiet(ctx: WorkflowContext, n: int) -> int:
            await fine(n)
            return await broken(n)

        async def main() -> None:
            store = MemoryWorkflowStore()
            worker = WorkflowWorker(store, WorkflowRegistry(WorkflowDefinition(quiet)), WorkerId.parse("w"),
                                    LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10))
            await store.enqueue(WorkflowTask("quiet", 1, {"n": 1}))
            outcome = await worker.run_once()
            assert type(outcome).__name__ == "Failed", outcome

        asyncio.run(main())
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""


def test_records_carry_the_event_and_its_fields(unconfigured_structlog: None, caplog: pytest.LogCaptureFixture) -> None:
    """A call becomes a stdlib record of the same logger name, with the event and every field (bound ones too)."""
    log = get_logger("runifold.test").bind(run_id="run_1", name="order")
    with caplog.at_level(logging.DEBUG, logger="runifold"):
        log.warning("step_failed", key="a#1", error="ValueError: no\x1b[31m")
    [record] = caplog.records
    assert record.name == "runifold.test" and record.levelno == logging.WARNING
    assert record.event == "step_failed"  # type: ignore[attr-defined]
    assert record.fields == {"run_id": "run_1", "name": "order", "key": "a#1",  # type: ignore[attr-defined]
                             "error": "ValueError: no\x1b[31m"}
    assert record.run_id == "run_1" and record.key == "a#1"  # type: ignore[attr-defined]
    assert record.name == "runifold.test"  # a field named like a LogRecord attribute stays in `fields` only
    assert record.getMessage() == "step_failed run_id=run_1 name=order key=a#1 error='ValueError: no\\x1b[31m'"
    assert record.funcName == "test_records_carry_the_event_and_its_fields"  # the caller, not the helper


def test_levels_are_checked_first(unconfigured_structlog: None, caplog: pytest.LogCaptureFixture) -> None:
    """Below the logger's level nothing is recorded; exception() attaches the traceback."""
    log = get_logger("runifold.test")
    with caplog.at_level(logging.WARNING, logger="runifold"):
        log.debug("step_completed", key="a#1")
        log.info("run_completed")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("slot_crashed", slot=1)
        log.error("run_failed", exc_info=ValueError("given"))
    assert [(r.event, r.levelname) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("slot_crashed", "ERROR"), ("run_failed", "ERROR")]
    crashed, failed = caplog.records
    assert crashed.exc_info is not None and crashed.exc_info[0] is RuntimeError
    assert "exc_info" not in crashed.fields  # type: ignore[attr-defined]
    assert failed.exc_info is not None and failed.exc_info[0] is ValueError


def test_an_application_that_configured_structlog_gets_the_calls(unconfigured_structlog: None,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Once the application configures structlog (even after the logger was made), calls go to structlog."""
    log = get_logger("runifold.test").bind(run_id="run_2")
    with caplog.at_level(logging.DEBUG, logger="runifold"), capture_logs() as captured:
        log.info("run_completed", revision=4)
    assert captured == [{"event": "run_completed", "run_id": "run_2", "revision": 4, "log_level": "info"}]
    assert caplog.records == []


def test_loggers_live_under_runifold() -> None:
    """A logger outside the runifold hierarchy would escape its NullHandler, so it is refused."""
    with pytest.raises(ValueError):
        get_logger("worker")
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("runifold").handlers)


async def test_a_task_left_behind_is_logged_with_its_run(unconfigured_structlog: None,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """workflow_task_left_behind exists to find code that leaks tasks, but its line named no run (helper-66):
    it carries the run id, checkpoint id and worker id, as every line about a run does."""
    import asyncio
    from datetime import timedelta

    from runifold import WorkflowContext, WorkflowDefinition, workflow
    from runifold.testing import WorkflowEnvironment

    @workflow("stubborn")
    async def stubborn(ctx: WorkflowContext) -> str:
        async def retries_for_ever() -> None:
            while True:
                try:
                    await ctx.sleep(timedelta(hours=1))
                    return
                except BaseException:  # swallows the suspension's cancellation every time
                    continue

        asyncio.create_task(retries_for_ever())
        return str(await ctx.wait_signal("go"))

    with caplog.at_level(logging.WARNING, logger="runifold"):
        async with WorkflowEnvironment(WorkflowDefinition(stubborn, signals={"go": {"*"}})) as env:
            run = await env.start(stubborn, {}, checkpoint_id="stub-1")
            await env.run_until_idle()
    [left] = [r for r in caplog.records if getattr(r, "event", "") == "workflow_task_left_behind"]
    assert left.fields["run_id"] == run.run_id and left.fields["checkpoint_id"] == "stub-1", left.fields  # type: ignore[attr-defined]
    assert left.fields["worker_id"] == "test-worker"  # type: ignore[attr-defined]
