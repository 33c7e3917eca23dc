"""How the command line shows runifold's logs: one line per record on stderr, as text or JSON."""

from __future__ import annotations

import logging
import sys
from typing import Any

import msgspec

from runifold.cli._text import iso, printable

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("console", "json")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return dict(fields) if isinstance(fields, dict) else {}


def _timelike(key: str) -> bool:
    return key.endswith(("_at", "_until")) or key in ("until", "deadline", "tick")


class ConsoleFormatter(logging.Formatter):
    """``<time> <level> <event> key=value ...``, control characters escaped, store times as ISO-8601."""

    def format(self, record: logging.LogRecord) -> str:
        event = getattr(record, "event", None)
        if isinstance(event, str):
            parts = [event]
            for key, value in _fields(record).items():
                if _timelike(key) and isinstance(value, (int, float)) and not isinstance(value, bool):
                    text = iso(value)
                elif isinstance(value, str):
                    text = value if value and value.isprintable() and " " not in value else repr(value)
                else:
                    text = printable(repr(value))
                parts.append(f"{key}={text}")
            message = " ".join(parts)
        else:
            message = printable(record.getMessage())
        line = f"{iso(record.created)} {record.levelname.lower():<7} {record.name} {message}"
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            line += "\n" + "\n".join("    " + printable(t) for t in trace.splitlines())
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``at``, ``level``, ``logger``, ``event``, the fields, ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        event = getattr(record, "event", None)
        line: dict[str, Any] = {"at": iso(record.created), "level": record.levelname.lower(), "logger": record.name,
                                "event": event if isinstance(event, str) else record.getMessage()}
        for key, value in _fields(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return msgspec.json.encode(line, enc_hook=repr).decode()


def configure(level: str, form: str) -> None:
    """Send runifold's records at ``level`` and above to stderr in ``form`` (``console`` or ``json``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if form == "json" else ConsoleFormatter())
    logger = logging.getLogger("runifold")
    for old in [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(getattr(logging, level.upper()))
