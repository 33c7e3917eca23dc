"""Every exception runifold raises, in one tree.

::

    RunifoldError
    ├── ConfigurationError        a value type or decorator argument is invalid
    ├── RegistrationError         duplicate (name, version) in a registry
    ├── UnknownWorkflowError      a task names a workflow nobody registered
    ├── InvalidInputError         a task's input does not fit the workflow's signature
    ├── EnqueueConflictError      checkpoint id reused with a different task
    ├── RunNotFoundError          no run with that id or checkpoint id
    ├── ScheduleNotFoundError     no schedule with that name
    ├── InvalidStateError         the operation does not fit the run's state
    │   └── OutsideWorkflowError  a WorkflowContext method called outside workflow code
    ├── LeaseLostError            a commit or renewal was fenced off
    ├── NondeterminismError       code and recorded history disagree
    ├── SerializationError        a value cannot be encoded or a row cannot be decoded
    ├── StoreError                the store's driver failed (translated at the boundary)
    │   └── StoreUnavailableError the store could not be reached or stayed busy
    ├── SignalRejectedError       a signal failed authentication, freshness, limits or scope
    │   └── SignalConflictError   a signal id was reused with another payload
    ├── RunFailedError            a run you await failed or was cancelled (RunHandle.result)
    ├── RunFailure                why a run was failed by the engine
    │   ├── BudgetExceededError
    │   └── CapabilityDeniedError
    └── WorkflowError             raised *inside* workflow code; catch it there
        ├── StepFailedError       a step exhausted its retry policy
        ├── EffectFailedError     an effect failed definitely or an operator failed it
        ├── ChildFailedError      a child workflow failed or was cancelled
        └── WaitTimeoutError      a signal did not arrive before its timeout

Every message says what to do next. Exceptions carry their facts as attributes,
so callers never parse messages.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "CapabilityDeniedError",
    "ChildFailedError",
    "ConfigurationError",
    "EffectFailedError",
    "EnqueueConflictError",
    "InvalidInputError",
    "InvalidStateError",
    "LeaseLostError",
    "NondeterminismError",
    "OutsideWorkflowError",
    "RegistrationError",
    "RunFailedError",
    "RunFailure",
    "RunNotFoundError",
    "RunifoldError",
    "ScheduleNotFoundError",
    "SerializationError",
    "SignalConflictError",
    "SignalRejectedError",
    "StepFailedError",
    "StoreError",
    "StoreUnavailableError",
    "UnknownWorkflowError",
    "WaitTimeoutError",
    "WorkflowError",
]


class RunifoldError(Exception):
    """Base of every error runifold raises."""


class ConfigurationError(RunifoldError, ValueError):
    """A value type, decorator or option was given an invalid value."""


class RegistrationError(RunifoldError):
    """A definition cannot be registered (for example, a duplicate version)."""


class UnknownWorkflowError(RunifoldError):
    """A task names a (name, version) that the registry does not hold."""

    def __init__(self, name: str, version: int, known: list[tuple[str, int]]) -> None:
        self.name = name
        self.version = version
        self.known = known
        listing = ", ".join(f"{n} v{v}" for n, v in known) or "none"
        super().__init__(
            f"no workflow {name!r} version {version} is registered (registered: {listing}); "
            "register its WorkflowDefinition or fix the task's name and version"
        )


class InvalidInputError(RunifoldError):
    """A task's input cannot be passed to the workflow function."""


