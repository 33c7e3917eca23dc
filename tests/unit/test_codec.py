"""The event codec: JSON rows that round-trip, and clear errors for bad values and rows."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runifold import SerializationError
from runifold.history import (
    EffectReconciled,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
    Verdict,
    decode_event,
    encode_event,
    to_plain,
)

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@given(output=json_values, key=st.text(min_size=1, max_size=20), attempt=st.integers(1, 100))
def test_step_events_round_trip(output: Any, key: str, attempt: int) -> None:
    """Any JSON-compatible step output survives encode then decode unchanged."""
    event = StepCompleted(key=key, output=output, attempt=attempt)
    assert decode_event(encode_event(event)) == event


@given(payload=json_values, name=st.text(max_size=10), reason=st.text(max_size=30))
def test_signal_events_round_trip(payload: Any, name: str, reason: str) -> None:
    """Signal events keep sender, id, reason and payload exactly."""
    event = SignalReceived(key="wait.x#1", name=name, payload=payload, signal_id="s", sender="alice",
                           reason=reason, received_at=1.5)
    assert decode_event(encode_event(event)) == event


def test_rows_are_readable_json_with_stable_tags() -> None:
    """A stored row is plain JSON whose type tag is the stable snake_case name."""
    row = encode_event(StepFailed(key="a#1", error="boom", attempt=2, retry_at=None))
    assert row.startswith(b'{"type":"step_failed"')
    assert b'"error":"boom"' in row
    assert encode_event(EffectReconciled(key="e#1", verdict=Verdict.APPLIED)).count(b'"verdict":"applied"') == 1


def test_corrupt_rows_raise_a_clear_error() -> None:
    """A row that is not a known event raises SerializationError saying what to do."""
    for raw in [b"not json", b'{"type":"no_such_event"}', b'{"type":"run_started","name":1}']:
        with pytest.raises(SerializationError, match="corrupt"):
            decode_event(raw)


def test_unserialisable_values_are_refused() -> None:
    """Values JSON cannot hold are refused with advice, before anything is written."""
    with pytest.raises(SerializationError, match="JSON-compatible"):
        to_plain(object(), what="x")
    assert to_plain({"a": (1, 2)}, what="x") == {"a": [1, 2]}


def test_old_rows_decode_with_new_defaults() -> None:
    """A row written without a later-added defaulted field still decodes."""
    raw = b'{"type":"run_started","name":"wf","version":1,"input":{}}'
    event = decode_event(raw)
    assert isinstance(event, RunStarted) and event.checkpoint_id is None and event.key == ""


def test_a_local_time_in_a_repeated_or_skipped_hour_is_recorded_with_its_offset() -> None:
    """Python never compares a datetime in a zone's repeated or skipped hour equal to one of another tzinfo
    (PEP 495), so such a value, alone or in a dataclass, dict or Struct, was refused: a step returning
    datetime.now(ZoneInfo(...)) failed for good two hours a year, and a workflow result holding one failed its
    run (helper-19 refused only fold=1, helper-62 the rest). It keeps its wall time and offset, as any zone's
    datetime does; what the call receives is what a replay decodes."""
    import dataclasses
    from zoneinfo import ZoneInfo

    import msgspec
    import pydantic

    from runifold.history import convert, record

    riga = ZoneInfo("Europe/Riga")

    @dataclasses.dataclass
    class Receipt:
        order: str
        at: dt.datetime

    class Stamp(msgspec.Struct):
        at: dt.datetime

    class Model(pydantic.BaseModel):
        at: dt.datetime

    for local in (dt.datetime(2025, 10, 26, 3, 30, tzinfo=riga), dt.datetime(2025, 10, 26, 3, 30, fold=1, tzinfo=riga),
                  dt.datetime(2026, 3, 29, 3, 30, tzinfo=riga)):  # twice when clocks go back; never when forward
        for value, type_ in ((local, dt.datetime), (Receipt("o1", local), Receipt),
                             ({"at": [local]}, dict[str, list[dt.datetime]]), (Stamp(local), Stamp),
                             ({local}, set[dt.datetime]), (frozenset([local]), frozenset[dt.datetime]),
                             ({local: local}, dict[dt.datetime, dt.datetime]),
                             (Model(at=local), Model)):  # (helper-65: models, sets and keys were refused still)
            plain, live = record(value, type_, what="step stamp#1")
            assert live == convert(plain, type_, what="a replay"), value
        at = record(local, dt.datetime, what="step stamp#1")[1]
        assert at.isoformat() == local.isoformat() and at.timestamp() == local.timestamp()

    @dataclasses.dataclass(eq=False)
    class Opaque:  # compared by identity: never equal after a round trip, as before
        at: dt.datetime

    with pytest.raises(SerializationError, match="would come back from the log"):
        record(Opaque(dt.datetime(2025, 7, 1, tzinfo=dt.UTC)), Opaque, what="step stamp#1")


CANONICAL_OF_SETS = """
import enum, sys
from runifold.history import canonical_json

