"""The application side: start runs and await their results.

A :class:`Client` wraps a store (and, optionally, the registry, which gives
results their types). ``start`` is idempotent by checkpoint id, as enqueue is;
``RunHandle.result`` waits for the run to finish and returns its output decoded
to the workflow's return annotation, or raises the run's failure.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, final

from runifold.dsl import WorkflowDefinition
from runifold.dsl._definition import WORKFLOW_ATTR, WorkflowSpec
from runifold.errors import ConfigurationError, RunFailedError
from runifold.history import Entry, RunCompleted, RunFailed, convert, decode_event, fold
from runifold.stores import RunInfo, WorkflowStore, WorkflowTask, open_store
from runifold.worker import WorkflowRegistry, cancel_run
from runifold.worker._registry import bind_input, with_concurrency

#: how often ``result()`` looks at a run whose store cannot notify it: from the first interval, doubling to the last
POLL_SECONDS = (0.02, 0.5)


def _spec_of(workflow: Any) -> WorkflowSpec | None:
    if isinstance(workflow, WorkflowDefinition):
        return workflow.spec
    spec = getattr(workflow, WORKFLOW_ATTR, None)
    return spec if isinstance(spec, WorkflowSpec) else None


@final
class RunHandle:
    """A run started (or looked up) through a :class:`Client`."""

    def __init__(self, client: Client, run_id: str, checkpoint_id: str | None, returns: Any) -> None:
        self._client = client
        self.run_id = run_id
        self.checkpoint_id = checkpoint_id
        self._returns = returns

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r}, checkpoint_id={self.checkpoint_id!r})"

    async def status(self) -> RunInfo:
        """The run's row: status, revision, lease, times."""
        return await self._client.store.get_run(self.run_id)

    async def result(self, timeout: float | timedelta | None = None) -> Any:
        """Wait for the run to finish; return its output, decoded to the workflow's return type.

        Args:
            timeout: how long to wait at most, in seconds or as a ``timedelta`` (None: as long as it takes).

        Raises:
            RunFailedError: the run failed or was cancelled (its reason, error type and traceback).
            TimeoutError: ``timeout`` passed first; the run goes on.
            ConfigurationError: ``timeout`` is not a number of seconds, a ``timedelta`` or None.
        """
        store = self._client.store
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or math.isnan(timeout)):
            raise ConfigurationError(
                f"result(timeout=...) takes seconds as a number, a timedelta or None, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = POLL_SECONDS[0]
        while True:
            info = await store.get_run(self.run_id)
            if info.status.finished:
                return await self._outcome(info)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"run {self.run_id} is still {info.status} after {timeout:g} s")
            wait = interval if left is None else min(interval, left)
            finished = getattr(store, "wait_for_finish", None)
            if finished is not None:
                await finished(self.run_id, wait if left is not None else None)
            else:
                await asyncio.sleep(wait)
                interval = min(interval * 2, POLL_SECONDS[1])

    async def _outcome(self, info: RunInfo) -> Any:
        entries = [Entry(e.seq, e.at, decode_event(e.body)) for e in await self._client.store.history(info.run_id)]
        last = entries[-1].event
        if isinstance(last, RunCompleted):
            returns = self._returns or self._client.returns_of(info.name, info.version)
            return convert(last.output, returns, what=f"the result of run {info.run_id}")
        checkpoint = fold(entries)
        failed = last if isinstance(last, RunFailed) else None
        raise RunFailedError(
            info.run_id, info.status, checkpoint.failure or info.reason,
            error_type=failed.error_type if failed else "", traceback=failed.traceback if failed else "",
        )

    async def cancel(self, *, by: str, reason: str) -> None:
        """Cancel the run (a no-op if it is cancelled already); recorded with who and why."""
        await cancel_run(self._client.store, self.run_id, by=by, reason=reason)


def started(workflow: Any, version: int | None) -> tuple[str, int]:
    """The ``(name, version)`` that :meth:`Client.start` starts for ``workflow`` and ``version``."""
    spec = _spec_of(workflow)
    if spec is not None:
        return spec.name, spec.version if version is None else version
    if isinstance(workflow, str):
        if version is None:
            raise ConfigurationError(f"start({workflow!r}) needs version=: runs are pinned to an exact version")
        return workflow, version
    raise ConfigurationError(f"start() takes a @workflow function, a WorkflowDefinition or a name, got {workflow!r}")


