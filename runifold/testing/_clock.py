"""A controllable clock for stores that accept one."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta
from typing import final

from runifold.errors import ConfigurationError


@final
class FakeClock:
    """A clock that only moves when told to. Call it to read the time."""

    def __init__(self, start: float | datetime | None = None) -> None:
        """``start``: seconds since the epoch, or an aware datetime (default: now)."""
        if isinstance(start, datetime):
            if start.utcoffset() is None:
                raise ConfigurationError(f"FakeClock(start=) takes seconds since the epoch or an aware datetime (e.g. "
                                         f"with tzinfo=UTC), got {start!r}: a naive one would be read in this "
                                         f"machine's time zone")
            start = start.timestamp()
        elif start is not None and (isinstance(start, bool) or not isinstance(start, (int, float))
                                    or not math.isfinite(start)):
            raise ConfigurationError(f"FakeClock(start=) takes seconds since the epoch or an aware datetime, "
                                     f"got {start!r}")
        self._now = time.time() if start is None else float(start)

    def __call__(self) -> float:
        return self._now

    def advance(self, by: timedelta | float, *, what: str = "advance()") -> None:
        """Move the clock forward by ``by`` (a timedelta, or seconds): a store's clock never goes back.
        ``what`` names the call in the error."""
        seconds = by.total_seconds() if isinstance(by, timedelta) else by
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0 \
                or not math.isfinite(seconds):
            raise ConfigurationError(f"the clock only moves forward: {what} takes a timedelta or seconds >= 0, "
                                     f"got {by!r}")
        self._now += seconds
