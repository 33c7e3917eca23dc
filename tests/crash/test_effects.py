"""Effects across real crashes (SIGKILL): applied exactly once, replayed or ambiguous by evidence, never guessed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from runifold import Resolution, RunStatus, WorkflowTask, open_store, resolve_effect
from tests.crash.conftest import CrashEnv
from tests.effects_app import registry as effects_registry
from runifold.history import EffectResolved, fold
from tests.support import entries, event_types

APP = "tests.effects_app:registry"
LEASE = 1.0


@pytest.fixture(autouse=True)
def _provider_dir(crash_env: CrashEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNIFOLD_TEST_DIR", str(crash_env.tmp))


def counts() -> tuple[int, int]:
    from tests.effects_app import provider_counts

    return provider_counts()


def call_keys() -> set[str]:
    from tests.effects_app import provider

    with provider() as conn:
        return {row[0] for row in conn.execute("SELECT key FROM calls")}


def last_line(env: CrashEnv, worker_id: str, exit_idle: bool = False) -> str:
    out, _ = env.spawn(worker_id, LEASE, APP, exit_idle=exit_idle).communicate(timeout=60)
    return out.split()[-1]


async def crash_then_recover(env: CrashEnv, workflow: str, block: str, marker: str, extra: tuple[str, ...] = ()) -> tuple[Any, str]:
    """Start a payment, SIGKILL its worker at ``marker`` while ``block`` holds it, recover with another worker."""
    tmp = Path(env.tmp)
    store = await open_store(env.url)
    await store.enqueue(WorkflowTask(workflow, 1, {"order_id": "o1", "amount": 1250}, checkpoint_id="o1"))
    (tmp / block).touch()
    for name in extra:
        (tmp / name).touch()
    doomed = env.spawn("worker-a", LEASE, APP)
    env.wait_for(marker)
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    (tmp / block).unlink()
    return store, last_line(env, "worker-b")


async def test_crash_before_effect_started_applies_once(crash_env: CrashEnv) -> None:
    """A crash before effect_started is committed: the recovered run applies the effect exactly once."""
    store, outcome = await crash_then_recover(crash_env, "pay-reconcile", "block-prepare", "preparing")
    assert outcome == "Completed"
    assert counts() == (1, 1)
    assert "effect_started" in await event_types(store, "o1")
    await store.close()


async def test_reconcile_with_evidence_replays(crash_env: CrashEnv) -> None:
    """Crash after the body applied: reconcile finds the charge, the effect is replayed and its body not run again."""
    store, outcome = await crash_then_recover(crash_env, "pay-reconcile", "block-after-apply", "applied")
    assert outcome == "Completed"
    assert counts() == (1, 1)
    types = await event_types(store, "o1")
    assert "effect_reconciled" in types and "effect_completed" not in types
    await store.close()


async def test_reconcile_without_evidence_runs_it(crash_env: CrashEnv) -> None:
    """Crash before the body applied: reconcile finds nothing, the effect runs again and applies once."""
    store, outcome = await crash_then_recover(crash_env, "pay-reconcile", "block-before-apply", "inflight")
    assert outcome == "Completed"
    assert counts() == (1, 2) and len(call_keys()) == 1
    types = await event_types(store, "o1")
    assert types.count("effect_started") == 2 and "effect_completed" in types
    await store.close()


@pytest.mark.parametrize("resolution", list(Resolution))
async def test_reconcile_unknown_parks_until_an_operator_resolves(crash_env: CrashEnv, resolution: Resolution) -> None:
    """No evidence either way: the run is parked as ambiguous until an operator resolves it (applied, retry or fail)."""
    store, outcome = await crash_then_recover(crash_env, "pay-reconcile", "block-after-apply", "applied", ("provider-down",))
    assert outcome == "Suspended"
    info = await store.get_run("o1")
    assert info.status is RunStatus.PARKED and "ambiguous" in info.reason
    assert last_line(crash_env, "worker-c", exit_idle=True) == "Idle"  # no worker touches a parked run
    (Path(crash_env.tmp) / "provider-down").unlink()
    await resolve_effect(store, effects_registry, "o1", "charge_card#1", resolution, by="ops-oncall", reason="checked the provider console",
                         output={"charge_id": "ch_manual", "amount": 1250} if resolution is Resolution.APPLIED else None)
    assert last_line(crash_env, "worker-d") == "Completed"
    applied, calls = counts()
    assert applied == 1
    assert calls == (2 if resolution is Resolution.RETRY else 1)
    types = await event_types(store, "o1")
    assert types.index("effect_ambiguous") < types.index("effect_resolved")
    [resolved] = [e.event for e in await entries(store, "o1") if isinstance(e.event, EffectResolved)]
    assert (resolved.by, resolved.reason, resolved.resolution) == ("ops-oncall", "checked the provider console", resolution)
    await store.close()


async def test_repeat_reuses_the_same_key(crash_env: CrashEnv) -> None:
    """REPEAT runs the body again with the same idempotency key; the provider applies it once."""
    store, outcome = await crash_then_recover(crash_env, "pay-repeat", "block-after-apply", "applied")
    assert outcome == "Completed"
    assert counts() == (1, 2) and len(call_keys()) == 1
    await store.close()


async def test_manual_is_ambiguous_at_once(crash_env: CrashEnv) -> None:
    """MANUAL parks an effect in doubt without calling anything."""
    store, outcome = await crash_then_recover(crash_env, "pay-manual", "block-after-apply", "applied")
    assert outcome == "Suspended"
    assert counts() == (1, 1)
    assert (await event_types(store, "o1"))[-1] == "effect_ambiguous"
    await store.close()


@pytest.mark.parametrize("policy", ["reconcile", "repeat", "manual"])
async def test_an_abandoned_effect_in_doubt_after_a_crash_gets_its_outcome_before_the_run_ends(
        crash_env: CrashEnv, policy: str) -> None:
    """Found by a user: a task group cancels a charge whose body has started (a sibling failed), the worker
    dies while the charge is in flight, and the run, replayed, has nothing waiting for the charge any more.
    It must not finish with the charge in doubt: its resume policy decides, as for an awaited effect."""
    tmp = Path(crash_env.tmp)
    store = await open_store(crash_env.url)
    await store.enqueue(WorkflowTask(f"abandon-{policy}", 1, {"order_id": "o1", "amount": 1250}, checkpoint_id="o1"))
    (tmp / "block-after-apply").touch()
    (tmp / "block-noted").touch()
    doomed = crash_env.spawn("worker-a", LEASE, APP)
    crash_env.wait_for("noted")  # the sibling's failure is committed and the charge, abandoned, is in flight
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    (tmp / "block-after-apply").unlink()
    (tmp / "block-noted").unlink()
    outcome = last_line(crash_env, "worker-b")
    types = await event_types(store, "o1")
    if policy == "manual":
        assert outcome == "Suspended" and "effect_ambiguous" in types and "run_completed" not in types
        assert (await store.get_run("o1")).status is RunStatus.PARKED
        await resolve_effect(store, effects_registry, "o1", "1/charge_card#1", Resolution.APPLIED, by="ops-oncall",
                             reason="charged, per the provider console", output={"charge_id": "ch_x", "amount": 1250})
        assert last_line(crash_env, "worker-c") == "Completed"
        types = await event_types(store, "o1")
    else:
        assert outcome == "Completed"
    outcome_event = {"reconcile": "effect_reconciled", "repeat": "effect_completed", "manual": "effect_resolved"}[policy]
    assert types.index("effect_started") < types.index(outcome_event) < types.index("run_completed")
    applied, calls = counts()
    assert applied == 1
    assert calls == (2 if policy == "repeat" else 1)
    checkpoint = fold(await entries(store, "o1"))
    assert checkpoint.result == "o1" and checkpoint.pending_effects == {}
    await store.close()
