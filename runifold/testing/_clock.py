"""A controllable clock for stores that accept one."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import final


@final
class FakeClock:
    """A clock that only moves when told to. Call it to read the time."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start

    def __call__(self) -> float:
        return self._now

    def advance(self, by: timedelta | float) -> None:
        """Move the clock forward."""
        self._now += by.total_seconds() if isinstance(by, timedelta) else by
