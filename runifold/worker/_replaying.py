"""The replay half of the driver: what history says about each call, and handing recorded outcomes back.

A call workflow code makes is classified against the events recorded under its
key (answered by replay, or progressing live from where it stopped); recorded
outcomes are handed back in the order they were recorded, one at a time. See
:mod:`runifold.worker._execution` for the whole picture.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, NoReturn, assert_never

import msgspec

from runifold.dsl import WorkflowDefinition
from runifold.errors import (
    BudgetExceededError,
    EffectFailedError,
    NondeterminismError,
    SerializationError,
    StepFailedError,
    WaitTimeoutError,
    describe,
    type_name,
)
from runifold.history import (
    NEVER_FIRES,
    Ambiguous,
    AnyEvent,
    CallKind,
    Cancelled,
    ChildStarted,
    Done,
    EffectFailed,
    EffectResolved,
    Failed,
    Fresh,
    InDoubt,
    Replayer,
    RetryDue,
    RunCancelled,
    RunCompleted,
    RunFailed,
    SignalReceived,
    SignalTimedOut,
    SignalWaitStarted,
    StepFailed,
    TimerDone,
    TimerFired,
    TimerPending,
    TimerStarted,
    WaitPending,
    WaitReceived,
    WaitTimedOut,
    convert,
    effect_state,
    record,
    step_state,
    timer_state,
    wait_state,
)
from runifold.worker._call import Call, Live, ReplayReport, child_start_under_way

#: the kinds of call that, with no history, start fresh and progress live
_FRESH_OPEN = frozenset({CallKind.STEP, CallKind.EFFECT})


class Replaying:
    """Classifies calls against their recorded events and hands recorded outcomes back in recorded order."""

    # shared with Execution, which sets them up
    replayer: Replayer
    report: ReplayReport
    _live: Live | None
    _root: asyncio.Task[Any] | None
    _calls: dict[str, Call]
    _open: list[Call]
    _buffer: list[AnyEvent]
    _resolutions: deque[tuple[Call, Any, BaseException | None, float]]
    _replaying: bool
    _cursor: int
    _divergence: NondeterminismError | None
    definition: WorkflowDefinition
    _recorded_result: list[RunCompleted]
    _recorded_failure: RunFailed | None
    _recorded_cancel: RunCancelled | None
    _failure: tuple[str, BaseException | None, str] | None

    def _check_recoveries(self) -> None:
        raise NotImplementedError

    def _deliver_next(self) -> None:
        raise NotImplementedError

    @staticmethod
    def _payload(call: Call, payload: Any) -> tuple[Any, BaseException | None]:
        raise NotImplementedError

    def _classify(self, call: Call, events: list[AnyEvent]) -> bool:
        """Take a call's state from its recorded events; True if it progresses live (else replay answers it)."""
        key = call.key
        if not events and call.kind in _FRESH_OPEN:
            return True  # no history: a step or an effect starts fresh, at attempt 1, and progresses live
        match call.kind:
            case CallKind.STEP:
                state = step_state(events)
                match state:
                    case Done() | Failed() | Cancelled():
                        return False
                    case RetryDue(attempt=attempt, retry_at=retry_at, error=error):
                        call.attempt, call.due, call.error = attempt, retry_at, error
                    case Fresh(attempt=attempt):
                        call.attempt = attempt
                    case _ as unreachable:
                        assert_never(unreachable)
            case CallKind.EFFECT:
                effect = effect_state(events)
                match effect:
                    case Done() | Failed() | Cancelled():
                        return False
                    case Ambiguous(reason=reason, attempt=attempt):
                        call.parked, call.attempt = reason, attempt
                    case InDoubt(attempt=attempt):
                        call.in_doubt, call.recovering, call.attempt = True, True, attempt
                    case RetryDue(attempt=attempt, retry_at=retry_at, error=error, unknown=unknown):
                        call.attempt, call.due, call.error, call.unknown = attempt, retry_at, error, unknown
                    case Fresh(attempt=attempt, unknown=unknown):
                        call.attempt, call.unknown = attempt, unknown
                    case _ as unreachable:
                        assert_never(unreachable)
            case CallKind.TIMER:
                timer = timer_state(events)
                match timer:
                    case TimerDone() | Cancelled():
                        return False
                    case TimerPending(fire_at=fire_at):
                        call.due = fire_at
                    case Fresh():
                        fire_at = NEVER_FIRES if call.due is None else call.due
                        self._buffer.append(TimerStarted(key=key, fire_at=fire_at))
                    case _ as unreachable:
                        assert_never(unreachable)
            case CallKind.SIGNAL:
                wait = wait_state(events)
                match wait:
                    case WaitReceived() | WaitTimedOut() | Cancelled():
                        return False
                    case WaitPending(deadline=deadline):
                        call.due = deadline
                    case Fresh():
                        self._buffer.append(SignalWaitStarted(key=key, name=call.name, deadline=call.due))
                    case _ as unreachable:
                        assert_never(unreachable)
            case CallKind.CHILD:
                if events:
                    # child_started: replay answers it; a start cancelled while its enqueue was under way, with no
                    # child_started (the worker stopped before that commit), runs on (see child_start_under_way)
                    return child_start_under_way(events)
            case CallKind.VALUE | CallKind.CHARGE:
                raise AssertionError("values and charges are answered at the call")
            case _ as unreachable:
                assert_never(unreachable)
        return True

    def _replay_next(self) -> bool:
        """Queue the next recorded outcome if its call is registered; end replay when all are handed out."""
        resolutions = self.replayer.resolutions
        while self._cursor < len(resolutions):
            call = self._calls.get(resolutions[self._cursor])
            if call is None:
                return False  # workflow code has not reached it (yet)
            committed = call.kind not in (CallKind.TIMER, CallKind.SIGNAL)
            if committed and not self.replayer.made_before(call.key):
                return False  # a branch has yet to make a call the live run made before this outcome came
            if call.future.done():
                self._cursor += 1
                self.report.steps.append((call.key, "cancelled"))
                if committed:
                    # the live run handed this committed outcome over, at its place, as a no-op, and workflow
                    # code ran a pass before the next: so does the replay
                    return True
                continue  # workflow code stopped waiting for it (cancelled): nothing to hand over
            if not self.replayer.made_before(call.key):
                return False  # a branch has yet to make a call the live run made before this outcome came
            if self._ended_by_budget(call):
                # the live run handed this failure to nobody: the retry budget failed the run there
                self._cursor += 1
                self.report.steps.append((call.key, "failed: the retry budget ended the run"))
                return True
            outcome = self._recorded_outcome(call)
            if outcome is None:
                # the live run's code cancelled the call at this point (its own timeout, say): the outcomes
                # recorded after it wait until this code has cancelled it too
                return False
            self._cursor += 1
            if self._divergence is not None:
                return True
            self._resolutions.append((call, *outcome))
            return True
        if self.replayer.first_unvisited() is not None:
            return False
        self._replaying = False
        if self._live is not None:
            self._check_recoveries()
        return True

    def _ended_by_budget(self, call: Call) -> bool:
        """The call's last attempt failed and the retry budget refused another, failing the run (see
        ``_failed_attempt``): workflow code was handed nothing. Read from the failed run's last event."""
        failure = self._recorded_failure
        return (failure is not None and failure.key == call.key and call.kind in (CallKind.STEP, CallKind.EFFECT)
                and failure.error_type == type_name(BudgetExceededError))

    def _recorded_outcome(self, call: Call) -> tuple[Any, BaseException | None, float] | None:
        """What history says the call returned or raised, and when that happened (see :meth:`_resolve`); None
        for a call the live run's code cancelled."""
        key = call.key
        events = self.replayer.events(key)
        steps = self.report.steps
        match call.kind:
            case CallKind.STEP | CallKind.EFFECT:
                state = step_state(events) if call.kind is CallKind.STEP else effect_state(events)
                at = self.replayer.committed_at(key)
                if isinstance(state, Done):
                    # (an outcome an operator's resolution decided says so, and by whom)
                    steps.append((key, f"resolved by {state.by} (applied)" if state.by else "replayed"))
                    return self._converted(call, state.output), None, at
                if isinstance(state, Cancelled):
                    return None
                assert isinstance(state, Failed)
                steps.append((key, f"resolved by {state.by} (fail)" if state.by else "failed"))
                if call.kind is CallKind.STEP:
                    failed = [e for e in events if isinstance(e, StepFailed)]
                    error_type = failed[-1].error_type if failed else ""
                    return None, StepFailedError(key, state.error, state.attempts, error_type), at
                ended = [e for e in events if isinstance(e, (EffectFailed, EffectResolved))]
                error_type = ended[-1].error_type if ended and isinstance(ended[-1], EffectFailed) else ""
                return None, EffectFailedError(key, state.error, error_type), at
            case CallKind.TIMER:
                if isinstance(timer_state(events), Cancelled):
                    return None
                steps.append((key, "timer fired"))
                return None, None, next(e.fired_at for e in events if isinstance(e, TimerFired))
            case CallKind.CHILD:
                started = events[0]
                if not isinstance(started, ChildStarted):
                    return None  # call_cancelled: the live run's code cancelled it before the child started
                steps.append((key, f"child {started.run_id} started"))
                return (started.run_id, started.checkpoint_id), None, self.replayer.committed_at(key)
            case CallKind.SIGNAL:
                wait = wait_state(events)
                if isinstance(wait, Cancelled):
                    return None
                if isinstance(wait, WaitReceived):
                    steps.append((key, "signal received"))
                    received = next(e for e in events if isinstance(e, SignalReceived))
                    taken = received.received_at if received.consumed_at is None else received.consumed_at
                    return *self._payload(call, wait.payload), taken
                steps.append((key, "wait timed out"))
                timed_out = next(e for e in events if isinstance(e, SignalTimedOut))
                started_wait = next(e for e in events if isinstance(e, SignalWaitStarted))
                judged = timed_out.timed_out_at if timed_out.timed_out_at is not None else started_wait.deadline
                return None, WaitTimeoutError(key, call.name), judged or 0.0
            case _:
                raise AssertionError(f"{call.kind} calls are not resolved by replay")

    async def unfit(self, what: str, plain: Any, returns: Any, exc: SerializationError) -> NoReturn:
        """A recorded value workflow code is handed outside a call's outcome (a child run's result) no longer
        fits the type today's code annotates: a divergence, as for a step's recorded result (see
        :meth:`_converted`), not an error of workflow code. The task waits until the driver ends the execution."""
        if self._divergence is None:
            self._divergence = NondeterminismError(
                what, f"the child's result {clipped(plain)} (in the child run's history)",
                f"result() expecting {_type_text(returns)}", str(exc))
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable: the execution ends at a divergence")

    def _converted(self, call: Call, plain: Any) -> Any:
        try:
            return convert(plain, call.returns, what=call.key)
        except SerializationError as exc:
            self._divergence = NondeterminismError(
                call.key, f"the value {clipped(plain)}", f"a call returning {_type_text(call.returns)}", str(exc))
            return None

    def _deliver_committed(self) -> None:
        """Replay: hand over at once an outcome the live run handed over right after committing it (a step's,
        an effect's, a child's start), as live workflow code ran no further in between; a wait's end (a timer, a
        signal) waits for the next pass of workflow code, as it did live."""
        if self._resolutions and self._resolutions[-1][0].kind not in (CallKind.TIMER, CallKind.SIGNAL):
            self._deliver_next()

    def _result_what(self) -> str:
        """What an error about the workflow's result names (as ``step x#1`` for a step's)."""
        return f"workflow {self.definition.spec.name!r}"

    def _report_end(self) -> None:
        """Debugger: where a replay that did not diverge ended, and how (the report's ``finished``, ``error``,
        ``result`` and ``stopped_at``).

        invariant: a run whose history records its end must end the same way on replay: a completed run's code
        returns an equal result, and a run whose code raised live raises an exception of the same type (a run the
        engine failed, at a call it refused or at a budget, ends where its code waits). For a run whose history
        has no end yet, the report says what the code does after the last recorded call: waits (``stopped_at``),
        returns (``result``) or raises (``error``), with ``finished`` false.
        """
        report, root = self.report, self._root
        pending = [c.key for c in self._open if not c.future.done()]
        report.stopped_at = pending[0] if pending else None
        failed = self._recorded_failure
        ended = report.ended = root is not None and root.done()
        if root is not None and ended and not root.cancelled():
            root.exception()  # (judged here, whatever the verdict: never logged as "never retrieved")
        if self._recorded_cancel is not None:
            # an operator ended the run from outside: its history, and so the replay, stops there
            cancel = self._recorded_cancel
            report.finished, report.cancelled, report.error = True, True, f"cancelled by {cancel.by}: {cancel.reason}"
            return
        if self._failure is not None:
            # a charge the budget refuses on replay: the run fails there, whatever its code does after; the same end
            # only where the live run failed at that very charge
            reason, _, key = self._failure
            report.stopped_at, report.error, report.ended = None, reason, False  # (the run ends at the charge)
            if failed is not None and failed.key == key:
                report.finished = True
            elif failed is not None or self._recorded_result:
                report.divergence = NondeterminismError(
                    "(result)", self._recorded_end(), f"a run its budget fails at {key} ({reason})")
            return
        if failed is not None and self._refused_here(failed, blocked=not ended and not pending):
            # the engine failed the run where the replay stops (a budget, a wait nothing can end), whatever else the
            # code did in that pass (a branch that raised, a workflow that had returned while an effect ran on)
            report.finished, report.stopped_at, report.error = True, None, failed.reason
            return
        if root is None or not ended:
            if failed is not None or self._recorded_result:
                # a run that ended must end again: the code goes on to a call its history does not answer
                report.divergence = NondeterminismError(
                    "(result)", self._recorded_end(),
                    f"a workflow that goes on to {report.stopped_at}" if report.stopped_at
                    else "a workflow that waits on something that is not a runifold call")
            return
        if root.cancelled() or root.exception() is not None:
            what = WORKFLOW_CANCELLED if root.cancelled() else describe(root.exception())  # type: ignore[arg-type]
            if self._recorded_result or (failed is not None and not self._ended_alike(failed, root)):
                report.divergence = NondeterminismError("(result)", self._recorded_end(), f"a workflow that raised {what}",
                                                        _moved(failed, root))
            else:
                report.finished, report.error = failed is not None, what
            return
        report.finished = failed is not None or bool(self._recorded_result)
        self._check_result(root.result())
        if failed is not None and report.error is None and report.divergence is None:
            # (a run the engine failed at its result failed because the result could not be recorded: see above)
            report.finished, report.divergence = False, NondeterminismError(
                "(result)", self._recorded_end(), f"a workflow that returns {_clipped_result(root.result())}")

    @staticmethod
    def _ended_alike(failed: RunFailed, root: asyncio.Task[Any]) -> bool:
        """The replayed workflow ended (raised, or its task was cancelled) as the live one did."""
        if failed.reason.startswith(WORKFLOW_RAISED):
            return not root.cancelled() and failed.error_type == type_name(root.exception())  # type: ignore[arg-type]
        return failed.reason == WORKFLOW_CANCELLED and root.cancelled()

    def _refused_here(self, failed: RunFailed, *, blocked: bool) -> bool:
        """The engine failed the run (its code had not ended), and the replayed code waits where it did: at the
        call the engine refused (a budget, a capability, a deadline), or anywhere for a failure of no call (the
        recovery budget, a workflow blocked on something that is not a runifold call)."""
        if failed.reason.startswith((WORKFLOW_RAISED, self._result_what())) or failed.reason == WORKFLOW_CANCELLED:
            return False  # the workflow's code ended the run live: raised, its task cancelled, or an unrecordable result
        if failed.reason.startswith(WORKFLOW_BLOCKED):
            return blocked  # blocked live: the code must be blocked again (``blocked``: waiting for no runifold call)
        if not failed.key:
            return True  # (the recovery budget, an event that could not be written: wherever the code is)
        call = self._calls.get(failed.key)
        return call is not None and not call.future.done()

    def _recorded_end(self) -> str:
        """How the run ended, as a divergence names what history recorded."""
        if self._recorded_result:
            return f"the run's completion with result {clipped(self._recorded_result[-1].output)}"
        failed = self._recorded_failure
        assert failed is not None
        return f"that the {failed.reason}" if failed.reason.startswith(WORKFLOW_RAISED) else f"the failure {failed.reason!r}"

    def _check_result(self, output: Any) -> None:
        """Debugger: a replay that finishes must return what the live run returned (compared as typed values)."""
        returns = self.definition.spec.returns.get()
        try:
            _, replayed = record(output, returns, what=self._result_what())
        except SerializationError as exc:
            if self._recorded_result:
                self.report.divergence = NondeterminismError(
                    "(result)", f"result {self._recorded_result[-1].output!r}", "a result that cannot be recorded",
                    str(exc))
            else:
                self.report.error = str(exc)  # the live run failed the same way, with this reason: its result was refused
            return
        self.report.result = replayed
        if not self._recorded_result:
            return
        recorded = self._recorded_result[-1].output
        try:
            same = convert(recorded, returns, what="the recorded result") == replayed
        except SerializationError:
            same = False
        if not same:
            self.report.divergence = NondeterminismError("(result)", f"result {recorded!r}", f"result {replayed!r}")

    def _stuck(self) -> NondeterminismError:
        """The divergence when workflow code is idle and a recorded call is still unreached."""
        resolutions = self.replayer.resolutions
        next_outcome = resolutions[self._cursor] if self._cursor < len(resolutions) else None
        if next_outcome is None or (next_outcome in self._calls and not self.replayer.made_before(next_outcome)):
            missing = self.replayer.first_unvisited()  # a call recorded before the next outcome
        else:
            missing = next_outcome
        assert missing is not None
        pending = self._calls.get(missing)
        if pending is not None and not pending.future.done():
            return NondeterminismError(
                missing, recorded=f"that the workflow stopped waiting for {missing} here (it cancelled the call)",
                called="code that still waits for it and for nothing else",
                detail="whatever cancelled the call (a timeout, a sibling) no longer does")
        root = self._root
        if root is not None and root.done():
            # (what the code did instead, with its exception: the cause of a divergence that a change of code made)
            exc = None if root.cancelled() else root.exception()
            doing = (WORKFLOW_CANCELLED if root.cancelled() else
                     f"the workflow raised {describe(exc)}{_raised_at(exc)}" if exc is not None
                     else "the workflow had returned")
        else:
            waiting = [c.key for c in self._open if not c.future.done()]
            doing = f"the workflow waits for {', '.join(waiting[:3])}" if waiting else "the workflow is blocked"
        return self.replayer.missing(missing, f"no call to it: {doing}")


