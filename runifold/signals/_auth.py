"""Signal envelopes and their authentication: an ``Authenticator`` protocol and a built-in HMAC-SHA256 scheme.

The signature covers canonical bytes of: the scheme version, key id, sender,
target run, signal name, signal id, timestamp, reason and the SHA-256 of the
payload's canonical JSON. Verification compares with ``hmac.compare_digest``
and refuses timestamps outside a freshness window judged on the *store's*
clock. Secrets never leave the key ring: audits record key ids only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any, Protocol, final

import msgspec

from runifold.errors import ConfigurationError, SignalRejectedError

SCHEME = "runifold-hmac-sha256-v1"


class SignalEnvelope(msgspec.Struct, frozen=True, kw_only=True):
    """A signed signal, as a sender transmits it."""

    target: str
    name: str
    payload: Any
    signal_id: str
    sender: str
    reason: str
    key_id: str
    timestamp: float
    signature: str = ""


def payload_hash(payload: Any) -> str:
    """Return ``sha256:<hex>`` of the payload's canonical JSON (sorted keys)."""
    return "sha256:" + hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()


def canonical_bytes(envelope: SignalEnvelope) -> bytes:
    """The exact bytes the signature covers."""
    return msgspec.json.encode([
        SCHEME, envelope.key_id, envelope.sender, envelope.target, envelope.name, envelope.signal_id,
        repr(float(envelope.timestamp)), envelope.reason, payload_hash(envelope.payload),
    ])


class Authenticator(Protocol):
    """Decides whether an envelope really comes from its claimed sender."""

    def verify(self, envelope: SignalEnvelope, now: float) -> None:
        """Return if authentic and fresh at ``now`` (store clock); raise :class:`SignalRejectedError` otherwise."""
        ...


class KeyFileEntry(msgspec.Struct, frozen=True):
    """One key in a key file."""

    key_id: str
    sender: str
    secret: str
    revoked: bool = False


@dataclass(frozen=True)
class _Key:
    sender: str
    secret: bytes
    revoked: bool = False


@final
class HmacKeyRing:
    """Per-sender HMAC keys under key ids; rotate by adding a new id, retire by revoking the old.

    Args:
        freshness: seconds a timestamp may differ from the store's clock (default ±300 s).
    """

    def __init__(self, freshness: float = 300.0) -> None:
        if freshness <= 0:
            raise ConfigurationError("freshness must be a positive number of seconds")
        self.freshness = freshness
        self._keys: dict[str, _Key] = {}

    def add(self, key_id: str, sender: str, secret: bytes) -> None:
        """Register ``secret`` (at least 16 bytes) for ``sender`` under ``key_id``."""
        if key_id in self._keys:
            raise ConfigurationError(f"key id {key_id!r} already exists; key ids are never reused")
        if len(secret) < 16:
            raise ConfigurationError("an HMAC secret needs at least 16 bytes; use HmacKeyRing.new_secret()")
        self._keys[key_id] = _Key(sender, bytes(secret))

    def revoke(self, key_id: str) -> None:
        """Refuse every signal signed with ``key_id`` from now on."""
        key = self._keys[key_id]
        self._keys[key_id] = _Key(key.sender, key.secret, revoked=True)

    @classmethod
    def from_file(cls, path: str, freshness: float = 300.0) -> HmacKeyRing:
        """Load a key ring from a JSON file: a list of ``{"key_id", "sender", "secret", "revoked"?}``.

        ``secret`` is base64. Keep the file readable by the workers and senders only.
        """
        with open(path, "rb") as f:
            try:
                entries = msgspec.json.decode(f.read(), type=list[KeyFileEntry])
            except msgspec.DecodeError as exc:
                raise ConfigurationError(f"key file {path} is not a list of key entries: {exc}") from exc
        ring = cls(freshness)
        for entry in entries:
            ring.add(entry.key_id, entry.sender, base64.b64decode(entry.secret))
            if entry.revoked:
                ring.revoke(entry.key_id)
        return ring

    def signing_key(self, sender: str) -> str:
        """Return the newest unrevoked key id of ``sender`` (for signing)."""
        ids = [k for k, key in self._keys.items() if key.sender == sender and not key.revoked]
        if not ids:
            raise ConfigurationError(f"no unrevoked key for sender {sender!r} in the key ring")
        return ids[-1]

    def secret_of(self, key_id: str) -> bytes:
        """Return the secret of ``key_id`` (for a sender signing with its own key)."""
        return self._keys[key_id].secret

    @staticmethod
    def new_secret() -> bytes:
        """Return 32 random bytes for a new key."""
        return secrets.token_bytes(32)

    def verify(self, envelope: SignalEnvelope, now: float) -> None:
        key = self._keys.get(envelope.key_id)
        if key is None:
            raise SignalRejectedError("unknown_key", f"key id {envelope.key_id!r} is not known")
        if key.revoked:
            raise SignalRejectedError("revoked_key", f"key id {envelope.key_id!r} was revoked")
        if key.sender != envelope.sender:
            raise SignalRejectedError("wrong_sender", f"key id {envelope.key_id!r} does not belong to {envelope.sender!r}")
        expected = sign_bytes(key.secret, envelope)
        if not hmac.compare_digest(expected, envelope.signature.encode()):
            raise SignalRejectedError("bad_signature", "the signature does not match the envelope")
        skew = envelope.timestamp - now
        if abs(skew) > self.freshness:
            raise SignalRejectedError(
                "stale" if skew < 0 else "future",
                f"timestamp is {abs(skew):.0f} s {'old' if skew < 0 else 'in the future'}; the window is ±{self.freshness:g} s "
                "on the store's clock: sign just before sending and check the sender's clock",
            )


def sign_bytes(secret: bytes, envelope: SignalEnvelope) -> bytes:
    """Return the base64url HMAC-SHA256 signature of ``envelope`` as bytes."""
    digest = hmac.new(secret, canonical_bytes(envelope), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest)


def sign(envelope: SignalEnvelope, secret: bytes) -> SignalEnvelope:
    """Return ``envelope`` with its signature set (what a sender does)."""
    return msgspec.structs.replace(envelope, signature=sign_bytes(secret, envelope).decode())
