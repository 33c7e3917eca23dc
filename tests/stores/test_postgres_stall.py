"""PostgreSQL behind a network that goes silent: every wait is bounded, and shutdown keeps its grace period.

A TCP proxy in the test forwards between the store and the server until told
to stall; then it holds every byte, in both directions, on connections old
and new, as a dead link or a frozen firewall would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from runifold import Supervisor, WorkflowContext, WorkflowDefinition, WorkflowTask, step, workflow
from runifold.errors import StoreUnavailableError
from runifold.stores.postgres import PostgresWorkflowStore
from tests.conftest import require_postgres, reset_postgres
from tests.support import worker

COMMAND_TIMEOUT = 0.5
RETRY_SECONDS = 1.5


class StallingProxy:
    """Forwards TCP between clients and one server until :meth:`stall`; then forwards nothing."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stall(self) -> None:
        self._flowing.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self._flowing.wait()  # stalled: hold the data, forward nothing
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()

    async def close(self) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        for w in self._writers:
            w.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[StallingProxy, str]]:
    dsn = require_postgres()
    await reset_postgres(dsn)
    parts = urlsplit(dsn)
    proxy = StallingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    netloc = f"{parts.username}@127.0.0.1:{proxy.port}" if parts.username else f"127.0.0.1:{proxy.port}"
    yield proxy, urlunsplit(parts._replace(netloc=netloc))
    await proxy.close()


async def _open(dsn: str) -> PostgresWorkflowStore:
    return await PostgresWorkflowStore.open(dsn, command_timeout=COMMAND_TIMEOUT, retry_seconds=RETRY_SECONDS,
                                            poll_seconds=0.2)


async def test_an_operation_in_a_stall_gives_up_within_its_retry_budget(proxy: tuple[StallingProxy, str]) -> None:
    """A read in flight when the network stalls raises StoreUnavailableError once its wall-time budget is spent."""
    stalling, dsn = proxy
    store = await _open(dsn)
    try:
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
        stalling.stall()
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match=f"unreachable for {RETRY_SECONDS:g} s"):
            await store.get_run("c1")
        waited = time.monotonic() - started
        print(f"read in a stall gave up after {waited:.2f} s (retry budget {RETRY_SECONDS:g} s)")
        # the budget is 1.5 s, attempts in flight included; the bug this guards against waited as long as the stall
        assert waited < RETRY_SECONDS + 2 * COMMAND_TIMEOUT, waited
    finally:
        await asyncio.wait_for(store.close(), 10)


async def test_a_release_in_a_stall_gives_up_within_its_own_bound_and_says_so(proxy: tuple[StallingProxy, str]) -> None:
    """A stopping worker's release is bounded tighter than other operations (its grace period must hold); the error
    it gives up with names that bound, not the store's retry budget (helper-51: "unreachable for 15 s" after 1 s)."""
    stalling, dsn = proxy
    store = await _open(dsn)
    try:
        await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))
        claim = await store.claim("w", {"wf"}, 30.0)
        assert claim is not None
        stalling.stall()
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match=f"unreachable for {COMMAND_TIMEOUT:g} s"):
            await store.release(claim.lease)
        assert time.monotonic() - started < RETRY_SECONDS
    finally:
        await asyncio.wait_for(store.close(), 10)


async def test_an_operation_in_a_stall_can_be_cancelled_at_once(proxy: tuple[StallingProxy, str]) -> None:
    """Cancelling a store call stuck in a stall ends it promptly, and the store stays usable for closing."""
    stalling, dsn = proxy
    store = await PostgresWorkflowStore.open(dsn, command_timeout=30, retry_seconds=60)
    try:
        stalling.stall()
        call = asyncio.create_task(store.count_runs())
        await asyncio.sleep(0.2)
        started = time.monotonic()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert time.monotonic() - started < 1.0
    finally:
        await asyncio.wait_for(store.close(), 40)


@step()
async def tick(i: int) -> int:
    await asyncio.sleep(0.01)
    return i


@workflow("ticking")
async def ticking(ctx: WorkflowContext, n: int) -> int:
    for i in range(n):
        await tick(i)
    return n


async def test_a_supervisor_stops_within_its_grace_period_during_a_stall(proxy: tuple[StallingProxy, str]) -> None:
    """SIGTERM-style stop while every store call hangs: run() returns within the grace period (plus the release bound)."""
    stalling, dsn = proxy
    store = await _open(dsn)
    grace = 1.0
    try:
        await store.enqueue_many([WorkflowTask("ticking", 1, {"n": 10_000}) for _ in range(2)])
        supervisor = Supervisor(worker(store, WorkflowDefinition(ticking), lease=30.0), 2,
                                idle_wait=timedelta(seconds=0.1), grace=timedelta(seconds=grace))
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        await asyncio.sleep(0.5)  # both runs are committing steps
        stalling.stall()
        await asyncio.sleep(0.2)
        started = time.monotonic()
        supervisor.stop()
        await asyncio.wait_for(running, 30)
        stopped = time.monotonic() - started
        print(f"supervisor stopped {stopped:.2f} s after stop(), grace {grace:g} s, during a stall")
        # the grace period, then the executor's release of each lease, which the store bounds to COMMAND_TIMEOUT
        assert stopped < grace + COMMAND_TIMEOUT + 0.5, stopped
    finally:
        await asyncio.wait_for(store.close(), 10)


async def test_closing_the_store_in_a_stall_is_bounded_once_for_all_its_connections(
        proxy: tuple[StallingProxy, str]) -> None:
    """The pool closed its connections one by one, each waiting up to the command timeout in a stall: a worker
    holding several took that many times 10 s to exit after its grace (helper-23). They close together now, within
    one bound of 1 s, and what did not close in time is dropped."""
    stalling, dsn = proxy
    store = await PostgresWorkflowStore.open(dsn, command_timeout=10, retry_seconds=30)
    await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))

    await asyncio.gather(*(store.count_runs() for _ in range(4)))  # at once: each opens a connection, kept idle
    assert store._pool.get_idle_size() >= 2
    stalling.stall()
    started = time.monotonic()
    await asyncio.wait_for(store.close(), 60)
    closed = time.monotonic() - started
    print(f"closed in a stall after {closed:.2f} s")
    assert closed < 2.0, closed
