"""The event loop workflow code runs on: one per execution, stepped by its driver.

Workflow code (the workflow function and every task it creates) runs on a
:class:`WorkflowLoop`, never on the worker's own loop. The driver calls
:meth:`WorkflowLoop.run_ready` to run workflow code until every workflow task
is blocked, then decides, with nothing of the workflow running, what happens
next: resolve the next recorded call, start a step's body, commit, or suspend.
Because the driver sees exactly when workflow code can make no progress, a
suspension needs no exception thrown through user code and no guess at how many
loop passes concurrent branches need to settle.

What workflow code may await on this loop: runifold calls (their futures are
resolved by the driver), asyncio's coordination primitives (``gather``,
``wait``, ``as_completed``, ``TaskGroup``, ``Event``, ``Queue``, ``Lock``, ...),
and asyncio's timers (``asyncio.sleep``, the timeouts of ``wait_for``,
``timeout`` and ``wait``): every ``call_at`` is a *durable timer*, a call of
the driver's like ``ctx.sleep``, recorded when it starts and when it fires, so
a replay fires it at its recorded place among the other outcomes. Nothing on
this loop waits for real time, so "no workflow task can run" is a fact the
driver sees. ``asyncio.to_thread`` (``run_in_executor``), sockets and
subprocesses are refused: their results and timing are not recorded, so that
work belongs in steps.

Every task created on this loop gets the next child *scope* of the task that
created it (see :mod:`runifold.dsl._context`), so call keys are the same on
every replay however the branches interleave.
"""

# typeshed types AbstractEventLoop's callbacks with TypeVarTuples; this loop takes any callable like asyncio's own
# mypy: disable-error-code="override,assignment"
from __future__ import annotations

import asyncio
import collections
import contextvars
import ctypes
import functools
import gc
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from runifold._log import Logger, get_logger

from runifold.dsl._context import Binding, Scope, current, here
from runifold.worker._handling import HandledErrors

log = get_logger("runifold.worker")

# where asyncio.as_completed turns the coroutines it was given into tasks (3.13 moved it into a class)
_SET_ORDERED = frozenset(
    getattr(fn, "__code__") for fn in (asyncio.tasks.as_completed,
                                       getattr(getattr(asyncio.tasks, "_AsCompletedIterator", None), "__init__", None))
    if hasattr(fn, "__code__")
)
#: frames between create_task and as_completed's: ensure_future, _ensure_future and the set comprehension
_FRAMES_TO_AS_COMPLETED = 6
#: coroutines of workflow tasks left behind (they caught every cancellation), kept so that they are never
#: resumed: Python resumes a coroutine to finalize it (GeneratorExit), wherever that happens, and code that
#: catches that too would make its calls outside its run. The list itself is never freed, not even at exit.
_STUCK: list[Any] = []
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_STUCK))
#: Python's cyclic garbage collector is running (it frees objects in reference cycles, at moments that depend on
#: allocations, so never at the same point of a replay)
_collecting = False


def _on_gc(phase: str, info: dict[str, int]) -> None:
    global _collecting
    _collecting = phase == "start"


gc.callbacks.append(_on_gc)


