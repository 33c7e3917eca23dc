"""Schedules: a workflow started at every tick of a cron expression or an interval.

A :class:`Schedule` is a value the stores keep (one row per name); the
supervisors of every worker read them and start each due tick's run (see
:mod:`runifold.worker._schedules`). Ticks are whole seconds on the store's
clock. A tick's run has the checkpoint id ``schedule:<name>:<tick>`` (the tick
as ISO-8601 UTC), so enqueueing it twice, from any number of workers, creates
one run.

Cron expressions are read by `cronsim <https://pypi.org/project/cronsim/>`_
(the ``cron`` extra), as Debian's cron reads them; ``every=`` needs nothing extra.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from runifold.errors import InvalidInputError, ScheduleNotFoundError
from runifold.history import canonical_json
from runifold.stores._protocol import WorkflowTask, check_text

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
#: the longest catch-up window a schedule may have
MAX_CATCHUP = timedelta(days=31)


@final
@dataclass(frozen=True)
class Schedule:
    """A workflow run started at every tick of ``cron`` or ``every``.

    Args:
        name: the schedule's identity: 1-100 letters, digits and ``_.-``. Adding a
            schedule under a name that is taken replaces that schedule.
        workflow: the workflow's name.
        version: the exact version each run is pinned to.
        input: the keyword arguments every run gets (JSON-compatible).
        cron: five fields (minute, hour, day of month, month, day of week) or six
            (a seconds field first), read as Debian's cron reads them, in
            ``timezone``. Needs the ``cron`` extra (cronsim).
        every: instead of ``cron``, an interval of whole seconds: the ticks are its
            multiples since the Unix epoch (every 60 s: at each minute, UTC).
        timezone: the IANA time zone cron's fields are read in (``every`` is
            UTC only).
        catchup: the catch-up window. At each check the most recent due tick is
            always started; earlier ticks that fell due since the schedule last
            fired are started too if they are at most this old (up to 1,000 per
            check). The default, one minute, starts every tick while workers run
            and, after an outage, only the most recent one.

    Raises:
        InvalidInputError: a field is invalid (the message says which and why).
    """

    name: str
    workflow: str
    version: int
    input: Mapping[str, Any] = field(default_factory=dict)
    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    catchup: timedelta = timedelta(minutes=1)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidInputError(
                f"invalid schedule name {self.name!r:.120}: use 1-100 letters, digits and '_.-' (for example 'nightly')"
            )
        # the task each tick enqueues: validates the workflow name, version and input
        WorkflowTask(self.workflow, self.version, self.input)
        if (self.cron is None) == (self.every is None):
            raise InvalidInputError(
                f"schedule {self.name!r} needs exactly one of cron= (e.g. '*/5 * * * *') or every= (a timedelta)"
            )
        if self.cron is not None:
            if not isinstance(self.cron, str):
                raise InvalidInputError(f"schedule {self.name!r}: cron must be a string, got {self.cron!r}")
            check_text(self.cron, what="the cron expression")
            object.__setattr__(self, "cron", " ".join(self.cron.split()))
        if self.every is not None:
            seconds = self.every.total_seconds() if isinstance(self.every, timedelta) else math.nan
            if not (seconds >= 1 and seconds.is_integer()):
                got = f"{seconds:g} s" if isinstance(self.every, timedelta) else repr(self.every)
                raise InvalidInputError(
                    f"schedule {self.name!r}: the interval (every, --every) must be a whole number of seconds, "
                    f"at least 1, got {got}"
                )
            if self.timezone != "UTC":
                raise InvalidInputError(
                    f"schedule {self.name!r}: timezone applies to cron only (every= counts from the epoch, UTC); "
                    "drop timezone or use cron"
                )
        if not isinstance(self.catchup, timedelta) or not timedelta(0) <= self.catchup <= MAX_CATCHUP:
            got = f"{self.catchup.total_seconds():.12g} s" if isinstance(self.catchup, timedelta) else repr(self.catchup)
            raise InvalidInputError(
                f"schedule {self.name!r}: the catch-up window (catchup, --catchup) must be from 0 to "
                f"{MAX_CATCHUP.total_seconds():.0f} s ({MAX_CATCHUP.days} days), got {got}"
            )
        self.zone()
        if self.cron is not None:
            _cron(self.cron, datetime.now(UTC), reverse=False, name=self.name)  # parses it: a bad field fails now

    def zone(self) -> tzinfo:
        """The time zone cron's fields are read in."""
        if self.timezone == "UTC":
            return UTC
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
            raise InvalidInputError(
                f"schedule {self.name!r}: unknown time zone {self.timezone!r}; use an IANA name such as "
                "'Europe/Riga' or 'America/New_York' (install tzdata where the system has no zone database)"
            ) from exc

    def describe(self) -> str:
        """How the schedule ticks, in a few words: ``cron '*/5 * * * *' in UTC`` or ``every 60 s``."""
        if self.every is not None:
            return f"every {self.every.total_seconds():g} s"
        return f"cron '{self.cron}' in {self.timezone}"

    def ticks_back(self, now: float, after: float, limit: int) -> list[float]:
        """Ticks ``t`` with ``after < t <= now``, the most recent first, at most ``limit``."""
        if self.every is not None:
            step = int(self.every.total_seconds())
            last = math.floor(now) // step * step
            return [float(t) for t in range(last, math.floor(after), -step)[:limit] if t > after]
        assert self.cron is not None
        zone, fixed = self.zone(), self._fixed()
        # walls outside [wall(after), wall(now)] show in between only if the clock went back in between
        shift = _shift(zone, after, now) if now - after < _DAY else _SHIFT
        found: set[float] = set()
        stop, capped = _wall(after, zone) - shift, False
        # whole seconds: reverse iteration yields ticks before its start, so start just after now
        for wall in _cron(self.cron, _wall(math.floor(now) + 1, zone) + shift, reverse=True, name=self.name):
            if wall < stop:
                break
            found.update(t for t in _instants(wall, zone, fixed) if after < t <= now)
            if len(found) >= limit and not capped:
                # no wall time older than this has a tick among the latest ``limit``
                stop, capped = max(stop, _wall(sorted(found)[-limit], zone) - shift), True
        return sorted(found, reverse=True)[:limit]

    def next_tick(self, after: float) -> float | None:
        """The first tick after ``after`` (None: none within 50 years)."""
        if self.every is not None:
            step = int(self.every.total_seconds())
            return float((math.floor(after) // step + 1) * step)
        assert self.cron is not None
        zone, fixed = self.zone(), self._fixed()
        first: float | None = None
        # a clock going back soon after ``after`` shows earlier walls again; one going back before the first tick
        # found shows later walls first
        start = _wall(after, zone) - _shift(zone, after, after + _SHIFT.total_seconds())
        for wall in _cron(self.cron, start, reverse=False, name=self.name):
            if first is not None and wall > _wall(first, zone) + _shift(zone, first - _SHIFT.total_seconds(), first):
                break
            for t in _instants(wall, zone, fixed):
                if t > after and (first is None or t < first):
                    first = t
        return first

    def _fixed(self) -> bool:
        """The cron expression fires at fixed times of day, which Debian's cron moves across clock changes: five
        fields, neither the minute nor the hour a wildcard (as cronsim decides it)."""
        assert self.cron is not None
        fields = self.cron.split()
        return len(fields) == 5 and not fields[0].startswith("*") and not fields[1].startswith("*")

    def task(self, tick: float) -> WorkflowTask:
        """The task this schedule enqueues for ``tick``."""
        return WorkflowTask(self.workflow, self.version, self.input, checkpoint_id=tick_checkpoint(self.name, tick))

    def definition(self) -> tuple[Any, ...]:
        """What makes two schedules of one name the same: re-adding an identical one changes nothing."""
        return (self.workflow, self.version,
                canonical_json(dict(self.input), what="the schedule's input").decode(),
                self.cron, None if self.every is None else int(self.every.total_seconds()), self.timezone,
                self.catchup.total_seconds())

    @classmethod
    def from_row(cls, name: str, workflow: str, version: int, input_json: str, cron: str | None,
                 every_seconds: int | None, timezone: str, catchup_seconds: float) -> Schedule:
        """A schedule as a store keeps it (the columns of :meth:`definition`)."""
        return cls(name, workflow, version, msgspec.json.decode(input_json), cron,
                   None if every_seconds is None else timedelta(seconds=every_seconds), timezone,
                   timedelta(seconds=catchup_seconds))


class ScheduleInfo(msgspec.Struct, frozen=True):
    """A stored schedule and its state.

    ``last_tick``: ticks at or before it are never started (again): the most
    recent tick started, or when the schedule was added, replaced or resumed.
    """

    schedule: Schedule
    paused: bool
    last_tick: float
    created_at: float
    updated_at: float


def check_schedule_name(name: str) -> None:
    """A name no schedule can have (NUL, invalid Unicode, characters outside ``[A-Za-z0-9_.-]``) names none, on every
    store alike.

    Raises:
        ScheduleNotFoundError: always, for such a name.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ScheduleNotFoundError(name)


def tick_checkpoint(name: str, tick: float) -> str:
    """The checkpoint id of a schedule's run for ``tick``: ``schedule:<name>:<tick as ISO-8601 UTC>``."""
    return f"schedule:{name}:{datetime.fromtimestamp(tick, UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


#: the largest change of a zone's clock that cron's ticks are placed across (tzdata's are mostly an hour): wall
#: times and instants keep their order to within it
_SHIFT = timedelta(hours=4)
_DAY = 86_400.0


def _shift(zone: tzinfo, start: float, end: float) -> timedelta:
    """How far the zone's clock changed between ``start`` and ``end`` (at most one change: under a day apart), so
    how far wall times and instants may be out of order there: nothing where the clock did not change."""
    before = datetime.fromtimestamp(start, zone).utcoffset()
    after = datetime.fromtimestamp(end, zone).utcoffset()
    assert before is not None and after is not None
    return min(abs(after - before), _SHIFT)


def _wall(instant: float, zone: tzinfo) -> datetime:
    """What a clock in ``zone`` shows at ``instant``: a naive datetime (converting an instant is never ambiguous)."""
    return datetime.fromtimestamp(instant, zone).replace(tzinfo=None)


def _instants(wall: datetime, zone: tzinfo, fixed: bool) -> list[float]:
    """The instants at which cron fires for the wall time ``wall`` in ``zone``: the one when the clock shows it;
    where the clocks go back and show it twice, the first for a time of day (``fixed``), both otherwise; where
    they go forward and skip it, the end of the gap for a time of day, none otherwise.

    Only instants are converted to wall times (never the other way, which zones whose clocks change by half an
    hour or off the hour confuse): the candidates are the wall time at the offsets before and after a change.
    """
    candidates = {(wall - wall.replace(tzinfo=zone, fold=fold).utcoffset()).replace(tzinfo=UTC).timestamp()  # type: ignore[operator]
                  for fold in (0, 1)}
    shown = sorted(t for t in candidates if _wall(t, zone) == wall)
    if shown:
        return shown[:1] if fixed else shown
    if not fixed or len(candidates) < 2:
        return []
    # skipped: the gap ends at the first instant whose clock shows a later time than ``wall``
    lo, hi = int(min(candidates)), int(max(candidates))
    while lo < hi:
        mid = (lo + hi) // 2
        if _wall(mid, zone) > wall:
            hi = mid
        else:
            lo = mid + 1
    return [float(lo)]


def _cron(expression: str, start: datetime, *, reverse: bool, name: str) -> Iterator[datetime]:
    """cronsim's iterator over ``expression`` from ``start``; a clear error when the expression or cronsim is missing."""
    try:
        from cronsim import CronSim, CronSimError
    except ImportError as exc:
        raise InvalidInputError(
            f"schedule {name!r} uses cron, which needs the cronsim package: pip install '/path/to/runifold[cron]' "
            "from a checkout, or 'runifold[cron]' from a package index (or give every= instead)"
        ) from exc
    make: Callable[..., Iterator[datetime]] = CronSim
    try:
        return make(expression, start, reverse=reverse)
    except CronSimError as exc:
        raise InvalidInputError(
            f"schedule {name!r}: invalid cron expression {expression!r} ({exc}); use five fields, minute hour "
            "day-of-month month day-of-week (e.g. '*/5 * * * *'), or six with seconds first"
        ) from exc
