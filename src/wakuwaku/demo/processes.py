"""The processes the flights demo runs beside itself, and the watcher over them.

- :class:`ConsumerProcess`: the consumer (:mod:`.consumer`) in its own
  process, started, told when a phase is over, SIGKILLed and restarted;
- :func:`lock_projection`: another process that holds the projection's write
  lock for a while;
- :func:`chaos_monkey`: the chaos (the lock, then the SIGKILL), recorded in
  :class:`Chaos`;
- :class:`Watcher`: samples the run a few times a second for the progress
  and the chaos.

This module may use the demo's options, the consumer's command line
(:mod:`.consumer`), the projection (:mod:`.flights`), the progress and the
producers' counts; never the verification or the orchestration (:mod:`.run`),
which drives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._text import plural
from .consumer import LOG_URL_ENV
from .flights import Projection
from .options import DemoOptions
from .producers import Produced
from .progress import Progress


@dataclass
class Chaos:
    """What the chaos did."""

    lock_at: float | None = None
    kill_at: float | None = None
    kills: int = 0
    unlocked: bool = False
    notes: list[str] = field(default_factory=list)


class ConsumerProcess:
    """The consumer, in its own process so it can be killed and restarted."""

    def __init__(self, opts: DemoOptions, log_url: str, projection: Path, done: Path) -> None:
        self.opts = opts
        self.log_url = log_url
        self.projection = projection
        self.done = done
        self.runs = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.stats_files: list[Path] = []

    def start(self) -> None:
        self.runs += 1
        stats = self.opts.workdir / f"consumer-stats-{self.runs}.json"
        self.stats_files.append(stats)
        logfile = (self.opts.workdir / "consumer.log").open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "wakuwaku.demo.consumer",
                "--projection",
                str(self.projection),
                "--stats",
                str(stats),
                "--done",
                str(self.done),
                "--retry-delays",
                ",".join(map(str, self.opts.retry_delays)),
            ],
            stdout=logfile,
            stderr=logfile,
            # The URL goes in the environment, not on the command line, where
            # any user of the machine could read its password (ps).
            env={**os.environ, "PYTHONUNBUFFERED": "1", LOG_URL_ENV: self.log_url},
        )
        logfile.close()

    def kill(self) -> bool:
        """SIGKILL the consumer if it is running; returns whether it was."""
        if self.process is None or self.process.poll() is not None:
            return False
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        return True

    def tell(self, token: str) -> None:
        """Ask the consumer to acknowledge ``token`` once idle (``stop``: then exit)."""
        tmp = self.done.with_suffix(".tmp")
        tmp.write_text(token)
        os.replace(tmp, self.done)

    async def wait_idle(self, token: str, limit: float) -> None:
        """Wait until the running consumer acknowledged ``token`` (it was idle after it).

        :raises TimeoutError: after ``limit`` seconds, or when the consumer exits.
        """
        ack = self.done.with_name(self.done.name + ".ack")
        deadline = time.monotonic() + limit
        while True:
            try:
                if ack.read_text() == token:
                    return
            except FileNotFoundError:
                pass
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise TimeoutError(f"the demo consumer exited (status {code}) before it was idle")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the demo consumer was not idle within {limit:.0f} s")
            await asyncio.sleep(0.02)

    async def wait(self, limit: float) -> int:
        """Wait for the consumer process to exit (``limit`` seconds at most)."""
        assert self.process is not None
        deadline = time.monotonic() + limit
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"the demo consumer did not finish within {limit:.0f} s")
            await asyncio.sleep(0.05)
        return self.process.returncode

    def stats(self) -> dict[str, Any]:
        """The consumer runs' last counters, summed."""
        total: dict[str, Any] = {}
        for path in self.stats_files:
            try:
                stats = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # not written yet
            total["quarantined_now"] = stats.pop("quarantined_now", 0)
            for name, value in stats.items():
                if isinstance(value, dict):
                    bucket = total.setdefault(name, Counter())
                    bucket.update(value)
                else:
                    total[name] = total.get(name, 0) + value
        return total


