"""Golden histories recorded from the examples replay against today's code; a broken one is caught."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from examples import approval, order_intake
from runifold import NondeterminismError, WorkflowRegistry
from runifold.history import Entry, decode_event
from runifold.worker._debug import replay

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
REGISTRIES: dict[str, WorkflowRegistry] = {"order-intake": order_intake.registry, "order-approval": approval.registry}


def load(name: str) -> list[Entry]:
    rows = json.loads((HISTORIES / name).read_text())
    return [Entry(r["seq"], r["at"], decode_event(msgspec.json.encode(r["body"]))) for r in rows]


def definition_for(entries: list[Entry]):  # type: ignore[no-untyped-def]
    started = entries[0].event
    return REGISTRIES[started.name].definition_for(started.name, started.version)  # type: ignore[union-attr]


@pytest.mark.parametrize("name", sorted(p.name for p in HISTORIES.glob("*.json") if "broken" not in p.name))
async def test_golden_history_replays_cleanly(name: str) -> None:
    """A recorded example history replays against the current code to the same result, running no body."""
    entries = load(name)
    report = await replay(definition_for(entries), name, entries)
    report.raise_for_divergence()
    assert report.finished
    assert msgspec.to_builtins(report.result) == entries[-1].event.output  # type: ignore[union-attr]


async def test_broken_history_raises_nondeterminism() -> None:
    """A history whose step was renamed raises NondeterminismError naming the recorded key."""
    entries = load("order_intake_v1_broken.json")
    report = await replay(definition_for(entries), "broken", entries)
    with pytest.raises(NondeterminismError) as err:
        report.raise_for_divergence()
    assert err.value.key == "quote_order#1" and "price_order#1" in err.value.called
