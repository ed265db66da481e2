"""Small SVG charts drawn on the server: geometry only, the template draws it.

Everything here is numbers (coordinates, counts) and the reason names the
template escapes; no markup is built as a string.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

WIDTH = 600
HEIGHT = 120
PALETTE = ("#d1495b", "#edae49", "#00798c", "#30638e", "#6a4c93", "#8d6e63", "#2a9d8f")


def clock(seconds: float) -> str:
    """``HH:MM:SS`` UTC of a wall time (seconds since the epoch)."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%H:%M:%S")


@dataclass(frozen=True, slots=True)
class LineChart:
    """A polyline of events/s over time.

    :param points: ``"x,y x,y ..."`` in the chart's coordinates.
    :param peak: the highest value (events/s), the top of the scale.
    :param start: / :param end: the first and last times (``HH:MM:SS`` UTC).
    :param last: the latest value (events/s).
    """

    points: str
    peak: float
    start: str
    end: str
    last: float
    width: int = WIDTH
    height: int = HEIGHT


def line_chart(values: Sequence[tuple[float, float]]) -> LineChart | None:
    """A chart of ``(wall time, value)`` pairs; None with fewer than two."""
    if len(values) < 2:
        return None
    t0, t1 = values[0][0], values[-1][0]
    span = max(t1 - t0, 1e-9)
    peak = max(v for _, v in values)
    scale = peak if peak > 0 else 1.0
    points = " ".join(
        f"{(t - t0) / span * WIDTH:.1f},{HEIGHT - v / scale * (HEIGHT - 4):.1f}" for t, v in values
    )
    return LineChart(points, peak, clock(t0), clock(t1), values[-1][1])


@dataclass(frozen=True, slots=True)
class Bar:
    """One reason's part of one time bucket: a rectangle and its tooltip."""

    x: float
    y: float
    width: float
    height: float
    color: str
    title: str


@dataclass(frozen=True, slots=True)
class BarChart:
    """Dead letters per reason over time (stacked bars).

    :param legend: ``(reason, color)`` in the order the bars stack.
    :param peak: the largest bucket (dead letters).
    """

    bars: tuple[Bar, ...]
    legend: tuple[tuple[str, str], ...]
    peak: int
    start: str
    end: str
    width: int = WIDTH
    height: int = HEIGHT


def bar_chart(letters: Iterable[tuple[float, str]], buckets: int = 30) -> BarChart | None:
    """Stacked bars of ``(time, reason)`` pairs in ``buckets`` equal time spans;
    None without any."""
    items = list(letters)
    if not items:
        return None
    t0 = min(t for t, _ in items)
    t1 = max(t for t, _ in items)
    span = max(t1 - t0, 1.0)
    reasons = sorted({r for _, r in items})
    colors = {r: PALETTE[i % len(PALETTE)] for i, r in enumerate(reasons)}
    counts: list[dict[str, int]] = [{} for _ in range(buckets)]
    for t, reason in items:
        i = min(buckets - 1, int((t - t0) / span * buckets))
        counts[i][reason] = counts[i].get(reason, 0) + 1
    peak = max(sum(c.values()) for c in counts)
    step = WIDTH / buckets
    bars: list[Bar] = []
    for i, bucket in enumerate(counts):
        y = float(HEIGHT)
        when = clock(t0 + span * i / buckets)
        for reason in reasons:
            n = bucket.get(reason, 0)
            if not n:
                continue
            h = n / peak * (HEIGHT - 4)
            y -= h
            bars.append(Bar(i * step + 1, y, step - 2, h, colors[reason], f"{when} {reason}: {n}"))
    return BarChart(tuple(bars), tuple(colors.items()), peak, clock(t0), clock(t1))