def lock_projection(path: Path, seconds: float) -> subprocess.Popen[bytes]:
    """Another process takes the projection's write lock and holds it for ``seconds``."""
    code = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
        "c.execute('BEGIN EXCLUSIVE')\n"
        "time.sleep(float(sys.argv[2]))\n"
        "c.execute('COMMIT')\n"
    )
    return subprocess.Popen([sys.executable, "-c", code, str(path), str(seconds)])


async def chaos_monkey(
    opts: DemoOptions,
    consumer: ConsumerProcess,
    watcher: Watcher,
    rows: int,
    started: float,
    chaos: Chaos,
) -> None:
    """Lock the projection at ~10 % applied, SIGKILL the consumer at ~35 %
    (or at ``opts.kill_at`` seconds)."""
    locker: subprocess.Popen[bytes] | None = None
    progress = watcher.progress
    while chaos.kill_at is None:
        await asyncio.sleep(0.01 if opts.kill_at is not None else 0.05)
        applied = watcher.applied
        if chaos.lock_at is None and applied >= rows * 0.10:
            locker = lock_projection(watcher.projection.path, opts.lock_seconds)
            chaos.lock_at = time.perf_counter() - started
            progress.event(
                "chaos",
                f"chaos: projection locked by another process for {opts.lock_seconds:.1f} s",
            )
        if locker is not None and locker.poll() is not None and not chaos.unlocked:
            chaos.unlocked = True
            progress.event("chaos", "chaos: projection unlocked")
        if opts.kill_at is not None:
            kill_now = time.perf_counter() - started >= opts.kill_at
        else:
            kill_now = (
                chaos.lock_at is not None
                and applied >= rows * 0.35
                and (locker is None or locker.poll() is not None)
            )
        if kill_now:
            if consumer.kill():
                chaos.kill_at = time.perf_counter() - started
                chaos.kills += 1
                progress.event(
                    "chaos",
                    f"chaos: consumer SIGKILLed at {applied:,} {plural(applied, 'flight')} applied",
                )
                consumer.start()
                progress.event("chaos", f"chaos: consumer restarted (run {consumer.runs})")
            else:
                return
    if locker is not None:
        await asyncio.to_thread(locker.wait)
        if not chaos.unlocked:
            chaos.unlocked = True
            progress.event("chaos", "chaos: projection unlocked")


class Watcher:
    """Samples the run a few times a second: feeds the progress and the chaos.

    :param progress: where the counts go.
    :param projection: the projection (its inbox counts the applied flights).
    :param consumer: the consumer process (its stats files).
    :param produced: the producers' live counts.
    """

    def __init__(
        self,
        progress: Progress,
        projection: Projection,
        consumer: ConsumerProcess,
        produced: Produced,
    ) -> None:
        self.progress = progress
        self.projection = projection
        self.consumer = consumer
        self.produced = produced
        self.applied = 0
        self.replay_base = 0
        self.chaos: Chaos | None = None

    async def sample(self) -> None:
        """Read the counts once and hand them to the progress."""
        self.applied = await asyncio.to_thread(_count_applied, self.projection)
        stats = await asyncio.to_thread(self.consumer.stats)
        progress = self.progress
        progress.quarantined = int(stats.get("quarantined_now", 0))
        progress.dead_letters = sum(stats.get("dead_letters", {}).values())
        progress.consumer_runs = self.consumer.runs
        phases = progress.phases
        if phases["produce"].status() == "running":
            progress.update("produce", self.produced.events)
        if phases["consume"].status() == "running":
            total = phases["consume"].total or 0
            done = self.applied + progress.dead_letters + self.produced.refused
            progress.update("consume", min(done, total))
        if phases["replay"].status() == "running":
            progress.update("replay", max(0, self.applied - self.replay_base))

    async def run(self, every: float = 0.25) -> None:
        """Sample every ``every`` seconds until cancelled."""
        while True:
            await self.sample()
            await asyncio.sleep(every)


def _count_applied(projection: Projection) -> int:
    import sqlite3

    try:
        conn = sqlite3.connect(projection.path, timeout=0.5)
        try:
            row = conn.execute(f"SELECT count(*) FROM {projection.inbox.table}").fetchone()
            return int(row[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
