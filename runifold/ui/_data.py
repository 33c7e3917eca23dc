"""What each page shows, as plain data: the JSON endpoints return it, the templates render it.

Shapes follow the CLI's ``--json`` output where the CLI has one (``runs
list``, ``runs show``, ``history``, ``replay``, ``audit``), with keys added,
never changed; times stay the stored numbers (seconds since the epoch), as
in the CLI's JSON. Everything here only reads the store.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec

from runifold.cli._runs import _report_json, budget_json, budget_of, effects_now, finished_at, show_json
from runifold.errors import RunifoldError, RunNotFoundError
from runifold.history import Entry, decode_event, fold
from runifold.stores import AuditRecord, RunInfo, RunStatus, StoredEvent, WorkflowStore
from runifold.ui._timeline import effect_evidence, timeline
from runifold.worker import WorkflowRegistry
from runifold.worker._admin import child_runs
from runifold.worker._debug import replay

#: the largest page of runs a request may ask for (as ``runifold runs list --limit``)
MAX_PAGE = 1_000
#: runs whose audits one page of the overall audit reads (the store answers audits one run at a time)
AUDIT_RUNS_PER_PAGE = 10_000
#: audits read at once while scanning runs
_AUDITS_AT_ONCE = 50


@dataclass(frozen=True)
class RunFilter:
    """What the runs page lists: every field optional; ``ref`` is a run id or checkpoint id."""

    status: RunStatus | None = None
    name: str | None = None
    version: int | None = None
    ref: str | None = None
    limit: int = 50
    after: str | None = None

    def matches(self, info: RunInfo, *, status: bool = True) -> bool:
        """Whether ``info`` passes the filter (``status=False``: its name and version filter only)."""
        return ((not status or self.status is None or info.status is self.status)
                and (self.name is None or info.name == self.name)
                and (self.version is None or info.version == self.version))


def run_row(info: RunInfo) -> dict[str, Any]:
    """One run as ``runifold runs list --json`` prints it."""
    done = finished_at(info)
    return {**msgspec.to_builtins(info), "finished_at": done,
            "duration": None if done is None else info.updated_at - info.created_at}


async def runs_page(store: WorkflowStore, where: RunFilter) -> dict[str, Any]:
    """A page of runs, newest first, as ``runs list --json`` (``total``, ``next_after``, ``runs``).

    Added: ``counts`` (runs per status under the name and version filter, or of the one run a reference names),
    and ``now`` (the store's clock, for the age of unfinished runs).
    """
    if where.ref:
        try:
            named = [await store.get_run(where.ref)]
        except RunNotFoundError:
            named = []
        runs = [r for r in named if where.matches(r)]
        total, more = len(runs), None
        counts = {s.value: sum(r.status is s and where.matches(r, status=False) for r in named) for s in RunStatus}
    else:
        # one run more than the page: the last page knows it is the last
        runs = await store.list_runs(status=where.status, name=where.name, version=where.version,
                                     limit=where.limit + 1, after=where.after)
        more = runs[where.limit - 1].run_id if len(runs) > where.limit else None
        runs = runs[:where.limit]
        total = await store.count_runs(status=where.status, name=where.name, version=where.version)
        counts = {s.value: await store.count_runs(status=s, name=where.name, version=where.version)
                  for s in RunStatus}
    return {"total": total, "next_after": more, "runs": [run_row(r) for r in runs], "counts": counts,
            "now": await store.now()}


def _entries(info: RunInfo, rows: list[StoredEvent]) -> list[Entry]:
    return [Entry(e.seq, e.at, decode_event(e.body, where=f"{info.run_id}#{e.seq}")) for e in rows]


async def replay_json(registry: WorkflowRegistry | None, info: RunInfo, entries: list[Entry]) -> dict[str, Any]:
    """The replay verdict as one report of ``runifold replay --json``, or ``{"error": why}`` when none can be had."""
    if registry is None:
        return {"error": "no workflows loaded: start `runifold ui` with --app module:registry to replay runs"}
    definition = registry.get(info.name, info.version)
    if definition is None:
        registered = ", ".join(f"{n} v{v}" for n, v in registry.versions()) or "none"
        return {"error": f"{info.name} v{info.version} is not registered in the loaded app ({registered})"}
    try:
        report = await replay(definition, info.run_id, entries)
    except RunifoldError as exc:
        return {"error": f"replay failed: {exc}"}
    return _report_json(report)


async def run_page(store: WorkflowStore, registry: WorkflowRegistry | None, ref: str, *,
                   with_replay: bool = True) -> dict[str, Any]:
    """Everything the run page shows.

    ``run``, ``checkpoint`` and ``failure`` as ``runs show --json``; added:
    ``budget``, ``effects`` (pending and ambiguous effects with their
    evidence), ``parent`` (the parent's run id, for a child run), ``children``
    (as ``runs show --json``), ``timeline`` (the history with durations, retries and who acted
    and why), ``replay`` (the verdict against the loaded app) and ``now``.
    """
    info = await store.get_run(ref)
    rows = await store.history(info.run_id)
    entries = _entries(info, rows)
    checkpoint = fold(entries)
    children = await child_runs(store, checkpoint)
    now = await store.now()
    page = show_json(info, entries, checkpoint, children, now)
    page.update(budget=budget_json(budget_of(registry, info)),
                effects=effect_evidence(entries, effects_now(info, checkpoint.pending_effects, now)),
                parent=checkpoint.parent_run_id, timeline=timeline(entries), now=now)
    if with_replay:
        page["replay"] = await replay_json(registry, info, entries)
    return page


async def history_json(store: WorkflowStore, ref: str) -> list[dict[str, Any]]:
    """A run's events as ``runifold history --json``: ``seq``, ``at``, ``event``."""
    info = await store.get_run(ref)
    entries = _entries(info, await store.history(info.run_id))
    return [{"seq": e.seq, "at": e.at, "event": msgspec.to_builtins(e.event)} for e in entries]


async def replay_page(store: WorkflowStore, registry: WorkflowRegistry | None, ref: str) -> dict[str, Any]:
    info = await store.get_run(ref)
    return await replay_json(registry, info, _entries(info, await store.history(info.run_id)))


def _verdict_matches(record: AuditRecord, verdict: str | None) -> bool:
    return verdict is None or record.verdict == verdict or record.verdict.startswith(verdict + ":")


async def run_audit(store: WorkflowStore, ref: str, verdict: str | None = None) -> dict[str, Any]:
    """Every signal attempt against ``ref``, oldest first (``records`` as ``runifold audit --json``).

    A reference no run has is not an error here when attempts were made
    against it (``run`` is then None): the store keeps rejected attempts
    against unknown runs under the reference the sender gave.
    """
    try:
        info: RunInfo | None = await store.get_run(ref)
    except RunNotFoundError as exc:
        info, unknown = None, exc
    records = await store.audit(ref)  # as `runifold audit REF`: the run's attempts, and those made under REF
    if info is None and not records:
        raise unknown
    return {"run": None if info is None else msgspec.to_builtins(info),
            "records": [msgspec.to_builtins(r) for r in records if _verdict_matches(r, verdict)]}


async def overall_audit(store: WorkflowStore, *, verdict: str | None = None, after: str | None = None,
                        runs: int = AUDIT_RUNS_PER_PAGE) -> dict[str, Any]:
    """The signal attempts against a page of runs (newest runs first), newest attempt first.

    The store answers audits per run, so this reads the audit of each of
    ``runs`` runs; ``next_after`` pages on to older runs. Attempts against
    references that name no run are not listed (no store method lists them):
    look one up by its reference on the run's audit page.
    """
    page: list[RunInfo] = []
    cursor = after
    while len(page) < runs:
        want = min(MAX_PAGE, runs - len(page))
        more = await store.list_runs(limit=want, after=cursor)
        page += more
        if len(more) < want:
            break
        cursor = more[-1].run_id
    records: list[AuditRecord] = []
    for start in range(0, len(page), _AUDITS_AT_ONCE):
        batch = page[start:start + _AUDITS_AT_ONCE]
        for audit in await asyncio.gather(*(store.audit(info.run_id) for info in batch)):
            records += [r for r in audit if _verdict_matches(r, verdict)]
    records.sort(key=lambda r: r.at, reverse=True)
    return {"runs_scanned": len(page), "first_run": page[0].run_id if page else None,
            "next_after": page[-1].run_id if len(page) == runs else None,
            "records": [msgspec.to_builtins(r) for r in records]}
