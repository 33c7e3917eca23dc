"""Small helpers shared by tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

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


@contextlib.contextmanager
def read_only_file(path: Path) -> Iterator[None]:
    """Make the file ``path`` unwritable while the block runs, its folder left writable.

    chmod 0444 stops a writer but not root (as in CI), so as root the file is bind-mounted read-only onto itself
    instead. Skips the test where neither technique stops a write.
    """
    mode = path.stat().st_mode
    mounted = False
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True).returncode == 0
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], capture_output=True)
    else:
        path.chmod(0o444)
    try:
        if os.access(path, os.W_OK):
            pytest.skip("nothing here stops a write to a file (root without a read-only bind mount)")
        yield
    finally:
        if mounted:  # lazily: a connection a failed test left open keeps the mount busy
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        else:
            path.chmod(mode)
