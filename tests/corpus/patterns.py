"""A corpus of the workflow shapes users write, around waits, failures and concurrency.

Every step body reports that it ran through :data:`seen` (in this process) and,
when ``RUNIFOLD_TEST_COUNTS`` names a file, appends ``run key time pid`` to it
(for worker processes). Each workflow suspends at least once (a signal wait or a
timer), so a run goes through several executions and replays.

Signals the workflows wait for are listed in :data:`SIGNALS`; a test sends them
whenever a run waits for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime as dt
import decimal
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgspec

from runifold import (
    Budget,
    ChildFailedError,
    ResumePolicy,
    RetryPolicy,
    StepFailedError,
    WaitTimeoutError,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    effect,
    step,
    workflow,
)

TICK = timedelta(milliseconds=60)


class Seen:
    """Which step bodies ran, with a hook a test installs to check each start (e.g. the run is not suspended)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str]] = []
        self.check: Callable[[str, str], None] | None = None

    def __call__(self, run: str, what: str) -> None:
        self.runs.append((run, what))
        if self.check is not None:
            self.check(run, what)
        path = os.environ.get("RUNIFOLD_TEST_COUNTS")
        if path:
            with open(path, "a") as f:
                f.write(f"{run} {what} {time.time():.6f} {os.getpid()}\n")


seen = Seen()
_attempts: dict[tuple[str, str], int] = {}
_lock = threading.Lock()


def attempt(run: str, what: str) -> int:
    """Count the attempts of one body (1, 2, ...): in this process, or across worker processes when
    ``RUNIFOLD_TEST_DIR`` names a folder they share (a killed worker's attempts count too)."""
    folder = os.environ.get("RUNIFOLD_TEST_DIR")
    if folder:
        with open(os.path.join(folder, f"attempts-{run}-{what}"), "a+") as f:
            f.write(".")
            f.flush()
            f.seek(0)
            return len(f.read())
    with _lock:
        n = _attempts.get((run, what), 0) + 1
        _attempts[(run, what)] = n
    return n


# -- steps -------------------------------------------------------------------------------


@step()
async def add(run: str, what: str, n: int) -> int:
    seen(run, what)
    await asyncio.sleep(0.001 * (n % 7))
    return n + 1


@step()
async def slow(run: str, what: str, seconds: float) -> str:
    seen(run, what)
    await asyncio.sleep(seconds)
    return what


@step()
async def note(run: str, what: str) -> str:
    seen(run, what)
    return f"noted {what}"


@step(retry=RetryPolicy(max_attempts=3, initial=timedelta(milliseconds=150), jitter=0))
async def flaky(run: str, what: str) -> str:
    seen(run, what)
    if attempt(run, what) == 1:
        raise RuntimeError("first attempt fails")
    return f"{what} ok"


@step(retry=RetryPolicy(max_attempts=1))
async def broken(run: str, what: str) -> int:
    seen(run, what)
    raise ValueError(f"{what} is broken")


@effect(resume=ResumePolicy.REPEAT)
async def send(key: str, run: str, what: str) -> dict[str, str]:
    seen(run, what)
    return {"idempotency_key_suffix": key.rsplit(":", 1)[-1], "what": what}


@effect(resume=ResumePolicy.REPEAT, retry=RetryPolicy(max_attempts=20, initial=timedelta(0)))
async def slow_send(key: str, run: str, what: str, seconds: float) -> str:
    seen(run, what)
    await asyncio.sleep(seconds)
    return f"{what} sent"


class Parcel(msgspec.Struct, frozen=True):
    sku: str
    weight: float
    tags: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Label:
    code: str
    printed: dt.datetime


@step()
async def when(run: str, what: str) -> dt.datetime:
    seen(run, what)
    return dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.UTC)


@step()
async def pair(run: str, what: str) -> tuple[int, str]:
    seen(run, what)
    return (7, "seven")


@step()
async def tags(run: str, what: str) -> frozenset[str]:
    seen(run, what)
    return frozenset({"b", "a"})


@step()
async def blob(run: str, what: str) -> bytes:
    seen(run, what)
    return b"\x00\x01binary"


