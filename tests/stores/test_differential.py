"""The same random command sequences, sent to memory, SQLite and PostgreSQL, get the same answers and leave the same rows.

A hypothesis state machine drives the three stores side by side: enqueue (one
or many, with or without a concurrency key), claim (the concurrency rule
passes over a run whose key is at its limit), commit (also a commit sent again, as after a lost answer),
renew, release, signal delivery, cancel, resolve, wake, purge, schedules
(add, replace, pause, resume, advance, delete), and crashes: a worker that
drops its handle after its short lease ran out. After every step
each run's row, history and audit are compared across the stores. Run ids are
random per store, so answers are compared through the order in which the runs
were enqueued; times are compared only as present or absent.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runifold.history import RunCancelled
from runifold.stores import (
    CommitResult,
    Continue,
    EventRow,
    Finish,
    Lease,
    Reschedule,
    RunInfo,
    RunStatus,
    Schedule,
    ScheduleInfo,
    Suspend,
    WorkflowTask,
)
from runifold.stores.memory import MemoryWorkflowStore
from runifold.stores.sqlite import SqliteWorkflowStore
from runifold.testing._conformance import delivery, step_row
from tests.conftest import require_postgres, reset_postgres

KINDS = ("memory", "sqlite", "postgres")
SHORT_LEASE = 0.15  # a crashed worker's lease: the rule waits it out
FAR = 3600.0
UNFINISHED = frozenset({RunStatus.READY, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.PARKED, RunStatus.DIVERGED})
TRANSITIONS: list[Callable[[float], Any]] = [
    lambda now: Continue(),
    lambda now: Finish(RunStatus.COMPLETED),
    lambda now: Finish(RunStatus.FAILED, "boom"),
    lambda now: Suspend(RunStatus.WAITING, None, ("go",), "signal go"),
    lambda now: Suspend(RunStatus.WAITING, now + FAR, ("go", "stop"), "go or timer"),
    lambda now: Suspend(RunStatus.WAITING, now - 1, (), "timer due"),
    lambda now: Suspend(RunStatus.PARKED, reason="ambiguous"),
    lambda now: Suspend(RunStatus.DIVERGED, now - 1, reason="diverged"),
    lambda now: Reschedule(now + FAR, "backoff"),
]


@dataclass
class Handle:
    """A worker's claim on one logical run, as each store answered it."""

    run: int
    leases: dict[str, Lease]
    revision: int
    inbox: list[str]
    last_commit: tuple[Any, ...] | None = None
    gone: bool = False


@dataclass
class Stores:
    loop: asyncio.AbstractEventLoop
    folder: str
    by_kind: dict[str, Any] = field(default_factory=dict)
    run_ids: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})

    def all(self, op: Callable[[str, Any], Awaitable[Any]]) -> dict[str, Any]:
        """Run ``op`` on every store; return each one's answer, or its exception's type name."""
        answers = {}
        for kind in KINDS:
            try:
                answers[kind] = self.loop.run_until_complete(op(kind, self.by_kind[kind]))
            except Exception as exc:
                answers[kind] = type(exc).__name__
        return answers


