"""The ``runifold`` command line. It parses, calls the public API, prints, and returns an exit code.

Exit codes: 0 success; 1 the operation was refused or found a problem (a run
not found, a rejected signal, a diverging replay, a run in the wrong state);
2 bad usage or configuration (including an unreachable store).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

import structlog

from runifold.cli import _drill, _operate, _runs, _signals
from runifold.cli._common import DEFAULT_STORE, UsageError, env_default
from runifold.errors import ConfigurationError, RunifoldError, StoreError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runifold", description="Durable async workflows: operate runs and workers.")
    parser.add_argument("--store", default=env_default("RUNIFOLD_STORE", DEFAULT_STORE),
                        help=f"store URL (env RUNIFOLD_STORE, default {DEFAULT_STORE})")
    parser.add_argument("--app", default=env_default("RUNIFOLD_APP"),
                        help="module:attribute of your WorkflowRegistry (env RUNIFOLD_APP)")
    parser.add_argument("--json", action="store_true", default=bool(env_default("RUNIFOLD_JSON")),
                        help="machine-readable output (env RUNIFOLD_JSON)")
    parser.add_argument("--debug", action="store_true", default=bool(env_default("RUNIFOLD_DEBUG")),
                        help="tracebacks and debug logs (env RUNIFOLD_DEBUG)")
    parser.add_argument("--log-level", default=env_default("RUNIFOLD_LOG_LEVEL", "warning"),
                        choices=["debug", "info", "warning", "error"], help="log level on stderr (env RUNIFOLD_LOG_LEVEL)")
    sub = parser.add_subparsers(dest="command", required=True)
    _operate.register(sub)
    _runs.register(sub)
    _signals.register(sub)
    _drill.register(sub)
    return parser


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
