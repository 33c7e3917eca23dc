"""One blocking database connection owned by one thread, awaited from the event loop.

The thread takes every job queued since its last batch and hands them to the
batch function together, then answers all their callers with one wake-up of
the event loop. A store gets group commit from this shape for free: while the
thread is inside one transaction (an fsync), the next jobs collect in the queue
and go into the next transaction together.

Each awaited call here costs one queue hand-off and one loop wake-up per batch,
where a general-purpose wrapper such as aiosqlite pays them per statement.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

C = TypeVar("C")
#: a job's outcome: its value, or the exception it raised
Outcome = tuple[Any, BaseException | None]
Batch = Callable[[C, Sequence[Any]], list[Outcome]]


class ConnectionThread(Generic[C]):
    """Runs jobs on ``conn`` in a daemon thread; ``batch(conn, jobs)`` returns one outcome per job.

    ``conn`` must be usable from a thread other than its creator's (sqlite3:
    ``check_same_thread=False``); the thread is its only user until :meth:`close`.
    """

    def __init__(self, conn: C, batch: Batch[C], name: str) -> None:
        self.connection = conn
        self._batch = batch
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        #: jobs submitted and not yet answered (read and written on the event loop only)
        self.in_flight = 0
        self._closing: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Any, orphan: Callable[[Any], None] | None = None) -> asyncio.Future[Any]:
        """Queue ``job``; the future settles with its outcome.

        ``orphan`` is called with the job's value if it succeeds after its caller
        stopped waiting (the future was cancelled), to undo what nobody will use.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.in_flight += 1
        self._jobs.put(_Job(loop, future, job, orphan))
        return future

    async def close(self) -> None:
        """Answer the jobs already queued, then end the thread (the connection stays open). Every call waits
        for the same ending.

        A job queued while the thread ends (what undoes a cancelled caller's claim, say: see ``submit``'s
        ``orphan``) still runs, after it, and is answered: none is left unrun and unanswered.
        """
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)
        here = asyncio.get_running_loop()
        while True:
            left: list[_Job] = []
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    left.append(job)
            if not left:
                return
            outcomes = await asyncio.to_thread(self._run_batch, left)
            for loop, answers in _by_loop(left, outcomes).items():
                if loop is here:
                    self._answer(answers)  # now: what answering queues (an orphan's undo) is drained next
                else:
                    self._answer_on(loop, answers)

    def _main(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            taken = [first]
            stop = False
            while True:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                taken.append(more)
            outcomes = self._run_batch(taken)
            for loop, answers in _by_loop(taken, outcomes).items():
                self._answer_on(loop, answers)
            if stop:
                return

    def _answer_on(self, loop: asyncio.AbstractEventLoop, answers: list[tuple[_Job, Outcome]]) -> None:
        try:
            loop.call_soon_threadsafe(self._answer, answers)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting
            pass

    def _run_batch(self, jobs: list[_Job]) -> list[Outcome]:
        try:
            return self._batch(self.connection, [j.job for j in jobs])
        except BaseException as exc:  # pragma: no cover - a bug in the batch function
            return [(None, exc)] * len(jobs)

    def _answer(self, answers: list[tuple[_Job, Outcome]]) -> None:
        self.in_flight -= len(answers)
        for job, outcome in answers:
            _settle(job, outcome)


def _by_loop(jobs: list[_Job], outcomes: list[Outcome]) -> dict[asyncio.AbstractEventLoop, list[tuple[_Job, Outcome]]]:
    """Each job with its outcome, grouped by the event loop of its caller."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, Outcome]]] = {}
    for job, outcome in zip(jobs, outcomes, strict=True):
        by_loop.setdefault(job.loop, []).append((job, outcome))
    return by_loop


class _Job(NamedTuple):
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    job: Any
    orphan: Callable[[Any], None] | None


def _settle(job: _Job, outcome: Outcome) -> None:
    future = job.future
    value, exc = outcome
    if future.done():
        if exc is None and job.orphan is not None:
            job.orphan(value)
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)
