"""The PostgreSQL store's connections: a small pool of plain asyncpg connections, with TCP keepalives."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import Awaitable, Callable

import asyncpg  # type: ignore[import-untyped]

#: the application_name of the store's connections (see pg_stat_activity)
APPLICATION = "runifold"
#: Every statement the store sends is planned once per connection (its generic plan). Left to choose, the
#: server re-plans the claim statement at every claim (0.3 ms, as long as the claim itself) whenever a
#: custom plan for LIMIT 1 looks cheaper than the generic one, which walks the due index just the same.
PLAN_CACHE_MODE = "force_generic_plan"
# errors of the connection rather than of the statement (InternalClientError: a connection
# whose server went away between calls)
_CONNECTION_ERRORS = (OSError, TimeoutError, asyncpg.exceptions.ConnectionDoesNotExistError,
                      asyncpg.exceptions.InternalClientError)
_DRIVER_ERRORS = (*_CONNECTION_ERRORS, asyncpg.exceptions.InterfaceError, asyncpg.PostgresError)


def _keepalive(seconds: float) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    """A connection hook: TCP keepalives after ``seconds`` idle, and unacknowledged sends given up after ``seconds``."""

    async def init(conn: asyncpg.Connection) -> None:
        sock = conn._transport.get_extra_info("socket") if conn._transport is not None else None
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        idle = max(1, int(seconds))
        options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
        for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", max(1, idle // 3)), ("TCP_KEEPCNT", 3),
                            ("TCP_USER_TIMEOUT", idle * 1000)):
            if hasattr(socket, name):
                options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
        for level, option, value in options:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)

    return init


class _Pool:
    """The store's connections: an idle one is reused, at most ``size`` are open, waiters are served in turn.

    Plain asyncpg connections, not asyncpg's pool: its proxy and its release
    cost about 30 µs of CPU per statement, a tenth of a durable step. The
    connections never change session state, so a released one needs no reset.
    """

    def __init__(self, dsn: str, size: int, command_timeout: float, keepalive_seconds: float,
                 readonly: bool = False) -> None:
        self._dsn = dsn
        self._settings = {"statement_timeout": str(int(command_timeout * 1000)), "application_name": APPLICATION,
                          "plan_cache_mode": PLAN_CACHE_MODE}
        if readonly:
            self._settings["default_transaction_read_only"] = "on"
        self._size = size
        self._command_timeout = command_timeout
        self._keepalive = _keepalive(keepalive_seconds)
        self._idle: list[asyncpg.Connection] = []
        self._open: set[asyncpg.Connection] = set()
        self._opening = 0
        # a waiter gets a connection, or None: it may open one itself
        self._waiters: collections.deque[asyncio.Future[asyncpg.Connection | None]] = collections.deque()

    async def acquire(self) -> asyncpg.Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.is_closed():
                return conn
            self._open.discard(conn)
        if len(self._open) + self._opening >= self._size:
            waiter: asyncio.Future[asyncpg.Connection | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._hand(waiter.result())  # handed over as we were cancelled: pass it on
                raise
            if handed is not None:
                return handed
        self._opening += 1
        try:
            conn = await asyncpg.connect(
                self._dsn, timeout=self._command_timeout, server_settings=self._settings)
            await self._keepalive(conn)
        except BaseException:
            self._opening -= 1
            self._hand(None)
            raise
        self._opening -= 1
        self._open.add(conn)
        return conn

    def release(self, conn: asyncpg.Connection) -> None:
        if conn.is_closed():
            self._open.discard(conn)
            self._hand(None)
        else:
            self._hand(conn)

    def _hand(self, conn: asyncpg.Connection | None) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)

    def get_size(self) -> int:
        return len(self._open)

    def get_idle_size(self) -> int:
        return len(self._idle)

    async def close(self) -> None:
        closing, self._open, self._idle = self._open, set(), []
        # all at once, within one bound: a stalled server must not hold up a stop once per connection
        with contextlib.suppress(*_DRIVER_ERRORS, asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(c.close() for c in closing), return_exceptions=True),
                                   min(1.0, self._command_timeout))
        for conn in closing:
            conn.terminate()  # what did not close in time (a closed connection ignores it)
