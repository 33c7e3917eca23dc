"""What every command shares: the store and app options, argument types, output as tables or JSON."""

from __future__ import annotations

import argparse
import atexit
import asyncio
import contextlib
import getpass
import importlib
import json
import math
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import msgspec

from runifold.errors import ConfigurationError, SerializationError
from runifold.history import MAX_INT_DIGITS, MAX_VERSION, encode_value

from runifold.cli._text import clip, iso, printable
from runifold.stores import WorkflowStore, open_store
from runifold.stores._open import says_readonly, sqlite_path
from runifold.stores._protocol import ref_column
from runifold.worker import WorkflowRegistry
from runifold.worker._values import MIN_LEASE, LeaseDuration

DEFAULT_STORE = "sqlite:///runifold-workflows.db"

#: the longest duration a seconds flag takes (about 31 years): beyond it a timedelta overflows
MAX_SECONDS = 1e9

__all__ = ["DEFAULT_STORE", "UsageError", "checkpoint_id", "clip", "compact", "drop_output", "emit_json", "operator",
           "parse_json", "positive_int", "printable", "refuse_memory", "refuse_readonly", "registry_of", "seconds",
           "store_of", "table", "text", "when"]


class UsageError(Exception):
    """Bad command-line input or configuration: exit code 2, said as ``runifold: error: ...``."""


class ArgumentError(UsageError):
    """A value (or a combination) of a command's own arguments that the command refuses: said as argparse says a
    bad argument, naming the command and its ``--help``."""


def exit_on_stop_signals() -> None:
    """The command has stopped (said so, released what it held): a SIGTERM or SIGINT from now on ends the process
    at once, with status 0, as it was about to. A second signal sent just after the first otherwise killed it
    during Python's exit (status 143). Until the threads are joined it ends the process at once (an exit held up
    by a thread of the app's included); after that, when Python's exit no longer runs handlers and has no more
    threads to wait for, it is ignored."""
    loop = asyncio.get_running_loop()
    # asyncio's remove_signal_handler puts the default action back before ours could be set, and a signal in
    # between killed the process (status -15): so ours replaces asyncio's handler directly, and the loop forgets
    # its own (the unix loop's table), so that closing it leaves ours in place
    handlers = getattr(loop, "_signal_handlers", None)
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            if isinstance(handlers, dict) and sig in handlers:
                signal.signal(sig, _exit_now)
                del handlers[sig]
            else:
                loop.remove_signal_handler(sig)  # (else closing the loop puts the default action back)
                signal.signal(sig, _exit_now)
    if isinstance(handlers, dict) and not handlers:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)  # (as asyncio does once it handles no signal)
    atexit.register(_ignore_stop_signals)  # (atexit runs once the threads are joined)


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):
            signal.signal(sig, signal.SIG_IGN)


def _exit_now(signum: int, frame: object) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream, or its reader gone: nothing more to say
            stream.flush()
    os._exit(0)


def without_environment(action: argparse.Action) -> None:
    """Give ``action`` no environment variable (see ``apply_environment``)."""
    action.no_environment = True  # type: ignore[attr-defined]


async def store_of(args: argparse.Namespace, *, readonly: bool = False, create: bool = False) -> WorkflowStore:
    """Open the store of ``--store``.

    Only commands that start runs or workers (``create``) may bring a new
    store into being (a SQLite file, or the schema in an empty PostgreSQL
    database); every other command refuses a store that does not exist, so a
    mistyped path or URL is an error, not an empty store. Commands that only
    read (``readonly``) open the store read-only: no migration, nothing written.
    """
    refuse_memory(args)
    try:
        sqlite_path(args.store)
    except ConfigurationError as exc:
        raise UsageError(f"--store: {exc}") from None
    if not readonly:
        refuse_readonly(args)
    return await open_store(args.store, readonly=readonly, create=create)


def registry_of(args: argparse.Namespace) -> WorkflowRegistry:
    """Import the registry named by ``--app module:attribute``."""
    if not args.app:
        raise UsageError("this command needs the workflows: pass --app module:attribute or set RUNIFOLD_APP")
    module_name, _, attribute = args.app.partition(":")
    if not attribute or not module_name:
        raise UsageError(f"--app {args.app!r} must look like module:attribute, e.g. examples.order_intake:registry")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r} for --app: {exc}") from exc
    except (Exception, SystemExit) as exc:  # the module raised (or exited) while importing: the app's error
        raise UsageError(f"importing {module_name!r} for --app raised {type(exc).__name__}: {exc} "
                         "(fix the module; --debug shows the traceback)") from exc
    if not hasattr(module, attribute):
        raise UsageError(f"module {module_name!r} has no {attribute!r} for --app; name the WorkflowRegistry it defines")
    registry = getattr(module, attribute)
    if not isinstance(registry, WorkflowRegistry):
        raise UsageError(f"{args.app} is a {type(registry).__name__}, not a WorkflowRegistry")
    return registry