class Colour(enum.Enum):
    RED = "red"; BLUE = "blue"; GREEN = "green"; AMBER = "amber"; TEAL = "teal"

words = {"alpha", "beta", "gamma", "delta", "epsilon"}
value = {"words": words, "colours": set(Colour), "mixed": {1, "one", None, 2.5}, "nested": [frozenset(words)]}
print(canonical_json(value, what="v").decode(), "|", ",".join(words), ",".join(c.value for c in set(Colour)))
"""


def test_an_equal_set_has_one_canonical_form_in_every_process() -> None:
    """Sets of strings and of Enum members iterate in the order each process's hash seed picks; their canonical
    JSON (what inputs and signal payloads are compared and signed by) sorts their members: by ``<``, or by their
    JSON text where ``<`` cannot order them (Enum members, mixed types). helper-91: a conflict from another process."""
    printed = []
    for seed in "1234":
        done = subprocess.run([sys.executable, "-c", CANONICAL_OF_SETS], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        canonical, orders = done.stdout.split(" | ")
        printed.append((canonical, orders))
    assert len({canonical for canonical, _ in printed}) == 1, printed
    assert len({orders for _, orders in printed}) > 1  # the sets did iterate in other orders
    assert json.loads(printed[0][0]) == {
        "colours": ["amber", "blue", "green", "red", "teal"], "mixed": ["one", 1, 2.5, None],
        "nested": [["alpha", "beta", "delta", "epsilon", "gamma"]],
        "words": ["alpha", "beta", "delta", "epsilon", "gamma"]}


def test_an_int_longer_than_msgspec_reads_back_is_refused_whatever_the_digit_limit() -> None:
    """msgspec reads back an int of at most 4,300 characters, a minus sign included; beyond, the value is refused
    with what to do, also with Python's digit limit lifted (helper-89, helper-92: a negative one of 4,300 digits
    passed the check and failed as a raw msgspec error)."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        for fits in (10**4300 - 1, -(10**4299 - 1)):
            assert to_plain({"n": fits}, what="v") == {"n": fits}
        for too_long in (10**4300, -(10**4299), [10**5000]):
            with pytest.raises(SerializationError, match=r"more than 4,300 characters \(digits and sign\)( at \S+)?, which "
                                                         r"runifold cannot read back.*record it as a str"):
                to_plain(too_long, what="v")
    finally:
        sys.set_int_max_str_digits(old)


def test_a_refusal_names_where_in_the_value_the_part_it_refuses_is() -> None:
    """helper-89: a refusal said what a large value held, not where: the user searched the whole value for it."""
    import dataclasses
    import datetime
    import decimal

    from runifold.history import record

    @dataclasses.dataclass
    class Line:
        sku: str
        price: float

    def refusal(value: Any) -> str:
        with pytest.raises(SerializationError) as caught:
            record(value, Any, what="step quote#1")
        return str(caught.value)

    assert "it holds NaN or an infinity at ['lines'][1].price, which JSON" in refusal(
        {"lines": [Line("a", 1.0), Line("b", float("inf"))]})
    assert "it is NaN or an infinity, which JSON" in refusal(float("nan"))
    assert "it holds Decimal('NaN') at ['totals'][0]: a NaN" in refusal({"totals": [decimal.Decimal("NaN")]})
    assert "it holds an int of more than 4,300 characters (digits and sign) at [2], which" in refusal([1, 2, 10**5000])
    # a part that would come back as another type: where, and what it was
    assert ("would come back from the log as dict {'order': {'placed': ['2026-01-02T03:04:05']}} (at ['order']"
            "['placed'][0]: datetime datetime.datetime(2026, 1, 2, 3, 4, 5))") in refusal(
        {"order": {"placed": [datetime.datetime(2026, 1, 2, 3, 4, 5)]}})
    assert "(at (a key): int 7)" in refusal({7: "seven"})
