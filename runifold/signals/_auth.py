"""Signal envelopes and their authentication: an ``Authenticator`` protocol and a built-in HMAC-SHA256 scheme.

The signature covers canonical bytes of: the scheme version, key id, sender,
target run, signal name, signal id, timestamp, reason and the SHA-256 of the
payload's canonical JSON. Verification compares with ``hmac.compare_digest``
and refuses timestamps that are not finite or lie outside a freshness window
judged on the *store's* clock. Secrets never leave the key ring: audits record
key ids only.

Key files are JSON lists of ``{"key_id", "sender", "secret" (base64),
"revoked"?}``. The same format serves a sender's own key file (it signs) and
the deployment's key ring (the receiving side verifies against it); both hold
secrets, so they are written readable by their owner only, and loading one
that others may read logs a warning.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass
from typing import Any, Protocol, final

import msgspec

from runifold.history import canonical, canonical_json, in_one_order, to_plain

from runifold._log import get_logger
from runifold.errors import ConfigurationError, SerializationError, SignalRejectedError

log = get_logger("runifold.signals")

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
    """Return ``sha256:<hex>`` of the payload's canonical JSON (sorted keys; models as their JSON data)."""
    return "sha256:" + hashlib.sha256(canonical_json(payload, what="the signal's payload")).hexdigest()


def check_timestamp(timestamp: Any) -> float:
    """Return the timestamp, or refuse it (``bad_timestamp``) if it is not a finite number of seconds: the one
    rule of the sender's :func:`sign`, the gateway's limits and the authenticator."""
    try:
        finite = not isinstance(timestamp, bool) and isinstance(timestamp, (int, float)) and math.isfinite(timestamp)
    except OverflowError:  # an int past a float's range (10**400)
        finite = False
    if not finite:
        raise SignalRejectedError("bad_timestamp", f"timestamp must be a finite number of seconds, got {timestamp!r:.60}")
    return float(timestamp)


def canonical_bytes(envelope: SignalEnvelope) -> bytes:
    """The exact bytes the signature covers.

    Raises:
        SerializationError: a field or the payload holds a string that is not valid Unicode.
    """
    fields = ("key_id", "sender", "target", "name", "signal_id", "reason")
    try:
        return msgspec.json.encode([
            SCHEME, *(getattr(envelope, f) for f in fields), repr(float(envelope.timestamp)),
            payload_hash(envelope.payload),
        ])
    except UnicodeEncodeError as exc:
        field = next((f for f in fields if not _encodes(getattr(envelope, f))), "a field")
        raise SerializationError(
            f"the signal's {field} holds a string that is not valid Unicode ({exc.reason}); it cannot be signed "
            "or stored: decode bytes with errors='replace'") from None


def _encodes(value: Any) -> bool:
    try:
        msgspec.json.encode(value)
    except UnicodeEncodeError:
        return False
    return True


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


class KeyInfo(msgspec.Struct, frozen=True):
    """A key of a ring as it may be shown: never its secret."""

    key_id: str
    sender: str
    revoked: bool


@dataclass(frozen=True)
class _Key:
    sender: str
    secret: bytes
    revoked: bool = False


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > 200 or not value.isprintable():
        raise ConfigurationError(f"a {what} must be 1-200 printable characters, got {value!r}")
    return value


