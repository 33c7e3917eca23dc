"""Failures you can see and runs you can recover: tracebacks, retry, wake, diverged runs, paging and purge."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Sequence
from typing import Any

from runifold import Budget, RunStatus, WorkflowTask, open_store
from runifold.history import RunCompleted, RunFailed, StepFailed
from runifold.stores import EventRow, Finish, Reschedule, Suspend, Transition
from tests.cli.conftest import Cli, key_file, run_worker_until

STEP_TRACE = ('Traceback (most recent call last):\n  File "tests/cli/app.py", line 86, in fragile\n'
              '    raise ValueError(f"cannot handle {n} yet")\nValueError: cannot handle 1 yet')


RUN_TRACE = ('Traceback (most recent call last):\n  File "tests/cli/app.py", line 91, in fragile_wf\n'
             '    return await fragile(n)\nrunifold.errors.StepFailedError: step fragile#1 failed after 1 attempt(s)')


async def drive(url: str, ref: str, events: Sequence[Any], transition: Transition, name: str = "fragile") -> str:
    """Enqueue a run and commit ``events`` and ``transition`` to it as a worker would; return its run id."""
    store = await open_store(url)
    try:
        await store.enqueue(WorkflowTask(name, 1, {"n": 1}, checkpoint_id=ref))
        claim = await store.claim("test-worker", [name], 30)
        assert claim is not None and claim.checkpoint_id == ref
        await store.commit(claim.lease, len(claim.history), [EventRow.of(e) for e in events], transition)
        return claim.run_id
    finally:
        await store.close()


def failed_events(n: int = 1, trace: str = STEP_TRACE) -> list[Any]:
    return [StepFailed(key="fragile#1", error=f"ValueError: cannot handle {n} yet", attempt=1, error_type="ValueError",
                       traceback=trace),
            RunFailed(key="fragile#1", reason="workflow raised StepFailedError: step fragile#1 failed after 1 attempt(s)",
                      error_type="runifold.errors.StepFailedError", traceback=RUN_TRACE)]


async def test_runs_show_json_gives_the_budget_of_the_loaded_app(cli: Cli) -> None:
    """With --app, runs show --json carries the definition's budget (as the web view's api/run); without, no key."""
    assert cli("migrate").returncode == 0
    await drive(cli.url, "b1", failed_events(), Finish(RunStatus.FAILED, "step failed"))
    shown = json.loads(cli("runs", "show", "b1", "--json").stdout)
    budget = Budget()
    assert shown["budget"] == {"max_steps": budget.max_steps, "max_effect_attempts": budget.max_effect_attempts,
                               "max_retries": budget.max_retries, "max_recoveries": budget.max_recoveries,
                               "max_cost_units": budget.max_cost_units, "max_elapsed": None}
    without = json.loads(cli("runs", "show", "b1", "--json", env={"RUNIFOLD_APP": ""}).stdout)
    assert "budget" not in without and without["run"]["status"] == "failed"


async def test_runs_show_gives_the_elapsed_budget_before_and_after_the_run_finishes(cli: Cli) -> None:
    """With --app: while a run is unfinished, when its elapsed budget runs out; once it finished, how long it took
    against the budget (found by helper-16: a finished run showed nothing)."""
    assert cli("migrate").returncode == 0
    await drive(cli.url, "t1", [RunCompleted(output=1)], Finish(RunStatus.COMPLETED), name="timeboxed")
    assert cli("enqueue", "timeboxed", "1", "--input", '{"n": 1}', "--checkpoint-id", "t0").returncode == 0
    open_run = cli("runs", "show", "t0").stdout.splitlines()
    assert any(line.startswith("elapsed     budget 1:00:00 from the start: runs out 20") for line in open_run), open_run
    done = cli("runs", "show", "t1").stdout.splitlines()
    assert any(line.startswith("elapsed     ") and line.endswith(" of budget 1:00:00") for line in done), done


async def test_a_failed_run_shows_its_error_type_and_traceback(cli: Cli) -> None:
    """runs show prints the failure's type and traceback, and the failed call's; history prints each under its event."""
    assert cli("migrate").returncode == 0
    await drive(cli.url, "f1", failed_events(trace=STEP_TRACE + "\x1b[31m"), Finish(RunStatus.FAILED, "step failed"))
    show = cli("runs", "show", "f1")
    assert show.returncode == 0, show.stderr
    lines = show.stdout.splitlines()
    assert "error       runifold.errors.StepFailedError in fragile#1" in lines
    at = lines.index("traceback")
    assert lines[at + 1:at + 5] == ["  " + line for line in RUN_TRACE.splitlines()]
    assert lines[at + 5] == "call        fragile#1 raised ValueError (attempt 1)"
    assert lines[at + 6:at + 11] == ["call traceback"] + ["  " + line for line in STEP_TRACE.splitlines()[:3]] + [
        "  ValueError: cannot handle 1 yet\\x1b[31m"]
    assert "\x1b" not in show.stdout
    failure = json.loads(cli("runs", "show", "f1", "--json").stdout)["failure"]
    assert failure["error_type"] == "runifold.errors.StepFailedError" and failure["traceback"] == RUN_TRACE
    assert failure["call"]["error_type"] == "ValueError" and failure["call"]["traceback"].startswith("Traceback")
    history = cli("history", "f1").stdout.splitlines()
    row = next(i for i, line in enumerate(history) if "step_failed" in line)
    assert '"error_type":"ValueError"' in history[row] and "Traceback" not in history[row]
    assert history[row + 1:row + 5] == ["      | " + line for line in STEP_TRACE.splitlines()[:3]] + [
        "      | ValueError: cannot handle 1 yet\\x1b[31m"]
    assert "run_failed" in history[row + 5]
    assert history[row + 6:] == ["      | " + line for line in RUN_TRACE.splitlines()]


async def test_a_run_failure_without_a_failed_call_shows_its_own_traceback(cli: Cli) -> None:
    """A run that failed in workflow code shows the run_failed event's own type and traceback."""
    assert cli("migrate").returncode == 0
    trace = 'Traceback (most recent call last):\n  File "app.py", line 3, in wf\nKeyError: \'sku\''
    await drive(cli.url, "f2", [RunFailed(reason="workflow raised KeyError: 'sku'", error_type="KeyError",
                                          traceback=trace)], Finish(RunStatus.FAILED, "KeyError"))
    show = cli("runs", "show", "f2").stdout
    assert "error       KeyError\n" in show and "traceback\n  Traceback (most recent call last):" in show
    assert "  KeyError: 'sku'" in show and "\ncall " not in show


