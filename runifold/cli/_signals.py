"""``runifold signal`` and ``audit``: sending signed signals and reading who sent what."""

from __future__ import annotations

import argparse
import time

import msgspec

from runifold.cli._common import emit_json, parse_json, registry_of, store_of, table, when
from runifold.signals import HmacKeyRing, SignalEnvelope, SignalGateway, sign


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    signal = sub.add_parser("signal", help="sign and send a signal to a run")
    signal.add_argument("run", help="run id or checkpoint id")
    signal.add_argument("name", help="signal name, e.g. approval")
    signal.add_argument("--payload", default="{}", help="JSON payload")
    signal.add_argument("--signal-id", required=True, help="your id for this signal; resending it is deduplicated")
    signal.add_argument("--as", dest="sender", required=True, help="the sender's identity")
    signal.add_argument("--key-file", required=True, help="JSON key file holding the sender's key")
    signal.add_argument("--keys", help="key ring the gateway verifies against (default: --key-file)")
    signal.add_argument("--reason", required=True, help="why: kept in the history and the audit")
    signal.set_defaults(handler=signal_cmd)

    audit = sub.add_parser("audit", help="every signal attempt on a run: accepted, duplicate, rejected")
    audit.add_argument("run", help="run id or checkpoint id")
    audit.set_defaults(handler=audit_cmd)


async def signal_cmd(args: argparse.Namespace) -> int:
    registry = registry_of(args)
    payload = parse_json(args.payload, "--payload")
    own = HmacKeyRing.from_file(args.key_file)
    key_id = own.signing_key(args.sender)
    envelope = sign(SignalEnvelope(target=args.run, name=args.name, payload=payload, signal_id=args.signal_id,
                                   sender=args.sender, reason=args.reason, key_id=key_id, timestamp=time.time()),
                    own.secret_of(key_id))
    verifier = HmacKeyRing.from_file(args.keys) if args.keys else own
    store = await store_of(args)
    try:
        receipt = await SignalGateway(store, registry, verifier).send(envelope)
    finally:
        await store.close()
    if args.json:
        emit_json(msgspec.to_builtins(receipt))
    else:
        state = "duplicate of an earlier delivery" if receipt.duplicate else "accepted"
        print(f"signal {receipt.signal_id} to {receipt.run_id}: {state} at {when(receipt.received_at)} "
              f"(run is {receipt.run_status})")
    return 0


async def audit_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args)
    try:
        records = await store.audit(args.run)
    finally:
        await store.close()
    if args.json:
        emit_json([msgspec.to_builtins(r) for r in records])
        return 0
    table(["at", "verdict", "signal", "signal_id", "sender", "key_id", "reason", "detail"],
          [[when(r.at), r.verdict, r.name, r.signal_id, r.sender, r.key_id, r.reason, r.detail] for r in records])
    return 0
