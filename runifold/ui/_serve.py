"""Serving the view with uvicorn on a socket the caller bound, stopped by SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp


class _Server(uvicorn.Server):
    """uvicorn's server, with SIGINT and SIGTERM handled on the running loop: the first stops it gracefully.

    uvicorn's own handling re-raises a caught signal once the server stopped,
    which would turn a requested stop into a death by signal; here the
    command returns as usual (exit code 0).
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        handled = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._stop)
                handled.append(sig)
        try:
            yield
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    def _stop(self) -> None:
        if self.should_exit:  # a second signal: stop without waiting for open connections
            self.force_exit = True
        self.should_exit = True


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (``port`` 0: a free one): connections queue until the server serves.

    Raises:
        OSError: the address cannot be bound (in use, not this machine's, not allowed).
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


async def serve(app: ASGIApp, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM (uvicorn's logging left unconfigured: the CLI's applies)."""
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", server_header=False)
    await _Server(config).serve(sockets=[sock])
