"""Schedules on the memory store with a fake clock: ticks, the catch-up policy, time zones, and who fires what."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo
from typing import Any

import pytest

from runifold import (
    ConcurrencyLimit,
    InvalidInputError,
    RunStatus,
    Schedule,
    Supervisor,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    workflow,
)
from runifold.stores.memory import MemoryWorkflowStore
from runifold.testing import FakeClock
from runifold.worker import _schedules
from runifold.worker._schedules import due_ticks, fire_due_schedules
from tests.support import worker


@workflow("report", version=1)
async def report(ctx: WorkflowContext, region: str = "eu") -> str:
    return region


@workflow("report", version=2)
async def report_v2(ctx: WorkflowContext, region: str = "eu") -> str:
    return region.upper()


DEFINITION = WorkflowDefinition(report, concurrency=ConcurrencyLimit(1))
REGISTRY = WorkflowRegistry(DEFINITION)
T0 = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC).timestamp()  # a Monday, noon UTC


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def checkpoints(store: Any) -> list[str]:
    return sorted(r.checkpoint_id for r in await store.list_runs(limit=10_000))


async def added(clock: FakeClock, *schedules: Schedule) -> MemoryWorkflowStore:
    store = MemoryWorkflowStore(clock)
    for schedule in schedules:
        await store.add_schedule(schedule)
    return store


def test_a_schedule_refuses_what_it_cannot_run() -> None:
    """A bad name, cron field, interval, time zone or catch-up window, or both or neither of cron and every, is refused with the reason."""
    cases = [
        (dict(name="a:b", cron="* * * * *"), "schedule name"),
        (dict(cron="61 * * * *"), "Bad minute"),
        (dict(cron="* * * *"), "Wrong number of fields"),
        (dict(), "exactly one of cron"),
        (dict(cron="* * * * *", every=timedelta(seconds=5)), "exactly one of cron"),
        (dict(every=timedelta(seconds=1.5)), "whole number of seconds"),
        (dict(every=timedelta(0)), "whole number of seconds"),
        (dict(every=timedelta(seconds=5), timezone="Europe/Riga"), "cron only"),
        (dict(cron="0 3 * * *", timezone="Mars/Olympus"), "unknown time zone"),
        (dict(cron="0 3 * * *", catchup=timedelta(days=40)), "catchup"),
        (dict(cron="0 3 * * *", catchup=timedelta(seconds=-1)), "catchup"),
    ]
    for fields, message in cases:
        kwargs: dict[str, Any] = {"name": "s", "workflow": "report", "version": 1, **fields}
        with pytest.raises(InvalidInputError, match=message):
            Schedule(**kwargs)
    with pytest.raises(InvalidInputError, match="version"):
        Schedule("s", "report", 0, cron="* * * * *")


def test_ticks_follow_cron_in_its_time_zone_and_every_from_the_epoch() -> None:
    """Cron ticks are read in the schedule's zone (Riga is UTC+2 in March); every= ticks are multiples since the epoch."""
    riga = Schedule("s", "report", 1, cron="30 9 * * MON-FRI", timezone="Europe/Riga")
    assert [iso(t) for t in riga.ticks_back(at("2026-03-09T12:00:00+00:00"), 0, 3)] == [
        "2026-03-09T07:30:00Z", "2026-03-06T07:30:00Z", "2026-03-05T07:30:00Z"]
    assert iso(riga.next_tick(at("2026-03-09T07:30:00+00:00")) or 0) == "2026-03-10T07:30:00Z"
    seconds = Schedule("s", "report", 1, cron="*/20 * * * * *")
    assert [iso(t) for t in seconds.ticks_back(T0 + 45, T0, 10)] == ["2026-03-02T12:00:40Z", "2026-03-02T12:00:20Z"]
    every = Schedule("s", "report", 1, every=timedelta(minutes=15))
    assert [iso(t) for t in every.ticks_back(T0 + 3599, T0 - 1, 10)] == [
        "2026-03-02T12:45:00Z", "2026-03-02T12:30:00Z", "2026-03-02T12:15:00Z", "2026-03-02T12:00:00Z"]
    assert every.next_tick(T0) == T0 + 900


