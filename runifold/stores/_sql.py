"""The SQL each store runs, kept as files next to it.

``sql/<dialect>/schema.sql`` is the baseline schema (version 1), readable on
its own. Later versions come as ``sql/<dialect>/NNNN_<what>.sql`` migrations
(``0002_...``), applied in order on open; applied ones are never edited.
``sql/<dialect>/queries.sql`` holds every statement the store sends, each
under a ``-- name: <name>`` line. A statement that looks a run up by
reference has ``{ref}`` where the column goes (``run_id`` or
``checkpoint_id``, see :func:`runifold.stores._protocol.ref_column`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from runifold.errors import StoreError

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _folder(dialect: str):  # type: ignore[no-untyped-def]
    return resources.files("runifold.stores").joinpath("sql", dialect)


def migrations(dialect: str) -> list[tuple[int, str]]:
    """Return ``(version, sql)`` for the baseline and every later migration of ``dialect``, in order."""
    folder = _folder(dialect)
    found = [(1, folder.joinpath("schema.sql").read_text(encoding="utf-8"))]
    for entry in folder.iterdir():
        if re.match(r"^\d{4}_\w+\.sql$", entry.name):
            found.append((int(entry.name[:4]), entry.read_text(encoding="utf-8")))
    return sorted(found)


def queries(dialect: str) -> dict[str, str]:
    """Return the named statements of ``dialect``."""
    text = _folder(dialect).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    return {name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def by_ref(statement: str) -> dict[str, str]:
    """The two forms of a statement that looks a run up by reference, keyed by column."""
    return {column: statement.replace("{ref}", column) for column in ("run_id", "checkpoint_id")}


def numbered(values: Sequence[Any]) -> dict[str, Any]:
    """The parameters of a SQLite statement with numbered placeholders (``?1``, ``?2``, ...): sqlite3 binds
    those by name, and Python 3.12 deprecates (3.14 refuses) a sequence for them."""
    return {str(n): value for n, value in enumerate(values, 1)}


def closed_store(where: str) -> StoreError:
    """The error for an operation on a store after its ``close()``."""
    return StoreError(f"{where} was closed; open the store again (open_store) to use it")


def newer_schema(where: str, found: int, known: int) -> StoreError:
    """The error for a database whose schema is newer than this code."""
    return StoreError(
        f"the runifold schema of {where} is version {found}, newer than this runifold knows (up to {known}); "
        "upgrade runifold to the version that migrated it"
    )
