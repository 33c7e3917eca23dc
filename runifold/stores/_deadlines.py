"""Time limits for a store's attempts in flight: one timer for all of them.

``asyncio.timeout`` schedules and cancels a timer per attempt, which cost a
networked store's step about a tenth of its CPU. Here an attempt only notes
its deadline; while any attempt is in flight, one check every ``PERIOD``
seconds cancels the task of each attempt past its deadline, and
:meth:`Deadlines.timed_out` turns that cancellation into ``TimeoutError``, as
``asyncio.timeout`` does. So an attempt ends at most ``PERIOD`` after its
deadline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

#: how often attempts in flight are checked (seconds): how late past its deadline one may end
PERIOD = 0.05


@dataclass(slots=True, eq=False)
class Attempt:
    """One attempt in flight: its task, its deadline (the loop's clock) and whether it was stopped."""

    task: asyncio.Task[object]
    deadline: float
    cancelling: int  # the task's cancel requests when the attempt began
    expired: bool = False


class Deadlines:
    """The attempts in flight and the one timer that bounds them."""

    def __init__(self) -> None:
        self._attempts: set[Attempt] = set()
        self._check: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def begin(self, seconds: float) -> Attempt:
        """Bound the current task's attempt to ``seconds`` from now; :meth:`end` it when it returns or raises."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "a store operation runs in a task"
        attempt = Attempt(task, loop.time() + seconds, task.cancelling())
        self._attempts.add(attempt)
        if self._check is None or self._loop is not loop:
            self._loop, self._check = loop, loop.call_later(PERIOD, self._expire, loop)
        return attempt

    def end(self, attempt: Attempt) -> None:
        self._attempts.discard(attempt)

    def timed_out(self, attempt: Attempt, exc: BaseException) -> bool:
        """Tell whether ``exc``, raised in ``attempt``, is its deadline's cancellation (then it is no longer one:
        the caller raises ``TimeoutError``) rather than a cancellation from outside."""
        return (attempt.expired and isinstance(exc, asyncio.CancelledError)
                and attempt.task.uncancel() <= attempt.cancelling)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._check = None
        if loop is not self._loop:
            return  # a check of a loop this store no longer runs on
        now = loop.time()
        for attempt in self._attempts:
            if not attempt.expired and attempt.deadline <= now:
                attempt.expired = True
                attempt.task.cancel()
        if self._attempts:
            self._check = loop.call_later(PERIOD, self._expire, loop)

    def close(self) -> None:
        if self._check is not None:
            self._check.cancel()
            self._check = None
