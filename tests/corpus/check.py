"""The three properties every completed run must have, and a driver that runs workflows through their waits.

1. Its history replays cleanly against the code that wrote it (no divergence, to the end).
2. The replay returns what the live run returned: equal values of the same types, all the way down.
3. No step body ran while the run was suspended (checked by :class:`Watched` in this process).

And one of its history: a completed run has no effect left without an outcome (in doubt or ambiguous).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Any

import msgspec

from runifold import Completed, Failed, Idle, RunStatus, Suspended, WorkflowRegistry
from runifold.errors import recordable
from runifold.history import RunFailed, fold
from runifold.stores import Continue
from runifold.worker._debug import replay
from tests.support import entries, send_signal, worker


def typed(value: Any) -> Any:
    """A structure naming the type of ``value`` and of everything inside it, for comparing live and replayed values."""
    name = type(value).__qualname__
    if isinstance(value, (list, tuple)):
        return (name, [typed(v) for v in value])
    if isinstance(value, (set, frozenset)):
        return (name, sorted(repr(typed(v)) for v in value))
    if isinstance(value, dict):
        return (name, sorted((repr(typed(k)), typed(v)) for k, v in value.items()))
    if isinstance(value, msgspec.Struct):
        return (name, [(f, typed(getattr(value, f))) for f in value.__struct_fields__])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (name, [(f.name, typed(getattr(value, f.name))) for f in dataclasses.fields(value)])
    return (name, repr(value))


async def replay_problems(store: Any, registry: WorkflowRegistry, ref: str, live: Any = None,
                          *, compare_live: bool = True, failed: bool = False) -> list[str]:
    """Return what breaks properties 1 and 2 for one finished run (empty: nothing); of a ``failed`` run, only
    a divergence (a call the engine refused, a step over budget say, leaves its replay stopped there)."""
    info = await store.get_run(ref)
    definition = registry.definition_for(info.name, info.version)
    report = await replay(definition, info.run_id, await entries(store, info.run_id))
    if failed:
        if report.divergence is not None:
            return [f"{ref} ({info.name}, failed): replay diverges: {report.divergence}"]
        # the replay fails as the live run did: with the reason history records
        recorded = next(e.event for e in reversed(await entries(store, info.run_id)) if isinstance(e.event, RunFailed))
        replayed = None if report.error is None else recordable(report.error)
        if not report.finished or recorded.reason not in (replayed, f"workflow raised {replayed}"):
            return [f"{ref} ({info.name}, failed): live failed with {recorded.reason!r}; the replay "
                    f"{'stopped at ' + str(report.stopped_at) if not report.finished else 'failed with ' + repr(replayed)}"]
        return []
    problems = []
    pending = fold(await entries(store, info.run_id)).pending_effects
    if info.status is RunStatus.COMPLETED and pending:
        problems.append(f"{ref} ({info.name}): completed with effects that have no outcome: {pending}")
    if report.divergence is not None:
        problems.append(f"{ref} ({info.name}): replay diverges: {report.divergence}")
    elif not report.finished:
        problems.append(f"{ref} ({info.name}): replay stopped at {report.stopped_at}")
    elif compare_live and report.error is None and typed(report.result) != typed(live):
        problems.append(f"{ref} ({info.name}): live returned {typed(live)!r}, replay {typed(report.result)!r}")
    return problems


class Watched:
    """A real store, watched: which runs are between executions (suspended or finished), per their last commit."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.idle: set[str] = set()

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        claim = await self._store.claim(*args, **kwargs)
        if claim is not None:
            self.idle.discard(claim.run_id)
        return claim

    async def commit(self, lease: Any, revision: int, events: Any, transition: Any, consumed: Any = ()) -> Any:
        result = await self._store.commit(lease, revision, events, transition, consumed)
        if not isinstance(transition, Continue):
            self.idle.add(lease.run_id)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def drive(store: Any, registry: WorkflowRegistry, refs: list[str], *, rng: random.Random,
                interrupt: float = 0.0, timeout: float = 60.0, send: tuple[str, ...] = ("go",),
                ) -> dict[str, Completed | Failed | None]:
    """Run ``refs`` to their end with one worker, sending each signal of ``send`` a run waits for as it suspends.

    The result maps each ref to how it ended (None: it ended in an interrupted execution).

    With ``interrupt`` > 0, that share of executions is cancelled after a random moment (the worker
    stops and hands the run back; the next execution replays whatever was committed).
    """
    w = worker(store, *[registry.definition_for(n, v) for n, v in registry.versions()], lease=10.0)
    ends: dict[str, Completed | Failed | None] = {}
    sent = 0
    deadline = time.monotonic() + timeout
    by_id: dict[str, str] = {}
    for ref in refs:
        by_id[(await store.get_run(ref)).run_id] = ref
    while len(ends) < len(refs):
        assert time.monotonic() < deadline, f"runs not finished in {timeout} s: {sorted(set(refs) - set(ends))}"
        running = asyncio.ensure_future(w.run_once())
        if interrupt and rng.random() < interrupt:
            done, _ = await asyncio.wait({running}, timeout=rng.uniform(0, 0.05))
            if not done:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
                continue
        outcome = await running
        match outcome:
            case Completed(run_id=run_id) | Failed(run_id=run_id, run_failed=True):
                if run_id in by_id:  # else a child run of one of them
                    ends[by_id[run_id]] = outcome
            case Suspended(run_id=run_id, signals=signals):
                for name in set(signals) & set(send):
                    sent += 1
                    await send_signal(store, run_id, name, f"{name}-{sent}")
            case Failed(run_failed=False, reason=reason):
                raise AssertionError(f"unchanged code diverged from its own history: {reason}")
            case Idle():
                # an interrupted execution may have committed its end or suspension without telling us
                for ref in set(refs) - set(ends):
                    status = (await store.get_run(ref)).status
                    if status in (RunStatus.COMPLETED, RunStatus.FAILED):
                        ends[ref] = None  # finished, but its live output never reached us
                    elif status is RunStatus.WAITING:
                        for name in send:
                            await send_signal(store, ref, name, f"{name}-idle-{ref}")
                await asyncio.sleep(0.01)
            case _:
                pass
    return ends