@final
class HmacKeyRing:
    """Per-sender HMAC keys under key ids; rotate by adding a new id, retire by revoking the old.

    Args:
        freshness: seconds a timestamp may differ from the store's clock (default ±300 s).
    """

    def __init__(self, freshness: float = 300.0) -> None:
        if not (isinstance(freshness, (int, float)) and math.isfinite(freshness) and freshness > 0):
            raise ConfigurationError(f"freshness must be a positive, finite number of seconds, got {freshness!r}")
        self.freshness = freshness
        self._keys: dict[str, _Key] = {}
        #: the file a ring loaded by from_file follows, with its (modification time, size, inode) when read
        self._file: tuple[str, tuple[int, int, int, int]] | None = None

    def add(self, key_id: str, sender: str, secret: bytes) -> None:
        """Register ``secret`` (at least 16 bytes) for ``sender`` under ``key_id``."""
        self._file = None  # (changed in memory: it no longer follows its file)
        _check_name("key id", key_id)
        _check_name("sender", sender)
        if key_id in self._keys:
            raise ConfigurationError(f"key id {key_id!r} already exists; key ids are never reused")
        if len(secret) < 16:
            raise ConfigurationError("an HMAC secret needs at least 16 bytes; use HmacKeyRing.new_secret()")
        self._keys[key_id] = _Key(sender, bytes(secret))

    def revoke(self, key_id: str) -> bool:
        """Refuse every signal signed with ``key_id`` from now on; False if it was revoked already."""
        key = self._keys.get(key_id)
        if key is None:
            known = ", ".join(self._keys) or "none"
            raise ConfigurationError(f"no key id {key_id!r} in the key ring (key ids: {known})")
        self._file = None
        self._keys[key_id] = _Key(key.sender, key.secret, revoked=True)
        return not key.revoked

    def keys(self) -> list[KeyInfo]:
        """Return every key's id, sender and whether it is revoked, in the order they were added."""
        return [KeyInfo(key_id, key.sender, key.revoked) for key_id, key in self._keys.items()]

    def merge(self, other: HmacKeyRing) -> list[str]:
        """Add every key of ``other`` (revoked ones stay revoked); return their key ids.

        Raises:
            ConfigurationError: a key id of ``other`` is already in this ring (key ids are never reused).
        """
        clash = sorted(set(self._keys) & set(other._keys))
        if clash:
            raise ConfigurationError(f"key id(s) {', '.join(clash)} already in the key ring; key ids are never reused")
        self._file = None
        self._keys.update(other._keys)
        return list(other._keys)

    @classmethod
    def from_file(cls, path: str, freshness: float = 300.0) -> HmacKeyRing:
        """Load a key ring from a JSON file: a list of ``{"key_id", "sender", "secret", "revoked"?}``.

        ``secret`` is base64. Keep the file readable by its owner only: a file
        that its group or others may read is loaded with a warning.

        The ring follows its file: :meth:`verify` reads the file again when it
        has changed since (its modification or change time, size or inode), so a key
        ``runifold keys revoke`` or ``keys add`` writes is refused or trusted
        by a running gateway from its next signal, and a file that can no
        longer be read refuses every signal (``ConfigurationError``). A ring
        changed in memory since (``add``, ``revoke``, ``merge``) no longer
        follows it.

        Raises:
            ConfigurationError: the file cannot be read or is not a list of valid key entries.
        """
        try:
            with open(path, "rb") as f:
                status = os.fstat(f.fileno())
                raw = f.read()
        except OSError as exc:
            raise ConfigurationError(f"cannot read key file {path}: {exc.strerror or exc}") from exc
        try:
            data = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:  # (decoded to the entries' type at once, it blamed the first character)
            raise ConfigurationError(f"key file {path} is not valid JSON ({exc}); restore it from where it was "
                                     "made (runifold keys new writes it)") from exc
        try:
            entries = msgspec.convert(data, type=list[KeyFileEntry])
        except msgspec.ValidationError as exc:
            raise ConfigurationError(f"key file {path} is not a JSON list of key entries "
                                     f'{{"key_id", "sender", "secret", "revoked"?}}: {exc}') from exc
        ring = cls(freshness)
        for entry in entries:
            try:
                secret = base64.b64decode(entry.secret, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ConfigurationError(f"key file {path}: the secret of {entry.key_id!r} is not base64") from exc
            try:
                ring.add(entry.key_id, entry.sender, secret)
            except ConfigurationError as exc:
                raise ConfigurationError(f"key file {path}: {exc}") from exc
            if entry.revoked:
                ring.revoke(entry.key_id)
        mode = status.st_mode
        if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("key_file_not_private", path=path, mode=oct(stat.S_IMODE(mode)),
                        fix=f"chmod 600 {path}: it holds secrets")
        ring._file = (path, _stamp(status))
        return ring

    def _follow_file(self) -> None:
        """Read the ring's file again if it changed since it was read (see :meth:`from_file`)."""
        if self._file is None:
            return
        path, stamp = self._file
        try:
            now = _stamp(os.stat(path))
        except OSError as exc:
            raise ConfigurationError(f"cannot read key file {path}: {exc.strerror or exc}; every signal is refused "
                                     "until it is back") from exc
        if now != stamp:
            fresh = HmacKeyRing.from_file(path, self.freshness)
            self._keys, self._file = fresh._keys, fresh._file
            log.info("key_file_reloaded", path=path, keys=len(self._keys))

    def to_file(self, path: str, *, overwrite: bool = True) -> None:
        """Write the ring to ``path`` (mode 0600) in the format :meth:`from_file` reads.

        The file is replaced atomically: a reader sees the old ring or the new one.

        Raises:
            ConfigurationError: ``overwrite`` is false and ``path`` exists, or it cannot be written.
        """
        entries = [KeyFileEntry(key_id, key.sender, base64.b64encode(key.secret).decode(), key.revoked)
                   for key_id, key in self._keys.items()]
        data = msgspec.json.format(msgspec.json.encode(entries), indent=2) + b"\n"
        try:
            if not overwrite:  # a new file, never an existing key: O_EXCL refuses a path that exists
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                    f.write(data)
                return
            fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".runifold-keys-")
            try:  # mkstemp creates the file with mode 0600
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(temporary, path)
            finally:
                if os.path.exists(temporary):
                    os.unlink(temporary)
        except FileExistsError as exc:
            raise ConfigurationError(f"{path} already exists; choose another file name") from exc
        except OSError as exc:
            raise ConfigurationError(f"cannot write key file {path}: {exc.strerror or exc}") from exc

    def signing_key(self, sender: str) -> str:
        """Return the newest unrevoked key id of ``sender`` (for signing)."""
        ids = [k for k, key in self._keys.items() if key.sender == sender and not key.revoked]
        revoked = [k for k, key in self._keys.items() if key.sender == sender and key.revoked]
        if not ids and revoked:
            raise ConfigurationError(
                f"every key of sender {sender!r} here is revoked ({', '.join(revoked)}); the deployment refuses "
                "signals signed with it: ask its operator for a new key")
        if not ids:
            raise ConfigurationError(
                f"no unrevoked key for sender {sender!r} here: the key file names "
                f"{sorted({k.sender for k in self._keys.values()}) or 'no sender'}; sign with that sender's own key file")
        return ids[-1]

    def secret_of(self, key_id: str) -> bytes:
        """Return the secret of ``key_id`` (for a sender signing with its own key)."""
        key = self._keys.get(key_id)
        if key is None:
            raise ConfigurationError(f"no key id {key_id!r} in the key ring")
        return key.secret

    @staticmethod
    def new_secret() -> bytes:
        """Return 32 random bytes for a new key."""
        return secrets.token_bytes(32)

    def verify(self, envelope: SignalEnvelope, now: float) -> None:
        self._follow_file()
        timestamp = check_timestamp(envelope.timestamp)
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
        skew = timestamp - now
        if not abs(skew) <= self.freshness:  # written so that a NaN is refused too
            raise SignalRejectedError(
                "stale" if skew < 0 else "future",
                f"timestamp is {abs(skew):.0f} s {'old' if skew < 0 else 'in the future'}; the window is ±{self.freshness:g} s "
                "on the store's clock: sign just before sending and check the sender's clock",
            )


