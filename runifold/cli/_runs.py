"""``runifold runs``, ``history`` and ``replay``: looking at runs."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from runifold.cli._common import UsageError, compact, emit_json, registry_of, store_of, table, when
from runifold.history import Entry, decode_event, fold
from runifold.stores import RunStatus
from runifold.worker._debug import ReplayReport, check_compatibility, replay_run


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = sub.add_parser("runs", help="list runs or show one run's checkpoint")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    listing = runs_sub.add_parser("list", help="list runs, newest first")
    listing.add_argument("--status", choices=[s.value for s in RunStatus])
    listing.add_argument("--name")
    listing.add_argument("--version", type=int)
    listing.add_argument("--limit", type=int, default=50)
    listing.set_defaults(handler=runs_list)
    show = runs_sub.add_parser("show", help="a run's checkpoint: phase, outputs, usage, waits, pending effects")
    show.add_argument("run", help="run id or checkpoint id")
    show.set_defaults(handler=runs_show)

    history = sub.add_parser("history", help="a run's event log as a timeline")
    history.add_argument("run", help="run id or checkpoint id")
    history.set_defaults(handler=history_cmd)

    replay = sub.add_parser("replay", help="re-run stored histories against today's code (no writes, no bodies)")
    replay.add_argument("run", nargs="?", help="run id or checkpoint id")
    replay.add_argument("--all", action="store_true", help="check every unfinished run (of --name, or every registered name)")
    replay.add_argument("--name", help="with --all: only runs of this workflow")
    replay.set_defaults(handler=replay_cmd)


async def runs_list(args: argparse.Namespace) -> int:
    store = await store_of(args)
    try:
        status = RunStatus(args.status) if args.status else None
        runs = await store.list_runs(status=status, name=args.name, version=args.version, limit=args.limit)
    finally:
        await store.close()
    if args.json:
        emit_json([msgspec.to_builtins(r) for r in runs])
        return 0
    table(["run_id", "checkpoint_id", "workflow", "status", "rev", "due", "lease_owner", "reason"],
          [[r.run_id, r.checkpoint_id, f"{r.name} v{r.version}", r.status, r.revision, when(r.due_at),
            r.lease_owner, r.reason[:40]] for r in runs])
    return 0


async def _entries(args: argparse.Namespace, run_ref: str) -> tuple[Any, list[Entry]]:
    store = await store_of(args)
    try:
        info = await store.get_run(run_ref)
        rows = await store.history(info.run_id)
    finally:
        await store.close()
    return info, [Entry(e.seq, e.at, decode_event(e.body, where=f"{info.run_id}#{e.seq}")) for e in rows]


async def runs_show(args: argparse.Namespace) -> int:
    info, entries = await _entries(args, args.run)
    checkpoint = fold(entries)
    budget = None
    if args.app:
        definition = registry_of(args).get(info.name, info.version)
        budget = definition.budget if definition else None
    if args.json:
        emit_json({"run": msgspec.to_builtins(info), "checkpoint": msgspec.to_builtins(checkpoint)})
        return 0
    print(f"run         {info.run_id}  (checkpoint {info.checkpoint_id or '-'})")
    print(f"workflow    {info.name} v{info.version}")
    print(f"status      {info.status}   phase {checkpoint.phase}   revision {info.revision}")
    print(f"lease       {info.lease_owner or '-'} until {when(info.lease_until)} (token {info.lease_token})")
    if info.reason:
        print(f"reason      {info.reason}")
    usage = checkpoint.usage
    def of(limit: float | None) -> str:
        return "" if budget is None else f" of {'unlimited' if limit is None else f'{limit:g}'}"

    limits = (of(budget.max_steps), of(budget.max_effect_attempts), of(budget.max_retries),
              of(budget.max_cost_units)) if budget else ("", "", "", "")
    print(f"usage       steps {usage.steps}{limits[0]}, effect attempts {usage.effect_attempts}{limits[1]}, "
          f"retries {usage.retries}{limits[2]}, cost units {usage.cost_units:g}{limits[3]}")
    print("outputs")
    for key, value in checkpoint.outputs.items():
        print(f"  {key:<28} {compact(value)}")
    for wait in checkpoint.waits:
        print(f"waiting     {wait.kind} {wait.key} {wait.signal or ''} until {when(wait.until)}")
    for key, state in checkpoint.pending_effects.items():
        print(f"effect      {key} is {state}")
    if checkpoint.failure:
        print(f"failure     {checkpoint.failure}")
    if checkpoint.phase == "completed":
        print(f"result      {compact(checkpoint.result, 200)}")
    return 0


async def history_cmd(args: argparse.Namespace) -> int:
    info, entries = await _entries(args, args.run)
    if args.json:
        emit_json([{"seq": e.seq, "at": e.at, "event": msgspec.to_builtins(e.event)} for e in entries])
        return 0
    print(f"{info.run_id}  {info.name} v{info.version}  {info.status}")
    rows = []
    for e in entries:
        data = {k: v for k, v in msgspec.to_builtins(e.event).items() if k not in ("type", "key")}
        rows.append([e.seq, when(e.at), msgspec.to_builtins(e.event)["type"], e.event.key or "", compact(data, 90)])
    table(["seq", "at", "event", "key", "data"], rows)
    return 0


def _print_report(report: ReplayReport) -> None:
    for key, what in report.steps:
        print(f"  {key:<32} {what}")
    if report.divergence is not None:
        d = report.divergence
        print(f"DIVERGED at {d.key}: history recorded {d.recorded}; code called {d.called}")
    elif report.finished:
        print(f"clean: code and history agree to the end (result {compact(report.result)})")
    else:
        print(f"clean: code and history agree as far as the history goes (stops at {report.stopped_at})")


async def replay_cmd(args: argparse.Namespace) -> int:
    registry = registry_of(args)
    store = await store_of(args)
    try:
        if args.all:
            reports = await check_compatibility(store, registry, name=args.name)
        elif args.run:
            reports = [await replay_run(store, registry, args.run)]
        else:
            raise UsageError("give a RUN to replay, or --all")
    finally:
        await store.close()
    diverged = [r for r in reports if not r.clean]
    if args.json:
        emit_json([{"run_id": r.run_id, "clean": r.clean, "finished": r.finished, "stopped_at": r.stopped_at,
                    "steps": r.steps, "divergence": None if r.divergence is None else {
                        "key": r.divergence.key, "recorded": r.divergence.recorded, "called": r.divergence.called}}
                   for r in reports])
    else:
        for report in reports:
            print(f"replay {report.run_id}")
            _print_report(report)
        if args.all:
            print(f"{len(reports)} run(s) checked, {len(diverged)} diverged")
    return 1 if diverged else 0
