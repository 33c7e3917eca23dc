"""``runifold schedule``: add, list, pause, resume and delete the schedules every worker fires."""

from __future__ import annotations

import argparse
import math
from datetime import timedelta
from typing import Any

from runifold.cli._common import ArgumentError, emit_json, parse_json, registry_of, seconds, store_of, table, version, when
from runifold.errors import InvalidInputError
from runifold.stores import Schedule, ScheduleInfo, WorkflowTask
from runifold.worker._schedules import due_ticks


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    schedule = sub.add_parser("schedule", help="start a workflow at every tick of a cron expression or an interval")
    schedule_sub = schedule.add_subparsers(dest="schedule_command", required=True, metavar="COMMAND")

    add = schedule_sub.add_parser("add", help="add a schedule, or replace the one of its name (re-adding it unchanged "
                                              "changes nothing)")
    add.add_argument("name", help="1-100 letters, digits and '_.-'")
    add.add_argument("--workflow", required=True, help="the workflow to start")
    add.add_argument("--version", type=version, required=True, help="the exact version its runs are pinned to")
    when_group = add.add_mutually_exclusive_group()  # not required: RUNIFOLD_CRON or RUNIFOLD_EVERY may give it
    when_group.add_argument("--cron", help="five cron fields, e.g. '*/5 * * * *', or six with seconds first "
                                           "(needs runifold[cron])")
    when_group.add_argument("--every", type=seconds, help="an interval of whole seconds instead of cron")
    add.add_argument("--input", default="{}", help="JSON object of workflow arguments for every run")
    add.add_argument("--timezone", default="UTC", help="the IANA time zone cron is read in (default UTC)")
    add.add_argument("--catchup", type=_window, default=60.0,
                     help="seconds: earlier due ticks at most this old start too; the most recent always does "
                          "(default 60)")
    add.set_defaults(handler=add_cmd)

    listing = schedule_sub.add_parser("list", help="every schedule: when it ticks, its state, last and next tick")
    listing.set_defaults(handler=list_cmd)

    for name, what in (("pause", "start no tick until resumed"),
                       ("resume", "start ticks again (none of those due while paused)")):
        action = schedule_sub.add_parser(name, help=what)
        action.add_argument("name")
        action.set_defaults(handler=pause_cmd, paused=name == "pause")

    delete = schedule_sub.add_parser("delete", help="delete a schedule (the runs it started stay)")
    delete.add_argument("name")
    delete.set_defaults(handler=delete_cmd)


def _window(value: str) -> float:
    """An argparse type: a finite number of seconds, zero or more."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be a finite number of seconds, zero or more")
    return number


def _next_tick(info: ScheduleInfo, now: float) -> float | None:
    """The next tick a worker starts: the oldest one due and not fired yet (by the catch-up policy), else the next."""
    due = due_ticks(info.schedule, info.last_tick, now)
    return due[0] if due else info.schedule.next_tick(max(info.last_tick, now))


def _row(info: ScheduleInfo, now: float) -> dict[str, Any]:
    s = info.schedule
    return {
        "name": s.name, "workflow": s.workflow, "version": s.version, "input": dict(s.input), "cron": s.cron,
        "every": None if s.every is None else s.every.total_seconds(), "timezone": s.timezone,
        "catchup": s.catchup.total_seconds(), "paused": info.paused, "last_tick": info.last_tick,
        "next_tick": None if info.paused else _next_tick(info, now),
        "created_at": info.created_at, "updated_at": info.updated_at,
    }


async def add_cmd(args: argparse.Namespace) -> int:
    if (args.cron is None) == (args.every is None):
        raise ArgumentError("give one of --cron EXPRESSION or --every SECONDS (or RUNIFOLD_CRON, RUNIFOLD_EVERY)")
    data = parse_json(args.input, "--input")
    if not isinstance(data, dict):
        raise ArgumentError("--input must be a JSON object of workflow arguments")
    try:
        schedule = Schedule(args.name, args.workflow, args.version, data, cron=args.cron,
                            every=None if args.every is None else timedelta(seconds=args.every),
                            timezone=args.timezone, catchup=timedelta(seconds=args.catchup))
    except InvalidInputError as exc:
        raise ArgumentError(str(exc)) from exc
    registry_of(args).validate(WorkflowTask(schedule.workflow, schedule.version, schedule.input))
    store = await store_of(args, create=True)
    try:
        before = {i.schedule.name: i for i in await store.list_schedules()}.get(schedule.name)
        info = await store.add_schedule(schedule)
        row = _row(info, await store.now())
    finally:
        await store.close()
    result = "added" if before is None else "unchanged" if info == before else "replaced"
    if args.json:
        emit_json({"result": result, **row})
    else:
        state = "; paused" if info.paused else f"; next tick {when(row['next_tick'])}"
        print(f"{result} schedule {schedule.name}: {schedule.workflow} v{schedule.version} {schedule.describe()}{state}")
    return 0


async def list_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args, readonly=True)
    try:
        infos = await store.list_schedules()
        rows = [_row(info, await store.now()) for info in infos]
    finally:
        await store.close()
    if args.json:
        emit_json(rows)
        return 0
    table(["name", "workflow", "when", "catchup", "state", "fired through", "next tick"],
          [[r["name"], f"{r['workflow']} v{r['version']}", i.schedule.describe(), f"{r['catchup']:g} s",
            "paused" if r["paused"] else "active", when(r["last_tick"]), when(r["next_tick"])]
           for r, i in zip(rows, infos, strict=True)])
    return 0


async def pause_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args)
    try:
        info = await store.pause_schedule(args.name, paused=args.paused)
        row = _row(info, await store.now())
    finally:
        await store.close()
    if args.json:
        emit_json(row)
    elif info.paused:
        print(f"paused schedule {args.name}: no tick starts until `runifold schedule resume {args.name}`")
    else:
        print(f"resumed schedule {args.name}: next tick {when(row['next_tick'])}")
    return 0


async def delete_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args)
    try:
        await store.delete_schedule(args.name)
    finally:
        await store.close()
    if args.json:
        emit_json({"deleted": args.name})
    else:
        print(f"deleted schedule {args.name} (the runs it started stay)")
    return 0
