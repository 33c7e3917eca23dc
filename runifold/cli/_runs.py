"""``runifold runs``, ``history`` and ``replay``: looking at runs."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from runifold.cli._common import (
    DEFAULT_STORE,
    ArgumentError,
    without_environment,
    clip,
    compact,
    emit_json,
    positive_int,
    printable,
    registry_of,
    store_of,
    table,
    table_lines,
    version,
    when,
)
from runifold.dsl import Budget
from runifold.history import (
    Checkpoint,
    EffectFailed,
    Entry,
    RunFailed,
    SignalReceived,
    StepFailed,
    decode_event,
    effect_attempts,
    fold,
)
from runifold.stores import UNFINISHED, AuditRecord, RunInfo, RunStatus
from runifold.stores._open import redacted
from runifold.stores._protocol import ref_column
from runifold.worker import WorkflowRegistry
from runifold.worker._admin import child_runs
from runifold.worker._debug import ReplayReport, compatibility_reports, replay_run

MAX_PAGE = 1_000
#: runs list's page size unless --limit says otherwise
_DEFAULT_LIMIT = 50


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = sub.add_parser("runs", help="list runs or show one run's checkpoint")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")
    listing = runs_sub.add_parser("list", help="list runs, newest first, a page at a time")
    listing.add_argument("--status", choices=[s.value for s in RunStatus])
    listing.add_argument("--name")
    listing.add_argument("--version", type=version)
    listing.add_argument("--limit", type=positive_int(MAX_PAGE), default=_DEFAULT_LIMIT,
                         help=f"runs per page (default {_DEFAULT_LIMIT})")
    listing.add_argument("--after", metavar="RUN_ID", help="the page after this run id (the last one of a page)")
    listing.set_defaults(handler=runs_list)
    show = runs_sub.add_parser("show", help="a run's checkpoint: phase, outputs, usage, waits, pending effects, failure")
    show.add_argument("run", help="run id or checkpoint id")
    show.set_defaults(handler=runs_show)

    history = sub.add_parser("history", help="a run's event log as a timeline")
    history.add_argument("run", help="run id or checkpoint id")
    history.set_defaults(handler=history_cmd)

    replay = sub.add_parser("replay", help="re-run stored histories against today's code (no writes, no bodies)")
    replay.add_argument("run", nargs="?", help="run id or checkpoint id")
    replay.add_argument("--all", action="store_true", help="check every unfinished run (or of --status; of --name, or of any name), "
                        "reporting runs whose version the app does not register")
    # (no environment variables: RUNIFOLD_NAME or RUNIFOLD_STATUS set for `runs list` or `retry` must not change
    # what the check before a deploy checks)
    without_environment(replay.add_argument("--name", help="with --all: only runs of this workflow"))
    without_environment(replay.add_argument(
        "--status", choices=[str(s) for s in RunStatus],
        help="with --all: the runs of this status instead of the unfinished ones, e.g. completed"))
    replay.set_defaults(handler=replay_cmd)


def duration(seconds: float | None) -> str:
    """``850 ms``, ``12.4 s``, ``3m 05s``, ``2h 03m``, ``4d 07h``; ``-`` for none."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    for unit, size, sub_unit, sub_size in (("d", 86_400, "h", 3_600), ("h", 3_600, "m", 60), ("m", 60, "s", 1)):
        if whole >= size:
            return f"{whole // size}{unit} {whole % size // sub_size:02d}{sub_unit}"
    raise AssertionError(seconds)


def finished_at(info: RunInfo) -> float | None:
    """When a finished run finished (its last update), None for an unfinished one."""
    return info.updated_at if info.status.finished else None