@step()
async def parcel(run: str, what: str) -> Parcel:
    seen(run, what)
    return Parcel("sku-1", 2.5, ("fragile", "heavy"))


@step()
async def label(run: str, what: str) -> Label:
    seen(run, what)
    return Label("L-1", dt.datetime(2026, 1, 2, tzinfo=dt.UTC))


@step()
async def price(run: str, what: str) -> decimal.Decimal:
    seen(run, what)
    return decimal.Decimal("19.90")


@step()
async def ident(run: str, what: str) -> uuid.UUID:
    seen(run, what)
    return uuid.UUID("12345678-1234-5678-1234-567812345678")


# -- workflows ----------------------------------------------------------------------------


@workflow("try-finally")
async def try_finally(ctx: WorkflowContext, n: int) -> list[Any]:
    done: list[Any] = []
    try:
        done.append(await add(ctx.run_id, "body", n))
        await ctx.wait_signal("go")
        await ctx.sleep(TICK)
        done.append(await add(ctx.run_id, "after-wait", n))
    finally:
        # runs when the try block really ends, never when the run merely suspends
        done.append(await note(ctx.run_id, "cleanup"))
    return done


class Session:
    """An async context manager whose exit calls a step."""

    def __init__(self, ctx: WorkflowContext) -> None:
        self.ctx = ctx
        self.log: list[str] = []

    async def __aenter__(self) -> Session:
        self.log.append(await note(self.ctx.run_id, "open"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.log.append(await note(self.ctx.run_id, "close"))


@workflow("async-with")
async def async_with(ctx: WorkflowContext, n: int) -> list[str]:
    async with Session(ctx) as session:
        await ctx.wait_signal("go")
        session.log.append(str(await add(ctx.run_id, "inside", n)))
    return session.log


@workflow("gather")
async def gather_values(ctx: WorkflowContext, n: int) -> list[Any]:
    async def branch(i: int) -> list[Any]:
        first = await add(ctx.run_id, f"b{i}-1", n + i)
        token = str(ctx.uuid())  # recorded while sibling branches commit
        second = await add(ctx.run_id, f"b{i}-2", first)
        return [first, second, len(token)]

    results = await asyncio.gather(branch(1), branch(2), branch(3))
    await ctx.wait_signal("go")
    return list(results)


@workflow("return-exceptions")
async def return_exceptions(ctx: WorkflowContext, n: int) -> list[str]:
    async def waiter() -> str:
        await ctx.wait_signal("go")
        return await note(ctx.run_id, "after-go")

    results = await asyncio.gather(broken(ctx.run_id, "broken"), waiter(), add(ctx.run_id, "add", n),
                                   return_exceptions=True)
    # the suspension on "go" must not show up here: only the step's own failure does
    return [type(r).__name__ if isinstance(r, BaseException) else str(r) for r in results]


@workflow("task-group")
async def task_group(ctx: WorkflowContext, n: int) -> list[Any]:
    async def waits_then_adds() -> int:
        await ctx.wait_signal("go")
        return await add(ctx.run_id, "tg-after-go", n)

    async with asyncio.TaskGroup() as tg:
        first = tg.create_task(add(ctx.run_id, "tg-1", n))
        second = tg.create_task(waits_then_adds())
        third = tg.create_task(slow(ctx.run_id, "tg-slow", 0.05))
    return [first.result(), second.result(), third.result()]


@workflow("first-completed")
async def first_completed(ctx: WorkflowContext, n: int) -> list[str]:
    timer = asyncio.ensure_future(ctx.sleep(TICK))
    work = asyncio.ensure_future(slow(ctx.run_id, "slow-work", 0.4))
    done, pending = await asyncio.wait({timer, work}, return_when=asyncio.FIRST_COMPLETED)
    order = ["timer" if timer in done else "work"]
    await asyncio.wait(pending)
    order.append(await note(ctx.run_id, "both-done"))
    await ctx.wait_signal("go")
    return order


@workflow("as-completed")
async def as_completed(ctx: WorkflowContext, n: int) -> list[Any]:
    """as_completed over coroutines (it makes their tasks in the order of a set) and over step calls; each
    coroutine must get back its own step's output, also after a suspension between the step and its return."""
    async def fetch(i: int) -> list[Any]:
        got = await slow(ctx.run_id, f"fetch-{i}", 0.01 * (4 - i))
        await ctx.sleep(TICK)
        return [i, got]

    fetched = [await finished for finished in asyncio.as_completed([fetch(i) for i in range(4)])]
    if any(got != f"fetch-{i}" for i, got in fetched):
        raise AssertionError(f"a coroutine got another one's output: {fetched}")
    calls = [slow(ctx.run_id, f"ac-{i}", 0.02 * (3 - i)) for i in range(3)]
    order = [await finished for finished in asyncio.as_completed(calls)]
    await ctx.wait_signal("go")
    return [sorted(fetched), order]


@workflow("nested-gather")
async def nested_gather(ctx: WorkflowContext, n: int) -> list[Any]:
    async def waits() -> str:
        await ctx.wait_signal("go")
        return await note(ctx.run_id, "nested-after-go")

    inner1 = asyncio.gather(add(ctx.run_id, "n-1", n), add(ctx.run_id, "n-2", n + 1))
    inner2 = asyncio.gather(add(ctx.run_id, "n-3", n + 2), waits())
    outer = await asyncio.gather(inner1, inner2, note(ctx.run_id, "n-4"))
    return [list(x) if isinstance(x, list) else x for x in outer]


@workflow("timer-siblings")
async def timer_siblings(ctx: WorkflowContext, n: int) -> list[Any]:
    """Branches between recorded calls on asyncio's timers (durable) and an Event."""
    ready = asyncio.Event()

    async def timed() -> int:
        first = await add(ctx.run_id, "rt-a1", n)
        await asyncio.sleep(0.03)
        ready.set()
        return await add(ctx.run_id, "rt-a2", first)

    async def sleeper() -> int:
        first = await add(ctx.run_id, "rt-b1", n)
        await asyncio.sleep(0.02)
        return await add(ctx.run_id, "rt-b2", first)

    async def evented() -> int:
        await ready.wait()
        return await add(ctx.run_id, "rt-c1", n)

    results = await asyncio.gather(timed(), sleeper(), evented())
    await ctx.wait_signal("go")
    return list(results)


@workflow("retry-and-timer")
async def retry_and_timer(ctx: WorkflowContext, n: int) -> list[str]:
    async def ticking() -> str:
        await ctx.sleep(TICK / 2)
        return await note(ctx.run_id, "ticked")

    results = await asyncio.gather(flaky(ctx.run_id, "flaky"), ticking())
    await ctx.wait_signal("go")
    return list(results)


@workflow("values")
async def values(ctx: WorkflowContext, n: int) -> list[Any]:
    async def drawing() -> list[Any]:
        drawn: list[Any] = []
        for i in range(3):
            drawn.append([len(str(ctx.uuid())), ctx.now().tzinfo is not None, 0 <= ctx.random() < 1])
            ctx.charge(1)
            drawn.append(await add(ctx.run_id, f"v-draw-{i}", i))
        return drawn

    async def committing() -> list[int]:
        return [await add(ctx.run_id, f"v-commit-{i}", i) for i in range(3)]

    results = await asyncio.gather(drawing(), committing())
    await ctx.wait_signal("go")
    return list(results)


class Typed(msgspec.Struct, frozen=True):
    when: dt.datetime
    pair: tuple[int, str]
    tags: frozenset[str]
    blob: bytes
    parcel: Parcel
    label: Label
    price: decimal.Decimal
    ident: uuid.UUID


@workflow("typed")
async def typed(ctx: WorkflowContext, n: int) -> Typed:
    first = await when(ctx.run_id, "when")
    await ctx.wait_signal("go")
    return Typed(first, await pair(ctx.run_id, "pair"), await tags(ctx.run_id, "tags"), await blob(ctx.run_id, "blob"),
                 await parcel(ctx.run_id, "parcel"), await label(ctx.run_id, "label"),
                 await price(ctx.run_id, "price"), await ident(ctx.run_id, "ident"))


@workflow("effects-and-timeouts")
async def effects_and_timeouts(ctx: WorkflowContext, n: int) -> list[Any]:
    sent = await send(ctx.run_id, "send-1")
    try:
        await ctx.wait_signal("never", timeout=TICK)
        outcome = "signal"
    except WaitTimeoutError:
        outcome = "timed out"
    try:
        await broken(ctx.run_id, "caught")
        caught = "no"
    except StepFailedError as exc:
        caught = exc.error_type
    await ctx.wait_signal("go")
    return [sent, outcome, caught]


@workflow("cancelled-calls")
async def cancelled_calls(ctx: WorkflowContext, n: int) -> list[Any]:
    """Calls the code stops waiting for: a timeout around a step, a step that loses a race to a durable timer,
    the sibling a failing TaskGroup member cancels; each followed by more calls in the same task."""
    out: list[Any] = []
    try:
        async with asyncio.timeout(0.05):
            out.append(await slow(ctx.run_id, "timed-out", 30.0))
    except TimeoutError:
        out.append(f"timeout {ctx.uuid().hex[:0]}")
    out.append(await note(ctx.run_id, "after-timeout"))
    try:
        out.append(await asyncio.wait_for(slow(ctx.run_id, "wait-for", 30.0), 0.05))
    except TimeoutError:
        out.append("wait_for timeout")
    work = asyncio.ensure_future(slow(ctx.run_id, "race", 30.0))
    timer = asyncio.ensure_future(ctx.sleep(TICK))
    done, _ = await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
    work.cancel()
    out.append("timer won" if timer in done else "work won")
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(slow(ctx.run_id, "tg-sibling", 30.0))
            tg.create_task(broken(ctx.run_id, "tg-broken"))
    except* StepFailedError as group:
        out.append([type(e).__name__ for e in group.exceptions])
    await ctx.wait_signal("go")
    out.append(await add(ctx.run_id, "end", n))
    return out


@workflow("abandoned-effects")
async def abandoned_effects(ctx: WorkflowContext, n: int) -> list[Any]:
    """Effects the code stops waiting for while their bodies run: the sibling a failing TaskGroup member
    cancels, and one that loses a race to a durable timer. Each runs on to its outcome (an interruption in
    flight leaves it in doubt, and REPEAT sends it again: with attempts enough that interruptions never park
    it) before the run may finish. Both are abandoned within milliseconds and run on for 200 ms, so an
    interrupted execution often stops while nothing waits for them any more."""
    out: list[Any] = []
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(slow_send(ctx.run_id, "tg-sibling", 0.2))
            tg.create_task(broken(ctx.run_id, "tg-broken"))
    except* StepFailedError as group:
        out.append([type(e).__name__ for e in group.exceptions])
    racer = asyncio.ensure_future(slow_send(ctx.run_id, "race", 0.2))
    timer = asyncio.ensure_future(ctx.sleep(timedelta(milliseconds=5)))
    done, _ = await asyncio.wait({racer, timer}, return_when=asyncio.FIRST_COMPLETED)
    racer.cancel()
    out.append("timer won" if timer in done else "effect won")
    await ctx.wait_signal("go")
    out.append(await note(ctx.run_id, "end"))
    return out


@workflow("coordination")
async def coordination(ctx: WorkflowContext, n: int) -> list[Any]:
    """asyncio's coordination primitives between branches: a Semaphore bounding parallel steps (some of them
    waiting for the signal while they hold it), a Queue from a producer to a consumer, a Lock."""
    limit = asyncio.Semaphore(2)

    async def limited(i: int) -> int:
        async with limit:
            if i == 1:
                await ctx.wait_signal("go")
            return await add(ctx.run_id, f"sem-{i}", i)

    bounded = await asyncio.gather(*(limited(i) for i in range(5)))
    queue: asyncio.Queue[int | None] = asyncio.Queue(maxsize=1)

    async def produce() -> None:
        for i in range(3):
            await queue.put(await add(ctx.run_id, f"produce-{i}", i))
        await queue.put(None)

    async def consume() -> list[str]:
        got = []
        while (item := await queue.get()) is not None:
            got.append(await note(ctx.run_id, f"consume-{item}"))
        return got

    _, consumed = await asyncio.gather(produce(), consume())
    lock = asyncio.Lock()
    order: list[int] = []

    async def locked(i: int) -> None:
        async with lock:
            order.append(await add(ctx.run_id, f"lock-{i}", i))
            await ctx.sleep(TICK / 4)

    await asyncio.gather(*(locked(i) for i in range(3)))
    return [list(bounded), consumed, order]


async def numbered(ctx: WorkflowContext, cleanup: list[str]) -> Any:
    """An async generator of step outputs that suspends between items and calls a step when it is closed."""
    try:
        for i in range(10):
            yield await add(ctx.run_id, f"gen-{i}", i)
            if i == 1:
                await ctx.wait_signal("go")
    finally:
        cleanup.append(await note(ctx.run_id, "gen-closed"))


@workflow("async-generator")
async def async_generator(ctx: WorkflowContext, n: int) -> list[Any]:
    """``async for`` over a generator of steps, left early: closed by ``aclosing``, and left to be collected."""
    cleanup: list[str] = []
    got: list[int] = []
    async with contextlib.aclosing(numbered(ctx, cleanup)) as items:
        async for item in items:
            got.append(item)
            if item >= 3:
                break
    total, late = 0, []
    async for item in numbered(ctx, late):  # never closed by the code: a workflow task closes it
        total += item
        if item >= 2:
            break
    ended = await note(ctx.run_id, "gen-end")
    while not late:  # the closing task's step
        await asyncio.sleep(0)
    return [got, cleanup, total, ended, late]


@workflow("children")
async def children(ctx: WorkflowContext, n: int) -> list[Any]:
    """Child runs started concurrently, one awaited under a timeout, a failing one caught."""
    first, second = await asyncio.gather(ctx.run_child(child, {"n": n}), ctx.run_child(child, {"n": n + 10}))
    handle = await ctx.start_child(child, {"n": n + 20})
    try:
        late = await asyncio.wait_for(handle.result(), timeout=30)
    except TimeoutError:
        late = -1
    try:
        await ctx.run_child(child, {"n": -1})
        failed = "no"
    except ChildFailedError as exc:
        failed = type(exc).__name__
    return [first, second, late, failed]


@workflow("child")
async def child(ctx: WorkflowContext, n: int) -> int:
    if n < 0:
        return await broken(ctx.run_id, "child-broken")
    await ctx.sleep(TICK)
    return await add(ctx.run_id, "child-add", n)


@workflow("shielded")
async def shielded(ctx: WorkflowContext, n: int) -> list[Any]:
    """A step shielded from a timeout and awaited again after it; context variables seen by every branch."""
    request.set(f"req-{n}")
    work = asyncio.ensure_future(slow(ctx.run_id, "shielded", 0.2))
    try:
        await asyncio.wait_for(asyncio.shield(work), timeout=0.01)
        early = "finished in time"
    except TimeoutError:
        early = "timed out"
    await ctx.wait_signal("go")

    async def reads(i: int) -> str:
        return f"{request.get()}:{await add(ctx.run_id, f'ctx-{i}', i)}"

    return [early, await work, await asyncio.gather(reads(1), reads(2))]


request: contextvars.ContextVar[str] = contextvars.ContextVar("request")


WORKFLOWS = [try_finally, async_with, gather_values, return_exceptions, task_group, first_completed, as_completed,
             nested_gather, timer_siblings, retry_and_timer, values, typed, effects_and_timeouts,
             cancelled_calls, abandoned_effects, coordination, async_generator, children, child, shielded]
SIGNALS = ("go",)
registry = WorkflowRegistry(*(WorkflowDefinition(fn, Budget(max_cost_units=100), signals={"go": {"*"}})
                              for fn in WORKFLOWS))
NAMES = [getattr(fn, "__runifold_workflow__").name for fn in WORKFLOWS]
