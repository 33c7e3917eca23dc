"""``Supervisor``: the production loop around a ``WorkflowWorker``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from datetime import timedelta
from typing import final

import structlog

from runifold.errors import ConfigurationError, RunifoldError
from runifold.worker._outcome import DefinitionUnavailable, Idle, Outcome
from runifold.worker._worker import WorkflowWorker

log = structlog.get_logger("runifold.supervisor")


@final
class Supervisor:
    """Runs up to ``concurrency`` runs at once until asked to stop.

    Each slot claims a run, drives it (with its own lease renewal), and claims
    the next; a run that fails does not stop the others.
    Idle slots wait on the store (PostgreSQL wakes them at once by
    notification; other stores poll every ``idle_wait``), one of them at a
    time: a slot that claims a run wakes the next idle one, so a burst of
    work fans out over the slots one claim after another. On SIGTERM or
    SIGINT (or :meth:`stop`) it stops claiming, gives in-flight runs ``grace``
    to finish, then cancels them and releases their leases so other workers
    continue them at once.
    """

    def __init__(
        self,
        worker: WorkflowWorker,
        concurrency: int = 8,
        *,
        idle_wait: timedelta = timedelta(seconds=1),
        grace: timedelta = timedelta(seconds=10),
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
        self.worker = worker
        self.concurrency = concurrency
        self.idle_wait = idle_wait.total_seconds()
        self.grace = grace.total_seconds()
        self._stopping = asyncio.Event()
        # invariant: at most one idle slot waits on the store; a slot that claims work
        # kicks the next idle slot, so a burst fans out without a thundering herd
        self._poll_lock = asyncio.Lock()
        self._kick = asyncio.Event()
        self.outcomes: dict[str, int] = {}
        self.log = log.bind(worker_id=str(worker.worker_id))

    def stop(self) -> None:
        """Stop claiming new runs; :meth:`run` returns after in-flight runs end or the grace period."""
        self._stopping.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until :meth:`stop` or SIGTERM/SIGINT."""
        loop = asyncio.get_running_loop()
        installed = []
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self.stop)
                    installed.append(sig)
        self.log.info("supervisor_started", concurrency=self.concurrency)
        slots = [asyncio.create_task(self._slot(i)) for i in range(self.concurrency)]
        try:
            await self._stopping.wait()
            self.log.info("supervisor_stopping", grace=self.grace)
            _, pending = await asyncio.wait(slots, timeout=self.grace)
            for task in pending:
                task.cancel()  # an execution releases its lease when cancelled
            await asyncio.gather(*slots, return_exceptions=True)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            for task in slots:
                task.cancel()
            await asyncio.gather(*slots, return_exceptions=True)
        self.log.info("supervisor_stopped", outcomes=self.outcomes)

    async def _slot(self, index: int) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                claim = await self.worker._claim()
                if claim is not None and self._stopping.is_set():
                    await self.worker.store.release(claim.lease)  # claimed as the stop came: hand it back
                    break
                if claim is not None:
                    self._kick.set()  # more may be due: the next idle slot claims now, not after this run
                outcome = Idle() if claim is None else await self.worker._drive(claim)
                failures = 0
            except RunifoldError as exc:
                failures += 1
                self.log.error("run_once_failed", slot=index, error=str(exc))
                await self._pause(min(0.1 * 2**failures, 5.0))
                continue
            self._count(outcome)
            if isinstance(outcome, (Idle, DefinitionUnavailable)):
                await self._idle()

    def _count(self, outcome: Outcome) -> None:
        name = type(outcome).__name__
        self.outcomes[name] = self.outcomes.get(name, 0) + 1

    async def _idle(self) -> None:
        async with self._poll_lock:
            if self._kick.is_set():  # another slot just found work: try to claim at once
                self._kick.clear()
                return
            waits = [asyncio.ensure_future(w) for w in
                     (self.worker.store.wait_for_work(self.idle_wait), self._stopping.wait(), self._kick.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
                self._kick.clear()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
