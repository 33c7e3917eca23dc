"""The examples run as the README says and print what it promises."""

from __future__ import annotations

import asyncio
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
    assert "fulfil ord_7 -> Fulfilment(invoice=Invoice(order_id='ord_7', total_cents=4200)" in out
    assert out.count("child_started") == 2 and out.count("signal_received") == 2
    assert "child child.bill#1: bill v1 completed" in out and "child child.pack#1: pack v1 completed" in out
