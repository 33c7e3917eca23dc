"""Frozen specifications attached by the decorators, and the definition types."""

from __future__ import annotations

import enum
import inspect
import math
import random
import re
import typing
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, final

from runifold.dsl._concurrency import ConcurrencyLimit
from runifold.errors import ConfigurationError, SerializationError
from runifold.history import CHILD_SIGNAL_PREFIX, Verdict, annotation_problem

WORKFLOW_ATTR = "__runifold_workflow__"


_SIGNAL_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")


def check_signal_name(name: str) -> str:
    """Validate a signal name (it becomes part of call keys and is schema)."""
    if not isinstance(name, str) or not _SIGNAL_NAME.match(name):
        raise ConfigurationError(
            f"invalid signal name {name!r}: use 1-100 letters, digits and '_.:-' (for example 'approval')"
        )
    if name.startswith(CHILD_SIGNAL_PREFIX):
        raise ConfigurationError(
            f"invalid signal name {name!r}: names starting with {CHILD_SIGNAL_PREFIX!r} are reserved for the results "
            "of child runs (await the child's handle instead)")
    return name


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ConfigurationError(f"{name} must be positive, got {value!r}")


@final
@dataclass(frozen=True)
class RetryPolicy:
    """How often a failing step or effect is tried, and how long to back off.

    Attempt ``n`` (``n >= 2``) waits ``initial * factor ** (n - 2)``, capped at
    ``maximum`` and spread by ``±jitter`` (a fraction). The run is rescheduled
    for that time; no worker sleeps. An exception that is an instance of one of
    ``non_retryable`` (classes, e.g. ``(CardDeclined, TypeError)``) fails the
    call at once, whatever attempts are left (an effect's unknown outcome is
    not a failure: its resume policy decides).
    """

    max_attempts: int = 3
    initial: timedelta = timedelta(seconds=1)
    factor: float = 2.0
    maximum: timedelta = timedelta(minutes=5)
    jitter: float = 0.2
    non_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        given = self.non_retryable
        classes = (given,) if isinstance(given, type) else tuple(given) if isinstance(given, (tuple, list)) else None
        if classes is None or not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
            raise ConfigurationError(f"RetryPolicy.non_retryable takes exception classes, e.g. (CardDeclined, "
                                     f"TypeError), got {given!r}")
        object.__setattr__(self, "non_retryable", classes)
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool):
            raise ConfigurationError(f"RetryPolicy.max_attempts takes an int, got {self.max_attempts!r}")
        for name in ("initial", "maximum"):
            if not isinstance(getattr(self, name), timedelta):
                raise ConfigurationError(f"RetryPolicy.{name} takes a timedelta (e.g. timedelta(seconds=2)), "
                                         f"got {getattr(self, name)!r}")
        for name in ("factor", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigurationError(f"RetryPolicy.{name} takes a finite number, got {value!r}")
        if self.max_attempts < 1:
            raise ConfigurationError(f"RetryPolicy.max_attempts must be at least 1, got {self.max_attempts}")
        if self.initial < timedelta(0) or self.maximum < timedelta(0) or self.factor < 1:
            raise ConfigurationError("RetryPolicy needs initial, maximum >= 0 and factor >= 1")
        if not 0 <= self.jitter < 1:
            raise ConfigurationError(f"RetryPolicy.jitter must be in [0, 1), got {self.jitter}")

    def backoff(self, next_attempt: int, rng: random.Random | None = None) -> float:
        """Return the delay in seconds before ``next_attempt``: ``initial`` times ``factor`` for each attempt
        before it, with ``jitter``, never over ``maximum``."""
        cap, initial = self.maximum.total_seconds(), self.initial.total_seconds()
        try:
            base = min(initial * self.factor ** max(0, next_attempt - 2), cap)
        except OverflowError:  # far past the cap (attempt 1,100 at factor 2), unless there is nothing to grow
            base = cap if initial > 0 else 0.0
        delay = max(0.0, base * (1 + (rng or random).uniform(-self.jitter, self.jitter)))
        # past the cap, the jitter is reflected below it: backoffs at the cap spread over [cap - jitter, cap]
        # instead of piling up at exactly the cap (retries of many runs in step again)
        return cap - (delay - cap) if delay > cap else delay


class ResumePolicy(enum.StrEnum):
    """What recovery does with an effect that started and never completed."""

    REPEAT = "repeat"
    RECONCILE = "reconcile"
    MANUAL = "manual"


@final
@dataclass(frozen=True)
class Evidence:
    """What a reconcile function found outside: applied, not applied, or unknown."""

    verdict: str
    result: Any = None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in tuple(Verdict):
            raise ConfigurationError(f"Evidence takes the verdict 'applied', 'not_applied' or 'unknown' (make it with "
                                     f"Evidence.applied(result), Evidence.not_applied() or Evidence.unknown(why)), "
                                     f"got {self.verdict!r}")

    @classmethod
    def applied(cls, result: Any, detail: str = "") -> Evidence:
        """The effect took place; ``result`` is what its body would have returned."""
        return cls("applied", result, detail)

    @classmethod
    def not_applied(cls, detail: str = "") -> Evidence:
        """The effect certainly did not take place; it is safe to run it."""
        return cls("not_applied", None, detail)

    @classmethod
    def unknown(cls, detail: str = "") -> Evidence:
        """No evidence either way; the effect becomes ambiguous."""
        return cls("unknown", None, detail)


@final
@dataclass(frozen=True)
class Budget:
    """Limits on what one run may consume. ``None`` means unlimited.

    Defaults: 10,000 live step executions, 1,000 effect attempts, 1,000
    retries, 100 recoveries, unlimited cost units and elapsed time.

    A *recovery* is a claim that takes the run over from a worker whose lease
    expired while it ran the workflow (it crashed, froze or lost the store).
    Whatever that worker was executing runs again, so each recovery also
    counts as one step execution: a step that crashes its worker every time
    exhausts ``max_steps`` or ``max_recoveries`` instead of looping forever.
    """

    max_steps: int | None = 10_000
    max_effect_attempts: int | None = 1_000
    max_retries: int | None = 1_000
    max_recoveries: int | None = 100
    max_cost_units: float | None = None
    max_elapsed: timedelta | None = None

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_effect_attempts", "max_retries", "max_recoveries", "max_cost_units"):
            _positive(f"Budget.{name}", getattr(self, name))
        if self.max_elapsed is not None:
            _positive("Budget.max_elapsed", self.max_elapsed.total_seconds())


@final
class CapabilitySet:
    """The capabilities a workflow definition is granted (``"payments"``, ...)."""

    __slots__ = ("_names",)

    def __init__(self, *names: str) -> None:
        for name in names:
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"capability names are non-empty strings, got {name!r}")
        self._names = frozenset(names)

    def allows(self, name: str) -> bool:
        """Tell whether ``name`` is granted."""
        return name in self._names

    def __iter__(self) -> typing.Iterator[str]:
        return iter(sorted(self._names))

    def __repr__(self) -> str:
        return f"CapabilitySet({', '.join(repr(n) for n in self)})"