async def runs_list(args: argparse.Namespace) -> int:
    status = RunStatus(args.status) if args.status else None
    if args.after is not None and ref_column(args.after) != "run_id":
        raise ArgumentError(f"--after {args.after!r} is not a run id: give the last run id of the page before "
                            "(runs list prints the command for the next page)")
    store = await store_of(args, readonly=True)
    try:
        # one run more than the page: whether there is a next page at all
        runs = await store.list_runs(status=status, name=args.name, version=args.version, limit=args.limit + 1,
                                     after=args.after)
        total = await store.count_runs(status=status, name=args.name, version=args.version)
    finally:
        await store.close()
    more = len(runs) > args.limit and runs[args.limit - 1].run_id
    runs = runs[:args.limit]
    if args.json:
        emit_json({"total": total, "next_after": more or None, "runs": [
            {**msgspec.to_builtins(r), "finished_at": finished_at(r),
             "duration": None if finished_at(r) is None else r.updated_at - r.created_at} for r in runs]})
        return 0
    table(["run_id", "checkpoint_id", "workflow", "status", "created", "finished", "duration", "due", "lease_owner",
           "reason"],
          [[r.run_id, r.checkpoint_id, f"{r.name} v{r.version}", r.status, when(r.created_at), when(finished_at(r)),
            duration(None if finished_at(r) is None else r.updated_at - r.created_at), when(r.due_at),
            r.lease_owner, clip(_reason(r), 40)] for r in runs])
    filters = [part for k, v in (("status", args.status), ("name", args.name), ("version", args.version))
               if v is not None for part in (f"--{k}", shlex.quote(str(v)))]
    which = " ".join(filters)
    shown = f"{len(runs)} run(s) shown of {total}{' ' + which if which else ''}, newest first"
    if not more:
        print(shown)
        return 0
    # the next page's command, as given: the store too unless it came from RUNIFOLD_STORE or the default (its
    # password hidden), the same filters and page size
    given = "" if args.store == os.environ.get("RUNIFOLD_STORE", DEFAULT_STORE) else redacted(args.store)
    command = ["runifold", *(["--store", shlex.quote(given)] if given else []), "runs", "list", *filters,
               *(["--limit", str(args.limit)] if args.limit != _DEFAULT_LIMIT else []), "--after", more]
    hidden = " (with the store's password in place of ***)" if given and given != args.store else ""
    print(f"{shown}; next page: {' '.join(command)}{hidden}")
    return 0


async def _entries(args: argparse.Namespace, run_ref: str) -> tuple[RunInfo, list[Entry]]:
    info, entries, _, _, _, _ = await _run_and_children(args, run_ref, children=False)
    return info, entries


async def _run_and_children(
    args: argparse.Namespace, run_ref: str, *, children: bool = True
) -> tuple[RunInfo, list[Entry], dict[str, RunInfo], int, list[AuditRecord], float]:
    """A run, its history, and (if asked) its child runs by the key of the call that started each, how
    many runs of its concurrency key are running (0 without a key, or when children are not asked for),
    the signals it accepted that its workflow has not consumed, and the store's time."""
    store = await store_of(args, readonly=True)
    try:
        info = await store.get_run(run_ref)
        rows = await store.history(info.run_id)
        entries = [Entry(e.seq, e.at, decode_event(e.body, where=f"{info.run_id}#{e.seq}")) for e in rows]
        found = await child_runs(store, fold(entries)) if children else {}
        running = (await store.count_runs(concurrency_key=info.concurrency_key, holding_slot=True)
                   if children and info.concurrency_key is not None else 0)
        consumed = {e.event.signal_id for e in entries if isinstance(e.event, SignalReceived)}
        unconsumed = ([a for a in await store.audit(info.run_id) if a.verdict == "accepted"
                       and a.signal_id not in consumed] if children else [])
        now = await store.now()
    finally:
        await store.close()
    return info, entries, found, running, unconsumed, now


def _failure(entries: list[Entry]) -> tuple[RunFailed | None, StepFailed | EffectFailed | None]:
    """A failed run's ``run_failed``, and the last failure of the call it names (the step or effect that ran out)."""
    last = entries[-1].event if entries else None
    if not isinstance(last, RunFailed):
        return None, None
    calls = [e.event for e in entries if isinstance(e.event, (StepFailed, EffectFailed)) and last.key
             and e.event.key == last.key]
    return last, calls[-1] if calls else None


def _reason(info: RunInfo) -> str:
    """Why the run stands where it stands; a running run's reason is that of its last stop: not shown."""
    return "" if info.status is RunStatus.RUNNING else info.reason


def budget_of(registry: WorkflowRegistry | None, info: RunInfo) -> Budget | None:
    """The run's budget from the loaded ``--app`` (None without one, or when its version is not registered)."""
    definition = registry.get(info.name, info.version) if registry is not None else None
    return None if definition is None else definition.budget


def budget_json(budget: Budget | None) -> dict[str, Any] | None:
    """A budget as ``runs show --json`` and the web view's ``api/run`` give it."""
    if budget is None:
        return None
    return {"max_steps": budget.max_steps, "max_effect_attempts": budget.max_effect_attempts,
            "max_retries": budget.max_retries, "max_recoveries": budget.max_recoveries,
            "max_cost_units": budget.max_cost_units,
            "max_elapsed": None if budget.max_elapsed is None else budget.max_elapsed.total_seconds()}


