"""The ``runifold`` command line. It parses, calls the public API, prints, and returns an exit code.

Every flag has an environment variable: ``--store`` is ``RUNIFOLD_STORE``,
``--idle-wait`` is ``RUNIFOLD_IDLE_WAIT``, and so on (``--help`` lists them).
The shared flags (``--store``, ``--app``, ``--json``, ``--debug``,
``--log-level``, ``--log-format``) go anywhere on the line, before or after
the command.

Exit codes:

* 0 success;
* 1 refused, or a problem found: a run not found, a rejected signal, a
  diverging replay, a run in the wrong state, a failed drill step;
* 2 bad usage or configuration: an unknown flag or a bad value, a missing or
  malformed key file, no key ring for ``signal``, a store file that does not
  exist, an unreachable store, an argument that is not UTF-8;
* 3 an unexpected internal error (a bug: rerun with ``--debug`` and report
  the traceback);
* 130 interrupted (Ctrl-C) outside the worker;
* 141 the reader of the output went away (``runifold runs list | head``);
  not the worker, whose output only informs: it runs on without it.

A standard stream closed at start (``>&-``) is the null device.

Errors are one line on stderr unless ``--debug``, which adds the traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import NoReturn

from runifold.cli import _drill, _keys, _logging, _operate, _recover, _runs, _schedules, _signals, _ui
from runifold.cli._common import DEFAULT_STORE, ArgumentError, UsageError, drop_output
from runifold.cli._text import printable
from runifold.errors import ConfigurationError, RunifoldError, StoreError

EXIT_REFUSED, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_PIPE = 1, 2, 3, 130, 141


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line that points to ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {printable(message)} (see `{self.prog} --help`)\n")


def _version() -> str:
    try:
        return version("runifold")
    except PackageNotFoundError:
        return "unknown (not installed)"


def add_shared_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The flags every command takes; on a subcommand they default to "not given", so the top level's value stands."""
    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    group = parser.add_argument_group("shared options (anywhere on the line)")
    group.add_argument("--store", default=default(DEFAULT_STORE), help=f"store URL (default {DEFAULT_STORE})")
    group.add_argument("--app", default=default(None), help="module:attribute of your WorkflowRegistry")
    group.add_argument("--json", action="store_true", default=default(False), help="machine-readable output on stdout")
    group.add_argument("--debug", action="store_true", default=default(False),
                       help="tracebacks with errors, and debug logs")
    group.add_argument("--log-level", default=default("warning"), choices=_logging.LEVELS, type=str.lower,
                       help="least severe log records shown on stderr (default warning)")
    group.add_argument("--log-format", default=default("console"), choices=_logging.FORMATS, type=str.lower,
                       help="log records as text lines or JSON objects (default console)")


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield sub
                yield from _subparsers(sub)


def _parser_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command's parser that parsed ``args``: the one whose handler they carry (the top level's if none)."""
    handler = getattr(args, "handler", None)
    return next((sub for sub in _subparsers(parser) if handler is not None and sub.get_default("handler") is handler),
                parser)


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(prog="runifold", description="Durable async workflows: operate runs and workers.")
    parser.add_argument("--version", action="version", version=f"runifold {_version()}")
    add_shared_options(parser, top=True)
    # not required here: an unknown flag with no command is named first (see main), not "COMMAND is required"
    sub = parser.add_subparsers(dest="command", required=False, metavar="COMMAND")
    _operate.register(sub)
    _runs.register(sub)
    _recover.register(sub)
    _signals.register(sub)
    _keys.register(sub)
    _drill.register(sub)
    _ui.register(sub)
    _schedules.register(sub)
    for child in _subparsers(parser):
        add_shared_options(child, top=False)
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
            for sub in dict.fromkeys(action.choices.values()):
                apply_environment(sub)
            continue
        if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        if getattr(action, "no_environment", False):
            continue
        name = env_name(action)
        action.help = f"{action.help or ''} (env {name})".strip()
        value = os.environ.get(name)
        if value is None or action.default is argparse.SUPPRESS:  # a shared flag's copy: the top level reads it
            continue
        action.default = _from_environment(action, name, value)
        action.required = False


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class _Unreadable:
    """An environment variable's value that its flag does not take: refused once its command is parsed (argparse
    checks a flag's choices only of what the command line gave, and a switch takes no value there at all)."""

    def __init__(self, message: str) -> None:
        self.message = message


def _from_environment(action: argparse.Action, name: str, value: str) -> object:
    """The default that the variable ``name`` set to ``value`` gives ``action``."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        flag = value.strip().lower()
        if flag in _TRUE + _FALSE:
            return flag in _TRUE
        return _Unreadable(f"{name}={value!r} is neither true (1, true, yes, on) nor false (0, false, no, off, "
                           "or empty)")
    if action.choices is not None:
        try:
            chosen = (action.type or str)(value)  # type: ignore[operator]
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            return value  # argparse says what is wrong with it, as of the flag's own value
        if chosen not in action.choices:
            return _Unreadable(f"argument {'/'.join(action.option_strings)}: invalid choice: {value!r} (from the "
                               f"flag or {name}; choose from {', '.join(repr(str(c)) for c in action.choices)})")
    return value  # argparse converts string defaults with the flag's type


def _not_utf8(arguments: Sequence[str]) -> str | None:
    """Describe the first argument or RUNIFOLD_* variable that is not valid UTF-8, if any."""
    named = [(f"argument {i + 1}", a) for i, a in enumerate(arguments)]
    named += [(f"environment variable {k}", v) for k, v in os.environ.items() if k.startswith("RUNIFOLD_")]
    for what, text in named:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return f"{what} is not valid UTF-8 ({printable(text)}); pass text in UTF-8"
    return None


def _fail(args: argparse.Namespace, exc: BaseException, code: int, prefix: str) -> int:
    if args.debug:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"runifold: {prefix}{printable(str(exc))}", file=sys.stderr)
    return code


def _closed_pipe() -> int:
    """The reader went away (``| head``): stop quietly, and keep the interpreter's last flush from failing again."""
    drop_output()
    return EXIT_PIPE


