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
a group's members (``except*`` hands over a copy of the group, with the same members). An exception is noted by
a fingerprint (its id, type and the place it was first raised), never by a reference: holding it would hold its
traceback's frames and whatever they hold (an async generator would then be closed at another moment than
where workflow code lets go of it, and the replay would differ), and workflow code may read its attributes, so
nothing is written on it either.

What this cannot see: calls of other tasks the failure made run (a sibling a ``TaskGroup`` cancelled, whose
``finally`` sends something; a task a ``finally`` wakes; a task a callback creates), calls an async
generator's ``finally`` makes when ``aclosing`` or a ``break`` closes it, calls made after an exception was
stored, or handled and gone on from, before it or another is raised, and an exception raised again with a new
traceback (``with_traceback(None)``: its place of raising moved). Python reuses the id of an exception it freed,
so one raised where an earlier one was handled with a call may be taken for it (a refusal, never an acceptance).
operations.md says so.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import TracebackType

#: the most exceptions of one chain looked at (a long chain or a large group, bounded)
_CHAIN_LIMIT = 10_000
#: a fingerprint: the ids of the exception and its type, and the code object, line and instruction where it was
#: first raised (ids only: a class may not be hashable)
Fingerprint = tuple[int, int, int, int, int]
#: what a task's creation is noted as (no call key looks like it)
TASK = "(a task)"


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
        except BaseException:  # noqa: BLE001 - a class whose attributes raise (even CancelledError): not followed
            pass


def fingerprint(exc: BaseException) -> Fingerprint:
    """What tells this exception from another that later takes its id (its place of raising is kept as it is
    raised again, as the innermost entry of its traceback)."""
    tb: TracebackType | None = None
    try:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    except BaseException:  # noqa: BLE001 - (as in chain)
        tb = None
    if tb is None:
        return id(exc), id(type(exc)), 0, 0, 0
    return id(exc), id(type(exc)), id(tb.tb_frame.f_code), tb.tb_lineno, tb.tb_lasti


class HandledErrors:
    """The exceptions one execution's workflow code made calls (or created tasks) while handling, and the keys
    of those calls (a task's creation has none)."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: dict[Fingerprint, set[str]] = {}

    def note(self, key: str = TASK) -> None:
        """Workflow code makes the call ``key`` (or creates a task) now: note what it is handling, if anything."""
        exc = sys.exc_info()[1]
        if exc is None:
            return
        for e in chain(exc):
            keys = self._calls.setdefault(fingerprint(e), set())
            if len(keys) < 2:  # (two tell whether there was another call than any one of them)
                keys.add(key)

    def led_to(self, exc: BaseException | None, failed: str) -> bool:
        """A call other than ``failed`` (the call whose failure fails the run, if one does) was made, or a task
        created, while ``exc`` or an exception of its chain was being handled."""
        calls = self._calls
        return any(calls.get(fingerprint(e), set()) - {failed} for e in chain(exc))