def effects_now(info: RunInfo, pending: dict[str, str], now: float) -> dict[str, str]:
    """Each pending effect's state as an operator reads it now: one started under a lease a worker still renews
    is ``running`` (its worker has not answered yet), not ``in doubt``, which it is once no live worker holds it."""
    live = info.status is RunStatus.RUNNING and info.lease_until is not None and info.lease_until >= now
    return {key: "running" if live and state == "in doubt" else state for key, state in pending.items()}


def show_json(info: RunInfo, entries: list[Entry], checkpoint: Checkpoint,
              children: dict[str, RunInfo], now: float) -> dict[str, Any]:
    """A run as ``runs show --json`` prints it (the web view's JSON too): run, checkpoint (its pending effects as
    :func:`effects_now` reads them at ``now``), children, failure."""
    failed, call = _failure(entries)
    shown = msgspec.to_builtins(checkpoint)
    shown["pending_effects"] = effects_now(info, checkpoint.pending_effects, now)
    return {"run": msgspec.to_builtins(info), "checkpoint": shown,
            "children": {key: msgspec.to_builtins(child) for key, child in children.items()},
            "failure": None if failed is None else {
                "reason": failed.reason, "key": failed.key, "error_type": failed.error_type,
                "traceback": failed.traceback, "call": None if call is None else {
                    "key": call.key, "error": call.error, "error_type": call.error_type,
                    "attempt": call.attempt, "traceback": call.traceback}}}


def _indented(text: str, indent: str) -> list[str]:
    return [indent + printable(line) for line in text.splitlines()]


