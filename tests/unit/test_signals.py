"""Signal envelopes, limits and key files: finite timestamps, bounded fields, private key files that load or fail clearly."""

from __future__ import annotations

import json
import logging
import math
import os
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runifold import (
    ConfigurationError,
    HmacKeyRing,
    SerializationError,
    SignalEnvelope,
    SignalRejectedError,
    sign,
)
from runifold.signals import SignalLimits
from runifold.signals._auth import sign_bytes

ALICE = b"alice-secret-0123456789abcdef"


def ring() -> HmacKeyRing:
    keys = HmacKeyRing()
    keys.add("alice-1", "alice", ALICE)
    return keys


def envelope(**changes: Any) -> SignalEnvelope:
    return sign(unsigned(**changes), ALICE)


def unsigned(**changes: Any) -> SignalEnvelope:
    fields: dict[str, Any] = dict(target="o1", name="approval", payload={"approved": True}, signal_id="s1",
                                  sender="alice", reason="looks good", key_id="alice-1", timestamp=1_000.0)
    fields.update(changes)
    return SignalEnvelope(**fields)


def hand_signed(**changes: Any) -> SignalEnvelope:
    """An envelope signed correctly by a sender that does not use sign() (which refuses what follows)."""
    made = unsigned(**changes)
    return msgspec.structs.replace(made, signature=sign_bytes(ALICE, made).decode())


@pytest.mark.parametrize("timestamp", [math.nan, math.inf, -math.inf])
def test_a_signed_envelope_with_a_non_finite_timestamp_is_refused(timestamp: float) -> None:
    """A correctly signed NaN or infinite timestamp never passes the freshness check (abs(nan) > 300 is false)."""
    signed = hand_signed(timestamp=timestamp)
    with pytest.raises(SignalRejectedError) as caught:
        ring().verify(signed, 1_000.0)
    assert caught.value.verdict == "bad_timestamp"
    with pytest.raises(SignalRejectedError) as limited:
        SignalLimits().check(signed)
    assert limited.value.verdict == "bad_timestamp"
    ring().verify(envelope(), 1_000.0)  # the same envelope with a finite timestamp is authentic


@pytest.mark.parametrize("field", ["reason", "signal_id", "sender", "payload"])
def test_signing_an_envelope_with_invalid_unicode_is_a_serialization_error_naming_the_field(field: str) -> None:
    """Found by helper-15: a lone surrogate in the reason or the signal id raised a bare UnicodeEncodeError."""
    with pytest.raises(SerializationError, match="payload" if field == "payload" else f"the signal's {field} "):
        envelope(**{field: {"text": "a\ud800"} if field == "payload" else "a\ud800"})


@pytest.mark.parametrize("timestamp", ["1700000000", None, math.nan, math.inf, True, 10**400])
def test_sign_refuses_a_timestamp_every_gateway_refuses_with_the_gateways_verdict(timestamp: Any) -> None:
    """helper-81: sign() signed a string, NaN or True timestamp (the gateway then refused the envelope), and raised
    a bare TypeError for None. It refuses them as the gateway does (one rule: check_timestamp); an int past a float's
    range raised OverflowError on both sides (helper-84)."""
    with pytest.raises(SignalRejectedError) as signing:
        envelope(timestamp=timestamp)
    with pytest.raises(SignalRejectedError) as gateway:
        SignalLimits().check(msgspec.structs.replace(envelope(), timestamp=timestamp))
    assert signing.value.verdict == gateway.value.verdict == "bad_timestamp"


@pytest.mark.parametrize("payload", [{"n": math.nan}, object()])
def test_sign_refuses_a_payload_that_is_not_json_data_with_a_serialization_error(payload: Any) -> None:
    with pytest.raises(SerializationError, match="the signal's payload cannot be recorded"):
        envelope(payload=payload)