def test_a_worker_failure_is_logged_and_kept_with_its_traceback(cli: Cli) -> None:
    """A run failing under `runifold worker` logs at warning/error on stderr and keeps its traceback for runs show."""
    assert cli("enqueue", "fragile", "1", "--input", '{"n": 1}', "--checkpoint-id", "f1").returncode == 0
    worker = run_worker_until(cli, "f1", RunStatus.FAILED)
    assert "warning" in worker.stderr and "step_failed" in worker.stderr
    assert "error" in worker.stderr and "run_failed" in worker.stderr
    assert "ValueError: cannot handle 1 yet" in cli("runs", "show", "f1").stdout.split("traceback")[-1]


def test_retry_continues_a_failed_run(any_cli: Cli) -> None:
    """retry records who and why and makes the failed run ready; re-enqueueing it says how to retry; others are refused."""
    cli = any_cli
    assert cli("enqueue", "fragile", "1", "--input", '{"n": 1}', "--checkpoint-id", "f1").returncode == 0
    run_worker_until(cli, "f1", RunStatus.FAILED)
    again = cli("enqueue", "fragile", "1", "--input", '{"n": 1}', "--checkpoint-id", "f1")
    assert again.returncode == 0 and "which failed: continue it with `runifold retry" in again.stdout
    retried = cli("retry", "f1", "--reason", "parser fixed", "--by", "ops-carol")
    assert retried.returncode == 0 and retried.stdout.startswith("retried run_") and "ready" in retried.stdout
    events = json.loads(cli("history", "f1", "--json").stdout)
    assert events[-1]["event"] == {**events[-1]["event"], "type": "run_retried", "by": "ops-carol",
                                   "reason": "parser fixed"}
    assert json.loads(cli("runs", "show", "f1", "--json").stdout)["run"]["status"] == "ready"
    twice = cli("retry", "f1", "--reason", "again")
    assert twice.returncode == 1 and "only failed runs can be retried" in twice.stderr


def test_a_retried_run_completes_once_the_cause_is_fixed(cli: Cli) -> None:
    """A run that failed, retried after the fix, completes on the next worker."""
    assert cli("enqueue", "fragile", "1", "--input", '{"n": 1}', "--checkpoint-id", "f1").returncode == 0
    run_worker_until(cli, "f1", RunStatus.FAILED)
    (cli.tmp / "fixed").touch()
    assert cli("retry", "f1", "--reason", "fixed").returncode == 0
    run_worker_until(cli, "f1", RunStatus.COMPLETED, timeout=20)
    assert "result      10" in cli("runs", "show", "f1").stdout


