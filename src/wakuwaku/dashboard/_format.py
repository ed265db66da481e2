"""How the dashboard writes times, distances in time and text from records,
and reads numbers from URLs and forms (every page and the controls use them)."""

from __future__ import annotations

import datetime

__all__ = ("MAX_NUMBER", "path_number", "printable", "relative", "when")


def when(seconds: float | None) -> str:
    """A time to the second with its zone, ``2026-05-01 10:15:04 UTC`` (``-``
    for None; ``<n> s since the epoch`` for a time no date can show)."""
    if seconds is None:
        return "-"
    try:
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (ValueError, OverflowError, OSError):
        return f"{seconds:.0f} s since the epoch"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(seconds: float, now: float) -> str:
    """``in 3.2 s`` / ``due now`` / ``12 s ago`` style distance to ``seconds``."""
    delta = seconds - now
    if abs(delta) < 0.05:
        return "now"
    if delta > 0:
        return f"in {delta:.1f} s"
    return f"{-delta:.1f} s ago"


def printable(text: str | None, limit: int | None = 200) -> str:
    """``text`` with non-printable characters as ``\\uXXXX`` (the template still
    escapes it), cut after ``limit`` characters with the count cut."""
    if text is None:
        return "-"
    cut = ""
    if limit is not None and len(text) > limit:
        cut = f"...({len(text) - limit} more characters)"
        text = text[:limit]
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text) + cut


MAX_NUMBER = 2**63 - 1
"""The largest partition or offset a URL may name (offsets are int64 in every log)."""


def path_number(raw: str) -> int | None:
    """A partition, offset or page number from a URL: an int from 0 to
    :data:`MAX_NUMBER` written in ASCII digits, None for anything else (a sign,
    a fraction, other digits, more than 19 digits)."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > len(str(MAX_NUMBER)):
        return None
    value = int(raw)
    return value if value <= MAX_NUMBER else None
