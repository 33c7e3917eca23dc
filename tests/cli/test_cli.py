"""Every command as a real subprocess against a real store, checked by output and exit code."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time

from runifold import RunStatus, WorkflowTask, open_store
from runifold.cli._runs import DIVERGED_ADVICE
from tests.cli.conftest import ROOT, Cli, key_file, run_worker_until


def test_enqueue_is_idempotent_and_validates(cli: Cli) -> None:
    """enqueue creates once per checkpoint id, refuses unknown workflows (1) and bad JSON (2)."""
    first = cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--checkpoint-id", "c1")
    assert first.returncode == 0 and first.stdout.startswith("enqueued run_")
    again = cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--checkpoint-id", "c1")
    assert again.returncode == 0 and again.stdout.startswith("already enqueued")
    conflict = cli("enqueue", "steps", "1", "--input", '{"n": 2}', "--checkpoint-id", "c1")
    assert conflict.returncode == 1 and "already names run" in conflict.stderr
    unknown = cli("enqueue", "nope", "1")
    assert unknown.returncode == 1 and "no workflow 'nope' version 1" in unknown.stderr
    bad = cli("enqueue", "steps", "1", "--input", "{n: 1}")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr and "Traceback" not in bad.stderr
    surrogate = cli("enqueue", "steps", "1", "--input", '{"n": "\\ud800"}')  # found by helper-15: "truncated"
    assert surrogate.returncode == 2 and "lone surrogate" in surrogate.stderr and "truncated" not in surrogate.stderr
    for number in ("NaN", "Infinity", "-Infinity", "1e999"):  # found by helper-18: "lone surrogate"
        refused = cli("enqueue", "steps", "1", "--input", f'{{"n": {number}}}')
        assert refused.returncode == 2 and "holds NaN or an infinity" in refused.stderr, refused.stderr
    huge = cli("enqueue", "steps", "1", "--input", f'{{"n": {"9" * 4_301}}}')  # helper-89: "not valid JSON"
    too_long = "holds an integer of more than 4,300 characters (digits and sign)"
    assert huge.returncode == 2 and too_long in huge.stderr, huge.stderr
    negative = cli("enqueue", "steps", "1", "--input", f'{{"n": -{"9" * 4_300}}}')  # helper-92: "lone surrogate"
    assert negative.returncode == 2 and too_long in negative.stderr, negative.stderr
    zero = cli("enqueue", "steps", "0", "--input", '{"n": 1}')  # a bad value is usage (2), as the README says
    assert zero.returncode == 2 and "'0' must be from 1 to" in zero.stderr, zero.stderr
    missing = cli("enqueue", "steps", "1", "--input", "{}")
    assert missing.returncode == 1 and missing.stderr.rstrip().endswith("missing ['n']"), missing.stderr
    extra = cli("enqueue", "steps", "1", "--input", '{"n": 1, "m": 2}')  # names only what is wrong (helper-47)
    assert extra.returncode == 1 and extra.stderr.rstrip().endswith("unexpected ['m']"), extra.stderr


def test_worker_runs_and_inspection_commands(any_cli: Cli) -> None:
    """A worker process completes a run; runs list/show, history and replay describe it, in tables and JSON."""
    cli = any_cli
    assert cli("enqueue", "steps", "1", "--input", '{"n": 4}', "--checkpoint-id", "c1").returncode == 0
    worker = run_worker_until(cli, "c1", RunStatus.COMPLETED)
    assert worker.returncode == 0 and "stopped" in worker.stdout
    listing = cli("runs", "list")
    assert listing.returncode == 0 and "c1" in listing.stdout and "completed" in listing.stdout
    listed = json.loads(cli("--json", "runs", "list", "--status", "completed").stdout)
    assert [r["checkpoint_id"] for r in listed["runs"]] == ["c1"] and listed["total"] == 1
    from_env = json.loads(cli("runs", "list", env={"RUNIFOLD_JSON": "1", "RUNIFOLD_STATUS": "completed"}).stdout)
    assert from_env == listed  # every flag has an environment variable
    show = cli("runs", "show", "c1")
    assert show.returncode == 0 and "phase completed" in show.stdout and "steps 2 of 10000" in show.stdout
    assert "a#1" in show.stdout and "result      10" in show.stdout
    history = cli("history", "c1")
    assert history.returncode == 0 and "step_completed  a#1" in history.stdout
    events = json.loads(cli("--json", "history", "c1").stdout)
    assert [e["event"]["type"] for e in events] == ["run_started", "step_completed", "step_completed", "run_completed"]
    replay = cli("replay", "c1")
    assert replay.returncode == 0 and "clean: code and history agree to the end" in replay.stdout
    missing = cli("runs", "show", "nope")
    assert missing.returncode == 1 and "no run with id" in missing.stderr


def test_signal_audit_and_replay_divergence(any_cli: Cli) -> None:
    """signal signs and delivers once (duplicates acknowledged), audit shows every attempt, replay flags changed code."""
    cli = any_cli
    alice = key_file(cli.tmp, "alice.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"a" * 32}])
    forged = key_file(cli.tmp, "forged.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"f" * 32}])
    assert cli("enqueue", "gated", "1", "--input", '{"n": 1}', "--checkpoint-id", "g1").returncode == 0
    run_worker_until(cli, "g1", RunStatus.WAITING)
    diverged = cli("--app", "tests.cli.app:changed", "replay", "g1")
    assert diverged.returncode == 1 and "DIVERGED at a#1" in diverged.stdout
    check_all = cli("--app", "tests.cli.app:changed", "replay", "--all", env={"RUNIFOLD_STATUS": "completed"})
    assert check_all.returncode == 1 and "1 run(s) checked, 1 diverged" in check_all.stdout
    # what to do, once, after the reports (the CLI's line said what parted and nothing more)
    for out in (diverged.stdout, check_all.stdout):
        assert out.splitlines()[-1] == DIVERGED_ADVICE and out.count("what to do:") == 1
    assert cli("replay", "--all").returncode == 0
    assert "what to do" not in cli("replay", "g1").stdout
    args = ["signal", "g1", "approval", "--payload", '{"ok": true}', "--signal-id", "s1", "--as", "alice", "--reason", "ship it"]
    rejected = cli(*args, "--key-file", forged, "--keys", alice)
    assert rejected.returncode == 1 and "bad_signature" in rejected.stderr
    sent = cli(*args, "--key-file", alice, "--keys", alice)
    assert sent.returncode == 0 and "accepted" in sent.stdout
    duplicate = cli(*args, "--key-file", alice, env={"RUNIFOLD_KEYS": alice})
    assert duplicate.returncode == 0 and "duplicate" in duplicate.stdout
    waiting = cli("runs", "show", "g1").stdout  # a signal the workflow has not taken yet is shown (helper-18)
    assert "signal      approval from alice (key alice-1) at " in waiting and "received, not consumed" in waiting, waiting
    run_worker_until(cli, "g1", RunStatus.COMPLETED)
    assert "not consumed" not in cli("runs", "show", "g1").stdout
    # finished runs are checked when asked for (helper-51: no command replayed them all)
    assert "0 run(s) checked" in cli("replay", "--all").stdout
    assert "1 run(s) checked, 0 diverged" in cli("replay", "--all", "--status", "completed").stdout
    finished = cli("--app", "tests.cli.app:changed", "replay", "--all", "--status", "completed")
    assert finished.returncode == 1 and "1 run(s) checked, 1 diverged" in finished.stdout
    # a --name nobody knows is a typo, not a passed check (helper-76: "0 run(s) checked, 0 diverged", exit 0)
    typo = cli("replay", "--all", "--name", "greet_typo")
    assert typo.returncode == 2 and "no unfinished run of a workflow named 'greet_typo'" in typo.stderr, typo
    assert len(typo.stderr.strip().splitlines()) == 1
    # a variable set for `runs list` changes nothing of the check before a deploy (helper-56)
    assert cli("--app", "tests.cli.app:changed", "replay", "g1", env={"RUNIFOLD_STATUS": "failed",
                                                                    "RUNIFOLD_NAME": "other"}).returncode == 1
    audit = cli("audit", "g1")
    assert audit.returncode == 0
    assert "rejected:bad_signature" in audit.stdout and "accepted" in audit.stdout and "duplicate" in audit.stdout
    records = json.loads(cli("--json", "audit", "g1").stdout)
    assert [r["verdict"] for r in records] == ["rejected:bad_signature", "accepted", "duplicate"]
    assert all(r["reason"] == "ship it" for r in records)
    history = cli("history", "g1")
    assert "signal_received" in history.stdout and '"sender":"alice"' in history.stdout
    # one that came after the run finished is kept, and shown as never to be taken (it read "not yet": helper-45)
    late = [*args[:6], "s2", *args[7:]]
    assert cli(*late, "--key-file", alice, "--keys", alice).returncode == 0
    assert "received, not consumed (the run finished without a wait taking it)" in cli("runs", "show", "g1").stdout
    # an attempt against a reference that names no run is kept, and audit finds it by that reference
    ghost = cli("signal", "ghost-order", "approval", "--signal-id", "s9", "--as", "alice", "--reason", "lost?",
                "--key-file", alice, "--keys", alice)
    assert ghost.returncode == 1 and "unknown_run" in ghost.stderr, ghost.stderr
    ghost_audit = json.loads(cli("--json", "audit", "ghost-order").stdout)
    assert [(r["verdict"], r["run_ref"], r["reason"]) for r in ghost_audit] == [
        ("rejected:unknown_run", "ghost-order", "lost?")]
    nothing = cli("audit", "nothing-here")
    assert nothing.returncode == 1 and "no run with id or checkpoint id 'nothing-here'" in nothing.stderr


def test_runs_show_marks_a_lease_its_worker_stopped_renewing(cli: Cli) -> None:
    """A run held by a worker that died shows its lease as expired, and says what happens next (helper-89: it
    showed `running`, leased until a time past, like a run in progress)."""

    async def claimed(seconds: float) -> None:
        store = await open_store(cli.url)
        try:
            await store.enqueue(WorkflowTask("steps", 1, {"n": 1}, checkpoint_id=f"held-{seconds:g}"))
            assert (await store.claim("dead-worker", {"steps"}, seconds)) is not None
        finally:
            await store.close()

    asyncio.run(claimed(0.01))
    asyncio.run(claimed(3_600))
    expired = "expired: its worker stopped renewing it; the next worker to claim the run takes it over"
    assert expired in cli("runs", "show", "held-0.01").stdout
    assert expired not in cli("runs", "show", "held-3600").stdout


def test_runs_show_says_nothing_settles_an_effect_in_flight_when_its_run_was_cancelled(cli: Cli) -> None:
    """helper-81: an effect whose body was in flight when an operator cancelled its run stays in doubt for good;
    runs show said only "in doubt", with no word that nothing will settle it or how to find out."""
    from runifold.history import EffectStarted
    from runifold.stores import Continue, EventRow

    async def started_then_cancelled() -> str:
        store = await open_store(cli.url)
        try:
            await store.enqueue(WorkflowTask("notifying", 1, {"n": 5}, checkpoint_id="f1"))
            claim = await store.claim("w0", {"notifying"}, 30.0)
            assert claim is not None
            await store.commit(claim.lease, 1, [EventRow.of(EffectStarted(
                key="notify#1", idempotency_key=f"{claim.run_id}:notify#1", attempt=1))], Continue())
            return claim.run_id
        finally:
            await store.close()

    run_id = asyncio.run(started_then_cancelled())
    # while its worker holds the run it is running, not in doubt (helper-97: "in doubt" while its body ran)
    assert f"notify#1 is running (attempt 1, idempotency key {run_id}:notify#1)" in cli("runs", "show", "f1").stdout
    shown = json.loads(cli("runs", "show", "f1", "--json").stdout)  # (helper-99: "in doubt" there)
    assert shown["checkpoint"]["pending_effects"] == {"notify#1": "running"}
    assert cli("cancel", "f1", "--reason", "order withdrawn", "--by", "ops").returncode == 0
    show = cli("runs", "show", "f1").stdout
    assert f"notify#1 is in doubt (attempt 1, idempotency key {run_id}:notify#1)" in show, show
    assert "the run has finished: nothing settles it now; check the outside world by its idempotency key" in show


def test_resolve_cancel_and_migrate(cli: Cli) -> None:
    """resolve settles an ambiguous effect, cancel ends a run (again: a no-op), migrate reports the schema version."""
    from runifold.stores._sql import migrations

    assert cli("migrate").stdout.strip() == f"schema at version {migrations('sqlite')[-1][0]}"
    assert cli("enqueue", "notifying", "1", "--input", '{"n": 3}', "--checkpoint-id", "e1").returncode == 0
    run_worker_until(cli, "e1", RunStatus.PARKED)
    show = cli("runs", "show", "e1")
    run_id = json.loads(cli("runs", "show", "e1", "--json").stdout)["run"]["run_id"]
    # what the operator needs to settle it, as the web view shows it (helper-40: only the first line was printed)
    assert f"effect      notify#1 is ambiguous (attempt 1, idempotency key {run_id}:notify#1)" in show.stdout
    assert (f"settle it: runifold resolve {run_id} notify#1 --applied JSON | --retry | --fail --reason ..."
            in show.stdout)
    wrong = cli("resolve", "e1", "other#1", "--retry", "--reason", "x")
    assert wrong.returncode == 1 and "ambiguous effects: ['notify#1']" in wrong.stderr
    # --retry and --fail need no code: only an --applied output is checked against it (helper-46)
    resolved = cli("resolve", "e1", "notify#1", "--retry", "--reason", "smtp is back", "--by", "ops-bob", "--json",
                   env={"RUNIFOLD_APP": ""})
    assert resolved.returncode == 0, resolved.stderr
    # --json names the run by its run id and checkpoint id, as every other command does (helper-63)
    answer = json.loads(resolved.stdout)
    assert (answer["run_id"], answer["checkpoint_id"], answer["effect"], answer["resolution"]) == (
        run_id, "e1", "notify#1", "retry"), answer
    run_worker_until(cli, "e1", RunStatus.COMPLETED)
    assert '"by":"ops-bob"' in cli("history", "e1").stdout
    # a parked run cancelled: its effect stays in doubt, and nothing can settle it now (helper-70: runs show named
    # `runifold resolve`, which refuses a finished run); its replay ends at the cancellation, not "as far as ..."
    (cli.tmp / "notify-called").unlink()  # the effect's next outcome is unknown again
    assert cli("enqueue", "notifying", "1", "--input", '{"n": 4}', "--checkpoint-id", "e2").returncode == 0
    run_worker_until(cli, "e2", RunStatus.PARKED)
    assert cli("cancel", "e2", "--reason", "order withdrawn", "--by", "ops").returncode == 0
    show = cli("runs", "show", "e2").stdout
    assert "notify#1 is ambiguous" in show and "settle it" not in show
    assert "the run has finished: nothing settles it now; check the outside world by its idempotency key" in show
    replayed = cli("replay", "e2")
    assert replayed.returncode == 0 and ("clean: code and history agree up to the run's cancellation (cancelled by "
                                         "ops: order withdrawn; its code waited at notify#1)") in replayed.stdout
    assert [r["cancelled"] for r in json.loads(cli("replay", "e2", "--json").stdout)] == [True]
    assert cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--checkpoint-id", "c9").returncode == 0
    assert cli("cancel", "c9", "--reason", "not needed").returncode == 0
    again = cli("cancel", "c9", "--reason", "again")
    assert again.returncode == 0 and "c9 was already cancelled" in again.stdout
    answer = json.loads(cli("cancel", "c9", "--reason", "again", "--json").stdout)
    assert answer["run_id"].startswith("run_") and answer["checkpoint_id"] == "c9" and answer["already_cancelled"]
    assert [e["event"]["type"] for e in json.loads(cli("history", "c9", "--json").stdout)] == [
        "run_started", "run_cancelled"]


async def test_sigterm_releases_in_flight_runs(any_cli: Cli) -> None:
    """SIGTERM with runs in flight: leases are released at once, another worker finishes each run, none commits twice."""
    cli = any_cli
    for i in range(3):
        assert cli("enqueue", "slow", "1", "--input", json.dumps({"tag": f"t{i}"}), "--checkpoint-id", f"s{i}").returncode == 0
    first = cli.spawn("worker", "--concurrency", "4", "--lease", "120", "--grace", "0.5", "--worker-id", "first",
                      env={"RUNIFOLD_TEST_SLOW": "30"})
    deadline = time.monotonic() + 60
    while len(list(cli.tmp.glob("started-*"))) < 3:
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0, out
    store = await open_store(cli.url)
    try:
        for i in range(3):
            info = await store.get_run(f"s{i}")
            assert info.status is RunStatus.READY and info.lease_owner is None  # released, not left to expire
        second = cli.spawn("worker", "--concurrency", "4", "--worker-id", "second", env={"RUNIFOLD_TEST_SLOW": "0"})
        try:
            for i in range(3):
                await cli.wait_status(f"s{i}", RunStatus.COMPLETED)
        finally:
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=60)
        for i in range(3):
            types = [e.type for e in await store.history(f"s{i}")]
            assert types == ["run_started", "step_completed", "run_completed"]
    finally:
        await store.close()


def test_sigterm_stops_a_worker_whose_async_steps_block_the_loop_past_their_lease(cli: Cli) -> None:
    """helper-98: async steps that block the event loop for longer than the lease: the worker's slots took the run
    over from each other (the lease expired while the loop was blocked) and the SIGTERM handler never ran, so
    the worker ran on until SIGKILL (60 s in the report). The signal now stops all claiming at once."""
    assert cli("enqueue", "blocking", "1", "--input", '{"tag": "b"}', "--checkpoint-id", "b1").returncode == 0
    worker = cli.spawn("worker", "--lease", "0.5", "--grace", "1", "--worker-id", "blocked",
                       env={"RUNIFOLD_TEST_BLOCK": "1.5"})
    try:
        deadline = time.monotonic() + 60
        while len(list(cli.tmp.glob("blocking-*"))) < 2:  # taken over once already: the lease ran out
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        started = len(list(cli.tmp.glob("blocking-*")))
        out, err = worker.communicate(timeout=30)  # (before the fix: never, until SIGKILL)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0 and "stopping: in-flight runs get up to 1 s" in err, (out, err)
    # no slot took the run again after the signal: at most the step in flight when it came ran on
    assert len(list(cli.tmp.glob("blocking-*"))) <= started + 1


def test_signals_after_the_worker_has_stopped_change_nothing(cli: Cli) -> None:
    """A second SIGTERM sent just after the first, once the worker has stopped, killed it during Python's exit
    (status -15 after "worker ... stopped"): it is ignored, and the worker exits 0 (helper-51)."""
    worker = cli.spawn("worker", "--idle-wait", "0.1")
    try:
        assert worker.stdout is not None
        assert "serving" in worker.stdout.readline()
        worker.send_signal(signal.SIGTERM)
        assert "stopped" in worker.stdout.readline()
        while worker.poll() is None:  # signal the whole way out
            worker.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        assert worker.returncode == 0
    finally:
        worker.kill()
        worker.communicate()


def test_sigterm_stops_a_worker_whose_stderr_reader_went_away(cli: Cli) -> None:
    """`runifold worker ... 2>&1 | head -1`: the reader is gone, so saying "stopping" raised BrokenPipeError before
    the stop was asked for, and neither SIGTERM nor a second one stopped the worker (helper-23)."""
    assert cli("enqueue", "slow", "1", "--input", json.dumps({"tag": "p"}), "--checkpoint-id", "p1").returncode == 0
    worker = subprocess.Popen(cli.argv("worker", "--grace", "0.5", "--idle-wait", "0.1"), cwd=ROOT,
                              env={**cli.env, "RUNIFOLD_TEST_SLOW": "30"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not list(cli.tmp.glob("started-*")):
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.05)
        assert worker.stderr is not None
        worker.stderr.close()  # the reader goes away
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0
    finally:
        worker.kill()


def test_runs_show_escapes_a_control_character_in_a_checkpoint_id(cli: Cli) -> None:
    """helper-90: a tab in a checkpoint id was printed raw by runs show (runs list escaped it)."""
    assert cli("enqueue", "notifying", "1", "--input", '{"n": 1}', "--checkpoint-id", "order\t7").returncode == 0
    first = cli("runs", "show", "order\t7").stdout.splitlines()[0]
    assert first.endswith("(checkpoint order\\t7)") and "\t" not in first, first