def _stamp(status: os.stat_result) -> tuple[int, int, int, int]:
    # (the change time too: a copy that keeps the old modification time, or a chmod, still changes it)
    return status.st_mtime_ns, status.st_ctime_ns, status.st_size, status.st_ino


def sign_bytes(secret: bytes, envelope: SignalEnvelope) -> bytes:
    """Return the base64url HMAC-SHA256 signature of ``envelope`` as bytes."""
    digest = hmac.new(secret, canonical_bytes(envelope), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest)


def sign(envelope: SignalEnvelope, secret: bytes) -> SignalEnvelope:
    """Return ``envelope`` with its signature set (what a sender does). A payload that holds a set comes back as
    its JSON data with each set's members sorted: the order in which every process hashes it, whatever order
    this process's hash seed gave the set, so the envelope sent as JSON is the one that was signed.

    Raises:
        SignalRejectedError: the timestamp is not a finite number of seconds (``bad_timestamp``), as every gateway
            would refuse it.
        SerializationError: the payload is not JSON data, or a field holds a string that is not valid Unicode.
    """
    check_timestamp(envelope.timestamp)
    ordered = in_one_order(envelope.payload, what="the signal's payload")
    if canonical(ordered) != canonical(to_plain(envelope.payload, what="the signal's payload")):
        envelope = msgspec.structs.replace(envelope, payload=ordered)  # it held a set, in this process's order
    return msgspec.structs.replace(envelope, signature=sign_bytes(secret, envelope).decode())
