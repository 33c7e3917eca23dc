"""Limits on what a signal may carry, checked before anything of it is stored."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, final

from runifold.errors import ConfigurationError, SerializationError, SignalRejectedError
from runifold.history import encode_value, to_plain
from runifold.signals._auth import SignalEnvelope, check_timestamp
from runifold.stores._protocol import check_unreserved

#: how many characters of a refused text field a rejected attempt keeps in the audit
_KEPT_OF_REFUSED = 200


@final
@dataclass(frozen=True)
class SignalLimits:
    """How large a signal may be, and how much of them a run keeps.

    Text limits count characters; ``max_payload_bytes`` counts the bytes of the
    payload's JSON. A signal over a limit is refused (``too_large``) before
    anything of it is stored; the audit keeps rejected attempts cut to these
    lengths.

    Args:
        max_target: run id or checkpoint id (default 200).
        max_name: signal name (default 200).
        max_signal_id: signal id (default 200).
        max_sender: sender (default 200).
        max_key_id: key id (default 200).
        max_reason: free-text reason (default 2,000).
        max_payload_bytes: the payload as JSON (default 64 KiB).
        max_unconsumed: accepted signals of one name a run may hold before a
            wait consumes them; past it the store refuses more of that name
            (``inbox_full``) (default 1,000).
        max_rejected_per_run: attempts not accepted (rejections and duplicates) the
            audit keeps per run, the newest (default 1,000).
    """

    max_target: int = 200
    max_name: int = 200
    max_signal_id: int = 200
    max_sender: int = 200
    max_key_id: int = 200
    max_reason: int = 2_000
    max_payload_bytes: int = 65_536
    max_unconsumed: int = 1_000
    max_rejected_per_run: int = 1_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"SignalLimits.{f.name} must be a positive integer, got {value!r}")

    def check(self, envelope: SignalEnvelope) -> None:
        """Raise :class:`SignalRejectedError` if ``envelope`` is malformed or over a limit.

        Identifiers (target, name, signal id, sender, key id) must be non-empty
        strings of printable characters; the reason a string (it may hold line
        breaks); the timestamp a finite number; the payload JSON data.
        """
        for field, limit in (("target", self.max_target), ("name", self.max_name),
                             ("signal_id", self.max_signal_id), ("sender", self.max_sender),
                             ("key_id", self.max_key_id)):
            value = getattr(envelope, field)
            if not isinstance(value, str) or not value:
                raise SignalRejectedError("invalid", f"{field} must be a non-empty string")
            if len(value) > limit:
                raise SignalRejectedError("too_large", f"{field} has {len(value):,} characters; the limit is {limit:,}")
            if not value.isprintable():
                raise SignalRejectedError("invalid", f"{field} holds control or other non-printable characters")
            if field in ("name", "signal_id"):
                check_unreserved(field, value)
        if not isinstance(envelope.reason, str):
            raise SignalRejectedError("invalid", "reason must be a string")
        if len(envelope.reason) > self.max_reason:
            raise SignalRejectedError(
                "too_large", f"reason has {len(envelope.reason):,} characters; the limit is {self.max_reason:,}")
        if not _valid_unicode(envelope.reason) or "\x00" in envelope.reason:
            raise SignalRejectedError("invalid", "reason is not valid Unicode text (or holds a NUL character)")
        if not isinstance(envelope.signature, str):
            raise SignalRejectedError("invalid", "signature must be a string")
        check_timestamp(envelope.timestamp)
        size = payload_size(envelope.payload)
        if size > self.max_payload_bytes:
            raise SignalRejectedError(
                "too_large", f"payload is {size:,} bytes of JSON; the limit is {self.max_payload_bytes:,}")

    def clip(self, field: str, value: Any) -> str:
        """Return ``value`` as the audit keeps it: valid text without NUL, of at most the field's limit."""
        limit = {"target": self.max_target, "name": self.max_name, "signal_id": self.max_signal_id,
                 "sender": self.max_sender, "key_id": self.max_key_id, "reason": self.max_reason}.get(
                     field, _KEPT_OF_REFUSED)
        text = value if isinstance(value, str) else repr(value)
        if not _valid_unicode(text):
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        text = text.replace("\x00", "\\x00")  # no store keeps a NUL in a text column
        return text if len(text) <= limit else text[: limit - 1] + "…"


def payload_size(payload: Any) -> int:
    """Return the size of ``payload`` as JSON, or refuse it (``bad_payload``) if it is not JSON data."""
    try:
        to_plain(payload, what="the signal's payload")  # refuses what cannot be read back (an int too long)
        return len(encode_value(payload, what="the signal's payload"))  # refuses NaN, infinities, objects
    except SerializationError as exc:
        raise SignalRejectedError("bad_payload", str(exc)) from None
    except RecursionError:
        raise SignalRejectedError("bad_payload", "the payload is nested too deeply") from None


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
