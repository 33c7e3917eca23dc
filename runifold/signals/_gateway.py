"""Delivering signals: check limits, authenticate, check scope, deduplicate, audit."""

from __future__ import annotations

from typing import final

from runifold._log import get_logger
from runifold.errors import RunNotFoundError, SignalRejectedError
from runifold.signals._auth import Authenticator, SignalEnvelope, payload_hash
from runifold.signals._limits import SignalLimits
from runifold.stores import AuditRecord, RunInfo, SignalDelivery, SignalReceipt, WorkflowStore
from runifold.worker import WorkflowRegistry

log = get_logger("runifold.signals")


@final
class SignalGateway:
    """The one way signals reach runs: every attempt is checked, verified and audited.

    A signal is accepted only if it is within ``limits`` (sizes, a finite
    timestamp, printable identifiers), its run exists, its envelope is
    authentic and fresh by ``authenticator`` (the deployment's keys, never
    the sender's), the run's workflow definition declares its name, and the
    definition allows its sender to send that name. Anything else raises
    :class:`SignalRejectedError` (``verdict`` says which check refused it),
    changes no run state, and is kept in the audit log cut to the limits'
    lengths. The store refuses a signal id reused with another payload
    (:class:`SignalConflictError`) and a run whose unconsumed signals reached
    ``limits.max_unconsumed`` (``inbox_full``), and audits both itself.

    Args:
        store: where runs, signals and the audit live.
        registry: the definitions that say which senders may send which names.
        authenticator: verifies envelopes, e.g. an :class:`HmacKeyRing` loaded
            from the deployment's key ring.
        limits: sizes and caps (default :class:`SignalLimits`).
    """

    def __init__(
        self,
        store: WorkflowStore,
        registry: WorkflowRegistry,
        authenticator: Authenticator,
        *,
        limits: SignalLimits | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.authenticator = authenticator
        self.limits = limits or SignalLimits()

    async def send(self, envelope: SignalEnvelope) -> SignalReceipt:
        """Verify and deliver ``envelope``; a repeated ``signal_id`` with the same payload returns the original receipt.

        Raises:
            SignalRejectedError: the signal was refused; ``verdict`` says why.
            SignalConflictError: the signal id was used before with another name, payload, sender or reason.
        """
        try:
            self.limits.check(envelope)
        except SignalRejectedError as exc:
            await self._reject(envelope, await self._run_of(envelope), exc)
            raise
        run = await self._run_of(envelope)
        if run is None:
            rejection = SignalRejectedError(
                "unknown_run", f"no run with id or checkpoint id {envelope.target!r}; list runs with `runifold runs list`")
            await self._reject(envelope, None, rejection)
            raise rejection
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
                    "out_of_scope", f"sender {envelope.sender!r} may not send {envelope.name!r} to workflow {run.name!r} v{run.version}"
                )
        except SignalRejectedError as exc:
            await self._reject(envelope, run, exc)
            raise
        try:
            # invariant: delivered to the run resolved (and authorised against) above, never looked up again
            receipt = await self.store.deliver_signal(SignalDelivery(
                run_ref=envelope.target, run_id=run.run_id, signal_id=envelope.signal_id, name=envelope.name,
                payload=envelope.payload, sender=envelope.sender, key_id=envelope.key_id, reason=envelope.reason,
                payload_hash=payload_hash(envelope.payload), max_unconsumed=self.limits.max_unconsumed,
                max_refused=self.limits.max_rejected_per_run,
            ))
        except SignalRejectedError as exc:  # a reused signal id, a full inbox: the store audited it
            # info, not warning: the caller gets the refusal as an exception and decides what it means
            log.info("signal_rejected", run_id=run.run_id, signal_id=envelope.signal_id, sender=envelope.sender,
                        verdict=exc.verdict)
            raise
        log.info("signal_delivered", run_id=receipt.run_id, signal_id=envelope.signal_id, sender=envelope.sender,
                 duplicate=receipt.duplicate)
        return receipt

    async def _run_of(self, envelope: SignalEnvelope) -> RunInfo | None:
        """The envelope's run, or None if it has none (or its target is not a run reference at all)."""
        target = envelope.target
        if not isinstance(target, str) or not target or len(target) > self.limits.max_target or not target.isprintable():
            return None
        try:
            return await self.store.get_run(target)
        except RunNotFoundError:
            return None

    async def _reject(self, envelope: SignalEnvelope, run: RunInfo | None, exc: SignalRejectedError) -> None:
        clip = self.limits.clip
        log.info("signal_rejected", run_ref=clip("target", envelope.target), sender=clip("sender", envelope.sender),
                    verdict=exc.verdict)
        try:
            digest = payload_hash(envelope.payload)
        except Exception:  # noqa: BLE001 - a payload that cannot even be hashed is recorded as such
            digest = "unhashable"
        await self.store.record_rejected(AuditRecord(
            None if run is None else run.run_id, clip("target", envelope.target), clip("signal_id", envelope.signal_id),
            clip("name", envelope.name), clip("sender", envelope.sender), clip("key_id", envelope.key_id),
            f"rejected:{exc.verdict}", digest, clip("reason", envelope.reason), clip("detail", exc.reason),
            await self.store.now(),
        ), max_per_run=self.limits.max_rejected_per_run)
