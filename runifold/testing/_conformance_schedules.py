"""The conformance suite's part on concurrency limits (the claim rule) and on schedules (their rows).

Mixed into :class:`runifold.testing.StoreConformance`; same ``store`` fixture.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from runifold.errors import InvalidInputError, ScheduleNotFoundError
from runifold.stores import Finish, Reschedule, RunStatus, Schedule, Suspend, WorkflowTask

LEASE = 30.0


def keyed(checkpoint_id: str, key: str | None = "pay", limit: int | None = 2, name: str = "wf") -> WorkflowTask:
    """A task of ``name`` under ``checkpoint_id`` with a concurrency key and limit (None: neither)."""
    return WorkflowTask(name, 1, {}, checkpoint_id=checkpoint_id, concurrency_key=key,
                        concurrency_limit=None if key is None else limit)


async def claimed_ids(store: Any, count: int, names: frozenset[str] = frozenset({"wf"})) -> list[str | None]:
    """The checkpoint ids of ``count`` claims made one after another (None: the claim found nothing)."""
    found: list[str | None] = []
    for _ in range(count):
        claim = await store.claim("w1", names, LEASE)
        found.append(None if claim is None else claim.checkpoint_id)
    return found


class ScheduleAndLimitConformance:
    """How every store applies concurrency limits in the claim, and keeps schedules."""

    # -- concurrency limits ------------------------------------------------------------

    async def test_a_run_keeps_its_concurrency_key(self, store: Any) -> None:
        """A task's concurrency key and limit are kept on its run's row; a task without them has neither."""
        await store.enqueue_many([keyed("k1", limit=3), keyed("u1", key=None)])
        one, other = await store.get_run("k1"), await store.get_run("u1")
        assert (one.concurrency_key, one.concurrency_limit) == ("pay", 3)
        assert (other.concurrency_key, other.concurrency_limit) == (None, None)
        listed = {r.checkpoint_id: (r.concurrency_key, r.concurrency_limit) for r in await store.list_runs()}
        assert listed == {"k1": ("pay", 3), "u1": (None, None)}

    async def test_the_claim_passes_over_a_run_whose_key_is_at_its_limit(self, store: Any) -> None:
        """With two of a key's runs running, a third stays due and the claim takes the next run; a finished run frees its slot."""
        for ref in ("k1", "k2", "k3"):
            await store.enqueue(keyed(ref))
        await store.enqueue(keyed("u1", key=None))
        first = await store.claim("w1", {"wf"}, LEASE)
        assert first is not None and first.checkpoint_id == "k1"
        assert await claimed_ids(store, 3) == ["k2", "u1", None]
        waiting = await store.get_run("k3")
        assert waiting.status is RunStatus.READY and waiting.due_at is not None
        await store.commit(first.lease, 1, [], Finish(RunStatus.COMPLETED))
        assert await claimed_ids(store, 2) == ["k3", None]

    async def test_a_run_that_stops_running_frees_its_slot(self, store: Any) -> None:
        """A run that suspends, is rescheduled, released or cancelled holds no slot of its key."""
        for ref in ("k1", "k2"):
            await store.enqueue(keyed(ref, limit=1))
        now = await store.now()
        for transition in (Suspend(RunStatus.WAITING, None, ("go",)), Reschedule(now + 3600)):
            claim = await store.claim("w1", {"wf"}, LEASE)
            assert claim is not None and await store.claim("w1", {"wf"}, LEASE) is None
            await store.commit(claim.lease, claim.history[-1].seq, [], transition)
        assert await claimed_ids(store, 1) == [None]  # k1 waits, k2 is rescheduled: nothing of the key is due
        await store.enqueue(keyed("k3", limit=1))
        held = await store.claim("w1", {"wf"}, LEASE)
        assert held is not None and held.checkpoint_id == "k3"
        await store.release(held.lease)
        again = await store.claim("w1", {"wf"}, LEASE)
        assert again is not None and again.checkpoint_id == "k3"
        await store.enqueue(keyed("k4", limit=1))
        await store.intervene("k3", {RunStatus.RUNNING}, [], RunStatus.CANCELLED)
        assert await claimed_ids(store, 2) == ["k4", None]

    async def test_an_expired_lease_holds_no_slot(self, store: Any) -> None:
        """A running run whose lease expired frees its slot: the next run of its key is claimed, then the expired one waits."""
        await store.enqueue(keyed("k1", limit=1))
        stale = await store.claim("w1", {"wf"}, 0.2)
        assert stale is not None
        await store.enqueue(keyed("k2", limit=1))
        assert await claimed_ids(store, 1) == [None]
        await asyncio.sleep(0.35)
        assert await claimed_ids(store, 2) == ["k2", None]  # k1 is due (its lease expired) but k2 holds the slot

    async def test_keys_are_counted_apart(self, store: Any) -> None:
        """Runs of different keys never hold each other's slots, whatever their workflow."""
        await store.enqueue_many([keyed("a1", "customer:a", 1), keyed("a2", "customer:a", 1),
                                  keyed("b1", "customer:b", 1, name="other"), keyed("b2", "customer:b", 1)])
        got = await claimed_ids(store, 4, frozenset({"wf", "other"}))
        assert got[2:] == [None, None] and sorted(str(ref)[0] for ref in got[:2]) == ["a", "b"]

    async def test_concurrent_claims_never_exceed_a_limit(self, store: Any) -> None:
        """Claims sent at once take at most the limit's number of a key's runs, and the runs without a key besides."""
        await store.enqueue_many([keyed(f"k{i}", limit=3) for i in range(10)] + [keyed(f"u{i}", key=None) for i in range(4)])
        claims = await asyncio.gather(*(store.claim(f"w{i}", {"wf"}, LEASE) for i in range(12)))
        got = sorted(c.checkpoint_id for c in claims if c is not None)
        assert len([r for r in got if r.startswith("k")]) == 3 and [r for r in got if r.startswith("u")] == \
            ["u0", "u1", "u2", "u3"]
        assert await store.count_runs(status=RunStatus.RUNNING) == 7

    async def test_claims_sent_together_count_what_they_took(self, store: Any) -> None:
        """Claims sent together that pass over a run and take the next one of the same key still stop at its limit."""
        for i in range(6):
            await store.enqueue(keyed(f"k{i}"))
        claims = await asyncio.gather(*(store.claim(f"w{i}", {"wf"}, LEASE) for i in range(3)))
        assert sorted(c.checkpoint_id for c in claims if c is not None) == ["k0", "k1"]
        assert await store.count_runs(status=RunStatus.RUNNING) == 2

    async def test_a_task_names_a_key_and_a_limit_together(self, store: Any) -> None:
        """A concurrency key without a limit, a limit without a key, or a limit below 1 is refused at the call."""
        for key, limit in (("pay", None), (None, 2), ("pay", 0), ("", 1)):
            with pytest.raises(InvalidInputError):
                WorkflowTask("wf", 1, {}, concurrency_key=key, concurrency_limit=limit)
        assert await store.count_runs() == 0

    # -- schedules -----------------------------------------------------------------------

    async def test_a_schedule_is_kept_replaced_and_deleted(self, store: Any) -> None:
        """A schedule is listed as added; re-adding it unchanged keeps its row, a changed one replaces it; delete removes it."""
        every = Schedule("tick", "wf", 1, {"x": 1}, every=timedelta(seconds=5))
        cron = Schedule("nightly", "wf", 2, {}, cron="0  3 * * *", timezone="Europe/Riga", catchup=timedelta(hours=1))
        before = await store.now()
        added = await store.add_schedule(every)
        await store.add_schedule(cron)
        listed = await store.list_schedules()
        assert [i.schedule for i in listed] == [cron, every]
        assert listed[0].schedule.cron == "0 3 * * *" and listed[1].schedule.input == {"x": 1}
        assert not added.paused and before <= added.last_tick == added.created_at == added.updated_at
        await asyncio.sleep(0.05)
        again = await store.add_schedule(Schedule("tick", "wf", 1, {"x": 1}, every=timedelta(seconds=5)))
        assert again == added
        await store.advance_schedules({"tick": added.last_tick + 5})
        changed = await store.add_schedule(Schedule("tick", "wf", 1, {"x": 2}, every=timedelta(seconds=5)))
        assert changed.schedule.input == {"x": 2} and changed.created_at == added.created_at
        assert added.last_tick < changed.last_tick == changed.updated_at
        await store.delete_schedule("nightly")
        assert [i.schedule.name for i in await store.list_schedules()] == ["tick"]
        with pytest.raises(ScheduleNotFoundError):
            await store.delete_schedule("nightly")

    async def test_advancing_a_schedule_only_moves_it_forward(self, store: Any) -> None:
        """advance_schedules raises last_tick, never lowers it, and ignores names no longer stored."""
        info = await store.add_schedule(Schedule("tick", "wf", 1, every=timedelta(seconds=1)))
        await store.advance_schedules({"tick": info.last_tick + 10, "gone": 1.0})
        await store.advance_schedules({"tick": info.last_tick + 5})
        [now] = await store.list_schedules()
        assert now.last_tick == info.last_tick + 10 and now.updated_at == info.updated_at

    async def test_a_resumed_schedule_skips_the_ticks_of_its_pause(self, store: Any) -> None:
        """Pausing keeps last_tick; resuming moves it to now, so ticks due while paused never start."""
        info = await store.add_schedule(Schedule("tick", "wf", 1, every=timedelta(seconds=1)))
        paused = await store.pause_schedule("tick")
        assert paused.paused and paused.last_tick == info.last_tick
        await store.add_schedule(Schedule("tick", "wf", 1, {"x": 1}, every=timedelta(seconds=1)))
        assert (await store.list_schedules())[0].paused  # a replaced schedule stays paused
        await asyncio.sleep(0.05)
        before = await store.now()
        resumed = await store.pause_schedule("tick", paused=False)
        assert not resumed.paused and resumed.last_tick >= before
        assert (await store.pause_schedule("tick", paused=False)).last_tick == resumed.last_tick
        with pytest.raises(ScheduleNotFoundError):
            await store.pause_schedule("gone")
