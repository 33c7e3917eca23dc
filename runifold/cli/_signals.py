"""``runifold signal`` and ``audit``: sending signed signals and reading who sent what."""

from __future__ import annotations

import argparse
import time

import msgspec

from runifold.cli._common import UsageError, clip, emit_json, parse_json, printable, registry_of, store_of, table, text, when
from runifold.signals import HmacKeyRing, SignalEnvelope, SignalGateway, sign

NO_RING = ("`runifold signal` verifies the signature against the deployment's key ring, never the sender's own file: "
           "pass --keys RING or set RUNIFOLD_KEYS (create or extend one with `runifold keys add --keys RING KEY_FILE`)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    signal = sub.add_parser("signal", help="sign a signal with the sender's key and deliver it, verified against --keys")
    signal.add_argument("run", help="run id or checkpoint id")
    signal.add_argument("name", help="signal name, e.g. approval")
    signal.add_argument("--payload", default="{}", help="JSON payload (default {})")
    signal.add_argument("--signal-id", required=True, help="your id for this signal; resending it is deduplicated")
    signal.add_argument("--as", dest="sender", required=True, help="the sender's identity")
    signal.add_argument("--key-file", required=True, help="the sender's key file (signs; see `runifold keys new`)")
    signal.add_argument("--keys", help="the deployment's key ring the signature is verified against (required)")
    signal.add_argument("--reason", required=True, type=text, help="why: kept in the history and the audit")
    signal.set_defaults(handler=signal_cmd)

    audit = sub.add_parser("audit", help="every signal attempt on a run: accepted, duplicate, rejected")
    audit.add_argument("run", help="run id or checkpoint id")
    audit.set_defaults(handler=audit_cmd)


async def signal_cmd(args: argparse.Namespace) -> int:
    if not args.keys:
        raise UsageError(NO_RING)
    registry = registry_of(args)
    payload = parse_json(args.payload, "--payload")
    deployment = HmacKeyRing.from_file(args.keys)
    own = HmacKeyRing.from_file(args.key_file)
    key_id = own.signing_key(args.sender)
    envelope = sign(SignalEnvelope(target=args.run, name=args.name, payload=payload, signal_id=args.signal_id,
                                   sender=args.sender, reason=args.reason, key_id=key_id, timestamp=time.time()),
                    own.secret_of(key_id))
    store = await store_of(args)
    try:
        receipt = await SignalGateway(store, registry, deployment).send(envelope)
    finally:
        await store.close()
    if args.json:
        emit_json(msgspec.to_builtins(receipt))
    else:
        state = "duplicate of an earlier delivery" if receipt.duplicate else "accepted"
        print(printable(f"signal {receipt.signal_id} to {receipt.run_id}: {state} at {when(receipt.received_at)} "
                        f"(run is {receipt.run_status})"))
    return 0


async def audit_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args, readonly=True)
    try:
        records = await store.audit(args.run)  # the run's attempts, and those made under this reference
        if not records:
            await store.get_run(args.run)  # a reference with neither a run nor attempts is an error, not an empty audit
    finally:
        await store.close()
    if args.json:
        emit_json([msgspec.to_builtins(r) for r in records])
        return 0
    table(["at", "verdict", "signal", "signal_id", "sender", "key_id", "reason", "detail"],
          [[when(r.at), r.verdict, clip(r.name, 40), clip(r.signal_id, 40), clip(r.sender, 40), clip(r.key_id, 40),
            clip(r.reason, 60), clip(r.detail, 80)] for r in records])
    return 0
