"""Live execution of one claimed run: the driver behind workflow code.

The workflow function is called from the top. Calls whose keys the history
holds return their recorded results; the first call that is new runs live and
its result is committed before the workflow continues.

Anything that must stop the run (a wait, a retry backoff, an ambiguous effect,
a failed budget, divergence from history) raises a private ``_Halt``, a
``BaseException`` that workflow code must not swallow. Halts raised by
concurrent branches are merged; after the workflow's root task ends and every
live call in flight has committed, one final commit writes the halt's events and
its transition, or the run's completion.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

from runifold._log import get_logger

from runifold.dsl import Evidence, ResumePolicy, WorkflowContext, WorkflowDefinition
from runifold.dsl._context import Binding, Scope, current
from runifold.dsl._decorators import EffectOutcomeUnknown
from runifold.dsl._definition import EffectSpec, RetryPolicy, StepSpec
from runifold.errors import (
    BudgetExceededError,
    CapabilityDeniedError,
    EffectFailedError,
    LeaseLostError,
    NondeterminismError,
    RunifoldError,
    SerializationError,
    StepFailedError,
    StoreUnavailableError,
    WaitTimeoutError,
    describe,
)
from runifold.history import (
    AnyEvent,
    Ambiguous,
    CallKind,
    Done,
    EffectAmbiguous,
    EffectCompleted,
    EffectFailed,
    EffectReconciled,
    EffectStarted,
    Entry,
    Failed,
    Fresh,
    InDoubt,
    Replayer,
    RetryDue,
    RunCompleted,
    RunFailed,
    SignalReceived,
    SignalTimedOut,
    SignalWaitStarted,
    StepCompleted,
    StepFailed,
    TimerDone,
    TimerFired,
    TimerPending,
    TimerStarted,
    UsageCharged,
    ValueRecorded,
    Verdict,
    WaitPending,
    WaitReceived,
    WaitTimedOut,
    convert,
    decode_event,
    effect_state,
    fold,
    step_state,
    timer_state,
    to_plain,
    wait_state,
)
from runifold.stores import (
    Claim,
    Continue,
    EventRow,
    Finish,
    InboxSignal,
    Lease,
    Reschedule,
    RunStatus,
    Suspend,
    Transition,
    WorkflowStore,
)
from runifold.worker._outcome import (
    Completed,
    Failed as FailedOutcome,
    LeaseLost,
    Outcome,
    Retried,
    Suspended,
    SuspendReason,
)
from runifold.worker._registry import bind_input
from runifold.worker._scope import install_scoped_task_factory

log = get_logger("runifold.worker")

# How long a run whose code diverged from its history waits before it is tried again.
DIVERGED_RETRY_SECONDS = 60.0
_UNKNOWN_OUTCOME = (TimeoutError, ConnectionError, EffectOutcomeUnknown)


class _Kind(enum.IntEnum):
    """Halt kinds, by precedence when concurrent branches halt together."""

    WAIT = 0
    RESCHEDULE = 1
    PARK = 2
    FAIL = 3
    DIVERGED = 4


class _Abandoned(BaseException):
    """Stops a branch of a run that is already stopping or lost; records nothing."""


@dataclass(eq=False)
class _Halt(BaseException):
    """Stops workflow code; carries what the final commit must write."""

    kind: _Kind
    events: list[AnyEvent] = field(default_factory=list)
    wake_at: float | None = None
    signals: tuple[str, ...] = ()
    reason: str = ""
    key: str = ""
    attempt: int = 0

    def merge(self, other: _Halt) -> _Halt:
        """Combine two halts: events add up; the strongest transition wins."""
        events = self.events + other.events
        if self.kind is _Kind.WAIT and other.kind is _Kind.WAIT:
            wakes = [w for w in (self.wake_at, other.wake_at) if w is not None]
            return replace(self, events=events, wake_at=min(wakes) if wakes else None,
                           signals=tuple(sorted(set(self.signals) | set(other.signals))))
        if {self.kind, other.kind} <= {_Kind.WAIT, _Kind.RESCHEDULE}:
            first = self if self.kind is _Kind.RESCHEDULE else other
            at = min(w for w in (self.wake_at, other.wake_at, math.inf) if w is not None)
            return replace(first, events=events, wake_at=at)
        strongest = self if self.kind >= other.kind else other
        return replace(strongest, events=events)


@dataclass
class _Usage:
    steps: int
    effect_attempts: int
    retries: int
    cost_units: float


async def _call(definition: WorkflowDefinition, ctx: WorkflowContext, kwargs: dict[str, Any]) -> Any:
    return await definition.fn(ctx, **kwargs)


class Execution:
    """Drives one claimed run to completion, suspension or failure."""

    def __init__(
        self,
        store: WorkflowStore,
        claim: Claim,
        definition: WorkflowDefinition,
        worker_id: str,
        lease_seconds: float,
        renew_every: float,
        ending: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self._ending = ending  # called once, as the final commit starts
        self.definition = definition
        self.run_id = claim.run_id
        self.checkpoint_id = claim.checkpoint_id
        self.lease: Lease = claim.lease
        self._lease_seconds = lease_seconds
        self._renew_every = renew_every
        self._claim_now = claim.now
        self._t0 = claim.received
        entries = [
            Entry(row.seq, row.at, decode_event(row.body, where=f"{claim.run_id}#{row.seq}"))
            for row in claim.history
        ]
        self.replayer = Replayer(entries)
        self.revision = self.replayer.revision
        usage = fold(entries).usage
        self.usage = _Usage(usage.steps, usage.effect_attempts, usage.retries, usage.cost_units)
        self._inbox: list[InboxSignal] = list(claim.inbox)
        self._pending: list[AnyEvent] = []
        self._consumed: list[str] = []
        self._lock = asyncio.Lock()
        self._halt: _Halt | None = None
        self._closed = False
        self._lost: str | None = None
        self._inflight = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._tasks: set[asyncio.Future[Any]] = set()
        self._visits_before_settle = 0
        self.log = log.bind(run_id=self.run_id, checkpoint_id=self.checkpoint_id, worker_id=worker_id)

    # -- Driver protocol: clock, tracking -----------------------------------

    def store_time(self) -> float:
        """The store's clock, extrapolated from the claim with a monotonic clock."""
        return self._claim_now + (time.monotonic() - self._t0)

    def track(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- halting ------------------------------------------------------------

    def _stop(self, halt: _Halt) -> _Halt:
        self._halt = halt if self._halt is None else self._halt.merge(halt)
        return halt

    def _diverged(self, exc: NondeterminismError) -> _Halt:
        return self._stop(_Halt(_Kind.DIVERGED, reason=str(exc), key=exc.key))

    def _fail(self, exc: RunifoldError, key: str = "") -> _Halt:
        return self._stop(_Halt(_Kind.FAIL, reason=str(exc), key=key))

    def _visit(self, key: str, kind: CallKind, scope: Scope) -> list[AnyEvent]:
        if self._closed or self._lost is not None:
            raise _Abandoned()  # the run is stopping: start nothing new
        try:
            return self.replayer.visit(key, kind)
        except NondeterminismError as exc:
            raise self._diverged(exc) from None

    def _replayed(self, key: str, value: Any, type_: Any) -> Any:
        try:
            return convert(value, type_, what=key)
        except SerializationError as exc:
            raise self._diverged(NondeterminismError(key, "a value of another type", f"{type_!r}", str(exc))) from None

    async def _before_live(self, key: str, kind: CallKind, requires: str | None, *, counts: bool = True) -> None:
        """Checks before anything runs live: history fully replayed, grants, budget."""
        if self.replayer.first_unvisited() is not None:
            await self._settle()
            try:
                self.replayer.check_all_visited(f"{kind} {key}")
            except NondeterminismError as exc:
                raise self._diverged(exc) from None
        if self._closed or self._lost is not None:
            raise _Abandoned()
        if requires is not None and not self.definition.capabilities.allows(requires):
            raise self._fail(CapabilityDeniedError(key, requires), key)
        budget = self.definition.budget
        if not counts:
            return
        if budget.max_elapsed is not None:
            elapsed = self.store_time() - self.replayer.started_at
            if elapsed > budget.max_elapsed.total_seconds():
                raise self._fail(BudgetExceededError("elapsed seconds", elapsed, budget.max_elapsed.total_seconds()), key)
        if kind is CallKind.STEP and budget.max_steps is not None and self.usage.steps + 1 > budget.max_steps:
            raise self._fail(BudgetExceededError("steps", self.usage.steps + 1, budget.max_steps), key)
        if (
            kind is CallKind.EFFECT
            and budget.max_effect_attempts is not None
            and self.usage.effect_attempts + 1 > budget.max_effect_attempts
        ):
            raise self._fail(
                BudgetExceededError("effect attempts", self.usage.effect_attempts + 1, budget.max_effect_attempts), key
            )

    async def _settle(self) -> None:
        """Let concurrent branches replay their recorded calls before judging divergence."""
        quiet = 0
        for _ in range(64):
            before = self.replayer.visited
            await asyncio.sleep(0)
            quiet = quiet + 1 if self.replayer.visited == before else 0
            if quiet >= 3 or self.replayer.first_unvisited() is None:
                return

    # -- commits --------------------------------------------------------------

    async def _commit(self, events: list[AnyEvent], transition: Transition = Continue()) -> None:
        async with self._lock:
            if self._lost is not None:
                raise _Abandoned()
            batch = self._pending + events
            consumed = list(self._consumed)
            rows = [EventRow.of(e) for e in batch]
            # invariant: tasks the store creates get no scope, or they would shift the keys of workflow tasks
            token = current.set(None)
            try:
                result = await self.store.commit(self.lease, self.revision, rows, transition, consumed)
            except LeaseLostError as exc:
                self._lose(str(exc))
                raise _Abandoned() from None
            except StoreUnavailableError as exc:
                # the commit's outcome is unknown: the run is taken over when the lease expires
                self._lose(f"store unavailable: {exc}")
                raise _Abandoned() from None
            finally:
                current.reset(token)
            first = self.revision + 1
            self.revision = result.revision
            self.replayer.extend(Entry(first + i, result.at, e) for i, e in enumerate(batch))
            self._pending.clear()
            self._consumed.clear()

    def _lose(self, detail: str) -> None:
        if self._lost is None:
            self._lost = detail
            self.log.warning("lease_lost", detail=detail)
            for task in list(self._tasks):
                task.cancel()

    async def _run_body(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None = None) -> Any:
        # invariant: bodies run without a binding, so tasks they create get no scope
        token = current.set(None)
        self._inflight += 1
        self._drained.clear()
        try:
            if timeout is None:
                return await fn(*args, **kwargs)
            async with asyncio.timeout(timeout):
                return await fn(*args, **kwargs)
        finally:
            current.reset(token)
            self._inflight -= 1
            if self._inflight == 0:
                self._drained.set()

    def _retry_or_final(self, retry: RetryPolicy, attempt: int) -> float | None:
        """Return when the next attempt may run, or None when the failure is final."""
        max_retries = self.definition.budget.max_retries
        if attempt >= retry.max_attempts or (max_retries is not None and self.usage.retries + 1 > max_retries):
            return None
        return self.store_time() + retry.backoff(attempt + 1)

    # -- steps ----------------------------------------------------------------

    async def call_step(self, spec: StepSpec, scope: Scope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = scope.key(spec.id)
        state = step_state(self._visit(key, CallKind.STEP, scope))
        match state:
            case Done(output=output):
                return self._replayed(key, output, spec.returns.get())
            case Failed(error=error, attempts=attempts):
                raise StepFailedError(key, error, attempts)
            case RetryDue(attempt=attempt) | Fresh(attempt=attempt):
                pass
            case _ as unreachable:
                assert_never(unreachable)
        await self._before_live(key, CallKind.STEP, spec.requires)
        self.usage.steps += 1
        try:
            output = await self._run_body(spec.fn, args, kwargs)
        except Exception as exc:
            error = describe(exc)
            retry_at = self._retry_or_final(spec.retry, attempt)
            self.log.info("step_failed", key=key, attempt=attempt, error=error, retry_at=retry_at)
            if retry_at is not None:
                self.usage.retries += 1
                raise self._stop(_Halt(
                    _Kind.RESCHEDULE, [StepFailed(key=key, error=error, attempt=attempt, retry_at=retry_at)],
                    wake_at=retry_at, reason=f"step {key} attempt {attempt} failed: {error}", key=key, attempt=attempt + 1,
                )) from None
            await self._commit([StepFailed(key=key, error=error, attempt=attempt)])
            raise StepFailedError(key, error, attempt) from exc
        try:
            plain = to_plain(output, what=f"the output of step {key}")
        except SerializationError as exc:
            raise self._fail(exc, key) from None
        await self._commit([StepCompleted(key=key, output=plain, attempt=attempt)])
        self.log.debug("step_completed", key=key, revision=self.revision)
        return output

    # -- effects ----------------------------------------------------------------

    async def call_effect(self, spec: EffectSpec, scope: Scope, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = scope.key(spec.id)
        state = effect_state(self._visit(key, CallKind.EFFECT, scope))
        idempotency_key = f"{self.run_id}:{key}"
        recovering = isinstance(state, InDoubt)
        while True:
            match state:
                case Done(output=output):
                    return self._replayed(key, output, spec.returns.get())
                case Failed(error=error):
                    raise EffectFailedError(key, error)
                case Ambiguous(reason=reason):
                    raise self._stop(_Halt(_Kind.PARK, reason=f"effect {key} is ambiguous: {reason}", key=key))
                case InDoubt(attempt=attempt):
                    state = await self._resolve_in_doubt(spec, key, attempt, idempotency_key, args, kwargs, recovering)
                case RetryDue(attempt=attempt) | Fresh(attempt=attempt):
                    state = await self._run_effect(spec, key, attempt, idempotency_key, args, kwargs)
                    recovering = False
                case _ as unreachable:
                    assert_never(unreachable)

    async def _run_effect(
        self, spec: EffectSpec, key: str, attempt: int, idem: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Done | Failed | InDoubt:
        await self._before_live(key, CallKind.EFFECT, spec.requires)
        self.usage.effect_attempts += 1
        # invariant: effect_started is durable before the body can touch the outside world
        await self._commit([EffectStarted(key=key, idempotency_key=idem, attempt=attempt)])
        timeout = None if spec.timeout is None else spec.timeout.total_seconds()
        try:
            output = await self._run_body(spec.fn, (idem, *args), kwargs, timeout)
        except _UNKNOWN_OUTCOME as exc:
            self.log.warning("effect_outcome_unknown", key=key, attempt=attempt, error=describe(exc))
            return InDoubt(attempt, idem)
        except Exception as exc:
            error = describe(exc)
            retry_at = self._retry_or_final(spec.retry, attempt)
            if retry_at is not None:
                self.usage.retries += 1
                raise self._stop(_Halt(
                    _Kind.RESCHEDULE, [EffectFailed(key=key, error=error, attempt=attempt, retry_at=retry_at)],
                    wake_at=retry_at, reason=f"effect {key} attempt {attempt} failed: {error}", key=key, attempt=attempt + 1,
                )) from None
            await self._commit([EffectFailed(key=key, error=error, attempt=attempt)])
            return Failed(error, attempt)
        try:
            plain = to_plain(output, what=f"the result of effect {key}")
        except SerializationError as exc:
            raise self._fail(exc, key) from None
        await self._commit([EffectCompleted(key=key, output=plain, attempt=attempt)])
        return Done(plain)

    async def _resolve_in_doubt(
        self, spec: EffectSpec, key: str, attempt: int, idem: str, args: tuple[Any, ...], kwargs: dict[str, Any],
        recovering: bool,
    ) -> Done | Fresh:
        """Apply the effect's resume policy to an outcome nobody knows."""
        match spec.resume:
            case ResumePolicy.REPEAT:
                if attempt >= spec.retry.max_attempts:
                    raise self._park(key, f"outcome unknown after {attempt} attempt(s) with policy REPEAT")
                if recovering:
                    return Fresh(attempt + 1)
                at = self.store_time() + spec.retry.backoff(attempt + 1)
                raise self._stop(_Halt(_Kind.RESCHEDULE, wake_at=at, key=key, attempt=attempt + 1,
                                       reason=f"effect {key} outcome unknown; repeating with the same key"))
            case ResumePolicy.MANUAL:
                raise self._park(key, "outcome unknown and the resume policy is MANUAL")
            case ResumePolicy.RECONCILE:
                assert spec.reconcile is not None
                await self._before_live(key, CallKind.EFFECT, None, counts=False)
                try:
                    evidence = await self._run_body(spec.reconcile, (idem, *args), kwargs)
                except Exception as exc:
                    evidence = Evidence.unknown(f"reconcile raised {describe(exc)}")
                if not isinstance(evidence, Evidence):
                    evidence = Evidence.unknown(f"reconcile returned {type(evidence).__name__}, not Evidence")
                self.log.info("effect_reconciled", key=key, verdict=evidence.verdict, detail=evidence.detail)
                if evidence.verdict == Verdict.APPLIED:
                    try:
                        plain = to_plain(evidence.result, what=f"the evidence result of effect {key}")
                    except SerializationError as exc:
                        raise self._fail(exc, key) from None
                    await self._commit([EffectReconciled(key=key, verdict=Verdict.APPLIED, output=plain, detail=evidence.detail)])
                    return Done(plain)
                if evidence.verdict == Verdict.NOT_APPLIED:
                    not_applied = EffectReconciled(key=key, verdict=Verdict.NOT_APPLIED, detail=evidence.detail)
                    if attempt >= spec.retry.max_attempts:
                        raise self._park(key, f"not applied after {attempt} attempt(s) with unknown outcomes", [not_applied])
                    self._pending.append(not_applied)
                    if recovering:
                        return Fresh(attempt + 1)
                    at = self.store_time() + spec.retry.backoff(attempt + 1)
                    raise self._stop(_Halt(_Kind.RESCHEDULE, wake_at=at, key=key, attempt=attempt + 1,
                                           reason=f"effect {key} was not applied; trying again"))
                raise self._park(key, f"reconcile found no evidence either way: {evidence.detail}",
                                 [EffectReconciled(key=key, verdict=Verdict.UNKNOWN, detail=evidence.detail)])
            case _ as unreachable:
                assert_never(unreachable)

    def _park(self, key: str, reason: str, events: list[AnyEvent] | None = None) -> _Halt:
        self.log.warning("effect_ambiguous", key=key, reason=reason)
        return self._stop(_Halt(_Kind.PARK, [*(events or []), EffectAmbiguous(key=key, reason=reason)],
                                reason=f"effect {key} is ambiguous: {reason}", key=key))

    # -- recorded values and usage ---------------------------------------------

    def record_value(self, scope: Scope, kind: str, make: Callable[[], Any]) -> Any:
        key = scope.key(kind)
        events = self._visit(key, CallKind.VALUE, scope)
        if events:
            event = events[0]
            assert isinstance(event, ValueRecorded)
            return event.value
        value = make()
        self._pending.append(ValueRecorded(key=key, value=value))
        return value

    def charge(self, scope: Scope, units: float) -> None:
        key = scope.key("charge")
        if self._visit(key, CallKind.CHARGE, scope):
            return
        budget = self.definition.budget.max_cost_units
        if budget is not None and self.usage.cost_units + units > budget:
            raise self._fail(BudgetExceededError("cost units", self.usage.cost_units + units, budget), key)
        self.usage.cost_units += units
        self._pending.append(UsageCharged(key=key, units=units))

    # -- waits ---------------------------------------------------------------------

    async def sleep(self, scope: Scope, delay: float | None, until: float | None) -> None:
        key = scope.key("sleep")
        state = timer_state(self._visit(key, CallKind.TIMER, scope))
        match state:
            case TimerDone():
                return
            case TimerPending(fire_at=fire_at):
                pass
            case Fresh():
                await self._before_live(key, CallKind.TIMER, None)
                fire_at = until if until is not None else self.store_time() + (delay or 0.0)
                self._pending.append(TimerStarted(key=key, fire_at=fire_at))
            case _ as unreachable:
                assert_never(unreachable)
        # invariant: a timer fires on the store's clock, never before fire_at
        if self.store_time() >= fire_at:
            self._pending.append(TimerFired(key=key, fired_at=self.store_time()))
            return
        raise self._stop(_Halt(_Kind.WAIT, wake_at=fire_at, key=key, reason=f"timer {key}"))

    async def wait_signal(self, scope: Scope, name: str, timeout: float | None) -> Any:
        key = scope.key(f"wait.{name}")
        state = wait_state(self._visit(key, CallKind.SIGNAL, scope))
        match state:
            case WaitReceived(payload=payload):
                return payload
            case WaitTimedOut():
                raise WaitTimeoutError(key, name)
            case WaitPending(deadline=deadline):
                pass
            case Fresh():
                await self._before_live(key, CallKind.SIGNAL, None)
                deadline = None if timeout is None else self.store_time() + timeout
                self._pending.append(SignalWaitStarted(key=key, name=name, deadline=deadline))
            case _ as unreachable:
                assert_never(unreachable)
        for signal in self._inbox:
            if signal.name == name:
                self._inbox.remove(signal)
                self._consumed.append(signal.signal_id)
                self._pending.append(SignalReceived(
                    key=key, name=name, payload=signal.payload, signal_id=signal.signal_id,
                    sender=signal.sender, reason=signal.reason, received_at=signal.received_at,
                ))
                self.log.info("signal_consumed", key=key, signal_id=signal.signal_id, sender=signal.sender)
                return signal.payload
        if deadline is not None and self.store_time() >= deadline:
            self._pending.append(SignalTimedOut(key=key, name=name))
            raise WaitTimeoutError(key, name)
        raise self._stop(_Halt(_Kind.WAIT, wake_at=deadline, signals=(name,), key=key, reason=f"signal {name!r}"))

    # -- the run --------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Replay and continue the run; return what happened."""
        if time.monotonic() - self._t0 >= self._renew_every:
            # a claim made ahead waited for its slot's previous run, maybe past its lease, and another
            # worker may hold the run now: renew before anything runs live, or run nothing
            try:
                self.lease = await self.store.renew(self.lease, self._lease_seconds)
            except LeaseLostError as exc:
                self._lose(f"the claim waited {time.monotonic() - self._t0:.1f} s before it was driven: {exc}")
                return LeaseLost(self.run_id, self.checkpoint_id, self._lost or str(exc))
        loop = asyncio.get_running_loop()
        install_scoped_task_factory(loop)
        try:
            kwargs = bind_input(self.definition, dict(self.replayer.started.input))
        except RunifoldError as exc:
            return await self._finish_failed(str(exc))
        root_ctx = contextvars.copy_context()
        root_ctx.run(current.set, Binding(self, Scope()))
        ctx = WorkflowContext(self)
        root: asyncio.Task[Any] = asyncio.Task(_call(self.definition, ctx, kwargs), loop=loop, context=root_ctx)
        self.track(root)
        renewer = asyncio.create_task(self._renew_loop(), context=contextvars.Context())
        try:
            try:
                await asyncio.wait({root})
            except asyncio.CancelledError:
                # the worker itself is being cancelled: stop the run and hand it back at once
                self._lose("worker cancelled")
                await self._cleanup()
                await asyncio.shield(self.store.release(self.lease))
                raise
            self._closed = True
            await self._drained.wait()
            await self._cleanup()
        finally:
            renewer.cancel()
            # invariant: no task of this run outlives run_once()
            await asyncio.gather(renewer, return_exceptions=True)
        return await self._finish(root)

    async def _cleanup(self) -> None:
        pending = [t for t in self._tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._renew_every)
            try:
                self.lease = await self.store.renew(self.lease, self._lease_seconds)
            except LeaseLostError as exc:
                self._lose(str(exc))
                return
            except RunifoldError as exc:
                self.log.warning("lease_renewal_failed", error=str(exc))

    async def _finish(self, root: asyncio.Task[Any]) -> Outcome:
        if not root.cancelled():
            root.exception()  # mark it retrieved: a halt is reported through self._halt
        if self._lost is not None:
            return LeaseLost(self.run_id, self.checkpoint_id, self._lost)
        if self._halt is None:
            exc = None if root.cancelled() else root.exception()
            if exc is None and not root.cancelled():
                return await self._finish_completed(root.result())
            if isinstance(exc, (_Halt, _Abandoned)):
                return await self._finish_failed("workflow stopped without a recorded reason")
            elif exc is not None:
                self.log.info("workflow_raised", error=describe(exc))
                return await self._finish_failed(f"workflow raised {describe(exc)}")
            else:
                return await self._finish_failed("workflow task was cancelled")
        return await self._finish_halt(self._halt)

    async def _final_commit(self, events: list[AnyEvent], transition: Transition) -> bool:
        if self._ending is not None:
            ending, self._ending = self._ending, None
            ending()
        try:
            await self._commit(events, transition)
        except _Abandoned:
            return False
        return True

    async def _finish_completed(self, output: Any) -> Outcome:
        try:
            self.replayer.check_all_visited("the workflow's return")
        except NondeterminismError as exc:
            return await self._finish_halt(_Halt(_Kind.DIVERGED, reason=str(exc), key=exc.key))
        try:
            plain = to_plain(output, what="the workflow's return value")
        except SerializationError as exc:
            return await self._finish_failed(str(exc))
        if not await self._final_commit([RunCompleted(output=plain)], Finish(RunStatus.COMPLETED)):
            return LeaseLost(self.run_id, self.checkpoint_id, self._lost or "commit fenced off")
        self.log.info("run_completed", revision=self.revision)
        return Completed(self.run_id, self.checkpoint_id, output, self.revision)

    async def _finish_failed(self, reason: str) -> Outcome:
        if not await self._final_commit([RunFailed(reason=reason)], Finish(RunStatus.FAILED, reason)):
            return LeaseLost(self.run_id, self.checkpoint_id, self._lost or "commit fenced off")
        self.log.info("run_failed", reason=reason, revision=self.revision)
        return FailedOutcome(self.run_id, self.checkpoint_id, reason)

    async def _finish_halt(self, halt: _Halt) -> Outcome:
        lost = LeaseLost(self.run_id, self.checkpoint_id, self._lost or "commit fenced off")
        match halt.kind:
            case _Kind.DIVERGED:
                # invariant: nothing is appended to a history the code no longer matches
                self._pending.clear()
                self._consumed.clear()
                at = self.store_time() + DIVERGED_RETRY_SECONDS
                if not await self._final_commit([], Reschedule(at, halt.reason)):
                    return lost
                self.log.error("nondeterminism", key=halt.key, reason=halt.reason)
                return FailedOutcome(self.run_id, self.checkpoint_id, halt.reason, run_failed=False)
            case _Kind.FAIL:
                if not await self._final_commit([*halt.events, RunFailed(reason=halt.reason)], Finish(RunStatus.FAILED, halt.reason)):
                    return lost
                self.log.info("run_failed", reason=halt.reason, revision=self.revision)
                return FailedOutcome(self.run_id, self.checkpoint_id, halt.reason)
            case _Kind.PARK:
                if not await self._final_commit(halt.events, Suspend(RunStatus.PARKED, reason=halt.reason)):
                    return lost
                return Suspended(self.run_id, self.checkpoint_id, SuspendReason.AMBIGUOUS, None, (), halt.reason)
            case _Kind.RESCHEDULE:
                assert halt.wake_at is not None
                if not await self._final_commit(halt.events, Reschedule(halt.wake_at, halt.reason)):
                    return lost
                return Retried(self.run_id, self.checkpoint_id, halt.key, halt.attempt, halt.wake_at, halt.reason)
            case _Kind.WAIT:
                transition = Suspend(RunStatus.WAITING, halt.wake_at, halt.signals, halt.reason)
                if not await self._final_commit(halt.events, transition):
                    return lost
                reason = SuspendReason.SIGNAL if halt.signals else SuspendReason.TIMER
                self.log.info("run_suspended", reason=str(reason), until=halt.wake_at, signals=halt.signals)
                return Suspended(self.run_id, self.checkpoint_id, reason, halt.wake_at, halt.signals, halt.reason)
            case _ as unreachable:
                assert_never(unreachable)
