"""The replay debugger: re-run a stored history against today's code, with no writes and no live bodies.

It is the worker's own driver (:class:`~runifold.worker._execution.Execution`)
with no store: every recorded outcome is handed to the workflow in the order
it was recorded, and where the history ends (a wait not yet resolved, a step
in flight) replay stops. Where code and history part, the report names the
first diverging key. This is what ``runifold replay`` runs, and the
compatibility check before a deploy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

from runifold.dsl import WorkflowDefinition
from runifold.errors import InvalidStateError, NondeterminismError, RunNotFoundError
from runifold.history import Entry, decode_event
from runifold.stores import UNFINISHED, RunStatus, WorkflowStore
from runifold.stores._protocol import check_listing, listed_statuses
from runifold.worker._call import ReplayReport
from runifold.worker._execution import Execution
from runifold.worker._registry import WorkflowRegistry

#: runs read per page by compatibility_reports
_PAGE = 1000

__all__ = ["ReplayReport", "call_returns", "check_compatibility", "compatibility_reports", "replay", "replay_run"]



async def replay(definition: WorkflowDefinition, run_id: str, history: Sequence[Entry]) -> ReplayReport:
    """Replay ``history`` against ``definition``'s code; never writes, never runs a body."""
    started = history[0].event if history else None
    checkpoint_id = getattr(started, "checkpoint_id", None)
    return await Execution(definition, run_id, checkpoint_id, history, None).replay()


async def call_returns(definition: WorkflowDefinition, run_id: str, history: Sequence[Entry], key: str) -> Any:
    """Replay ``history`` and return the annotated return type of the call the code makes under ``key``.

    Raises:
        InvalidStateError: the history does not replay against the code, or the code does not make that call.
    """
    started = history[0].event if history else None
    execution = Execution(definition, run_id, getattr(started, "checkpoint_id", None), history, None)
    report = await execution.replay()
    if report.divergence is not None:
        raise InvalidStateError(
            f"run {run_id} does not replay against the registered code ({report.divergence}); "
            "deploy code that matches its history first"
        )
    returns = execution.call_returns(key)
    if returns is None:
        raise InvalidStateError(f"replaying run {run_id}, the code does not reach {key!r}")
    return returns


async def replay_run(store: WorkflowStore, registry: WorkflowRegistry, run_ref: str) -> ReplayReport:
    """Replay one stored run against the registry's definition of its exact version.

    Raises:
        UnknownWorkflowError: the registry lacks the run's ``(name, version)``.
    """
    info = await store.get_run(run_ref)
    definition = registry.definition_for(info.name, info.version)
    history = [Entry(e.seq, e.at, decode_event(e.body, where=f"{info.run_id}#{e.seq}"))
               for e in await store.history(info.run_id)]
    return await replay(definition, info.run_id, history)


async def check_compatibility(
    store: WorkflowStore, registry: WorkflowRegistry, *, name: str | None = None, limit: int | None = None,
    statuses: Collection[RunStatus] = UNFINISHED,
) -> list[ReplayReport]:
    """Replay every unfinished run (of ``name``, or of every workflow) against today's code.

    The check before a deploy: a report that is not ``clean`` names a run whose
    history the new code cannot continue. Every unfinished run in the store is
    checked, whatever its name: a run whose ``(name, version)`` the registry
    does not hold is reported as diverging at ``(definition)``, since no worker
    with this registry could continue it. ``statuses`` picks other runs instead
    (``{RunStatus.COMPLETED}``: do finished runs replay exactly against this code?);
    ``limit`` checks at most that many (the newest), None every one. See
    :func:`compatibility_reports` for the same check one report at a time.
    """
    if limit is not None:
        check_listing(limit=limit)
    reports: list[ReplayReport] = []
    if limit == 0:
        return reports
    async for report in compatibility_reports(store, registry, name=name, statuses=statuses):
        reports.append(report)
        if limit is not None and len(reports) >= limit:
            break
    return reports


async def compatibility_reports(
    store: WorkflowStore, registry: WorkflowRegistry, *, name: str | None = None,
    statuses: Collection[RunStatus] = UNFINISHED,
) -> AsyncIterator[ReplayReport]:
    """:func:`check_compatibility`'s reports, each as soon as its run is replayed, newest run first.

    Workers may run meanwhile: the store's runs of ``statuses`` are read a page at a time, newest first and each
    page older than the last (the store filters: finished runs are not read for the default statuses), so a run
    that changes status while the check reads is checked once (listing status by status missed a run that moved
    to a status already listed, and counted twice one that moved ahead). A run purged meanwhile is left out.
    """
    check_listing(name=name, status=statuses)
    wanted = frozenset(RunStatus(s) for s in listed_statuses(statuses) or ())
    after = None
    while True:
        page = await store.list_runs(status=wanted, name=name, limit=_PAGE, after=after)
        for info in page:
            if info.status not in wanted:
                continue  # (a store that does not filter)
            if registry.get(info.name, info.version) is None:
                report = ReplayReport(info.run_id)
                registered = ", ".join(f"{n} v{v}" for n, v in registry.versions()) or "none"
                report.divergence = NondeterminismError(
                    "(definition)", f"a run of {info.name} v{info.version}", f"a registry of {registered}",
                    "no worker with this code can continue it: keep that version registered until its runs finish",
                )
                yield report
                continue
            try:
                yield await replay_run(store, registry, info.run_id)
            except RunNotFoundError:
                continue  # purged since it was listed: nothing is left to continue
        if len(page) < _PAGE:
            return
        after = page[-1].run_id