def test_clock_changes_fire_a_cron_time_once() -> None:
    """When clocks go forward a time that does not exist fires once just after the gap; when they go back, a repeated time fires once."""
    spring = Schedule("s", "report", 1, cron="30 3 * * *", timezone="Europe/Riga")  # 03:00 -> 04:00 on 2026-03-29
    ticks = spring.ticks_back(at("2026-03-30T12:00:00+00:00"), at("2026-03-27T12:00:00+00:00"), 10)
    assert [iso(t) for t in sorted(ticks)] == ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    autumn = Schedule("s", "report", 1, cron="30 3 * * *", timezone="Europe/Riga")  # 04:00 -> 03:00 on 2026-10-25
    ticks = autumn.ticks_back(at("2026-10-26T12:00:00+00:00"), at("2026-10-24T12:00:00+00:00"), 10)
    assert [iso(t) for t in sorted(ticks)] == ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]


def _fires_by_the_minute(cron: str, timezone: str, start: int, end: int) -> list[float]:
    """An oracle for the documented rule, read off the clock minute by minute after start (instants to wall times only): a
    time of day fires when the clock first shows it, or, skipped, at the end of the gap; other expressions fire
    whenever the clock shows a matching minute."""
    from cronsim import CronSim

    zone = ZoneInfo(timezone)
    fields = cron.split()
    fixed = not fields[0].startswith("*") and not fields[1].startswith("*")

    def matches(wall: datetime) -> bool:
        return next(CronSim(cron, wall - timedelta(seconds=1))) == wall

    fired: list[float] = []
    shown: set[datetime] = set()
    before: datetime | None = None
    for t in range(start + 60, end + 1, 60):
        wall = datetime.fromtimestamp(t, zone).replace(tzinfo=None)
        skipped = []
        if before is not None and fixed:
            skipped = [before + timedelta(minutes=m) for m in range(1, int((wall - before) / timedelta(minutes=1)))]
        if (matches(wall) and not (fixed and wall in shown)) or any(matches(w) for w in skipped):
            fired.append(float(t))
        shown.add(wall)
        before = wall
    return fired


@pytest.mark.parametrize("timezone, day", [
    ("Pacific/Chatham", "2026-04-05"), ("Pacific/Chatham", "2026-09-27"),  # back at 03:45, forward at 02:45
    ("Australia/Lord_Howe", "2026-04-05"), ("Australia/Lord_Howe", "2026-10-04"),  # half an hour back and forward
    ("Europe/Riga", "2026-03-29"), ("Europe/Riga", "2026-10-25"),
    ("America/New_York", "2026-03-08"), ("America/New_York", "2026-11-01"), ("UTC", "2026-03-29"),
])
def test_cron_ticks_across_clock_changes_follow_the_rule_in_every_zone(timezone: str, day: str) -> None:
    """Going back (ticks_back, what workers start) and forward (next_tick, what `schedule list` shows), cron's
    ticks are those the rule gives, minute by minute, in zones whose clocks change by half an hour or off the hour
    too (in Chatham a check started one tick 1,000 times, 45 minutes early, and lost the ticks before it; on Lord
    Howe next_tick skipped two: helper-33)."""
    start = int(at(f"{day}T00:00:00+00:00")) - 86_400
    end = start + 3 * 86_400
    for cron in ("*/15 2 * * *", "30 3 * * *", "0 2 * * *", "45 2 * * *", "* 2 * * *", "0 * * * *", "*/20 1-3 * * *",
                 "15 1,2,3 * * *"):
        schedule = Schedule("s", "report", 1, cron=cron, timezone=timezone)
        expected = _fires_by_the_minute(cron, timezone, start, end)
        assert sorted(schedule.ticks_back(end, start, 10_000)) == expected, cron
        forward, tick = [], schedule.next_tick(start)
        while tick is not None and tick <= end:
            forward.append(tick)
            tick = schedule.next_tick(tick)
        assert forward == expected, cron
        # a check that sees only part of the span starts the same ticks: no tick from the future, none twice
        for now in range(start + 3_600, end, 1_800):
            assert sorted(schedule.ticks_back(now, now - 3_600, 10_000)) == [t for t in expected if now - 3_600 < t <= now], (cron, now)