async def runs_show(args: argparse.Namespace) -> int:
    info, entries, children, running, unconsumed, now = await _run_and_children(args, args.run)
    checkpoint = fold(entries)
    budget = budget_of(registry_of(args), info) if args.app else None
    failed, call = _failure(entries)
    if args.json:
        shown = show_json(info, entries, checkpoint, children, now)
        if args.app:
            shown["budget"] = budget_json(budget)
        emit_json(shown)
        return 0
    out = [f"run         {info.run_id}  (checkpoint {printable(info.checkpoint_id or '-')})",
           f"workflow    {info.name} v{info.version}",
           f"status      {info.status}   phase {checkpoint.phase}   revision {info.revision}",
           f"created     {when(info.created_at)}   updated {when(info.updated_at)}"
           + (f"   took {duration(info.updated_at - info.created_at)}" if info.status.finished else ""),
           f"lease       {info.lease_owner or '-'} until {when(info.lease_until)} (token {info.lease_token})"
           + ("   expired: its worker stopped renewing it; the next worker to claim the run takes it over"
              if info.lease_owner and info.lease_until is not None and info.lease_until < now else "")]
    if info.status in (RunStatus.READY, RunStatus.WAITING, RunStatus.DIVERGED):
        out.append(f"due         {when(info.due_at)}")
    if _reason(info):
        out.append(f"reason      {printable(_reason(info))}")
    if info.concurrency_key is not None:
        line = (f"concurrency key {printable(info.concurrency_key)}, at most {info.concurrency_limit} running at once: "
                f"{running} running now")
        if info.status is RunStatus.READY and info.concurrency_limit is not None and running >= info.concurrency_limit:
            line += " (this run waits for one of them to stop)"
        out.append(line)
    if checkpoint.parent_run_id:
        out.append(f"parent      {checkpoint.parent_run_id}")
    out += [f"child       {printable(key)} -> {child.run_id} ({child.name} v{child.version}, {child.status})"
            for key, child in children.items()]
    usage = checkpoint.usage
    recovered = f" + {info.recoveries} recoveries" if info.recoveries else ""

    def of(limit: float | None) -> str:
        return "" if budget is None else f" of {'unlimited' if limit is None else f'{limit:g}'}"

    limits = (of(budget.max_steps), of(budget.max_effect_attempts), of(budget.max_retries),
              of(budget.max_cost_units)) if budget else ("", "", "", "")
    out.append(f"usage       steps {usage.steps}{recovered}{limits[0]}, effect attempts {usage.effect_attempts}{limits[1]}, "
               f"retries {usage.retries}{limits[2]}, cost units {usage.cost_units:g}{limits[3]}")
    if info.recoveries:
        out.append(f"recoveries  {info.recoveries}{of(budget.max_recoveries) if budget else ''} (claims that took the "
                   "run over from an expired lease; each counts as a step)")
    if budget is not None and budget.max_elapsed is not None:
        if info.status.finished:
            out.append(f"elapsed     {duration(info.updated_at - info.created_at)} of budget {budget.max_elapsed}")
        else:
            out.append(f"elapsed     budget {budget.max_elapsed} from the start: runs out "
                       f"{when(info.created_at + budget.max_elapsed.total_seconds())}")
    out.append("outputs")
    out += [f"  {printable(key):<28} {compact(value)}" for key, value in checkpoint.outputs.items()]
    out += [f"waiting     {wait.kind} {printable(wait.key)} {printable(wait.signal or '')} until {when(wait.until)}"
            for wait in checkpoint.waits]
    why = ("the run finished without a wait taking it" if info.status.finished
           else "no wait of the workflow's has taken it yet")
    out += [f"signal      {printable(a.name)} from {printable(a.sender)} (key {printable(a.key_id)}) at {when(a.at)}: "
            "received, not consumed "
            f"({why})" for a in unconsumed]
    for key, state in effects_now(info, checkpoint.pending_effects, now).items():
        idempotency_key, attempts = effect_attempts([e.event for e in entries if e.event.key == key])
        out.append(f"effect      {printable(key)} is {state} (attempt {attempts}, idempotency key "
                   f"{printable(idempotency_key or '-')})")
        if info.status.finished:  # (in doubt: its body was in flight when the run was cancelled)
            out.append("            the run has finished: nothing settles it now; check the outside world by its "
                       "idempotency key")
        elif state == "ambiguous":
            out.append(f"            settle it: runifold resolve {info.run_id} {printable(key)} "
                       "--applied JSON | --retry | --fail --reason ...")
    if checkpoint.failure and checkpoint.failure != _reason(info):
        out.append(f"failure     {printable(checkpoint.failure)}")
    if failed is not None:
        where = f" in {printable(failed.key)}" if failed.key else ""
        out.append(f"error       {printable(failed.error_type or '-')}{where}")
        if failed.traceback:
            out.append("traceback")
            out += _indented(failed.traceback, "  ")
        if call is not None:
            out.append(f"call        {printable(call.key)} raised {printable(call.error_type or call.error)} "
                       f"(attempt {call.attempt})")
            if call.traceback:
                out.append("call traceback")
                out += _indented(call.traceback, "  ")
        if not failed.traceback and (call is None or not call.traceback):
            out.append("traceback   (none recorded)")
    if checkpoint.phase == "completed":
        out.append(f"result      {compact(checkpoint.result, 200)}")
    for line in out:
        print(line)
    return 0


async def history_cmd(args: argparse.Namespace) -> int:
    info, entries = await _entries(args, args.run)
    if args.json:
        emit_json([{"seq": e.seq, "at": e.at, "event": msgspec.to_builtins(e.event)} for e in entries])
        return 0
    print(printable(f"{info.run_id}  {info.name} v{info.version}  {info.status}"))
    rows, traces = [], []
    for e in entries:
        data = {k: v for k, v in msgspec.to_builtins(e.event).items() if k not in ("type", "key", "traceback")}
        if "error_type" in data:  # a failure: its type first, so the column never cuts it off
            error_type = data.pop("error_type")
            data = {"error_type": error_type, **data} if error_type else data
        rows.append([e.seq, when(e.at), msgspec.to_builtins(e.event)["type"], e.event.key or "", compact(data, 90)])
        traces.append(getattr(e.event, "traceback", ""))
    lines = table_lines(["seq", "at", "event", "key", "data"], rows)
    for line in lines[:2]:
        print(line)
    for line, trace in zip(lines[2:], traces, strict=True):
        print(line)
        for extra in _indented(trace, "      | "):
            print(extra)
    return 0


def _print_report(report: ReplayReport) -> None:
    for key, what in report.steps:
        print(f"  {printable(key):<32} {printable(what)}")
    print(printable(verdict(report)))


