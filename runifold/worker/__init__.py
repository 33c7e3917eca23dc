"""Workers: the registry, value types, outcomes, ``WorkflowWorker`` and ``Supervisor``."""

from runifold.worker._admin import cancel_run, resolve_effect, retry_run
from runifold.worker._debug import ReplayReport, check_compatibility, compatibility_reports, replay_run
from runifold.worker._outcome import (
    Completed,
    DefinitionUnavailable,
    Failed,
    Idle,
    LeaseLost,
    Outcome,
    Retried,
    Suspended,
    SuspendReason,
)
from runifold.worker._registry import WorkflowRegistry
from runifold.worker._supervisor import Supervisor
from runifold.worker._values import LeaseDuration, WorkerId
from runifold.worker._worker import WorkflowWorker

__all__ = [
    "Completed", "DefinitionUnavailable", "ReplayReport", "check_compatibility", "compatibility_reports", "replay_run", "Failed", "Idle", "LeaseDuration", "LeaseLost", "Outcome",
    "Retried", "Supervisor", "Suspended", "SuspendReason", "WorkerId", "WorkflowRegistry", "WorkflowWorker", "cancel_run", "resolve_effect", "retry_run",
]
