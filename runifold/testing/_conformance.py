"""The store conformance suite: the protocol's guarantees, checked against any store.

Subclass :class:`StoreConformance` and provide an async ``store`` fixture that
yields a fresh, empty store. Tests use real time with short leases, so they
also hold for stores judged on a database clock.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from runifold.errors import (
    EnqueueConflictError,
    InvalidInputError,
    InvalidStateError,
    LeaseLostError,
    RunNotFoundError,
    SerializationError,
    SignalConflictError,
    SignalRejectedError,
)
from runifold.history import RunCancelled, RunCompleted, StepCompleted, decode_event
from runifold.stores import (
    AuditRecord,
    Continue,
    EventRow,
    Finish,
    Lease,
    Reschedule,
    RunStatus,
    SignalDelivery,
    SignalReceipt,
    Suspend,
    WorkflowTask,
)

from runifold.testing._conformance_schedules import ScheduleAndLimitConformance

LEASE = 30.0


def step_row(key: str, output: Any = None) -> EventRow:
    """An encoded ``step_completed`` event."""
    return EventRow.of(StepCompleted(key=key, output=output))


def delivery(ref: str, run_id: str, signal_id: str, name: str = "approval", payload: Any = None,
             max_unconsumed: int = 1000) -> SignalDelivery:
    """A signal delivery as the gateway hands it to a store (``run_id``: the run ``ref`` resolved to)."""
    payload = {"ok": True} if payload is None else payload
    return SignalDelivery(ref, run_id, signal_id, name, payload, "alice", "k1", "because",
                          "sha256:" + hashlib.sha256(repr(payload).encode("utf-8", "backslashreplace")).hexdigest(), max_unconsumed)


async def deliver(store: Any, ref: str, signal_id: str, name: str = "approval", payload: Any = None,
                  max_unconsumed: int = 1000) -> SignalReceipt:
    """Resolve ``ref`` once, as the gateway does, and deliver a signal to that run."""
    run = await store.get_run(ref)
    receipt: SignalReceipt = await store.deliver_signal(
        delivery(ref, run.run_id, signal_id, name, payload, max_unconsumed))
    return receipt


class StoreConformance(ScheduleAndLimitConformance):
    """Guarantees every ``WorkflowStore`` keeps. Provide a ``store`` fixture."""

    async def _claimed(self, store: Any, checkpoint_id: str = "c1", lease: float = LEASE) -> Lease:
        await store.enqueue(WorkflowTask("wf", 1, {"x": 1}, checkpoint_id=checkpoint_id))
        claim = await store.claim("w1", {"wf"}, lease)
        assert claim is not None
        held: Lease = claim.lease
        return held

    async def test_enqueue_is_idempotent_by_checkpoint_id(self, store: Any) -> None:
        """The same task under one checkpoint id yields the same run, created once."""
        first = await store.enqueue(WorkflowTask("wf", 1, {"x": 1}, checkpoint_id="c1"))
        again = await store.enqueue(WorkflowTask("wf", 1, {"x": 1}, checkpoint_id="c1"))
        assert first.created and not again.created and first.run_id == again.run_id
        assert len(await store.list_runs()) == 1
        # inputs compare as JSON values: key order aside, 1.0 is the number 1 (and -0.0 is 0)
        same = await store.enqueue(WorkflowTask("wf", 1, {"f": 1, "x": [0, 2.5]}, checkpoint_id="c2"))
        for spelled in ({"x": [-0.0, 2.5], "f": 1.0}, {"f": 1.0, "x": [0.0, 2.5]}):
            assert (await store.enqueue(WorkflowTask("wf", 1, spelled, checkpoint_id="c2"))).run_id == same.run_id
        history = await store.history("c2")
        assert decode_event(history[0].body).input == {"f": 1, "x": [0, 2.5]}  # type: ignore[union-attr]
        with pytest.raises(EnqueueConflictError):  # a different number is a different task
            await store.enqueue(WorkflowTask("wf", 1, {"f": 1.5, "x": [0, 2.5]}, checkpoint_id="c2"))
        # so is another parent's child: a checkpoint id never names the child of two parents
        parent = (await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="p1"))).run_id
        other = (await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="p2"))).run_id
        child = await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="k1", parent_run_id=parent))
        again = await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="k1", parent_run_id=parent))
        assert again.run_id == child.run_id and not again.created
        for stranger in (other, None):
            with pytest.raises(EnqueueConflictError):
                await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="k1", parent_run_id=stranger))

    async def test_enqueue_conflict_keeps_the_original(self, store: Any) -> None:
        """A different task under a used checkpoint id is refused and changes nothing."""
        first = await store.enqueue(WorkflowTask("wf", 1, {"x": 1}, checkpoint_id="c1"))
        with pytest.raises(EnqueueConflictError) as err:
            await store.enqueue(WorkflowTask("wf", 1, {"x": 2}, checkpoint_id="c1"))
        assert err.value.run_id == first.run_id
        history = await store.history("c1")
        assert [e.type for e in history] == ["run_started"]
        assert decode_event(history[0].body).input == {"x": 1}  # type: ignore[union-attr]

    async def test_history_opens_with_run_started(self, store: Any) -> None:
        """A new run's log is one run_started event at seq 1 and its revision is 1."""
        await store.enqueue(WorkflowTask("wf", 3, {"x": 1}, checkpoint_id="c1"))
        info = await store.get_run("c1")
        history = await store.history(info.run_id)
        assert [(e.seq, e.type) for e in history] == [(1, "run_started")]
        assert info.revision == 1 and info.status is RunStatus.READY and info.version == 3

    async def test_unknown_run_is_a_clear_error(self, store: Any) -> None:
        """Looking up a run that does not exist raises RunNotFoundError."""
        with pytest.raises(RunNotFoundError):
            await store.get_run("nope")

    async def test_claim_takes_a_lease_with_a_growing_token(self, store: Any) -> None:
        """Each claim of a run carries a larger fencing token than the last."""
        lease = await self._claimed(store)
        assert await store.claim("w2", {"wf"}, LEASE) is None  # held
        await store.release(lease)
        again = await store.claim("w2", {"wf"}, LEASE)
        assert again is not None and again.lease.token > lease.token and again.lease.owner == "w2"

    async def test_claim_respects_names_and_exclusions(self, store: Any) -> None:
        """A claim only takes runs of the given names and not excluded ids."""
        result = await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
        assert await store.claim("w1", {"other"}, LEASE) is None
        assert await store.claim("w1", {"wf"}, LEASE, exclude={result.run_id}) is None
        assert await store.claim("w1", {"wf"}, LEASE) is not None

    async def test_commit_appends_in_order(self, store: Any) -> None:
        """A commit appends events with contiguous seqs and sets the revision to the last."""
        lease = await self._claimed(store)
        result = await store.commit(lease, 1, [step_row("a#1", 1), step_row("b#1", 2)], Continue())
        assert result.revision == 3
        history = await store.history("c1")
        assert [(e.seq, e.key) for e in history] == [(1, ""), (2, "a#1"), (3, "b#1")]
        assert (await store.get_run("c1")).revision == 3

    async def test_stale_revision_is_fenced_and_writes_nothing(self, store: Any) -> None:
        """A commit from an outdated revision raises LeaseLostError and leaves the log as it was."""
        lease = await self._claimed(store)
        await store.commit(lease, 1, [step_row("a#1")], Continue())
        with pytest.raises(LeaseLostError):
            await store.commit(lease, 1, [step_row("b#1")], Continue())
        assert [e.key for e in await store.history("c1")] == ["", "a#1"]

    async def test_concurrent_commits_are_fenced_one_by_one(self, store: Any) -> None:
        """Commits of several runs sent at once each land or are refused on their own, with their own transition."""
        leases = [await self._claimed(store, f"c{i}") for i in range(6)]
        await deliver(store, "c3", "early")
        await deliver(store, "c4", "used")
        results = await asyncio.gather(
            store.commit(leases[0], 1, [step_row("a#1", 1), step_row("b#1", 2)], Continue()),
            store.commit(leases[1], 1, [step_row("a#1", 1)], Continue()),
            store.commit(leases[2], 7, [step_row("a#1", 1)], Continue()),  # stale: refused
            store.commit(leases[3], 1, [], Suspend(RunStatus.WAITING, None, ("approval",))),
            store.commit(leases[4], 1, [step_row("a#1")], Suspend(RunStatus.WAITING, None, ("approval",)),
                         consumed_signals=["used"]),
            store.commit(leases[5], 1, [step_row("a#1", "done")], Finish(RunStatus.COMPLETED)),
            return_exceptions=True,
        )
        assert [getattr(r, "revision", type(r).__name__) for r in results] == [3, 2, "LeaseLostError", 1, 2, 2]
        assert [[e.key for e in await store.history(f"c{i}")] for i in range(6)] == [
            ["", "a#1", "b#1"], ["", "a#1"], [""], [""], ["", "a#1"], ["", "a#1"]]
        statuses = [(await store.get_run(f"c{i}")).status for i in range(6)]
        assert statuses == [RunStatus.RUNNING, RunStatus.RUNNING, RunStatus.RUNNING, RunStatus.WAITING,
                            RunStatus.WAITING, RunStatus.COMPLETED]
        # c3's signal beat its wait, so it is due again; c4 consumed its only signal, so it waits on
        woken = await store.claim("w2", {"wf"}, LEASE)
        assert woken is not None and woken.checkpoint_id == "c3" and [s.signal_id for s in woken.inbox] == ["early"]
        assert await store.claim("w2", {"wf"}, LEASE) is None
        # the lease of a refused commit still holds: the fence judged the revision alone
        await store.commit(leases[2], 1, [step_row("a#1")], Continue())

    async def test_concurrent_step_commits_are_fenced_one_by_one(self, store: Any) -> None:
        """Step commits of several runs sent at once, none changing a status: the stale one alone is refused."""
        leases = [await self._claimed(store, f"s{i}") for i in range(3)]
        results = await asyncio.gather(
            store.commit(leases[0], 1, [step_row("a#1", 1)], Continue()),
            store.commit(leases[1], 4, [step_row("a#1", 1)], Continue()),  # stale: refused
            store.commit(leases[2], 1, [step_row("a#1", 1), step_row("b#1", 2)], Continue()),
            return_exceptions=True,
        )
        assert [getattr(r, "revision", type(r).__name__) for r in results] == [2, "LeaseLostError", 3]
        assert [[e.key for e in await store.history(f"s{i}")] for i in range(3)] == [
            ["", "a#1"], [""], ["", "a#1", "b#1"]]
        assert [(await store.get_run(f"s{i}")).revision for i in range(3)] == [2, 1, 3]

    async def test_expired_lease_is_taken_over_and_fenced(self, store: Any) -> None:
        """After expiry another worker claims the run; the old holder can neither commit nor renew."""
        old = await self._claimed(store, lease=0.2)
        await asyncio.sleep(0.35)
        new = await store.claim("w2", {"wf"}, LEASE)
        for _ in range(50):  # (seen once on a loaded machine, cause unknown: no run claimed right after the expiry)
            if new is not None:
                break
            await asyncio.sleep(0.1)
            new = await store.claim("w2", {"wf"}, LEASE)
        assert new is not None and new.lease.token > old.token
        before = await store.history("c1")
        with pytest.raises(LeaseLostError):
            await store.commit(old, 1, [step_row("a#1")], Continue())
        with pytest.raises(LeaseLostError):
            await store.renew(old, LEASE)
        assert await store.history("c1") == before
        await store.commit(new.lease, 1, [step_row("a#1")], Continue())

    async def test_expired_lease_cannot_commit_even_unclaimed(self, store: Any) -> None:
        """A holder whose lease expired cannot commit, even before anyone else claims."""
        lease = await self._claimed(store, lease=0.2)
        await asyncio.sleep(0.35)
        with pytest.raises(LeaseLostError):
            await store.commit(lease, 1, [step_row("a#1")], Continue())

    async def test_renew_extends_the_lease(self, store: Any) -> None:
        """A renewed lease outlives its first expiry."""
        lease = await self._claimed(store, lease=0.4)
        await asyncio.sleep(0.2)
        lease = await store.renew(lease, 0.4)
        await asyncio.sleep(0.3)
        assert await store.claim("w2", {"wf"}, LEASE) is None
        await store.commit(lease, 1, [step_row("a#1")], Continue())

    async def test_release_leaves_the_run_untouched(self, store: Any) -> None:
        """A released run keeps its log and revision and is claimable at once."""
        lease = await self._claimed(store)
        await store.release(lease)
        info = await store.get_run("c1")
        assert info.status is RunStatus.READY and info.revision == 1 and info.lease_owner is None
        assert await store.claim("w2", {"wf"}, LEASE) is not None

    async def test_finished_runs_are_never_claimed(self, store: Any) -> None:
        """A committed Finish ends the run: its status is final and no claim returns it."""
        lease = await self._claimed(store)
        await store.commit(lease, 1, [step_row("a#1")], Finish(RunStatus.COMPLETED))
        info = await store.get_run("c1")
        assert info.status is RunStatus.COMPLETED and info.due_at is None and info.lease_owner is None
        assert await store.claim("w1", {"wf"}, LEASE) is None

    async def test_reschedule_waits_for_its_time(self, store: Any) -> None:
        """A rescheduled run is claimable only from its due time."""
        lease = await self._claimed(store)
        now = await store.now()
        await store.commit(lease, 1, [], Reschedule(now + 0.3))
        assert await store.claim("w1", {"wf"}, LEASE) is None
        await asyncio.sleep(0.4)
        assert await store.claim("w1", {"wf"}, LEASE) is not None

    async def test_waiting_run_wakes_on_its_signal(self, store: Any) -> None:
        """A run waiting for a signal becomes claimable when that signal arrives, not another."""
        lease = await self._claimed(store)
        await store.commit(lease, 1, [], Suspend(RunStatus.WAITING, None, ("approval",)))
        assert await store.claim("w1", {"wf"}, LEASE) is None
        await deliver(store, "c1", "s0", name="other")
        assert await store.claim("w1", {"wf"}, LEASE) is None
        receipt = await deliver(store, "c1", "s1")
        assert not receipt.duplicate
        claim = await store.claim("w1", {"wf"}, LEASE)
        assert claim is not None
        assert [s.signal_id for s in claim.inbox] == ["s0", "s1"]

    async def test_signal_before_the_wait_is_not_lost(self, store: Any) -> None:
        """A signal that arrives while the run is running wakes it as soon as it suspends on it."""
        lease = await self._claimed(store)
        await deliver(store, "c1", "s1")
        await store.commit(lease, 1, [], Suspend(RunStatus.WAITING, None, ("approval",)))
        assert await store.claim("w1", {"wf"}, LEASE) is not None

    async def test_consumed_signals_leave_the_inbox(self, store: Any) -> None:
        """Signals consumed by a commit are not offered again."""
        lease = await self._claimed(store)
        await deliver(store, "c1", "s1")
        await store.commit(lease, 1, [], Suspend(RunStatus.WAITING, None, ("approval",)), consumed_signals=["s1"])
        assert await store.claim("w1", {"wf"}, LEASE) is None

    async def test_the_inbox_holds_the_signals_no_commit_consumed_in_order(self, store: Any) -> None:
        """A running execution reads its run's inbox: the signals no commit consumed, oldest first."""
        lease = await self._claimed(store)
        run_id = lease.run_id
        assert await store.inbox(run_id) == []
        for signal_id in ("s1", "s2", "s3"):
            await deliver(store, "c1", signal_id, payload={"id": signal_id})
        inbox = await store.inbox(run_id)
        assert [(s.signal_id, s.payload) for s in inbox] == [(i, {"id": i}) for i in ("s1", "s2", "s3")]
        assert [s.received_at for s in inbox] == sorted(s.received_at for s in inbox)
        await store.commit(lease, 1, [], Continue(), consumed_signals=["s2"])
        assert [s.signal_id for s in await store.inbox(run_id)] == ["s1", "s3"]

    async def test_duplicate_signal_returns_the_original_receipt(self, store: Any) -> None:
        """A repeated signal id is acknowledged as a duplicate with the first receipt, stored once."""
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
        first = await deliver(store, "c1", "s1", payload={"n": 1})
        again = await deliver(store, "c1", "s1", payload={"n": 1})
        assert again.duplicate and again.received_at == first.received_at
        with pytest.raises(SignalConflictError) as err:  # the same id with another payload is another signal
            await deliver(store, "c1", "s1", payload={"n": 2})
        assert err.value.signal_id == "s1" and err.value.run_id == first.run_id
        claim = await store.claim("w1", {"wf"}, LEASE)
        assert claim is not None and [s.payload for s in claim.inbox] == [{"n": 1}]
        verdicts = [a.verdict for a in await store.audit("c1")]
        assert verdicts == ["accepted", "duplicate", "rejected:conflict"]

    async def test_signal_to_a_finished_run_is_kept(self, store: Any) -> None:
        """A signal to a finished run is recorded as unconsumed, never dropped."""
        lease = await self._claimed(store)
        await store.commit(lease, 1, [], Finish(RunStatus.COMPLETED))
        receipt = await deliver(store, "c1", "late")
        assert receipt.run_status is RunStatus.COMPLETED and not receipt.duplicate
        [record] = await store.audit("c1")
        assert record.verdict == "accepted" and "unconsumed" in record.detail

    async def test_rejected_signals_are_audited(self, store: Any) -> None:
        """A rejected attempt is kept in the audit log without touching the run."""
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
        info = await store.get_run("c1")
        now = await store.now()
        await store.record_rejected(AuditRecord(info.run_id, "c1", "s9", "approval", "mallory", "k9", "rejected",
                                                "sha256:y", "", "bad signature", now))
        [record] = await store.audit("c1")
        assert record.sender == "mallory" and record.detail == "bad signature"
        assert (await store.get_run("c1")).revision == info.revision

    async def test_intervene_fences_the_holder(self, store: Any) -> None:
        """An operator's append fences off the current lease holder."""
        lease = await self._claimed(store)
        await store.intervene("c1", {RunStatus.RUNNING, RunStatus.READY},
                              [EventRow.of(RunCancelled(by="ops", reason="test"))], RunStatus.CANCELLED)
        with pytest.raises(LeaseLostError) as lost:
            await store.commit(lease, 1, [step_row("a#1")], Continue())
        # the holder is told why: the run will not go on anywhere (and by a renewal alike)
        assert "the run was cancelled; nothing was written" in str(lost.value)
        with pytest.raises(LeaseLostError) as lost:
            await store.renew(lease, 30.0)
        assert "the run was cancelled; nothing was written" in str(lost.value)
        assert "another worker" not in str(lost.value)
        assert [e.type for e in await store.history("c1")] == ["run_started", "run_cancelled"]
        with pytest.raises(InvalidStateError):
            await store.intervene("c1", {RunStatus.PARKED}, [], RunStatus.READY)

    async def test_list_runs_filters(self, store: Any) -> None:
        """Listing filters by status, name and version."""
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
        await store.enqueue(WorkflowTask("wf", 2, {}, checkpoint_id="c2"))
        await store.enqueue(WorkflowTask("other", 1, {}, checkpoint_id="c3"))
        assert {r.checkpoint_id for r in await store.list_runs(name="wf")} == {"c1", "c2"}
        assert [r.checkpoint_id for r in await store.list_runs(name="wf", version=2)] == ["c2"]
        assert len(await store.list_runs(status=RunStatus.READY)) == 3
        assert await store.list_runs(status=RunStatus.COMPLETED) == []

    async def test_list_runs_and_count_runs_take_several_statuses(self, store: Any) -> None:
        """``status`` may be a collection: the runs in any of its statuses (none for an empty one), newest first,
        paged by ``after`` as with one status; a bad status in it is refused like a single one."""
        lease = await self._claimed(store, "done")
        await store.commit(lease, 1, [], Finish(RunStatus.COMPLETED))
        ids = sorted([(await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id=ref))).run_id
                      for ref in ("r1", "r2", "r3")], reverse=True)
        running = await store.claim("w1", {"wf"}, LEASE)
        assert running is not None
        unfinished = [RunStatus.READY, RunStatus.RUNNING, RunStatus.WAITING]
        listed = await store.list_runs(status=unfinished)
        assert [r.run_id for r in listed] == ids
        assert sorted(r.status for r in listed) == sorted([RunStatus.READY, RunStatus.READY, RunStatus.RUNNING])
        assert [r.run_id for r in await store.list_runs(status=unfinished, limit=2, after=ids[0])] == ids[1:]
        assert [r.checkpoint_id for r in await store.list_runs(status=frozenset({RunStatus.COMPLETED}))] == ["done"]
        assert await store.list_runs(status=()) == []
        assert await store.count_runs(status=unfinished) == 3
        assert await store.count_runs(status=(RunStatus.COMPLETED, RunStatus.READY)) == 3
        assert await store.count_runs(status=[]) == 0
        for bad in ([RunStatus.READY, "nope"], ["ready", None]):
            with pytest.raises(InvalidInputError, match="status must be one of"):
                await store.list_runs(status=bad)
            with pytest.raises(InvalidInputError, match="status must be one of"):
                await store.count_runs(status=bad)

    async def test_purge_deletes_only_finished_runs(self, store: Any) -> None:
        """A finished run can be purged with its history; an unfinished one cannot."""
        lease = await self._claimed(store)
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="keep"))
        with pytest.raises(InvalidStateError):
            await store.purge("c1")
        await store.commit(lease, 1, [], Finish(RunStatus.COMPLETED))
        await deliver(store, "c1", "late")
        await store.purge("c1")
        with pytest.raises(RunNotFoundError):
            await store.get_run("c1")
        assert await store.audit("c1") == []
        assert [r.checkpoint_id for r in await store.list_runs()] == ["keep"]
        await store.enqueue(WorkflowTask("wf", 1, {"x": 2}, checkpoint_id="c1"))  # the id is free again

    # -- run references -------------------------------------------------------------

    async def test_a_checkpoint_id_never_takes_a_run_ids_place(self, store: Any) -> None:
        """A checkpoint id may not start with run_, so a run id always names its own run (the old data-loss case)."""
        old = await store.enqueue(WorkflowTask("wf", 1, {"n": 1}))
        with pytest.raises(InvalidInputError, match="run_"):
            WorkflowTask("wf", 1, {"n": 2}, checkpoint_id=old.run_id)
        new = await store.enqueue(WorkflowTask("wf", 1, {"n": 2}, checkpoint_id="new"))
        for ref in (old.run_id, "new"):
            await store.intervene(ref, {RunStatus.READY}, [EventRow.of(RunCancelled(by="ops", reason="t"))],
                                  RunStatus.CANCELLED)
        await store.purge(old.run_id)
        with pytest.raises(RunNotFoundError):
            await store.get_run(old.run_id)
        assert (await store.get_run("new")).run_id == new.run_id
        assert [e.type for e in await store.history(new.run_id)] == ["run_started", "run_cancelled"]
        with pytest.raises(RunNotFoundError):  # a reference in the run-id namespace is never a checkpoint id
            await store.get_run("run_" + new.run_id[4:][::-1])

    async def test_a_delivery_goes_to_the_run_id_it_names(self, store: Any) -> None:
        """The store delivers to delivery.run_id, the run the gateway resolved, and does not look run_ref up again."""
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="a"))
        b = await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="b"))
        receipt = await store.deliver_signal(delivery("a", b.run_id, "s1"))
        assert receipt.run_id == b.run_id
        claims = [await store.claim("w", {"wf"}, LEASE) for _ in range(2)]
        inboxes = {c.checkpoint_id: [s.signal_id for s in c.inbox] for c in claims if c is not None}
        assert inboxes == {"a": [], "b": ["s1"]}
        [record] = await store.audit("b")
        assert record.run_id == b.run_id and record.run_ref == "a"
        with pytest.raises(RunNotFoundError):
            await store.deliver_signal(delivery("b", "run_000000000000000000000000", "s2"))

    # -- values -----------------------------------------------------------------------

    async def test_nul_and_any_valid_unicode_are_kept_the_same_everywhere(self, store: Any) -> None:
        """NUL, line separators and astral characters in inputs, step outputs and payloads come back unchanged."""
        text = "nul \x00 sep \u2028 emoji \U0001f600 quote \" back \\"
        await store.enqueue(WorkflowTask("wf", 1, {"text": text}, checkpoint_id="c1"))
        claim = await store.claim("w1", {"wf"}, LEASE)
        assert claim is not None
        await deliver(store, "c1", "s1", payload={"text": text})
        await store.commit(claim.lease, 1, [step_row("a#1", {"text": text})], Suspend(RunStatus.WAITING, None, ("approval",)))
        history = await store.history("c1")
        assert decode_event(history[0].body).input == {"text": text}  # type: ignore[union-attr]
        assert decode_event(history[1].body).output == {"text": text}  # type: ignore[union-attr]
        again = await store.claim("w1", {"wf"}, LEASE)
        assert again is not None and [s.payload for s in again.inbox] == [{"text": text}]

    async def test_text_no_store_can_keep_is_refused_at_the_call(self, store: Any) -> None:
        """Invalid Unicode anywhere, and NUL in an identifier, are refused before any store sees them."""
        with pytest.raises(SerializationError):
            WorkflowTask("wf", 1, {"x": "lone \ud800"})
        with pytest.raises(InvalidInputError):
            WorkflowTask("wf", 1, {}, checkpoint_id="nul\x00id")
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
        with pytest.raises(SerializationError):
            await deliver(store, "c1", "s1", payload={"x": "lone \udc80"})
        with pytest.raises(SerializationError):
            await deliver(store, "c1", "nul\x00id")
        lease = (await store.claim("w1", {"wf"}, LEASE)).lease
        # a reason is display text: kept with NUL and lone surrogates replaced, never a failed commit
        await store.commit(lease, 1, [], Finish(RunStatus.FAILED, "boom \x00 \udcff"))
        assert (await store.get_run("c1")).reason == "boom \ufffd \ufffd"

    # -- retries --------------------------------------------------------------------------

    async def test_a_retried_commit_recognises_its_own_write(self, store: Any) -> None:
        """The same commit sent again (its answer lost) succeeds with the same revision and writes nothing more."""
        lease = await self._claimed(store)
        first = await store.commit(lease, 1, [step_row("a#1", 1)], Continue())
        again = await store.commit(lease, 1, [step_row("a#1", 1)], Continue())
        assert first.revision == again.revision == 2
        with pytest.raises(LeaseLostError):  # another commit from that revision is not a retry
            await store.commit(lease, 1, [step_row("a#1", 2)], Continue())
        done = await store.commit(lease, 2, [], Suspend(RunStatus.WAITING, None, ("approval",), "waits"))
        assert (await store.commit(lease, 2, [], Suspend(RunStatus.WAITING, None, ("approval",), "waits"))).revision \
            == done.revision == 2
        with pytest.raises(LeaseLostError):
            await store.commit(lease, 2, [], Finish(RunStatus.COMPLETED))
        assert [e.key for e in await store.history("c1")] == ["", "a#1"]

    async def test_enqueue_many_is_one_transaction(self, store: Any) -> None:
        """enqueue_many answers each task in order; a conflict anywhere enqueues nothing."""
        await store.enqueue(WorkflowTask("wf", 1, {"x": 1}, checkpoint_id="have"))
        results = await store.enqueue_many([
            WorkflowTask("wf", 1, {"x": 1}, checkpoint_id="have"), WorkflowTask("wf", 1, {}, checkpoint_id="n1"),
            WorkflowTask("wf", 1, {}), WorkflowTask("wf", 1, {}, checkpoint_id="n1")])
        assert [r.created for r in results] == [False, True, True, False]
        assert results[1].run_id == results[3].run_id and len({r.run_id for r in results}) == 3
        with pytest.raises(EnqueueConflictError):
            await store.enqueue_many([WorkflowTask("wf", 1, {}, checkpoint_id="n2"),
                                      WorkflowTask("wf", 1, {"x": 2}, checkpoint_id="have")])
        with pytest.raises(RunNotFoundError):
            await store.get_run("n2")
        assert await store.count_runs() == 3
        assert await store.enqueue_many([]) == []

    # -- claims ---------------------------------------------------------------------------

    async def test_recoveries_count_takeovers_of_expired_leases(self, store: Any) -> None:
        """A claim of a run whose lease expired counts a recovery; a claim of a released run does not."""
        lease = await self._claimed(store, lease=0.2)
        await asyncio.sleep(0.35)
        taken = await store.claim("w2", {"wf"}, LEASE)
        assert taken is not None and taken.recoveries == 1 and (await store.get_run("c1")).recoveries == 1
        await store.release(taken.lease)
        again = await store.claim("w3", {"wf"}, LEASE)
        assert again is not None and again.recoveries == 1 and lease.token < again.lease.token

    async def test_a_diverged_run_is_claimed_again_at_its_time(self, store: Any) -> None:
        """Suspend(DIVERGED, wake_at) makes the run diverged and due at wake_at, not before."""
        lease = await self._claimed(store)
        await store.commit(lease, 1, [], Suspend(RunStatus.DIVERGED, await store.now() + 0.3, reason="code changed"))
        info = await store.get_run("c1")
        assert info.status is RunStatus.DIVERGED and info.due_at is not None and info.reason == "code changed"
        assert await store.claim("w1", {"wf"}, LEASE) is None
        await asyncio.sleep(0.4)
        assert await store.claim("w1", {"wf"}, LEASE) is not None

    # -- signals --------------------------------------------------------------------------

    async def test_a_full_inbox_refuses_new_signals(self, store: Any) -> None:
        """A run holding max_unconsumed unconsumed signals refuses another (audited); a duplicate still answers."""
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
        for i in range(2):
            await deliver(store, "c1", f"s{i}", max_unconsumed=2)
        with pytest.raises(SignalRejectedError) as err:
            await deliver(store, "c1", "s2", max_unconsumed=2)
        assert err.value.verdict == "inbox_full"
        assert (await deliver(store, "c1", "s1", max_unconsumed=2)).duplicate
        assert [a.verdict for a in await store.audit("c1")] == ["accepted", "accepted", "rejected:inbox_full",
                                                                  "duplicate"]
        # counted per signal name: another name still has room
        assert not (await deliver(store, "c1", "t0", name="other", max_unconsumed=2)).duplicate

    async def test_rejected_attempts_are_capped_per_run(self, store: Any) -> None:
        """record_rejected keeps the newest max_per_run rejected attempts of a run, and of unknown runs ten times that."""
        run = await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
        await deliver(store, "c1", "ok")
        for i in range(5):
            await store.record_rejected(AuditRecord(run.run_id, "c1", f"bad{i}", "approval", "mallory", "k", "rejected:bad",
                                                    "h", "", "", 0.0), max_per_run=3)
            await store.record_rejected(AuditRecord(None, "nope", f"bad{i}", "x\x00", "m", "k", "rejected:unknown_run",
                                                    "h", "", "", 0.0), max_per_run=0)
        assert [a.signal_id for a in await store.audit("c1")] == ["ok", "bad2", "bad3", "bad4"]
        assert await store.audit("nope") == []

    # -- operators --------------------------------------------------------------------------

    async def test_wake_makes_a_waiting_run_due_now(self, store: Any) -> None:
        """wake makes a ready, waiting or diverged run due now without an event, and explains why it cannot for others."""
        lease = await self._claimed(store)
        with pytest.raises(InvalidStateError, match="running"):
            await store.wake("c1")
        await store.commit(lease, 1, [], Suspend(RunStatus.WAITING, await store.now() + 3600))
        assert await store.claim("w1", {"wf"}, LEASE) is None
        info = await store.wake("c1")
        assert info.status is RunStatus.WAITING and info.revision == 1
        again = await store.claim("w1", {"wf"}, LEASE)
        assert again is not None
        await store.commit(again.lease, 1, [], Suspend(RunStatus.PARKED, reason="ambiguous"))
        with pytest.raises(InvalidStateError, match="resolve"):
            await store.wake("c1")
        await store.intervene("c1", {RunStatus.PARKED}, [EventRow.of(RunCancelled(by="o", reason="r"))],
                              RunStatus.CANCELLED)
        with pytest.raises(InvalidStateError, match="it has finished"):
            await store.wake("c1")
        with pytest.raises(RunNotFoundError):
            await store.wake("nope")

    async def test_list_runs_pages_and_counts(self, store: Any) -> None:
        """list_runs pages newest first with an after cursor; count_runs counts with the same filters."""
        ids = [(await store.enqueue(WorkflowTask("wf", 1, {"i": i}))).run_id for i in range(5)]
        await store.enqueue(WorkflowTask("other", 1, {}))
        first = await store.list_runs(name="wf", limit=2)
        second = await store.list_runs(name="wf", limit=2, after=first[-1].run_id)
        rest = await store.list_runs(name="wf", limit=2, after=second[-1].run_id)
        paged = [r.run_id for r in first + second + rest]
        assert paged == sorted(ids, reverse=True)
        assert await store.count_runs(name="wf") == 5 and await store.count_runs() == 6
        assert await store.count_runs(status=RunStatus.COMPLETED) == 0
        for i in range(3):  # runs of a concurrency key: counted by key, and by key and status
            await store.enqueue(WorkflowTask("keyed", 1, {"i": i}, concurrency_key="k", concurrency_limit=2))
        assert await store.claim("w", ["keyed"], 30.0) is not None
        assert await store.count_runs(concurrency_key="k") == 3 and await store.count_runs(concurrency_key="z") == 0
        assert await store.count_runs(status=RunStatus.RUNNING, concurrency_key="k") == 1
        assert await store.count_runs(concurrency_key="k", holding_slot=True) == 1
        # a run whose lease expired (its worker died) is still running, but holds no slot
        assert await store.claim("w", ["keyed"], 0.2) is not None
        assert await store.count_runs(concurrency_key="k", holding_slot=True) == 2
        await asyncio.sleep(0.35)
        assert await store.count_runs(status=RunStatus.RUNNING, concurrency_key="k") == 2
        assert await store.count_runs(concurrency_key="k", holding_slot=True) == 1

    async def test_purge_finished_deletes_old_finished_runs_in_batches(self, store: Any) -> None:
        """purge_finished deletes at most limit finished runs updated before the cutoff, and nothing unfinished."""
        for i in range(3):
            lease = await self._claimed(store, f"f{i}")
            await store.commit(lease, 1, [], Finish(RunStatus.COMPLETED))
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="open"))
        cutoff = await store.now() + 1
        assert await store.purge_finished(cutoff, limit=2) == 2
        assert await store.purge_finished(cutoff, limit=2) == 1
        assert await store.purge_finished(cutoff) == 0
        assert [r.checkpoint_id for r in await store.list_runs()] == ["open"]
        assert await store.purge_finished(0.0) == 0

    async def test_a_finished_child_posts_its_last_event_to_its_parent(self, store: Any) -> None:
        """Rule 6: a child run that finishes (commit or operator) posts its last event to its parent, once, waking it."""
        parent = await store.enqueue(WorkflowTask("parent", 1, {}, checkpoint_id="p1"))
        first = await store.enqueue(WorkflowTask("child", 1, {}, checkpoint_id="k1", parent_run_id=parent.run_id))
        second = await store.enqueue(WorkflowTask("child", 1, {}, checkpoint_id="k2", parent_run_id=parent.run_id))
        claim = await store.claim("w1", {"parent"}, LEASE)
        assert claim is not None
        names = (f"child:{first.run_id}", f"child:{second.run_id}")
        await store.commit(claim.lease, 1, [], Suspend(RunStatus.WAITING, signals=names))
        claim = await store.claim("w1", {"child"}, LEASE, exclude={second.run_id})
        assert claim is not None and claim.run_id == first.run_id
        await store.commit(claim.lease, 1, [step_row("a#1", 1)], Continue())
        assert (await store.get_run("p1")).due_at is None  # a step is not an end: the parent sleeps on
        await store.commit(claim.lease, 2, [EventRow.of(RunCompleted(output={"n": 1}))], Finish(RunStatus.COMPLETED))
        assert (await store.get_run("p1")).due_at is not None  # woken: it waits for that signal
        await store.intervene(second.run_id, {RunStatus.READY}, [EventRow.of(RunCancelled(by="ops", reason="no"))],
                              RunStatus.CANCELLED)
        parent_claim = await store.claim("w1", {"parent"}, LEASE)
        assert parent_claim is not None and parent_claim.run_id == parent.run_id
        payloads = {s.name: s.payload for s in parent_claim.inbox}
        assert payloads == {
            names[0]: {"type": "run_completed", "output": {"n": 1}},
            names[1]: {"type": "run_cancelled", "by": "ops", "reason": "no"},
        }
        assert all(s.sender == "runifold" for s in parent_claim.inbox)
