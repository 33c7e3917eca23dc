"""Operator actions on runs: resolve an ambiguous effect, cancel a run.

Both append to the run's history with who and why, through the store's
``intervene``, which fences off any worker holding the run.
"""

from __future__ import annotations

from typing import Any

from runifold._log import get_logger

from runifold.errors import BudgetExceededError, ConfigurationError, InvalidStateError, RunNotFoundError, type_name
from runifold.history import (
    Ambiguous,
    Checkpoint,
    EffectStarted,
    Entry,
    Failed,
    InDoubt,
    Resolution,
    RunCancelled,
    RunFailed,
    RunRetried,
    RunStarted,
    decode_event,
    effect_state,
    accept,
    fold,
    step_state,
)
from runifold.history import EffectResolved as EffectResolvedEvent
from runifold.stores import UNFINISHED, CommitResult, EventRow, RunInfo, RunStatus, WorkflowStore
from runifold.stores import _rule
from runifold.worker._debug import call_returns
from runifold.worker._registry import WorkflowRegistry

log = get_logger("runifold.admin")
#: the error type run_failed records for a run the engine failed on its budget
_BUDGET_EXCEEDED = type_name(BudgetExceededError)



def _who_and_why(action: str, by: Any, reason: Any) -> None:
    """An operator action names who decided and why, as text: both go into the history."""
    if not (isinstance(by, str) and by and isinstance(reason, str) and reason):
        raise InvalidStateError(f"{action} needs `by` (who) and `reason` (why), as text; both go into the history "
                                f"(got by={by!r}, reason={reason!r})")


async def _history(store: WorkflowStore, run_ref: str) -> list[Entry]:
    return [Entry(e.seq, e.at, decode_event(e.body)) for e in await store.history(run_ref)]


async def resolve_effect(
    store: WorkflowStore,
    registry: WorkflowRegistry | None,
    run_ref: str,
    key: str,
    resolution: Resolution,
    *,
    by: str,
    reason: str,
    output: Any = None,
) -> CommitResult:
    """Settle an ambiguous effect of an unfinished run and make the run claimable again.

    Args:
        registry: the workflows' code: an ``APPLIED`` output is checked against the
            effect's annotated return type (by replaying the run), so a resolution
            can never leave the run unable to continue. ``RETRY`` and ``FAIL`` need
            no code (None).
        run_ref: run id or checkpoint id.
        key: the effect's key as the history shows it (e.g. ``charge_card#1``).
        resolution: ``APPLIED`` (with ``output``, what the effect returned),
            ``RETRY`` (run it again with the same idempotency key) or ``FAIL``
            (the workflow receives ``EffectFailedError``).
        by: who decided (recorded in the history).
        reason: why (recorded in the history).

    Raises:
        InvalidStateError: ``key`` is not an ambiguous effect of the run, or the
            run's history does not replay against the registered code.
        SerializationError: ``output`` does not fit the effect's return type.
        UnknownWorkflowError: the registry lacks the run's ``(name, version)``.
        ConfigurationError: ``APPLIED`` without a registry.
    """
    try:
        resolution = Resolution(resolution)  # (its value, "applied", names it too)
    except ValueError:
        raise ConfigurationError(f"resolution takes a Resolution ({', '.join(f'Resolution.{r.name}' for r in Resolution)}), "
                                 f"got {resolution!r}") from None
    if resolution is Resolution.APPLIED and registry is None:
        raise ConfigurationError("resolving an effect as APPLIED needs the registry: its output is checked against "
                                 "the effect's annotated return type")
    _who_and_why("resolving an effect", by, reason)
    info = await store.get_run(run_ref)
    finished = _rule.intervene_refusal(info.run_id, info.status, UNFINISHED)
    if finished is not None:  # before the effect: a finished run's effects are settled, whatever they were
        raise finished
    history = await _history(store, info.run_id)
    events = [e.event for e in history if e.event.key == key]
    state = effect_state(events)
    if not isinstance(state, Ambiguous):
        ambiguous = sorted(k for k, status in fold(history).pending_effects.items() if status == "ambiguous")
        doubt = (" (it is in doubt: the next worker that takes the run reconciles it by its resume policy, and only an "
                 "effect left ambiguous then waits for `resolve`)") if isinstance(state, InDoubt) else ""
        raise InvalidStateError(
            f"{key!r} is not an ambiguous effect of run {run_ref}{doubt}; ambiguous effects: {ambiguous or 'none'}"
        )
    plain = None
    if resolution is Resolution.APPLIED:
        assert registry is not None
        definition = registry.definition_for(info.name, info.version)
        returns = await call_returns(definition, info.run_id, history, key)
        plain, _ = accept(output, returns, what=f"the resolution of effect {key}")
    event = EffectResolvedEvent(key=key, resolution=resolution, by=by, reason=reason, output=plain)
    # decided on this history: refused if the run moved on meanwhile (another operator resolved it first)
    result = await store.intervene(info.run_id, UNFINISHED, [EventRow.of(event)], RunStatus.READY,
                                   f"effect {key} resolved as {resolution} by {by}: {reason}",
                                   decided_at=history[-1].seq)
    log.info("effect_resolved", run_ref=run_ref, key=key, resolution=str(resolution), by=by)
    return result


