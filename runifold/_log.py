"""How runifold logs: structlog-style calls that become standard ``logging`` records by default.

Every module takes its logger from :func:`get_logger` and logs a fixed
snake_case event name with key-value fields::

    log = get_logger("runifold.worker")
    log.bind(run_id=run_id).warning("step_failed", key="charge#1", error="...")

Where a call goes is the application's choice, made when the call is made
(so configuring before or after importing runifold makes no difference):

* If the application configured structlog (``structlog.configure(...)``),
  the call goes to ``structlog.get_logger(name)`` with the bound fields, and
  the application's processors do the rest.
* Otherwise it becomes a record of the standard library logger of the same
  name (``logging.getLogger("runifold.worker")``). The ``runifold`` logger
  holds a ``NullHandler``, so nothing is printed until the application
  configures logging (``logging.basicConfig(level=logging.WARNING)``). The
  level is checked before anything else, so a disabled call costs a method
  call and a comparison.

A record's message is the event name followed by its fields as
``key=value``; the fields are also on the record: ``record.event`` (the event
name), ``record.fields`` (every field, bound ones included) and each field as
an attribute of its own unless ``logging.LogRecord`` already uses that name
(``name``, ``msg``, ...). ``exc_info=exc`` (or :meth:`Logger.exception`)
attaches a traceback.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any, final

import structlog

ROOT = "runifold"

# The library never prints unless the application asks: records stop at this
# handler unless the application (or the CLI) configured logging.
logging.getLogger(ROOT).addHandler(logging.NullHandler())

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "event", "fields"}


def context_var(name: str) -> contextvars.ContextVar[Any]:
    """The context variable behind structlog's context-local field ``name`` (what ``bind_contextvars`` sets).

    Setting it directly binds the field for log lines of the current context at the cost of a plain
    ``ContextVar.set``, for a field bound around every step body.
    """
    token = structlog.contextvars.bind_contextvars(**{name: ...})[name]
    token.var.reset(token)
    return token.var


def get_logger(name: str) -> Logger:
    """Return the logger of ``name`` (a dotted name under ``runifold``)."""
    if name != ROOT and not name.startswith(ROOT + "."):
        raise ValueError(f"runifold loggers live under {ROOT!r}, got {name!r}")
    return Logger(logging.getLogger(name), {})


@final
class Logger:
    """A structlog-style logger: ``bind`` fields, then log an event name with more fields."""

    __slots__ = ("_context", "_logger")

    def __init__(self, logger: logging.Logger, context: dict[str, Any]) -> None:
        self._logger = logger
        self._context = context

    @property
    def name(self) -> str:
        return self._logger.name

    def bind(self, **fields: Any) -> Logger:
        """Return a logger that adds ``fields`` to every line."""
        return Logger(self._logger, {**self._context, **fields})

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, "error", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """Log at error with the exception being handled attached."""
        fields.setdefault("exc_info", True)
        self._emit(logging.ERROR, "error", event, fields)

    def _emit(self, level: int, method: str, event: str, fields: dict[str, Any]) -> None:
        if structlog.is_configured():
            getattr(structlog.get_logger(self._logger.name, **self._context), method)(event, **fields)
            return
        if not self._logger.isEnabledFor(level):
            return
        exc_info = fields.pop("exc_info", None)
        merged = {**self._context, **fields}
        extra = {k: v for k, v in merged.items() if k not in _RESERVED}
        extra["event"] = event
        extra["fields"] = merged
        # stacklevel 3: the record names the module that called info(), not this one
        self._logger.log(level, render(event, merged), exc_info=exc_info, extra=extra, stacklevel=3)


def render(event: str, fields: dict[str, Any]) -> str:
    """Return ``event key=value ...``; strings that need it are quoted with their control characters escaped."""
    parts = [event]
    for key, value in fields.items():
        if isinstance(value, str):
            text = value if value and value.isprintable() and " " not in value and "=" not in value else repr(value)
        else:
            text = repr(value)
        parts.append(f"{key}={text}")
    return " ".join(parts)
