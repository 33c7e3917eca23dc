"""The registry: the workflow definitions a worker can run, by exact version."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, final

from runifold.dsl import WorkflowDefinition
from runifold.errors import InvalidInputError, RegistrationError, SerializationError, UnknownWorkflowError
from runifold.history import convert
from runifold.history._codec import UnsupportedTypeError, brief
from runifold.stores import WorkflowTask


@final
class WorkflowRegistry:
    """Holds definitions; several versions of one name live side by side."""

    def __init__(self, *definitions: WorkflowDefinition) -> None:
        self._defs: dict[tuple[str, int], WorkflowDefinition] = {}
        for definition in definitions:
            self.register(definition)

    def register(self, definition: WorkflowDefinition) -> WorkflowDefinition:
        """Add a definition.

        Raises:
            RegistrationError: the ``(name, version)`` is already registered.
        """
        if not isinstance(definition, WorkflowDefinition):
            raise RegistrationError(f"register() takes a WorkflowDefinition, got {definition!r}")
        key = (definition.name, definition.version)
        if key in self._defs:
            raise RegistrationError(
                f"workflow {definition.name!r} version {definition.version} is already registered; "
                "give changed code a new version number"
            )
        self._defs[key] = definition
        return definition

    def get(self, name: str, version: int) -> WorkflowDefinition | None:
        """Return the exact definition, or None."""
        return self._defs.get((name, version))

    def names(self) -> frozenset[str]:
        """Return every registered workflow name."""
        return frozenset(name for name, _ in self._defs)

    def versions(self) -> list[tuple[str, int]]:
        """Return every registered ``(name, version)``, sorted."""
        return sorted(self._defs)

    def definition_for(self, name: str, version: int) -> WorkflowDefinition:
        """Return the exact definition or raise :class:`UnknownWorkflowError`."""
        definition = self.get(name, version)
        if definition is None:
            raise UnknownWorkflowError(name, version, self.versions())
        return definition

    def validate(self, task: WorkflowTask) -> WorkflowTask:
        """Check that ``task`` names a registered definition and fits its signature.

        Returns the task to enqueue: ``task``, with its definition's concurrency
        key and limit when the definition has a :class:`ConcurrencyLimit` and the
        task names no key of its own.

        Raises:
            UnknownWorkflowError: no such ``(name, version)``.
            InvalidInputError: missing, unexpected or mistyped input fields, or a key function that failed.
        """
        definition = self.definition_for(task.name, task.version)
        bind_input(definition, dict(task.input))
        return with_concurrency(definition, task)


def with_concurrency(definition: WorkflowDefinition, task: WorkflowTask) -> WorkflowTask:
    """``task`` with ``definition``'s concurrency key and limit, unless it names a key or the definition has none."""
    limit = definition.concurrency
    if limit is None or task.concurrency_key is not None:
        return task
    return dataclasses.replace(task, concurrency_key=limit.key_for(task.name, task.input), concurrency_limit=limit.limit)


def bind_input(definition: WorkflowDefinition, data: dict[str, Any]) -> dict[str, Any]:
    """Convert a task's input to the workflow's keyword arguments."""
    types = definition.spec.param_types()
    unexpected = sorted(set(data) - set(types))
    missing = sorted(p for p in types if p not in data and not _has_default(definition, p))
    if unexpected or missing:
        wrong = "; ".join(f"{what} {names}" for what, names in (("missing", missing), ("unexpected", unexpected))
                          if names)
        raise InvalidInputError(
            f"input for workflow {definition.name!r} v{definition.version} does not fit its "
            f"parameters {list(types)}: {wrong}"
        )
    kwargs = {}
    for name, value in data.items():
        try:
            kwargs[name] = convert(value, types[name], what=f"parameter {name!r}", advice="pass a value of that type",
                                   strict=True)
        except SerializationError as exc:
            if isinstance(exc.__cause__, UnsupportedTypeError):  # no value fits: the annotation is what to change
                raise InvalidInputError(f"input for workflow {definition.name!r} v{definition.version}: {exc}") from exc
            raise InvalidInputError(
                f"input for workflow {definition.name!r} v{definition.version}: parameter {name!r} expects "
                f"{getattr(types[name], '__name__', types[name])!r}, got {type(value).__name__} "
                f"{str(value)[:60]!r} ({brief(exc.__cause__ or exc)})"
            ) from exc
    return kwargs



def _has_default(definition: WorkflowDefinition, param: str) -> bool:
    p = inspect.signature(definition.fn).parameters[param]
    return p.default is not inspect.Parameter.empty
