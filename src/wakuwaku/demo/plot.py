"""``--plot FILE.png``: the demo's run drawn with matplotlib (the ``demo`` extra).

Two panels over the run's wall time: events per second per phase (produce:
events published; consume: CSV rows accounted for, applied or dead-lettered
or refused; replay: flights applied), and the keys quarantined at each
moment. The projection lock is shaded and the SIGKILL marked on both.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import ConfigError

if TYPE_CHECKING:
    from .options import DemoOptions
    from .processes import Chaos
    from .progress import Progress

COLORS = {"produce": "tab:blue", "consume": "tab:green", "replay": "tab:purple"}


def rates(samples: list[tuple[float, int]]) -> tuple[list[float], list[float]]:
    """Per consecutive pair of (seconds, count) samples: the midpoint time and count per second."""
    times: list[float] = []
    values: list[float] = []
    for (t0, c0), (t1, c1) in itertools.pairwise(samples):
        if t1 > t0:
            times.append((t0 + t1) / 2)
            values.append(max(0.0, (c1 - c0) / (t1 - t0)))
    return times, values


def plot_run(progress: Progress, chaos: Chaos, opts: DemoOptions, path: Path) -> None:
    """Draw the run into ``path`` (PNG).

    :raises ConfigError: when matplotlib is not installed (with the install line).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'wakuwaku[demo]'") from None
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6.5))
    for phase, color in COLORS.items():
        series = [(s.at, s.count) for s in progress.samples if s.phase == phase]
        times, values = rates(series)
        if times:
            top.plot(times, values, label=phase, color=color)
    quarantined = [(s.at, s.quarantined) for s in progress.samples if s.phase == "consume"]
    quarantined += [(s.at, s.quarantined) for s in progress.samples if s.phase == "replay"]
    quarantined.sort()
    if quarantined:
        bottom.step(
            [t for t, _ in quarantined], [q for _, q in quarantined], where="post", color="tab:red"
        )
    for axis in (top, bottom):
        if chaos.lock_at is not None:
            axis.axvspan(
                chaos.lock_at,
                chaos.lock_at + opts.lock_seconds,
                color="orange",
                alpha=0.25,
                label="projection locked" if axis is top else None,
            )
        if chaos.kill_at is not None:
            axis.axvline(
                chaos.kill_at,
                color="black",
                linestyle="--",
                label="consumer SIGKILLed" if axis is top else None,
            )
    top.set_ylabel("events per second")
    top.set_title("wakuwaku demo flights")
    top.legend(loc="upper right")
    bottom.set_ylabel("keys quarantined")
    bottom.set_xlabel("seconds since the start")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
