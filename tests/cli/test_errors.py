"""Every way the command line is misused ends in one line on stderr and a documented exit code, never a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runifold import RunStatus, open_store
from tests.cli.conftest import ROOT, Cli, key_file, run_worker_until
from tests.support import read_only_file


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    """The command exited with ``code`` and said why in exactly one line naming ``fragments``."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def enqueued(cli: Cli, ref: str = "c1") -> None:
    assert cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--checkpoint-id", ref).returncode == 0


def test_bad_values_are_usage_errors(cli: Cli) -> None:
    """Non-finite or absurd durations, an empty worker id, a zero page, an unknown flag: exit 2, one line."""
    one_line_error(cli("worker", "--lease", "nan"), 2, "--lease", "finite")
    one_line_error(cli("worker", "--lease", "inf"), 2, "--lease", "finite")
    # in the flag's terms, not the Python API's (helper-98: "give a timedelta of at least 100 ms")
    one_line_error(cli("worker", "--lease", "0.001"), 2, "runifold worker: error: argument --lease: '0.001' is "
                   "shorter than a lease may be: give at least 0.1 seconds")
    one_line_error(cli("worker", "--grace", "1e300"), 2, "--grace")
    one_line_error(cli("worker", "--idle-wait", "-1"), 2, "--idle-wait")
    one_line_error(cli("worker", "--concurrency", "0"), 2, "--concurrency")
    one_line_error(cli("worker", "--worker-id", ""), 2, "runifold worker: error: invalid worker id ''",
                   "(see `runifold worker --help`)")
    one_line_error(cli("worker", env={"RUNIFOLD_WORKER_ID": ""}), 2, "invalid worker id ''")
    one_line_error(cli("runs", "list", "--limit", "0"), 2, "--limit")
    one_line_error(cli("runs", "list", "--no-such-flag"), 2, "unrecognized arguments: --no-such-flag")
    # a variable's value is checked as the flag's is (helper-54: a bug's exit 3, a traceback, or nothing said)
    one_line_error(cli("runs", "list", env={"RUNIFOLD_STATUS": "bogus"}), 2,
                   "runifold runs list: error: argument --status: invalid choice: 'bogus' (from the flag or "
                   "RUNIFOLD_STATUS; choose from 'ready',")
    one_line_error(cli("runs", "list", env={"RUNIFOLD_LOG_LEVEL": "loud"}), 2, "invalid choice: 'loud'")
    one_line_error(cli("runs", "list", env={"RUNIFOLD_LOG_FORMAT": "xml"}), 2, "invalid choice: 'xml'")
    assert "no SQLite store" in cli("runs", "list", env={"RUNIFOLD_LOG_LEVEL": "INFO"}).stderr  # any case, as before
    one_line_error(cli("runs", "list", env={"RUNIFOLD_JSON": "ture"}), 2, "runifold: error: RUNIFOLD_JSON='ture' is "
                   "neither true (1, true, yes, on) nor false (0, false, no, off, or empty)")
    one_line_error(cli("replay", env={"RUNIFOLD_ALL": "2"}), 2, "runifold replay: error: RUNIFOLD_ALL='2'")
    assert "no SQLite store" in cli("runs", "list", env={"RUNIFOLD_JSON": "Off"}).stderr
    one_line_error(cli("frobnicate"), 2, "invalid choice: 'frobnicate'")
    one_line_error(cli("replay", "c1", "--all"), 2, "not both")
    one_line_error(cli("replay", "c1", "--name", "steps"), 2, "--name picks the runs of --all")  # it was ignored
    one_line_error(cli("replay", "c1", "--status", "completed"), 2, "--status picks the runs of --all")
    one_line_error(cli("replay", "--all", "--status", "done"), 2, "invalid choice: 'done'")
    one_line_error(cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--concurrency-key", "k"), 2, "go together")
    assert not (cli.tmp / "cli.db").exists()  # nothing was opened, let alone created


def test_deeply_nested_json_is_a_usage_error(cli: Cli) -> None:
    """A 10,000-level nested --input or --payload is refused in one line."""
    nested = '{"n": ' + "[" * 10_000 + "]" * 10_000 + "}"
    one_line_error(cli("enqueue", "steps", "1", "--input", nested), 2, "--input is nested too deeply")


def test_arguments_that_are_not_utf8_are_usage_errors(cli: Cli) -> None:
    """An argument or RUNIFOLD_* variable that is not UTF-8 is named, escaped, in one line (exit 2)."""
    argv: list[str | bytes] = [sys.executable, "-m", "runifold.cli", "enqueue", "steps", "1", "--checkpoint-id", b"\xff"]
    result = subprocess.run(argv, cwd=ROOT, env=cli.env, capture_output=True, text=True, timeout=60)
    one_line_error(result, 2, "argument 5 is not valid UTF-8 (\\udcff)")
    env = {k: v for k, v in cli.env.items() if k != "RUNIFOLD_STORE"}
    environ: dict[str | bytes, str | bytes] = {**env, b"RUNIFOLD_STORE": b"sqlite:///\xfe.db"}
    result = subprocess.run([sys.executable, "-m", "runifold.cli", "runs", "list"], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=60)
    one_line_error(result, 2, "environment variable RUNIFOLD_STORE is not valid UTF-8")


def test_key_file_problems_are_configuration_errors(cli: Cli) -> None:
    """A missing key file, a malformed one, or no deployment ring for `signal`: exit 2 with what to do, in one line."""
    enqueued(cli)
    good = key_file(cli.tmp, "alice.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"a" * 32}])
    (cli.tmp / "malformed.json").write_text('[{"key_id": "k", "sender": "alice", "secret": "not base64!"}]')
    args = ["signal", "c1", "approval", "--signal-id", "s1", "--as", "alice", "--reason", "r"]
    one_line_error(cli(*args, "--key-file", good), 2, "--keys RING", "RUNIFOLD_KEYS")
    one_line_error(cli(*args, "--key-file", str(cli.tmp / "missing.json"), "--keys", good), 2,
                   "cannot read key file", "missing.json")
    one_line_error(cli(*args, "--key-file", good, "--keys", str(cli.tmp / "malformed.json")), 2, "is not base64")
    one_line_error(cli("keys", "list", "--keys", str(cli.tmp / "missing.json")), 2, "cannot read key file")


def test_read_only_commands_never_create_a_store(cli: Cli) -> None:
    """Listing, showing, auditing or replaying a SQLite file that does not exist is an error naming it; no file appears."""
    missing = cli.tmp / "typo.db"
    for args in (["runs", "list"], ["runs", "show", "c1"], ["history", "c1"], ["audit", "c1"], ["replay", "--all"],
                 ["cancel", "c1", "--reason", "r"], ["retry", "c1", "--reason", "r"], ["wake", "c1"],
                 ["purge", "--finished-before", "30d"]):
        one_line_error(cli(*args, "--store", f"sqlite:///{missing}"), 2, f"no SQLite store at {missing}")
    assert not missing.exists()


async def test_commands_that_change_a_store_never_give_an_empty_postgres_database_a_schema(cli: Cli) -> None:
    """On PostgreSQL as on SQLite, only the commands that start runs or workers (and `migrate`) create a store:
    cancelling, retrying, waking, purging or pausing a schedule in a database with no runifold schema is an error
    saying so, and the database stays empty (they created the whole schema, then said the run was unknown: a
    mistyped URL quietly got a runifold schema; found by helper-42)."""
    import asyncpg

    from tests.conftest import empty_postgres_database, require_postgres

    async with empty_postgres_database(require_postgres(), f"runifold_empty_{os.getpid()}") as empty:
        for args in (["cancel", "c1", "--reason", "r"], ["retry", "c1", "--reason", "r"], ["wake", "c1"],
                     ["purge", "--finished-before", "30d"], ["schedule", "pause", "nightly"]):
            one_line_error(await asyncio.to_thread(cli, *args, "--store", empty), 2, "has no runifold schema",
                           "runifold migrate")
        probe = await asyncpg.connect(empty)
        try:
            assert await probe.fetchval(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'runifold%'") == 0
        finally:
            await probe.close()
        assert (await asyncio.to_thread(cli, "migrate", "--store", empty)).returncode == 0  # migrate creates it


def test_a_worker_refuses_a_store_file_it_cannot_write(cli: Cli) -> None:
    """`runifold worker` on a SQLite file it cannot write exits 2 at start with one line naming the file and what to
    do (it started, and logged slot_error at every claim until stopped); the commands that only read still read it."""
    enqueued(cli)
    path = cli.tmp / "cli.db"
    with read_only_file(path):
        proc = cli.spawn("worker", "--idle-wait", "0.1")
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), 2,
                       f"cannot write the SQLite database {path}", "writable", "?mode=ro")
        for args in (["runs", "list"], ["runs", "show", "c1"], ["history", "c1"], ["replay", "--all"]):
            result = cli(*args)
            assert result.returncode == 0 and result.stderr == "", (args, result)


def test_commands_that_write_refuse_a_read_only_store_url(cli: Cli) -> None:
    """A SQLite URL with ?mode=ro given to a command that writes is refused at once, in one line (a worker started
    and logged slot_error with a traceback at every claim, 1,624 of them in 17 minutes: helper-32); the commands
    that only read take it."""
    enqueued(cli)
    url = f"sqlite:///{cli.tmp / 'cli.db'}?mode=ro"
    for args in (["worker", "--idle-wait", "0.1"], ["enqueue", "steps", "1", "--input", '{"n": 1}'],
                 ["cancel", "c1", "--reason", "r"], ["migrate"], ["drill"]):
        one_line_error(cli(*args, "--store", url), 2, "?mode=ro opens the store read-only", f"`runifold {args[0]}` "
                       "writes to it; drop ?mode=ro")
    listed = cli("runs", "list", "--store", url)
    assert listed.returncode == 0 and "c1" in listed.stdout


def test_empty_or_reserved_flag_values_are_usage_errors(cli: Cli) -> None:
    """An empty --checkpoint-id, --reason or --by, or a checkpoint id in the run-id form, is a bad value: exit 2
    naming the flag (they exited 1, the first with the API's wording "a non-empty string or None": helper-32)."""
    enqueued(cli)
    one_line_error(cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--checkpoint-id", ""), 2,
                   "argument --checkpoint-id: must not be empty")
    one_line_error(cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--checkpoint-id", "run_abc"), 2,
                   "argument --checkpoint-id: 'run_abc' starts with 'run_', which is reserved for run ids")
    for command in (["cancel", "c1"], ["retry", "c1"], ["resolve", "c1", "pay#1", "--fail"],
                    ["signal", "c1", "approval", "--signal-id", "s1", "--as", "alice"]):
        one_line_error(cli(*command, "--reason", " "), 2, "argument --reason: must not be empty")
    one_line_error(cli("cancel", "c1", "--reason", "r", "--by", ""), 2, "argument --by: must not be empty")
    assert json.loads(cli("runs", "show", "c1", "--json").stdout)["run"]["status"] == "ready"


def test_an_unknown_flag_without_a_command_is_named(cli: Cli) -> None:
    """`runifold --bogus` said only that COMMAND is required, never naming --bogus (helper-32)."""
    one_line_error(cli("--bogus"), 2, "unrecognized arguments: --bogus")
    one_line_error(cli(), 2, "the following arguments are required: COMMAND")


def test_an_unknown_flag_after_a_command_is_blamed_on_that_command(cli: Cli) -> None:
    """A typo in a command's flag said `runifold: error: ... (see `runifold --help`)`, whose help does not list the
    command's flags (helper-36)."""
    one_line_error(cli("worker", "--concurency", "8"), 2,
                   "runifold worker: error: unrecognized arguments: --concurency 8 (see `runifold worker --help`)")
    one_line_error(cli("runs", "list", "--stauts", "failed"), 2,
                   "runifold runs list: error: unrecognized arguments: --stauts failed (see `runifold runs list --help`)")


def test_a_commands_flag_before_the_command_is_named_and_blamed_on_that_command(cli: Cli) -> None:
    """`runifold --keys k.json keys list` said `invalid choice: 'k.json'` (argparse took the flag's value for the
    command), naming neither the flag nor where it belongs (helper-47)."""
    one_line_error(cli("--keys", "k.json", "keys", "list"), 2,
                   "runifold keys list: error: --keys is a flag of the command: give it after `runifold keys list` "
                   "(see `runifold keys list --help`)")
    one_line_error(cli("--lease=3", "worker"), 2, "runifold worker: error: --lease is a flag of the command")
    one_line_error(cli("--concurency", "8", "worker"), 2,
                   "runifold worker: error: unrecognized arguments: --concurency (see `runifold worker --help`)")
    one_line_error(cli("--stauts", "runs", "list"), 2, "runifold runs list: error: unrecognized arguments: --stauts")
    # the shared flags, with their values, still go before the command, and abbreviated as argparse allows
    assert cli("migrate").returncode == 0
    assert json.loads(cli("--json", "--log-level", "warning", "runs", "list").stdout)["runs"] == []
    assert json.loads(cli("--js", "--log-l", "warning", "runs", "list").stdout)["runs"] == []


def test_the_memory_store_is_refused_by_the_command_line(cli: Cli) -> None:
    """`--store memory:` lives and dies with one command: `enqueue` printed "enqueued run_..." for a run already
    gone (helper-23); `drill` ran for 30 s against it and failed (helper-38)."""
    for args in (["enqueue", "steps", "1", "--input", '{"n": 1}'], ["runs", "list"], ["worker", "--idle-wait", "0.1"],
                 ["drill"]):
        one_line_error(cli(*args, "--store", "memory:"), 2, "--store memory: is a store inside one process")


def test_unknown_runs_are_refusals(cli: Cli) -> None:
    """An unknown run is exit 1 for every command that names one, audit included."""
    enqueued(cli)
    for args in (["runs", "show", "nope"], ["history", "nope"], ["audit", "nope"], ["cancel", "nope", "--reason", "r"],
                 ["retry", "nope", "--reason", "r"], ["wake", "nope"]):
        one_line_error(cli(*args), 1, "no run with id or checkpoint id 'nope'")


def test_shared_flags_go_anywhere_and_every_command_speaks_json(cli: Cli) -> None:
    """--json, --store and --app work before or after the command (and from the environment); worker and migrate print JSON."""
    migrated = cli("migrate", "--json")
    assert migrated.returncode == 0 and isinstance(json.loads(migrated.stdout)["schema_version"], int)
    enqueued(cli)
    before = json.loads(cli("--json", "runs", "list").stdout)
    after = json.loads(cli("runs", "list", "--json").stdout)
    nested = json.loads(cli("runs", "--json", "list").stdout)
    from_env = json.loads(cli("runs", "list", env={"RUNIFOLD_JSON": "1"}).stdout)
    assert before == after == nested == from_env and before["total"] == 1
    other = cli.tmp / "other.db"
    assert cli("migrate", "--store", f"sqlite:///{other}").returncode == 0
    assert json.loads(cli("runs", "list", "--json", "--store", f"sqlite:///{other}").stdout)["total"] == 0
    worker = run_worker_until(cli, "c1", RunStatus.COMPLETED, "--json", "--log-format", "json")
    started, stopped = (json.loads(line) for line in worker.stdout.splitlines())
    assert started["event"] == "worker_started" and "steps v1" in started["serving"]
    assert stopped["event"] == "worker_stopped" and stopped["outcomes"]["Completed"] == 1
    [stopping] = [json.loads(line) for line in worker.stderr.splitlines()]  # the stop, as a log record too
    assert stopping["event"] == "worker_stopping" and stopping["now"] is False
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("runifold ")


def test_an_app_module_that_raises_on_import_is_a_configuration_error(cli: Cli) -> None:
    """--app naming a module that raises while importing: exit 2, one line naming --app and the exception."""
    (cli.tmp / "broken_app.py").write_text("raise RuntimeError('DATABASE_URL is not set')\n")
    env = {"PYTHONPATH": f"{cli.tmp}{os.pathsep}{ROOT}"}
    one_line_error(cli("enqueue", "steps", "1", "--app", "broken_app:registry", env=env), 2,
                   "--app", "RuntimeError: DATABASE_URL is not set")
    debug = cli("enqueue", "steps", "1", "--app", "broken_app:registry", "--debug", env=env)
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "broken_app.py" in debug.stderr
    # no module, or a registry that holds nothing (helper-98: "Empty module name"; a worker serving nothing)
    one_line_error(cli("enqueue", "steps", "1", "--app", ":registry", env=env), 2,
                   "--app ':registry' must look like module:attribute")
    (cli.tmp / "empty_app.py").write_text("from runifold import WorkflowRegistry\nregistry = WorkflowRegistry()\n")
    one_line_error(cli("worker", "--app", "empty_app:registry", env=env), 2,
                   "--app empty_app:registry holds no workflow, so the worker would serve nothing")
    (cli.tmp / "exiting_app.py").write_text("import sys\nsys.exit(0)\n")  # a deploy check must not pass on this
    one_line_error(cli("replay", "--all", "--app", "exiting_app:registry", env=env), 2, "--app", "SystemExit")


def test_the_drill_speaks_json(cli: Cli) -> None:
    """`runifold drill --json` prints one JSON object per step and a final verdict."""
    result = cli("drill", "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["step"] for line in lines[:-1]] == ["1", "2", "3", "4", "5", "6"]
    assert lines[-1] == {**lines[-1], "passed": True, "steps": 6, "steps_passed": 6}


def test_logs_are_json_when_asked(cli: Cli) -> None:
    """--log-format json prints each log record as a JSON object on stderr (here: a world-readable key file)."""
    alice = key_file(cli.tmp, "alice.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"a" * 32}])
    Path(alice).chmod(0o644)
    console = cli("keys", "list", "--keys", alice)
    assert console.returncode == 0 and "key_file_not_private" in console.stderr and "chmod 600" in console.stderr
    as_json = cli("keys", "list", "--keys", alice, "--log-format", "json")
    [record] = [json.loads(line) for line in as_json.stderr.splitlines()]
    assert record["level"] == "warning" and record["event"] == "key_file_not_private" and record["path"] == alice
    quiet = cli("keys", "list", "--keys", alice, "--log-level", "error")
    assert quiet.stderr == ""


def test_a_closed_output_pipe_ends_quietly(cli: Cli) -> None:
    """`runifold history X | head` with the reader gone: exit 141, nothing on stderr."""
    enqueued(cli)
    reader, writer = os.pipe()
    os.close(reader)
    try:
        result = subprocess.run(cli.argv("history", "c1"), cwd=ROOT, env=cli.env, stdout=writer,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(writer)
    assert result.returncode == 141 and result.stderr == ""


def test_debug_adds_the_traceback(cli: Cli) -> None:
    """With --debug an error keeps its one-line message and adds the traceback above it."""
    enqueued(cli)
    result = cli("runs", "show", "nope", "--debug")
    assert result.returncode == 1 and "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("runifold: no run with id")


def wait_until_started(cli: Cli, proc: subprocess.Popen[str]) -> None:
    """Wait (at most 60 s) until the worker process has started the body of run tag ``t``."""
    deadline = time.monotonic() + 60
    while not list(cli.tmp.glob("started-t-*")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)


async def assert_released(cli: Cli, ref: str) -> None:
    """The run was handed back: ready, with nobody's lease."""
    store = await open_store(cli.url)
    try:
        run = await store.get_run(ref)
        assert run.status is RunStatus.READY and run.lease_owner is None
    finally:
        await store.close()


async def test_a_second_interrupt_stops_the_worker_at_once(cli: Cli) -> None:
    """Ctrl-C once waits for in-flight runs (up to --grace); twice cancels them at once and releases their leases."""
    assert cli("enqueue", "slow", "1", "--input", '{"tag": "t"}', "--checkpoint-id", "s1").returncode == 0
    proc = cli.spawn("worker", "--grace", "600", "--lease", "600", env={"RUNIFOLD_TEST_SLOW": "600"})
    try:
        wait_until_started(cli, proc)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None  # the first Ctrl-C waits for the run
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Ctrl-C again to stop at once" in err and "stopping now" in err
    assert "Released 1" in out  # the run it was running is counted as handed back
    await assert_released(cli, "s1")


async def test_a_stopping_worker_does_not_wait_for_a_plain_def_step_past_its_grace(cli: Cli) -> None:
    """Found by helper-16: a plain def step (a thread, which nothing can interrupt) kept the worker process alive
    until it returned, past --grace and a second SIGTERM. The run is released and the process exits."""
    assert cli("enqueue", "slow-thread", "1", "--input", '{"tag": "t"}', "--checkpoint-id", "s1").returncode == 0
    proc = cli.spawn("worker", "--grace", "0.5", "--lease", "600", env={"RUNIFOLD_TEST_SLOW": "600"})
    try:
        wait_until_started(cli, proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)  # not the body's 600 s
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Released 1" in out
    await assert_released(cli, "s1")


async def stop_after_completing(cli: Cli, proc: subprocess.Popen[str], ref: str) -> int:
    """Wait (the process alive) for run ``ref`` to complete, SIGTERM the worker, and return its exit status."""
    try:
        deadline = time.monotonic() + 60
        store = await open_store(cli.url)
        try:
            while (await store.get_run(ref)).status is not RunStatus.COMPLETED:
                assert proc.poll() is None, f"the worker exited with {proc.returncode} before being stopped"
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        finally:
            await store.close()
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_worker_whose_output_is_closed_works_and_stops_as_usual(cli: Cli) -> None:
    """A worker started with stdout and stderr closed (`>&- 2>&-`) runs, and SIGTERM stops it with 0 as with its
    output open: it exited with 3 at start (sys.stdout is None), and the numbers 1 and 2 went to the next files
    opened (the event loop's)."""
    enqueued(cli)
    proc = subprocess.Popen(["bash", "-c", 'exec "$@" >&- 2>&-', "bash", *cli.argv("worker", "--idle-wait", "0.1")],
                            cwd=ROOT, env=cli.env, stdin=subprocess.DEVNULL, text=True)
    assert await stop_after_completing(cli, proc, "c1") == 0


async def test_a_worker_whose_readers_went_away_stops_as_usual(cli: Cli) -> None:
    """A worker whose stdout and stderr readers closed their ends after it started exits 0 on SIGTERM, as with its
    output open: its last line ("stopped: ...") met the closed pipe and it exited 141."""
    enqueued(cli)
    proc = cli.spawn("worker", "--idle-wait", "0.1")
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith("worker ")
    proc.stdout.close()
    proc.stderr.close()
    assert await stop_after_completing(cli, proc, "c1") == 0


def test_an_interrupt_outside_the_worker_exits_130(cli: Cli) -> None:
    """Ctrl-C while a command waits on something else (here the drill's workers) ends it with exit 130, no traceback."""
    proc = cli.spawn("drill")
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # the drill has started
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err


def test_console_log_lines_give_store_times_as_iso() -> None:
    """The console format prints a store time (a schedule's tick, a retry's time, a deadline) as ISO-8601."""
    from runifold._log import get_logger
    from runifold.cli._logging import ConsoleFormatter

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("runifold.test_console")
    logger.addHandler(keep := Keep())
    logger.setLevel(logging.INFO)
    try:
        get_logger("runifold.test_console").info("schedule_fired", schedule="s", tick=1796143050.0,
                                                  retry_at=1796143051.5, attempt=2)
    finally:
        logger.removeHandler(keep)
    line = ConsoleFormatter().format(records[0])
    assert "schedule_fired schedule=s tick=2026-12-01T16:37:30.000Z retry_at=2026-12-01T16:37:31.500Z attempt=2" \
        in line, line


def test_a_password_in_the_query_of_a_postgresql_url_is_never_printed(cli: Cli) -> None:
    """helper-87: libpq's `?password=` form was printed in clear by the store's connection error (and by runs list's
    next-page hint); it is shown as *** like a password in the user part."""
    refused = cli("--store", "postgresql://ops@127.0.0.1:1/runs?password=s3cret&sslmode=disable", "runs", "list")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "s3cret" not in refused.stderr and "postgresql://ops@127.0.0.1:1/runs?password=***&sslmode=disable" in (
        refused.stderr), refused.stderr
    drill = cli("--store", "postgresql://ops@127.0.0.1:1/runs?password=s3cret", "drill")
    assert drill.returncode == 2 and "s3cret" not in drill.stdout + drill.stderr, (drill.stdout, drill.stderr)
    assert drill.stdout.startswith("recovery drill against 127.0.0.1:1/runs?password=***"), drill.stdout