@pytest.mark.parametrize(("field", "value", "verdict"), [
    ("signal_id", "x" * 201, "too_large"),
    ("sender", "a" * 201, "too_large"),
    ("name", "n" * 201, "too_large"),
    ("target", "t" * 201, "too_large"),
    ("key_id", "k" * 201, "too_large"),
    ("reason", "r" * 2_001, "too_large"),
    ("payload", {"blob": "x" * 70_000}, "too_large"),
    ("sender", "alice\x1b[32m", "invalid"),
    ("signal_id", "", "invalid"),
    ("name", 7, "invalid"),
    ("payload", {"n": math.nan}, "bad_payload"),
    ("payload", object(), "bad_payload"),
    ("timestamp", "now", "bad_timestamp"),
])
def test_limits_refuse_malformed_and_oversized_envelopes(field: str, value: Any, verdict: str) -> None:
    """Each field is checked for type, printable identifiers and size before anything is stored."""
    SignalLimits().check(envelope())
    with pytest.raises(SignalRejectedError) as caught:
        SignalLimits().check(msgspec.structs.replace(envelope(), **{field: value}))
    assert caught.value.verdict == verdict


def test_limits_are_configurable() -> None:
    """A deployment sets its own limits; a reason with line breaks is allowed, a zero limit is not."""
    small = SignalLimits(max_reason=10, max_payload_bytes=20)
    small.check(envelope(reason="ok\nfine", payload={"a": 1}))
    with pytest.raises(SignalRejectedError, match="the limit is 10"):
        small.check(envelope(reason="eleven char"))
    with pytest.raises(SignalRejectedError, match="the limit is 20"):
        small.check(envelope(payload={"approved": True, "why": "x"}))
    with pytest.raises(ConfigurationError):
        SignalLimits(max_sender=0)


def test_clip_keeps_a_bounded_printable_form() -> None:
    """What the audit keeps of a refused field is a string within its limit, whatever was sent."""
    limits = SignalLimits()
    assert limits.clip("reason", "r" * 1_000_000) == "r" * 1_999 + "…"
    assert len(limits.clip("signal_id", "s" * 100_000)) == 200
    assert limits.clip("sender", ["not", "a", "string"]) == "['not', 'a', 'string']"
    assert limits.clip("sender", "bad\udcff").encode("utf-8")  # never a string a database refuses
    assert len(limits.clip("detail", "d" * 10_000)) == 200


def write_keys(path: Path, entries: list[dict[str, Any]], mode: int = 0o600) -> str:
    path.write_text(json.dumps(entries))
    path.chmod(mode)
    return str(path)


