"""Running one body: a coroutine function on the worker's loop, a plain ``def`` in a thread of its own.

What a body returns or raises becomes its call's outcome in :mod:`runifold.worker._progress`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, NamedTuple


class _Raised(NamedTuple):
    """What a body that raised a BaseException other than CancelledError returns instead (see :func:`run_body`)."""

    exc: BaseException


def body_outcome(value: Any, exc: BaseException | None) -> tuple[Any, BaseException | None]:
    """A body's ``(value, exception)``, with what :func:`run_body` caught as the exception."""
    return (None, value.exc) if type(value) is _Raised else (value, exc)


async def run_body(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None) -> Any:
    """Run one body: a coroutine function on this loop, a plain function in a worker thread.

    A BaseException it raises other than CancelledError (``sys.exit`` in a library, ``KeyboardInterrupt``, one of
    its own) is returned as :class:`_Raised`: it fails the attempt like any exception, and never reaches the
    worker's loop (asyncio lets SystemExit and KeyboardInterrupt out of a task, which would end the worker).
    """
    try:
        if timeout is None:
            if is_async(fn):
                return await fn(*args, **kwargs)
            return await _call(fn, args, kwargs)
        try:
            async with asyncio.timeout(timeout):
                return await _call(fn, args, kwargs)
        except TimeoutError as exc:
            if str(exc):
                raise  # the body's own timeout, with its own message
            raise TimeoutError(f"the attempt took longer than its timeout of {timeout:g} s") from None
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:
        return _Raised(exc)


async def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if is_async(fn):
        return await fn(*args, **kwargs)
    # in this context, as asyncio.to_thread runs it (log lines carry the run id and the key)
    body = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    thread = asyncio.get_running_loop().run_in_executor(_BODY_THREADS, body)
    try:
        return await asyncio.shield(thread)
    except asyncio.CancelledError as cancelled:
        # invariant: a thread cannot be interrupted, so a cancelled body (workflow code stopped waiting for it, its
        # timeout passed) stays in flight until its thread returns, and its result is dropped: the run neither
        # suspends nor finishes meanwhile. Halted (the execution stops), or cancelled again, it lets the thread go
        if not thread.done() and cancelled.args != (HALT,):
            await asyncio.wait([thread])
        raise


#: the message of the cancellation that halts a body because its execution stops (the worker stops, the lease is lost)
HALT = "runifold: the execution stops"


class _DaemonThreads(concurrent.futures.Executor):
    """Runs each plain ``def`` body in a daemon thread of its own.

    A thread cannot be interrupted: when a worker stops (its grace period over, or a second signal), it
    releases the run and stops waiting for the body, and the process may exit without waiting for the
    thread either, as it would have to for asyncio's default executor.
    """

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to the awaiting body, as a thread pool would
                future.set_exception(exc)

        threading.Thread(target=run, name="runifold-body", daemon=True).start()
        return future


_BODY_THREADS = _DaemonThreads()


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a coroutine function (remembered on plain functions: a step's body is asked once per call)."""
    known = getattr(fn, "__runifold_is_async__", None)
    if known is None:
        known = inspect.iscoroutinefunction(fn)
        if inspect.isfunction(fn):
            fn.__runifold_is_async__ = known  # type: ignore[attr-defined]
    return bool(known)
