"""Firing schedules: which ticks are due (the catch-up policy), and starting their runs.

Every worker's :class:`Supervisor` calls :func:`fire_due_schedules` every
``schedule_every``. Each due tick becomes a task whose checkpoint id carries the
tick (``schedule:<name>:<tick>``), so however many workers enqueue it, the store
creates one run; then the schedule's ``last_tick`` is advanced, so a tick is
never started again even after its run was purged.

The catch-up policy (:func:`due_ticks`): of the ticks that fell due since the
schedule's ``last_tick``, the most recent is always started, and the earlier
ones that are at most ``Schedule.catchup`` old (at most 1,000). So a check that
comes late (a busy worker, a restart) loses no tick inside the window, and a
schedule whose workers were all down starts its most recent tick once, not one
run per missed tick.

A worker fires only the schedules whose exact ``(workflow, version)`` its
registry holds: the run is validated against the code that will run it and
gets that definition's concurrency limit. While no worker has the version, the
schedule's ticks pass and the catch-up policy applies when one comes up, as
after an outage.
"""

from __future__ import annotations

from collections.abc import Sequence

from runifold._log import get_logger
from runifold.errors import EnqueueConflictError, RunifoldError, describe
from runifold.stores import EnqueueResult, Schedule, ScheduleInfo, WorkflowStore, WorkflowTask
from runifold.worker._registry import WorkflowRegistry

log = get_logger("runifold.schedules")

#: the most ticks of one schedule started by one check (the most recent ones)
MAX_TICKS_PER_CHECK = 1000


def due_ticks(schedule: Schedule, last_tick: float, now: float) -> list[float]:
    """The ticks to start now, oldest first: the catch-up policy (see the module docstring)."""
    recent = schedule.ticks_back(now, last_tick, MAX_TICKS_PER_CHECK)
    if not recent:
        return []
    window = now - schedule.catchup.total_seconds()
    kept = [recent[0]] + [tick for tick in recent[1:] if tick >= window]
    return sorted(kept)


async def fire_due_schedules(
    store: WorkflowStore, registry: WorkflowRegistry, *, worker_id: str | None = None
) -> list[tuple[str, float, EnqueueResult]]:
    """Start the due ticks of every active schedule this registry can run; return (name, tick, result) of each.

    "Due" is judged on the store's clock. Safe to call from any number of workers at once: a tick
    another worker enqueued first comes back with ``created=False``. ``worker_id`` goes into the log lines.
    """
    now = await store.now()
    tasks: list[tuple[str, float, WorkflowTask]] = []
    advanced: dict[str, float] = {}
    for info in await store.list_schedules():
        planned = _plan(info, registry, now)
        if planned is None:
            continue
        last, ticked = planned
        tasks.extend((info.schedule.name, tick, task) for tick, task in ticked)
        advanced[info.schedule.name] = last
    if not advanced:
        return []
    results = await _enqueue(store, [task for _, _, task in tasks])
    await store.advance_schedules(advanced)
    fired = []
    for (name, tick, task), result in zip(tasks, results, strict=True):
        if result is None:
            continue
        log.info("schedule_fired", schedule=name, tick=tick, run_id=result.run_id,
                 checkpoint_id=task.checkpoint_id, created=result.created, worker_id=worker_id)
        fired.append((name, tick, result))
    return fired


#: (schedule, workflow, version) this process said it cannot start (see _plan)
_SAID_UNAVAILABLE: set[tuple[str, str, int]] = set()


def _plan(info: ScheduleInfo, registry: WorkflowRegistry, now: float) -> tuple[float, list[tuple[float, WorkflowTask]]] | None:
    """The last due tick of one schedule and the (tick, task) to start, or None when this worker does not start it now."""
    schedule = info.schedule
    if info.paused:
        return None
    ticks = due_ticks(schedule, info.last_tick, now)
    if not ticks:
        return None
    if registry.get(schedule.workflow, schedule.version) is None:
        # a worker that has the version fires it; said once per process, so a missing version is not silent
        said = (schedule.name, schedule.workflow, schedule.version)
        if said not in _SAID_UNAVAILABLE:
            _SAID_UNAVAILABLE.add(said)
            log.warning("schedule_not_here", schedule=schedule.name, workflow=schedule.workflow,
                        version=schedule.version, detail="a tick is due and this worker does not register this "
                        "version: a worker that does starts it (until one does, ticks older than the catch-up pass)")
        return None
    try:
        tasks = [registry.validate(schedule.task(tick)) for tick in ticks]
    except RunifoldError as exc:
        # the input no longer fits the code: these ticks are passed (not retried every check) and said so
        log.error("schedule_invalid", schedule=schedule.name, workflow=schedule.workflow, version=schedule.version,
                  ticks=len(ticks), error=describe(exc))
        return ticks[-1], []
    return ticks[-1], list(zip(ticks, tasks, strict=True))


async def _enqueue(store: WorkflowStore, tasks: Sequence[WorkflowTask]) -> list[EnqueueResult | None]:
    """Enqueue the ticks' tasks in one transaction; if one conflicts, each on its own (None: conflicted)."""
    if not tasks:
        return []
    try:
        return list(await store.enqueue_many(tasks))
    except EnqueueConflictError:
        pass
    results: list[EnqueueResult | None] = []
    for task in tasks:
        try:
            results.append(await store.enqueue(task))
        except EnqueueConflictError as exc:
            # the tick's run was started by the schedule as it was before it was replaced
            log.warning("schedule_tick_taken", checkpoint_id=task.checkpoint_id, run_id=exc.run_id)
            results.append(None)
    return results
