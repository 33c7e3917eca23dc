"""The one timer that bounds a store's attempts in flight (runifold.stores._deadlines)."""

from __future__ import annotations

import asyncio

import pytest

from runifold.stores._deadlines import PERIOD, Deadlines


async def _attempt(deadlines: Deadlines, seconds: float, work: float) -> str:
    attempt = deadlines.begin(seconds)
    try:
        await asyncio.sleep(work)
        return "answered"
    except BaseException as exc:
        if deadlines.timed_out(attempt, exc):
            raise TimeoutError("deadline") from None
        raise
    finally:
        deadlines.end(attempt)


async def test_an_attempt_past_its_deadline_ends_with_timeout_error_soon_after() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError, match="deadline"):
        await _attempt(deadlines, 0.1, 60)
    assert 0.1 <= loop.time() - started < 0.1 + PERIOD + 0.5
    deadlines.close()


async def test_attempts_within_their_deadlines_answer_and_leave_no_check_behind() -> None:
    deadlines = Deadlines()
    assert await asyncio.gather(*[_attempt(deadlines, 5, 0.01 * i) for i in range(5)]) == ["answered"] * 5
    await asyncio.sleep(PERIOD * 3)  # the check stops once nothing is in flight
    assert deadlines._check is None
    deadlines.close()


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    deadlines = Deadlines()
    task = asyncio.ensure_future(_attempt(deadlines, 60, 60))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadlines.close()


async def test_a_cancellation_from_outside_beside_the_deadlines_stays_a_cancellation() -> None:
    deadlines = Deadlines()
    task = asyncio.ensure_future(_attempt(deadlines, 0.001, 60))
    await asyncio.sleep(PERIOD / 5)  # the attempt waits, past its deadline, before the check
    deadlines.close()
    deadlines._expire(asyncio.get_running_loop())  # the check cancels it ...
    task.cancel()  # ... and so does somebody else, before the task runs again
    with pytest.raises(asyncio.CancelledError):
        await task
    deadlines.close()
