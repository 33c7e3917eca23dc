"""A store used after ``close()`` (helper-36): SQLite's reads waited for ever on a reader thread that had ended,
its writes raised the driver's "Cannot operate on a closed database", and PostgreSQL opened new connections and
went on. SQLite and PostgreSQL now refuse every operation with one StoreError; the memory store holds nothing to
close and keeps answering."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runifold import StoreError, WorkflowTask


async def test_a_closed_store_refuses_every_operation_at_once(open_store: Any) -> None:
    store = await open_store()
    run_id = (await store.enqueue(WorkflowTask("w", 1, {}, checkpoint_id="c1"))).run_id
    await store.close()
    operations = {  # by name, for the traceback
        "get_run": lambda: store.get_run(run_id),
        "history": lambda: store.history(run_id),
        "list_runs": lambda: store.list_runs(),
        "enqueue": lambda: store.enqueue(WorkflowTask("w", 1, {}, checkpoint_id="c2")),
        "claim": lambda: store.claim("w1", ["w"], 30.0),
    }
    for operation in operations.values():
        if open_store.kind == "memory":
            await asyncio.wait_for(operation(), 5)
            continue
        with pytest.raises(StoreError, match=r"was closed; open the store again \(open_store\) to use it"):
            await asyncio.wait_for(operation(), 5)  # (a hang fails here as TimeoutError)