@final
class Client:
    """Starts runs and awaits their results.

    Args:
        store: the store the workers use.
        registry: optional; gives results started by name their types.
    """

    def __init__(self, store: WorkflowStore, registry: WorkflowRegistry | None = None) -> None:
        self.store = store
        self.registry = registry
        self._owned = False

    async def start(
        self,
        workflow: Callable[..., Any] | WorkflowDefinition | str,
        input: Mapping[str, Any] | None = None,
        *,
        version: int | None = None,
        checkpoint_id: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> RunHandle:
        """Start a run of ``workflow`` (a ``@workflow`` function, its definition, or a name with ``version``).

        Idempotent by ``checkpoint_id``: starting the same task under the same id
        returns a handle to the existing run. The input is checked against the
        workflow's signature first when the code is known (a function, a definition,
        or a name the registry holds). The run gets ``concurrency_key`` and
        ``concurrency_limit`` if given, else its definition's ``ConcurrencyLimit``
        when the code is known (a definition, or a name the registry holds).

        Raises:
            EnqueueConflictError: ``checkpoint_id`` names a run of a different task.
            InvalidInputError: the input does not fit the workflow's parameters.
            SerializationError: the input holds a value that cannot be recorded.
            UnknownWorkflowError: a name and version the registry does not hold.
        """
        name, version = started(workflow, version)
        task = WorkflowTask(name, version, {} if input is None else input, checkpoint_id,
                            concurrency_key=concurrency_key, concurrency_limit=concurrency_limit)
        definition = self._definition(workflow, name, version)
        if definition is not None:
            bind_input(definition, dict(task.input))
            task = with_concurrency(definition, task)
        result = await self.store.enqueue(task)
        returns = definition.spec.returns.get() if definition is not None else None
        return RunHandle(self, result.run_id, checkpoint_id, returns)

    def _definition(self, workflow: Any, name: str, version: int) -> WorkflowDefinition | None:
        if isinstance(workflow, WorkflowDefinition):
            return workflow
        if self.registry is not None and self.registry.get(name, version) is not None:
            return self.registry.get(name, version)
        if self.registry is not None and isinstance(workflow, str):
            self.registry.definition_for(name, version)  # raises UnknownWorkflowError, naming what it holds
        spec = _spec_of(workflow)
        return WorkflowDefinition(workflow) if spec is not None and spec.version == version else None

    async def get_handle(self, run_ref: str, workflow: Callable[..., Any] | WorkflowDefinition | None = None) -> RunHandle:
        """A handle to an existing run (by run id or checkpoint id); ``workflow``, the run's code, gives its
        result's type.

        Raises:
            RunNotFoundError: no such run.
            ConfigurationError: ``workflow`` is not the run's ``(name, version)``.
        """
        info = await self.store.get_run(run_ref)
        spec = _spec_of(workflow) if workflow is not None else None
        if spec is not None and (spec.name, spec.version) != (info.name, info.version):
            raise ConfigurationError(
                f"get_handle({run_ref!r}, ...) was given {spec.name} v{spec.version}, but the run is of {info.name} "
                f"v{info.version}: pass that workflow, or none (its result is then typed by the client's registry, "
                f"or plain JSON)")
        returns = spec.returns.get() if spec is not None else None
        return RunHandle(self, info.run_id, info.checkpoint_id, returns)

    def returns_of(self, name: str, version: int) -> Any:
        """The return annotation of ``(name, version)`` if the registry holds it (else plain JSON)."""
        definition = self.registry.get(name, version) if self.registry is not None else None
        return definition.spec.returns.get() if definition is not None else Any

    async def close(self) -> None:
        """Close the store if :func:`connect` opened it."""
        if self._owned:
            await self.store.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(url: str, registry: WorkflowRegistry | None = None) -> Client:
    """Open the store at ``url`` and return a :class:`Client` on it (close it, or use ``async with``)."""
    client = Client(await open_store(url), registry)
    client._owned = True
    return client


