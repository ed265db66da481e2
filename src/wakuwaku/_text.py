"""Counts and keys as the command line, the demo and the dashboard print them.

One copy of two small rules that every printed line follows:

- a count takes its noun in the right number: ``1 dead letter``,
  ``2 dead letters``, ``0 keys`` (:func:`plural`);
- a key is quoted and escaped once: ``'a\\x00b'`` for a key holding a NUL,
  not ``'a\\\\u0000b'`` (escaped by hand, then again by ``repr``), and a long
  key is cut with the count of what was cut (:func:`shown_key`).
"""

from __future__ import annotations


def plural(count: int, word: str, many: str | None = None) -> str:
    """``word`` in the number ``count`` asks for: itself for 1, else ``many``
    (default ``word + "s"``). ``f"{n} {plural(n, 'record')}"``."""
    if count == 1:
        return word
    return many if many is not None else word + "s"


def counted(count: int, word: str, many: str | None = None) -> str:
    """``count`` and its noun: ``1 record``, ``3 records`` (:func:`plural`)."""
    return f"{count} {plural(count, word, many)}"


def shown_key(key: str, limit: int | None = None) -> str:
    """``key`` quoted, every character that is not printable escaped once
    (Python's ``repr``: ``'a\\x00b'``), cut after ``limit`` characters with the
    count of what was cut (a key may be 1 MiB)."""
    if limit is not None and len(key) > limit:
        return f"{key[:limit]!r}...({len(key) - limit} more characters)"
    return repr(key)
