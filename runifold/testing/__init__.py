"""Helpers for testing workflows and stores: a fake clock and the store conformance suite.

``StoreConformance`` is the suite every runifold store passes. To check a store
of your own, subclass it in a test module and provide a ``store`` fixture::

    class TestMyStore(StoreConformance):
        @pytest.fixture
        async def store(self):
            s = await MyStore.open(...)
            yield s
            await s.close()
"""

from runifold.testing._clock import FakeClock
from runifold.testing._conformance import StoreConformance

__all__ = ["FakeClock", "StoreConformance"]
