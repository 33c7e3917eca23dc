"""A waiting run needs no live worker: the worker process exits, the signal arrives, another process finishes."""

from __future__ import annotations

from runifold import SignalGateway, WorkflowTask, open_store
from runifold.history import SignalReceived
from tests.crash.conftest import CrashEnv
from tests.stores.test_waits import APPROVAL, envelope, keyring
from tests.support import entries

APP = "tests.crash.test_signal_after_exit:registry"

from runifold import WorkflowRegistry  # noqa: E402

registry = WorkflowRegistry(APPROVAL)


async def test_signal_after_the_worker_exited(crash_env: CrashEnv) -> None:
    """The run suspends, its worker process exits, the signal is sent, a new worker process completes it; history names the sender."""
    store = await open_store(crash_env.url)
    try:
        await store.enqueue(WorkflowTask("approval", 1, {"order_id": "o1"}, checkpoint_id="o1"))
        first = crash_env.spawn("worker-a", 5.0, APP)
        out, _ = first.communicate(timeout=60)
        assert first.returncode == 0 and out.split() == ["Suspended"], out
        await SignalGateway(store, registry, keyring()).send(envelope("o1", "approve-1", await store.now()))
        second = crash_env.spawn("worker-b", 5.0, APP)
        out, _ = second.communicate(timeout=60)
        assert out.split()[-1] == "Completed", out
        [received] = [e.event for e in await entries(store, "o1") if isinstance(e.event, SignalReceived)]
        assert (received.sender, received.signal_id, received.reason) == ("alice", "approve-1", "looks good")
    finally:
        await store.close()
