"""Task lineage for workflow code.

A loop task factory gives every task created from workflow code a child scope
of its creator (see :mod:`runifold.dsl._context`), so keys stay deterministic
under ``asyncio.gather``. Tasks created from anywhere else are untouched.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any

from runifold.dsl._context import Binding, current

_MARK = "_runifold_scoped"


def install_scoped_task_factory(loop: asyncio.AbstractEventLoop) -> None:
    """Install the lineage-tracking task factory on ``loop`` (idempotent, chains any existing one)."""
    previous = loop.get_task_factory()
    if getattr(previous, _MARK, False):
        return

    def factory(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> asyncio.Future[Any]:
        given = kwargs.pop("context", None)
        ctx = given.copy() if given is not None else contextvars.copy_context()
        binding = ctx.get(current)
        child: Binding | None = None
        if binding is not None:
            child = Binding(binding.driver, binding.scope.child())
            ctx.run(current.set, child)
        task: asyncio.Future[Any]
        if previous is not None:
            task = previous(loop, coro, context=ctx, **kwargs)  # type: ignore[call-arg]
        else:
            task = asyncio.Task(coro, loop=loop, context=ctx, **kwargs)
        if child is not None:
            track = getattr(child.driver, "track", None)
            if track is not None:
                track(task)
        return task

    setattr(factory, _MARK, True)
    loop.set_task_factory(factory)  # type: ignore[arg-type]
