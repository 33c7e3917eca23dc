"""Validated value types for workers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import final

from runifold.errors import ConfigurationError

_WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@\-]{0,127}$")


@final
@dataclass(frozen=True)
class WorkerId:
    """A worker's identity, written into every lease it takes."""

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not _WORKER_ID.match(self.value):
            raise ConfigurationError(
                f"invalid worker id {self.value!r}: use 1-128 characters of letters, digits and "
                "'_.:@-', starting with a letter or digit (for example 'worker-host1-1')"
            )

    @classmethod
    def parse(cls, value: str) -> WorkerId:
        """Validate ``value`` as a worker id."""
        return cls(value)

    def __str__(self) -> str:
        return self.value


#: the shortest lease
MIN_LEASE = timedelta(milliseconds=100)


@final
@dataclass(frozen=True)
class LeaseDuration:
    """How long a claim lasts without renewal (at least :data:`MIN_LEASE`, 100 ms)."""

    value: timedelta

    def __post_init__(self) -> None:
        if not isinstance(self.value, timedelta) or self.value < MIN_LEASE:
            raise ConfigurationError(
                f"invalid lease duration {self.value!r}: give a timedelta of at least 100 ms "
                "(for example LeaseDuration(timedelta(seconds=30)))"
            )

    @property
    def seconds(self) -> float:
        return self.value.total_seconds()
