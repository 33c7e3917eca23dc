"""Stores: the ``WorkflowStore`` protocol and its implementations.

``runifold.stores.memory``, ``runifold.stores.sqlite`` and
``runifold.stores.postgres`` hold the implementations; :func:`open_store`
chooses one by URL.
"""

from runifold.stores._open import open_store
from runifold.stores._protocol import (
    UNFINISHED,
    AuditRecord,
    Claim,
    CommitResult,
    Continue,
    EnqueueResult,
    EventRow,
    Finish,
    InboxSignal,
    Lease,
    Reschedule,
    RunInfo,
    RunStatus,
    SignalDelivery,
    SignalReceipt,
    StoredEvent,
    Suspend,
    Transition,
    WorkflowStore,
    WorkflowTask,
)
from runifold.stores._schedule import Schedule, ScheduleInfo

__all__ = [
    "AuditRecord", "Claim", "CommitResult", "Continue", "EnqueueResult", "EventRow", "Finish",
    "InboxSignal", "Lease", "Reschedule", "RunInfo", "RunStatus", "Schedule", "ScheduleInfo", "SignalDelivery", "SignalReceipt",
    "StoredEvent", "Suspend", "Transition", "UNFINISHED", "WorkflowStore", "WorkflowTask", "open_store",
]
