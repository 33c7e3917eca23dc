"""The ``runifold`` command line. It parses, calls the public API, prints, and returns an exit code.

Every flag has an environment variable: ``--store`` is ``RUNIFOLD_STORE``,
``--idle-wait`` is ``RUNIFOLD_IDLE_WAIT``, and so on (``--help`` lists them).

Exit codes: 0 success; 1 the operation was refused or found a problem (a run
not found, a rejected signal, a diverging replay, a run in the wrong state);
2 bad usage or configuration (including an unreachable store).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

import structlog

from runifold.cli import _drill, _operate, _runs, _signals
from runifold.cli._common import DEFAULT_STORE, UsageError
from runifold.errors import ConfigurationError, RunifoldError, StoreError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runifold", description="Durable async workflows: operate runs and workers.")
    parser.add_argument("--store", default=DEFAULT_STORE, help=f"store URL (default {DEFAULT_STORE})")
    parser.add_argument("--app", help="module:attribute of your WorkflowRegistry")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logs")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                        help="log level on stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    _operate.register(sub)
    _runs.register(sub)
    _signals.register(sub)
    _drill.register(sub)
    apply_environment(parser)
    return parser


def env_name(action: argparse.Action) -> str:
    """The environment variable of a flag: ``--idle-wait`` is ``RUNIFOLD_IDLE_WAIT``."""
    return "RUNIFOLD_" + action.option_strings[-1].lstrip("-").replace("-", "_").upper()


def apply_environment(parser: argparse.ArgumentParser) -> None:
    """Give every flag of ``parser`` and its subcommands an environment variable.

    A set variable becomes the flag's default (so a flag given on the command
    line still wins) and satisfies a required flag; ``--help`` names each one.
    """
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                apply_environment(sub)
            continue
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        name = env_name(action)
        action.help = f"{action.help or ''} (env {name})".strip()
        value = os.environ.get(name)
        if value is None:
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            action.default = value.lower() in ("1", "true", "yes", "on")
        else:
            action.default = value  # argparse converts string defaults with the flag's type
        action.required = False


def _configure_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.debug else getattr(logging, args.log_level.upper())
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args)
    try:
        return int(asyncio.run(args.handler(args)))
    except KeyboardInterrupt:
        return 130
    except (UsageError, ConfigurationError, StoreError) as exc:
        if args.debug:
            raise
        print(f"runifold: error: {exc}", file=sys.stderr)
        return 2
    except RunifoldError as exc:
        if args.debug:
            raise
        print(f"runifold: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
