"""The signal gateway on every store: refusals are SignalRejectedErrors, audited in a bounded form, changing nothing."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from runifold import (
    HmacKeyRing,
    SignalConflictError,
    SignalEnvelope,
    SignalGateway,
    SignalLimits,
    SignalRejectedError,
    WorkflowRegistry,
    WorkflowTask,
    sign,
)
from runifold.signals._auth import sign_bytes
from tests.stores.test_waits import ALICE, APPROVAL, BOB, envelope, keyring
from tests.support import worker


async def waiting_run(store: Any, ref: str = "o1") -> str:
    await store.enqueue(WorkflowTask("approval", 1, {"order_id": ref}, checkpoint_id=ref))
    await worker(store, APPROVAL).run_once()
    return (await store.get_run(ref)).run_id


def gateway(store: Any, limits: SignalLimits | None = None, ring: HmacKeyRing | None = None) -> SignalGateway:
    return SignalGateway(store, WorkflowRegistry(APPROVAL), ring or keyring(), limits=limits)


async def unchanged(store: Any, ref: str) -> tuple[Any, Any]:
    return await store.get_run(ref), await store.history(ref)


def hand_signed(made: SignalEnvelope, **changes: Any) -> SignalEnvelope:
    """``made`` changed and signed again correctly by a sender that does not use sign() (which refuses a NaN)."""
    changed = msgspec.structs.replace(made, **changes)
    return msgspec.structs.replace(changed, signature=sign_bytes(ALICE, changed).decode())


async def test_a_signed_nan_timestamp_is_refused_and_audited(store: Any) -> None:
    """A correctly signed envelope whose timestamp is NaN is refused (bad_timestamp), audited, and changes nothing."""
    await waiting_run(store)
    before = await unchanged(store, "o1")
    with pytest.raises(SignalRejectedError) as caught:
        await gateway(store).send(hand_signed(envelope("o1", "s1", 0.0), timestamp=math.nan))
    assert caught.value.verdict == "bad_timestamp"
    assert await unchanged(store, "o1") == before
    assert [a.verdict for a in await store.audit("o1")] == ["rejected:bad_timestamp"]


async def test_a_signal_to_an_unknown_run_is_a_rejected_signal(store: Any) -> None:
    """A signal to a run that does not exist raises SignalRejectedError('unknown_run'), not RunNotFoundError, and is audited."""
    with pytest.raises(SignalRejectedError) as caught:
        await gateway(store).send(envelope("ghost", "s1", await store.now()))
    assert caught.value.verdict == "unknown_run" and "ghost" in str(caught.value)
    [record] = await store.audit("ghost")
    assert record.run_id is None and record.verdict == "rejected:unknown_run" and record.sender == "alice"


async def test_oversized_unauthenticated_attempts_are_refused_and_kept_bounded(store: Any) -> None:
    """Oversized (a 20 MB payload, a 100 KB id, a 1 MB reason) or unstorable (NUL, invalid Unicode) attempts with no
    valid key: refused before storing, audited cut to the limits as text every store keeps."""
    run_id = await waiting_run(store)
    before = await unchanged(store, "o1")
    forged = SignalEnvelope(target="o1", name="approval", payload={"blob": "x" * 20_000_000}, signal_id="i" * 100_000,
                            sender="mallory" * 1_000, reason="r" * 1_000_000, key_id="k" * 10_000,
                            timestamp=await store.now(), signature="AAAA")
    limits = SignalLimits()
    for change in ({}, {"payload": {"approved": True}}, {"payload": {"approved": True}, "signal_id": "s1"},
                   {"payload": {"approved": True}, "signal_id": "s1", "sender": "alice\x1b[2K\raccepted alice"}):
        with pytest.raises(SignalRejectedError) as caught:
            await gateway(store).send(msgspec.structs.replace(forged, **change))
        assert caught.value.verdict in ("too_large", "invalid")
    for change in ({"sender": "al\x00ice"}, {"reason": "why\x00not"}, {"signal_id": "s\udcff"}):
        with pytest.raises(SignalRejectedError) as caught:
            fields = {"payload": {}, "signal_id": "s2", "sender": "alice", "reason": "r", "key_id": "k", **change}
            await gateway(store).send(msgspec.structs.replace(forged, **fields))
        assert caught.value.verdict == "invalid"
    assert await unchanged(store, "o1") == before
    audit = await store.audit("o1")
    assert [a.sender for a in audit[-3:]] == ["al\\x00ice", "alice", "alice"]
    assert audit[-2].reason == "why\\x00not" and audit[-1].signal_id == "s\\udcff"
    audit = audit[:4]
    assert len(audit) == 4 and all(a.run_id == run_id and a.verdict.startswith("rejected:") for a in audit)
    for record in audit:
        assert len(record.signal_id) <= limits.max_signal_id and len(record.sender) <= limits.max_sender
        assert len(record.reason) <= limits.max_reason and len(record.key_id) <= limits.max_key_id
        assert len(record.detail) <= 200
    assert sum(len(msgspec.json.encode(a)) for a in audit) < 4 * 4_000  # bounded whatever was sent
    assert audit[-1].sender == "alice\x1b[2K\raccepted alice"  # kept as sent (escaped where it is printed)


async def test_a_deployment_can_tighten_the_limits(store: Any) -> None:
    """Limits given to the gateway apply before authentication: an authentic signal over them is refused."""
    await waiting_run(store)
    small = SignalLimits(max_payload_bytes=20)  # {"approved":true} is 17 bytes
    with pytest.raises(SignalRejectedError, match="the limit is 20"):
        await gateway(store, small).send(envelope("o1", "s1", await store.now(), payload={"approved": True, "note": "x"}))
    receipt = await gateway(store, small).send(envelope("o1", "s2", await store.now()))
    assert not receipt.duplicate


async def test_a_signal_id_reused_with_another_payload_is_a_conflict(store: Any) -> None:
    """The same signal id with another payload raises SignalConflictError and is audited; the first payload stays."""
    await waiting_run(store)
    now = await store.now()
    first = await gateway(store).send(envelope("o1", "s1", now))
    again = await gateway(store).send(envelope("o1", "s1", now))
    assert again.duplicate and again.received_at == first.received_at
    with pytest.raises(SignalConflictError):
        await gateway(store).send(envelope("o1", "s1", now, payload={"approved": False}))
    assert [a.verdict.split(":")[-1] for a in await store.audit("o1")][-1] == "conflict"
    # found by helper-15: another sender (or another reason) under the id, with the same payload, was a
    # "duplicate": accepted with the first sender's receipt, and never delivered
    bobs = envelope("o1", "c1", now, name="comment", sender="bob", key_id="bob-1", secret=BOB)
    alices = envelope("o1", "c1", now, name="comment")
    assert not (await gateway(store).send(alices)).duplicate
    with pytest.raises(SignalConflictError, match="sender or reason"):
        await gateway(store).send(bobs)
    with pytest.raises(SignalConflictError):
        await gateway(store).send(sign(msgspec.structs.replace(alices, reason="changed my mind"), ALICE))
    assert (await gateway(store).send(alices)).duplicate  # the very same signal again is a resend
    verdicts = [(a.signal_id, a.sender, a.verdict.split(":")[-1]) for a in await store.audit("o1")][-4:]
    assert verdicts == [("c1", "alice", "accepted"), ("c1", "bob", "conflict"), ("c1", "alice", "conflict"),
                        ("c1", "alice", "duplicate")]


async def test_a_payload_holding_an_equal_set_is_the_same_signal_whatever_its_order(store: Any) -> None:
    """A set's members are compared in one order: the same signal resent with an equal set iterated in another
    order (as another process's hash seed orders a set of strings) is a duplicate, not a conflict, and an
    envelope sent as JSON (msgspec.json.encode, as the README says) still verifies (helper-91: a conflict)."""
    await waiting_run(store)
    now = await store.now()
    one, other = {9, 1}, {1, 9}
    assert one == other and list(one) != list(other)  # equal sets, iterated in two orders
    signed = envelope("o1", "s1", now, payload={"approved": True, "lines": one})
    assert signed.payload == {"approved": True, "lines": [1, 9]}  # sent as its data, the set's members sorted
    wire = msgspec.json.decode(msgspec.json.encode(signed), type=SignalEnvelope)
    first = await gateway(store).send(wire)
    again = await gateway(store).send(envelope("o1", "s1", now, payload={"approved": True, "lines": other}))
    assert again.duplicate and again.received_at == first.received_at
    with pytest.raises(SignalConflictError):
        await gateway(store).send(envelope("o1", "s1", now, payload={"approved": True, "lines": {1, 8}}))
    # a payload without a set is sent as it was given
    plain = {"approved": True, "lines": [9, 1], "by": {"z": 1, "a": 2}}
    assert envelope("o1", "s2", now, payload=plain).payload is plain


async def test_a_payload_with_an_int_too_long_to_read_back_is_a_rejected_and_audited_signal(store: Any) -> None:
    """With Python's digit limit lifted, an int of more than 4,300 characters encodes but cannot be read back: the
    gateway refuses it as bad_payload and audits it (helper-92: a bare SerializationError, not audited)."""
    import sys

    await waiting_run(store)
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        with pytest.raises(SignalRejectedError) as caught:
            await gateway(store).send(msgspec.structs.replace(  # (limits are checked before the signature)
                envelope("o1", "s1", await store.now()), payload={"approved": True, "n": 10**5000}))
    finally:
        sys.set_int_max_str_digits(old)
    assert caught.value.verdict == "bad_payload" and "more than 4,300 characters" in caught.value.reason
    assert [a.verdict for a in await store.audit("o1")] == ["rejected:bad_payload"]


async def test_replayed_envelopes_keep_the_audit_bounded_and_refusals_say_why(store: Any) -> None:
    """One captured envelope sent again and again added an audit row each time, without bound (5,000 resends:
    5,000 rows, helper-57): duplicates are trimmed with rejections, the newest ``max_rejected_per_run`` of a run
    kept, accepted signals never. A conflict says what differs; a full inbox says so (they said nothing)."""
    await waiting_run(store)
    now = await store.now()
    limits = SignalLimits(max_rejected_per_run=5, max_unconsumed=2)
    signed = envelope("o1", "s1", now, name="comment")
    assert not (await gateway(store, limits).send(signed)).duplicate
    for _ in range(20):
        assert (await gateway(store, limits).send(signed)).duplicate
    with pytest.raises(SignalConflictError):
        await gateway(store, limits).send(envelope("o1", "s1", now, name="comment", payload={"approved": False}))
    assert not (await gateway(store, limits).send(envelope("o1", "s2", now, name="comment"))).duplicate
    with pytest.raises(SignalRejectedError) as full:
        await gateway(store, limits).send(envelope("o1", "s3", now, name="comment"))
    assert full.value.verdict == "inbox_full"
    audit = [(a.signal_id, a.verdict, a.detail) for a in await store.audit("o1")]
    assert audit == [("s1", "accepted", ""), *[("s1", "duplicate", "")] * 3,
                     ("s1", "rejected:conflict", "the signal id names another signal (it differs in: payload)"),
                     ("s2", "accepted", ""), ("s3", "rejected:inbox_full",
                                                         "the run's inbox is full (at most 2 unconsumed signals named "
                                                         "'comment')")]


async def test_a_run_holds_a_bounded_number_of_unconsumed_signals(store: Any) -> None:
    """Past limits.max_unconsumed unconsumed signals, the next is refused as inbox_full (and audited)."""
    await waiting_run(store)
    await store.enqueue(WorkflowTask("approval", 1, {"order_id": "o2"}, checkpoint_id="o2"))  # never runs: keeps all
    small = SignalLimits(max_unconsumed=3)
    now = await store.now()
    for i in range(3):
        await gateway(store, small).send(envelope("o2", f"c{i}", now, name="comment"))
    with pytest.raises(SignalRejectedError) as caught:
        await gateway(store, small).send(envelope("o2", "c3", now, name="comment"))
    assert caught.value.verdict == "inbox_full"
    # what to do, for a run that waits and for one that has finished (helper-90: "wait until it consumes some",
    # which a finished run never does)
    assert "already holds 3 unconsumed signals named 'comment'; an unfinished run makes room as its waits for " \
           "'comment' consume them (send again after that), a finished run takes no more; if none of its waits " \
           "will, cancel it" in str(caught.value)
    # the limit is per name: the senders of one signal cannot fill the inbox against another's (helper-96: a
    # thousand early finance approvals refused the manager's approval the run waited for)
    assert not (await gateway(store, small).send(envelope("o2", "a1", now, name="approval"))).duplicate


async def test_rejected_attempts_are_capped_per_run(store: Any) -> None:
    """The audit keeps at most limits.max_rejected_per_run rejected attempts of a run."""
    await waiting_run(store)
    small = SignalLimits(max_rejected_per_run=5)
    now = await store.now()
    for i in range(12):
        with pytest.raises(SignalRejectedError):
            await gateway(store, small).send(envelope("o1", f"f{i}", now, secret=b"wrong-secret-0123456789"))
    assert len([a for a in await store.audit("o1") if a.verdict.startswith("rejected:")]) == 5