def _raised_at(exc: BaseException) -> str:
    """`` (at file.py:12 in fn)``: where ``exc`` was raised, its traceback's last frame; empty if it has none."""
    import os.path
    import traceback

    try:
        frames = traceback.extract_tb(exc.__traceback__)
    except Exception:  # noqa: BLE001 - an odd traceback: say nothing of where
        return ""
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"


#: how the reason of a run whose workflow code raised begins, and the reason of one whose workflow task was
#: cancelled (see Execution._finish_root)
WORKFLOW_RAISED = "workflow raised "
WORKFLOW_CANCELLED = "the workflow's task was cancelled"
#: how the reason of a run failed because its workflow could never go on begins (see Execution._suspend)
WORKFLOW_BLOCKED = "the workflow is blocked on something that is not a runifold call"


def _clipped_result(value: Any) -> str:
    """A workflow's result as a divergence shows it (a value it could not record, by its type)."""
    try:
        return clipped(msgspec.to_builtins(value))
    except (TypeError, ValueError, msgspec.MsgspecError):
        return f"a value of type {type(value).__name__}"


def clipped(value: Any, limit: int = 80) -> str:
    """A recorded value as a divergence shows it: its JSON text, cut short."""
    text = repr(value) if isinstance(value, float) else msgspec.json.encode(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_text(type_: Any) -> str:
    """An annotation as code writes it: ``int``, ``list[str]``, ``Order``."""
    return type_.__name__ if isinstance(type_, type) else repr(type_).replace("typing.", "")


def _moved(failed: RunFailed | None, root: asyncio.Task[Any]) -> str:
    """Where the replay raised an exception of another class than the live run with the same text (the class
    moved to another module, say), what the divergence adds: both classes by their qualified names, which it
    compares (helper-95: both sides read alike)."""
    if failed is None or root.cancelled() or not failed.reason.startswith(WORKFLOW_RAISED):
        return ""
    raised = type_name(root.exception())  # type: ignore[arg-type]
    if raised == failed.error_type or raised.rpartition(".")[2] != failed.error_type.rpartition(".")[2]:
        return ""
    return (f"the live run raised {failed.error_type}, the replay {raised}: an exception's class is compared by its "
            f"module and qualified name, so a class moved elsewhere is another class; define it where it was, or "
            f"register the change as a new version")
