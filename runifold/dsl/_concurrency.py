"""``ConcurrencyLimit``: a definition's default concurrency key and limit for the runs it starts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, final

from runifold.errors import ConfigurationError, InvalidInputError

#: what a key function receives: the task's input, as it will be stored (JSON-compatible)
KeyFunction = Callable[[Mapping[str, Any]], str]


@final
@dataclass(frozen=True)
class ConcurrencyLimit:
    """At most ``limit`` runs of one key run at once, across every worker and host.

    ``WorkflowDefinition(fn, concurrency=ConcurrencyLimit(3))`` limits the
    workflow's runs to three at once (the key is the workflow's name);
    ``ConcurrencyLimit(1, key="payments")`` shares a key (and so its slots) with
    every definition naming it; ``ConcurrencyLimit(1, key=lambda input:
    f"customer:{input['customer_id']}")`` allows one run per customer. The key
    is computed once, when the task is validated or started, and kept on the
    run: a task that names its own ``concurrency_key`` keeps it.

    Args:
        limit: how many runs of the key may run (hold a lease) at once; at least 1.
        key: the key, a function of the task's input returning it, or None for
            the workflow's name.
    """

    limit: int
    key: str | KeyFunction | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit < 1:
            raise ConfigurationError(f"ConcurrencyLimit.limit must be an integer >= 1, got {self.limit!r}")
        if self.key is not None and not callable(self.key) and (not isinstance(self.key, str) or not self.key):
            raise ConfigurationError(
                f"ConcurrencyLimit.key must be a non-empty string, a function of the input, or None, got {self.key!r}"
            )

    def key_for(self, workflow: str, input: Mapping[str, Any]) -> str:
        """The key of a run of ``workflow`` with ``input``.

        Raises:
            InvalidInputError: the key function raised, or returned something other than a non-empty string.
        """
        if self.key is None:
            return workflow
        if isinstance(self.key, str):
            return self.key
        try:
            key = self.key(input)
        except Exception as exc:
            raise InvalidInputError(
                f"the concurrency key function of workflow {workflow!r} raised {type(exc).__name__}: {exc}; "
                "make it accept every input the workflow accepts"
            ) from exc
        if not isinstance(key, str) or not key:
            raise InvalidInputError(
                f"the concurrency key function of workflow {workflow!r} returned {key!r:.80}; it must return a "
                "non-empty string"
            )
        return key
