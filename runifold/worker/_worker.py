"""``WorkflowWorker``: claims one run at a time and drives it."""

from __future__ import annotations

from datetime import timedelta
from typing import final

from runifold._log import get_logger

from runifold.errors import ConfigurationError, SerializationError
from runifold.history import Entry, decode_event
from runifold.stores import Claim, WorkflowStore
from runifold.worker._execution import Execution
from runifold.worker._outcome import DefinitionUnavailable, Idle, Outcome
from runifold.worker._registry import WorkflowRegistry
from runifold.worker._values import LeaseDuration, WorkerId

log = get_logger("runifold.worker")

# Runs this worker cannot execute (version not registered, corrupt history) are
# skipped by later claims; the set is bounded so a long-lived worker cannot grow.
_MAX_SKIPPED = 10_000


@final
class WorkflowWorker:
    """Claims runs of its registry's workflows and drives them.

    Args:
        store: the durable control plane.
        registry: the definitions this worker can run.
        worker_id: written into every lease it takes.
        lease: how long a claim lasts without renewal.
        renew_every: how often the lease is renewed while a run executes;
            must be shorter than ``lease``.
    """

    def __init__(
        self,
        store: WorkflowStore,
        registry: WorkflowRegistry,
        worker_id: WorkerId,
        lease: LeaseDuration,
        renew_every: timedelta,
    ) -> None:
        if not isinstance(worker_id, WorkerId):
            raise ConfigurationError("worker_id must be a WorkerId; build one with WorkerId.parse('worker-1')")
        if not isinstance(lease, LeaseDuration):
            raise ConfigurationError("lease must be a LeaseDuration, e.g. LeaseDuration(timedelta(seconds=30))")
        if not isinstance(renew_every, timedelta) or not timedelta(0) < renew_every < lease.value:
            raise ConfigurationError(
                f"renew_every must be a positive timedelta shorter than the lease ({lease.value}), "
                f"got {renew_every!r}; a third of the lease is a good choice"
            )
        self.store = store
        self.registry = registry
        self.worker_id = worker_id
        self.lease = lease
        self.renew_every = renew_every
        self._skipped: set[str] = set()
        self._lacking: set[tuple[str, int]] = set()  # the (name, version)s of runs met that it does not register

    async def run_once(self) -> Outcome:
        """Claim at most one run and drive it until it completes, fails, suspends or loses its lease."""
        claim = await self._claim()
        if claim is None:
            return Idle()
        return await self._drive(claim)

    async def _claim(self) -> Claim | None:
        return await self.store.claim(str(self.worker_id), self.registry.names(), self.lease.seconds, self._skipped)

    async def _drive(self, claim: Claim) -> Outcome:
        """Drive a claimed run."""
        definition = self.registry.get(claim.name, claim.version)
        if definition is None:
            # invariant: the run is handed back untouched for a worker that has this version; skipped first,
            # so another slot of this worker does not claim it the moment it is released
            self._skip(claim.run_id)
            await self.store.release(claim.lease)
            # a warning once per version a worker meets and lacks (an operator's sign that no worker serves it),
            # then info: a worker of a rolling deploy meets them at every claim
            lacking = (claim.name, claim.version)
            report = log.info if lacking in self._lacking else log.warning
            self._lacking.add(lacking)
            report("definition_unavailable", run_id=claim.run_id, name=claim.name, version=claim.version,
                   worker_id=str(self.worker_id),
                   detail="this worker does not register that version; the run stays ready for one that does")
            return DefinitionUnavailable(claim.run_id, claim.name, claim.version)
        try:
            entries = [Entry(row.seq, row.at, decode_event(row.body, where=f"{claim.run_id}#{row.seq}"))
                       for row in claim.history]
            execution = Execution.live(self.store, claim, definition, entries, str(self.worker_id),
                                       self.lease.seconds, self.renew_every.total_seconds(), self.registry)
        except SerializationError:
            self._skip(claim.run_id)
            await self.store.release(claim.lease)
            raise
        return await execution.run()

    def _skip(self, run_id: str) -> None:
        if len(self._skipped) >= _MAX_SKIPPED:
            self._skipped.clear()
        self._skipped.add(run_id)
