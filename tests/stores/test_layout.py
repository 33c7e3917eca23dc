"""The stores' shape: modules stay small, each store's SQL lives in its named files, every named query is used."""

from __future__ import annotations

import re
from pathlib import Path

from runifold.stores import _sql

STORES = Path(__file__).resolve().parents[2] / "runifold" / "stores"


def test_no_module_is_over_800_lines() -> None:
    """Every module of the package (the stores' and all others) is at most 800 lines."""
    sizes = {str(p.relative_to(STORES.parent)): len(p.read_text().splitlines()) for p in STORES.parent.rglob("*.py")}
    assert len(sizes) > 50 and max(sizes.values()) <= 800, {name: n for name, n in sizes.items() if n > 800}


def test_each_store_keeps_one_baseline_schema_and_uses_every_named_query() -> None:
    """sql/<dialect>/ holds schema.sql (version 1), migrations numbered on from it (``0002_<what>.sql``, ...) and
    queries.sql, and the store's code (its module and its ``_<dialect>_*.py`` helpers) uses every query it names."""
    for dialect in ("sqlite", "postgres"):
        folder = STORES / "sql" / dialect
        names = sorted(p.name for p in folder.glob("*.sql"))
        assert names[-2:] == ["queries.sql", "schema.sql"]
        assert all(re.fullmatch(r"\d{4}_[a-z_]+\.sql", name) for name in names[:-2]), names
        assert [v for v, _ in _sql.migrations(dialect)] == list(range(1, len(names)))
        modules = [STORES / f"{dialect}.py", *sorted(STORES.glob(f"_{dialect}_*.py"))]
        code = "".join(p.read_text() for p in modules)
        unused = [name for name in _sql.queries(dialect)
                  if not re.search(rf"""["']{name}["']""", code)]
        assert unused == [], f"{dialect} queries never sent: {unused}"
