"""The shipped conformance suite, run against memory, SQLite and PostgreSQL."""

from runifold.testing import StoreConformance


class TestEveryStore(StoreConformance):
    """Uses the ``store`` fixture from conftest, parametrised over every store."""
