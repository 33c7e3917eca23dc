"""Signals: signed envelopes, the ``Authenticator`` protocol, the HMAC key ring, and the gateway."""

from runifold.signals._auth import (
    Authenticator,
    HmacKeyRing,
    SignalEnvelope,
    canonical_bytes,
    payload_hash,
    sign,
)
from runifold.signals._gateway import SignalGateway

__all__ = ["Authenticator", "HmacKeyRing", "SignalEnvelope", "SignalGateway", "canonical_bytes", "payload_hash", "sign"]
