"""What a run of the flights demo is asked to do: :class:`DemoOptions`.

Every other module of the demo reads the options; this one imports only the
standard library and calls nothing of the demo, so the CLI builds ``wakuwaku
demo flights``'s options and their defaults from it without loading the demo.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_DELAYS = (0.05,)
"""The demo consumer's retry schedule (seconds) unless ``--retry-delays`` says otherwise."""


@dataclass(frozen=True)
class DemoOptions:
    """How to run the demo.

    :param workdir: where the log (by default), projection and logs go; the
        demo's own files there are replaced on each run.
    :param log_url: the log; default ``sqlite:///<workdir>/log.db``. It must
        be reachable from another process (not ``memory://``).
    :param partitions: partitions of each topic.
    :param chaos: lock the projection and SIGKILL the consumer once.
    :param replay: run the replay phase.
    :param limit: use only the first ``limit`` flights (tests use a slice).
    :param retry_delays: the consumer's schedule (seconds).
    :param lock_seconds: how long the chaos holds the projection locked.
    :param kill_at: with ``chaos``, SIGKILL the consumer this many seconds
        after the demo started instead of at ~35 % applied (crash tests).
    :param reset: delete the demo's topics and group offsets from ``log_url``
        first (a log holding them is refused otherwise).
    :param progress: ``auto`` (a live status block on a terminal, plain
        lines otherwise), ``live``, ``plain`` or ``none``.
    :param plot: draw the run into this PNG file (matplotlib).
    """

    workdir: Path = Path("demo-out")
    log_url: str | None = None
    partitions: int = 4
    chaos: bool = False
    replay: bool = False
    limit: int | None = None
    retry_delays: tuple[float, ...] = DEFAULT_DELAYS
    lock_seconds: float = 3.0
    kill_at: float | None = None
    reset: bool = False
    progress: str = "auto"
    plot: Path | None = None