class DifferentialMachine(RuleBasedStateMachine):
    """Memory, SQLite and PostgreSQL under the same commands."""

    def __init__(self) -> None:
        super().__init__()
        self.s = Stores(asyncio.new_event_loop(), tempfile.mkdtemp(prefix="runifold-diff-"))
        dsn = require_postgres()

        async def open_all() -> None:
            await reset_postgres(dsn)
            from runifold.stores.postgres import PostgresWorkflowStore

            self.s.by_kind = {
                "memory": MemoryWorkflowStore(),
                "sqlite": await SqliteWorkflowStore.open(f"{self.s.folder}/runifold.db"),
                "postgres": await PostgresWorkflowStore.open(dsn),
            }

        self.s.loop.run_until_complete(open_all())
        self.handles: list[Handle] = []
        self.runs = 0

    def teardown(self) -> None:
        async def close_all() -> None:
            for store in self.s.by_kind.values():
                await store.close()

        self.s.loop.run_until_complete(close_all())
        self.s.loop.close()
        shutil.rmtree(self.s.folder, ignore_errors=True)

    # -- helpers ------------------------------------------------------------------

    def same(self, answers: dict[str, Any]) -> Any:
        """Assert every store answered alike (after mapping run ids to logical runs); return the answer."""
        normal = {kind: self.logical(kind, answer) for kind, answer in answers.items()}
        assert normal["memory"] == normal["sqlite"] == normal["postgres"], normal
        return answers

    def logical(self, kind: str, value: Any) -> Any:
        ids = self.s.run_ids[kind]
        if isinstance(value, str) and value in ids:
            return f"run#{ids.index(value)}"
        if isinstance(value, RunInfo):
            return (self.logical(kind, value.run_id), value.checkpoint_id, value.name, value.status, value.revision,
                    value.due_at is None, value.lease_owner, value.lease_token, value.lease_until is None,
                    value.reason, value.recoveries)
        if isinstance(value, CommitResult):
            return ("commit", value.revision)
        if isinstance(value, (list, tuple)):
            return [self.logical(kind, v) for v in value]
        if isinstance(value, frozenset):
            return sorted(self.logical(kind, v) for v in value)
        return value

    def ref(self, kind: str, run: int) -> str:
        return self.s.run_ids[kind][run]

    def checkpoint_of(self, run: int) -> str | None:
        try:
            info = self.s.loop.run_until_complete(self.s.by_kind["memory"].get_run(self.ref("memory", run)))
        except Exception:
            return None
        return info.checkpoint_id

    def live(self) -> list[Handle]:
        return [h for h in self.handles if not h.gone]

    # -- commands -------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.enqueue(None, 1, None)

    @rule(checkpoint=st.sampled_from([None, "a", "b"]), x=st.integers(1, 2),
          limit=st.sampled_from([None, ("k", 1), ("k", 2), ("j", 1)]))
    def enqueue(self, checkpoint: str | None, x: int, limit: tuple[str, int] | None) -> None:
        key, most = limit or (None, None)
        task = WorkflowTask(f"wf{self.runs}", 1, {"x": x}, checkpoint_id=checkpoint, concurrency_key=key,
                            concurrency_limit=most)
        if checkpoint is not None:  # reusing a checkpoint names an existing run's workflow
            known = [i for i in range(self.runs) if self.checkpoint_of(i) == checkpoint]
            if known:
                task = WorkflowTask(f"wf{known[0]}", 1, {"x": x}, checkpoint_id=checkpoint)
        answers = self.s.all(lambda kind, store: store.enqueue(task))
        self.record_new(answers)

    @rule(count=st.integers(0, 3), conflict=st.booleans())
    def enqueue_many(self, count: int, conflict: bool) -> None:
        tasks = [WorkflowTask(f"wf{self.runs + i}", 1, {}) for i in range(count)]
        if conflict:
            tasks.append(WorkflowTask("other", 1, {"x": 3}, checkpoint_id="a"))
        answers = self.s.all(lambda kind, store: store.enqueue_many(tasks))
        if all(isinstance(a, list) for a in answers.values()):
            for i in range(len(tasks)):
                self.record_new({k: a[i] for k, a in answers.items()})
        else:
            self.same(answers)

    def record_new(self, answers: dict[str, Any]) -> None:
        created = {k: getattr(a, "created", a) for k, a in answers.items()}
        assert len(set(created.values())) == 1, answers
        if created["memory"] is True:
            for kind, answer in answers.items():
                self.s.run_ids[kind].append(answer.run_id)
            self.runs += 1
        elif created["memory"] is False:
            self.same({k: a.run_id for k, a in answers.items()})

    @rule(run=st.integers(0, 20), short=st.booleans())
    def claim(self, run: int, short: bool) -> None:
        """Claim the run of one workflow (one name per run: the stores' order of equal due times never matters);
        a run whose concurrency key is at its limit is not claimed."""
        run = run % self.runs
        lease = SHORT_LEASE if short else 30.0
        answers = self.s.all(lambda kind, store: store.claim("w", {f"wf{run}"}, lease))
        got = {k: a for k, a in answers.items() if a is not None and not isinstance(a, str)}
        self.same({k: None if a is None or isinstance(a, str) else
                   (a.run_id, a.checkpoint_id, a.lease.token, a.recoveries,
                    [(e.seq, e.type, e.key, e.body) for e in a.history],
                    [(s.signal_id, s.name, s.payload) for s in a.inbox]) for k, a in answers.items()})
        if got:
            any_claim = next(iter(got.values()))
            handle = Handle(run, {k: a.lease for k, a in got.items()}, any_claim.history[-1].seq,
                            [s.signal_id for s in any_claim.inbox])
            self.handles.append(handle)
            if short:  # the worker crashes: its handle stays (a zombie), its lease runs out
                time.sleep(SHORT_LEASE + 0.05)

    @rule(short=st.booleans())
    def claim_two_of_a_key(self, short: bool) -> None:
        """Two runs of a key allowed one at a time, each claimed: the second is passed over while a run of the key runs."""
        for x in (1, 2):
            self.enqueue(None, x, ("one", 1))
            self.claim(self.runs - 1, short and x == 1)

    @precondition(lambda self: self.live())
    @rule(pick=st.integers(0, 50), events=st.integers(0, 2), which=st.integers(0, len(TRANSITIONS) - 1),
          stale=st.booleans(), consume=st.booleans())
    def commit(self, pick: int, events: int, which: int, stale: bool, consume: bool) -> None:
        handle = self.live()[pick % len(self.live())]
        expected = handle.revision - 1 if stale and handle.revision > 1 else handle.revision
        rows = [step_row(f"s{handle.revision}-{i}", {"i": i, "nul": "\x00"}) for i in range(events)]
        transition = TRANSITIONS[which](time.time())
        consumed = handle.inbox if consume else []
        args = (expected, rows, transition, consumed)
        answers = self.same(self.s.all(lambda kind, store: store.commit(handle.leases[kind], *args)))
        handle.last_commit = args
        if not isinstance(answers["memory"], str):
            handle.revision = answers["memory"].revision
            handle.inbox = [] if consume else handle.inbox
            if transition != Continue():
                handle.gone = True

    @precondition(lambda self: any(h.last_commit for h in self.handles))
    @rule(pick=st.integers(0, 50))
    def commit_again(self, pick: int) -> None:
        """The last commit of a handle sent again, as a retry after a lost answer."""
        done = [h for h in self.handles if h.last_commit]
        handle = done[pick % len(done)]
        assert handle.last_commit is not None
        self.same(self.s.all(lambda kind, store: store.commit(handle.leases[kind], *handle.last_commit)))

    @precondition(lambda self: self.handles)
    @rule(pick=st.integers(0, 50), release=st.booleans())
    def renew_or_release(self, pick: int, release: bool) -> None:
        handle = self.handles[pick % len(self.handles)]
        if release:
            self.same(self.s.all(lambda kind, store: store.release(handle.leases[kind])))
            handle.gone = True
        else:
            self.same(self.s.all(lambda kind, store: _renewed(store.renew(handle.leases[kind], 30.0))))

    @rule(run=st.integers(0, 20), signal=st.sampled_from(["s1", "s2", "s3"]), name=st.sampled_from(["go", "stop"]),
          payload=st.sampled_from([1, "\x00", {"k": [1]}]))
    def deliver(self, run: int, signal: str, name: str, payload: Any) -> None:
        run = run % self.runs
        self.same(self.s.all(lambda kind, store: _receipt(store.deliver_signal(
            delivery(f"ref{run}", self.ref(kind, run), signal, name, payload, max_unconsumed=2)))))

    @rule(run=st.integers(0, 20), resolve=st.booleans(), decided_at=st.none() | st.integers(0, 6))
    def intervene(self, run: int, resolve: bool, decided_at: int | None) -> None:
        run = run % self.runs
        allowed, status = ({RunStatus.PARKED}, RunStatus.READY) if resolve else (UNFINISHED, RunStatus.CANCELLED)
        rows = [EventRow.of(RunCancelled(by="ops", reason="differential"))]
        self.same(self.s.all(lambda kind, store: _revision(store.intervene(self.ref(kind, run), allowed, rows, status,
                                                                           decided_at=decided_at))))

    @rule(run=st.integers(0, 20))
    def wake(self, run: int) -> None:
        run = run % self.runs
        self.same(self.s.all(lambda kind, store: store.wake(self.ref(kind, run))))

    @rule(run=st.integers(0, 20))
    def purge(self, run: int) -> None:
        run = run % self.runs
        self.same(self.s.all(lambda kind, store: store.purge(self.ref(kind, run))))

    @rule(name=st.sampled_from(["s1", "s2"]), x=st.integers(1, 2), cron=st.booleans())
    def add_schedule(self, name: str, x: int, cron: bool) -> None:
        schedule = Schedule(name, "wf0", 1, {"x": x}, cron="*/5 * * * *" if cron else None,
                            every=None if cron else timedelta(seconds=5))
        self.same(self.s.all(lambda kind, store: _schedule(store.add_schedule(schedule))))

    @rule(name=st.sampled_from(["s1", "s2", "s3"]), op=st.sampled_from(["pause", "resume", "delete", "advance"]))
    def change_schedule(self, name: str, op: str) -> None:
        async def change(kind: str, store: Any) -> Any:
            if op == "delete":
                return await store.delete_schedule(name)
            if op == "advance":
                return await store.advance_schedules({name: time.time() + 3600})
            return await _schedule(store.pause_schedule(name, paused=op == "pause"))

        self.same(self.s.all(change))

    # -- rows -------------------------------------------------------------------------

    @invariant()
    def rows_agree(self) -> None:
        for run in range(self.runs):
            self.same(self.s.all(lambda kind, store: store.get_run(self.ref(kind, run))))
            self.same(self.s.all(lambda kind, store: _events(store.history(self.ref(kind, run)))))
            self.same(self.s.all(lambda kind, store: _audit(store.audit(self.ref(kind, run)))))
        self.same(self.s.all(lambda kind, store: store.count_runs()))
        self.same(self.s.all(lambda kind, store: _schedules(store.list_schedules())))
        for status in (RunStatus.READY, RunStatus.RUNNING, RunStatus.WAITING):
            self.same(self.s.all(lambda kind, store: _ids(store.list_runs(status=status))))


