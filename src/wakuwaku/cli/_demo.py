"""``wakuwaku demo flights``: run the flights demo (see :mod:`wakuwaku.demo`).

Every ``wakuwaku`` command imports this module, so it takes the options and
their defaults from :mod:`wakuwaku.demo.options` alone; the demo itself
(:mod:`wakuwaku.demo.run`, which registers the demo's event types) is
imported only when the command runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from ..demo.options import DEFAULT_DELAYS, DemoOptions
from ._options import Seconds, parse_retry_delays


def _delays(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, ...]:
    return parse_retry_delays(value)


def register(group: click.Group) -> None:
    @group.group()
    def demo() -> None:
        """Demonstrations of the whole library on real data."""

    @demo.command()
    @click.option(
        "--log",
        "log_url",
        default=None,
        envvar="WAKUWAKU_DEMO_LOG",
        help=(
            "Log URL: sqlite:///file.db, redis://host:port/db, nats://host:port, "
            "kafka://host:port (each with ?prefix=... to share a server) or "
            "iggy://user:password@host:port (?stream=...) "
            "(default: a fresh SQLite file in --workdir)."
        ),
    )
    @click.option(
        "--workdir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("demo-out"),
        show_default=True,
        help="Where the demo's databases and consumer log go (replaced each run).",
    )
    @click.option("--partitions", type=click.IntRange(1, 64), default=4, show_default=True)
    @click.option(
        "--chaos",
        is_flag=True,
        help="Lock the projection for a few seconds and SIGKILL the consumer once.",
    )
    @click.option(
        "--replay-dead-letters",
        "replay",
        is_flag=True,
        help="Then register the missing aircraft and replay the dead letters.",
    )
    @click.option(
        "--limit", type=click.IntRange(1), default=None, help="Use only the first N flights."
    )
    @click.option(
        "--retry-delays",
        callback=_delays,
        default=",".join(str(d) for d in DEFAULT_DELAYS),
        show_default=True,
        help="The consumer's retry schedule, comma-separated seconds.",
    )
    @click.option(
        "--lock-seconds",
        type=Seconds(0.1, 60),
        default=3.0,
        show_default=True,
        help="How long --chaos locks the projection.",
    )
    @click.option(
        "--kill-at",
        type=Seconds(0.0, 3600),
        default=None,
        help="With --chaos, SIGKILL the consumer this many seconds after the start "
        "(default: at ~35 % of the flights applied).",
    )
    @click.option(
        "--reset",
        is_flag=True,
        help="Delete the demo's topics and group offsets from --log first "
        "(a log holding them is refused otherwise).",
    )
    @click.option(
        "--progress",
        type=click.Choice(["auto", "live", "plain", "none"]),
        default="auto",
        show_default=True,
        help="Live status block (a terminal), plain periodic lines (CI logs), or none.",
    )
    @click.option(
        "--plot",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Draw the run into this PNG file (events/s per phase, quarantined keys, "
        "the lock and the kill).",
    )
    def flights(
        log_url: str | None,
        workdir: Path,
        partitions: int,
        chaos: bool,
        replay: bool,
        limit: int | None,
        retry_delays: tuple[float, ...],
        lock_seconds: float,
        kill_at: float | None,
        reset: bool,
        progress: str,
        plot: Path | None,
    ) -> int:
        """Project the 2013 New York flights and aircraft register, then verify the result."""
        from ..demo.run import run_demo

        options = DemoOptions(
            workdir=workdir,
            log_url=log_url,
            partitions=partitions,
            chaos=chaos,
            replay=replay,
            limit=limit,
            retry_delays=retry_delays,
            lock_seconds=lock_seconds,
            kill_at=kill_at,
            reset=reset,
            progress=progress,
            plot=plot,
        )
        return asyncio.run(run_demo(options, click.echo))
