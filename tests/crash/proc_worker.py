"""A worker process for crash tests: ``python -m tests.crash.proc_worker STORE WORKER_ID LEASE_SECONDS``.

Prints one line per outcome (the outcome's class name) and exits after a
terminal outcome, or after 30 s without one.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import timedelta

from runifold import Completed, Failed, LeaseDuration, LeaseLost, WorkerId, WorkflowWorker, open_store
from tests.crash.app import registry


async def main(url: str, worker_id: str, lease: float) -> None:
    store = await open_store(url)
    worker = WorkflowWorker(store, registry, WorkerId.parse(worker_id), LeaseDuration(timedelta(seconds=lease)),
                            timedelta(seconds=lease / 4))
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            outcome = await worker.run_once()
            print(type(outcome).__name__, flush=True)
            if isinstance(outcome, (Completed, Failed, LeaseLost)):
                return
            await asyncio.sleep(0.05)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
