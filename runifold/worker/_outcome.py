"""What ``WorkflowWorker.run_once()`` reports: one small typed value per case."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, final


class SuspendReason(enum.StrEnum):
    """Why a run stopped without finishing."""

    TIMER = "timer"
    SIGNAL = "signal"
    AMBIGUOUS = "ambiguous"


@final
@dataclass(frozen=True)
class Idle:
    """No run was claimable."""


@final
@dataclass(frozen=True)
class Completed:
    """The run finished; ``output`` is the workflow's return value."""

    run_id: str
    checkpoint_id: str | None
    output: Any
    revision: int


@final
@dataclass(frozen=True)
class Retried:
    """A step or effect failed and the run was rescheduled for its next attempt."""

    run_id: str
    checkpoint_id: str | None
    key: str
    attempt: int
    retry_at: float
    error: str


@final
@dataclass(frozen=True)
class Suspended:
    """The run waits for a timer or signal, or is parked on an ambiguous effect."""

    run_id: str
    checkpoint_id: str | None
    reason: SuspendReason
    until: float | None
    signals: tuple[str, ...]
    detail: str


@final
@dataclass(frozen=True)
class Failed:
    """The run could not continue.

    ``run_failed`` is True when the run itself was failed (its log ends with
    ``run_failed``). It is False when the code diverged from the history: the
    run is kept, rescheduled, and continues once compatible code is deployed.
    """

    run_id: str
    checkpoint_id: str | None
    reason: str
    run_failed: bool = True


@final
@dataclass(frozen=True)
class DefinitionUnavailable:
    """The claimed run's exact version is not registered here; it was released untouched."""

    run_id: str
    name: str
    version: int


@final
@dataclass(frozen=True)
class LeaseLost:
    """The lease was lost (renewal failed or a commit was fenced off); nothing more was written."""

    run_id: str
    checkpoint_id: str | None
    detail: str


Outcome = Idle | Completed | Retried | Suspended | Failed | DefinitionUnavailable | LeaseLost