def test_the_catch_up_policy_starts_the_latest_tick_and_those_in_the_window() -> None:
    """Of the ticks due since the last one started, the latest always starts and the earlier ones only within the window."""
    minute = Schedule("s", "report", 1, cron="* * * * *")  # catchup: one minute
    assert [iso(t) for t in due_ticks(minute, T0, T0 + 150)] == ["2026-03-02T12:02:00Z"]
    assert [iso(t) for t in due_ticks(minute, T0, T0 + 90)] == ["2026-03-02T12:01:00Z"]
    assert [iso(t) for t in due_ticks(minute, T0 - 1, T0 + 59)] == ["2026-03-02T12:00:00Z"]
    assert due_ticks(minute, T0, T0 + 59) == []  # nothing since the last tick started
    seconds = Schedule("s", "report", 1, every=timedelta(seconds=1))
    assert len(due_ticks(seconds, T0, T0 + 3.5)) == 3  # a late check loses no tick inside the window
    hourly = Schedule("s", "report", 1, cron="0 * * * *", catchup=timedelta(hours=6))
    assert [iso(t) for t in due_ticks(hourly, T0 - 86400, T0 + 60)] == [
        f"2026-03-02T{h:02}:00:00Z" for h in range(7, 13)]  # 06:00 is six hours and a minute old
    exact = Schedule("s", "report", 1, cron="0 * * * *", catchup=timedelta(0))
    assert [iso(t) for t in due_ticks(exact, T0 - 86400, T0 + 60)] == ["2026-03-02T12:00:00Z"]
    flood = Schedule("s", "report", 1, every=timedelta(seconds=1), catchup=timedelta(days=1))
    assert len(due_ticks(flood, T0 - 86400, T0)) == 1000  # at most 1,000 per check, the most recent


async def test_three_workers_start_each_tick_once() -> None:
    """However the checks of three workers interleave, each tick starts one run named by the tick, and none is skipped."""
    clock = FakeClock(T0 + 0.5)
    store = await added(clock, Schedule("every-second", "report", 1, every=timedelta(seconds=1)))
    for step in [0.3, 0.9, 0.2, 1.7, 0.4, 0.1, 2.2, 0.6]:
        clock.advance(step)
        for _ in range(3):
            await fire_due_schedules(store, REGISTRY)
    assert await checkpoints(store) == [f"schedule:every-second:2026-03-02T12:00:{s:02}Z" for s in range(1, 7)]


async def test_an_outage_starts_only_the_latest_tick() -> None:
    """After no worker checked for a day, an hourly schedule starts its latest tick once, and its next tick when it comes."""
    clock = FakeClock(T0 - 1)
    store = await added(clock, Schedule("hourly", "report", 1, cron="0 * * * *"))
    clock.advance(86400 + 30)
    fired = await fire_due_schedules(store, REGISTRY)
    assert [(name, iso(tick), result.created) for name, tick, result in fired] == [
        ("hourly", "2026-03-03T12:00:00Z", True)]
    assert await fire_due_schedules(store, REGISTRY) == []
    clock.advance(3600)
    assert await checkpoints(store) == ["schedule:hourly:2026-03-03T12:00:00Z"]
    await fire_due_schedules(store, REGISTRY)
    assert len(await checkpoints(store)) == 2


async def test_a_wider_window_starts_every_missed_tick_once() -> None:
    """With catchup of six hours, a restart starts the ticks of the last six hours, oldest first, and a second check adds nothing."""
    clock = FakeClock(T0 - 1)
    store = await added(clock, Schedule("hourly", "report", 1, cron="0 * * * *", catchup=timedelta(hours=6)))
    clock.advance(86400 + 30)
    fired = await fire_due_schedules(store, REGISTRY)
    assert [iso(t) for _, t, _ in fired] == [f"2026-03-03T{h:02}:00:00Z" for h in range(7, 13)]
    await fire_due_schedules(store, REGISTRY)
    assert len(await checkpoints(store)) == 6


async def test_a_new_schedule_starts_with_its_next_tick() -> None:
    """A schedule added between two ticks never starts the tick before it was added."""
    clock = FakeClock(T0 + 30)
    store = await added(clock, Schedule("minutely", "report", 1, cron="* * * * *"))
    assert await fire_due_schedules(store, REGISTRY) == []
    clock.advance(31)
    await fire_due_schedules(store, REGISTRY)
    assert await checkpoints(store) == ["schedule:minutely:2026-03-02T12:01:00Z"]


