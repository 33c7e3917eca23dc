"""Driving one run: replay its history through the workflow's code, then continue it live.

Workflow code runs on its own :class:`~runifold.worker._loop.WorkflowLoop`.
Each durable call (step, effect, timer, signal wait; asyncio's timers are
durable timers too) registers a *call* and awaits a future that only this
driver resolves:

* **Replay.** Calls whose outcome history records are answered in the order
  the outcomes were recorded, one at a time, running workflow code until it is
  idle in between: the interleaving of concurrent branches is the one the live
  run had. A recorded call the code cannot reach once it is idle is a
  divergence; nothing runs live and nothing is
  written before the whole history has been replayed.
* **Live.** Then the open calls progress: step and effect bodies run as tasks
  of the worker's loop, and their results are committed, grouped when several
  finish together, *before* workflow code sees them, in commit order. Timers
  fire and signals are consumed when due on the store's clock; a retry waits
  for its own due time.
* **Suspension.** When workflow code is idle, no body is in flight and nothing
  is due, the transition is derived from the open calls (earliest due time,
  signals awaited, ambiguous effects) and committed once. Nothing is raised
  through workflow code to stop it; afterwards its tasks are cancelled, and a
  call made while they unwind raises ``CancelledError`` without running or
  recording anything.

Workflow code never awaits the store: a commit that fails stops the execution
(the run stays as it was), it is never raised into the workflow. Values
recorded by one branch while another commits are buffered and go into the
next commit; nothing buffered is dropped.

The debugger (:mod:`runifold.worker._debug`) is this same driver with no store:
it stops where the history ends. The replay half is in
:mod:`runifold.worker._replaying`, the live half in :mod:`runifold.worker._progress`.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import structlog
from runifold._log import get_logger

from runifold.dsl import WorkflowContext, WorkflowDefinition
from runifold.dsl._context import Binding, Scope
from runifold.dsl._definition import WORKFLOW_ATTR, EffectSpec, StepSpec, WorkflowSpec
from runifold.errors import (
    BudgetExceededError,
    ConfigurationError,
    EffectFailedError,
    LeaseLostError,
    NondeterminismError,
    OutsideWorkflowError,
    RunifoldError,
    SerializationError,
    StepFailedError,
    StoreError,
    StoreUnavailableError,
    describe,
    recordable,
    traceback_of,
    type_name,
)
from runifold.history import (
    AnyEvent,
    CallKind,
    Entry,
    Replayer,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunRetried,
    RunStarted,
    UsageCharged,
    ValueRecorded,
    fire_time,
    fold,
    holds_deadline,
    record,
)
from runifold.history._replayer import scope_of
from runifold.stores import (Continue, EventRow, Finish, InboxSignal, Reschedule, RunStatus, Suspend, Transition,
                             WorkflowStore, WorkflowTask)
from runifold.worker._call import Call, Live, ReplayReport, Usage, failed_call, why
from runifold.worker._lease import LeaseKeeping
from runifold.worker._loop import WorkflowLoop
from runifold.worker._bodies import HALT
from runifold.worker._progress import LiveProgress
from runifold.worker._replaying import WORKFLOW_BLOCKED, WORKFLOW_CANCELLED, WORKFLOW_RAISED, Replaying, clipped
from runifold.worker._outcome import (
    Completed,
    Failed as FailedOutcome,
    LeaseLost,
    Outcome,
    Retried,
    Suspended,
    SuspendReason,
)
from runifold.worker._registry import WorkflowRegistry, bind_input, with_concurrency

log = get_logger("runifold.worker")

#: how long a run whose code diverged from its history waits before it is tried again
DIVERGED_RETRY_SECONDS = 60.0
#: how long a stopping execution waits for the bodies it cancelled
_BODY_GRACE = 1.0
#: the pause before a commit whose answer was lost (the store unreachable) is sent again
_RESEND_PAUSE = 0.5


class _Stop(Exception):
    """Ends the driver: the lease is lost or the store failed. Never reaches workflow code."""


class _Unrecordable(Exception):
    """A buffered event cannot be encoded (a value nested too deeply to encode inside its event)."""

    def __init__(self, error: SerializationError) -> None:
        super().__init__(str(error))
        self.error = error


class Execution(LeaseKeeping, LiveProgress, Replaying):
    """Drives one run: live under a claim, or as the debugger with no store."""

    def __init__(
        self,
        definition: WorkflowDefinition,
        run_id: str,
        checkpoint_id: str | None,
        entries: Sequence[Entry],
        live: Live | None,
        inbox: Sequence[InboxSignal] = (),
        worker_id: str = "",
        registry: WorkflowRegistry | None = None,
    ) -> None:
        self.definition = definition
        self._registry = registry  # the worker's: what child runs' definitions are
        self.run_id = run_id
        self.checkpoint_id = checkpoint_id
        self._live = live
        self.replayer = Replayer(entries)
        self.revision = self.replayer.revision
        usage = fold(entries).usage
        recoveries = live.recoveries if live is not None else 0
        # invariant: usage only grows; a recovery repeated whatever was in flight, so it counts as a step
        self.usage = Usage(usage.steps + recoveries, usage.effect_attempts, usage.retries, usage.cost_units)
        self._recorded_result = [e.event for e in entries if isinstance(e.event, RunCompleted)]
        self._unstarted: list[tuple[str, CallKind]] = []  # calls of a completed run's left tasks (see _visit)
        # how the run failed, if it is failed (its last event); the debugger reports it
        last = entries[-1].event if entries else None
        self._recorded_failure = last if isinstance(last, RunFailed) else None
        self._recorded_cancel = last if isinstance(last, RunCancelled) else None
        # the live run failed before its code made any call (its input did not fit, it was retried and did not)
        self._failed_at_start = self._recorded_failure is not None and all(
            isinstance(e.event, (RunStarted, RunFailed, RunRetried)) for e in entries)
        self._inbox: list[InboxSignal] = sorted(inbox, key=lambda s: s.received_at)
        self._inbox_read = live.store_now if live is not None else 0.0
        self._inbox_due: float | None = None
        self._calls: dict[str, Call] = {}
        self.child_ends: dict[str, asyncio.Future[Any]] = {}  # (see ChildHandle.result)
        self._open: list[Call] = []  # calls that progress live, in registration order
        self._replaying = True
        self._cursor = 0  # into replayer.resolutions
        self._resolutions: deque[tuple[Call, Any, BaseException | None, float]] = deque()
        self._buffer: list[AnyEvent] = []  # recorded with the next commit
        self._consumed: list[str] = []  # signal ids, consumed with the next commit
        # events that must be durable before their action runs: (events, action after the commit, given its time)
        self._outbox: list[tuple[list[AnyEvent], Callable[[float], None]]] = []
        self._bodies: set[asyncio.Task[Any]] = set()
        self._starts = []
        self._finished = []
        self._failure: tuple[str, BaseException | None, str] | None = None  # reason, exception, call key
        # calls workflow code has made (registered, values drawn, charges, cancellations), live and replayed alike;
        # and, for each call whose final failure was handed to it, how many it had made by then
        self._made = 0
        self._failed_at: dict[str, int] = {}
        self._divergence: NondeterminismError | None = None
        self._lost: str | None = None
        self._store_error: StoreError | None = None
        self._closing = False
        # the key of a charge the budget refused: the run fails there, and nothing workflow code calls after it is
        # recorded (a charge returns, so its task goes on: what it calls next must not enter the history)
        self._refused: str | None = None
        self._flush = False
        self._woken = False
        self._waiter: asyncio.Future[None] | None = None
        self._renewal_due: asyncio.TimerHandle | None = None  # when the lease is next renewed
        self._renewal: asyncio.Task[None] | None = None  # a renewal under way
        self.report = ReplayReport(run_id)
        self.log = log.bind(run_id=run_id, checkpoint_id=checkpoint_id, worker_id=worker_id)

    def call_returns(self, key: str) -> Any | None:
        """The annotated return type of the call workflow code made under ``key`` (None: it made none)."""
        call = self._calls.get(key)
        return None if call is None else call.returns

    # -- construction -------------------------------------------------------------------

    @classmethod
    def live(
        cls, store: WorkflowStore, claim: Any, definition: WorkflowDefinition, entries: Sequence[Entry],
        worker_id: str, lease_seconds: float, renew_every: float, registry: WorkflowRegistry | None = None,
    ) -> Execution:
        """An execution of a claimed run."""
        sent = claim.received if claim.sent is None else min(claim.sent, claim.received)
        io = Live(store, claim.lease, lease_seconds, renew_every, claim.received, claim.now, claim.recoveries, sent,
                  getattr(store, "local_clock", None))
        return cls(definition, claim.run_id, claim.checkpoint_id, entries, io, claim.inbox, worker_id, registry)

    # -- what WorkflowContext and the decorators call (the Driver protocol) ---------------

    def store_time(self) -> float:
        """The store's clock: read directly when this process can, else the claim's reading plus the time
        elapsed here since (monotonic)."""
        live = self._live
        if live is None:
            return time.time()
        if live.local_clock is not None:
            return live.local_clock()
        return live.store_now + (time.monotonic() - live.claimed_at)

    def call_step(self, spec: StepSpec, scope: Scope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Awaitable[Any]:
        return self._awaited(self._register(scope.key(spec.id), CallKind.STEP, spec.returns.get(), spec=spec,
                                            args=args, kwargs=kwargs))

    def call_effect(self, spec: EffectSpec, scope: Scope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Awaitable[Any]:
        return self._awaited(self._register(scope.key(spec.id), CallKind.EFFECT, spec.returns.get(), spec=spec,
                                            args=args, kwargs=kwargs))

    async def sleep(self, scope: Scope, delay: float | None, until: float | None) -> None:
        fire_at = until if until is not None else self.store_time() + (delay or 0.0)
        await self._awaited(self._register(scope.key("sleep"), CallKind.TIMER, None, due=fire_time(fire_at)))

    def timer(self, scope: Scope, delay: float, fire: Callable[[], None]) -> Callable[[], None]:
        """A durable timer for asyncio's ``call_at`` in workflow code: ``fire`` runs when it fires (live, or at
        its recorded place on replay); the function returned cancels it (recorded as ``call_cancelled``)."""
        # an endless sleep (math.inf), or one past the year 9999, never fires: it has no due time
        due = fire_time(self.store_time() + max(0.0, delay))
        call = self._register(scope.key("timer"), CallKind.TIMER, None, due=due)
        call.future.add_done_callback(lambda future: None if future.cancelled() else fire())

        def cancel() -> None:
            if call.future.cancel():
                self._abandon(call)

        return cancel

    async def wait_signal(self, scope: Scope, name: str, timeout: float | None, type_: Any = Any) -> Any:
        # a deadline past the year 9999 never passes, as a timer due then never fires
        deadline = None if timeout is None else fire_time(self.store_time() + timeout)
        return await self._awaited(self._register(scope.key(f"wait.{name}"), CallKind.SIGNAL, type_, name=name,
                                                  due=deadline))

    async def _awaited(self, call: Call) -> Any:
        """The call's outcome; a call workflow code stops waiting for (cancels) is abandoned."""
        try:
            return await call.future
        except asyncio.CancelledError:
            self._abandon(call)  # before the cancelled task runs on: its next calls come after this one's record
            raise

    async def start_child(self, scope: Scope, workflow: Any, input: Mapping[str, Any], version: int | None,
                          checkpoint_id: str | None) -> tuple[str, str]:
        task = self._child_task(workflow, input, version, checkpoint_id, scope)
        call = self._register(scope.key(f"child.{task.name}"), CallKind.CHILD, None, args=(task,))
        child: tuple[str, str] = await self._awaited(call)
        return child

    def _child_task(self, workflow: Any, input: Mapping[str, Any], version: int | None, checkpoint_id: str | None,
                    scope: Scope) -> WorkflowTask:
        """The child's task, its input checked against the child's code when it is known (a pure check)."""
        spec = getattr(workflow, WORKFLOW_ATTR, None)
        if isinstance(spec, WorkflowSpec):
            name, version = spec.name, spec.version if version is None else version
        elif isinstance(workflow, str) and version is not None:
            name = workflow
        else:
            raise ConfigurationError(
                f"start_child() takes a @workflow function, or a workflow name with version=, got {workflow!r}")
        # the child's code, as this worker knows it: its input is checked, and its definition's limit applies
        definition = self._registry.get(name, version) if self._registry is not None else None
        if definition is None and isinstance(spec, WorkflowSpec) and version == spec.version:
            definition = WorkflowDefinition(workflow)
        # invariant: the child's checkpoint id follows from this run and the call, so a replay that starts the
        # child again finds the same run (key: the one this call is about to get)
        key = scope.peek(f"child.{name}")
        task = WorkflowTask(name, version, dict(input), checkpoint_id or f"child:{self.run_id}:{key}",
                            parent_run_id=self.run_id)
        if definition is None:
            return task
        bind_input(definition, dict(input))
        return with_concurrency(definition, task)

    def record_value(self, scope: Scope, kind: str, make: Callable[[], Any]) -> Any:
        self._here()
        key = scope.key(kind)
        if self._closing or self._refused is not None:
            return make()  # the run is suspended, over or failing: nothing is recorded (see _register)
        events = self._visit(key, CallKind.VALUE)
        if events:
            event = events[0]
            assert isinstance(event, ValueRecorded)
            return event.value
        value = make()
        self._buffer.append(ValueRecorded(key=key, value=value))
        return value

    def charge(self, scope: Scope, units: float) -> None:
        self._here()
        key = scope.key("charge")
        if self._closing or self._refused is not None:
            return
        if self._visit(key, CallKind.CHARGE):
            return
        budget = self.definition.budget.max_cost_units
        if budget is not None and self.usage.cost_units + units > budget:
            # invariant: the run fails at this charge, live and on replay alike (usage is the history's fold, and
            # nothing charged after it is recorded), so its history ends where its code was refused
            self._refused = key
            self._fail(BudgetExceededError("cost units", self.usage.cost_units + units, budget), key)
            return
        self.usage.cost_units += units
        self._buffer.append(UsageCharged(key=key, units=units))

    # -- registration ---------------------------------------------------------------------

    def _visit(self, key: str, kind: CallKind) -> list[AnyEvent]:
        self._made += 1  # (every call of workflow code comes here: a step, effect, wait, child, value or charge)
        self._loop.handled.note(key)  # (what workflow code is handling: see _handling)
        if self._divergence is not None:
            return []
        try:
            events = self.replayer.visit(key, kind)
        except NondeterminismError as exc:
            self._divergence = exc
            return []
        root = self._root
        if not events and self._recorded_result and root is not None and not root.done():
            # invariant: a completed run recorded every call its workflow made before it returned (only tasks it
            # left running may call on after that, unrecorded), so code that makes a new call before returning
            # no longer ends where the run ended. But a step, effect or child start of another task, made in the
            # pass of workflow code in which the workflow returned, never started live: it was dropped,
            # unrecorded. So such a call is judged once that pass is over (see _drive)
            if kind in (CallKind.STEP, CallKind.EFFECT, CallKind.CHILD) and scope_of(key) != "":
                self._unstarted.append((key, kind))
            else:
                self._divergence = self.replayer.added(key, kind, "the run's completion, with no such call before it")
        return events

    def _here(self) -> None:
        """Refuse a call made outside workflow code: from a task or thread of another loop, which the driver
        neither sees nor waits for, so where it falls among the run's calls would differ on every replay."""
        if asyncio.events._get_running_loop() is not self._loop:
            raise OutsideWorkflowError(
                "a step, effect, wait or recorded value was called for this run from outside its workflow code "
                "(a task or thread of another event loop); make every call of a run from the workflow function "
                "and the tasks it creates")

    def _register(self, key: str, kind: CallKind, returns: Any, **fields: Any) -> Call:
        """Register a call made by workflow code; its future is resolved by the driver only."""
        self._here()
        if self._closing:
            # invariant: while the run is suspended or over, no call runs, records or raises anything at once;
            # the task that made a durable call is cancelled at its await. So workflow code that swallows every
            # cancellation (a retry loop around a wait) still yields at each wait, and the teardown's bounded
            # passes end
            task = asyncio.current_task()
            if task is not None:
                task.cancel()
            return Call(key, kind, self._loop.create_future(), returns, **fields)
        if self._refused is not None:
            # the run fails at a refused charge: a later call records nothing and never ends (as a step the budget
            # refused: its task waits until the run's teardown)
            return Call(key, kind, self._loop.create_future(), returns, **fields)
        events = self._visit(key, kind)
        call = Call(key, kind, self._loop.create_future(), returns, **fields)
        if self._divergence is not None:
            return call  # never resolved: the driver ends the execution
        if self._replaying or self._live is None:
            # replay hands recorded outcomes to calls by key, and the debugger reports their types; a live run
            # past its history keeps no index of its calls (a long run would hold every one it ever made)
            self._calls[key] = call
        if self._classify(call, events):
            self._open.append(call)
        return call

    # -- the drive loop -------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Replay and continue the run; return what happened.

        Raises:
            StoreError: the store failed (nothing of this execution after its last
                commit was written; the run is handed back or taken over when its
                lease expires).
        """
        assert self._live is not None
        live = self._live
        # the claim may have waited (behind a busy event loop, a slow start): another worker may hold the run by
        # now, so renew before anything of it runs, or run nothing (the check before every body, see _hold_lease)
        if not await self._hold_lease():
            return LeaseLost(self.run_id, self.checkpoint_id, f"the claim waited too long: {self._lost}")
        self._schedule_renewal(live)
        # the run id on user code's log lines (step bodies run in this task or in copies of its context)
        bound = structlog.contextvars.bind_contextvars(run_id=self.run_id)
        try:
            try:
                if not self._start():
                    return await self._finish_failed(self._failure)
                outcome = await self._drive()
                assert outcome is not None
                return outcome
            except _Unrecordable as unrecordable:
                # invariant: nothing of the buffer is written; the run fails with why, once, instead of
                # running its steps again at every claim
                await self._halt_bodies()
                self._unpark_unwritten()
                self._buffer.clear()
                self._outbox.clear()
                self._consumed.clear()
                return await self._finish_failed((str(unrecordable.error), unrecordable.error, ""))
            except _Stop:
                await self._halt_bodies()
                if self._store_error is not None:
                    await self._release(live)
                    raise self._store_error from None
                return LeaseLost(self.run_id, self.checkpoint_id, self._lost or "lease lost")
            except asyncio.CancelledError:
                # the worker itself is being cancelled: stop and hand the run back at once
                self._closing = True
                await self._halt_bodies()
                await self._release(live)
                raise
            except Exception:
                # escaped the driver (a bug, or a value it could not handle): stop as a crash would, the lease
                # left to expire (see Supervisor), and no body of this run outliving run_once()
                await self._halt_bodies()
                raise
        finally:
            structlog.contextvars.reset_contextvars(**bound)
            self._teardown()
            await self._stop_renewal()

    async def replay(self) -> ReplayReport:
        """Replay the history with no store and no bodies; report where code and history part, if they do."""
        assert self._live is None
        try:
            if self._start():
                await self._drive()
            report = self.report
            report.divergence = self._divergence
            if report.divergence is None:
                self._report_end()  # invariant: read before the teardown, which cancels every task of the workflow
        finally:
            self._teardown()
        return report

    def _start(self) -> bool:
        """Create the workflow loop and the root task; False if the recorded input does not fit."""
        self._outer = asyncio.get_running_loop()
        self._loop = WorkflowLoop(self._outer, self._wake_up)  # type: ignore[abstract]  # the I/O half is refused
        self._root: asyncio.Task[Any] | None = None
        try:
            kwargs = bind_input(self.definition, dict(self.replayer.started.input))
        except RunifoldError as exc:
            failed = self._recorded_failure
            if self._live is None and not (
                    self._failed_at_start and failed is not None and failed.error_type == type_name(exc)):
                # the live run's code took this input: today's code does not fit it
                self._divergence = NondeterminismError(
                    "(input)", f"the input {clipped(self.replayer.started.input)}", f"a signature it does not fit ({exc})",
                    str(exc))
            else:
                self._fail(exc, "")  # (the debugger: the live run failed the same way, at its input)
            return False
        ctx = contextvars.copy_context()
        # log lines of workflow code carry the run id (structlog's contextvars)
        ctx.run(structlog.contextvars.bind_contextvars, run_id=self.run_id)
        self._loop.advance(self.replayer.started_at)
        self._root = self._loop.start(self._workflow(kwargs), Binding(self, Scope()), ctx)
        return True

    async def _workflow(self, kwargs: dict[str, Any]) -> Any:
        return await self.definition.fn(WorkflowContext(self), **kwargs)

    async def _drive(self) -> Outcome | None:
        """Run workflow code and the history to the run's next transition (None: the debugger's replay ended)."""
        loop = self._loop
        root = self._root
        assert root is not None
        passes = 0
        while True:
            passes += 1
            if loop.busy:
                # invariant: after each pass that workflow code left still running (polling with sleep(0)), the
                # worker's process idles for _BUSY_PAUSE: its other runs, bodies, lease renewals, a stop request
                # and the threads a store or a plain def body runs in go on meanwhile. Yielding to the loop alone
                # is not enough: a thread needs the GIL, which a process that never idles hands over only every
                # few milliseconds, once per statement of a SQLite read, say (seconds for one history)
                await asyncio.sleep(_BUSY_PAUSE)
            elif passes % _YIELD_EVERY == 0:
                # (and it lets the worker's loop run at least every _YIELD_EVERY passes)
                await asyncio.sleep(0)
            loop.run_ready()
            if self._unstarted:
                if not root.done() and self._divergence is None:  # the workflow did not return in that pass
                    self._divergence = self.replayer.added(
                        *self._unstarted[0], "the run's completion, with no such call before it")
                self._unstarted.clear()
            if self._divergence is not None:
                return await self._finish_diverged()
            if self._lost is not None:
                raise _Stop()
            if self._resolutions:
                self._deliver_next()
                continue
            if self._replaying:
                if self._replay_next():
                    self._deliver_committed()
                    continue
                if loop.has_ready:  # still running (a busy loop): not idle, so not stuck
                    continue
                self._divergence = self._stuck()
                continue
            if self._live is None:
                return None  # the debugger stops where the history ends
            if self._finished:
                self._collect_finished()
            if self._outbox or self._flush or len(self._buffer) >= _BUFFER_LIMIT:
                await self._commit()
            if self._resolutions:
                self._deliver_next()
                continue
            if self._failure is None:
                self._advance(settling=root.done())
            if self._starts:
                await self._launch()
                continue
            if self._inbox_due is not None and self._inbox_due <= self.store_time():
                await self._read_inbox()
                continue
            if self._resolutions or self._outbox or (loop.has_ready and not root.done()):
                continue  # (once the workflow returned, tasks it left running do not hold the run: see below)
            if self._bodies:
                if holds_deadline(self._buffer):  # committed before bodies are waited for (see holds_deadline)
                    await self._commit()
                else:  # (once the run fails, no timer fires: its bodies are waited for, not the next due time)
                    await self._wait(None if self._failure is not None else self._next_due())
                continue
            if self._failure is not None:
                return await self._finish_failed(self._failure)
            if root.done():
                # invariant: a run finishes only once every effect that started has its outcome
                unsettled = self._unsettled()
                if not unsettled:
                    return await self._finish_root(root)
                return await self._suspend(unsettled)
            return await self._suspend([c for c in self._open if self._pending(c)])

    # -- handing outcomes to workflow code ----------------------------------------------------

    def _deliver_next(self) -> None:
        call, value, error, at = self._resolutions.popleft()
        if call.future.done():
            return
        self._loop.advance(at)
        if error is not None:
            if isinstance(error, (StepFailedError, EffectFailedError)):
                self._failed_at[call.key] = self._made
            call.future.set_exception(error)
        else:
            call.future.set_result(value)

    # -- commits -------------------------------------------------------------------------------------

    async def _commit(self, transition: Transition = Continue()) -> None:
        """Commit the buffer and the outbox; run the outbox's actions after. Raises _Stop on failure."""
        live = self._live
        assert live is not None
        buffered, outbox, consumed = len(self._buffer), list(self._outbox), list(self._consumed)
        self._flush = False  # what this commit takes (a cancellation buffered meanwhile sets it again)
        events = self._buffer[:buffered] + [event for batch, _ in outbox for event in batch]
        try:
            rows = [EventRow.of(event) for event in events]
        except SerializationError as exc:
            raise _Unrecordable(exc) from None
        give_up: float | None = None
        while True:
            try:
                result = await live.store.commit(live.lease, self.revision, rows, transition, consumed)
                break
            except LeaseLostError as exc:
                self._lose(str(exc))
                raise _Stop() from None
            except StoreUnavailableError as exc:
                # the store could not be reached for its whole retry budget: the commit may or may not have
                # landed, and resending it is safe (a store recognises its own write), for as long as the lease
                # held when it first failed (renewals that go through meanwhile do not make a commit that keeps
                # failing hold the run for ever)
                if give_up is None:
                    give_up = live.lease.until
                if self.store_time() + _RESEND_PAUSE >= give_up:
                    self.log.warning("commit_failed", error=describe(exc))
                    self._store_error = exc
                    raise _Stop() from None
                self.log.warning("commit_resent", error=describe(exc))
                await asyncio.sleep(_RESEND_PAUSE)
            except StoreError as exc:
                self.log.warning("commit_failed", error=describe(exc))
                self._store_error = exc
                raise _Stop() from None
        self.revision = result.revision
        # invariant: exactly what was committed leaves the buffers; anything added meanwhile stays for the next
        del self._buffer[:buffered]
        del self._outbox[: len(outbox)]
        del self._consumed[: len(consumed)]
        for _, action in outbox:
            action(result.at)

    def _abort(self, exc: StoreError) -> None:
        """Stop this execution for a store error met outside a commit; nothing more is written."""
        self.log.warning("store_failed", error=describe(exc))
        self._store_error = exc
        self._lose(f"store error: {exc}")

    def _lose(self, detail: str) -> None:
        if self._lost is None:
            detail = self._lost = self._held_up(detail)
            self.log.warning("lease_lost", detail=detail)
            self._wake_up()
            self._stop_alone()

    # -- endings -------------------------------------------------------------------------------------

    async def _finish_root(self, root: asyncio.Task[Any]) -> Outcome:
        if root.cancelled():
            return await self._finish_failed((WORKFLOW_CANCELLED, None, ""))
        exc = root.exception()
        if exc is not None:
            return await self._finish_failed((f"{WORKFLOW_RAISED}{describe(exc)}", exc, failed_call(exc)))
        try:
            plain, output = record(root.result(), self.definition.spec.returns.get(), what=self._result_what())
        except SerializationError as err:
            return await self._finish_failed((str(err), err, ""))
        self._buffer.append(RunCompleted(output=plain))
        await self._commit(Finish(RunStatus.COMPLETED))
        self.log.info("run_completed", revision=self.revision)
        return Completed(self.run_id, self.checkpoint_id, output, self.revision)

    async def _finish_failed(self, failure: tuple[str, BaseException | None, str] | None) -> Outcome:
        assert failure is not None
        reason, exc, key = failure
        doubtful = self._park_in_doubt(reason)
        if doubtful:  # (parked, not failed: see _park_in_doubt)
            return await self._suspend(doubtful)
        reason = recordable(reason)
        error_type = "" if exc is None else type_name(exc)
        tb = "" if exc is None or exc.__traceback__ is None else traceback_of(exc)
        # invariant: a retry gives the failed call another attempt only if workflow code made no call after its
        # failure reached it (a replay in which that call succeeds would not make those calls again), nor any other
        # call while handling the exception that failed the run, or one of its chain (see _handling)
        handled = key in self._failed_at and self._failed_at[key] != self._made or self._loop.handled.led_to(exc, key)
        self._buffer.append(RunFailed(key=key, reason=reason, error_type=error_type, traceback=tb, handled=handled))
        await self._commit(Finish(RunStatus.FAILED, reason))
        self.log.error("run_failed", reason=reason, error_type=error_type, revision=self.revision)
        return FailedOutcome(self.run_id, self.checkpoint_id, reason)

    async def _finish_diverged(self) -> Outcome:
        divergence = self._divergence
        assert divergence is not None
        if self._live is None:
            return FailedOutcome(self.run_id, self.checkpoint_id, str(divergence), run_failed=False)
        # invariant: nothing is appended to a history the code no longer matches
        self._buffer.clear()
        self._outbox.clear()
        self._consumed.clear()
        at = self.store_time() + DIVERGED_RETRY_SECONDS
        await self._commit(Suspend(RunStatus.DIVERGED, wake_at=at, reason=str(divergence)))
        self.log.error("nondeterminism", key=divergence.key, reason=str(divergence))
        return FailedOutcome(self.run_id, self.checkpoint_id, str(divergence), run_failed=False)

    async def _suspend(self, pending: list[Call]) -> Outcome:
        """Workflow code is idle and nothing is due: commit the transition its ``pending`` calls imply."""
        if not pending:
            return await self._finish_failed((
                f"{WORKFLOW_BLOCKED} (an Event or a future "
                "nothing in workflow code will set, or one a thread of its own would set: threads are not "
                "recorded, so that work belongs in a step); it can never continue", None, ""))
        dues = [c.due for c in pending if c.due is not None and c.parked is None]
        deadline = self._deadline()
        if deadline is not None and not self._parked() and (
                dues or any(c.kind in (CallKind.SIGNAL, CallKind.TIMER) for c in pending)):
            dues.append(deadline)  # a run waiting past its elapsed budget is woken to fail (one parked waits for its operator)
        wake_at = min(dues) if dues else None
        signals = tuple(sorted({c.name for c in pending if c.kind is CallKind.SIGNAL}))
        waits = [c for c in pending if c.kind in (CallKind.TIMER, CallKind.SIGNAL)]
        parked = [c for c in pending if c.parked is not None]
        reason = "; ".join(why(c) for c in pending)
        if waits:
            await self._commit(Suspend(RunStatus.WAITING, wake_at, signals, reason))
            kind = SuspendReason.SIGNAL if signals else SuspendReason.TIMER
            self.log.info("run_suspended", reason=str(kind), until=wake_at, signals=signals)
            return Suspended(self.run_id, self.checkpoint_id, kind, wake_at, signals, reason)
        if wake_at is not None:
            retry = min((c for c in pending if c.due is not None and c.parked is None), key=lambda c: c.due or 0.0)
            await self._commit(Reschedule(wake_at, reason))
            return Retried(self.run_id, self.checkpoint_id, retry.key, retry.attempt, wake_at, retry.error)
        await self._commit(Suspend(RunStatus.PARKED, reason=reason))
        assert parked
        return Suspended(self.run_id, self.checkpoint_id, SuspendReason.AMBIGUOUS, None, (), reason)

    # -- waiting, renewal, teardown ----------------------------------------------------------------

    def _next_due(self) -> float | None:
        dues = [c.due for c in self._open
                if c.due is not None and not c.busy and c.parked is None and self._pending(c)]
        if self._inbox_due is not None:
            dues.append(self._inbox_due)
        return min(dues) if dues else None

    def _wake_up(self) -> None:
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, until: float | None) -> None:
        """Wait for a body, the lease, or ``until`` (store clock)."""
        if self._woken:
            self._woken = False
            return
        waiter = self._waiter = self._outer.create_future()
        timer = None if until is None else self._outer.call_later(
            max(0.0, until - self.store_time()), _settle, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            self._woken = False
            if timer is not None:
                timer.cancel()

    async def _halt_bodies(self) -> None:
        self._closing = True
        bodies = list(self._bodies)
        for task in bodies:
            task.cancel(HALT)  # a plain def body lets its thread go (see _call)
        if bodies:
            await asyncio.wait(bodies, timeout=_BODY_GRACE)

    def _teardown(self) -> None:
        """Unwind workflow code after the run's last commit; a durable call made meanwhile cancels its task."""
        self._closing = True
        loop = getattr(self, "_loop", None)
        if loop is None:
            return
        for task in list(loop.tasks):
            task.cancel()
        # bounded: a task that swallows every cancellation is left behind
        loop.run_ready(limit=_TEARDOWN_TURNS * (1 + len(loop.tasks)))
        if loop.close(self.log) and self._live is not None:
            self._shed()

    def _shed(self) -> None:
        """Drop what this finished execution holds (its history, its calls): a task left behind keeps it."""
        replayer = self.replayer
        self.replayer = Replayer([Entry(0, replayer.started_at, replayer.started)])
        for held in (self._calls, self._open, self._inbox, self._buffer, self._outbox, self._consumed,
                     self._resolutions, self._finished, self._starts, self._bodies, self._recorded_result,
                     self._failed_at, self.child_ends):
            held.clear()


#: how many callbacks per task workflow code gets to unwind after the run's last commit
_TEARDOWN_TURNS = 100
#: the driver lets the worker's loop run at least every this many passes
_YIELD_EVERY = 64
#: how long the process idles after a pass of workflow code that never went idle (see _drive)
_BUSY_PAUSE = 0.001
#: buffered events (fired timers, values drawn, ...) committed once this many wait, with no outcome to go with
_BUFFER_LIMIT = 1000


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
