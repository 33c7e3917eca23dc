"""``runifold worker``, ``enqueue``, ``resolve``, ``cancel``, ``migrate``: operating runs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
from datetime import timedelta

import msgspec

from runifold._log import get_logger
from runifold.cli._common import (
    ArgumentError,
    exit_on_stop_signals,
    checkpoint_id,
    drop_output,
    emit_json,
    lease_seconds,
    operator,
    parse_json,
    positive_int,
    registry_of,
    seconds,
    store_of,
    text,
    version,
)
from runifold.errors import ConfigurationError, InvalidInputError
from runifold.history import Resolution
from runifold.stores import RunStatus, WorkflowTask
from runifold.worker import LeaseDuration, Supervisor, WorkerId, WorkflowWorker, cancel_run, resolve_effect

MAX_CONCURRENCY = 10_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = sub.add_parser("worker", help="run a supervisor: claim and drive runs until SIGTERM/SIGINT")
    worker.add_argument("--concurrency", type=positive_int(MAX_CONCURRENCY), default=8,
                        help="runs driven at once (default 8)")
    worker.add_argument("--worker-id", help="lease owner id (default host-pid)")
    worker.add_argument("--lease", type=lease_seconds, default=30.0, help="lease seconds (default 30); renewed every third")
    worker.add_argument("--idle-wait", type=seconds, default=1.0,
                        help="seconds an idle slot waits before polling again (default 1)")
    worker.add_argument("--grace", type=seconds, default=10.0,
                        help="seconds in-flight runs get on shutdown before their leases are released (default 10); "
                             "a second SIGTERM/SIGINT releases them at once")
    worker.add_argument("--schedule-every", type=seconds, default=1.0,
                        help="seconds between checks of the schedules for due ticks (default 1)")
    worker.set_defaults(handler=worker_cmd)

    enqueue = sub.add_parser("enqueue", help="start a run (idempotent by --checkpoint-id)")
    enqueue.add_argument("name")
    enqueue.add_argument("version", type=version)
    enqueue.add_argument("--input", default="{}", help="JSON object of workflow arguments")
    enqueue.add_argument("--checkpoint-id", type=checkpoint_id, help="durable identity of the run")
    enqueue.add_argument("--concurrency-key", help="at most --concurrency-limit runs of this key run at once "
                                                   "(default: the definition's ConcurrencyLimit, if any)")
    enqueue.add_argument("--concurrency-limit", type=positive_int(MAX_CONCURRENCY), help="with --concurrency-key")
    enqueue.set_defaults(handler=enqueue_cmd)

    resolve = sub.add_parser("resolve", help="settle an ambiguous effect of a parked run")
    resolve.add_argument("run")
    resolve.add_argument("effect", help="the effect's key, e.g. charge_card#1")
    how = resolve.add_mutually_exclusive_group(required=True)
    how.add_argument("--applied", metavar="JSON", help="it took place; JSON is what it returned")
    how.add_argument("--retry", action="store_true", help="run it again with the same idempotency key")
    how.add_argument("--fail", action="store_true", help="the workflow receives EffectFailedError")
    resolve.add_argument("--reason", required=True, type=text)
    resolve.add_argument("--by", default=operator(), type=text, help="who decides (default: your user name)")
    resolve.set_defaults(handler=resolve_cmd)

    cancel = sub.add_parser("cancel", help="cancel an unfinished run (cancelling a cancelled run changes nothing)")
    cancel.add_argument("run")
    cancel.add_argument("--reason", required=True, type=text)
    cancel.add_argument("--by", default=operator(), type=text, help="who decides (default: your user name)")
    cancel.set_defaults(handler=cancel_cmd)

    migrate = sub.add_parser("migrate", help="create or migrate the store's schema")
    migrate.set_defaults(handler=migrate_cmd)


def _on_stop(supervisor: Supervisor, grace: float, log_format: str) -> None:
    """SIGTERM/SIGINT: the first stops gracefully, a second one stops at once.

    Each says so on stderr: a line of text, or with ``--log-format json`` a log record (``worker_stopping``).
    """
    state = {"signals": 0}

    def say(now: bool, text: str) -> None:
        with contextlib.suppress(OSError):  # stderr's reader went away (`| head`): stopping goes on
            if log_format == "json":
                get_logger("runifold.cli").warning("worker_stopping", now=now, grace_seconds=0 if now else grace,
                                                   message=text)
            else:
                print(text, file=sys.stderr, flush=True)

    def handle() -> None:
        state["signals"] += 1
        # invariant: the stop comes first; saying so can fail (a closed pipe) and must not prevent it
        if state["signals"] == 1:
            supervisor.stop()
            say(False, f"stopping: in-flight runs get up to {grace:g} s; send SIGTERM or press Ctrl-C again to stop at once")
        else:
            supervisor.stop(now=True)
            say(True, "stopping now: in-flight runs are cancelled and their leases released")

    loop = asyncio.get_running_loop()

    def on_signal(signum: int, frame: object) -> None:
        # run by Python between two lines of code, even while a step blocks the event loop: no slot claims from
        # now on, and the loop says so and stops the rest when it next turns
        supervisor.stop_soon()
        loop.call_soon_threadsafe(handle)

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):  # (not the main thread)
            signal.signal(sig, on_signal)


async def worker_cmd(args: argparse.Namespace) -> int:
    registry = registry_of(args)
    if not list(registry.versions()):  # (helper-98: it started, "serving" nothing, and never said so)
        raise ArgumentError(f"--app {args.app} holds no workflow, so the worker would serve nothing: register your "
                            "definitions in it (registry.register(WorkflowDefinition(...)))")
    try:
        worker_id = WorkerId.parse(f"{socket.gethostname()}-{os.getpid()}" if args.worker_id is None else args.worker_id)
    except ConfigurationError as exc:  # a bad --worker-id (the host's name makes a good one)
        raise ArgumentError(str(exc)) from None
    store = await store_of(args, create=True)
    try:
        worker = WorkflowWorker(store, registry, worker_id, LeaseDuration(timedelta(seconds=args.lease)),
                                timedelta(seconds=args.lease / 3))
        supervisor = Supervisor(worker, args.concurrency, idle_wait=timedelta(seconds=args.idle_wait),
                                grace=timedelta(seconds=args.grace),
                                schedule_every=timedelta(seconds=args.schedule_every))
        # (before the worker says it serves: a SIGTERM from then on stops it as a SIGTERM should)
        _on_stop(supervisor, args.grace, args.log_format)
        serving = [f"{n} v{v}" for n, v in registry.versions()]
        _tell(args.json, {"event": "worker_started", "worker_id": str(worker_id), "serving": serving,
                          "concurrency": args.concurrency},
              f"worker {worker_id} serving {', '.join(serving)} with concurrency {args.concurrency}")
        await supervisor.run(handle_signals=False)
    finally:
        await store.close()
    counts = ", ".join(f"{name} {count}" for name, count in sorted(supervisor.outcomes.items())) or "nothing"
    _tell(args.json, {"event": "worker_stopped", "worker_id": str(worker_id), "outcomes": supervisor.outcomes},
          f"worker {worker_id} stopped: {counts}")
    exit_on_stop_signals()
    return 0


def _tell(as_json: bool, record: dict[str, object], line: str) -> None:
    """Write one of the worker's lines to stdout, as JSON or as text.

    The worker's output only informs: a reader gone away (a closed pipe) neither stops the worker nor changes
    its exit status, and what it would have read is dropped.
    """
    try:
        if as_json:
            emit_json(record)
        else:
            print(line)
        sys.stdout.flush()
    except OSError:
        drop_output()


async def enqueue_cmd(args: argparse.Namespace) -> int:
    data = parse_json(args.input, "--input")
    if not isinstance(data, dict):
        raise ArgumentError("--input must be a JSON object of workflow arguments")
    if (args.concurrency_key is None) != (args.concurrency_limit is None):
        raise ArgumentError("--concurrency-key and --concurrency-limit go together: give both, or neither to use "
                            "the definition's ConcurrencyLimit")
    try:
        task = WorkflowTask(args.name, args.version, data, args.checkpoint_id, concurrency_key=args.concurrency_key,
                            concurrency_limit=args.concurrency_limit)
    except InvalidInputError as exc:  # a flag's value the task cannot take (NUL in a name or a checkpoint id, say)
        raise ArgumentError(str(exc)) from exc
    task = registry_of(args).validate(task)
    store = await store_of(args, create=True)
    try:
        result = await store.enqueue(task)
        status = None if result.created else (await store.get_run(result.run_id)).status
    finally:
        await store.close()
    if args.json:
        emit_json({**msgspec.to_builtins(result), "status": status or "ready"})
    elif result.created:
        print(f"enqueued {result.run_id}")
    elif status is RunStatus.FAILED:
        print(f"already enqueued {result.run_id}, which failed: continue it with "
              f"`runifold retry {result.run_id} --reason ...`")
    else:
        print(f"already enqueued {result.run_id} ({status})")
    return 0


async def resolve_cmd(args: argparse.Namespace) -> int:
    if args.applied is not None:
        resolution, output = Resolution.APPLIED, parse_json(args.applied, "--applied")
    else:
        resolution, output = (Resolution.RETRY if args.retry else Resolution.FAIL), None
    store = await store_of(args)
    try:
        # (only an APPLIED output is checked against the code)
        registry = registry_of(args) if resolution is Resolution.APPLIED else None
        info = await store.get_run(args.run)
        result = await resolve_effect(store, registry, info.run_id, args.effect, resolution, by=args.by,
                                      reason=args.reason, output=output)
    finally:
        await store.close()
    if args.json:
        emit_json({"run_id": info.run_id, "checkpoint_id": info.checkpoint_id, "effect": args.effect,
                   "resolution": resolution, "revision": result.revision})
    else:
        print(f"resolved {args.effect} of {args.run} as {resolution} (revision {result.revision}); the run is ready")
    return 0


async def cancel_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args)
    try:
        info = await store.get_run(args.run)
        already = info.status is RunStatus.CANCELLED
        result = await cancel_run(store, info.run_id, by=args.by, reason=args.reason)
    finally:
        await store.close()
    if args.json:
        emit_json({"run_id": info.run_id, "checkpoint_id": info.checkpoint_id, "revision": result.revision,
                   "already_cancelled": already})
    else:
        print(f"{args.run} was already cancelled (revision {result.revision})" if already
              else f"cancelled {args.run} (revision {result.revision})")
    return 0


async def migrate_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args, create=True)
    try:
        schema = await store.migrate()
    finally:
        await store.close()
    if args.json:
        emit_json({"schema_version": schema})
    else:
        print(f"schema at version {schema}")
    return 0
