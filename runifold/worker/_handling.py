"""Calls workflow code makes while an exception is being handled, and whether they led to the run's failure.

A retry replays a failed run's history: every recorded call returns what it returned, matched by its key, not
by its arguments. A call made while the exception that failed the run was being handled (a compensation in an
``except`` that re-raises, a cleanup in a ``finally`` the exception passes through, a task created there) was
made because of that failure, with the values of the failing code: a replay of the fixed code would hand it its
recorded result wherever the fixed code makes a call of that key (helper-82: a receipt sent from a ``finally``
with the old status, and the retried run "completed" with another). So such a failure is ``handled``, and the
run is not retried (see ``retry_run``).

Python knows which exception a frame is handling only while it handles it (``sys.exc_info()``), so each call
notes it then, with the exceptions it was raised while handling (an ``except`` inside a ``finally``, say) and
a group's members (``except*`` hands over a copy of the group, with the same members). The exceptions are held
by the execution, never marked on the objects (workflow code may read their attributes), and let go once
nothing else holds them (a long run handles many).

What this cannot see: calls of other tasks the failure made run (a sibling a ``TaskGroup`` cancelled, whose
``finally`` sends something; a task a ``finally`` wakes; a task a callback creates), and calls made after an
exception was stored and before it is raised again. operations.md says so.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

#: the most exceptions of one chain looked at (a chain is short; this bounds a pathological one)
_CHAIN_LIMIT = 100
#: how many exceptions are held before those nothing else holds are let go
_PRUNE_FROM = 64


def _refs_when_held_alone() -> int:
    """sys.getrefcount of an object the held dict alone holds, as :meth:`HandledErrors._prune` counts it."""
    held = {0: object()}
    counts = [sys.getrefcount(e) for e in held.values()]
    return counts[0]


_ALONE = _refs_when_held_alone()


def chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, the exceptions it was raised from or while handling, and a group's members: each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < _CHAIN_LIMIT:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        try:
            todo += [e.__cause__, e.__context__]
            if isinstance(e, BaseExceptionGroup):
                todo += list(e.exceptions)
        except Exception:  # an exception class that guards its attributes: its chain is not followed
            pass


class HandledErrors:
    """The exceptions one execution's workflow code made calls (or created tasks) while handling."""

    __slots__ = ("_held", "_prune_from")

    def __init__(self) -> None:
        self._held: dict[int, BaseException] = {}
        self._prune_from = _PRUNE_FROM

    def note(self) -> None:
        """Workflow code makes a call or creates a task now: note what it is handling, if anything."""
        exc = sys.exc_info()[1]
        if exc is None:
            return
        for e in chain(exc):
            self._held[id(e)] = e
        if len(self._held) > self._prune_from:
            self._prune()

    def led_to(self, exc: BaseException | None) -> bool:
        """A call was made while ``exc``, or an exception of its chain, was being handled."""
        held = self._held
        return any(held.get(id(e)) is e for e in chain(exc))

    def _prune(self) -> None:
        # an exception nothing else holds can never be raised again, nor be in a failing one's chain
        self._held = {k: e for k, e in self._held.items() if sys.getrefcount(e) > _ALONE}
        self._prune_from = max(_PRUNE_FROM, 2 * len(self._held))