def _open_standard_streams() -> None:
    """Give a standard stream closed at start (``>&- 2>&-``) the null device.

    Python leaves such a stream None (a print is lost, a flush raises), and the next file opened takes its
    number, so a write meant for it would land in that file.
    """
    for name in ("stdin", "stdout", "stderr"):
        if getattr(sys, name) is None:
            # the lowest free number: the stream's own where it was closed (the lower ones are open by now)
            fd = os.open(os.devnull, os.O_RDWR)
            setattr(sys, name, open(fd, "r" if name == "stdin" else "w", encoding="utf-8", errors="backslashreplace"))


def _command_parser(parser: argparse.ArgumentParser, words: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of the (sub)command the first of ``words`` names (``runs list``: the deepest one named)."""
    for word in words:
        chosen = next((a.choices[word] for a in parser._actions
                       if isinstance(a, argparse._SubParsersAction) and word in a.choices), None)
        if chosen is None:
            break
        parser = chosen
    return parser


def _flag(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    """The flag of ``parser`` that ``name`` names: exactly, or abbreviated as argparse allows (one flag it begins)."""
    actions = parser._option_string_actions
    if name in actions:
        return actions[name]
    begun = {a for o, a in actions.items() if name.startswith("--") and o.startswith(name)}
    return begun.pop() if len(begun) == 1 else None


def _misplaced_flag(parser: argparse.ArgumentParser,
                    arguments: Sequence[str]) -> tuple[argparse.ArgumentParser, str] | None:
    """A flag before the command that runifold itself does not take: the command's parser and what to say.

    argparse would take such a flag's value (``runifold --lease 3 worker``) for the command's name and report an
    invalid command instead of the flag."""
    commands = {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}

    flag: str | None = None
    expects_value = False
    for i, argument in enumerate(arguments):
        if expects_value:
            expects_value = False
            continue
        if argument == "--":
            return None
        if argument in commands:
            if flag is None:
                return None
            command = _command_parser(parser, arguments[i:])
            if _flag(command, flag) is not None:
                return command, f"{flag} is a flag of the command: give it after `{command.prog}`"
            return command, f"unrecognized arguments: {flag}"
        name = argument.split("=", 1)[0]
        action = _flag(parser, name)
        if action is not None:
            expects_value = action.nargs != 0 and "=" not in argument
        elif flag is None and name.startswith("-"):
            flag = name
    return None


def main(argv: Sequence[str] | None = None) -> int:
    _open_standard_streams()
    arguments = list(sys.argv[1:] if argv is None else argv)
    problem = _not_utf8(arguments)
    if problem:
        print(f"runifold: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser()
    try:
        misplaced = _misplaced_flag(parser, arguments)
        if misplaced is not None:
            misplaced[0].error(misplaced[1])
        args, unknown = parser.parse_known_args(arguments)
        if unknown:  # blamed on the command that took the others, pointing at its --help
            _parser_of(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
        if args.command is None:
            parser.error("the following arguments are required: COMMAND")
        unreadable = next(((d, v) for d, v in vars(args).items() if isinstance(v, _Unreadable)), None)
        if unreadable is not None:  # a shared flag's is said as runifold's own, a command's as that command's
            shared = any(a.dest == unreadable[0] for a in parser._actions)
            (parser if shared else _parser_of(parser, args)).error(unreadable[1].message)
    except SystemExit as exc:  # --help and --version (0), or a usage error argparse already printed (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except BrokenPipeError:
        return _closed_pipe()
    _logging.configure("debug" if args.debug else args.log_level, args.log_format)
    try:
        code = int(asyncio.run(args.handler(args)))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ArgumentError as exc:  # a bad argument the command found: said as argparse says one, naming the command
        command = _parser_of(parser, args).prog
        if args.debug:
            traceback.print_exception(exc, file=sys.stderr)
        print(f"{command}: error: {printable(str(exc))} (see `{command} --help`)", file=sys.stderr)
        return EXIT_USAGE
    except (UsageError, ConfigurationError, StoreError, OSError) as exc:
        return _fail(args, exc, EXIT_USAGE, "error: ")
    except RunifoldError as exc:
        return _fail(args, exc, EXIT_REFUSED, "")
    except Exception as exc:  # noqa: BLE001 - a bug: one line, and the traceback with --debug
        return _fail(args, exc, EXIT_INTERNAL,
                     f"unexpected error (a bug; rerun with --debug and report the traceback): {type(exc).__name__}: ")


if __name__ == "__main__":
    sys.exit(main())