async def test_bulk_retry_retries_every_failed_run_of_a_workflow(cli: Cli) -> None:
    """retry --name N --status failed retries each failed run of N, one line each, across pages; others untouched."""
    assert cli("migrate").returncode == 0
    for i in range(105):
        await drive(cli.url, f"f{i}", failed_events(), Finish(RunStatus.FAILED, "step failed"))
    await drive(cli.url, "other", failed_events(), Finish(RunStatus.FAILED, "x"), name="steps")
    one_of_them = cli("retry", "--name", "fragile", "--reason", "r")
    assert one_of_them.returncode == 2 and "--status failed" in one_of_them.stderr
    both = cli("retry", "f1", "--name", "fragile", "--status", "failed", "--reason", "r")
    assert both.returncode == 2
    result = cli("retry", "--name", "fragile", "--status", "failed", "--reason", "provider back", "--by", "ops")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 106 and all(line.startswith("retried run_") for line in lines[:-1])
    assert lines[-1] == "105 failed run(s) of fragile retried"
    listing = json.loads(cli("runs", "list", "--status", "ready", "--json", "--limit", "1000").stdout)
    assert listing["total"] == 105
    assert json.loads(cli("runs", "show", "other", "--json").stdout)["run"]["status"] == "failed"
    none = cli("retry", "--name", "fragile", "--version", "2", "--status", "failed", "--reason", "r")
    assert none.returncode == 0 and none.stdout == (  # (it said "of that name", whose runs were there: helper-54)
        "0 failed run(s) of fragile v2 retried (no failed runs of fragile v2: check with `runifold runs list --name "
        "...`)\n")


async def test_wake_makes_a_rescheduled_or_diverged_run_due_now(any_cli: Cli) -> None:
    """wake brings a run rescheduled an hour ahead, or a diverged one, to now; diverged runs list as diverged."""
    cli = any_cli
    assert cli("migrate").returncode == 0
    store = await open_store(cli.url)
    try:
        later = await store.now() + 3_600
    finally:
        await store.close()
    await drive(cli.url, "later", [], Reschedule(at=later, reason="backing off"))
    await drive(cli.url, "diverged", [], Suspend(RunStatus.DIVERGED, wake_at=later, reason="diverged at a#1"),
                name="steps")
    await drive(cli.url, "napping", [], Suspend(RunStatus.WAITING, wake_at=later, reason="timer"), name="steps")
    listed = json.loads(cli("runs", "list", "--status", "diverged", "--json").stdout)
    assert [r["checkpoint_id"] for r in listed["runs"]] == ["diverged"]
    assert "diverged" in cli("runs", "list", "--status", "diverged").stdout
    for ref in ("later", "diverged"):
        woken = cli("wake", ref)
        assert woken.returncode == 0 and "due now" in woken.stdout, woken.stderr
        # a retry's backoff is recorded, so a rescheduled run's retry keeps its time: the line says so (helper-56)
        assert ("retry backoffs keep their times" in woken.stdout) == (ref == "later"), woken.stdout
        info = json.loads(cli("runs", "show", ref, "--json").stdout)["run"]
        assert info["due_at"] < later - 3_000
    looked_at = cli("wake", "napping")
    assert looked_at.returncode == 0 and "its timers and retry backoffs keep their times" in looked_at.stdout
    await drive(cli.url, "done", [], Finish(RunStatus.COMPLETED), name="slow")
    finished = cli("wake", "done")
    assert finished.returncode == 1 and "cannot be woken: it has finished" in finished.stderr
    cancelled = cli("cancel", "done", "--reason", "too late")
    assert cancelled.returncode == 1 and "has finished (completed): only a run that has not finished" in cancelled.stderr


async def test_runs_list_pages_with_a_total_and_times(cli: Cli) -> None:
    """runs list shows a page with the total and the command for the next; pages cover every run once, newest first."""
    assert cli("migrate").returncode == 0
    for i in range(7):
        await drive(cli.url, f"r{i}", [], Finish(RunStatus.COMPLETED), name="steps")
    everything = json.loads(cli("runs", "list", "--json").stdout)
    assert everything["total"] == 7 and everything["next_after"] is None
    expected = [r["run_id"] for r in everything["runs"]]
    assert [r["checkpoint_id"] for r in everything["runs"]] == [f"r{i}" for i in reversed(range(7))]
    for first, env in ((["runs", "list", "--limit", "3"], None),
                       # the store given on the command line, not in RUNIFOLD_STORE: the hint repeats it (helper-82)
                       (["--store", cli.url, "runs", "list", "--limit", "3"], {"RUNIFOLD_STORE": ""})):
        _follow_pages(cli, first, env, expected)
    # a full last page offers no next page; --after takes a run id only
    full = json.loads(cli("runs", "list", "--limit", "7", "--json").stdout)
    assert len(full["runs"]) == 7 and full["next_after"] is None
    assert "next page" not in cli("runs", "list", "--limit", "7").stdout
    bogus = cli("runs", "list", "--after", "bogus")
    assert bogus.returncode == 2 and "--after 'bogus' is not a run id" in bogus.stderr
    table = cli("runs", "list").stdout.splitlines()
    assert table[0].split()[:7] == ["run_id", "checkpoint_id", "workflow", "status", "created", "finished", "duration"]
    created, finished = table[2].split()[5:7]
    assert created.endswith("Z") and finished.endswith("Z") and "T" in created
    assert cli("runs", "list", "--status", "failed").stdout.splitlines()[-1] == "0 run(s) shown of 0 --status failed, newest first"