class EnqueueConflictError(RunifoldError):
    """A checkpoint id already names a run of a different task."""

    def __init__(self, checkpoint_id: str, run_id: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.run_id = run_id
        super().__init__(
            f"checkpoint id {checkpoint_id!r} already names run {run_id} with a different "
            "name, version, input or parent; use a new checkpoint id for a new run"
        )


class RunNotFoundError(RunifoldError):
    """No run has the given run id or checkpoint id."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        super().__init__(f"no run with id or checkpoint id {ref!r}; list runs with `runifold runs list`")


class ScheduleNotFoundError(RunifoldError):
    """No schedule has the given name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no schedule named {name!r}; list schedules with `runifold schedule list`")


class InvalidStateError(RunifoldError):
    """The operation does not apply to the run in its current state."""


class OutsideWorkflowError(InvalidStateError):
    """A ``WorkflowContext`` method was called outside workflow code (from a step or effect body, say).

    A body that raises it fails for good, without retries: another attempt would raise the same.
    """


#: why a commit was refused for good: the run is no more to be continued by anyone (see :class:`LeaseLostError`)
RUN_GONE = "the run no longer exists"
RUN_CANCELLED = "the run was cancelled"


class LeaseLostError(RunifoldError):
    """The worker no longer holds the run's lease; nothing was written."""

    def __init__(self, run_id: str, detail: str = "") -> None:
        self.run_id = run_id
        ended = detail in (RUN_GONE, RUN_CANCELLED)
        super().__init__(
            f"lease on run {run_id} was lost{': ' + detail if detail else ''}; "
            f"nothing was written{'' if ended else ', another worker may continue the run'}"
        )


class NondeterminismError(RunifoldError):
    """Workflow code no longer matches the history recorded for the run."""

    def __init__(self, key: str, recorded: str, called: str, detail: str = "") -> None:
        self.key = key
        self.recorded = recorded
        self.called = called
        self.detail = detail
        super().__init__(
            f"workflow code diverges from its history at key {key!r}: history recorded "
            f"{recorded}, code called {called}{'; ' + detail if detail else ''}. Restore the "
            "previous code for running workflows or register the change as a new version; if the code did "
            "not change, it is not deterministic: use ctx.now(), ctx.uuid() and ctx.random() instead of the "
            "clock and the random and uuid modules, and iterate in a fixed order"
        )


class SerializationError(RunifoldError):
    """A value cannot be encoded for the log, or a stored row cannot be decoded."""


class StoreError(RunifoldError):
    """The store's database driver reported an error."""


class StoreUnavailableError(StoreError):
    """The store could not be reached, or stayed busy past its retry budget."""


class SignalRejectedError(RunifoldError):
    """A signal was refused; no run state changed."""

    def __init__(self, verdict: str, reason: str) -> None:
        self.verdict = verdict
        self.reason = reason
        super().__init__(f"signal rejected ({verdict}): {reason}")


class SignalConflictError(SignalRejectedError):
    """A signal id already names another signal for this run (another name, payload, sender or reason)."""

    def __init__(self, run_id: str, signal_id: str) -> None:
        self.run_id = run_id
        self.signal_id = signal_id
        super().__init__(
            "conflict",
            f"signal id {signal_id!r} was already used for run {run_id} with a different name, payload, sender "
            f"or reason (`runifold audit {run_id}` says which); a signal id names one signal: use a new id for a "
            "new signal",
        )


class RunFailedError(RunifoldError):
    """The run whose result you awaited failed or was cancelled."""

    def __init__(self, run_id: str, status: str, reason: str, *, error_type: str = "", traceback: str = "") -> None:
        self.run_id = run_id
        self.status = status
        self.reason = reason
        #: the exception that ended the run (qualified class name), and its bounded traceback, if one did
        self.error_type = error_type
        self.traceback = traceback
        super().__init__(f"run {run_id} {status}: {reason}")


class RunFailure(RunifoldError):
    """The engine failed a run on purpose (budget, capability)."""


class BudgetExceededError(RunFailure):
    """A run exceeded one of its budget's limits."""

    def __init__(self, limit: str, used: float, allowed: float, reached: str | None = None) -> None:
        self.limit = limit
        self.used = used
        self.allowed = allowed
        if reached is None:
            reached = (f"would reach {used:g}, the budget allows {allowed:g}" if used > allowed
                       else f"reached {used:g}, all the budget allows, and the run needed more")
        super().__init__(f"budget exceeded: {limit} {reached}; raise the Budget of this definition or split the work")

    @staticmethod
    def limit_in(reason: str) -> str | None:
        """The limit a failed run's recorded reason names (``"retries"``, ...), or None if it is no budget's."""
        for limit in ("steps", "effect attempts", "retries", "recoveries", "cost units", "elapsed seconds"):
            if reason.startswith(f"budget exceeded: {limit} "):
                return limit
        return None

    @classmethod
    def elapsed(cls, used: float, allowed: float) -> BudgetExceededError:
        """The run's elapsed budget ran out (time is not spent by a call: it runs out)."""
        return cls("elapsed seconds", used, allowed,
                   f"ran out: {used:.1f} s since the run started, the budget allows {allowed:g}")


class CapabilityDeniedError(RunFailure):
    """A step or effect requires a capability the definition was not granted."""

    def __init__(self, key: str, capability: str) -> None:
        self.key = key
        self.capability = capability
        super().__init__(
            f"{key} requires capability {capability!r}, which this workflow definition is not "
            "granted; add it to the definition's CapabilitySet"
        )


class WorkflowError(RunifoldError):
    """Raised inside workflow code; the workflow may catch it."""


class StepFailedError(WorkflowError):
    """A step failed on every attempt its retry policy allowed."""

    def __init__(self, key: str, error: str, attempts: int, error_type: str = "") -> None:
        self.key = key
        self.error = error
        self.attempts = attempts
        #: the qualified class name of the exception the step's last attempt raised
        self.error_type = error_type
        super().__init__(f"step {key} failed after {attempts} attempt(s): {error}")


class EffectFailedError(WorkflowError):
    """An effect failed definitely, or an operator resolved it as failed."""

    def __init__(self, key: str, reason: str, error_type: str = "") -> None:
        self.key = key
        self.reason = reason
        #: the qualified class name of the exception the effect's last attempt raised ("" when an operator
        #: resolved it as failed)
        self.error_type = error_type
        super().__init__(f"effect {key} failed: {reason}")


class ChildFailedError(WorkflowError):
    """A child workflow run failed or was cancelled."""

    def __init__(self, run_id: str, status: str, reason: str, error_type: str = "") -> None:
        self.run_id = run_id
        self.status = status
        self.reason = reason
        self.error_type = error_type
        super().__init__(f"child run {run_id} {status}: {reason}")


class WaitTimeoutError(WorkflowError):
    """A signal wait reached its timeout before the signal arrived."""

    def __init__(self, key: str, name: str) -> None:
        self.key = key
        self.name = name
        super().__init__(f"no {name!r} signal arrived before the timeout of wait {key}")


#: the longest error text recorded: a longer one keeps its start and says how long it was (helper-95: a 3 MB
#: message was written whole into each failed attempt and the run's reason)
MAX_ERROR_TEXT = 8_000


def describe(exc: BaseException) -> str:
    """Return ``Type: message`` for recording an exception in the history (always recordable text: see
    :func:`recordable`), at most :data:`MAX_ERROR_TEXT` characters and a note."""
    try:
        message = str(exc)
    except Exception as err:  # an exception whose __str__ raises is still a failure to record
        message = f"<its message could not be read: {type(err).__name__}>"
    text = f"{type(exc).__name__}: {message}"
    if len(text) > MAX_ERROR_TEXT:
        text = f"{text[:MAX_ERROR_TEXT]}... [{len(text):,} characters; the rest is not recorded]"
    return recordable(text)


def recordable(text: str) -> str:
    """``text`` with what is not valid Unicode (lone surrogates, as ``os.fsdecode`` makes of undecodable bytes)
    written as ``\\udcff`` escapes: an error's text is recorded whatever it holds, so the failure it describes
    is handled as one (retried, caught) rather than failing the run for an unrecordable event."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def type_name(exc: BaseException | type[BaseException]) -> str:
    """Return the qualified class name of ``exc`` (an exception or its class: ``module.Class``), as failure events
    record it."""
    cls = exc if isinstance(exc, type) else type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


#: the most characters of a traceback a failure event keeps (its last lines: where it was raised)
TRACEBACK_CHARS = 4000


def traceback_of(exc: BaseException) -> str:
    """Return the traceback of ``exc`` as text, cut to its last ``TRACEBACK_CHARS`` characters."""
    import traceback

    try:
        text = recordable("".join(traceback.format_exception(exc)).rstrip())
    except BaseException as err:  # noqa: BLE001 - its attributes raise (even CancelledError), synchronously: still a failure
        return f"<its traceback could not be read: {type(err).__name__}>"
    if len(text) > TRACEBACK_CHARS:
        text = "...\n" + text[-TRACEBACK_CHARS:].split("\n", 1)[-1]
    return text