@dataclass(frozen=True)
class _ReturnType:
    """The annotated return type of a function, resolved on first use."""

    fn: Callable[..., Any]
    cache: dict[str, Any] = field(default_factory=dict, compare=False)

    def get(self) -> Any:
        """The type, resolved on first use.

        Raises:
            SerializationError: no value can be decoded to it (see :func:`check_annotations`), so the call fails
                before its body runs.
        """
        if "t" not in self.cache:
            try:
                hints = typing.get_type_hints(self.fn)
            except Exception:  # unresolved forward references: decode as plain data
                hints = {}
            self.cache["t"] = hints.get("return", Any)
            self.cache["why"] = annotation_problem(self.cache["t"])
        if self.cache["why"] is not None:
            name = getattr(self.fn, "__qualname__", self.fn)
            raise SerializationError(f"{name} cannot return a value runifold records: {self.cache['why']}")
        return self.cache["t"]


def check_annotations(fn: Callable[..., Any], what: str, params: Collection[str] = ()) -> None:
    """Refuse, as ``fn`` is decorated, an annotation no value can be decoded to: its return's, and those of
    ``params`` (a workflow's input). One Python cannot resolve yet (a class defined further down) is checked when
    the call is first made."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return
    for name in ("return", *params):
        why = annotation_problem(hints.get(name, Any))
        if why is not None:
            where = "return a value runifold records" if name == "return" else f"take its parameter {name!r}"
            raise ConfigurationError(f"{what} {getattr(fn, '__name__', fn)!r} cannot {where}: {why}")


@final
@dataclass(frozen=True)
class StepSpec:
    """A step as declared by ``@step``."""

    id: str
    fn: Callable[..., Any]
    retry: RetryPolicy
    requires: str | None
    returns: _ReturnType
    timeout: timedelta | None = None


@final
@dataclass(frozen=True)
class EffectSpec:
    """An effect as declared by ``@effect``."""

    id: str
    fn: Callable[..., Awaitable[Any]]
    resume: ResumePolicy
    reconcile: Callable[..., Awaitable[Evidence]] | None
    retry: RetryPolicy
    requires: str | None
    timeout: timedelta | None
    returns: _ReturnType


@final
@dataclass(frozen=True)
class WorkflowSpec:
    """A workflow as declared by ``@workflow``."""

    name: str
    version: int
    fn: Callable[..., Awaitable[Any]]
    params: tuple[str, ...]
    _types: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    returns: _ReturnType = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "returns", _ReturnType(self.fn))

    def param_types(self) -> dict[str, Any]:
        """Return the annotated type of each input parameter (``Any`` if none), resolved once."""
        if not self._types and self.params:
            try:
                hints = typing.get_type_hints(self.fn)
            except Exception:  # unresolved forward references: accept plain data
                hints = {}
            self._types.update({p: hints.get(p, Any) for p in self.params})
        return self._types

@final
class WorkflowDefinition:
    """An exact ``(name, version)`` of a workflow with its budget and capabilities.

    Args:
        fn: an ``async def`` decorated with ``@workflow``.
        budget: limits for each run.
        capabilities: what its steps and effects may do.
        signals: for each signal name the workflow accepts, the senders allowed
            to send it (``"*"`` admits any authenticated sender).
        concurrency: the concurrency key and limit given to the runs of this
            definition that are validated or started through code that knows it
            (``WorkflowRegistry.validate``, ``Client.start``, the CLI, schedules).
    """

    __slots__ = ("budget", "capabilities", "fn", "signals", "spec", "concurrency")

    def __init__(
        self,
        fn: Callable[..., Awaitable[Any]],
        budget: Budget | None = None,
        capabilities: CapabilitySet | None = None,
        *,
        signals: Mapping[str, Collection[str]] | None = None,
        concurrency: ConcurrencyLimit | None = None,
    ) -> None:
        spec = getattr(fn, WORKFLOW_ATTR, None)
        if not isinstance(spec, WorkflowSpec):
            raise ConfigurationError(
                f"{getattr(fn, '__qualname__', fn)!r} is not a workflow; decorate it with "
                "@workflow(name, version)"
            )
        self.fn = fn
        self.spec = spec
        self.budget = budget or Budget()
        self.capabilities = capabilities or CapabilitySet()
        self.signals: dict[str, frozenset[str]] = {
            check_signal_name(name): frozenset(senders) for name, senders in (signals or {}).items()
        }
        if concurrency is not None and not isinstance(concurrency, ConcurrencyLimit):
            raise ConfigurationError(f"concurrency must be a ConcurrencyLimit, e.g. ConcurrencyLimit(3), got {concurrency!r}")
        self.concurrency = concurrency

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def version(self) -> int:
        return self.spec.version

    def allows_signal(self, name: str, sender: str) -> bool:
        """Tell whether ``sender`` may send signal ``name`` to runs of this definition."""
        senders = self.signals.get(name)
        return senders is not None and ("*" in senders or sender in senders)

    def __repr__(self) -> str:
        return f"WorkflowDefinition({self.name!r}, version={self.version})"


def positional_params(fn: Callable[..., Any], skip: int) -> tuple[str, ...]:
    """Return the names of ``fn``'s parameters after the first ``skip``."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return tuple(p.name for p in params)
