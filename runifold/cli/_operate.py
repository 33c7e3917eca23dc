"""``runifold worker``, ``enqueue``, ``resolve``, ``cancel``, ``migrate``: operating runs."""

from __future__ import annotations

import argparse
import getpass
import os
import socket
from datetime import timedelta

import msgspec

from runifold.cli._common import UsageError, check_positive, emit_json, parse_json, registry_of, store_of
from runifold.history import Resolution
from runifold.stores import WorkflowTask
from runifold.worker import LeaseDuration, Supervisor, WorkerId, WorkflowWorker, cancel_run, resolve_effect


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown-operator"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = sub.add_parser("worker", help="run a supervisor: claim and drive runs until SIGTERM/SIGINT")
    worker.add_argument("--concurrency", type=int, default=8, help="runs driven at once (default 8)")
    worker.add_argument("--worker-id", help="lease owner id (default host-pid)")
    worker.add_argument("--lease", type=check_positive, default=30.0, help="lease seconds (default 30); renewed every third")
    worker.add_argument("--idle-wait", type=check_positive, default=1.0,
                        help="seconds an idle slot waits before polling again (default 1)")
    worker.add_argument("--grace", type=check_positive, default=10.0,
                        help="seconds in-flight runs get on shutdown before their leases are released (default 10)")
    worker.set_defaults(handler=worker_cmd)

    enqueue = sub.add_parser("enqueue", help="start a run (idempotent by --checkpoint-id)")
    enqueue.add_argument("name")
    enqueue.add_argument("version", type=int)
    enqueue.add_argument("--input", default="{}", help="JSON object of workflow arguments")
    enqueue.add_argument("--checkpoint-id", help="durable identity of the run")
    enqueue.set_defaults(handler=enqueue_cmd)

    resolve = sub.add_parser("resolve", help="settle an ambiguous effect of a parked run")
    resolve.add_argument("run")
    resolve.add_argument("effect", help="the effect's key, e.g. charge_card#1")
    how = resolve.add_mutually_exclusive_group(required=True)
    how.add_argument("--applied", metavar="JSON", help="it took place; JSON is what it returned")
    how.add_argument("--retry", action="store_true", help="run it again with the same idempotency key")
    how.add_argument("--fail", action="store_true", help="the workflow receives EffectFailedError")
    resolve.add_argument("--reason", required=True)
    resolve.add_argument("--by", default=_operator(), help="who decides (default: your user name)")
    resolve.set_defaults(handler=resolve_cmd)

    cancel = sub.add_parser("cancel", help="cancel an unfinished run")
    cancel.add_argument("run")
    cancel.add_argument("--reason", required=True)
    cancel.add_argument("--by", default=_operator(), help="who decides (default: your user name)")
    cancel.set_defaults(handler=cancel_cmd)

    migrate = sub.add_parser("migrate", help="create or migrate the store's schema")
    migrate.set_defaults(handler=migrate_cmd)


async def worker_cmd(args: argparse.Namespace) -> int:
    registry = registry_of(args)
    if args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    worker_id = WorkerId.parse(args.worker_id or f"{socket.gethostname()}-{os.getpid()}")
    store = await store_of(args)
    try:
        worker = WorkflowWorker(store, registry, worker_id, LeaseDuration(timedelta(seconds=args.lease)),
                                timedelta(seconds=args.lease / 3))
        supervisor = Supervisor(worker, args.concurrency, idle_wait=timedelta(seconds=args.idle_wait),
                                grace=timedelta(seconds=args.grace))
        print(f"worker {worker_id} serving {', '.join(f'{n} v{v}' for n, v in registry.versions())} "
              f"with concurrency {args.concurrency}", flush=True)
        await supervisor.run()
        print(f"worker {worker_id} stopped: {supervisor.outcomes}", flush=True)
    finally:
        await store.close()
    return 0


async def enqueue_cmd(args: argparse.Namespace) -> int:
    data = parse_json(args.input, "--input")
    if not isinstance(data, dict):
        raise UsageError("--input must be a JSON object of workflow arguments")
    task = registry_of(args).validate(WorkflowTask(args.name, args.version, data, args.checkpoint_id))
    store = await store_of(args)
    try:
        result = await store.enqueue(task)
    finally:
        await store.close()
    if args.json:
        emit_json(msgspec.to_builtins(result))
    else:
        print(f"{'enqueued' if result.created else 'already enqueued'} {result.run_id}")
    return 0


async def resolve_cmd(args: argparse.Namespace) -> int:
    if args.applied is not None:
        resolution, output = Resolution.APPLIED, parse_json(args.applied, "--applied")
    else:
        resolution, output = (Resolution.RETRY if args.retry else Resolution.FAIL), None
    store = await store_of(args)
    try:
        result = await resolve_effect(store, registry_of(args), args.run, args.effect, resolution, by=args.by,
                                      reason=args.reason, output=output)
    finally:
        await store.close()
    print(f"resolved {args.effect} of {args.run} as {resolution} (revision {result.revision}); the run is ready")
    return 0


async def cancel_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args)
    try:
        result = await cancel_run(store, args.run, by=args.by, reason=args.reason)
    finally:
        await store.close()
    print(f"cancelled {args.run} (revision {result.revision})")
    return 0


async def migrate_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args)
    try:
        version = await store.migrate()
    finally:
        await store.close()
    print(f"schema at version {version}")
    return 0
