"""``Supervisor``: the production loop around a ``WorkflowWorker``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from datetime import timedelta
from typing import final

from runifold._log import get_logger

from runifold.errors import ConfigurationError, RunifoldError
from runifold.stores import Claim
from runifold.worker._outcome import DefinitionUnavailable, Idle
from runifold.worker._schedules import fire_due_schedules
from runifold.worker._worker import WorkflowWorker

log = get_logger("runifold.supervisor")


@final
class Supervisor:
    """Runs up to ``concurrency`` runs at once until asked to stop.

    Each slot claims a run, drives it (with its own lease renewal), and claims
    the next; a run that fails does not stop the others. A slot survives any
    exception from the store or from a run: it logs it with its traceback at
    error, counts it in :attr:`outcomes` (``"Error"`` for a runifold error,
    ``"UnexpectedError"`` for any other exception, after which the run it held
    is left to its lease's expiry, as after a crash), backs off (up to 5 s)
    and carries on.
    Idle slots wait on the store (PostgreSQL wakes them at once by
    notification; other stores poll every ``idle_wait``), one of them at a
    time: a slot that claims a run wakes the next idle one, so a burst of
    work fans out over the slots one claim after another. On SIGTERM or
    SIGINT (or :meth:`stop`) it stops claiming, gives in-flight runs ``grace``
    to finish, then cancels them and releases their leases so other workers
    continue them at once. A second SIGTERM or SIGINT (or ``stop(now=True)``)
    cancels the runs still in flight at once.

    Every ``schedule_every`` (default 1 s; None: never) it also starts the due
    ticks of the store's schedules whose workflow version its registry holds
    (see :func:`runifold.worker._schedules.fire_due_schedules`): every worker
    checks, and each tick still starts one run. A failed check is logged at
    error (``schedule_check_failed``) and tried again at the next interval.

    :attr:`outcomes` counts what the slots saw, by outcome class name
    (``Completed``, ``Idle``, ...) plus ``Error`` and ``UnexpectedError``.
    """

    def __init__(
        self,
        worker: WorkflowWorker,
        concurrency: int = 8,
        *,
        idle_wait: timedelta = timedelta(seconds=1),
        grace: timedelta = timedelta(seconds=10),
        schedule_every: timedelta | None = timedelta(seconds=1),
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
        if schedule_every is not None and not schedule_every > timedelta(0):
            raise ConfigurationError(f"schedule_every must be a positive timedelta or None, got {schedule_every!r}")
        self.schedule_every = None if schedule_every is None else schedule_every.total_seconds()
        self.worker = worker
        self.concurrency = concurrency
        self.idle_wait = idle_wait.total_seconds()
        self.grace = grace.total_seconds()
        self._stopping = asyncio.Event()
        self._stop_now = asyncio.Event()
        self._stop_asked = False  # (set by stop_soon, from a signal handler: no slot claims after it)
        # invariant: at most one idle slot waits on the store; a slot that claims work
        # kicks the next idle slot, so a burst fans out without a thundering herd
        self._poll_lock = asyncio.Lock()
        self._kick = asyncio.Event()
        self.outcomes: dict[str, int] = {}
        self.log = log.bind(worker_id=str(worker.worker_id))

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming new runs; :meth:`run` returns after in-flight runs end or the grace period.

        Args:
            now: cancel the runs in flight at once instead of after the grace
                period (their leases are released, so other workers continue them).
        """
        if now:
            self._stop_now.set()
        self._stopping.set()

    def stop_soon(self) -> None:
        """Claim no more runs from now on; safe in a signal handler, which Python runs between two lines of code
        even while a step blocks the event loop (:meth:`stop`, called on the loop, does the rest). A worker whose
        async steps block the loop past their lease would otherwise go on taking its own runs over from itself,
        and the loop never get to the stop (helper-98)."""
        self._stop_asked = True

    def _on_signal(self) -> None:
        # the first signal stops gracefully, a second one stops at once
        self.stop(now=self._stopping.is_set())

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until :meth:`stop` or SIGTERM/SIGINT."""
        loop = asyncio.get_running_loop()
        installed = []
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._on_signal)
                    installed.append(sig)
        self.log.info("supervisor_started", concurrency=self.concurrency)
        slots = [asyncio.create_task(self._slot(i)) for i in range(self.concurrency)]
        if self.schedule_every is not None:
            slots.append(asyncio.create_task(self._schedules(self.schedule_every)))
        try:
            await self._stopping.wait()
            self.log.info("supervisor_stopping", grace=self.grace)
            ended = asyncio.ensure_future(asyncio.wait(slots))  # cancelling this wait leaves the slots be
            now = asyncio.ensure_future(self._stop_now.wait())
            try:
                await asyncio.wait([ended, now], timeout=self.grace, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ended.cancel()
                now.cancel()
                await asyncio.gather(ended, now, return_exceptions=True)
            for task in slots:
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
        while not (self._stopping.is_set() or self._stop_asked):
            claim: Claim | None = None
            try:
                claim = await self.worker._claim()
                if claim is not None and (self._stopping.is_set() or self._stop_asked):
                    await self.worker.store.release(claim.lease)  # claimed as the stop came: hand it back
                    break
                if claim is not None:
                    self._kick.set()  # more may be due: the next idle slot claims now, not after this run
                outcome = Idle() if claim is None else await self.worker._drive(claim)
                claim = None  # driven to an outcome: the run is no longer this slot's to hand back
                failures = 0
                self._count(type(outcome).__name__)
                if isinstance(outcome, (Idle, DefinitionUnavailable)):
                    await self._idle()
            except asyncio.CancelledError:
                if claim is not None:
                    self._count("Released")  # stopped in flight: the execution released its lease
                raise
            except Exception as exc:  # noqa: BLE001 - a slot outlives anything a run or the store raises
                failures += 1
                self._survive(index, claim, exc)
                await self._pause(min(0.1 * 2**failures, 5.0))

    async def _schedules(self, every: float) -> None:
        """Start the schedules' due ticks every ``every`` seconds until stopped."""
        while not self._stopping.is_set():
            try:
                await fire_due_schedules(self.worker.store, self.worker.registry, worker_id=str(self.worker.worker_id))
            except Exception as exc:  # noqa: BLE001 - the next check tries again
                self.log.error("schedule_check_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
            await self._pause(every)

    def _survive(self, index: int, claim: Claim | None, exc: Exception) -> None:
        """Log and count an exception that ended a slot's turn."""
        expected = isinstance(exc, RunifoldError)
        self._count("Error" if expected else "UnexpectedError")
        run = {} if claim is None else {"run_id": claim.run_id, "checkpoint_id": claim.checkpoint_id}
        self.log.error("slot_error" if expected else "slot_unexpected_error", slot=index, **run,
                       error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        # invariant: the run it held is not handed back. A runifold error (the store unreachable, a lease lost)
        # is the execution's to handle, and it decided what becomes of the lease. Anything else escaped the
        # execution, like a crash: the lease expires and the next claim takes the run over as a recovery,
        # counted against the run's budget, so a run that fails this way every time ends with its budget
        # instead of being claimed again at once and running its bodies again, uncounted, without end

    def _count(self, name: str) -> None:
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

