"""The in-memory store: the same semantics as the durable stores, no durability.

For unit tests and experiments. Every method runs without awaiting inside its
critical section, so each is atomic on the event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import final

from runifold.errors import EnqueueConflictError, LeaseLostError, RunNotFoundError
from runifold.stores._protocol import (
    AuditRecord,
    Claim,
    CommitResult,
    EnqueueResult,
    EventRow,
    InboxSignal,
    Lease,
    RunInfo,
    RunStatus,
    SignalDelivery,
    SignalReceipt,
    StoredEvent,
    Transition,
    WorkflowTask,
    new_run_id,
    not_allowed,
    not_finished,
    same_task,
    transition_columns,
)


@dataclass
class _Run:
    run_id: str
    checkpoint_id: str | None
    name: str
    version: int
    input_json: bytes
    status: RunStatus
    revision: int
    due_at: float | None
    created_at: float
    updated_at: float
    lease_owner: str | None = None
    lease_token: int = 0
    lease_until: float | None = None
    wait_signals: tuple[str, ...] = ()
    reason: str = ""
    events: list[StoredEvent] = field(default_factory=list)
    signals: dict[str, tuple[InboxSignal, bool]] = field(default_factory=dict)

    def info(self) -> RunInfo:
        return RunInfo(
            self.run_id, self.checkpoint_id, self.name, self.version, self.status, self.revision,
            self.due_at, self.lease_owner, self.lease_token, self.lease_until, self.created_at,
            self.updated_at, self.reason,
        )


@final
class MemoryWorkflowStore:
    """A :class:`WorkflowStore` held in this process's memory.

    Args:
        clock: the store's clock (seconds since the epoch); inject a fake one in tests.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._runs: dict[str, _Run] = {}
        self._by_checkpoint: dict[str, str] = {}
        self._audit: list[AuditRecord] = []
        self._work = asyncio.Event()
        # (due_at, run_id) entries; stale ones (due_at changed since) are dropped lazily
        self._due: list[tuple[float, str]] = []

    def _schedule(self, run: _Run, due_at: float | None) -> None:
        run.due_at = due_at
        if due_at is not None:
            heapq.heappush(self._due, (due_at, run.run_id))

    async def now(self) -> float:
        return self._clock()

    async def migrate(self) -> int:
        return 0  # nothing persistent to migrate

    def _find(self, ref: str) -> _Run:
        run = self._runs.get(ref) or self._runs.get(self._by_checkpoint.get(ref, ""))
        if run is None:
            raise RunNotFoundError(ref)
        return run

    def _append(self, run: _Run, events: Sequence[EventRow], now: float) -> CommitResult:
        for row in events:
            run.revision += 1
            run.events.append(StoredEvent(run.revision, now, row.type, row.key, row.body))
        run.updated_at = now
        return CommitResult(run.revision, now)

    def _held(self, lease: Lease, now: float) -> _Run:
        run = self._runs.get(lease.run_id)
        if (
            run is None
            or run.status is not RunStatus.RUNNING
            or run.lease_token != lease.token
            or run.lease_until is None
            or run.lease_until <= now
        ):
            raise LeaseLostError(lease.run_id)
        return run

    @staticmethod
    def _clear_lease(run: _Run) -> None:
        run.lease_owner = None
        run.lease_until = None

    async def enqueue(self, task: WorkflowTask) -> EnqueueResult:
        if task.checkpoint_id is not None and task.checkpoint_id in self._by_checkpoint:
            existing = self._runs[self._by_checkpoint[task.checkpoint_id]]
            if same_task(task, existing.name, existing.version, existing.input_json):
                return EnqueueResult(existing.run_id, False)
            raise EnqueueConflictError(task.checkpoint_id, existing.run_id)
        now = self._clock()
        run = _Run(new_run_id(now), task.checkpoint_id, task.name, task.version, task.input_json(),
                   RunStatus.READY, 0, now, now, now)
        self._append(run, [task.first_event()], now)
        self._runs[run.run_id] = run
        self._schedule(run, now)
        if task.checkpoint_id is not None:
            self._by_checkpoint[task.checkpoint_id] = run.run_id
        self._work.set()
        return EnqueueResult(run.run_id, True)

    async def claim(
        self, owner: str, names: Collection[str], lease_seconds: float, exclude: Collection[str] = ()
    ) -> Claim | None:
        now = self._clock()
        run: _Run | None = None
        passed_over: list[tuple[float, str]] = []
        while self._due and self._due[0][0] <= now:
            due_at, run_id = heapq.heappop(self._due)
            candidate = self._runs[run_id]
            if candidate.due_at != due_at:
                continue  # stale entry
            if candidate.name not in names or run_id in exclude:
                passed_over.append((due_at, run_id))
                continue
            run = candidate
            break
        for item in passed_over:
            heapq.heappush(self._due, item)
        if run is None:
            return None
        run.status = RunStatus.RUNNING
        run.lease_token += 1
        run.lease_owner = owner
        run.lease_until = now + lease_seconds
        self._schedule(run, run.lease_until)
        inbox = [sig for sig, consumed in run.signals.values() if not consumed]
        return Claim(run.run_id, run.checkpoint_id, run.name, run.version,
                     Lease(run.run_id, owner, run.lease_token, run.lease_until), now, list(run.events), inbox)

    async def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        now = self._clock()
        run = self._held(lease, now)
        run.lease_until = now + lease_seconds
        self._schedule(run, run.lease_until)
        return Lease(lease.run_id, lease.owner, lease.token, run.lease_until)

    async def commit(
        self,
        lease: Lease,
        expected_revision: int,
        events: Sequence[EventRow],
        transition: Transition,
        consumed_signals: Sequence[str] = (),
    ) -> CommitResult:
        now = self._clock()
        run = self._held(lease, now)
        if run.revision != expected_revision:
            raise LeaseLostError(lease.run_id, f"revision {run.revision} is not the expected {expected_revision}")
        result = self._append(run, events, now)
        for signal_id in consumed_signals:
            sig, _ = run.signals[signal_id]
            run.signals[signal_id] = (sig, True)
        columns = transition_columns(transition)
        if columns is None:
            return result
        run.status, run.wait_signals, run.reason = columns.status, columns.wait_signals, columns.reason
        due_at = columns.due_at
        if run.status is RunStatus.WAITING and any(
            sig.name in run.wait_signals for sig, consumed in run.signals.values() if not consumed
        ):
            due_at = now  # invariant: no lost wakeup for a signal that beat the wait
        self._schedule(run, due_at)
        self._clear_lease(run)
        self._work.set()
        return result

    async def release(self, lease: Lease) -> None:
        now = self._clock()
        run = self._runs.get(lease.run_id)
        if run is None or run.status is not RunStatus.RUNNING or run.lease_token != lease.token:
            return
        run.status = RunStatus.READY
        self._schedule(run, now)
        self._clear_lease(run)
        self._work.set()

    async def intervene(
        self, run_ref: str, allowed: Collection[RunStatus], events: Sequence[EventRow], status: RunStatus
    ) -> CommitResult:
        run = self._find(run_ref)
        if run.status not in allowed:
            raise not_allowed(run.run_id, run.status, allowed)
        now = self._clock()
        result = self._append(run, events, now)
        run.lease_token += 1  # fences off any current holder
        self._clear_lease(run)
        run.status = status
        self._schedule(run, None if status.finished else now)
        self._work.set()
        return result

    async def purge(self, run_ref: str) -> None:
        run = self._find(run_ref)
        if not run.status.finished:
            raise not_finished(run.run_id, run.status)
        del self._runs[run.run_id]
        if run.checkpoint_id is not None:
            self._by_checkpoint.pop(run.checkpoint_id, None)
        self._audit = [a for a in self._audit if a.run_id != run.run_id]

    async def get_run(self, run_ref: str) -> RunInfo:
        return self._find(run_ref).info()

    async def list_runs(
        self, *, status: RunStatus | None = None, name: str | None = None, version: int | None = None, limit: int = 100
    ) -> list[RunInfo]:
        runs = [
            r.info() for r in self._runs.values()
            if (status is None or r.status is status) and (name is None or r.name == name)
            and (version is None or r.version == version)
        ]
        runs.sort(key=lambda r: r.run_id, reverse=True)
        return runs[:limit]

    async def history(self, run_ref: str) -> list[StoredEvent]:
        return list(self._find(run_ref).events)

    async def deliver_signal(self, delivery: SignalDelivery) -> SignalReceipt:
        run = self._find(delivery.run_ref)
        now = self._clock()
        if delivery.signal_id in run.signals:
            original, _ = run.signals[delivery.signal_id]
            self._audit.append(_audit(delivery, run.run_id, "duplicate", "", now))
            return SignalReceipt(run.run_id, delivery.signal_id, True, original.received_at, run.status)
        sig = InboxSignal(delivery.signal_id, delivery.name, delivery.payload, delivery.sender, delivery.reason, now)
        run.signals[delivery.signal_id] = (sig, False)
        detail = "run finished; kept unconsumed" if run.status.finished else ""
        self._audit.append(_audit(delivery, run.run_id, "accepted", detail, now))
        if run.status is RunStatus.WAITING and delivery.name in run.wait_signals:
            self._schedule(run, now)
            self._work.set()
        return SignalReceipt(run.run_id, delivery.signal_id, False, now, run.status)

    async def record_rejected(self, record: AuditRecord) -> None:
        self._audit.append(record)

    async def audit(self, run_ref: str) -> list[AuditRecord]:
        try:
            run_id: str | None = self._find(run_ref).run_id
        except RunNotFoundError:
            run_id = None
        return [a for a in self._audit if (run_id is not None and a.run_id == run_id) or a.run_ref == run_ref]

    async def wait_for_work(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._work.wait(), timeout)
        except TimeoutError:
            pass
        self._work.clear()

    async def close(self) -> None:
        return None


def _audit(delivery: SignalDelivery, run_id: str, verdict: str, detail: str, now: float) -> AuditRecord:
    return AuditRecord(run_id, delivery.run_ref, delivery.signal_id, delivery.name, delivery.sender,
                       delivery.key_id, verdict, delivery.payload_hash, delivery.reason, detail, now)
