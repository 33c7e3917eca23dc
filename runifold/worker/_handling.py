"""Calls workflow code makes while an exception is being handled, and whether they lead to the run's failure.

A retry replays a failed run's history: every recorded call returns what it returned, matched by its key, not
by its arguments. A call made while the exception that failed the run was being handled (a compensation in an
``except`` that re-raises, a cleanup in a ``finally`` the exception passes through, a task created there) was
made because of that failure, with the values of the failing code: a replay of the fixed code would hand it its
recorded result wherever the fixed code makes a call of that key (helper-82: a receipt sent from a ``finally``
with the old status, and the retried run "completed" with another). So such a failure is ``handled``, and the
run is not retried (see ``retry_run``).

Each such exception is marked, for the execution that saw it, when the call is made: Python knows which
exception a frame is handling only while it handles it.
"""

from __future__ import annotations

import sys

from runifold.dsl._context import current

#: the attribute that marks an exception workflow code made calls while handling: the execution's token
_MARK = "_runifold_calls_made_handling_it"


def handling() -> BaseException | None:
    """The exception the calling workflow code is handling now: in its own frames (an ``except``, or a ``finally``
    the exception passes through), or where its task was created."""
    exc = sys.exc_info()[1]
    if exc is None:
        binding = current.get()
        exc = None if binding is None else binding.handling
    return exc


def note_call(token: object) -> None:
    """A call of workflow code is being made: mark the exception it is handling, if any, for ``token``'s
    execution."""
    exc = handling()
    if exc is not None:
        try:
            vars(exc)[_MARK] = token  # (past any __setattr__ of the class: a frozen dataclass's, say)
        except TypeError:
            pass  # an exception without attributes of its own: never marked, so never refused for it


def calls_made_handling(exc: BaseException | None, token: object) -> bool:
    """``token``'s execution made calls while handling ``exc``, an exception it was raised from (``__cause__``)
    or while handling (``__context__``), or one of a group's."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        try:
            if vars(e).get(_MARK) is token:
                return True
        except TypeError:
            pass
        todo += [e.__cause__, e.__context__]
        if isinstance(e, BaseExceptionGroup):
            todo += e.exceptions
    return False