async def _renewed(renewing: Awaitable[Lease]) -> tuple[str, int]:
    lease = await renewing
    return lease.run_id, lease.token


async def _receipt(delivering: Awaitable[Any]) -> tuple[Any, ...]:
    r = await delivering
    return r.run_id, r.signal_id, r.duplicate, r.run_status


async def _revision(committing: Awaitable[Any]) -> int:
    return int((await committing).revision)


async def _events(reading: Awaitable[Any]) -> list[tuple[Any, ...]]:
    return [(e.seq, e.type, e.key, e.body) for e in await reading]


async def _audit(reading: Awaitable[Any]) -> list[tuple[Any, ...]]:
    return [(a.run_ref, a.signal_id, a.name, a.verdict, a.detail) for a in await reading]


async def _schedule(changing: Awaitable[ScheduleInfo]) -> tuple[Any, ...]:
    info = await changing
    return info.schedule, info.paused


async def _schedules(listing: Awaitable[list[ScheduleInfo]]) -> list[tuple[Any, ...]]:
    """Each schedule's definition, state, and whether it started a tick since it was last changed."""
    return [(i.schedule, i.paused, i.last_tick > i.updated_at) for i in await listing]


async def _ids(listing: Awaitable[list[RunInfo]]) -> frozenset[str]:
    return frozenset(r.run_id for r in await listing)


DifferentialMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_memory_sqlite_and_postgres_agree() -> None:
    """Random sequences of every store command get the same answers and rows from all three stores."""
    require_postgres()
    DifferentialMachine.TestCase().runTest()
