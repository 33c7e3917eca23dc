"""SQLite's errors as runifold's: the one place an error name becomes a message that says what to do."""

from __future__ import annotations

import os
import sqlite3

from runifold.errors import StoreError, StoreUnavailableError

_BUSY = {"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_BUSY_SNAPSHOT", "SQLITE_BUSY_RECOVERY", "SQLITE_LOCKED_SHAREDCACHE"}
_CANNOT_WRITE = {"SQLITE_CANTOPEN", "SQLITE_CANTOPEN_ISDIR", "SQLITE_PERM", "SQLITE_READONLY"}


def errorname(exc: sqlite3.Error) -> str:
    return getattr(exc, "sqlite_errorname", "") or type(exc).__name__


def is_busy(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.Error) and errorname(exc) in _BUSY


def translate(exc: sqlite3.Error, path: str) -> StoreError:
    """The runifold error for ``exc``, raised on the SQLite database at ``path``, by its error name."""
    name = errorname(exc)
    if is_busy(exc):
        return StoreUnavailableError(
            f"the SQLite database {path} stayed locked ({name}) past the busy budget; another process holds a "
            "long write transaction. Retry later, raise busy_seconds, or move many concurrent writers to PostgreSQL"
        )
    if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        return StoreError(f"the SQLite database {path} is not a SQLite database, or is damaged ({name}: {exc}); check "
                          "the path, or restore the file from a backup")
    if name == "SQLITE_FULL" or name.startswith("SQLITE_IOERR"):
        return StoreUnavailableError(
            f"cannot write the SQLite database {path} ({name}: {exc}): the disk is full or failing; free space "
            f"(keep room for the write-ahead log {path}-wal beside it, several MB) or check the disk; workers go on "
            "once it is writable again")
    if name in _CANNOT_WRITE:
        return StoreUnavailableError(
            f"cannot write the SQLite database {path} ({name}: {exc}); check that the file and its folder exist and "
            "are writable, or open it read-only (sqlite:///path?mode=ro) for commands that only read"
        )
    if name == "SQLITE_ERROR" and "already exists" in str(exc):
        return StoreError(f"the SQLite database {path} holds tables of another application ({exc}), which runifold's "
                          "schema cannot share: give runifold a database file of its own")
    return StoreError(f"SQLite error {name} on {path}: {exc}")


def open_error(exc: sqlite3.Error, path: str) -> StoreError:
    """The runifold error for ``exc``, raised opening the SQLite database at ``path``."""
    where = os.path.abspath(path)
    folder = os.path.dirname(where)
    if not is_busy(exc) and not os.path.isdir(folder):
        return StoreUnavailableError(
            f"cannot open the SQLite database {where}: the directory {folder} does not exist; create it, "
            "or check the path")
    if os.path.isdir(where):
        return StoreUnavailableError(f"cannot open the SQLite database {where}: it is a directory; give the path of "
                                     "a file in it (e.g. sqlite:///path/to/folder/runifold.db)")
    if is_busy(exc) or errorname(exc) not in _CANNOT_WRITE:
        return translate(exc, where)
    return StoreUnavailableError(
        f"cannot open the SQLite database {where} ({errorname(exc)}: {exc}); check that the path "
        "exists and is writable, or open it read-only (sqlite:///path?mode=ro) for commands that only read"
    )
