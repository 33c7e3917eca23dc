"""The application side: :func:`connect`, :class:`Client` and :class:`RunHandle`."""

from runifold.client._client import POLL_SECONDS, Client, RunHandle, connect

__all__ = ["POLL_SECONDS", "Client", "RunHandle", "connect"]
