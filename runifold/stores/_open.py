"""Choosing a store by URL."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit, urlunsplit

from runifold.errors import ConfigurationError, StoreError

if TYPE_CHECKING:
    from runifold.stores._protocol import WorkflowStore


#: what starts a URL (a scheme of two letters or more: ``C:`` is a drive), as in ``sqllite:///a.db``
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


async def open_store(url: str, *, readonly: bool = False, create: bool = True) -> WorkflowStore:
    """Open the store a URL names.

    ``sqlite:///relative.db``, ``sqlite:////abs/path.db`` or a plain path ending
    in ``.db`` open the embedded SQLite store; ``postgresql://...`` (or
    ``postgres://``) opens PostgreSQL; ``memory:`` an in-memory store.

    ``readonly=True``, or ``?mode=ro`` on a SQLite URL, opens the store for
    commands that only read: a SQLite database must exist, is never created or
    migrated, and may sit on a read-only file system; a PostgreSQL schema must
    exist at this runifold's version, is never created or migrated, and every
    transaction is read-only. The memory store ignores it.

    ``create=False`` (what every command but those that start runs or workers passes)
    opens only a store that exists: a missing SQLite file, or a
    PostgreSQL database with no runifold schema, raises :class:`StoreError`
    instead of being given one (an older schema is migrated).
    """
    sqlite = _sqlite(url)
    if sqlite is not None:
        from runifold.stores.sqlite import SqliteWorkflowStore

        if not create and not os.path.exists(sqlite[0]):
            raise StoreError(f"no SQLite store at {sqlite[0]}: opened to use an existing store, it never creates one; "
                             "check the path, or create the store first (`runifold migrate`, or open_store(url) "
                             "with create=True)")
        return await SqliteWorkflowStore.open(sqlite[0], readonly=readonly or sqlite[1])
    if url == "memory:":
        from runifold.stores.memory import MemoryWorkflowStore

        return MemoryWorkflowStore()
    from runifold.stores.postgres import PostgresWorkflowStore

    return await PostgresWorkflowStore.open(url, readonly=readonly, create=create)


def redacted(url: str) -> str:
    """``url`` as messages, the CLI and the web view show it: a password, in its user part or a ``password=``
    query option (libpq's forms), shown as ``***``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # (not a URL: a SQLite path, say)
        return url
    query = "&".join(f"{k}=***" if k.lower() == "password" else f"{k}{sep}{v}"
                     for k, sep, v in (item.partition("=") for item in parts.query.split("&"))) if parts.query else ""
    if password is None and query == parts.query:
        return url  # (nothing to hide: the URL as given, which urlunsplit might respell)
    if password is not None:
        credentials, _, host = parts.netloc.rpartition("@")
        parts = parts._replace(netloc=f"{credentials.split(':', 1)[0]}:***@{host}")
    return urlunsplit(parts._replace(query=query))


def sqlite_path(url: str) -> str | None:
    """The file a SQLite store URL names, None for another store's URL.

    Raises:
        ConfigurationError: the URL names no store (an unknown scheme, a SQLite URL with two slashes).
    """
    sqlite = _sqlite(url)
    return None if sqlite is None else sqlite[0]


def says_readonly(url: str) -> bool:
    """The URL opens its store read-only (a SQLite URL's ``?mode=ro``)."""
    sqlite = _sqlite(url)
    return sqlite is not None and sqlite[1]


def _sqlite(url: str) -> tuple[str, bool] | None:
    """The file a SQLite URL (or a plain path ending in ``.db``, ``.sqlite`` or ``.sqlite3``) names, and whether it
    says ``?mode=ro``; None for a PostgreSQL or memory URL. The one place a store URL is read."""
    if url.startswith(("postgresql://", "postgres://")):
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises for a port that is no number or out of range, a bad IPv6 host
        except ValueError as exc:  # the URL itself is not repeated: it may hold a password
            raise ConfigurationError(f"unrecognised PostgreSQL URL ({exc}); use postgresql://user@host:port/db") from None
        if "mode" in {key.lower() for key in parse_qs(parts.query)}:  # (else the server refuses "mode" as an unknown setting)
            raise ConfigurationError("?mode=ro is a SQLite URL's: the commands that only read open PostgreSQL "
                                     "read-only by themselves (a role with SELECT rights suffices); drop ?mode=")
        return None
    if url == "memory:":
        return None
    if url.startswith("sqlite://"):
        path, _, query = url.removeprefix("sqlite://").partition("?")
        if path == "/":
            raise ConfigurationError(f"the SQLite URL {url!r} names no file: sqlite:///relative.db or sqlite:////abs/path.db")
        if not path.startswith("/"):
            raise ConfigurationError(f"a SQLite URL takes three slashes before a relative path and four before an "
                                     f"absolute one: sqlite:///{path or 'relative.db'} or sqlite:////abs/path.db, "
                                     f"not {url!r}")
        options = parse_qs(query)
        unknown = set(options) - {"mode"}
        if unknown or options.get("mode", ["rw"])[-1] not in ("ro", "rw", "rwc"):
            raise ConfigurationError(f"unrecognised SQLite URL options {query!r}; the one option is ?mode=ro")
        return path[1:], options.get("mode", [""])[-1] == "ro"
    if url.endswith((".db", ".sqlite", ".sqlite3")) and not _SCHEME.match(url):
        return url, False
    raise ConfigurationError(
        f"unrecognised store URL {url!r}; use sqlite:///relative.db, sqlite:////abs/path.db, a path ending in "
        ".db, .sqlite or .sqlite3, postgresql://user@host/db or memory:"
    )
