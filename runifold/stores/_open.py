"""Choosing a store by URL."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runifold.errors import ConfigurationError

if TYPE_CHECKING:
    from runifold.stores._protocol import WorkflowStore


async def open_store(url: str) -> WorkflowStore:
    """Open the store a URL names.

    ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or a plain path ending
    in ``.db`` open the embedded SQLite store; ``postgresql://...`` (or
    ``postgres://``) opens PostgreSQL; ``memory:`` an in-memory store.
    """
    if url.startswith("sqlite://"):
        from runifold.stores.sqlite import SqliteWorkflowStore

        path = url.removeprefix("sqlite://")
        return await SqliteWorkflowStore.open(path[1:] if path.startswith("/") else path)
    if url.startswith(("postgresql://", "postgres://")):
        from runifold.stores.postgres import PostgresWorkflowStore

        return await PostgresWorkflowStore.open(url)
    if url == "memory:":
        from runifold.stores.memory import MemoryWorkflowStore

        return MemoryWorkflowStore()
    if url.endswith((".db", ".sqlite", ".sqlite3")):
        from runifold.stores.sqlite import SqliteWorkflowStore

        return await SqliteWorkflowStore.open(url)
    raise ConfigurationError(
        f"unrecognised store URL {url!r}; use sqlite:///path.db, postgresql://user@host/db or memory:"
    )