def verdict(report: ReplayReport) -> str:
    """The replay's verdict in one line, as ``runifold replay`` prints it (and the web view shows it)."""
    if report.divergence is not None:
        d = report.divergence
        why = f" ({d.detail})" if d.detail and d.detail not in d.called else ""
        return f"DIVERGED at {d.key}: history recorded {d.recorded}; code called {d.called}{why}"
    if report.cancelled:
        where = f"; its code waited at {report.stopped_at}" if report.stopped_at else ""
        return f"clean: code and history agree up to the run's cancellation ({report.error}{where})"
    if report.finished and report.error is not None:
        return f"clean: code and history agree to the end (the workflow failed: {report.error})"
    if report.finished:
        return f"clean: code and history agree to the end (result {compact(report.result)})"
    if report.ended and report.error is not None:
        return f"clean: code and history agree as far as the history goes (then the workflow raises {report.error})"
    if report.ended:
        return f"clean: code and history agree as far as the history goes (then the workflow returns {compact(report.result)})"
    if report.error is not None:
        return f"clean: code and history agree as far as the history goes (then the run fails: {report.error})"
    if report.stopped_at is not None:
        return f"clean: code and history agree as far as the history goes (stops at {report.stopped_at})"
    return ("clean: code and history agree as far as the history goes (then the workflow waits on something that is "
            "not a runifold call)")


async def replay_cmd(args: argparse.Namespace) -> int:
    registry = registry_of(args)
    if not args.all and not args.run:
        raise ArgumentError("give a RUN to replay, or --all")
    if args.all and args.run:
        raise ArgumentError(f"give a RUN to replay or --all, not both (got {args.run!r} and --all)")
    if args.name is not None and not args.all:
        raise ArgumentError(f"--name picks the runs of --all; a RUN is replayed whatever its workflow (drop --name, "
                            f"or replay --all --name {args.name})")
    if args.status and not args.all:
        raise ArgumentError("--status picks the runs of --all; a RUN is replayed whatever its status (drop --status, "
                            "or replay --all --status ...)")
    store = await store_of(args, readonly=True)
    checked, diverged, as_json = 0, 0, []
    try:
        if args.all:
            reports: AsyncIterator[ReplayReport] = compatibility_reports(
                store, registry, name=args.name, statuses=UNFINISHED if args.status is None else [RunStatus(args.status)])
        else:
            reports = _one(await replay_run(store, registry, args.run))
        async for report in reports:  # each printed as its run is checked: a large store takes a while
            checked, diverged = checked + 1, diverged + (not report.clean)
            if args.json:
                as_json.append(_report_json(report))
            else:
                print(f"replay {report.run_id}")
                _print_report(report)
                sys.stdout.flush()
    finally:
        await store.close()
    if args.all and args.name is not None and not checked and args.name not in registry.names():
        # (a check that found nothing to check under a name nobody knows: a typo, which must not pass a deploy)
        registered = ", ".join(sorted(registry.names())) or "none"
        which = "unfinished" if args.status is None else args.status
        raise ArgumentError(f"no {which} run of a workflow named {args.name!r} to check, and the --app registry holds "
                            f"no such workflow (it holds: {registered}); check the name")
    if args.json:
        emit_json(as_json)
        return 1 if diverged else 0
    if args.all:
        print(f"{checked} run(s) checked, {diverged} diverged")
    if diverged:
        print(DIVERGED_ADVICE)
    return 1 if diverged else 0


#: what ``runifold replay`` says once after any diverged run
DIVERGED_ADVICE = (
    "what to do: code that diverges cannot continue a run; keep (or restore) the code each run ran for its version, "
    "and register a change as a new version beside it (docs/operations.md, Deploying new workflow code); once "
    "matching code is deployed, `runifold wake RUN` retries a diverged run now. A run of a workflow or version the "
    "--app does not register (`(definition)`) needs that code beside the new. A failed run replayed against the fix "
    "of what failed it may diverge as the fix changes its path: deploy the fix, then `runifold retry RUN` "
    "(docs/operations.md, Failed runs). If the code did not change, it is not deterministic: use ctx.now(), "
    "ctx.uuid() and ctx.random() instead of the clock and the random and uuid modules")


async def _one(report: ReplayReport) -> AsyncIterator[ReplayReport]:
    yield report


def _report_json(r: ReplayReport) -> dict[str, Any]:
    return {"run_id": r.run_id, "clean": r.clean, "verdict": verdict(r), "finished": r.finished, "ended": r.ended,
            "cancelled": r.cancelled,
            "stopped_at": r.stopped_at, "workflow_error": r.error,
            "steps": r.steps, "divergence": None if r.divergence is None else {
                "key": r.divergence.key, "recorded": r.divergence.recorded, "called": r.divergence.called}}
