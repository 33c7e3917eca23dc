"""Testing workflows and stores.

``WorkflowEnvironment`` runs workflows on the memory store with time you control
(see ``docs/testing.md``); ``FakeClock`` is the clock it uses. Neither needs
pytest.

``StoreConformance`` is the suite every runifold store passes (it needs pytest).
To check a store of your own, subclass it in a test module and provide a
``store`` fixture::

    class TestMyStore(StoreConformance):
        @pytest.fixture
        async def store(self):
            s = await MyStore.open(...)
            yield s
            await s.close()
"""

from typing import TYPE_CHECKING, Any

from runifold.testing._clock import FakeClock
from runifold.testing._environment import WorkflowEnvironment

if TYPE_CHECKING:
    from runifold.testing._conformance import StoreConformance

__all__ = ["FakeClock", "StoreConformance", "WorkflowEnvironment"]


def __getattr__(name: str) -> Any:
    # the conformance suite imports pytest: load it only when asked for
    if name == "StoreConformance":
        from runifold.testing._conformance import StoreConformance

        return StoreConformance
    raise AttributeError(name)
