"""Real worker processes killed with SIGKILL or frozen with SIGSTOP mid-step."""

from __future__ import annotations

import os
import signal

from runifold import WorkflowTask, open_store
from runifold.history import fold
from tests.crash.conftest import CrashEnv
from tests.support import entries

LEASE = 1.0


async def test_killed_worker_is_recovered_by_another(crash_env: CrashEnv) -> None:
    """SIGKILL during a step: after the lease expires a worker with another id finishes; completed steps are not repeated, the in-flight one runs again, usage never decreases."""
    store = await open_store(crash_env.url)
    try:
        await store.enqueue(WorkflowTask("crashy", 1, {"order_id": "ord_42"}, checkpoint_id="ord_42"))
        (crash_env.tmp / "block").touch()
        first = crash_env.spawn("worker-a", LEASE)
        crash_env.wait_for("inflight")
        first.send_signal(signal.SIGKILL)
        first.wait()
        usage_at_crash = fold(await entries(store, "ord_42")).usage
        assert crash_env.counts() == {"prepare": 1, "slow": 1}
        (crash_env.tmp / "block").unlink()
        second = crash_env.spawn("worker-b", LEASE)
        out, _ = second.communicate(timeout=60)
        assert out.strip().splitlines()[-1] == "Completed", out
        assert crash_env.counts() == {"prepare": 1, "slow": 2, "finish": 1}
        history = await entries(store, "ord_42")
        usage_after = fold(history).usage
        assert usage_after.steps >= usage_at_crash.steps and usage_after.steps == 3
        assert [e.event.key for e in history if e.event.key] == ["prepare#1", "slow#1", "finish#1"]
        assert [e.seq for e in history] == list(range(1, len(history) + 1))
        assert (await store.get_run("ord_42")).lease_owner is None
    finally:
        await store.close()


async def test_frozen_worker_is_fenced_after_takeover(crash_env: CrashEnv) -> None:
    """A worker frozen past its lease is replaced; when it wakes its commit is refused (LeaseLost) and the log is unchanged."""
    store = await open_store(crash_env.url)
    try:
        await store.enqueue(WorkflowTask("crashy", 1, {"order_id": "o1"}, checkpoint_id="o1"))
        (crash_env.tmp / "block").touch()
        frozen = crash_env.spawn("worker-a", LEASE)
        crash_env.wait_for("inflight")
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            (crash_env.tmp / "block").unlink()
            rescuer = crash_env.spawn("worker-b", LEASE)
            out, _ = rescuer.communicate(timeout=60)
            assert out.strip().splitlines()[-1] == "Completed", out
            settled = await store.history("o1")
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        out, _ = frozen.communicate(timeout=60)
        assert out.strip().splitlines()[-1] == "LeaseLost", out
        assert await store.history("o1") == settled
        assert crash_env.counts()["finish"] == 1
    finally:
        await store.close()


async def _kill_in_flight(crash_env: CrashEnv, times: int) -> None:
    for i in range(times):
        (crash_env.tmp / "inflight").unlink(missing_ok=True)
        worker = crash_env.spawn(f"worker-{i}", LEASE)
        crash_env.wait_for("inflight")
        worker.send_signal(signal.SIGKILL)
        worker.wait()


async def test_a_step_that_kills_its_worker_exhausts_the_step_budget(crash_env: CrashEnv) -> None:
    """Each recovery counts as a step execution: with max_steps=1, the first recovery fails the run, not a loop."""
    store = await open_store(crash_env.url)
    try:
        await store.enqueue(WorkflowTask("crash-loop", 1, {"order_id": "o1"}, checkpoint_id="o1"))
        (crash_env.tmp / "block").touch()
        await _kill_in_flight(crash_env, 1)
        out, _ = crash_env.spawn("worker-last", LEASE).communicate(timeout=60)
        assert out.strip().splitlines()[-1] == "Failed", out
        info = await store.get_run("o1")
        assert info.status == "failed" and info.recoveries == 1
        assert "budget exceeded: steps would reach 2" in info.reason
        assert crash_env.counts() == {"slow": 1}  # the step did not run again
    finally:
        await store.close()


async def test_recoveries_of_one_run_are_capped(crash_env: CrashEnv) -> None:
    """A run recovered more often than its budget's max_recoveries fails with that reason instead of running again."""
    store = await open_store(crash_env.url)
    try:
        await store.enqueue(WorkflowTask("crash-loop-recoveries", 1, {"order_id": "o2"}, checkpoint_id="o2"))
        (crash_env.tmp / "block").touch()
        await _kill_in_flight(crash_env, 3)
        out, _ = crash_env.spawn("worker-last", LEASE).communicate(timeout=60)
        assert out.strip().splitlines()[-1] == "Failed", out
        info = await store.get_run("o2")
        assert info.recoveries == 3 and "recoveries would reach 3" in info.reason
        assert crash_env.counts() == {"slow": 3}
    finally:
        await store.close()
