"""Record the golden histories: ``python -m tests.histories.record`` (run from the project root).

Each file is the stored log of one example run, as JSON rows (seq, at, type,
key, body). Re-record only when a change is meant to alter histories, and
then give the workflow a new version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from datetime import timedelta
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples import approval, order_intake  # noqa: E402
from runifold import LeaseDuration, WorkerId, WorkflowTask, WorkflowWorker, open_store, sign  # noqa: E402
from runifold.signals import SignalEnvelope, SignalGateway  # noqa: E402

HERE = Path(__file__).parent


async def record(name: str, registry: object, task: WorkflowTask, signal: bool = False) -> None:
    store = await open_store("memory:")
    await store.enqueue(task)
    worker = WorkflowWorker(store, registry, WorkerId.parse("recorder"), LeaseDuration(timedelta(seconds=30)),  # type: ignore[arg-type]
                            timedelta(seconds=10))
    await worker.run_once()
    if signal:
        envelope = SignalEnvelope(target=task.checkpoint_id or "", name="approval", payload={"approved": True},
                                  signal_id="golden-1", sender="alice", reason="golden history",
                                  key_id="alice-2026", timestamp=time.time())
        await SignalGateway(store, approval.registry, approval.keys).send(
            sign(envelope, approval.keys.secret_of("alice-2026")))
        await worker.run_once()
    rows = [{"seq": e.seq, "at": e.at, "type": e.type, "key": e.key, "body": json.loads(e.body)}
            for e in await store.history(task.checkpoint_id or "")]
    (HERE / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")


async def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    await record("order_intake_v1", order_intake.registry,
                 WorkflowTask("order-intake", 1, {"order_id": "ord_golden"}, checkpoint_id="ord_golden"))
    await record("order_approval_v1", approval.registry,
                 WorkflowTask("order-approval", 1, {"order_id": "ord_golden"}, checkpoint_id="ord_golden"), signal=True)


if __name__ == "__main__":
    asyncio.run(main())
