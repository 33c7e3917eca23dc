"""``runifold retry``, ``wake`` and ``purge``: recovering failed and rescheduled runs, and retention."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from typing import Any

import msgspec

from runifold.cli._common import ArgumentError, emit_json, operator, positive_int, printable, store_of, text, version, when
from runifold.errors import InvalidStateError
from runifold.stores import RunStatus
from runifold.worker import retry_run

_PAGE = 100
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([dhms])$")
_UNIT = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    retry = sub.add_parser("retry", help="continue a failed run from its history (or every failed run of a workflow)")
    retry.add_argument("run", nargs="?", help="run id or checkpoint id of a failed run")
    retry.add_argument("--name", help="retry every failed run of this workflow (with --status failed)")
    retry.add_argument("--version", type=version, help="with --name: only runs of this version")
    retry.add_argument("--status", choices=[RunStatus.FAILED.value],
                       help="with --name: which runs (only failed runs can be retried)")
    retry.add_argument("--reason", required=True, type=text, help="why: kept in the history")
    retry.add_argument("--by", default=operator(), type=text, help="who decides (default: your user name)")
    retry.set_defaults(handler=retry_cmd)

    wake = sub.add_parser("wake", help="make a run due now: a diverged run is replayed at once (after deploying fixed code); any other run is looked at, its timers and retry backoffs keep their times")
    wake.add_argument("run", help="run id or checkpoint id")
    wake.set_defaults(handler=wake_cmd)

    purge = sub.add_parser("purge", help="delete finished runs (with history, signals, audit) that finished before a time")
    purge.add_argument("--finished-before", required=True, metavar="AGE_OR_DATE",
                       help="an age (30d, 12h, 90m, 45s) or an ISO-8601 date or time (UTC unless it says otherwise)")
    purge.add_argument("--batch", type=positive_int(100_000), default=1_000,
                       help="runs deleted per transaction (default 1000)")
    purge.set_defaults(handler=purge_cmd)


async def retry_cmd(args: argparse.Namespace) -> int:
    if args.run and (args.name or args.version is not None or args.status):
        raise ArgumentError("give either a RUN, or --name (with --version and --status failed) for many runs, not both")
    if not args.run and not args.name:
        raise ArgumentError("give a RUN to retry, or --name NAME --status failed to retry every failed run of a workflow")
    if args.name and args.status != RunStatus.FAILED:
        raise ArgumentError("retrying many runs needs --status failed: only failed runs can be retried")
    store = await store_of(args)
    results: list[dict[str, Any]] = []
    try:
        if args.run:
            info = await store.get_run(args.run)
            result = await retry_run(store, info.run_id, by=args.by, reason=args.reason)
            results.append({"run_id": info.run_id, "checkpoint_id": info.checkpoint_id, "retried": True,
                            "revision": result.revision})
        else:
            after: str | None = None
            while True:
                page = await store.list_runs(status=RunStatus.FAILED, name=args.name, version=args.version,
                                             limit=_PAGE, after=after)
                for info in page:
                    try:
                        result = await retry_run(store, info.run_id, by=args.by, reason=args.reason)
                    except InvalidStateError as exc:  # it cannot be retried, or changed since the listing (retried by someone else)
                        results.append({"run_id": info.run_id, "checkpoint_id": info.checkpoint_id, "retried": False,
                                        "error": str(exc)})
                    else:
                        results.append({"run_id": info.run_id, "checkpoint_id": info.checkpoint_id, "retried": True,
                                        "revision": result.revision})
                    if not args.json:
                        _print_retry(results[-1])
                if len(page) < _PAGE:
                    break
                after = page[-1].run_id
    finally:
        await store.close()
    if args.json:
        emit_json(results)
    elif args.run:
        _print_retry(results[0])
    else:
        done = sum(r["retried"] for r in results)
        which = printable(args.name) + ("" if args.version is None else f" v{args.version}")
        print(f"{done} failed run(s) of {which} retried" + (
            f", {len(results) - done} skipped" if done < len(results) else "")
            + ("" if results else f" (no failed runs of {which}: check with `runifold runs list --name ...`)"))
    return 0 if all(r["retried"] for r in results) else 1


def _print_retry(result: dict[str, Any]) -> None:
    name = result["run_id"] + (f" ({result['checkpoint_id']})" if result["checkpoint_id"] else "")
    if result["retried"]:
        print(printable(f"retried {name}: ready at revision {result['revision']}"))
    else:
        print(printable(f"skipped {name}: {result['error']}"))


async def wake_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args)
    try:
        info = await store.wake(args.run)
    finally:
        await store.close()
    if args.json:
        emit_json(msgspec.to_builtins(info))
    else:
        line = f"{info.run_id} ({info.checkpoint_id or '-'}) is {info.status}, due now ({when(info.due_at)})"
        if info.status.finished:  # it finished between the wake and this reading
            line = f"{info.run_id} ({info.checkpoint_id or '-'}) is {info.status}: it finished meanwhile"
        elif info.status is not RunStatus.DIVERGED:
            line += "; a worker looks at it at once, but its timers and retry backoffs keep their times"
        print(printable(line))
    return 0


def cutoff(text: str, now: float) -> float:
    """The time ``--finished-before`` names: ``now`` minus an age (``30d``), or an ISO-8601 date or time."""
    match = _DURATION.match(text.strip())
    if match:
        age = float(match.group(1)) * _UNIT[match.group(2)]
        if not age > 0:
            raise ArgumentError(f"--finished-before {text!r} is an age of zero, which would purge every finished run; "
                                "give a positive age (30d), or a date or time to purge what finished before it")
        if age > now:
            raise ArgumentError(f"--finished-before {text!r} reaches back before 1970, before any run finished; "
                                f"give an age of at most {now // 86400:.0f}d")
        return now - age
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ArgumentError(f"--finished-before {text!r} is neither an age (30d, 12h, 90m, 45s) nor an ISO-8601 date "
                            "(2026-01-31 or 2026-01-31T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if moment.timestamp() > now:
        raise ArgumentError(f"--finished-before {text!r} is in the future, which would purge every finished run; "
                            "give a date or time that has passed, or an age (30d)")
    return moment.timestamp()


async def purge_cmd(args: argparse.Namespace) -> int:
    store = await store_of(args)
    try:
        before = cutoff(args.finished_before, await store.now())
        purged = 0
        while True:
            batch = await store.purge_finished(before, limit=args.batch)  # one transaction each
            purged += batch
            if batch == 0:
                break
    finally:
        await store.close()
    if args.json:
        emit_json({"purged": purged, "finished_before": before})
    else:
        print(f"purged {purged} finished run(s) that finished before {when(before)}")
    return 0
