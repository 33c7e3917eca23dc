"""Schedules: a workflow started at every tick, exactly once, however many workers fire it.

Run with ``.venv/bin/python examples/schedule.py [STORE_URL]`` (default: a
SQLite file in the current folder). It adds a schedule ticking every second
(a six-field cron expression, seconds first: needs ``runifold[cron]``), runs
two workers, each with its own store connection and both checking the
schedules, for about four seconds, and prints one run per tick with the tick in
its checkpoint id. Then, on an in-memory store with a clock it moves by hand,
it shows the catch-up policy: after a day with no worker up, an hourly
schedule starts its most recent tick once, or, with ``catchup=`` six hours,
every tick of the last six hours.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runifold import (  # noqa: E402
    Client,
    LeaseDuration,
    RunStatus,
    Schedule,
    Supervisor,
    WorkerId,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowWorker,
    open_store,
    step,
    workflow,
)
from runifold.stores.memory import MemoryWorkflowStore  # noqa: E402
from runifold.testing import FakeClock  # noqa: E402


@step()
async def build_report(region: str, tick: str) -> str:
    return f"{region} report for {tick}"


@workflow("report", version=1)
async def report(ctx: WorkflowContext, region: str) -> str:
    tick = (ctx.checkpoint_id or "::").split(":", 2)[2]  # schedule:<name>:<tick>
    return await build_report(region, tick)


registry = WorkflowRegistry(WorkflowDefinition(report))


def supervisor(store: WorkflowStore, name: str) -> Supervisor:
    worker = WorkflowWorker(store, registry, WorkerId.parse(name), LeaseDuration(timedelta(seconds=30)),
                            timedelta(seconds=10))
    return Supervisor(worker, 2, idle_wait=timedelta(seconds=0.1), schedule_every=timedelta(seconds=0.25))


async def run_for(supervisors: list[Supervisor], seconds: float) -> None:
    running = [asyncio.create_task(s.run(handle_signals=False)) for s in supervisors]
    await asyncio.sleep(seconds)
    for s in supervisors:
        s.stop()
    await asyncio.gather(*running)


async def two_workers(url: str) -> None:
    stores = [await open_store(url), await open_store(url)]
    store = stores[0]
    try:
        since = await store.now()
        await store.add_schedule(Schedule("every-second", "report", 1, {"region": "eu"}, cron="* * * * * *"))
        [info] = await store.list_schedules()
        print(f"schedule {info.schedule.name}: {info.schedule.workflow} v{info.schedule.version} "
              f"{info.schedule.describe()}")
        await run_for([supervisor(stores[0], "worker-a"), supervisor(stores[1], "worker-b")], 4.2)
        await store.delete_schedule("every-second")  # the runs it started stay
        runs = [r for r in await store.list_runs(name="report") if r.created_at >= since]
        client = Client(store, registry)
        for run in runs:  # the last tick's run may still be due: a worker finishes it
            if run.status is not RunStatus.COMPLETED:
                finishing = asyncio.create_task(run_for([supervisor(store, "worker-a")], 1.0))
                await (await client.get_handle(run.run_id)).result(timeout=30)
                await finishing
        runs = sorted([await store.get_run(r.run_id) for r in runs], key=lambda r: r.checkpoint_id or "")
        for run in runs:
            print(f"  {run.checkpoint_id}  {run.status}")
        ticks = [run.checkpoint_id for run in runs]
        print(f"{len(ticks)} ticks, {len(runs)} runs: one run per tick ({len(set(ticks)) == len(runs)})")
        first = await client.get_handle(runs[0].run_id, report)
        print(f"the first run returned {await first.result()!r}")
    finally:
        for s in stores:
            await s.close()


async def catch_up() -> None:
    day_start = datetime(2026, 3, 2, tzinfo=UTC).timestamp()
    for window in (timedelta(minutes=1), timedelta(hours=6)):
        clock = FakeClock(day_start)
        store = MemoryWorkflowStore(clock)
        await store.add_schedule(Schedule("hourly", "report", 1, {"region": "us"}, cron="0 * * * *", catchup=window))
        clock.advance(timedelta(days=1, minutes=20))  # no worker was up all day
        await run_for([supervisor(store, "worker-c")], 0.5)
        started = sorted(r.checkpoint_id or "" for r in await store.list_runs())
        print(f"after a day without workers, catchup={window}: {len(started)} run(s), ticks "
              f"{', '.join(ref.split(':', 2)[2] for ref in started)}")


async def main(url: str) -> None:
    await two_workers(url)
    await catch_up()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///schedule-example.db"))
