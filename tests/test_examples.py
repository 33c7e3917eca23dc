"""The examples run as the README says and print what it promises."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_postgres, reset_postgres

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, tmp_path: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_no_example_hides_a_standard_module() -> None:
    """`python examples/X.py` puts examples/ first on the import path, so an example named like a standard module
    (examples/types.py) replaced it for everything, and every example failed with an ImportError outside an
    editable install (helper-32)."""
    names = {path.stem for path in (ROOT / "examples").glob("*.py")}
    assert names and not names & sys.stdlib_module_names


def test_order_intake_demo(tmp_path: Path) -> None:
    """The demo completes the order, prints its history, and does not repeat a finished run."""
    out = run_example("order_intake.py", tmp_path, str(tmp_path / "demo.db"))
    assert out.startswith("Completed(") and "'total': 2999" in out
    assert "step_completed    reserve_stock#1" in out and "run_completed" in out
    assert "created=False" in out and "next claim -> Idle()" in out


def test_approval_example(tmp_path: Path) -> None:
    """The approval example suspends, accepts alice's signed approval once, refuses a forgery, and completes."""
    out = run_example("approval.py", tmp_path, f"sqlite:///{tmp_path / 'approval.db'}")
    assert "worker: Suspended(" in out and "duplicate=True" in out
    assert "forged: signal rejected (bad_signature)" in out and "'status': 'shipped'" in out
    assert "rejected:bad_signature" in out


def test_payment_example(tmp_path: Path) -> None:
    """The payment example replays a charge found by evidence and parks an unknown one until resolved; nothing is charged twice."""
    out = run_example("payment.py", tmp_path, f"sqlite:///{tmp_path / 'payment.db'}")
    assert "ord_2: Completed(" in out and "'effect_reconciled', 'step_completed'" in out
    assert "ord_3: Suspended(" in out and "AMBIGUOUS" in out
    assert "provider applied 2 charge(s) for 2 settled orders" in out
    assert "ord_3 after resolution: Completed(" in out and "provider applied 3 charge(s) in total" in out


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_children_example(tmp_path: Path, kind: str) -> None:
    """The child-workflow example: a client awaits a parent that awaits two children; typed results come back."""
    if kind == "postgres":
        dsn = require_postgres()
        asyncio.run(reset_postgres(dsn))
        url = dsn
    else:
        url = f"sqlite:///{tmp_path / 'children.db'}"
    out = run_example("children.py", tmp_path, url)
    assert "fulfil ord_9 -> Fulfilment(invoice=Invoice(order_id='ord_9', total_cents=4200)" in out
    assert out.count("child_started") == 2 and out.count("signal_received") == 2
    assert "child child.bill#1: bill v1 completed" in out and "child child.pack#1: pack v1 completed" in out


async def _store_url(kind: str, tmp_path: Path, name: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / name}"
    dsn = require_postgres()
    await reset_postgres(dsn)
    return dsn


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_schedule_example(kind: str, tmp_path: Path) -> None:
    """Two workers fire a one-second schedule: one run per tick named by its tick; after an outage the catch-up policy starts the latest tick, or the window's."""
    out = run_example("schedule.py", tmp_path, await _store_url(kind, tmp_path, "schedule.db"))
    ticks = [line.split()[0] for line in out.splitlines() if line.startswith("  schedule:every-second:")]
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), out
    assert all(line.endswith("completed") for line in out.splitlines() if line.startswith("  schedule:")), out
    assert f"{len(ticks)} ticks, {len(ticks)} runs: one run per tick (True)" in out
    assert f"the first run returned 'eu report for {ticks[0].split(':', 2)[2]}'" in out
    assert "catchup=0:01:00: 1 run(s), ticks 2026-03-03T00:00:00Z" in out
    assert "catchup=6:00:00: 6 run(s), ticks 2026-03-02T19:00:00Z," in out


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_concurrency_example(kind: str, tmp_path: Path) -> None:
    """Payouts run at most two at once and each customer's syncs one at a time, on two workers with twelve slots."""
    out = run_example("concurrency.py", tmp_path, await _store_url(kind, tmp_path, "concurrency.db"))
    assert "a sync of bob carries key 'customer:bob' with limit 1" in out
    assert "most at once: customer:alice 1, customer:bob 1, payout 2 (limits" in out, out


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_types_example(kind: str, tmp_path: Path) -> None:
    """A pydantic input (a bad one refused naming the field), dataclass and Struct results, a thread step, a
    retried timeout, a typed signal payload, and step log lines carrying the run id and the call key."""
    out = run_example("typed_values.py", tmp_path, await _store_url(kind, tmp_path, "types.db"))
    assert "refused: input for workflow 'quote-order' v1: parameter 'order'" in out
    assert "quantity: Input should be greater than 0" in out
    assert ("quote-order q-1 -> Outcome(quote=Quote(order_id='q-1', cents=3750, valid_until=datetime.datetime(2026, 12, 8, "
            "9, 0, tzinfo=datetime.timezone.utc)), reservation='res-q-1', approved_by='alice')") in out
    assert "types: Outcome Quote datetime" in out
    assert "reserve: [('step_failed', 'reserve#1'), ('step_completed', 'reserve#1')]" in out
    [pricing] = [json.loads(line) for line in out.splitlines() if '"event": "pricing"' in line]
    assert pricing["key"] == "price#1" and pricing["run_id"].startswith("run_") and pricing["quantity"] == 3
