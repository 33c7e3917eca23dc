"""The live half of the driver: how open calls progress once the history is replayed.

Bodies (steps, effects, reconcile functions) run as tasks of the worker's
loop; what they return becomes events in the outbox (committed before workflow
code sees the outcome) or in the buffer (recorded with the next commit). See
:mod:`runifold.worker._execution` for the whole picture.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, assert_never

import msgspec

from runifold._log import context_var
from runifold.dsl import Evidence, ResumePolicy, WorkflowDefinition
from runifold.dsl._decorators import EffectOutcomeUnknown
from runifold.dsl._definition import EffectSpec, RetryPolicy, StepSpec
from runifold.errors import (
    BudgetExceededError,
    CapabilityDeniedError,
    ConfigurationError,
    EffectFailedError,
    OutsideWorkflowError,
    RunifoldError,
    SerializationError,
    StepFailedError,
    StoreError,
    WaitTimeoutError,
    describe,
    traceback_of,
    type_name,
)
from runifold.history import (
    AnyEvent,
    CallCancelled,
    CallKind,
    ChildStarted,
    EffectAmbiguous,
    EffectCompleted,
    EffectFailed,
    EffectReconciled,
    EffectStarted,
    EffectUnknown,
    Replayer,
    SignalReceived,
    SignalTimedOut,
    StepCompleted,
    StepFailed,
    TimerFired,
    Verdict,
    accept,
    convert,
    not_applied,
    record,
    to_plain,
)
from runifold.stores import EnqueueResult, InboxSignal, WorkflowTask
from runifold.worker._bodies import body_outcome, is_async, run_body
from runifold.worker._call import Call, Live, Usage, child_start_under_way
from runifold.worker._loop import WorkflowLoop

#: the call key on log lines of a body (structlog's context-local field ``key``)
_KEY = context_var("key")
_UNKNOWN_OUTCOME = (TimeoutError, ConnectionError, EffectOutcomeUnknown)
#: a body that raises one of these misused runifold: another attempt would raise the same, so it is not retried
_MISUSE = (ConfigurationError, OutsideWorkflowError)
#: while a signal wait is open, a live execution reads its run's inbox at least this often (seconds)
INBOX_EVERY = 1.0


class _Start(NamedTuple):
    """A body (or a reconcile function) to start for a call."""

    call: Call
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    timeout: float | None
    what: str  # "body" or "reconcile"


class LiveProgress:
    """Starts due bodies, fires timers, consumes signals, and turns outcomes into events."""

    # shared with Execution, which sets them up
    definition: WorkflowDefinition
    run_id: str
    replayer: Replayer
    usage: Usage
    log: Any
    _live: Live | None
    _outer: asyncio.AbstractEventLoop
    _open: list[Call]
    _inbox: list[InboxSignal]
    _buffer: list[AnyEvent]
    _consumed: list[str]
    _outbox: list[tuple[list[AnyEvent], Callable[[float], None]]]  # events, and what follows their commit
    _resolutions: deque[tuple[Call, Any, BaseException | None, float]]
    _bodies: set[asyncio.Task[Any]]
    _starts: list[_Start]
    _finished: list[tuple[Call, Any, BaseException | None, str]]  # call, value, exception, "body" or "reconcile"
    _loop: WorkflowLoop
    _failure: tuple[str, BaseException | None, str] | None
    _closing: bool
    _lost: str | None  # why the lease was lost, once it was
    _replaying: bool
    _flush: bool  # commit the buffer at the next pass, outcome or not
    _made: int  # calls workflow code has made, cancellations included (see Execution)
    _inbox_read: float  # the store's clock when the run's inbox was last read (the claim read it)
    _inbox_due: float | None  # when to read it next, while a signal wait is open (see _wait_end)
    #: the driver's task while it awaits a body itself (see _launch): what stops the body when the lease is lost
    _alone: asyncio.Task[Any] | None = None

    def store_time(self) -> float:
        raise NotImplementedError

    def _wake_up(self) -> None:
        raise NotImplementedError

    def _next_due(self) -> float | None:
        raise NotImplementedError

    async def _hold_lease(self) -> bool:
        raise NotImplementedError

    @staticmethod
    def _payload(call: Call, payload: Any) -> tuple[Any, BaseException | None]:
        """A signal's payload as the wait's type; one that does not fit is the workflow's error, live and replayed.

        Workflow code gets a copy, read back from the payload's JSON as a replay reads it: its ``signal_received``
        event holds the payload as it came, and is committed after workflow code has run on (it may change what
        it was given, which must not change what is recorded)."""
        try:
            what = f"the payload of signal {call.name!r} ({call.key})"
            return convert(to_plain(payload, what=what), call.returns, what=what,
                           advice="the sender must send a payload of that type", strict=True), None
        except SerializationError as exc:
            return None, exc

    def _resolve(self, call: Call, at: float, value: Any = None, error: BaseException | None = None) -> None:
        """Queue an outcome; the driver hands them over one at a time, in the order queued.

        ``at``: when it happened on the store's clock, as history records it (a commit's time; when a timer fired,
        a wait took its signal or timed out): workflow code's clock (``loop.time()``) moves to it when the outcome
        is handed over, live and replayed alike."""
        self._resolutions.append((call, value, error, at))

    def _abandon(self, call: Call) -> None:
        """Workflow code stopped waiting for a call (it cancelled it) before its outcome was known.

        ``call_cancelled`` is recorded before the cancelled task runs on, so the scope's next call comes
        after it in the log, as in the code, and the call's outcome is never recorded: a step's body is
        cancelled, a timer never fires, a signal wait consumes nothing. An effect that has started runs on
        and its outcome is recorded (it may have touched the world already); one that never started is cancelled
        like a step; so is a child's start (one under way runs on). The debugger (and a teardown) records nothing.

        A call the replay cancels is recorded too when history holds no end of it: the worker that cancelled it
        live stopped (a crash) before committing its record, and a completed run's history must hold every call
        its code made. One whose end history holds (its outcome, or its ``call_cancelled``) is no open call.
        """
        if self._closing:
            return
        self._made += 1  # a cancellation is a call of workflow code, on replay too
        if self._live is None or call.cancelled:
            return
        if call not in self._open and not call.busy:
            return  # its outcome is recorded already, or it never progressed live
        if call.kind is CallKind.CHILD and call.busy:  # committed at once: a crash after it finds the start under way
            self._buffer.append(CallCancelled(key=call.key, kind=call.kind.value, attempt=call.attempt, ran=True))
            self._flush = True
            self.log.info("call_cancelled", key=call.key, attempt=call.attempt)
            return
        if self._runs_on(call):
            return  # started in some attempt: it runs to its outcome (see _runs_on)
        if call in self._open:
            self._open.remove(call)
        call.cancelled = True
        if call.body is not None:
            call.body.cancel()
        if call.busy and not call.began and call.kind is CallKind.STEP:
            self.usage.steps -= 1  # queued or launched, its body never began: no execution (see _start_step)
        ran = call.busy and call.began
        self._buffer.append(CallCancelled(key=call.key, kind=call.kind.value, attempt=call.attempt, ran=ran))
        # a body that ran and was stopped: its end is committed at once (with what workflow code records after
        # it), so a crash does not run the body again as if it had been in flight
        self._flush = self._flush or ran
        self.log.info("call_cancelled", key=call.key, attempt=call.attempt)

    def _runs_on(self, call: Call) -> bool:
        """An effect that started in some attempt, or a child's start under way (the child may exist): it is
        driven to its outcome whether or not workflow code still waits for it (it may have touched the world).

        That holds across crashes: an attempt left in doubt is recovered by the effect's resume policy, a
        retry runs when due, and one parked waits for its operator, before the run may finish.
        """
        if call.kind is CallKind.CHILD:
            return call.busy or child_start_under_way(self.replayer.events(call.key))
        return call.kind is CallKind.EFFECT and (call.busy or call.attempt > 1 or call.in_doubt
                                                 or call.parked is not None or self.replayer.is_recorded(call.key))

    def _pending(self, call: Call) -> bool:
        """The call still has to progress: workflow code waits for it, or it runs on (see :meth:`_runs_on`)."""
        return not call.future.done() or self._runs_on(call)

    def _unsettled(self) -> list[Call]:
        """Open calls that workflow code no longer waits for but that run on (see :meth:`_runs_on`)."""
        return [c for c in self._open if c.future.done() and self._runs_on(c)]

    # -- live progress --------------------------------------------------------------------------

    def _advance(self, *, settling: bool = False) -> None:
        """Start what is due among the open calls: bodies, timers, signals, retries.

        ``settling``: workflow code has finished; only the calls that run on (effects that started) progress.

        Of the waits that can end (a timer due, a signal that came, a wait's deadline passed), only the one that
        ended first on the store's clock ends now: workflow code sees it before the next is judged, as it would
        have from a worker that was on time (a timeout that fires may cancel a wait whose signal came later).
        """
        now = self.store_time()
        first: tuple[float, int, Call, InboxSignal | None] | None = None
        self._inbox_due = None
        for order, call in enumerate(list(self._open)):
            if not self._pending(call):
                # nobody waits for it any more. A call whose awaiting task was cancelled stays until that task
                # runs on and abandons it (see _abandon), which records its cancellation where the code made it:
                # the task may still be queued behind others (run_ready's limit)
                if not call.future.cancelled():
                    self._open.remove(call)
                continue
            if settling and not self._runs_on(call):
                continue
            if call.busy or call.parked is not None:
                continue
            due = call.due is None or call.due <= now
            match call.kind:
                case CallKind.STEP:
                    if due:
                        self._start_step(call)
                case CallKind.EFFECT:
                    if due:
                        self._start_effect(call)
                case CallKind.TIMER | CallKind.SIGNAL:
                    ended = self._wait_end(call, now, order)
                    if ended is not None and (first is None or ended[:2] < first[:2]):
                        first = ended
                case CallKind.CHILD:
                    self._spawn(call, self._enqueue_child, call.args, {}, None, "body")
                case CallKind.VALUE | CallKind.CHARGE:
                    raise AssertionError("values and charges are never open")
                case _ as unreachable:
                    assert_never(unreachable)
            if self._failure is not None:
                return
        if self._inbox_due is not None and self._inbox_due <= now:
            return  # no wait ends before the inbox is read: a signal that came may have ended one first
        if first is not None:
            self._end_wait(first[2], first[3], now)
            return
        out_of_time = None if settling else self._out_of_time(now, at=True)
        if out_of_time is not None and not self._parked():
            # the run's elapsed budget ran out while it waited: a wait, or a retry's backoff, still open can no
            # longer end in time (a run with an ambiguous effect waits for its operator instead: failing it would
            # strand the effect; so an effect waiting to try again after an unknown outcome is parked for one, as
            # _allowed parks it when a late worker finds its attempt due; one whose last attempt failed took no
            # place, and fails the run like a step's retry. A run whose code has finished waits only for effects)
            for call in self._open:
                if call.kind is CallKind.EFFECT and call.due and not call.busy and call.unknown:
                    self._park(call, f"outcome unknown after {call.attempt - 1} attempt(s), and the run's elapsed "
                                     f"budget ran out while it waited for attempt {call.attempt} ({out_of_time})")
            if self._parked():
                return
            for call in self._open:
                if call.future.done() or call.busy:
                    continue
                if call.kind in (CallKind.TIMER, CallKind.SIGNAL) or (
                        call.kind in (CallKind.STEP, CallKind.EFFECT) and call.due):
                    self._fail(out_of_time, call.key)
                    return

    def _deadline(self) -> float | None:
        """When the run's elapsed budget runs out (store clock), if it has one."""
        budget = self.definition.budget.max_elapsed
        return None if budget is None else self.replayer.started_at + budget.total_seconds()

    def _out_of_time(self, now: float, *, at: bool) -> BudgetExceededError | None:
        """The error when the run's elapsed budget has run out by ``now`` (``at``: reaching it counts)."""
        budget = self.definition.budget.max_elapsed
        if budget is None:
            return None
        deadline = self._deadline()
        if deadline is None or now < deadline or (now == deadline and not at):
            return None
        return BudgetExceededError.elapsed(now - self.replayer.started_at, budget.total_seconds())

    def _parked(self) -> bool:
        """An open call waits for an operator (an ambiguous effect)."""
        return any(c.parked is not None for c in self._open)

    def _wait_end(self, call: Call, now: float, order: int) -> tuple[float, int, Call, InboxSignal | None] | None:
        """When a timer or signal wait ended by the store's clock, if it has: ``(at, order, call, signal)``, the
        signal it takes (None: a timer fired, or a wait's deadline passed)."""
        if call.kind is CallKind.TIMER:
            if call.due is None or call.due > now:
                return None
            if self._inbox_read < call.due and any(c.kind is CallKind.SIGNAL and self._pending(c) for c in self._open):
                # invariant: a timer racing a signal wait (asyncio.timeout or wait_for around wait_signal, a
                # reminder sleep beside it) fires only once the inbox was read at or after its due time: a signal
                # the store received before it ends that wait first, however late this worker looks
                self._inbox_due = call.due if self._inbox_due is None else min(self._inbox_due, call.due)
            return call.due, order, call, None
        # invariant: a signal counts for a wait only if it arrived by the wait's deadline (store clock), however
        # late this worker looks, and within the run's elapsed budget; the same inputs take the same branch on
        # every worker
        deadline = self._deadline()
        for signal in self._inbox:
            if (signal.name == call.name and (call.due is None or signal.received_at <= call.due)
                    and (deadline is None or signal.received_at <= deadline)):
                return signal.received_at, order, call, signal
        # invariant: while a signal wait is open the inbox is read again at least every INBOX_EVERY seconds (a
        # signal sent while the run executes is seen), and a wait's deadline (its own, or the run's elapsed
        # budget's) is judged only by a read made at or after it, so a signal the store received in time is
        # never judged late
        read, due = self._inbox_read, self._inbox_read + INBOX_EVERY
        for end in (call.due, deadline):
            if end is not None and read < end:
                due = min(due, end)
        self._inbox_due = due if self._inbox_due is None else min(self._inbox_due, due)
        if call.due is not None and now >= call.due and read >= call.due:
            return call.due, order, call, None
        return None

    async def _read_inbox(self) -> None:
        """Read the run's inbox from the store: the signals that arrived since the claim (or the last read)."""
        live = self._live
        assert live is not None
        read_at = self.store_time()
        try:
            signals = await live.store.inbox(self.run_id)
        except StoreError as exc:
            self._abort(exc)
            return
        known = {s.signal_id for s in self._inbox}.union(self._consumed)  # consumed: not committed yet
        self._inbox = sorted([*self._inbox, *(s for s in signals if s.signal_id not in known)],
                             key=lambda s: s.received_at)
        self._inbox_read = read_at
        self._inbox_due = None

    def _end_wait(self, call: Call, signal: InboxSignal | None, now: float) -> None:
        """A timer fires, or a signal wait takes ``signal`` or times out; workflow code's clock reads ``now``, which
        its event records."""
        self._open.remove(call)
        if call.kind is CallKind.TIMER:
            self._buffer.append(TimerFired(key=call.key, fired_at=now))
            self._resolve(call, now)
        elif signal is None:
            self._buffer.append(SignalTimedOut(key=call.key, name=call.name, timed_out_at=now))
            self._resolve(call, now, error=WaitTimeoutError(call.key, call.name))
        else:
            self._inbox.remove(signal)
            self._consumed.append(signal.signal_id)
            self._buffer.append(SignalReceived(
                key=call.key, name=call.name, payload=signal.payload, signal_id=signal.signal_id,
                sender=signal.sender, reason=signal.reason, received_at=signal.received_at, consumed_at=now,
            ))
            self.log.info("signal_consumed", key=call.key, signal_id=signal.signal_id, sender=signal.sender)
            value, error = self._payload(call, signal.payload)
            self._resolve(call, now, value, error)

    def _allowed(self, call: Call, kind: CallKind, requires: str | None) -> bool:
        """Checks before a body runs: capability and budget. A refusal fails the run."""
        key = call.key
        if requires is not None and not self.definition.capabilities.allows(requires):
            self._fail(CapabilityDeniedError(key, requires), key)
            return False
        budget = self.definition.budget
        refusal = self._out_of_time(self.store_time(), at=False)
        if refusal is None and kind is CallKind.STEP and budget.max_steps is not None \
                and self.usage.steps + 1 > budget.max_steps:
            refusal = BudgetExceededError("steps", self.usage.steps + 1, budget.max_steps)
        if refusal is None and kind is CallKind.EFFECT and self._effect_attempts_spent():
            assert budget.max_effect_attempts is not None
            refusal = BudgetExceededError("effect attempts", self.usage.effect_attempts + 1, budget.max_effect_attempts)
        if refusal is None:
            return True
        if call.unknown:
            # invariant: an effect whose outcome is unknown is parked, never failed: the budget refuses the next
            # attempt, and an operator decides whether the last one took place (as when the retry budget is spent)
            self._park(call, f"outcome unknown after {call.attempt - 1} attempt(s), and the run's budget allows no "
                             f"more: {refusal}")
            return False
        self._fail(refusal, key)
        return False

    def _effect_attempts_spent(self) -> bool:
        """The run's budget allows no more effect attempts."""
        limit = self.definition.budget.max_effect_attempts
        return limit is not None and self.usage.effect_attempts + 1 > limit

    def _check_recoveries(self) -> None:
        assert self._live is not None
        limit = self.definition.budget.max_recoveries
        if limit is not None and self._live.recoveries > limit:
            self._fail(BudgetExceededError("recoveries", self._live.recoveries, limit), "")

    def _start_step(self, call: Call) -> None:
        spec = call.spec
        assert isinstance(spec, StepSpec)
        if not self._allowed(call, CallKind.STEP, spec.requires):
            return
        self.usage.steps += 1
        timeout = None if spec.timeout is None else spec.timeout.total_seconds()
        self._spawn(call, spec.fn, call.args, call.kwargs, timeout, "body")

    def _start_effect(self, call: Call) -> None:
        spec = call.spec
        assert isinstance(spec, EffectSpec)
        if call.in_doubt:
            self._recover_effect(call, spec)
            return
        if not self._allowed(call, CallKind.EFFECT, spec.requires):
            return
        call.unknown = False
        self.usage.effect_attempts += 1
        idem = self._idempotency_key(call)
        timeout = None if spec.timeout is None else spec.timeout.total_seconds()
        call.busy = True
        # invariant: effect_started is durable before the body can touch the outside world
        self._outbox.append((
            [EffectStarted(key=call.key, idempotency_key=idem, attempt=call.attempt)],
            lambda at: self._spawn(call, spec.fn, (idem, *call.args), call.kwargs, timeout, "body"),
        ))

    def _idempotency_key(self, call: Call) -> str:
        return f"{self.run_id}:{call.key}"

    def _recover_effect(self, call: Call, spec: EffectSpec) -> None:
        """Apply the effect's resume policy to an attempt whose outcome nobody knows."""
        match spec.resume:
            case ResumePolicy.REPEAT:
                if call.attempt >= spec.retry.max_attempts:
                    self._park(call, f"outcome unknown after {call.attempt} attempt(s) with policy REPEAT")
                    return
                if self._effect_attempts_spent():
                    # unknown, so not failed: an operator decides, as when the retry budget is spent
                    self._park(call, f"outcome unknown after {call.attempt} attempt(s), and the run's effect-attempt "
                                     f"budget ({self.definition.budget.max_effect_attempts}) is spent")
                    return
                # (the attempt a crash cut short has an unknown outcome: a budget that refuses the next one parks it)
                call.in_doubt, call.attempt, call.unknown = False, call.attempt + 1, True
                self._start_effect(call)
            case ResumePolicy.MANUAL:
                self._park(call, "outcome unknown and the resume policy is MANUAL")
            case ResumePolicy.RECONCILE:
                assert spec.reconcile is not None
                self._spawn(call, spec.reconcile, (self._idempotency_key(call), *call.args), call.kwargs, None, "reconcile")
            case _ as unreachable:
                assert_never(unreachable)

    def _park_in_doubt(self, failing: str) -> list[Call]:
        """Park every effect whose outcome is unknown, as the run is about to fail for ``failing``; return every
        effect parked, these and those parked already.

        invariant: a run never fails while an effect's outcome is unknown (whatever fails it: a sibling's budget
        or failure, the recovery budget, a capability a deploy withdrew): the effect is parked, or stays parked,
        and once an operator settles it the run fails again, unless what failed it changed.
        """
        doubtful = [c for c in self._open if c.kind is CallKind.EFFECT and c.parked is None and not c.busy
                    and not c.future.done() and (c.in_doubt or c.unknown)]
        for call in doubtful:
            self._park(call, f"its outcome is unknown and the run cannot go on ({failing}): settle it")
        return [c for c in self._open if c.kind is CallKind.EFFECT and c.parked is not None]

    def _unpark_unwritten(self) -> None:
        """The buffer is dropped unwritten: an effect parked in it is in doubt again, so the run's failure parks it
        anew with an ``effect_ambiguous`` that is written. Parked in memory only, it left the run parked with
        nothing an operator could resolve (helper-80)."""
        unwritten = {e.key for e in self._buffer if isinstance(e, EffectAmbiguous)}
        for call in self._open:
            if call.parked is not None and call.key in unwritten:
                call.parked, call.in_doubt = None, True

    def _park(self, call: Call, reason: str, events: Sequence[AnyEvent] = ()) -> None:
        self.log.warning("effect_ambiguous", key=call.key, reason=reason)
        self._record_effect(*events, EffectAmbiguous(key=call.key, reason=reason))
        call.parked, call.in_doubt = reason, False

    def _record_effect(self, *events: AnyEvent) -> None:
        """Record what became known of an effect's outcome (a failure, an unknown outcome, a verdict, that it is
        ambiguous): committed at once, not with the run's next outcome. An operator sees an ambiguous effect to
        resolve while a sibling's body still runs, and a crash meanwhile does not lose what was learnt (a REPEAT's
        backoff, a reconcile's verdict)."""
        self._buffer.extend(events)
        self._flush = True

    # -- bodies ---------------------------------------------------------------------------------

    def _spawn(self, call: Call, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               timeout: float | None, what: str) -> None:
        """Queue a body (or a reconcile) to start; the driver launches what is queued (see :meth:`_launch`)."""
        call.busy = True
        self._starts.append(_Start(call, fn, args, kwargs, timeout, what))

    async def _launch(self) -> None:
        """Start the queued bodies.

        An async body that is the only thing this run could do meanwhile (no other body in flight, nothing with
        a due time, no outcome yet to be committed or handed over, no workflow task ready) runs right here,
        in the driver's task:
        nothing else could progress while it runs, and the hand-off to a task of its own and back
        would cost loop passes that hold up this run's next commit. Others run as tasks.
        """
        starts, self._starts = [s for s in self._starts if not s.call.cancelled], []
        # invariant: an outcome waiting to be committed or handed over (a timer that fired beside this start,
        # say) means workflow code has more to do meanwhile, so the body must not hold the driver
        loop = self._loop
        # (a plain def body always runs as a task: cancelled, it waits for its thread, which a stopping worker's
        # cancellation of the driver must not)
        alone = (len(starts) == 1 and is_async(starts[0].fn) and not self._bodies and not self._resolutions
                 and not self._outbox and not loop.has_ready)
        if alone and self._next_due() is None:
            start = starts[0]
            if not await self._hold_lease():
                return  # the lease is lost: the body does not start, and the driver stops
            value: Any = None
            exc: BaseException | None = None
            # this task is the run's own (the run id is bound on it already): bind the key, and unbind after
            bound = _KEY.set(start.call.key)
            self._alone = task = asyncio.current_task()
            start.call.began = True
            try:
                value = await run_body(start.fn, start.args, start.kwargs, start.timeout)
            except asyncio.CancelledError as err:
                if task is not None and task.cancelling():
                    if self._lost is None or task.uncancel() > 0:
                        raise  # the worker itself is being cancelled
                    return  # the lease was lost (see _stop_alone): the body's outcome is dropped, the driver stops
                exc = err  # the body raised CancelledError itself: a failure like any other
            except Exception as err:
                exc = err
            finally:
                self._alone = None
                _KEY.reset(bound)
            self._finished.append((start.call, *body_outcome(value, exc), start.what))
            return
        for start in starts:
            # invariant: bodies run without a binding: steps they call run plainly, ctx calls refuse
            ctx = contextvars.copy_context()
            ctx.run(_KEY.set, start.call.key)
            task = self._outer.create_task(self._started(start), context=ctx)
            start.call.body = task
            self._bodies.add(task)
            task.add_done_callback(functools.partial(self._body_done, start))

    async def _started(self, start: _Start) -> Any:
        """Run ``start``'s body once this worker is sure it still holds the lease (see ``_hold_lease``).

        Checked here, as the body starts, not when it is launched: a body's task starts on a later pass of the
        worker's loop, which a body started before it may hold up past the lease.

        Raises:
            _NotStarted: the lease is lost; the body did not start.
        """
        if not await self._hold_lease():
            raise _NotStarted()
        start.call.began = True
        return await run_body(start.fn, start.args, start.kwargs, start.timeout)

    def _stop_alone(self) -> None:
        """The lease is lost: stop the body the driver awaits itself, as bodies running as tasks are stopped."""
        if self._alone is not None:
            self._alone.cancel()

    def _body_done(self, start: _Start, task: asyncio.Task[Any]) -> None:
        self._bodies.discard(task)
        value: Any = None
        exc: BaseException | None
        if task.cancelled():
            # a body that raised CancelledError itself (nobody cancelled it) failed like any other
            exc = asyncio.CancelledError("the body raised CancelledError")
        else:
            exc = task.exception()  # retrieved here: an execution that stops before collecting it records nothing
            if isinstance(exc, _NotStarted):
                return  # the lease is lost, and the driver stops: nothing of it is recorded
            if exc is None:
                value, exc = body_outcome(task.result(), None)
        if not self._closing:
            self._finished.append((start.call, value, exc, start.what))
            self._wake_up()

    def _collect_finished(self) -> None:
        finished, self._finished = self._finished, []
        for call, value, exc, what in finished:
            call.busy, call.body, call.began = False, None, False
            if call.cancelled:
                continue  # workflow code stopped waiting for it: call_cancelled is its record
            if what == "reconcile":
                self._reconciled(call, value, exc)
            elif call.kind is CallKind.STEP:
                self._step_finished(call, value, exc)
            elif call.kind is CallKind.CHILD:
                self._child_started(call, value, exc)
            else:
                self._effect_finished(call, value, exc)

    async def _enqueue_child(self, task: WorkflowTask) -> EnqueueResult:
        """Create the child run (idempotent by its checkpoint id: a repeat after a crash finds it)."""
        assert self._live is not None
        return await self._live.store.enqueue(task)

    def _child_started(self, call: Call, result: EnqueueResult | None, exc: BaseException | None) -> None:
        task = call.args[0]
        assert isinstance(task, WorkflowTask)
        if isinstance(exc, StoreError):
            self._abort(exc)  # the store's trouble, never the workflow's: this execution stops, nothing recorded
        elif exc is not None:
            # e.g. EnqueueConflictError: a checkpoint id (the workflow's own choice) that names another task or
            # another parent's child. Nothing records a refused start, so a replay could not hand the error back
            # to workflow code: it fails the run instead, saying why, at the call
            if call in self._open:
                self._open.remove(call)
            self._fail(exc if isinstance(exc, RunifoldError) else RunifoldError(describe(exc)), call.key)
        else:
            assert result is not None and task.checkpoint_id is not None
            started = ChildStarted(key=call.key, run_id=result.run_id, name=task.name, version=task.version,
                                   checkpoint_id=task.checkpoint_id)
            self._done(call, [started], (result.run_id, task.checkpoint_id))

    def _abort(self, exc: StoreError) -> None:
        raise NotImplementedError

    def _done(self, call: Call, events: list[AnyEvent], value: Any = None, error: BaseException | None = None) -> None:
        """The call's outcome is known: commit ``events``, then hand the outcome to workflow code."""
        if call in self._open:
            self._open.remove(call)
        self._outbox.append((events, lambda at: self._resolve(call, at, value, error)))

    def _retry_at(self, retry: RetryPolicy, attempt: int, exc: BaseException | None = None) -> float | None:
        """When the next attempt may run by the call's policy, or None when the failure (``exc``) is final."""
        if attempt >= retry.max_attempts or isinstance(exc, _MISUSE) or isinstance(exc, retry.non_retryable):
            return None
        return self.store_time() + retry.backoff(attempt + 1)

    def _retries_spent(self) -> bool:
        """The run's budget allows no more retries."""
        limit = self.definition.budget.max_retries
        return limit is not None and self.usage.retries + 1 > limit

    def _retry_allowed(self, call: Call) -> bool:
        """The run's budget allows one more retry; if not, the run fails with BudgetExceededError."""
        if self._retries_spent():
            limit = self.definition.budget.max_retries
            assert limit is not None
            self._fail(BudgetExceededError("retries", self.usage.retries + 1, limit), call.key)
            return False
        return True

    def _step_finished(self, call: Call, value: Any, exc: BaseException | None) -> None:
        spec = call.spec
        assert isinstance(spec, StepSpec)
        key, attempt = call.key, call.attempt
        if exc is None:
            try:
                plain, live = record(value, call.returns, what=f"step {key}")
            except SerializationError as err:
                # deterministic: another attempt would return the same, so the failure is final
                self._failed_attempt(call, err, None)
                return
            self._done(call, [StepCompleted(key=key, output=plain, attempt=attempt)], live)
            return
        self._failed_attempt(call, exc, self._retry_at(spec.retry, attempt, exc))

    def _failed_attempt(self, call: Call, exc: BaseException, retry_at: float | None) -> None:
        key, attempt, error = call.key, call.attempt, describe(exc)
        step = call.kind is CallKind.STEP
        error_type, tb = type_name(exc), traceback_of(exc)
        over_budget = retry_at is not None and not self._retry_allowed(call)
        if over_budget:
            retry_at = None
        event: AnyEvent = (
            StepFailed(key=key, error=error, attempt=attempt, retry_at=retry_at, error_type=error_type, traceback=tb)
            if step else
            EffectFailed(key=key, error=error, attempt=attempt, retry_at=retry_at, error_type=error_type, traceback=tb)
        )
        self.log.warning("step_failed" if step else "effect_failed", key=key, attempt=attempt, error=error,
                         retry_at=retry_at)
        if over_budget:
            # the retry budget ends the run: the attempt is recorded, and workflow code is handed nothing
            if call in self._open:
                self._open.remove(call)
            self._buffer.append(event)
            return
        if retry_at is None:
            failure = (StepFailedError(key, error, attempt, type_name(exc)) if step
                       else EffectFailedError(key, error, type_name(exc)))
            self._done(call, [event], error=failure)
            return
        self.usage.retries += 1
        if step:
            self._buffer.append(event)  # (a crash meanwhile runs the step again: it is at least once)
        else:
            self._record_effect(event)
        call.attempt, call.due, call.error = attempt + 1, retry_at, error

    def _effect_finished(self, call: Call, value: Any, exc: BaseException | None) -> None:
        spec = call.spec
        assert isinstance(spec, EffectSpec)
        key, attempt = call.key, call.attempt
        if exc is None:
            try:
                plain, live = record(value, call.returns, what=f"effect {key}")
            except SerializationError as err:
                self._park(call, f"it took place but returned a value that cannot be recorded ({err}); resolve it "
                                 "with the result it should have returned")
                return
            self._done(call, [EffectCompleted(key=key, output=plain, attempt=attempt)], live)
            return
        if not isinstance(exc, _UNKNOWN_OUTCOME):
            self._failed_attempt(call, exc, self._retry_at(spec.retry, attempt, exc))
            return
        self.log.warning("effect_outcome_unknown", key=key, attempt=attempt, error=describe(exc))
        unknown = EffectUnknown(key=key, error=describe(exc), attempt=attempt, error_type=type_name(exc))
        match spec.resume:
            case ResumePolicy.REPEAT:
                retry_at = self._retry_at(spec.retry, attempt)
                if retry_at is not None and self._retries_spent():
                    # unknown, so not failed: an operator decides, as when the policy's attempts run out
                    self._park(call, f"outcome unknown after {attempt} attempt(s), and the run's retry budget "
                                     f"({self.definition.budget.max_retries}) is spent", [unknown])
                elif retry_at is None:
                    self._park(call, f"outcome unknown after {attempt} attempt(s) with policy REPEAT", [unknown])
                else:
                    # the provider is idempotent by key: the same key is tried again after the backoff
                    self.usage.retries += 1
                    self._record_effect(msgspec.structs.replace(unknown, retry_at=retry_at))
                    call.attempt, call.due, call.error, call.unknown = attempt + 1, retry_at, unknown.error, True
            case ResumePolicy.MANUAL:
                self._park(call, "outcome unknown and the resume policy is MANUAL", [unknown])
            case ResumePolicy.RECONCILE:
                self._record_effect(unknown)
                call.in_doubt, call.recovering = True, False  # reconcile at once, in this execution
            case _ as unreachable:
                assert_never(unreachable)

    def _reconciled(self, call: Call, evidence: Any, exc: BaseException | None) -> None:
        spec = call.spec
        assert isinstance(spec, EffectSpec)
        key, attempt = call.key, call.attempt
        if exc is not None:
            evidence = Evidence.unknown(f"reconcile raised {describe(exc)}")
        elif not isinstance(evidence, Evidence):
            evidence = Evidence.unknown(f"reconcile returned {type(evidence).__name__}, not Evidence")
        self.log.info("effect_reconciled", key=key, verdict=evidence.verdict, detail=evidence.detail)
        if evidence.verdict == Verdict.APPLIED:
            try:
                plain, live = accept(evidence.result, call.returns, what=f"the evidence of effect {key}")
            except SerializationError as err:
                self._park(call, f"reconcile found it applied, with a result that cannot be recorded: {err}",
                           [EffectReconciled(key=key, verdict=Verdict.UNKNOWN, detail=str(err))])
                return
            self._done(call, [EffectReconciled(key=key, verdict=Verdict.APPLIED, output=plain,
                                               detail=evidence.detail)], live)
        elif evidence.verdict == Verdict.NOT_APPLIED:
            if attempt >= spec.retry.max_attempts:
                self._park(call, f"reconciled as not applied after {attempt} attempt(s), each ended without a "
                                 "known outcome (a crash, or an unknown result)",
                           [EffectReconciled(key=key, verdict=Verdict.NOT_APPLIED, detail=evidence.detail)])
                return
            if not self._retry_allowed(call):
                # (known not applied: nothing of it is in doubt, so the budget fails the run)
                call.in_doubt = call.unknown = False
                self._record_effect(EffectReconciled(key=key, verdict=Verdict.NOT_APPLIED, detail=evidence.detail))
                return
            # after a crash the next attempt runs at once; after an unknown outcome here, it backs off
            retry_at = None if call.recovering else self.store_time() + spec.retry.backoff(attempt + 1)
            self.usage.retries += 1
            self._record_effect(EffectReconciled(key=key, verdict=Verdict.NOT_APPLIED, detail=evidence.detail,
                                                 retry_at=retry_at))
            call.in_doubt, call.recovering, call.attempt, call.due = False, False, attempt + 1, retry_at
            call.error = not_applied(evidence.detail)
        else:
            self._park(call, f"reconcile found no evidence either way: {evidence.detail}",
                       [EffectReconciled(key=key, verdict=Verdict.UNKNOWN, detail=evidence.detail)])

    # -- failing ------------------------------------------------------------------------------------

    def _fail(self, exc: RunifoldError, key: str) -> None:
        """The engine fails the run (budget, capability, input): no new body starts; in-flight ones finish."""
        if self._failure is None:
            self._failure = (str(exc), exc, key)


class _NotStarted(Exception):
    """A body did not start: the lease is lost (see ``LiveProgress._started``). Never reaches workflow code."""
