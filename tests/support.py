"""Small helpers shared by tests."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from runifold import LeaseDuration, WorkerId, WorkflowDefinition, WorkflowRegistry, WorkflowWorker
from runifold.history import Entry, decode_event

NO_WAIT = timedelta(0)
#: a retry backoff long enough that the run is rescheduled, short enough to wait out in a test
SHORT_WAIT = timedelta(milliseconds=150)


def worker(store: Any, *definitions: WorkflowDefinition, worker_id: str = "w1", lease: float = 30.0) -> WorkflowWorker:
    """A worker over ``definitions`` with a lease of ``lease`` seconds."""
    return WorkflowWorker(
        store, WorkflowRegistry(*definitions), WorkerId.parse(worker_id),
        LeaseDuration(timedelta(seconds=lease)), timedelta(seconds=lease / 3),
    )


async def entries(store: Any, ref: str) -> list[Entry]:
    """The decoded history of a run."""
    return [Entry(e.seq, e.at, decode_event(e.body)) for e in await store.history(ref)]


async def event_types(store: Any, ref: str) -> list[str]:
    return [e.type for e in await store.history(ref)]


async def keys(store: Any, ref: str, type_: str) -> list[str]:
    return [e.key for e in await store.history(ref) if e.type == type_]


async def send_signal(store: Any, ref: str, name: str, signal_id: str, payload: Any = None) -> Any:
    """Deliver an (already authenticated) signal straight to the store, as the gateway would."""
    from runifold.stores import SignalDelivery

    run_id = (await store.get_run(ref)).run_id  # the gateway resolves the reference once
    return await store.deliver_signal(SignalDelivery(
        ref, run_id, signal_id, name, {} if payload is None else payload, "tester", "k1", "test", "sha256:x"))
