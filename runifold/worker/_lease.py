"""Keeping a run's lease: renewals on a timer, and the check before a body starts.

A worker holds a run only while its lease holds. Renewals are anchored to the
claim (then to the last renewal), counted from when each was sent; a worker
whose renewal is overdue renews before it starts a body, and starts nothing if
the store refuses.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

from runifold.errors import LeaseLostError, RunifoldError, describe
from runifold.worker._call import Live


class LeaseKeeping:
    """Renews the lease of a live execution (see :class:`runifold.worker._execution.Execution`)."""

    # shared with Execution, which sets them up
    log: Any
    _live: Live | None
    _lost: str | None  # why the lease was lost, once it was
    _renewal_due: asyncio.TimerHandle | None  # when the lease is next renewed
    _renewal: asyncio.Task[None] | None  # a renewal under way

    def _lose(self, detail: str) -> None:
        raise NotImplementedError

    def _held_up(self, detail: str) -> str:
        """``detail`` (why the lease was lost), with why it ran out when this worker, which renews it on a timer,
        had not renewed it for longer than the lease: it was held up, and what to do about that."""
        live = self._live
        silent = time.monotonic() - live.renewed_at if live is not None else 0.0
        if live is None or silent < live.lease_seconds:
            return detail
        return (f"{detail}; this worker last renewed it {silent:.1f} s ago, longer than the lease "
                f"({live.lease_seconds:g} s): its event loop was held up (a step body that blocks it, such as "
                "time.sleep or long CPU work in an async def: make that a plain def step), its process was paused, "
                "or the store could not be reached; a lease longer than the longest such pause keeps the run")

    async def _renew(self, live: Live) -> None:
        started = time.monotonic()
        live.lease = await live.store.renew(live.lease, live.lease_seconds)
        live.renewed_at = started

    async def _hold_lease(self) -> bool:
        """Before a body starts: make sure this worker still holds the run's lease; False if it does not.

        invariant: a worker starts no body once its lease may have expired. A renewal that is overdue (the
        worker's loop was blocked, or its process frozen, past when the renewal was due) is made here first,
        and if the store refuses it nothing starts: another worker may have taken the run over and run that
        very body already. If the store cannot be reached, the body starts only while the lease, counted from
        its last renewal, has not run out.
        """
        live = self._live
        if live is None or self._lost is not None:
            return self._lost is None
        if time.monotonic() - live.renewed_at < live.renew_every:
            return True
        try:
            await self._renew(live)
        except LeaseLostError as exc:
            self._lose(str(exc))
            return False
        except RunifoldError as exc:
            self.log.warning("lease_renewal_failed", error=describe(exc))
        # (a renewal counts from when it was sent: one whose answer came after the lease it granted had run out
        # grants nothing)
        if time.monotonic() - live.renewed_at >= live.lease_seconds:
            self._lose("the lease ran out before a body could start (this worker was held up, or the store "
                       "could not be reached)")
        return self._lost is None

    def _schedule_renewal(self, live: Live, soon: bool = False) -> None:
        """Renew the lease when it is next due (``soon``: after a failed renewal): a timer, and a task only
        while a renewal is under way."""
        # invariant: renewals are anchored to the claim (then to the last renewal), not to when this
        # execution started: a claim that waited has used part of its lease already
        delay = (0.25 * live.renew_every if soon
                 else max(0.0, live.renew_every - (time.monotonic() - live.renewed_at)))
        # (an empty context: the renewal is no part of workflow code, and logs no run's fields but its own)
        self._renewal_due = asyncio.get_running_loop().call_later(
            delay, self._start_renewal, live, context=contextvars.Context())

    def _start_renewal(self, live: Live) -> None:
        self._renewal_due = None
        self._renewal = asyncio.ensure_future(self._renew_once(live))

    async def _renew_once(self, live: Live) -> None:
        try:
            await self._renew(live)
        except LeaseLostError as exc:
            self._lose(str(exc))
            return
        except RunifoldError as exc:
            self.log.warning("lease_renewal_failed", error=describe(exc))
            self._renewal = None
            self._schedule_renewal(live, soon=True)  # (renewed_at stays: the lease runs out from the last renewal)
            return
        self._renewal = None
        self._schedule_renewal(live)

    async def _stop_renewal(self) -> None:
        if self._renewal_due is not None:
            self._renewal_due.cancel()
            self._renewal_due = None
        renewal = self._renewal
        if renewal is not None:
            renewal.cancel()
            # invariant: no task of this run outlives run_once()
            await asyncio.gather(renewal, return_exceptions=True)

    async def _release(self, live: Live) -> None:
        """Hand the run back untouched (best effort, bounded: a stalled store must not hold up a stop)."""
        try:
            await asyncio.wait_for(asyncio.shield(live.store.release(live.lease)), live.renew_every)
        except (RunifoldError, TimeoutError) as exc:
            self.log.warning("release_failed", error=describe(exc))
