"""What every command shares: the store and app options, output as tables or JSON."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from runifold.stores import WorkflowStore, open_store
from runifold.worker import WorkflowRegistry

DEFAULT_STORE = "sqlite:///runifold-workflows.db"


class UsageError(Exception):
    """Bad command-line input: exit code 2."""


async def store_of(args: argparse.Namespace) -> WorkflowStore:
    return await open_store(args.store)


def registry_of(args: argparse.Namespace) -> WorkflowRegistry:
    """Import the registry named by ``--app module:attribute``."""
    if not args.app:
        raise UsageError("this command needs the workflows: pass --app module:attribute or set RUNIFOLD_APP")
    module_name, _, attribute = args.app.partition(":")
    if not attribute:
        raise UsageError(f"--app {args.app!r} must look like module:attribute, e.g. examples.order_intake:registry")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r} for --app: {exc}") from exc
    registry = getattr(module, attribute, None)
    if not isinstance(registry, WorkflowRegistry):
        raise UsageError(f"{args.app} is not a WorkflowRegistry")
    return registry


def parse_json(text: str, what: str) -> Any:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise UsageError(f"{what} is not valid JSON ({exc}); quote it for the shell, e.g. '{{\"order_id\": \"o1\"}}'") from exc


def when(ts: float | None) -> str:
    """Format a store timestamp as UTC ISO-8601 (to the millisecond)."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def emit_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as aligned columns under ``headers``."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def compact(value: Any, limit: int = 80) -> str:
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from exc
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be positive")
    return number

