"""Group commit for a networked store: what callers ask while a round trip is in flight goes in the next one.

One round trip at a time, sent by a task of the batcher's own. A caller that
finds none in flight starts that task, which sends on the event loop's next
pass, so callers woken together by the last answer leave together; callers
that arrive while a round trip is in flight go together in the next one. So a
process's concurrent runs share round trips, and with them transactions and
WAL flushes, as far as they overlap, with no timer. A caller whose item was
the last round trip's only one (a run committing step after step, alone)
sends at once from its own task: nobody is there to join it, and the pass and
the task would cost it about a third of its CPU per step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - an item asked for
O = TypeVar("O")  # its answer

@dataclass(slots=True)
class _Pending(Generic[I, O]):
    item: I
    done: asyncio.Future[O]


class Batcher(Generic[I, O]):
    """Sends queued items in batches of at most ``limit`` through ``send``, one batch at a time.

    Args:
        send: sends a batch and returns one answer (or exception) per item, in order.
        limit: the most items in one batch.
        alike: items go in one batch only if this key is the same for all of them.
        apart: items with the same key never share a batch (their order is kept).
        orphan: called with the answer of an item whose caller stopped waiting.
    """

    def __init__(
        self,
        send: Callable[[list[I]], Awaitable[Sequence[O | BaseException]]],
        *,
        limit: int,
        alike: Callable[[I], Hashable] = lambda item: None,
        apart: Callable[[I], Hashable] | None = None,
        orphan: Callable[[O], None] | None = None,
    ) -> None:
        self._send = send
        self._limit = limit
        self._alike = alike
        self._apart = apart
        self._orphan = orphan
        self._queue: list[_Pending[I, O]] = []
        self._sender: asyncio.Future[None] | None = None
        self._direct = False  # a caller is sending its own item, alone
        self._alone: Hashable | None = None  # the mark of the last round trip's only item
        #: round trips made, and the items they carried
        self.batches = 0
        self.items = 0

    async def submit(self, item: I) -> O:
        """Send ``item`` in the next batch and return its answer."""
        if self._idle() and self._alone is not None and self._alone == self._mark(item):
            # the last round trip carried this caller's item alone (a run committing step after step,
            # nobody else): nobody will join it, so it goes at once, from the caller's task
            self._direct = True
            try:
                [answer] = await self._send([item])
            finally:
                self._direct = False
                self._start()
            self.batches += 1
            self.items += 1
            if isinstance(answer, BaseException):
                raise answer
            return answer
        pending: _Pending[I, O] = _Pending(item, asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        self._start()
        return await pending.done

    def _idle(self) -> bool:
        return not self._direct and not self._queue and (self._sender is None or self._sender.done())

    def _mark(self, item: I) -> Hashable:
        return self._alike(item) if self._apart is None else self._apart(item)

    def _start(self) -> None:
        if self._queue and not self._direct and (self._sender is None or self._sender.done()):
            # owned by the batcher: a cancelled caller never cancels a batch of others' items. It starts
            # on the loop's next pass, so callers woken together (by the last answer) leave together.
            self._sender = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while self._queue:
            batch = self._take()
            if batch:
                await self._round_trip(batch)

    async def _round_trip(self, batch: list[_Pending[I, O]]) -> None:
        try:
            answers = await self._send([p.item for p in batch])
        except asyncio.CancelledError:
            for p in batch:
                p.done.cancel()
            raise
        except BaseException as exc:  # invariant: no caller waits forever, whatever went wrong
            answers = [exc] * len(batch)
        self.batches += 1
        self.items += len(batch)
        self._alone = self._mark(batch[0].item) if len(batch) == 1 else None
        for p, answer in zip(batch, answers, strict=True):
            if p.done.done():
                if self._orphan is not None and not isinstance(answer, BaseException):
                    self._orphan(answer)
            elif isinstance(answer, BaseException):
                p.done.set_exception(answer)
            else:
                p.done.set_result(answer)

    def _take(self) -> list[_Pending[I, O]]:
        """The next batch: alike with the first queued item, none apart from another, at most ``limit``."""
        live = [p for p in self._queue if not p.done.done()]  # a caller cancelled before sending: left out
        if not live:
            self._queue = []
            return []
        key = self._alike(live[0].item)
        batch: list[_Pending[I, O]] = []
        later: list[_Pending[I, O]] = []
        seen: set[Hashable] = set()
        for p in live:
            mark = None if self._apart is None else self._apart(p.item)
            if len(batch) < self._limit and self._alike(p.item) == key and (mark is None or mark not in seen):
                batch.append(p)
                if mark is not None:
                    seen.add(mark)
            else:
                later.append(p)
        self._queue = later
        return batch

    async def close(self) -> None:
        """Stop sending; callers still waiting are cancelled."""
        if self._sender is not None and not self._sender.done():
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        for p in self._queue:
            p.done.cancel()
        self._queue = []
