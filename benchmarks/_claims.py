"""The claim of due runs: runs without a concurrency key (the hot path) and runs held back by their key.

Uses only the store API (``enqueue_many``, ``claim``), so the same code times any version of runifold:
``python benchmarks/_claims.py sqlite|postgres`` with ``PYTHONPATH`` pointing at the version to time.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]

Row = tuple[str, str, str]
NAME = "claimbench"


async def _analyze(kind: str) -> None:
    """On PostgreSQL, ANALYZE the runs table, as autovacuum does soon after a table grows: the store's plans (made
    once per connection, possibly while the table was empty) are made again for the table as it is."""
    if kind == "postgres":
        import asyncpg

        conn = await asyncpg.connect(os.environ["RUNIFOLD_TEST_POSTGRES"])
        await conn.execute("ANALYZE runifold_runs")
        await conn.close()


async def _fresh(kind: str, folder: Path) -> Any:
    from runifold import open_store

    if kind == "sqlite":
        return await open_store(f"sqlite:///{folder / f'claims-{time.monotonic_ns()}.db'}")
    url = os.environ["RUNIFOLD_TEST_POSTGRES"]
    conn = await asyncpg.connect(url)
    if await conn.fetchval("SELECT to_regclass('runifold_runs') IS NOT NULL"):
        await conn.execute("TRUNCATE runifold_runs, runifold_events, runifold_signals, runifold_signal_audit")
        await conn.execute("VACUUM ANALYZE runifold_runs")
    await conn.close()
    return await open_store(url)


async def _enqueue(store: Any, count: int, **task: Any) -> None:
    from runifold import WorkflowTask

    for start in range(0, count, 500):
        await store.enqueue_many([WorkflowTask(NAME, 1, {"i": i}, **task) for i in range(start, min(count, start + 500))])


async def _claims(store: Any, count: int, at_once: int) -> float:
    """Seconds per claim, ``at_once`` claimers taking ``count`` due runs between them."""
    left = [count]

    async def claimer() -> None:
        while left[0] > 0:
            left[0] -= 1
            assert await store.claim("bench", {NAME}, 30.0) is not None

    started = time.perf_counter()
    await asyncio.gather(*(claimer() for _ in range(at_once)))
    return (time.perf_counter() - started) / count


async def _trip(kind: str, store: Any, count: int) -> float:
    """Seconds per trivial round trip (``store.now()``): what a claim costs at least on PostgreSQL; 0 on SQLite."""
    if kind != "postgres":
        return 0.0
    started = time.perf_counter()
    for _ in range(count):
        await store.now()
    return (time.perf_counter() - started) / count


async def measure(kind: str, folder: Path, count: int, rounds: int = 5) -> dict[str, float]:
    """Median seconds per claim of runs without a key (1 and 8 claimers at once) and per round trip."""
    found: dict[str, list[float]] = {"one": [], "eight": [], "trip": []}
    for _ in range(rounds):
        store = await _fresh(kind, folder)
        try:
            await _enqueue(store, 2 * count)
            await _analyze(kind)
            found["trip"].append(await _trip(kind, store, count // 2))
            found["one"].append(await _claims(store, count, 1))
            found["eight"].append(await _claims(store, count, 8))
        finally:
            await store.close()
    return {k: sorted(v)[len(v) // 2] for k, v in found.items()}


async def keyed(kind: str, folder: Path, count: int) -> tuple[float, float]:
    """Seconds per claim of runs with a key whose limit never binds, and of a run behind ``count`` held-back runs."""
    store = await _fresh(kind, folder)
    try:
        await _enqueue(store, count, concurrency_key="bench", concurrency_limit=10 * count)
        await _analyze(kind)
        free = await _claims(store, count, 1)
    finally:
        await store.close()
    store = await _fresh(kind, folder)
    try:
        await _enqueue(store, 1, concurrency_key="full", concurrency_limit=1)
        assert await store.claim("bench", {NAME}, 30.0) is not None  # the key's one slot is taken
        await _enqueue(store, count, concurrency_key="full", concurrency_limit=1)
        await _enqueue(store, 200)
        await _analyze(kind)
        started = time.perf_counter()
        for _ in range(200):
            claim = await store.claim("bench", {NAME}, 30.0)
            assert claim is not None
        behind = (time.perf_counter() - started) / 200
        assert await store.claim("bench", {NAME}, 30.0) is None
    finally:
        await store.close()
    return free, behind


async def claims(kind: str, limits: Any, folder: Path, scale: float) -> list[Row]:
    count = max(100, int(1000 * scale))
    m = await measure(kind, folder, count, rounds=5 if scale >= 1 else 1)
    free, behind = await keyed(kind, folder, count)
    trip = f"; a trivial round trip {m['trip'] * 1000:.3f} ms" if kind == "postgres" else ""
    return [
        (f"claims: {count:,} due runs without a key",
         f"{m['one'] * 1000:.3f} ms per claim one at a time, {m['eight'] * 1000:.3f} ms with 8 claimers",
         f"median of {5 if scale >= 1 else 1} rounds{trip}"),
        (f"claims: {count:,} due runs with a key",
         f"{free * 1000:.3f} ms per claim (limit never reached); {behind * 1000:.3f} ms per claim of a run without a "
         f"key behind {count:,} due runs held back by their full key",
         f"against {m['one'] * 1000:.3f} ms without a key"),
    ]


if __name__ == "__main__":
    # time whichever runifold PYTHONPATH names: python benchmarks/_claims.py sqlite|postgres [count] [rounds]
    which = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    r = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    import runifold

    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(which, Path(tmp), n, r))
    print(f"{which} {Path(runifold.__file__).parent.parent.name}: " + ", ".join(
        f"{k} {v * 1000:.4f} ms" for k, v in result.items()))
