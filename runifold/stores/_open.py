"""Choosing a store by URL."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from runifold.errors import ConfigurationError

if TYPE_CHECKING:
    from runifold.stores._protocol import WorkflowStore


async def open_store(url: str, *, readonly: bool = False) -> WorkflowStore:
    """Open the store a URL names.

    ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or a plain path ending
    in ``.db`` open the embedded SQLite store; ``postgresql://...`` (or
    ``postgres://``) opens PostgreSQL; ``memory:`` an in-memory store.

    ``readonly=True``, or ``?mode=ro`` on a SQLite URL, opens the store for
    commands that only read: a SQLite database must exist, is never created or
    migrated, and may sit on a read-only file system; a PostgreSQL schema must
    exist at this runifold's version, is never created or migrated, and every
    transaction is read-only. The memory store ignores it.
    """
    if url.startswith("sqlite://"):
        from runifold.stores.sqlite import SqliteWorkflowStore

        path, _, query = url.removeprefix("sqlite://").partition("?")
        options = parse_qs(query)
        unknown = set(options) - {"mode"}
        if unknown or options.get("mode", ["rw"])[-1] not in ("ro", "rw", "rwc"):
            raise ConfigurationError(f"unrecognised SQLite URL options {query!r}; the one option is ?mode=ro")
        readonly = readonly or options.get("mode", [""])[-1] == "ro"
        return await SqliteWorkflowStore.open(path[1:] if path.startswith("/") else path, readonly=readonly)
    if url.startswith(("postgresql://", "postgres://")):
        from runifold.stores.postgres import PostgresWorkflowStore

        return await PostgresWorkflowStore.open(url, readonly=readonly)
    if url == "memory:":
        from runifold.stores.memory import MemoryWorkflowStore

        return MemoryWorkflowStore()
    if url.endswith((".db", ".sqlite", ".sqlite3")):
        from runifold.stores.sqlite import SqliteWorkflowStore

        return await SqliteWorkflowStore.open(url, readonly=readonly)
    raise ConfigurationError(
        f"unrecognised store URL {url!r}; use sqlite:///path.db, postgresql://user@host/db or memory:"
    )
