"""Signals: signed envelopes, the ``Authenticator`` protocol, the HMAC key ring, limits, and the gateway."""

from runifold.signals._auth import (
    Authenticator,
    HmacKeyRing,
    KeyInfo,
    SignalEnvelope,
    canonical_bytes,
    payload_hash,
    sign,
)
from runifold.signals._gateway import SignalGateway
from runifold.signals._limits import SignalLimits

__all__ = [
    "Authenticator", "HmacKeyRing", "KeyInfo", "SignalEnvelope", "SignalGateway", "SignalLimits", "canonical_bytes",
    "payload_hash", "sign",
]
