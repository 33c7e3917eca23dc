"""``runifold schedule`` and ``enqueue --concurrency-key`` as real subprocesses against real stores."""

from __future__ import annotations

import asyncio
import json
import time

from runifold import RunStatus, open_store
from tests.cli.conftest import Cli


def test_schedule_add_list_pause_resume_delete(any_cli: Cli) -> None:
    """A schedule is added, re-added unchanged, replaced, listed (table and JSON), paused, resumed and deleted."""
    cli = any_cli
    add = ("schedule", "add", "nightly", "--workflow", "steps", "--version", "1", "--input", '{"n": 1}')
    first = cli(*add, "--cron", "0 3 * * *", "--timezone", "Europe/Riga")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("added schedule nightly: steps v1 cron '0 3 * * *' in Europe/Riga; next tick ")
    again = cli(*add, "--cron", "0 3 * * *", "--timezone", "Europe/Riga")
    assert again.stdout.startswith("unchanged schedule nightly")
    replaced = json.loads(cli("--json", *add, "--cron", "0 4 * * *", "--timezone", "Europe/Riga").stdout)
    assert replaced["result"] == "replaced" and replaced["cron"] == "0 4 * * *"
    assert cli("schedule", "add", "fast", "--workflow", "steps", "--version", "1", "--input", '{"n": 2}',
               "--every", "5", "--catchup", "0").returncode == 0
    assert cli("schedule", "pause", "fast").stdout.startswith("paused schedule fast")
    listing = cli("schedule", "list")
    lines = listing.stdout.splitlines()
    assert lines[0].split()[:5] == ["name", "workflow", "when", "catchup", "state"]
    assert "every 5 s" in lines[2] and "paused" in lines[2] and lines[2].startswith("fast")
    assert "cron '0 4 * * *' in Europe/Riga" in lines[3] and "active" in lines[3]
    listed = json.loads(cli("schedule", "list", env={"RUNIFOLD_JSON": "1"}).stdout)
    assert [(s["name"], s["paused"], s["every"], s["catchup"]) for s in listed] == [
        ("fast", True, 5.0, 0.0), ("nightly", False, None, 60.0)]
    assert listed[0]["next_tick"] is None and listed[1]["next_tick"] % 3600 == 0
    assert cli("schedule", "resume", "fast").stdout.startswith("resumed schedule fast: next tick ")
    assert cli("schedule", "delete", "fast").stdout == "deleted schedule fast (the runs it started stay)\n"
    gone = cli("schedule", "delete", "fast")
    assert gone.returncode == 1 and gone.stderr == "runifold: no schedule named 'fast'; list schedules with " \
        "`runifold schedule list`\n"


def test_schedule_list_gives_a_due_tick_not_yet_fired_as_the_next(cli: Cli) -> None:
    """With no worker, a tick that came due is the next one a worker will start: list shows it, not a later one."""
    assert cli("schedule", "add", "tick", "--workflow", "steps", "--version", "1", "--input", '{"n": 1}',
               "--every", "1", "--catchup", "0").returncode == 0
    time.sleep(2.2)  # two ticks come due; with --catchup 0 a worker starts the latest only
    [row] = json.loads(cli("--json", "schedule", "list").stdout)
    now = time.time()
    assert row["last_tick"] < row["next_tick"] <= now, (row, now)  # due, where it used to show a later tick


def test_schedule_add_refuses_bad_input_in_one_line(cli: Cli) -> None:
    """A bad cron field, name or time zone, no --cron/--every, and input the workflow refuses are one-line errors."""
    add = ("schedule", "add", "s", "--workflow", "steps", "--version", "1", "--input", '{"n": 1}')
    for extra, code, message in [
        (("--cron", "61 * * * *"), 2, "invalid cron expression '61 * * * *' (Bad minute)"),
        (("--cron", "* * * * *", "--timezone", "Nowhere/Atlantis"), 2, "unknown time zone 'Nowhere/Atlantis'"),
        ((), 2, "give one of --cron EXPRESSION or --every SECONDS"),
        (("--every", "1.5"), 2, "must be a whole number of seconds, at least 1, got 1.5 s"),
        (("--every", "5", "--catchup", "-1"), 2, "must be a finite number of seconds, zero or more"),
        (("--every", "5", "--catchup", "9999999"), 2,
         "the catch-up window (catchup, --catchup) must be from 0 to 2678400 s (31 days), got 9999999 s"),
    ]:
        done = cli(*add, *extra)
        assert done.returncode == code and message in done.stderr, (extra, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    refused = cli("schedule", "add", "s", "--workflow", "steps", "--version", "1", "--input", "{}", "--every", "5")
    assert refused.returncode == 1 and "missing ['n']" in refused.stderr
    unknown = cli("schedule", "add", "s", "--workflow", "nope", "--version", "1", "--every", "5")
    assert unknown.returncode == 1 and "no workflow 'nope' version 1" in unknown.stderr
    bad_name = cli("schedule", "add", "a:b", "--workflow", "steps", "--version", "1", "--input", '{"n": 1}',
                   "--every", "5")
    assert bad_name.returncode == 2 and "invalid schedule name 'a:b'" in bad_name.stderr
    assert cli("schedule", "list").stdout.splitlines()[2:] == []


def test_schedule_list_opens_the_store_read_only(cli: Cli) -> None:
    """schedule list refuses a store that does not exist instead of creating it, and reads without writing."""
    missing = cli("schedule", "list", env={"RUNIFOLD_STORE": f"sqlite:///{cli.tmp / 'none.db'}"})
    assert missing.returncode == 2 and "never creates one" in missing.stderr
    assert not (cli.tmp / "none.db").exists()


def test_enqueue_takes_a_concurrency_key(any_cli: Cli) -> None:
    """enqueue --concurrency-key/--concurrency-limit keeps them on the run (runs show gives them); one without
    the other is refused."""
    cli = any_cli
    done = cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--checkpoint-id", "k1", "--concurrency-key", "pay",
               "--concurrency-limit", "2")
    assert done.returncode == 0, done.stderr
    half = cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--concurrency-key", "pay")
    assert half.returncode == 2 and "--concurrency-key and --concurrency-limit go together" in half.stderr

    async def key() -> tuple[str | None, int | None, RunStatus]:
        store = await open_store(cli.url)
        try:
            info = await store.get_run("k1")
        finally:
            await store.close()
        return info.concurrency_key, info.concurrency_limit, info.status

    assert asyncio.run(key()) == ("pay", 2, RunStatus.READY)
    shown = cli("runs", "show", "k1")
    assert "concurrency key pay, at most 2 running at once: 0 running now\n" in shown.stdout, shown.stdout
    # a ready run whose key is full says so (it is held back, not forgotten)
    for ref in ("h1", "h2"):
        assert cli("enqueue", "steps", "1", "--input", '{"n": 1}', "--checkpoint-id", ref, "--concurrency-key", "one",
                   "--concurrency-limit", "1").returncode == 0

    async def claim_one() -> str:
        store = await open_store(cli.url)
        try:
            while True:  # k1 (due first) is claimed too, then one of h1, h2
                claim = await store.claim("test-worker", ["steps"], 30.0)
                assert claim is not None
                if claim.checkpoint_id in ("h1", "h2"):
                    return "h2" if claim.checkpoint_id == "h1" else "h1"
        finally:
            await store.close()

    held = asyncio.run(claim_one())
    shown = cli("runs", "show", held)
    assert ("concurrency key one, at most 1 running at once: 1 running now (this run waits for one of them to "
            "stop)") in shown.stdout, shown.stdout