def _follow_pages(cli: Cli, args: list[str], env: dict[str, str] | None, expected: list[str]) -> None:
    """Page through ``runs list`` by running each page's next-page command as printed."""
    seen: list[str] = []
    sizes: list[int] = []
    while True:
        page = cli(*args, env=env)
        assert page.returncode == 0, page.stderr
        rows = [line.split()[0] for line in page.stdout.splitlines()[2:-1]]
        seen += rows
        sizes.append(len(rows))
        footer = page.stdout.splitlines()[-1]
        assert footer.startswith(f"{len(rows)} run(s) shown of 7")
        if "next page" not in footer:
            break
        command = footer.split("next page: ")[1]
        assert "  " not in command and ("--store" in command) == ("--store" in args), command  # (helper-84)
        args = shlex.split(command)[1:]
    assert seen == expected
    assert sizes == [3, 3, 1]  # the hint keeps --limit (helper-73: the next pages were of 50)


async def test_purge_deletes_runs_finished_before_a_time_in_batches(cli: Cli) -> None:
    """purge --finished-before deletes finished runs older than the cutoff, batch by batch, and leaves the rest."""
    assert cli("migrate").returncode == 0
    for i in range(5):
        await drive(cli.url, f"done{i}", [], Finish(RunStatus.COMPLETED), name="steps")
    assert cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--checkpoint-id", "open").returncode == 0
    kept = cli("purge", "--finished-before", "30d")
    assert kept.returncode == 0 and kept.stdout.startswith("purged 0 finished run(s)")
    bad = cli("purge", "--finished-before", "last tuesday")
    assert bad.returncode == 2 and "neither an age" in bad.stderr
    for zero in ("0d", "0s", "0.0h"):  # an age of zero would purge every finished run: refused, nothing deleted
        refused = cli("purge", "--finished-before", zero)
        assert refused.returncode == 2 and "an age of zero" in refused.stderr, refused.stderr
    for vast in ("99999999999d", "100000000d"):  # found by helper-15: it reached before 1970 and exited 0
        refused = cli("purge", "--finished-before", vast)
        assert refused.returncode == 2 and "reaches back before 1970" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    future = cli("purge", "--finished-before", "2999-01-01")  # as an age of zero: it purged every finished run
    assert future.returncode == 2 and "is in the future" in future.stderr, future.stderr  # (helper-46)
    assert len(json.loads(cli("runs", "list", "--json").stdout)["runs"]) == 6
    await asyncio.sleep(1.1)
    purged = json.loads(cli("purge", "--finished-before", "1s", "--batch", "2", "--json").stdout)
    assert purged["purged"] == 5 and purged["finished_before"] <= time.time() - 1, purged
    remaining = json.loads(cli("runs", "list", "--json").stdout)
    assert [r["checkpoint_id"] for r in remaining["runs"]] == ["open"]


def test_a_run_whose_code_diverged_is_listed_and_woken_once_fixed(cli: Cli) -> None:
    """Changed code parks a run as diverged (listed so), and after the fix `wake` makes it due now, not a minute later."""
    ring = key_file(cli.tmp, "ring.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"a" * 32}])
    assert cli("enqueue", "gated", "1", "--input", '{"n": 1}', "--checkpoint-id", "g1").returncode == 0
    run_worker_until(cli, "g1", RunStatus.WAITING)
    assert cli("signal", "g1", "approval", "--signal-id", "s1", "--as", "alice", "--key-file", ring, "--keys", ring,
               "--reason", "ok").returncode == 0
    run_worker_until(cli, "g1", RunStatus.DIVERGED, "--app", "tests.cli.app:changed")
    listed = json.loads(cli("runs", "list", "--status", "diverged", "--json").stdout)
    assert [r["checkpoint_id"] for r in listed["runs"]] == ["g1"] and "diverges" in listed["runs"][0]["reason"]
    diverged_until = listed["runs"][0]["due_at"]
    woken = cli("wake", "g1", "--json")
    assert woken.returncode == 0 and json.loads(woken.stdout)["due_at"] < diverged_until - 30
    worker = run_worker_until(cli, "g1", RunStatus.COMPLETED, timeout=20)  # the original code: compatible again
    assert worker.returncode == 0