async def cancel_run(store: WorkflowStore, run_ref: str, *, by: str, reason: str) -> CommitResult:
    """Cancel an unfinished run, and its unfinished child runs: append ``run_cancelled``, fence off workers.

    Cancelling a run that is already cancelled changes nothing and returns its
    current revision (so a repeated cancel is safe). Its children started with
    ``ctx.start_child`` are cancelled too (with the reason ``parent <run> was
    cancelled: <reason>``), and theirs, and so on.

    Raises:
        InvalidStateError: the run completed or failed.
    """
    _who_and_why("cancelling a run", by, reason)
    info = await store.get_run(run_ref)
    if info.status is RunStatus.CANCELLED:
        return CommitResult(info.revision, info.updated_at)
    event = RunCancelled(by=by, reason=reason)
    result = await store.intervene(info.run_id, UNFINISHED, [EventRow.of(event)], RunStatus.CANCELLED,
                                   f"cancelled by {by}: {reason}")
    log.info("run_cancelled", run_ref=run_ref, by=by)
    for child in (await child_runs(store, fold(await _history(store, info.run_id)))).values():
        if not child.status.finished:
            await cancel_run(store, child.run_id, by=by, reason=f"parent {info.run_id} was cancelled: {reason}")
    return result


async def child_runs(store: WorkflowStore, checkpoint: Checkpoint) -> dict[str, RunInfo]:
    """A run's child runs by the key of the call that started each; a child purged since is left out."""
    found = {}
    for key, run_id in checkpoint.children.items():
        try:
            found[key] = await store.get_run(run_id)
        except RunNotFoundError:
            pass  # purged: it finished, and purge deleted it (the parent's history still names it)
    return found


async def retry_run(store: WorkflowStore, run_ref: str, *, by: str, reason: str) -> CommitResult:
    """Continue a failed run from its history, recording who decided and why.

    Appends ``run_retried`` and makes the run claimable at once. The replay
    returns every recorded result as before; the call whose failure ended the
    run (a step or effect that ran out of attempts), if any, gets another
    attempt. A run that failed in workflow code runs that code again, so deploy
    the fix first (compatible with the history, or the run diverges).

    Raises:
        InvalidStateError: the run has not failed, or its workflow code made
            calls after the failed call's failure reached it (a compensation, a
            cleanup in ``finally``, siblings it cancelled): a replay that gives
            the call another attempt would not make them again; or it made
            calls while handling an error of its own that failed the run.
    """
    _who_and_why("retrying a run", by, reason)
    history = await _history(store, run_ref)
    last = history[-1].event
    if not isinstance(last, RunFailed):
        status = (await store.get_run(run_ref)).status
        raise InvalidStateError(f"run {run_ref} has not failed (it is {status}); only failed runs can be retried")
    if last.handled:
        why = (f"after {last.key} failed, or while handling an error its failure came from, its workflow code made "
               f"more calls (a compensation, a cleanup in finally, siblings it cancelled) before the run failed, and a "
               f"replay in which {last.key} gets another attempt would not make them again, or would hand them their "
               f"recorded results" if last.key else
               "its workflow code made calls while handling the error that failed it (a compensation in an except "
               "block, a cleanup in finally), with the values of the failing code, and a replay of fixed code would "
               "hand those calls their recorded results (or the error was raised where one the code handled with a "
               "call was raised before: docs/operations.md, Failed runs)")
        raise InvalidStateError(f"run {run_ref} cannot be retried: {why}; start a new run instead (enqueue it with "
                                f"another checkpoint id)")
    event = RunRetried(key=last.key, by=by, reason=reason)
    result = await store.intervene(run_ref, {RunStatus.FAILED}, [EventRow.of(event)], RunStatus.READY,
                                   f"retried by {by}: {reason}", decided_at=history[-1].seq)
    log.info("run_retried", run_ref=run_ref, key=last.key, by=by)
    parent = history[0].event.parent_run_id if isinstance(history[0].event, RunStarted) else None
    if parent is not None:
        # a child's end is posted to its parent once, when it first finishes (helper-79)
        log.warning("run_retried_unseen_by_its_parent", run_ref=run_ref, parent_run_id=parent,
                    hint=f"its failure was posted to its parent {parent} when it failed; the parent does not see this "
                         "run's new end: retry the parent's work instead if the parent must see it")
    if last.error_type == _BUDGET_EXCEEDED:
        # usage only grows: retried as it is, the run fails again at once (helper-40), except on its retry budget:
        # an operator's retry is not one of the automatic retries max_retries counts, so the call gets its attempt
        more = "raise the budget and restart the workers"
        if BudgetExceededError.limit_in(last.reason) == "retries":
            hint = (f"{last.key} gets one more attempt; if it fails, the run fails again on its retry budget unless "
                    f"the definition your workers register for its version allows more retries: {more}")
        else:
            hint = f"it fails again at once unless the definition your workers register for its version allows more: {more}"
        log.warning("run_retried_over_budget", run_ref=run_ref, reason=last.reason, hint=hint)
    elif not _attempt_given(history, last.key):
        # no step or effect failure ended the run: its code failed on what its history holds (a signal's payload
        # that does not fit, an error of its own), and replays to the same failure unless the code changed
        log.warning("run_retried_without_a_new_attempt", run_ref=run_ref, reason=last.reason,
                    hint="no call gets another attempt: the run fails again the same way unless the code your workers "
                         "run for its version changed (deploy the fix first); calls made because of the failure that "
                         "the check cannot see (in a TaskGroup sibling's finally, a task a finally woke or a callback "
                         "created, an async generator's finally, a compensation before a new error, between storing an "
                         "error and raising it, an error raised again with a new traceback) return their recorded "
                         "results to the fixed code: if the run made such calls, start a new run instead "
                         "(docs/operations.md, Failed runs)")
    return result


def _attempt_given(history: list[Entry], key: str) -> bool:
    """A retry gives ``key`` another attempt: the run ended on a step's or an effect's final failure (its state is
    ``Failed``, which ``run_retried`` turns into a fresh attempt)."""
    events = [e.event for e in history if key and e.event.key == key]
    effect = any(isinstance(e, EffectStarted) for e in events)
    return isinstance(effect_state(events) if effect else step_state(events), Failed)
