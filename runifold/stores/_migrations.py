"""Versioned schema migrations, kept as numbered ``.sql`` files next to each store."""

from __future__ import annotations

from importlib import resources


def migrations(dialect: str) -> list[tuple[int, str]]:
    """Return ``(version, sql)`` for every migration of ``dialect``, in order."""
    folder = resources.files("runifold.stores").joinpath("sql", dialect)
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text(encoding="utf-8")))
    return sorted(found)