class WorkflowLoop(asyncio.AbstractEventLoop):
    """A deterministic loop for one run's workflow code, nested in the worker's loop.

    Args:
        outer: the worker's running loop (bodies and commits live there).
        activity: called on the outer loop when something outside workflow code
            made a workflow task runnable (a callback from another thread).
    """

    #: a step called on this loop without a run's binding is refused (see runifold.dsl._decorators)
    runs_workflow_code = True

    def __init__(self, outer: asyncio.AbstractEventLoop, activity: Callable[[], None]) -> None:
        self._outer = outer
        self._activity = activity
        self._ready: collections.deque[asyncio.Handle] = collections.deque()
        #: the durable timers of asyncio's timer handles not yet fired or cancelled: how to cancel each
        self._timers: dict[asyncio.TimerHandle, Callable[[], None]] = {}
        self._closed = False
        self._stepping = False
        #: workflow code's clock (``loop.time()``): the time, as history records it, of the last thing workflow
        #: code was handed (the run's start, a commit, when a timer fired or a wait ended). It stands still while
        #: workflow code runs, so a deadline computed from it passes at the same point of every replay
        self._clock = 0.0
        #: the last run_ready stopped at its limit with workflow code still runnable (a busy loop)
        self.busy = False
        #: every task created on this loop that has not finished (strong references)
        self.tasks: set[asyncio.Task[Any]] = set()
        #: the asyncio.as_completed call creating tasks now: its frame, the list it was given, the task number
        #: before the first, and how many of its coroutines are still to be created
        self._listing: tuple[Any, Sequence[Any], int, int] | None = None
        #: the exceptions workflow code made calls or created tasks while handling (the driver notes its calls)
        self.handled = HandledErrors()
        #: the worker loop's async generator hooks, and this loop's finalizer (see _finalize_asyncgen)
        self._outer_hooks = sys.get_asyncgen_hooks()
        self._finalizer = self._finalize_asyncgen

    # -- what the driver uses ---------------------------------------------------------

    def run_ready(self, limit: int = 1000) -> None:
        """Run workflow code until no workflow task is runnable, running at most ``limit`` callbacks. Bounded:
        workflow code polling with ``sleep(0)`` is always ready, and the driver must go on (let the worker's
        loop run, unwind a run's tasks) whatever it does."""
        ready = self._ready
        self.busy = False
        if not ready:
            return
        outer = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(self)
        outer_hooks = self._outer_hooks
        sys.set_asyncgen_hooks(None, self._finalizer)
        self._stepping = True
        try:
            while ready and limit:
                handle = ready.popleft()
                if not handle._cancelled:
                    try:
                        handle._run()
                    except (SystemExit, KeyboardInterrupt) as exc:
                        # raised by workflow code (sys.exit in a library, say): asyncio lets these out of a task,
                        # which would end the worker. The task that raised it holds it as its exception, so it
                        # fails the run like any other once it reaches the workflow function; one raised by a
                        # plain callback is reported like any exception of a callback (a task's is not: the run's
                        # end says it, and a task nobody awaits is reported when it is dropped, as asyncio does)
                        if not isinstance(getattr(getattr(handle, "_callback", None), "__self__", None), asyncio.Task):
                            self.call_exception_handler({"message": "workflow code raised", "exception": exc})
                limit -= 1
        finally:
            self._stepping = False
            self.busy = bool(ready)
            sys.set_asyncgen_hooks(*outer_hooks)
            asyncio.events._set_running_loop(outer)

    def _finalize_asyncgen(self, agen: Any) -> None:
        """An async generator of workflow code that the code left unclosed (``break`` out of ``async for``) is
        closed by a workflow task, created where workflow code let go of it (as asyncio's loop would, but on this
        loop): a ``finally`` in it calls steps as workflow code, while the run goes on.

        invariant: only where workflow code lets go of it, which is the same point on every replay. One freed by
        the cyclic garbage collector (it was in a reference cycle), or once the run is suspended or over, is not
        closed: nothing of it runs (Python frees it without resuming it), as its moment would differ on replay.
        """
        if not self._closed and self._stepping and not _collecting and current.get() is not None:
            self.call_soon(self.create_task, agen.aclose())

    @property
    def has_ready(self) -> bool:
        """Workflow code is runnable (the driver resolved a call or started a task)."""
        return bool(self._ready)

    def start(self, coro: Coroutine[Any, Any, Any], binding: Binding, ctx: contextvars.Context) -> asyncio.Task[Any]:
        """Create the workflow's root task in ``ctx`` (a context of its own), bound to ``binding``."""
        ctx.run(current.set, binding)
        return self._task(coro, ctx, None)

    def close(self, logger: Logger | None = None) -> int:
        """Stop: nothing more runs. A task still pending (it swallowed every cancellation) is left behind, and
        logged on ``logger`` (the run's: its lines name the run); return how many were."""
        self._timers.clear()
        self._ready.clear()
        self._closed = True
        left = len(self.tasks)
        for task in self.tasks:
            _STUCK.append(task.get_coro())
            (logger or log).warning("workflow_task_left_behind", task=task.get_name(),
                        hint="workflow code caught the cancellation of the run's suspension or end every time")
        self.tasks.clear()
        return left

    # -- scheduling ------------------------------------------------------------------

    def call_soon(self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None) -> asyncio.Handle:
        handle = asyncio.Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any,
                   context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        return self.call_at(self.time() + delay, callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        # invariant: a timer of workflow code is a durable timer of the task that set it (its scope names
        # it), due after the same delay on the store's clock; it fires when the driver resolves it
        binding = current.get()
        if binding is None:
            raise RuntimeError("a timer set outside the workflow's tasks")  # asyncio's own code never does
        binding = here(binding)
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        handle._scheduled = True  # type: ignore[attr-defined]
        self._timers[handle] = binding.driver.timer(binding.scope, when - self.time(),
                                                    functools.partial(self._fire, handle))
        return handle

    def _fire(self, handle: asyncio.TimerHandle) -> None:
        if self._timers.pop(handle, None) is not None and not handle._cancelled:
            self._ready.append(handle)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        cancel = self._timers.pop(handle, None)
        if cancel is not None:
            cancel()

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any,
                             context: contextvars.Context | None = None) -> asyncio.Handle:
        handle = asyncio.Handle(callback, args, self, context)
        self._outer.call_soon_threadsafe(self._arrive, handle)
        return handle

    def _arrive(self, handle: asyncio.Handle) -> None:
        if not self._closed:
            self._ready.append(handle)
            self._activity()

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        raise NotImplementedError(
            "asyncio.to_thread (run_in_executor) is not available in workflow code: neither its result nor when "
            "it ends is recorded, so a replay could not see what the live run saw; do blocking work in a @step "
            "(a plain `def` step runs in a thread of its own)")

    def time(self) -> float:
        return self._clock

    def advance(self, at: float) -> None:
        """Move the clock forward to ``at`` (store clock), never back: see :attr:`_clock`."""
        if at > self._clock:
            self._clock = at

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def create_task(self, coro: Any, *, name: str | None = None,
                    context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        ctx = context.copy() if context is not None else contextvars.copy_context()
        binding = ctx.get(current)
        if binding is not None:
            # invariant: the i-th task created from scope s gets scope s + "i/", on every replay alike
            scope = self._listed_scope(binding.scope, coro) or binding.scope.child()
            ctx.run(current.set, Binding(binding.driver, scope))
        self.handled.note()  # a task created while an exception is handled makes its calls because of it
        return self._task(coro, ctx, name)

    def _listed_scope(self, scope: Scope, coro: Any) -> Scope | None:
        """The scope of a task ``asyncio.as_completed`` creates for one of the coroutines it was given, else None.

        It creates them in the order of a set of the coroutines, which follows their ids and so differs from
        one execution to the next. Numbered by their places in the list it was given, they get the same
        scopes (and their calls the same keys) in every replay as in the live run.
        """
        frame = sys._getframe(2)
        for _ in range(_FRAMES_TO_AS_COMPLETED):
            if frame is None or frame.f_code in _SET_ORDERED:
                break
            frame = frame.f_back
        if frame is None or frame.f_code not in _SET_ORDERED:
            return None
        if self._listing is None or self._listing[0] is not frame:
            given = frame.f_locals.get("fs", frame.f_locals.get("aws"))
            if not isinstance(given, (list, tuple)):
                raise NotImplementedError(
                    "asyncio.as_completed starts the coroutines it is given in an arbitrary order, so in workflow "
                    "code it needs them in a list or tuple (or create the tasks first with asyncio.create_task)")
            coroutines = sum(1 for c in given if asyncio.iscoroutine(c))
            self._listing = (frame, given, scope.reserve(len(given)), coroutines)
        listed, given, base, left = self._listing
        place = next(i for i, c in enumerate(given) if c is coro)
        self._listing = (listed, given, base, left - 1) if left > 1 else None  # the last one lets the frame go
        return scope.child_at(base + place + 1)

    def _task(self, coro: Any, ctx: contextvars.Context, name: str | None) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=self, context=ctx, name=name)
        task._log_destroy_pending = False  # type: ignore[attr-defined]  # teardown may leave tasks pending
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- the rest of the loop protocol that asyncio's own code uses ---------------------

    def get_debug(self) -> bool:
        return False

    def is_running(self) -> bool:
        return self._stepping

    def is_closed(self) -> bool:
        return self._closed

    def get_exception_handler(self) -> None:
        return None

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        # e.g. a task that failed and was never awaited: workflow code's business, worth a line
        exc = context.get("exception")
        log.warning("workflow_task_error", message=context.get("message"),
                    error=None if exc is None else f"{type(exc).__name__}: {exc}")

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        self.call_exception_handler(context)

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "workflow code cannot do I/O on its event loop (sockets, subprocesses, servers); "
            "do it in a @step or @effect body"
        )

    # the I/O half of AbstractEventLoop: refused with a message saying where I/O belongs
    create_connection = create_server = create_datagram_endpoint = create_unix_connection = _unsupported
    getaddrinfo = getnameinfo = sock_connect = sock_recv = sock_sendall = sock_accept = _unsupported
    subprocess_exec = subprocess_shell = connect_read_pipe = connect_write_pipe = _unsupported
    add_reader = add_writer = add_signal_handler = run_until_complete = run_forever = _unsupported
