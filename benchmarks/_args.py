"""What the benchmarks' command lines accept: argparse ``type=`` functions for their numbers.

Every numeric option of every benchmark goes through one of these, so a
value no run can use (``--rounds 0``, ``--keys -1``, ``--timeout nan``)
ends in argparse's usage error (exit code 2, one line naming the option and
the value) instead of a traceback, a verdict over no data or a hang deep in
the run. A check that involves two options (fewer events than keys) is the
benchmark's own, in its ``parse_args``, with ``parser.error``.
"""

from __future__ import annotations

import argparse
import math

__all__ = (
    "add_workload",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
)


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
    return value


def _float(text: str, above_zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (above_zero and value == 0):
        bound = "more than 0" if above_zero else "0 or more"
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
    return value


def positive_int(text: str) -> int:
    """An int of 1 or more: events, keys, partitions, rounds, page and batch sizes."""
    return _int(text, 1)


def non_negative_int(text: str) -> int:
    """An int of 0 or more: a count where 0 means "none of that step"."""
    return _int(text, 0)


def positive_float(text: str) -> float:
    """A finite float above 0: a time bound (seconds)."""
    return _float(text, above_zero=True)


def non_negative_float(text: str) -> float:
    """A finite float of 0 or more: a wait that may be none (seconds)."""
    return _float(text, above_zero=False)


def add_workload(
    parser: argparse.ArgumentParser,
    *,
    events: int = 200_000,
    rounds: int = 3,
    events_help: str | None = None,
) -> None:
    """The options of a benchmark's workload, the same in every benchmark
    that takes them: ``--events``, ``--keys`` (1 000), ``--partitions`` (4)
    and ``--rounds``, each an int of 1 or more."""
    parser.add_argument("--events", type=positive_int, default=events, help=events_help)
    parser.add_argument("--keys", type=positive_int, default=1_000)
    parser.add_argument("--partitions", type=positive_int, default=4)
    parser.add_argument("--rounds", type=positive_int, default=rounds)