def parse_json(text: str, what: str) -> Any:
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        problem = _stdlib_only(text)
        if problem == "non-finite":
            raise ArgumentError(f"{what} holds NaN or an infinity, which JSON cannot represent (and runifold does not "
                                "record); use null or a string for a missing or unbounded number") from exc
        if problem == "huge-int":
            raise ArgumentError(f"{what} holds an integer of more than {MAX_INT_DIGITS:,} characters (digits and sign), which runifold "
                                "cannot record; pass it as a string") from exc
        if problem == "surrogate":
            raise ArgumentError(f"{what} holds a \\u escape of a lone surrogate (half of a UTF-16 pair), which is not "
                                "valid Unicode; write the character itself, or both halves of its pair") from exc
        raise ArgumentError(f"{what} is not valid JSON ({exc}); quote it for the shell, e.g. '{{\"order_id\": \"o1\"}}'") from exc
    except RecursionError:
        raise ArgumentError(f"{what} is nested too deeply; pass flatter JSON") from None


def _stdlib_only(text: str) -> str | None:
    """Why the stdlib reads ``text`` as JSON where msgspec refuses it: ``"non-finite"`` (``NaN``, ``Infinity``,
    or a number too large for a float), ``"huge-int"`` (an integer of more digits than msgspec reads),
    ``"surrogate"`` (a lone surrogate escape), or None (it is not JSON)."""
    non_finite = huge = False

    def integer(literal: str) -> int:
        nonlocal huge
        huge = huge or len(literal) > MAX_INT_DIGITS  # (a minus sign counts)
        return 0

    def constant(name: str) -> float:
        nonlocal non_finite
        non_finite = True
        return math.nan

    def number(literal: str) -> float:
        nonlocal non_finite
        value = float(literal)
        non_finite = non_finite or not math.isfinite(value)
        return value

    try:
        json.loads(text, parse_constant=constant, parse_float=number, parse_int=integer)
    except (ValueError, RecursionError):
        return None
    return "non-finite" if non_finite else "huge-int" if huge else "surrogate"


def operator() -> str:
    """The person at the keyboard, recorded as ``by`` unless ``--by`` says otherwise."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown-operator"


def when(ts: float | None) -> str:
    """Format a store timestamp as UTC ISO-8601 (to the millisecond)."""
    return iso(ts)


def drop_output() -> None:
    """Send stdout, what it still holds included, to the null device: its reader went away (a closed pipe), and the
    interpreter's last flush must not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def emit_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")


def table_lines(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Rows as aligned columns under ``headers``, every cell on one line with control characters escaped."""
    cells = [[printable(str(h)) for h in headers]] + [["-" if c is None else printable(str(c)) for c in row]
                                                     for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as aligned columns under ``headers``."""
    for line in table_lines(headers, rows):
        print(line)


def compact(value: Any, limit: int = 80) -> str:
    try:
        text = encode_value(value, what="the value").decode()  # the one codec: pydantic models too
    except SerializationError:
        text = repr(value)
    return printable(clip(text, limit))


def seconds(value: str) -> float:
    """An argparse type: a finite, positive number of seconds (at most about 31 years)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number) or number <= 0 or number > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{value!r} must be a positive, finite number of seconds up to {MAX_SECONDS:g}")
    return number


def lease_seconds(value: str) -> float:
    """An argparse type: a lease, as LeaseDuration takes it."""
    number = seconds(value)
    try:
        LeaseDuration(timedelta(seconds=number))
    except ConfigurationError:
        raise argparse.ArgumentTypeError(f"{value!r} is shorter than a lease may be: give at least "
                                         f"{MIN_LEASE.total_seconds():g} seconds") from None
    return number


def refuse_memory(args: argparse.Namespace) -> None:
    """Refuse ``--store memory:``: it would live and die with this one command (`enqueue` would "succeed")."""
    if args.store == "memory:":
        raise UsageError("--store memory: is a store inside one process, gone when this command ends; the command "
                         "line needs a SQLite file (sqlite:///runifold-workflows.db) or PostgreSQL")


def refuse_readonly(args: argparse.Namespace) -> None:
    """Refuse a ``--store`` URL that opens the store read-only for a command that writes (a worker would start, then
    fail every claim until stopped)."""
    if says_readonly(args.store):
        raise UsageError(f"--store: ?mode=ro opens the store read-only, and `runifold {args.command}` writes to it; "
                         "drop ?mode=ro")


def checkpoint_id(value: str) -> str:
    """An argparse type: a checkpoint id (not empty, and not in the run-id form)."""
    value = text(value)
    if ref_column(value) == "run_id":
        raise argparse.ArgumentTypeError(f"{value!r} starts with 'run_', which is reserved for run ids; choose a "
                                         "checkpoint id without that prefix")
    return value


def text(value: str) -> str:
    """An argparse type: a value that is not empty (a reason, a name, an identity)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def version(value: str) -> int:
    """An argparse type: a workflow version (a whole number from 1)."""
    return positive_int(MAX_VERSION)(value)  # type: ignore[no-any-return]


def positive_int(limit: int) -> Any:
    """An argparse type: an integer from 1 to ``limit``."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not 1 <= number <= limit:
            raise argparse.ArgumentTypeError(f"{value!r} must be from 1 to {limit:,}")
        return number
    parse.__name__ = "number"
    return parse
