"""Every shape, with its execution stopped right after each of its commits in turn: what a crash leaves.

A worker that dies between two commits loses everything the second would have recorded (a cancellation, a
value drawn, a timer fired): the next worker replays the first and must record the rest itself, so that the
completed run's history replays against its code and returns what the live run returned. A random SIGKILL
rarely lands in that window; this test puts every run there once, at every commit.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from runifold import Failed, WorkflowTask
from tests.corpus import patterns
from tests.corpus.check import drive, replay_problems


class StoppedAfter:
    """A real store that hands a run back right after its ``k``-th commit (``stops``: run id to ``k``), without a
    word to the worker; it counts every run's commits.

    The worker's next write (or renewal) under that lease is refused (the store fences it), so nothing it did
    after the commit is recorded, as if it had crashed there; the next claim replays the history.
    """

    def __init__(self, store: Any) -> None:
        self._store = store
        self.stops: dict[str, int] = {}
        self.commits: Counter[str] = Counter()
        self.handed_back = 0

    async def commit(self, lease: Any, *args: Any, **kwargs: Any) -> Any:
        result = await self._store.commit(lease, *args, **kwargs)
        self.commits[lease.run_id] += 1
        if self.commits[lease.run_id] == self.stops.get(lease.run_id):
            await self._store.release(lease)
            self.handed_back += 1
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def _run(store: StoppedAfter, refs: dict[str, int]) -> list[str]:
    """Run each ref (``checkpoint id: k``, 0: never stopped) to its end; what breaks the corpus's properties."""
    for ref, k in refs.items():
        started = await store.enqueue(WorkflowTask(ref.rpartition("-")[0], 1, {"n": 0}, checkpoint_id=ref))
        store.stops[started.run_id] = k
    ends = await drive(store, patterns.registry, list(refs), rng=random.Random(0), timeout=240)
    problems = [f"{ref} failed: {end.reason}" for ref, end in ends.items() if isinstance(end, Failed)]
    for ref, end in ends.items():
        problems += [f"stopped after commit {refs[ref]}: {p}" for p in await replay_problems(
            store, patterns.registry, ref, getattr(end, "output", None), compare_live=end is not None)]
    return problems


async def test_every_shape_replays_after_its_execution_stopped_after_each_commit(open_store: Any) -> None:
    store = StoppedAfter(await open_store())
    assert await _run(store, {f"{name}-whole": 0 for name in patterns.NAMES}) == []
    commits = {name: store.commits[(await store.get_run(f"{name}-whole")).run_id] for name in patterns.NAMES}
    # (stopped after its last commit, a run has ended: nothing of it is lost)
    stopped = {f"{name}-k{k}": k for name, n in commits.items() for k in range(1, n)}
    assert len(stopped) > 3 * len(commits)
    problems = await _run(store, stopped)
    print(f"{len(stopped)} runs of {len(commits)} shapes, {store.handed_back} handed back after a commit")
    assert not problems, "\n".join(problems)
    assert store.handed_back >= len(stopped) // 2
