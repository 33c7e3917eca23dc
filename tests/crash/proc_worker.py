"""A worker process for crash tests: ``python -m tests.crash.proc_worker STORE WORKER_ID LEASE_SECONDS [APP]``.

``APP`` is ``module:attribute`` naming a WorkflowRegistry (default: the crash
app). Prints one line per outcome (the outcome's class name) and exits after a
terminal outcome or a suspension, or after 30 s without one.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import time
from datetime import timedelta

from runifold import Completed, Failed, Idle, LeaseDuration, LeaseLost, Suspended, WorkerId, WorkflowRegistry, WorkflowWorker, open_store


async def main(url: str, worker_id: str, lease: float, app: str = "tests.crash.app:registry") -> None:
    module, _, attribute = app.partition(":")
    registry: WorkflowRegistry = getattr(importlib.import_module(module), attribute)
    store = await open_store(url)
    worker = WorkflowWorker(store, registry, WorkerId.parse(worker_id), LeaseDuration(timedelta(seconds=lease)),
                            timedelta(seconds=lease / 4))
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            outcome = await worker.run_once()
            print(type(outcome).__name__, flush=True)
            if isinstance(outcome, (Completed, Failed, LeaseLost, Suspended)):
                return
            if isinstance(outcome, Idle) and os.environ.get("RUNIFOLD_TEST_EXIT_IDLE"):
                return
            await asyncio.sleep(0.05)
    finally:
        await store.close()


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), *sys.argv[4:]))
