"""A test bench for workflows: the memory store, a clock that skips ahead, a worker, and replay checks."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, final

from runifold.client import Client, RunHandle
from runifold.client._client import started
from runifold.dsl import WorkflowDefinition
from runifold.errors import ConfigurationError
from runifold.history import CHILD_SIGNAL_PREFIX, Entry, decode_event, fold, is_version
from runifold.signals import SignalEnvelope, SignalGateway
from runifold.stores import UNFINISHED, RunInfo, RunStatus, SignalReceipt
from runifold.stores.memory import MemoryWorkflowStore
from runifold.testing._clock import FakeClock
from runifold.worker import Idle, LeaseDuration, Outcome, WorkerId, WorkflowRegistry, WorkflowWorker
from runifold.worker._debug import replay

#: how many times result() and run_until_suspended() skip time, by default, before they give up on a run that never
#: settles (each skip replays the run, so a workflow that sleeps in a loop for ever must be stopped well before
#: 100,000)
_MAX_ROUNDS = 1_000


class _Trusted:
    """An authenticator that believes every sender: tests need no keys."""

    def verify(self, envelope: SignalEnvelope, now: float) -> None:
        return None


@final
class WorkflowEnvironment:
    """Runs workflows in this process, on the memory store, with time you control.

    Timers and retry backoffs of any length take no time: :meth:`result` and
    :meth:`skip_time` move the store's clock straight to the next one that is
    due. Everything else is the real engine: the same worker, the same replay,
    the same checks.

    Args:
        registry: the definitions to run (a :class:`WorkflowRegistry`, or definitions).
        start: the clock's first reading (default: now), an aware datetime.
        max_time_skips: how many times :meth:`result` and :meth:`run_until_suspended` skip time for one call
            before they give up on a run that never settles (raise it for a run with more timers than that).

    Use it as an async context manager::

        async with WorkflowEnvironment(registry) as env:
            run = await env.start(order_intake, {"order_id": "o1"})
            assert await env.result(run) == {...}
    """

    def __init__(self, registry: WorkflowRegistry | WorkflowDefinition, *more: WorkflowDefinition,
                 start: datetime | None = None, max_time_skips: int = _MAX_ROUNDS) -> None:
        if isinstance(registry, WorkflowDefinition):
            registry = WorkflowRegistry(registry, *more)
        elif not isinstance(registry, WorkflowRegistry) or more:
            both = "; not both" if isinstance(registry, WorkflowRegistry) else ""
            raise ConfigurationError(
                f"WorkflowEnvironment takes a WorkflowRegistry, or one or more WorkflowDefinitions (a @workflow "
                f"function goes in one: WorkflowDefinition(fn)){both}; got {', '.join(map(repr, (registry, *more)))}")
        if start is not None and not isinstance(start, datetime):
            raise ConfigurationError(f"WorkflowEnvironment(start=) takes an aware datetime (e.g. "
                                     f"datetime(2030, 1, 1, tzinfo=UTC)), got {start!r}")
        if start is not None and start.utcoffset() is None:
            raise ConfigurationError(f"WorkflowEnvironment(start=) takes an aware datetime (e.g. with tzinfo=UTC), "
                                     f"got {start!r}: a naive one would be read in this machine's time zone")
        if not isinstance(max_time_skips, int) or isinstance(max_time_skips, bool) or max_time_skips < 1:
            raise ConfigurationError(f"WorkflowEnvironment(max_time_skips=) takes a whole number of at least 1, "
                                     f"got {max_time_skips!r}")
        self.max_time_skips = max_time_skips
        self.registry = registry
        self.clock = FakeClock(None if start is None else start.timestamp())
        self.store = MemoryWorkflowStore(self.clock)
        self.client = Client(self.store, registry)
        self.worker = WorkflowWorker(self.store, registry, WorkerId.parse("test-worker"),
                                     LeaseDuration(timedelta(hours=1)), timedelta(minutes=20))
        #: every outcome the worker reported, in order
        self.outcomes: list[Outcome] = []

    async def __aenter__(self) -> WorkflowEnvironment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.store.close()

    # -- starting and driving runs ------------------------------------------------------------

    async def start(self, workflow: Callable[..., Any] | WorkflowDefinition | str, input: Mapping[str, Any] | None = None,
                    *, version: int | None = None, checkpoint_id: str | None = None,
                    concurrency_key: str | None = None, concurrency_limit: int | None = None) -> RunHandle:
        """Start a run, as :meth:`runifold.Client.start` does (its input is checked against the workflow).

        Raises:
            UnknownWorkflowError: this environment's registry does not hold the workflow (its worker could never
                run it).
        """
        name, version = started(workflow, version)
        if is_version(version):  # (one that is not is refused as Client.start refuses it)
            self.registry.definition_for(name, version)
        return await self.client.start(workflow, input, version=version, checkpoint_id=checkpoint_id,
                                       concurrency_key=concurrency_key, concurrency_limit=concurrency_limit)

    async def run_once(self) -> Outcome:
        """Let the worker claim and drive at most one due run."""
        outcome = await self.worker.run_once()
        self.outcomes.append(outcome)
        return outcome

    async def run_until_idle(self) -> list[Outcome]:
        """Drive every due run until none is due (no time passes); return the outcomes."""
        outcomes: list[Outcome] = []
        while not isinstance(outcome := await self.run_once(), Idle):
            outcomes.append(outcome)
        return outcomes

    async def skip_time(self, by: timedelta | None = None) -> bool:
        """Move the clock ``by`` ahead, or (by default) to the next due timer or retry; False if none is pending."""
        if by is not None:
            self.clock.advance(by, what="skip_time(by=)")
            return True
        due = [r.due_at for r in await self._unfinished() if r.due_at is not None]
        if not due:
            return False
        self.clock.advance(max(0.0, min(due) - self.clock()))
        return True

    async def run_until_suspended(self, run: RunHandle | str) -> RunInfo:
        """Drive runs, skipping timers, until ``run`` waits for a signal, is parked or diverged, or has finished."""
        for skipped in range(self.max_time_skips + 1):  # (driven after the last skip too)
            await self.run_until_idle()
            await self._check_runnable()
            info = await self.store.get_run(_id(run))
            if info.status not in (RunStatus.READY, RunStatus.WAITING) or await self._signals_awaited(info):
                return info
            if skipped == self.max_time_skips:
                break
            if not await self.skip_time():
                return info
        raise AssertionError(f"run {_id(run)} did not settle after skipping time {self.max_time_skips:,} times: "
                             "does it loop forever? (if not, raise WorkflowEnvironment(max_time_skips=))")

    async def result(self, run: RunHandle | str) -> Any:
        """Drive runs, skipping time (signal deadlines too), until ``run`` finishes; return its output.

        Raises:
            RunFailedError: the run failed or was cancelled.
            AssertionError: the run waits for something that never comes in this environment
                (a signal nobody sent, an operator's resolution) or diverged, saying which.
        """
        for skipped in range(self.max_time_skips + 1):  # (driven after the last skip too)
            await self.run_until_idle()
            await self._check_runnable()
            info = await self.store.get_run(_id(run))
            if info.status.finished:
                handle = run if isinstance(run, RunHandle) else await self.client.get_handle(run)
                return await handle.result()
            # (a run whose child is parked or diverged waits for ever too: skipping time would only run out its
            # elapsed budget)
            stuck = info.status in (RunStatus.PARKED, RunStatus.DIVERGED) or await self._stuck_child(info) is not None
            if not stuck and skipped == self.max_time_skips:
                break
            if stuck or not await self.skip_time():
                raise AssertionError(
                    f"run {info.run_id} is {info.status} and nothing in this environment will change that "
                    f"({info.reason}): {await self._what_it_needs(info)}"
                )
        raise AssertionError(f"run {_id(run)} did not finish after skipping time {self.max_time_skips:,} times: "
                             "does it loop forever? (if not, raise WorkflowEnvironment(max_time_skips=))")

    # -- signals --------------------------------------------------------------------------------

    async def signal(self, run: RunHandle | str, name: str, payload: Any = None, *, sender: str = "test",
                     reason: str = "test", signal_id: str | None = None) -> SignalReceipt:
        """Send a signal without keys; the definition must still declare ``name`` and allow ``sender``."""
        envelope = SignalEnvelope(target=_id(run), name=name, payload=payload, sender=sender, reason=reason,
                                  signal_id=f"{name}-{time.monotonic_ns()}" if signal_id is None else signal_id,
                                  key_id="test",
                                  timestamp=self.clock())
        return await SignalGateway(self.store, self.registry, _Trusted()).send(envelope)

    # -- checks -------------------------------------------------------------------------------------

    async def assert_replays(self) -> None:
        """Replay every finished run (completed, failed or cancelled) against its code; raise AssertionError naming
        each that diverges."""
        problems = []
        finished = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
        for info in await self.store.list_runs(status=finished, limit=1_000_000):
            definition = self.registry.get(info.name, info.version)
            if definition is None:
                continue
            history = [Entry(e.seq, e.at, decode_event(e.body)) for e in await self.store.history(info.run_id)]
            report = await replay(definition, info.run_id, history)
            if report.divergence is not None:
                problems.append(f"{info.checkpoint_id or info.run_id}: {report.divergence}")
        if problems:
            raise AssertionError("runs that do not replay against their code:\n" + "\n".join(problems))

    async def _check_runnable(self) -> None:
        """Raise AssertionError for a due run this environment has no definition of (a child's, say): nothing
        would ever run it, and whatever waits for it would wait for ever."""
        for info in await self.store.list_runs(status=RunStatus.READY, limit=1_000_000):
            if self.registry.get(info.name, info.version) is None:
                raise AssertionError(
                    f"run {info.run_id} ({info.name!r} v{info.version}) is due, but this environment has no "
                    "definition of it, so nothing runs it: add its WorkflowDefinition to the environment's "
                    "registry (a child workflow's too)")

    async def _unfinished(self) -> list[RunInfo]:
        return await self.store.list_runs(status=UNFINISHED, limit=1_000_000)

    async def _what_it_needs(self, info: RunInfo) -> str:
        """What would move a run on that waits for ever here: for a run waiting on a child, what the child needs."""
        if info.status is RunStatus.PARKED:
            return f"resolve its effect with resolve_effect(env.store, env.registry, {info.run_id!r}, ...) first"
        if info.status is RunStatus.DIVERGED:
            return "its code no longer matches its history"
        children = await self._children_waited_for(info)
        stopping = [c for c in children
                    if c.status in (RunStatus.PARKED, RunStatus.DIVERGED) or await self._stuck_child(c) is not None]
        for child in stopping or children:  # the child a parked or diverged run stops, if one does
            return f"its child run {child.run_id} is {child.status} ({child.reason}): {await self._what_it_needs(child)}"
        awaited = await self._signals_awaited(info)
        declared = getattr(self.registry.get(info.name, info.version), "signals", None)
        undeclared = [n for n in awaited if declared is not None and n not in declared
                      and not n.startswith(CHILD_SIGNAL_PREFIX)]
        if undeclared:
            return (f"it waits for signal {undeclared[0]!r}, which its definition does not declare (it declares "
                    f"{sorted(declared or ())}), so no sender may send it: fix the name, or declare it in "
                    "WorkflowDefinition(signals=...)")
        if awaited:
            return f"send what it waits for with env.signal({info.run_id!r}, ...) first"
        return "it waits only for a timer that never fires"

    async def _stuck_child(self, info: RunInfo) -> RunInfo | None:
        """A parked or diverged run among the unfinished children ``info`` waits for (and theirs)."""
        for child in await self._children_waited_for(info):
            if child.status in (RunStatus.PARKED, RunStatus.DIVERGED):
                return child
            below = await self._stuck_child(child)
            if below is not None:
                return below
        return None

    async def _children_waited_for(self, info: RunInfo) -> list[RunInfo]:
        history = [Entry(e.seq, e.at, decode_event(e.body)) for e in await self.store.history(info.run_id)]
        children = [await self.store.get_run(wait.signal.removeprefix(CHILD_SIGNAL_PREFIX))
                    for wait in fold(history).waits
                    if wait.kind == "signal" and wait.signal is not None and wait.signal.startswith(CHILD_SIGNAL_PREFIX)]
        return [child for child in children if not child.status.finished]

    async def _signals_awaited(self, info: RunInfo) -> list[str]:
        history = [Entry(e.seq, e.at, decode_event(e.body)) for e in await self.store.history(info.run_id)]
        return [wait.signal or "" for wait in fold(history).waits if wait.kind == "signal"]


def _id(run: RunHandle | str) -> str:
    return run.run_id if isinstance(run, RunHandle) else run
