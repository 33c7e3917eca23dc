"""``@workflow``, ``@step`` and ``@effect``.

Decorators validate eagerly and attach a frozen spec; they never register
anything globally. A step or effect called from workflow code is routed to the
run's driver; called anywhere else it simply runs its body.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, overload

from runifold.dsl._context import current
from runifold.dsl._definition import (
    WORKFLOW_ATTR,
    EffectSpec,
    Evidence,
    ResumePolicy,
    RetryPolicy,
    StepSpec,
    WorkflowSpec,
    _ReturnType,
    check_annotations,
    positional_params,
)
from runifold.errors import ConfigurationError, OutsideWorkflowError
from runifold.history import MAX_VERSION, is_version

P = ParamSpec("P")
R = TypeVar("R")

_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
STEP_ATTR = "__runifold_step__"


def _check_async(fn: Callable[..., Any], what: str) -> None:
    if not inspect.iscoroutinefunction(fn):
        raise ConfigurationError(f"@{what} needs an `async def` function, got {fn!r}")


def _check_callable(fn: Callable[..., Any], what: str) -> None:
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise ConfigurationError(
            f"@{what} {getattr(fn, '__name__', fn)!r} is a generator function (it uses `yield`); a {what} records "
            "one value: return a list of the items instead")
    if not callable(fn):
        raise ConfigurationError(f"@{what} needs an `async def` or a plain `def` function, got {fn!r}")


def _may_be_context(annotation: Any) -> bool:
    """Whether a first parameter annotated so can be the WorkflowContext (unannotated, or annotated as it)."""
    from runifold.dsl._context import WorkflowContext

    if annotation is inspect.Parameter.empty or annotation is Any or annotation is WorkflowContext:
        return True
    # postponed annotations are strings: the class's name, however it was imported
    return isinstance(annotation, str) and annotation.rpartition(".")[2] in ("WorkflowContext", "Any")


def _check_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise ConfigurationError(
            f"{what} id {value!r} is invalid; use letters, digits, '_', '.', '-', starting with a letter or '_'"
        )
    return value


def _check_options(what: str, retry: Any, timeout: Any) -> None:
    """The options every durable call takes: a RetryPolicy and a positive timedelta, refused clearly otherwise."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"{what} retry= takes a RetryPolicy (e.g. RetryPolicy(max_attempts=5)), got {retry!r}")
    if timeout is not None and not isinstance(timeout, timedelta):
        raise ConfigurationError(f"{what} timeout= takes a timedelta (e.g. timedelta(seconds=30)), got {timeout!r}")
    if timeout is not None and timeout <= timedelta(0):
        raise ConfigurationError(f"{what} timeout must be positive, got {timeout}")


def _no_bare_use(fn: Any, what: str, example: str) -> None:
    if fn is not None:
        raise ConfigurationError(f"@{what} is used with parentheses: write {example} above the function")


