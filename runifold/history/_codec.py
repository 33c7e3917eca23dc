"""Encoding of events and recorded values (JSON, never pickle)."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from runifold.errors import SerializationError
from runifold.history._events import AnyEvent

T = TypeVar("T")

_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(AnyEvent)
_any_decoder = msgspec.json.Decoder()


def encode_event(event: AnyEvent) -> bytes:
    """Encode an event as the JSON stored in a row."""
    return _encoder.encode(event)


def decode_event(raw: bytes | str, *, where: str = "") -> AnyEvent:
    """Decode a stored row; a corrupt row raises ``SerializationError``."""
    try:
        return _event_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise SerializationError(
            f"stored event {where or ''} cannot be decoded ({exc}); the row is corrupt or was "
            "written by a newer runifold: upgrade runifold or restore the row from a backup"
        ) from exc


def to_plain(value: Any, *, what: str) -> Any:
    """Return ``value`` as JSON-compatible builtins, or raise ``SerializationError``."""
    try:
        # a JSON round trip: exactly what a replay will see (tuples become lists, ...)
        return _any_decoder.decode(_encoder.encode(value))
    except (TypeError, msgspec.EncodeError, OverflowError) as exc:
        raise SerializationError(
            f"{what} cannot be recorded ({exc}); return JSON-compatible data (dict, list, str, "
            "int, float, bool, None), a msgspec.Struct or a dataclass, and keep large artifacts "
            "outside the log, referenced by id"
        ) from exc


def convert(value: Any, type_: Any, *, what: str) -> Any:
    """Convert recorded builtins back to ``type_``, as a live call would have returned."""
    if type_ is Any:
        return value
    try:
        return msgspec.convert(value, type_, strict=False)
    except msgspec.ValidationError as exc:
        raise SerializationError(
            f"recorded value of {what} does not fit its annotated type {type_!r} ({exc}); "
            "the return type changed incompatibly: register the change as a new version"
        ) from exc
