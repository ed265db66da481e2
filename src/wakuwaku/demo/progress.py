"""Live progress of the flights demo: phases with counts, rates and ETA, and chaos events.

Two renderers, chosen by whether stdout is a terminal:

- :class:`LiveProgress`: one status block that updates in place (``rich``);
- :class:`PlainProgress`: a line per running phase every few seconds, and a
  line per event as it happens, so CI logs stay readable.

Both keep every sample (:attr:`Progress.samples`) for ``--plot``.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any

from .._text import plural

PHASES = ("produce", "consume", "replay", "verify")


@dataclass
class Phase:
    """One phase of the demo.

    :param name: one of :data:`PHASES`.
    :param unit: what :attr:`count` counts.
    :param total: the count at which the phase is complete, when known.
    """

    name: str
    unit: str
    total: int | None = None
    count: int = 0
    started: float | None = None
    ended: float | None = None
    recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=12))

    def rate(self, now: float) -> float:
        """Count per second over the last few samples (the whole phase once it ended)."""
        if self.started is None:
            return 0.0
        if self.ended is not None:
            seconds = self.ended - self.started
            return self.count / seconds if seconds > 0 else 0.0
        if len(self.recent) < 2:
            seconds = now - self.started
            return self.count / seconds if seconds > 0 else 0.0
        (t0, c0), (t1, c1) = self.recent[0], self.recent[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0

    def eta(self, now: float) -> float | None:
        """Seconds left at the current rate, when the total is known."""
        rate = self.rate(now)
        if self.total is None or self.ended is not None or rate <= 0:
            return None
        if self.count < self.total * 0.02:
            return None  # the first trickle says nothing about the pace

        return max(0.0, (self.total - self.count) / rate)

    def status(self) -> str:
        if self.ended is not None:
            return "done"
        return "running" if self.started is not None else "waiting"


@dataclass(frozen=True)
class Sample:
    """The demo at one moment (for the plot).

    :param at: seconds since the demo started.
    :param phase: the phase whose count is sampled.
    :param count: that phase's count.
    :param quarantined: keys quarantined now (summed over partitions).
    """

    at: float
    phase: str
    count: int
    quarantined: int


@dataclass(frozen=True)
class Event:
    """A chaos or phase event at ``at`` seconds since the start."""

    at: float
    kind: str
    text: str


class Progress:
    """What the demo did so far; renderers subclass it and draw it.

    :param started: ``time.perf_counter()`` when the demo started.
    """

    def __init__(self, started: float) -> None:
        self.started = started
        self.phases = {
            "produce": Phase("produce", "events"),
            "consume": Phase("consume", "rows accounted"),
            "replay": Phase("replay", "flights applied"),
            "verify": Phase("verify", "checks"),
        }
        self.samples: list[Sample] = []
        self.events: list[Event] = []
        self.quarantined = 0
        self.dead_letters = 0
        self.consumer_runs = 0

    def now(self) -> float:
        return time.perf_counter() - self.started

    def start(self, name: str, total: int | None = None) -> None:
        phase = self.phases[name]
        phase.started, phase.total = self.now(), total
        phase.recent.clear()
        phase.recent.append((phase.started, phase.count))
        self.event("phase", f"{name} started")

    def update(self, name: str, count: int) -> None:
        now = self.now()
        phase = self.phases[name]
        phase.count = count
        phase.recent.append((now, count))
        self.samples.append(Sample(now, name, count, self.quarantined))
        self.draw()

    def finish(self, name: str, count: int | None = None) -> None:
        phase = self.phases[name]
        if count is not None:
            self.update(name, count)
        phase.ended = self.now()
        self.event("phase", f"{name} done: {phase.count:,} {phase.unit}")

    def event(self, kind: str, text: str) -> None:
        self.events.append(Event(self.now(), kind, text))
        self.draw(event=self.events[-1])

    def draw(self, event: Event | None = None) -> None:
        """Show the state (renderers override it)."""

    def close(self) -> None:
        """Stop drawing (the final report follows)."""

    def phase_line(self, phase: Phase) -> str:
        now = self.now()
        total = f" of {phase.total:,}" if phase.total is not None else ""
        share = f" ({100 * phase.count / phase.total:.0f} %)" if phase.total else ""
        eta = phase.eta(now)
        return (
            f"{phase.name}: {phase.count:,}{total} {phase.unit}{share}, "
            f"{phase.rate(now):,.0f}/s" + (f", ETA {eta:.0f} s" if eta is not None else "")
        )

    def state_line(self) -> str:
        return (
            f"{self.quarantined:,} {plural(self.quarantined, 'key')} quarantined now, "
            f"{self.dead_letters:,} {plural(self.dead_letters, 'dead letter')}, "
            f"consumer run {self.consumer_runs}"
        )


class PlainProgress(Progress):
    """Plain lines: every ``every`` seconds one per running phase, and each event at once."""

    def __init__(self, started: float, stream: IO[str] | None = None, every: float = 2.0) -> None:
        super().__init__(started)
        self.stream = stream or sys.stdout
        self.every = every
        self._last = 0.0

    def _print(self, text: str) -> None:
        self.stream.write(f"[{self.now():6.1f} s] {text}\n")
        self.stream.flush()

    def draw(self, event: Event | None = None) -> None:
        if event is not None:
            if event.kind != "phase" or "done" in event.text:
                self._print(event.text)
            return
        now = self.now()
        if now - self._last < self.every:
            return
        self._last = now
        # verify is quick and counts checks: only its end is worth a line.
        running = [
            p for p in self.phases.values() if p.status() == "running" and p.name != "verify"
        ]
        for phase in running:
            self._print(self.phase_line(phase))
        if any(p.name == "consume" for p in running):
            self._print(self.state_line())


class LiveProgress(Progress):
    """One status block, updated in place on the terminal (``rich``)."""

    def __init__(self, started: float) -> None:
        super().__init__(started)
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def _renderable(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        now = self.now()
        table = Table(title="wakuwaku demo flights", title_justify="left", expand=False)
        for column, justify in (
            ("phase", "left"),
            ("status", "left"),
            ("count", "right"),
            ("of", "right"),
            ("rate", "right"),
            ("ETA", "right"),
        ):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for phase in self.phases.values():
            eta = phase.eta(now)
            style = {"done": "green", "running": "bold yellow", "waiting": "dim"}[phase.status()]
            table.add_row(
                phase.name,
                phase.status(),
                f"{phase.count:,}",
                f"{phase.total:,}" if phase.total is not None else "",
                f"{phase.rate(now):,.0f}/s" if phase.started is not None else "",
                f"{eta:.0f} s" if eta is not None else "",
                style=style,
            )
        lines = [Text(f"{now:.1f} s  " + self.state_line())]
        lines += [
            Text(f"  {e.at:5.1f} s  {e.text}", style="red" if e.kind == "chaos" else "")
            for e in self.events
            if e.kind != "phase"
        ]
        return Group(table, *lines)

    def draw(self, event: Event | None = None) -> None:
        self.live.update(self._renderable())

    def close(self) -> None:
        self.live.update(self._renderable())
        self.live.stop()


def make_progress(started: float, mode: str) -> Progress:
    """The renderer for ``mode``: ``auto`` (live on a terminal, else plain), ``live``,
    ``plain`` or ``none``."""
    if mode == "auto":
        mode = "live" if sys.stdout.isatty() else "plain"
    if mode == "live":
        return LiveProgress(started)
    if mode == "plain":
        return PlainProgress(started)
    return Progress(started)
