"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runifold import (
    Completed,
    Idle,
    LeaseDuration,
    Outcome,
    Suspended,
    WorkerId,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowWorker,
)
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


async def until_completed(store: Any, *definitions: WorkflowDefinition, attempts: int = 100,
                          each: float | None = None) -> Completed:
    """Run executions of the run due in ``store`` until it completes, and return that outcome.

    On the way the run may suspend (on its timers, its retries' backoff) or not be due yet; any other outcome
    fails the test. ``each`` bounds one execution, in seconds.
    """
    done = await _run_until(store, definitions, lambda o: isinstance(o, Completed), "complete", attempts, each)
    assert isinstance(done, Completed)
    return done


async def until_waiting_for_signal(store: Any, definition: WorkflowDefinition) -> Suspended:
    """Run executions (the run suspends on its short timers on the way) until the run waits for a signal."""
    waiting = await _run_until(store, (definition,), lambda o: isinstance(o, Suspended) and bool(o.signals),
                               "come to wait for a signal", 100, None)
    assert isinstance(waiting, Suspended)
    return waiting


async def _run_until(store: Any, definitions: tuple[WorkflowDefinition, ...], reached: Callable[[Outcome], bool],
                     what: str, attempts: int, each: float | None) -> Outcome:
    for _ in range(attempts):
        execution = worker(store, *definitions).run_once()
        outcome = await (execution if each is None else asyncio.wait_for(execution, each))
        if reached(outcome):
            return outcome
        assert isinstance(outcome, (Suspended, Idle)), outcome
        await asyncio.sleep(0.02)
    raise AssertionError(f"the run did not {what} in {attempts} executions")


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
