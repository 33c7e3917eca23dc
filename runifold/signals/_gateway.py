"""Delivering signals: authenticate, check scope, deduplicate, audit."""

from __future__ import annotations

from typing import final

import structlog

from runifold.errors import RunNotFoundError, SignalRejectedError
from runifold.signals._auth import Authenticator, SignalEnvelope, payload_hash
from runifold.stores import AuditRecord, SignalDelivery, SignalReceipt, WorkflowStore
from runifold.worker import WorkflowRegistry

log = structlog.get_logger("runifold.signals")


@final
class SignalGateway:
    """The one way signals reach runs: every attempt is verified and audited.

    A signal is accepted only if its envelope is authentic and fresh, the run's
    workflow definition declares its name, and the definition allows its sender
    to send that name. A rejected signal changes no run state; it raises
    :class:`SignalRejectedError` and is kept in the audit log.
    """

    def __init__(self, store: WorkflowStore, registry: WorkflowRegistry, authenticator: Authenticator) -> None:
        self.store = store
        self.registry = registry
        self.authenticator = authenticator

    async def send(self, envelope: SignalEnvelope) -> SignalReceipt:
        """Verify and deliver ``envelope``; a repeated ``signal_id`` returns the original receipt."""
        try:
            run = await self.store.get_run(envelope.target)
        except RunNotFoundError:
            await self._reject(envelope, None, SignalRejectedError("unknown_run", f"no run {envelope.target!r}"))
            raise
        try:
            self.authenticator.verify(envelope, await self.store.now())
            definition = self.registry.get(run.name, run.version)
            if definition is None:
                raise SignalRejectedError(
                    "unknown_definition",
                    f"workflow {run.name!r} v{run.version} is not registered here, so the signal's scope cannot be checked",
                )
            if envelope.name not in definition.signals:
                raise SignalRejectedError(
                    "unknown_signal", f"workflow {run.name!r} v{run.version} declares no signal {envelope.name!r}"
                )
            if not definition.allows_signal(envelope.name, envelope.sender):
                raise SignalRejectedError(
                    "out_of_scope", f"sender {envelope.sender!r} may not send {envelope.name!r} to {run.name!r}"
                )
        except SignalRejectedError as exc:
            await self._reject(envelope, run.run_id, exc)
            raise
        # invariant: delivered to the run resolved (and authorised against) above, never looked up again
        receipt = await self.store.deliver_signal(SignalDelivery(
            envelope.target, run.run_id, envelope.signal_id, envelope.name, envelope.payload, envelope.sender,
            envelope.key_id, envelope.reason, payload_hash(envelope.payload),
        ))
        log.info("signal_delivered", run_id=receipt.run_id, signal_id=envelope.signal_id, sender=envelope.sender,
                 duplicate=receipt.duplicate)
        return receipt

    async def _reject(self, envelope: SignalEnvelope, run_id: str | None, exc: SignalRejectedError) -> None:
        log.warning("signal_rejected", run_ref=envelope.target, sender=envelope.sender, verdict=exc.verdict)
        await self.store.record_rejected(AuditRecord(
            run_id, envelope.target, envelope.signal_id, envelope.name, envelope.sender, envelope.key_id,
            f"rejected:{exc.verdict}", payload_hash(envelope.payload), envelope.reason, exc.reason,
            await self.store.now(),
        ))
