"""The in-memory store: the same semantics as the durable stores, no durability.

For unit tests and experiments. Every method runs without awaiting inside its
critical section, so each is atomic on the event loop. What each operation
writes is decided by :mod:`runifold.stores._rule`.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import final

import msgspec

from runifold.errors import (
    EnqueueConflictError,
    LeaseLostError,
    RunNotFoundError,
    ScheduleNotFoundError,
    SignalConflictError,
)
from runifold.stores import _rule
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
    clean_audit,
    check_listing,
    listed_statuses,
    check_purge,
    clean_text,
    new_run_id,
    ref_column,
    transition_columns,
)
from runifold.stores._schedule import Schedule, ScheduleInfo, check_schedule_name


@dataclass
class _Signal:
    inbox: InboxSignal
    payload_hash: str
    consumed: bool = False


@dataclass
class _Run:
    run_id: str
    checkpoint_id: str | None
    name: str
    version: int
    input_json: str
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
    recoveries: int = 0
    parent_run_id: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    events: list[StoredEvent] = field(default_factory=list)
    signals: dict[str, _Signal] = field(default_factory=dict)

    def info(self) -> RunInfo:
        return RunInfo(
            self.run_id, self.checkpoint_id, self.name, self.version, self.status, self.revision,
            self.due_at, self.lease_owner, self.lease_token, self.lease_until, self.created_at,
            self.updated_at, self.reason, self.recoveries, concurrency_key=self.concurrency_key,
            concurrency_limit=self.concurrency_limit,
        )

    def state(self) -> _rule.RunState:
        return _rule.RunState(self.status, self.revision, self.lease_token, self.lease_until, self.wait_signals,
                              self.reason)

    def unconsumed(self) -> list[_Signal]:
        return [s for s in self.signals.values() if not s.consumed]


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
        self._finish_waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._schedules: dict[str, ScheduleInfo] = {}

    def _schedule(self, run: _Run, due_at: float | None) -> None:
        run.due_at = due_at
        if due_at is not None:
            heapq.heappush(self._due, (due_at, run.run_id))
            self._work.set()

    async def now(self) -> float:
        return self._clock()

    @property
    def local_clock(self) -> Callable[[], float]:
        """The store's clock, readable in this process: a worker on this store reads it directly (so time
        moves only when the clock does, as a test's fake clock), where on other stores it counts the time
        elapsed since the claim's reading of the store's clock."""
        return self._clock

    async def migrate(self) -> int:
        return 0  # nothing persistent to migrate

    def _find(self, ref: str) -> _Run:
        run_id = ref if ref_column(ref) == "run_id" else self._by_checkpoint.get(ref, "")
        run = self._runs.get(run_id)
        if run is None:
            raise RunNotFoundError(ref)
        return run

    def _append(self, run: _Run, events: Sequence[EventRow], now: float) -> CommitResult:
        for row in events:
            run.revision += 1
            run.events.append(StoredEvent(run.revision, now, row.type, row.key, row.body))
        run.updated_at = now
        return CommitResult(run.revision, now)

    @staticmethod
    def _clear_lease(run: _Run) -> None:
        run.lease_owner = None
        run.lease_until = None

    async def enqueue(self, task: WorkflowTask) -> EnqueueResult:
        return (await self.enqueue_many([task]))[0]

    async def enqueue_many(self, tasks: Sequence[WorkflowTask]) -> list[EnqueueResult]:
        now = self._clock()
        staged: dict[str, tuple[_Run, WorkflowTask]] = {}
        by_checkpoint: dict[str, str] = {}  # checkpoint ids this call creates
        results = []
        for task in tasks:
            input_json = task.input_json().decode()
            run_id = new_run_id(now)
            existing = None
            if task.checkpoint_id is not None:
                other_id = by_checkpoint.get(task.checkpoint_id) or self._by_checkpoint.get(task.checkpoint_id)
                if other_id is not None:
                    other = staged[other_id][0] if other_id in staged else self._runs[other_id]
                    existing = (other.run_id, other.name, other.version, other.input_json, other.parent_run_id)
            verdict = _rule.enqueue_verdict(existing, run_id, task.name, task.version, input_json, task.parent_run_id)
            if existing is not None and verdict == "conflict":
                raise EnqueueConflictError(task.checkpoint_id or "", existing[0])
            if existing is not None and verdict == "existing":
                results.append(EnqueueResult(existing[0], False))
                continue
            staged[run_id] = (_Run(run_id, task.checkpoint_id, task.name, task.version, input_json, RunStatus.READY,
                                   0, now, now, now, parent_run_id=task.parent_run_id,
                                   concurrency_key=task.concurrency_key, concurrency_limit=task.concurrency_limit),
                              task)
            if task.checkpoint_id is not None:
                by_checkpoint[task.checkpoint_id] = run_id
            results.append(EnqueueResult(run_id, True))
        # invariant: nothing is written unless every task was accepted
        for run, task in staged.values():
            self._append(run, [task.first_event()], now)
            self._runs[run.run_id] = run
            self._schedule(run, now)
        self._by_checkpoint.update(by_checkpoint)
        return results

    async def claim(
        self, owner: str, names: Collection[str], lease_seconds: float, exclude: Collection[str] = ()
    ) -> Claim | None:
        now = self._clock()
        run: _Run | None = None
        passed_over: list[tuple[float, str]] = []
        while self._due and self._due[0][0] <= now:
            due_at, run_id = heapq.heappop(self._due)
            candidate = self._runs.get(run_id)
            if candidate is None or candidate.due_at != due_at:
                continue  # stale entry
            if candidate.name not in names or run_id in exclude or self._at_limit(candidate, now):
                passed_over.append((due_at, run_id))
                continue
            run = candidate
            break
        for item in passed_over:
            heapq.heappush(self._due, item)
        if run is None:
            return None
        if _rule.recovered(run.state()):
            run.recoveries += 1
        run.status = RunStatus.RUNNING
        run.lease_token += 1
        run.lease_owner = owner
        run.lease_until = now + lease_seconds
        run.updated_at = now
        self._schedule(run, run.lease_until)
        inbox = [s.inbox for s in run.unconsumed()]
        return Claim(run.run_id, run.checkpoint_id, run.name, run.version,
                     Lease(run.run_id, owner, run.lease_token, run.lease_until), now, list(run.events), inbox,
                     recoveries=run.recoveries)

    def _at_limit(self, run: _Run, now: float) -> bool:
        if run.concurrency_key is None:
            return False
        running = sum(1 for r in self._runs.values() if r.concurrency_key == run.concurrency_key
                      and _rule.holds_slot(r.status, r.lease_until, now))
        return _rule.passed_over(run.concurrency_limit, running)

    async def renew(self, lease: Lease, lease_seconds: float) -> Lease:
        now = self._clock()
        run = self._runs.get(lease.run_id)
        if _rule.fence(None if run is None else run.state(), lease, run.revision if run else 0, now) is not None:
            raise LeaseLostError(lease.run_id, _rule.renewal_refused(None if run is None else run.status))
        assert run is not None
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
        run = self._runs.get(lease.run_id)
        state = None if run is None else run.state()
        columns = transition_columns(transition)
        refused = _rule.fence(state, lease, expected_revision, now)
        if refused is not None:
            if run is not None:
                stored = [(e.type, e.key, e.body.decode()) for e in run.events[expected_revision:]]
                if _rule.is_own_retry(state, lease, expected_revision, events, columns, stored):
                    return CommitResult(run.revision, run.events[-1].at if events else run.updated_at)
            raise LeaseLostError(lease.run_id, refused)
        assert run is not None
        result = self._append(run, events, now)
        for signal_id in consumed_signals:
            if signal_id in run.signals:
                run.signals[signal_id].consumed = True
        if columns is None:
            return result
        run.status, run.wait_signals, run.reason = columns.status, columns.wait_signals, columns.reason
        self._clear_lease(run)
        self._schedule(run, _rule.commit_due(columns, now, {s.inbox.name for s in run.unconsumed()}))
        self._notify_parent(run, events, now)
        if run.concurrency_key is not None:
            self._work.set()  # a slot of its key is free: runs passed over may be claimed now
        return result

    def _notify_parent(self, run: _Run, events: Sequence[EventRow], now: float) -> None:
        """Rule 6: a finished child posts its last event to its parent's inbox; awaiting clients wake."""
        if run.status.finished:
            for waiter in self._finish_waiters.pop(run.run_id, ()):
                if not waiter.done():
                    waiter.set_result(None)
        last = events[-1].body.decode() if events else None
        if not _rule.child_notice(run.status, run.parent_run_id, last):
            return
        parent = self._runs.get(run.parent_run_id or "")
        name = _rule.child_signal(run.run_id)
        if parent is None or name in parent.signals:
            return
        assert last is not None
        signal = InboxSignal(name, name, msgspec.json.decode(last), _rule.CHILD_SENDER, "child run finished", now)
        parent.signals[name] = _Signal(signal, "child")
        if _rule.signal_wakes(parent.status, parent.wait_signals, name):
            self._schedule(parent, now)

    async def release(self, lease: Lease) -> None:
        now = self._clock()
        run = self._runs.get(lease.run_id)
        if run is None or run.status is not RunStatus.RUNNING or run.lease_token != lease.token:
            return
        run.status = RunStatus.READY
        self._clear_lease(run)
        self._schedule(run, now)

    async def intervene(
        self, run_ref: str, allowed: Collection[RunStatus], events: Sequence[EventRow], status: RunStatus,
        reason: str = "", *, decided_at: int | None = None,
    ) -> CommitResult:
        run = self._find(run_ref)
        refused = _rule.intervene_refusal(run.run_id, run.status, allowed, run.revision, decided_at)
        if refused is not None:
            raise refused
        now = self._clock()
        result = self._append(run, events, now)
        run.lease_token += 1  # fences off any current holder
        self._clear_lease(run)
        run.status, run.reason = status, clean_text(reason)
        self._schedule(run, _rule.intervene_due(status, now))
        self._notify_parent(run, events, now)
        if run.concurrency_key is not None:
            self._work.set()
        return result

    async def wake(self, run_ref: str) -> RunInfo:
        run = self._find(run_ref)
        refused = _rule.wake_refusal(run.run_id, run.status)
        if refused is not None:
            raise refused
        self._schedule(run, self._clock())
        return run.info()

    async def purge(self, run_ref: str) -> None:
        run = self._find(run_ref)
        refused = _rule.purge_refusal(run.run_id, run.status)
        if refused is not None:
            raise refused
        self._delete(run)

    def _delete(self, run: _Run) -> None:
        del self._runs[run.run_id]
        if run.checkpoint_id is not None:
            self._by_checkpoint.pop(run.checkpoint_id, None)
        self._audit = [a for a in self._audit if a.run_id != run.run_id]

    async def purge_finished(self, before: float, *, limit: int = 1000) -> int:
        before, limit = check_purge(before, limit)
        finished = sorted((r for r in self._runs.values() if r.status.finished and r.updated_at < before),
                          key=lambda r: r.run_id)[:limit]
        for run in finished:
            self._delete(run)
        return len(finished)

    async def get_run(self, run_ref: str) -> RunInfo:
        return self._find(run_ref).info()

    def _matching(self, status: RunStatus | Collection[RunStatus] | None, name: str | None,
                  version: int | None) -> list[_Run]:
        statuses = listed_statuses(status)
        return [
            r for r in self._runs.values()
            if (statuses is None or r.status.value in statuses) and (name is None or r.name == name)
            and (version is None or r.version == version)
        ]

    async def list_runs(
        self,
        *,
        status: RunStatus | Collection[RunStatus] | None = None,
        name: str | None = None,
        version: int | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[RunInfo]:
        limit = check_listing(status=status, name=name, after=after, limit=limit, version=version)
        runs = [r.info() for r in self._matching(status, name, version) if after is None or r.run_id < after]
        runs.sort(key=lambda r: r.run_id, reverse=True)
        return runs[:limit]

    async def count_runs(
        self, *, status: RunStatus | Collection[RunStatus] | None = None, name: str | None = None,
        version: int | None = None, concurrency_key: str | None = None, holding_slot: bool = False,
    ) -> int:
        check_listing(status=status, name=name, version=version, concurrency_key=concurrency_key,
                      holding_slot=holding_slot)
        now = self._clock()
        return sum(1 for r in self._matching(status, name, version)
                   if (concurrency_key is None or r.concurrency_key == concurrency_key)
                   and (not holding_slot or _rule.holds_slot(r.status, r.lease_until, now)))

    async def history(self, run_ref: str) -> list[StoredEvent]:
        return list(self._find(run_ref).events)

    async def inbox(self, run_id: str) -> list[InboxSignal]:
        return [s.inbox for s in self._find(run_id).unconsumed()]

    async def deliver_signal(self, delivery: SignalDelivery) -> SignalReceipt:
        payload = msgspec.json.decode(delivery.payload_json())
        run = self._runs.get(delivery.run_id)
        if run is None:
            raise RunNotFoundError(delivery.run_id)
        now = self._clock()
        found = run.signals.get(delivery.signal_id)
        existing = None if found is None else (found.inbox.name, found.payload_hash, found.inbox.sender,
                                               found.inbox.reason)
        unconsumed = sum(s.inbox.name == delivery.name for s in run.unconsumed())
        verdict, detail = _rule.signal_verdict(delivery, existing, unconsumed, run.status.finished)
        self._audit.append(_audit(delivery, verdict, detail, now))
        if verdict != "accepted":
            self._trim_refused(run.run_id, delivery.max_refused)
        if verdict == "rejected:conflict":
            raise SignalConflictError(run.run_id, delivery.signal_id)
        if verdict == "rejected:inbox_full":
            raise _rule.inbox_full(run.run_id, delivery.name, delivery.max_unconsumed)
        if found is not None:
            return SignalReceipt(run.run_id, delivery.signal_id, True, found.inbox.received_at, run.status)
        sig = InboxSignal(delivery.signal_id, delivery.name, payload, delivery.sender, delivery.reason, now)
        run.signals[delivery.signal_id] = _Signal(sig, delivery.payload_hash)
        if _rule.signal_wakes(run.status, run.wait_signals, delivery.name):
            self._schedule(run, now)
        return SignalReceipt(run.run_id, delivery.signal_id, False, now, run.status)

    async def record_rejected(self, record: AuditRecord, *, max_per_run: int = 1000) -> None:
        self._audit.append(clean_audit(record))
        self._trim_refused(record.run_id, max_per_run)

    def _trim_refused(self, run_id: str | None, max_per_run: int) -> None:
        cap = _rule.refused_cap(run_id, max_per_run)
        mine = [a for a in self._audit if a.run_id == run_id and a.verdict != "accepted"]
        drop = {id(a) for a in mine[:len(mine) - cap]} if len(mine) > cap else set()
        if drop:
            self._audit = [a for a in self._audit if id(a) not in drop]

    async def audit(self, run_ref: str) -> list[AuditRecord]:
        try:
            run_id: str | None = self._find(run_ref).run_id
        except RunNotFoundError:
            run_id = None
        return [a for a in self._audit if (run_id is not None and a.run_id == run_id) or a.run_ref == run_ref]

    async def wait_for_finish(self, run_id: str, timeout: float | None) -> None:
        """Return when ``run_id`` finishes, or after ``timeout``."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._finish_waiters.setdefault(run_id, set()).add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            self._finish_waiters.get(run_id, set()).discard(waiter)

    async def wait_for_work(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._work.wait(), timeout)
        except TimeoutError:
            pass
        self._work.clear()

    async def add_schedule(self, schedule: Schedule) -> ScheduleInfo:
        now = self._clock()
        found = self._schedules.get(schedule.name)
        verdict = _rule.schedule_added(None if found is None else found.schedule.definition(), schedule.definition())
        if found is not None and verdict == "unchanged":
            return found
        paused = found is not None and found.paused
        info = ScheduleInfo(schedule, paused, now, found.created_at if found else now, now)
        self._schedules[schedule.name] = info
        return info

    async def delete_schedule(self, name: str) -> None:
        check_schedule_name(name)
        if self._schedules.pop(name, None) is None:
            raise ScheduleNotFoundError(name)

    async def list_schedules(self) -> list[ScheduleInfo]:
        return [self._schedules[name] for name in sorted(self._schedules)]

    async def pause_schedule(self, name: str, *, paused: bool = True) -> ScheduleInfo:
        check_schedule_name(name)
        found = self._schedules.get(name)
        if found is None:
            raise ScheduleNotFoundError(name)
        now = self._clock()
        last_tick = found.last_tick if paused else _rule.resumed_last_tick(found.paused, found.last_tick, now)
        info = ScheduleInfo(found.schedule, paused, last_tick, found.created_at, now)
        self._schedules[name] = info
        return info

    async def advance_schedules(self, ticks: Mapping[str, float]) -> None:
        for name, tick in ticks.items():
            found = self._schedules.get(name)
            if found is not None and tick > found.last_tick:
                self._schedules[name] = ScheduleInfo(found.schedule, found.paused, tick, found.created_at,
                                                     found.updated_at)

    async def close(self) -> None:
        return None


def _audit(delivery: SignalDelivery, verdict: str, detail: str, now: float) -> AuditRecord:
    return AuditRecord(delivery.run_id, delivery.run_ref, delivery.signal_id, delivery.name, delivery.sender,
                       delivery.key_id, verdict, delivery.payload_hash, delivery.reason, detail, now)