async def test_a_paused_schedule_starts_nothing_and_resumes_after_its_pause() -> None:
    """No tick of a paused schedule starts, and none of its pause starts once it is resumed."""
    clock = FakeClock(T0 + 0.5)
    store = await added(clock, Schedule("tick", "report", 1, every=timedelta(seconds=10)))
    await store.pause_schedule("tick")
    clock.advance(25)
    assert await fire_due_schedules(store, REGISTRY) == []
    await store.pause_schedule("tick", paused=False)
    assert await fire_due_schedules(store, REGISTRY) == []
    clock.advance(10)
    await fire_due_schedules(store, REGISTRY)
    assert await checkpoints(store) == ["schedule:tick:2026-03-02T12:00:30Z"]


async def test_a_worker_without_the_version_leaves_the_schedule_to_one_that_has_it(caplog: pytest.LogCaptureFixture) -> None:
    """A worker whose registry lacks the schedule's version starts nothing; one that has it starts the tick with its input checked."""
    clock = FakeClock(T0 + 0.5)
    store = await added(clock, Schedule("v2", "report", 2, every=timedelta(seconds=1)),
                        Schedule("bad", "report", 1, {"nope": 1}, every=timedelta(seconds=1)))
    clock.advance(1)
    _schedules._SAID_UNAVAILABLE.discard(("v2", "report", 2))  # said once per process: this test says it first
    with caplog.at_level(logging.WARNING, logger="runifold"):
        assert await fire_due_schedules(store, REGISTRY) == []
    assert await checkpoints(store) == []
    assert "schedule_invalid" in caplog.text and "'nope'" in caplog.text  # logged once: the tick is passed
    # a due tick this worker cannot start is said once, so a missing version is not silent
    assert caplog.text.count("schedule_not_here") == 1 and "schedule=v2 workflow=report version=2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="runifold"):
        assert await fire_due_schedules(store, REGISTRY) == []
    assert "schedule_invalid" not in caplog.text and "schedule_not_here" not in caplog.text
    v2 = WorkflowRegistry(WorkflowDefinition(report_v2))
    clock.advance(1)
    fired = await fire_due_schedules(store, v2)
    # the tick passed while no worker had v2 is inside the catch-up window: it starts too
    assert [(name, iso(t)) for name, t, _ in fired] == [("v2", "2026-03-02T12:00:01Z"), ("v2", "2026-03-02T12:00:02Z")]


async def test_a_scheduled_run_gets_its_definitions_concurrency_limit() -> None:
    """A tick's run is the registry's task: its definition's concurrency key and limit are on the run."""
    clock = FakeClock(T0 + 0.5)
    store = await added(clock, Schedule("tick", "report", 1, {"region": "us"}, every=timedelta(seconds=1)))
    clock.advance(1)
    [(_, _, result)] = await fire_due_schedules(store, REGISTRY)
    info = await store.get_run(result.run_id)
    assert (info.checkpoint_id, info.concurrency_key, info.concurrency_limit) == (
        "schedule:tick:2026-03-02T12:00:01Z", "report", 1)


async def test_a_replaced_schedule_does_not_take_a_tick_already_started() -> None:
    """A tick started under the old definition stays that run; the replaced schedule starts the ticks after it was replaced."""
    clock = FakeClock(T0 + 0.5)
    store = await added(clock, Schedule("tick", "report", 1, {"region": "eu"}, every=timedelta(seconds=1)))
    clock.advance(1)
    await fire_due_schedules(store, REGISTRY)
    await store.add_schedule(Schedule("tick", "report", 1, {"region": "us"}, every=timedelta(seconds=1)))
    clock.advance(1)
    await fire_due_schedules(store, REGISTRY)
    runs = {r.checkpoint_id: r.run_id for r in await store.list_runs()}
    assert sorted(runs) == ["schedule:tick:2026-03-02T12:00:01Z", "schedule:tick:2026-03-02T12:00:02Z"]


async def test_a_supervisor_fires_schedules_and_runs_them() -> None:
    """A Supervisor checks the schedules on its interval and its slots run the runs they start."""
    store = MemoryWorkflowStore()
    await store.add_schedule(Schedule("fast", "report", 1, every=timedelta(seconds=1)))
    supervisor = Supervisor(worker(store, DEFINITION), 2, idle_wait=timedelta(seconds=0.05),
                            schedule_every=timedelta(seconds=0.1))
    running = asyncio.create_task(supervisor.run(handle_signals=False))
    try:
        while await store.count_runs(status=RunStatus.COMPLETED) < 2:
            await asyncio.sleep(0.05)
    finally:
        supervisor.stop()
        await asyncio.wait_for(running, 10)
    assert all(ref.startswith("schedule:fast:") for ref in await checkpoints(store))
