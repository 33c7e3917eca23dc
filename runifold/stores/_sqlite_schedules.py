"""The SQLite store's schedule operations, run in its writer or reader thread (see ``sqlite.py``).

What adding, pausing and advancing a schedule writes is decided by
:mod:`runifold.stores._rule`; the statements are in ``sql/sqlite/queries.sql``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from runifold.errors import ScheduleNotFoundError
from runifold.stores import _rule
from runifold.stores._schedule import Schedule, ScheduleInfo
from runifold.stores._sql import numbered, queries

Q = queries("sqlite")


def info(row: Sequence[Any]) -> ScheduleInfo:
    """A ``schedule``/``schedules`` row as a :class:`ScheduleInfo`."""
    return ScheduleInfo(Schedule.from_row(*row[:8]), bool(row[8]), row[9], row[10], row[11])


def _find(conn: sqlite3.Connection, name: str) -> ScheduleInfo:
    row = conn.execute(Q["schedule"], (name,)).fetchone()
    if row is None:
        raise ScheduleNotFoundError(name)
    return info(row)


def add(conn: sqlite3.Connection, schedule: Schedule, now: float) -> ScheduleInfo:
    row = conn.execute(Q["schedule"], (schedule.name,)).fetchone()
    found = None if row is None else info(row)
    definition = schedule.definition()
    verdict = _rule.schedule_added(None if found is None else found.schedule.definition(), definition)
    if found is not None and verdict == "unchanged":
        return found
    workflow, version, input_json, cron, every, timezone, catchup = definition
    conn.execute(Q["put_schedule"], numbered((schedule.name, workflow, version, input_json, cron, every, timezone,
                                              catchup, now)))
    return _find(conn, schedule.name)


def delete(conn: sqlite3.Connection, name: str) -> None:
    if conn.execute(Q["delete_schedule"], (name,)).rowcount == 0:
        raise ScheduleNotFoundError(name)


def listing(conn: sqlite3.Connection) -> list[ScheduleInfo]:
    return [info(row) for row in conn.execute(Q["schedules"])]


def pause(conn: sqlite3.Connection, name: str, paused: bool, now: float) -> ScheduleInfo:
    found = _find(conn, name)
    last_tick = found.last_tick if paused else _rule.resumed_last_tick(found.paused, found.last_tick, now)
    conn.execute(Q["pause_schedule"], (int(paused), last_tick, now, name))
    return _find(conn, name)


def advance(conn: sqlite3.Connection, ticks: Mapping[str, float]) -> None:
    conn.executemany(Q["advance_schedule"], [numbered((tick, name)) for name, tick in sorted(ticks.items())])
