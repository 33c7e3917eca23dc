"""Random workflow shapes (hypothesis), on every store: every run that ends replays exactly.

Each generated shape runs to its end through its waits, with executions cut at random moments; then
its history must replay cleanly, the replay must return (or raise) what the live run did, with the
same types, and no step body may have started while the run was suspended.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runifold import Completed, WorkflowTask
from runifold.stores.memory import MemoryWorkflowStore
from runifold.stores.sqlite import SqliteWorkflowStore
from tests.conftest import require_postgres, reset_postgres
from tests.corpus import patterns, shapes
from tests.corpus.check import Watched, drive, replay_problems

_tags = iter(range(10**9))


def _step() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda fails: {"step": f"s{next(_tags)}", "fails": fails},
                     st.sampled_from([0, 0, 0, 1, 2, 3]))


leaves = st.one_of(
    _step(),
    st.just({"wait": "go"}),
    st.builds(lambda ms: {"sleep": ms}, st.sampled_from([0, 20, 80])),
    st.builds(lambda kind: {"value": kind}, st.sampled_from(["uuid", "now", "random"])),
    st.just({"charge": 1}),
    st.builds(lambda ms: {"asleep": ms}, st.sampled_from([0, 10])),
)


def _branches(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    many = st.lists(children, min_size=1, max_size=4)
    return st.one_of(
        st.builds(lambda ms, x: {"within": ms, "do": x}, st.sampled_from([5, 50]), children),
        st.builds(lambda xs: {"seq": xs}, many),
        st.builds(lambda xs, rx: {"gather": xs, "rx": rx}, many, st.booleans()),
        st.builds(lambda xs: {"group": xs}, many),
    )


shape_trees = st.recursive(leaves, _branches, max_leaves=10)

EXAMPLES = {"memory": 40, "sqlite": 12, "postgres": 8}


async def _open(kind: str, folder: Path) -> Any:
    if kind == "memory":
        return MemoryWorkflowStore()
    if kind == "sqlite":
        return await SqliteWorkflowStore.open(str(folder / "shapes.db"))
    dsn = require_postgres()
    await reset_postgres(dsn)
    from runifold.stores.postgres import PostgresWorkflowStore

    return await PostgresWorkflowStore.open(dsn)


async def _check(kind: str, shape: dict[str, Any], seed: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = Watched(await _open(kind, Path(folder)))
        violations: list[str] = []
        patterns.seen.check = lambda run, what: violations.append(f"{what} ran while suspended") \
            if run in store.idle else None
        try:
            await store.enqueue(WorkflowTask("shape", 1, {"shape": shape}, checkpoint_id="r1"))
            ends = await drive(store, shapes.registry, ["r1"], rng=random.Random(seed), interrupt=0.25)
            end = ends["r1"]
            problems = await replay_problems(store, shapes.registry, "r1",
                                             end.output if isinstance(end, Completed) else None,
                                             compare_live=isinstance(end, Completed))
            assert not problems + violations, f"shape {shape}: " + "\n".join(problems + violations)
        finally:
            patterns.seen.check = None
            await store.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_random_shapes_replay_exactly(kind: str) -> None:
    """Any tree of steps, failures, waits, values and concurrency ends with a history that replays exactly."""
    if kind == "postgres":
        require_postgres()

    @settings(max_examples=EXAMPLES[kind], deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(shape=shape_trees, seed=st.integers(0, 2**32))
    def check(shape: dict[str, Any], seed: int) -> None:
        asyncio.run(_check(kind, shape, seed))

    check()