def workflow(name: str, *, version: int = 1) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Declare an ``async def`` as workflow ``name`` at ``version``.

    The function takes a :class:`WorkflowContext` first, then its input as
    keyword-compatible parameters. It is returned unchanged, with its spec
    attached; hand it to a :class:`WorkflowDefinition` to register it.
    """
    if callable(name):
        raise ConfigurationError('@workflow takes the workflow\'s name: write @workflow("order-intake", version=1) '
                                 "above the function")
    _check_id(name, "workflow")
    if not is_version(version):
        raise ConfigurationError(f"workflow version must be a whole number from 1 to {MAX_VERSION:,}, got {version!r}")

    def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        _check_async(fn, "workflow")
        earlier = getattr(fn, WORKFLOW_ATTR, None)
        if isinstance(earlier, WorkflowSpec) and earlier.fn is fn:  # (a functools.wraps wrapper is another function)
            # the spec lives on the function: decorating it again would relabel the first workflow too
            fname = getattr(fn, "__name__", "fn")
            raise ConfigurationError(
                f"{fname} is workflow {earlier.name!r} version {earlier.version} already; a function is one "
                f"workflow version: for {name!r} version {version}, decorate another function (it may call this "
                f"one: return await {fname}(ctx, ...))")
        params = positional_params(fn, 0)
        if not params or not _may_be_context(inspect.signature(fn).parameters[params[0]].annotation):
            raise ConfigurationError(
                f"workflow {name!r} must take the WorkflowContext as its first parameter, then its input, e.g. "
                f"async def {getattr(fn, '__name__', 'fn')}(ctx: WorkflowContext, order_id: str)")
        check_annotations(fn, "workflow", params[1:])
        setattr(fn, WORKFLOW_ATTR, WorkflowSpec(name, version, fn, params[1:]))
        return fn

    return decorate


class StepDecorator(Protocol):
    """What ``@step(...)`` returns: it takes an ``async def`` or a plain ``def``; either is awaited."""

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]: ...


def step(
    fn: None = None, /, *, id: str | None = None, retry: RetryPolicy | None = None, requires: str | None = None,
    timeout: timedelta | None = None,
) -> StepDecorator:
    """Declare a durable step: its result is recorded and never recomputed on replay.

    The body is an ``async def``, or a plain ``def`` that runs in a worker
    thread (the run's lease is renewed meanwhile); from workflow code either is
    awaited.

    Args:
        id: the step's stable id in histories (default: the function's name).
            Treat it like a database column name: renaming it breaks running workflows.
        retry: retry policy for exceptions the body raises (default: 3 attempts).
        requires: a capability the workflow definition must be granted.
        timeout: the longest one attempt may take; it then fails with
            ``TimeoutError`` and is retried by ``retry`` (a plain ``def`` body's thread
            cannot be stopped: it finishes in the background and its result is dropped).
    """
    _no_bare_use(fn, "step", "@step() (or @step(retry=RetryPolicy(...)))")
    _check_options("step", retry, timeout)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
        _check_callable(fn, "step")
        check_annotations(fn, "step")
        spec = StepSpec(_check_id(fn.__name__ if id is None else id, "step"), fn, retry or RetryPolicy(), requires, _ReturnType(fn),
                        timeout)
        plain = not inspect.iscoroutinefunction(fn)

        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> Any:
            binding = current.get()
            if binding is None:
                _not_on_a_workflow_loop(spec.id)
                return fn(*args, **kwargs) if plain else await fn(*args, **kwargs)
            return await binding.driver.call_step(spec, binding.scope, args, kwargs)

        setattr(call, STEP_ATTR, spec)
        return call

    return decorate


def _not_on_a_workflow_loop(step_id: str) -> None:
    """A step called without a run is a plain call of its body (a test, another step's body), but not on a
    workflow's loop: there it is workflow code that lost its run (a task made where no run's code was running),
    and its body would run unrecorded."""
    if getattr(asyncio.events._get_running_loop(), "runs_workflow_code", False):
        raise OutsideWorkflowError(
            f"step {step_id!r} was called on a workflow's event loop from a task that belongs to no run's code "
            "(made where workflow code was not running), so it could not be recorded; make the call from the "
            "workflow function or the tasks it creates")


def effect(
    fn: None = None,
    /,
    *,
    id: str | None = None,
    resume: ResumePolicy = ResumePolicy.RECONCILE,
    reconcile: Callable[..., Awaitable[Evidence]] | None = None,
    retry: RetryPolicy | None = None,
    requires: str | None = None,
    timeout: timedelta | None = None,
) -> Callable[[Callable[Concatenate[str, P], Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Declare an effect: a call to the outside world whose outcome may be unknown.

    The body receives the effect's idempotency key first, then the caller's
    arguments; ``reconcile`` (required for ``RECONCILE``) receives the same and
    returns :class:`Evidence`. A ``TimeoutError``, ``ConnectionError`` or
    :class:`EffectOutcomeUnknown` from the body, or passing ``timeout``, makes the
    outcome *unknown* and goes through ``resume``; any other exception is a
    definite failure and goes through ``retry``.
    """
    _no_bare_use(fn, "effect", "@effect(resume=ResumePolicy.REPEAT) (or another resume policy)")
    if not isinstance(resume, ResumePolicy):
        raise ConfigurationError(f"resume must be a ResumePolicy, got {resume!r}")
    if resume is ResumePolicy.RECONCILE and reconcile is None:
        raise ConfigurationError(
            "an effect with ResumePolicy.RECONCILE needs reconcile=<async function returning Evidence>; "
            "or choose ResumePolicy.REPEAT (idempotent by key) or ResumePolicy.MANUAL"
        )
    if reconcile is not None and resume is not ResumePolicy.RECONCILE:
        raise ConfigurationError(f"reconcile= is asked only by ResumePolicy.RECONCILE; with {resume} it would never "
                                 "be called: choose ResumePolicy.RECONCILE, or leave reconcile= out")
    if reconcile is not None:
        _check_async(reconcile, "effect reconcile")
    _check_options("effect", retry, timeout)

    def decorate(fn: Callable[Concatenate[str, P], Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        _check_async(fn, "effect")
        if not positional_params(fn, 0):
            raise ConfigurationError(f"effect {fn.__name__!r} must take the idempotency key as its first parameter")
        check_annotations(fn, "effect")
        spec = EffectSpec(
            _check_id(fn.__name__ if id is None else id, "effect"), fn, resume, reconcile, retry or RetryPolicy(),
            requires, timeout, _ReturnType(fn),
        )

        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            binding = current.get()
            if binding is None:
                raise ConfigurationError(
                    f"effect {spec.id!r} was called outside a workflow; effects need a run to derive "
                    "their idempotency key from. Call the undecorated body directly in tests"
                )
            result: R = await binding.driver.call_effect(spec, binding.scope, args, kwargs)
            return result

        setattr(call, STEP_ATTR, spec)
        return call

    return decorate


class EffectOutcomeUnknown(Exception):
    """Raise from an effect body when it cannot tell whether the call took effect."""

    __module__ = "runifold"  # recorded as runifold.EffectOutcomeUnknown, the name users import
