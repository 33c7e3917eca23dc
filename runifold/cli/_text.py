"""Text a person reads: store times as ISO-8601 UTC, and strings with their control characters escaped."""

from __future__ import annotations

import math
from datetime import UTC, datetime


def iso(ts: float | None) -> str:
    """Format a store timestamp (seconds since the epoch) as UTC ISO-8601 to the millisecond; ``-`` for none."""
    if ts is None or not math.isfinite(ts):
        return "-"
    try:
        moment = datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError):
        return repr(ts)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def printable(text: str) -> str:
    """Return ``text`` on one line with every non-printable character escaped.

    Control characters (ESC, CR, newline, C1), format characters (bidi
    overrides) and unpaired surrogates become ``\\x1b``, ``\\n``, ``\\u202e``,
    ..., so nothing read from a store or a signal can move the cursor, colour
    the terminal, or make one line look like another.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def clip(text: str, limit: int) -> str:
    """Return ``text`` cut to ``limit`` characters, ending in ``…`` when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
