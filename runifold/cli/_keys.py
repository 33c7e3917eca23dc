"""``runifold keys``: a sender's key file, and the deployment's key ring that signals are verified against."""

from __future__ import annotations

import argparse
import os
import secrets

from runifold.cli._common import UsageError, emit_json, printable, table
from runifold.signals import HmacKeyRing


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="create a sender's key; add, revoke and list the deployment's keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")

    new = keys_sub.add_parser("new", help="create a sender's key file (mode 0600): it signs, and is given to the sender")
    new.add_argument("--as", dest="sender", required=True, help="the sender the key belongs to, e.g. alice")
    new.add_argument("--key-id", help="the key's id (default <sender>-<8 random hex digits>); never reused")
    new.add_argument("--out", required=True, help="the file to create; an existing file is never overwritten")
    new.set_defaults(handler=new_cmd)

    add = keys_sub.add_parser("add", help="trust a sender's key: copy it into the deployment's key ring")
    add.add_argument("key_file", help="the sender's key file (from `runifold keys new`)")
    add.add_argument("--keys", required=True, help="the deployment's key ring (created if it does not exist)")
    add.set_defaults(handler=add_cmd)

    revoke = keys_sub.add_parser("revoke", help="refuse every signal signed with a key from now on")
    revoke.add_argument("key_id")
    revoke.add_argument("--keys", required=True, help="the deployment's key ring")
    revoke.set_defaults(handler=revoke_cmd)

    listing = keys_sub.add_parser("list", help="the keys of a ring: id, sender, active or revoked (never a secret)")
    listing.add_argument("--keys", required=True, help="the deployment's key ring (or a sender's key file)")
    listing.set_defaults(handler=list_cmd)


async def new_cmd(args: argparse.Namespace) -> int:
    key_id = args.key_id or f"{args.sender}-{secrets.token_hex(4)}"
    ring = HmacKeyRing()
    ring.add(key_id, args.sender, HmacKeyRing.new_secret())
    ring.to_file(args.out, overwrite=False)
    if args.json:
        emit_json({"key_id": key_id, "sender": args.sender, "path": args.out})
    else:
        print(printable(f"wrote key {key_id} of {args.sender} to {args.out} (mode 0600). Give it to {args.sender} "
                        f"only; trust it with `runifold keys add --keys RING {args.out}`"))
    return 0


async def add_cmd(args: argparse.Namespace) -> int:
    ring = HmacKeyRing.from_file(args.keys) if os.path.exists(args.keys) else HmacKeyRing()
    added = ring.merge(HmacKeyRing.from_file(args.key_file))
    if not added:
        raise UsageError(f"{args.key_file} holds no keys")
    ring.to_file(args.keys)
    if args.json:
        emit_json({"added": added, "keys": args.keys})
    else:
        print(printable(f"added {', '.join(added)} to {args.keys}"))
    return 0


async def revoke_cmd(args: argparse.Namespace) -> int:
    ring = HmacKeyRing.from_file(args.keys)
    newly = ring.revoke(args.key_id)
    if newly:
        ring.to_file(args.keys)
    if args.json:
        emit_json({"revoked": args.key_id, "keys": args.keys, "already": not newly})
    elif newly:
        print(printable(f"revoked {args.key_id} in {args.keys}: signals signed with it are refused from now on"))
    else:
        print(printable(f"{args.key_id} in {args.keys} was revoked already: nothing changed"))
    return 0


async def list_cmd(args: argparse.Namespace) -> int:
    keys = HmacKeyRing.from_file(args.keys).keys()
    if args.json:
        emit_json([{"key_id": k.key_id, "sender": k.sender, "revoked": k.revoked} for k in keys])
    else:
        table(["key_id", "sender", "state"], [[k.key_id, k.sender, "revoked" if k.revoked else "active"] for k in keys])
    return 0