def test_key_files_round_trip_privately(tmp_path: Path) -> None:
    """to_file writes mode 0600 and from_file reads back every key, revoked ones revoked; no secret is listed."""
    keys = ring()
    keys.add("bob-1", "bob", b"b" * 32)
    keys.revoke("bob-1")
    path = tmp_path / "ring.json"
    keys.to_file(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = HmacKeyRing.from_file(str(path))
    assert [(k.key_id, k.sender, k.revoked) for k in loaded.keys()] == [("alice-1", "alice", False), ("bob-1", "bob", True)]
    assert loaded.secret_of("alice-1") == ALICE
    with pytest.raises(ConfigurationError, match="already exists"):
        keys.to_file(str(path), overwrite=False)
    assert HmacKeyRing.from_file(str(path)).keys() == loaded.keys()  # the refused write left the file alone


def test_a_ring_loaded_from_a_file_follows_revokes_and_new_keys_written_to_it(tmp_path: Path) -> None:
    """A gateway's ring, loaded once, refuses a key that `runifold keys revoke` revoked in its file from the next
    signal on, and trusts a key added since; a file gone refuses every signal. It kept trusting a revoked key
    until the process restarted (helper-68). A ring changed in memory no longer follows its file."""
    path = str(tmp_path / "ring.json")
    ring().to_file(path)
    running = HmacKeyRing.from_file(path)
    running.verify(envelope(), 1_000.0)

    operator = HmacKeyRing.from_file(path)  # what `runifold keys revoke alice-1` does
    operator.revoke("alice-1")
    operator.add("alice-2", "alice", b"a" * 32)
    operator.to_file(path)
    with pytest.raises(SignalRejectedError) as refused:
        running.verify(envelope(), 1_000.0)
    assert refused.value.verdict == "revoked_key"
    running.verify(sign(msgspec.structs.replace(envelope(), key_id="alice-2"), b"a" * 32), 1_000.0)

    # rewritten in place, same size, its modification time put back (cp -p, rsync -t): the change time still moves
    before = os.stat(path)
    restored = HmacKeyRing.from_file(path)
    restored.revoke("alice-2")
    with open(path, "r+b") as f:
        text = f.read()
    restored.to_file(path + ".new")
    with open(path + ".new", "rb") as f:
        changed = f.read()
    changed += b" " * (len(text) - len(changed))  # ("true" is one byte shorter than "false": JSON allows the space)
    assert len(changed) == len(text)
    with open(path, "r+b") as f:
        f.write(changed)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(SignalRejectedError) as refused:
        running.verify(sign(msgspec.structs.replace(envelope(), key_id="alice-2"), b"a" * 32), 1_000.0)
    assert refused.value.verdict == "revoked_key"

    os.remove(path)
    with pytest.raises(ConfigurationError, match="cannot read key file .* every signal is refused"):
        running.verify(envelope(key_id="alice-2"), 1_000.0)

    ring().to_file(path)
    in_memory = HmacKeyRing.from_file(path)
    in_memory.add("bob-1", "bob", b"b" * 32)
    operator = HmacKeyRing.from_file(path)
    operator.revoke("alice-1")
    operator.to_file(path)
    in_memory.verify(envelope(), 1_000.0)  # changed in memory: it keeps its own keys


def test_a_key_file_others_can_read_is_loaded_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A group- or world-readable key file logs a warning naming the file and the fix."""
    if os.name != "posix":
        pytest.skip("file modes are POSIX")
    entry = {"key_id": "alice-1", "sender": "alice", "secret": "YWxpY2Utc2VjcmV0LTAxMjM0NTY3ODlhYmNkZWY="}
    private = write_keys(tmp_path / "private.json", [entry])
    shared = write_keys(tmp_path / "shared.json", [entry], mode=0o644)
    with caplog.at_level(logging.WARNING, logger="runifold"):
        HmacKeyRing.from_file(private)
        assert caplog.records == []
        HmacKeyRing.from_file(shared)
    [record] = caplog.records
    assert record.event == "key_file_not_private" and record.path == shared  # type: ignore[attr-defined]
    assert "chmod 600" in record.getMessage()


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read key file"),
    ("not json", "is not valid JSON"),
    ('{"broken', "is not valid JSON"),  # (it said "Expected `array`, got `object`": helper-36)
    ("{}", "is not a JSON list of key entries"),
    ('[{"key_id": 1}]', "is not a JSON list of key entries"),
    ('[{"key_id": "k", "sender": "alice", "secret": "not base64!"}]', "is not base64"),
    ('[{"key_id": "k", "sender": "alice", "secret": "c2hvcnQ="}]', "at least 16 bytes"),
    ('[{"key_id": "k", "sender": "alice\\u001b", "secret": "YWxpY2Utc2VjcmV0LTAxMjM0NTY3ODlhYmNkZWY="}]',
     "printable characters"),
])
def test_a_missing_or_malformed_key_file_is_a_configuration_error(tmp_path: Path, content: str | None, message: str) -> None:
    """Every way a key file can be wrong raises ConfigurationError naming the file, never a raw OSError or ValueError."""
    path = tmp_path / "keys.json"
    if content is not None:
        path.write_text(content)
        path.chmod(0o600)
    with pytest.raises(ConfigurationError, match=message) as caught:
        HmacKeyRing.from_file(str(path))
    assert str(path) in str(caught.value)


def test_merging_rings_never_reuses_a_key_id() -> None:
    """A deployment ring takes a sender's keys once; the same key id again is refused."""
    deployment = HmacKeyRing()
    assert deployment.merge(ring()) == ["alice-1"]
    with pytest.raises(ConfigurationError, match="never reused"):
        deployment.merge(ring())
    with pytest.raises(ConfigurationError, match="no key id 'nobody'"):
        deployment.revoke("nobody")
