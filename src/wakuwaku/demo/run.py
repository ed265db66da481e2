"""``wakuwaku demo flights``: the whole library on real data, verified from its own output.

Phases:

1. create ``planes`` and ``flights`` on the log; start the consumer process;
2. publish the aircraft register and the flights *concurrently* (flights
   often arrive before their plane); rows without a tail number are refused
   by the producer and counted;
3. with ``--chaos``: lock the projection database from another process for a
   few seconds (handlers see "database is locked": Transient), and SIGKILL
   the consumer once mid-run, then start it again;
4. when everything is handled, print the report and verify it against totals
   computed from the CSV files without wakuwaku;
5. with ``--replay-dead-letters``: register the missing aircraft as unknown
   models, replay the dead-letter topic with the CLI's replay path, run the
   consumer again and verify that every flight with a tail number is applied
   exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from .._errors import ConfigError, MissingKeyError
from .._events import event_type
from .._producer import Producer
from .._sanitize import redact_url
from ..admin import DeadLetter, list_dead_letters, replay_dead_letters
from ..engine import ConsumerConfig
from ..logs import Log, open_log
from .consumer import LOG_URL_ENV
from .data import (
    Expected,
    FlightRow,
    PlaneRow,
    Totals,
    expected_totals,
    read_flights,
    read_planes,
)
from .flights import (
    FLIGHTS_TOPIC,
    GROUP,
    PLANES_TOPIC,
    FlightCancelled,
    FlightFlown,
    PlaneRegistered,
    Projection,
    RegisterPublished,
)
from .progress import Progress, make_progress

DEFAULT_DELAYS = (0.05,)
REGISTER = "nycflights13"
CONSUMER_TIMEOUT = 600.0
Print = Callable[[str], None]


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


@dataclass
class Produced:
    """What the producers did."""

    planes: int = 0
    registers: int = 0
    flown: int = 0
    cancelled: int = 0
    refused: int = 0
    first_refusal: str = ""
    seconds: float = 0.0

    @property
    def events(self) -> int:
        return self.planes + self.registers + self.flown + self.cancelled


@dataclass
class Chaos:
    """What the chaos did."""

    lock_at: float | None = None
    kill_at: float | None = None
    kills: int = 0
    unlocked: bool = False
    notes: list[str] = field(default_factory=list)


def flight_event(
    tailnum: str | None, cancelled: bool, distance: int, air_time: int | None, arr_delay: int | None
) -> FlightFlown | FlightCancelled:
    """The event of one CSV row (a missing tail number stays missing: the producer refuses it)."""
    tail: Any = tailnum
    if cancelled:
        return FlightCancelled(tail)
    return FlightFlown(tail, 1, distance, air_time or 0, arr_delay or 0)


async def produce(
    log: Log, flight_rows: Sequence[FlightRow], produced: Produced, rows: Sequence[PlaneRow]
) -> Produced:
    """Publish the register (``rows``) and the flights concurrently, counting into ``produced``."""
    started = time.perf_counter()

    async def planes() -> None:
        producer = Producer(log, PLANES_TOPIC)
        # Flights may still come before their plane: they wait (Transient)
        # until the register is complete, then only unlisted planes fail.
        for i in range(0, len(rows), 1000):
            await producer.publish_many(
                [
                    PlaneRegistered(p.tailnum, p.year, p.manufacturer, p.model, p.seats)
                    for p in rows[i : i + 1000]
                ]
            )
            produced.planes += len(rows[i : i + 1000])
            await asyncio.sleep(0)
        await producer.publish(RegisterPublished(REGISTER, len({p.tailnum for p in rows})))
        produced.registers += 1

    async def flights() -> None:
        producer = Producer(log, FLIGHTS_TOPIC)
        batch: list[FlightFlown | FlightCancelled] = []
        for row in flight_rows:
            ev = flight_event(row.tailnum, row.cancelled, row.distance, row.air_time, row.arr_delay)
            try:
                event_type(ev).key_of(ev)
            except MissingKeyError as exc:
                produced.refused += 1
                produced.first_refusal = produced.first_refusal or f"row {row.row}: {exc}"
                continue
            batch.append(ev)
            if len(batch) == 5000:
                await _publish(producer, batch, produced)
                batch = []
        await _publish(producer, batch, produced)

    await asyncio.gather(planes(), flights())
    produced.seconds = time.perf_counter() - started
    return produced


async def _publish(
    producer: Producer, batch: list[FlightFlown | FlightCancelled], produced: Produced
) -> None:
    if not batch:
        return
    await producer.publish_many(batch)
    produced.cancelled += sum(isinstance(e, FlightCancelled) for e in batch)
    produced.flown += sum(isinstance(e, FlightFlown) for e in batch)
    await asyncio.sleep(0)


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
                progress.event("chaos", f"chaos: consumer SIGKILLed at {applied:,} flights applied")
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


@dataclass
class Verification:
    """The demo's proof, from the CSV files and the demo's own outputs."""

    lines: list[str] = field(default_factory=list)
    ok: bool = True

    def check(self, ok: bool, text: str) -> None:
        self.ok = self.ok and ok
        self.lines.append(f"  [{'ok' if ok else 'FAILED'}] {text}")


async def verify(
    dead: Sequence[DeadLetter],
    projection: Projection,
    expected: Expected,
    registered: set[str],
    refused: int,
    *,
    after_replay: bool,
) -> Verification:
    """Check the projection and the dead letters against the CSV totals."""
    result = Verification()
    zero = Totals().as_tuple()
    actual = projection.totals()
    tails = set(expected.totals)
    wrong = [t for t in tails & registered if actual.get(t, zero) != expected.totals[t].as_tuple()]
    result.check(
        not wrong,
        f"projection equals the CSV totals for all {len(registered):,} "
        f"registered tail numbers" + (f" (wrong: {sorted(wrong)[:5]})" if wrong else ""),
    )
    strays = sorted(set(actual) - registered)
    result.check(
        not strays,
        "no totals for unregistered tail numbers" + (f" (found {strays[:5]})" if strays else ""),
    )
    other = Counter(d.reason for d in dead if d.reason != "gave_up_retry")
    result.check(
        not other, "no dead letters but gave_up_retry" + (f" ({dict(other)})" if other else "")
    )
    dead_ids: set[str] = set()
    dead_totals: dict[str, Totals] = {}
    seen: set[tuple[str | None, tuple[str, ...]]] = set()
    for letter in dead:
        if letter.source is None:
            continue
        identity = (letter.type_tag, tuple(letter.source.ids))
        if identity in seen:
            continue  # written again after a crash (at-least-once): the same dead letter
        seen.add(identity)
        dead_ids.update(letter.source.ids)
        t = dead_totals.setdefault(letter.key or "", Totals())
        if letter.type_tag == event_type(FlightFlown).tag:
            flown = msgspec.json.decode(letter.body, type=FlightFlown)
            t.flights += flown.flights
            t.distance += flown.distance
            t.air_time += flown.air_time
            t.arr_delay += flown.arr_delay
        else:
            t.cancelled += 1
    applied = projection.applied_ids()
    if not after_replay:
        missing = tails - registered
        wrong_dead = [
            t
            for t in missing
            if dead_totals.get(t, Totals()).as_tuple() != expected.totals[t].as_tuple()
        ]
        # A registered plane's flight given up (its plane stored too late for
        # the retry schedule) is accounted for as a dead letter below; named
        # here, it cannot pass for an effect lost after its id was claimed.
        registered_dead = sorted(set(dead_totals) & registered)
        given_up = sum(dead_totals[t].flights + dead_totals[t].cancelled for t in registered_dead)
        result.check(
            not wrong_dead and not registered_dead,
            f"dead letters hold exactly the flights of the "
            f"{len(missing):,} unregistered tail numbers"
            + (f" (wrong: {sorted(wrong_dead)[:5]})" if wrong_dead else "")
            + (
                f" (and {given_up:,} flights of registered ones: {registered_dead[:5]})"
                if registered_dead
                else ""
            ),
        )
        overlap = applied & dead_ids
        result.check(not overlap, "no flight both applied and dead-lettered")
        total = len(applied) + len(dead_ids) + refused
        result.check(
            total == expected.rows,
            f"every row accounted for exactly once: {len(applied):,} applied + "
            f"{len(dead_ids):,} dead-lettered + {refused:,} refused = {total:,} "
            f"of {expected.rows:,}",
        )
    else:
        with_tail = expected.rows - expected.without_tail
        result.check(
            len(applied) == with_tail and refused == expected.without_tail,
            f"every flight with a tail number applied exactly once: {len(applied):,} "
            f"of {with_tail:,} (plus {refused:,} refused without one)",
        )
    return result


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s" if seconds > 0 else "-"


def demo_topics() -> list[str]:
    """Every topic the demo writes: main, and the group's retry, dead-letter and
    replay-ledger topics (a ledger kept past a reset would mark the new run's
    dead letters, at the same positions, as replayed already)."""
    config = ConsumerConfig(topic=(PLANES_TOPIC, FLIGHTS_TOPIC), group=GROUP)
    return [name for topic in config.topics for name, _ in config.group_topics(topic).roles()]


class LogInUseError(ConfigError):
    """The log already holds the demo's topics (an earlier run): refused without ``--reset``."""


async def prepare_log(log: Log, log_url: str, *, reset: bool) -> None:
    """Make sure the demo starts from an empty log.

    :param reset: delete the demo's topics (main, retry, dead-letter, replay
        ledger) and its group's offsets and leases first.
    :raises LogInUseError: without ``reset``, when any demo topic exists
        (an earlier run's records would mix with this one's).
    """
    names = demo_topics()
    existing = sorted({t.name for t in await log.list_topics()} & set(names))
    if existing and not reset:
        raise LogInUseError(
            f"{redact_url(log_url)} already holds the flights demo's topics "
            f"({', '.join(existing)}) from an earlier run; "
            "add --reset to delete them and the group's offsets first"
        )
    if reset:
        # The group first: on Kafka its committed offsets are only found
        # while their topics exist, and offsets kept past a reset would
        # skip the new topics' first records.
        await log.delete_group(GROUP)
        for name in names:
            await log.delete_topic(name)


def report(
    out: Print,
    *,
    opts: DemoOptions,
    log_url: str,
    produced: Produced,
    stats: dict[str, Any],
    dead: Counter[str],
    chaos: Chaos,
    seconds: float,
    runs: int,
) -> None:
    """Print the demo's report (the README explains each line)."""
    events = produced.events
    attempts = stats.get("attempts", 0)
    out(f"log                      {redact_url(log_url)} ({opts.partitions} partitions per topic)")
    out(
        f"produced                 {produced.planes:,} PlaneRegistered, {produced.registers} "
        f"RegisterPublished, {produced.flown:,} FlightFlown, {produced.cancelled:,} "
        f"FlightCancelled in {produced.seconds:.1f} s"
    )
    out(
        f"refused at publish       {produced.refused:,} flights without a tail number "
        f"(first: {produced.first_refusal or '-'})"
    )
    out(
        f"handled                  {stats.get('handled', 0):,} records in "
        f"{stats.get('handler_calls', 0):,} handler calls"
    )
    out(f"reduced away by combine  {stats.get('reduced_away', 0):,} records")
    out(f"skipped by the inbox     {stats.get('inbox_skipped', 0):,} records already applied")
    out(
        f"retryable                {stats.get('quarantined_keys', 0):,} keys quarantined, "
        f"{attempts:,} attempts ({stats.get('attempts_failed', 0):,} failed), "
        f"{stats.get('routed', 0):,} records routed during quarantine"
    )
    out(f"keys given up            {stats.get('gave_up_keys', 0):,}")
    out(
        "dead letters             "
        + (", ".join(f"{r}: {n:,}" for r, n in sorted(dead.items())) or "none")
    )
    out(
        f"transient pauses         {stats.get('transient_pauses', 0):,} failed calls retried "
        f"in place"
        + (
            f" (projection locked for {opts.lock_seconds:.1f} s at {chaos.lock_at:.1f} s)"
            if chaos.lock_at is not None
            else ""
        )
    )
    out(
        f"consumer runs            {runs}"
        + (f" (SIGKILL at {chaos.kill_at:.1f} s, restarted)" if chaos.kill_at is not None else "")
    )
    out(f"duration                 {seconds:.1f} s, {_rate(events, seconds)} events")


def clean_workdir(opts: DemoOptions) -> str:
    """Remove the demo's files of an earlier run from the workdir; returns the log URL.

    :raises ConfigError: for a ``memory://`` log (the consumer runs in
        another process).
    """
    workdir = opts.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    log_url = opts.log_url or f"sqlite:///{workdir / 'log.db'}"
    if log_url.startswith("memory:"):
        raise ConfigError(
            "the demo's consumer runs in another process: use a log URL it can "
            "reach, such as sqlite:///demo.db"
        )
    names = ["projection.db", "projection.db-wal", "projection.db-shm", "consumer.log"]
    names += ["done", "done.ack"]
    if opts.log_url is None:
        names += ["log.db", "log.db-wal", "log.db-shm"]  # the demo's own log: replaced
    for name in names:
        (workdir / name).unlink(missing_ok=True)
    for stale in workdir.glob("consumer-stats-*.json"):
        stale.unlink()
    return log_url


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


async def run_demo(opts: DemoOptions, out: Print = print) -> int:
    """Run the demo; returns 0 when every verification passed, else 1.

    Progress goes to stdout while it runs (see :mod:`wakuwaku.demo.progress`);
    the report and the verification are printed with ``out`` at the end.

    :raises ConfigError: for a log URL another process cannot reach, or
        missing demo data.
    :raises LogInUseError: when the log holds an earlier run's topics and
        ``opts.reset`` is false.
    """
    workdir = opts.workdir
    log_url = clean_workdir(opts)
    started = time.perf_counter()
    cpu_before = _cpu_seconds()
    log = open_log(log_url)
    progress: Progress | None = None
    try:
        await prepare_log(log, log_url, reset=opts.reset)
        for topic in (PLANES_TOPIC, FLIGHTS_TOPIC):
            await log.create_topic(topic, opts.partitions)
        projection_path = workdir / "projection.db"
        projection = Projection(projection_path)
        await projection.inbox.ensure_schema()
        consumer = ConsumerProcess(opts, log_url, projection_path, workdir / "done")
        consumer.start()  # it starts up while the CSV files are read
        flight_rows = list(read_flights(opts.limit))
        expected = expected_totals(rows=flight_rows)
        planes = read_planes()
        progress = make_progress(started, opts.progress)
        produced = Produced()
        watcher = Watcher(progress, projection, consumer, produced)
        progress.start("produce", len(planes) + 1 + expected.rows - expected.without_tail)
        progress.start("consume", expected.rows)
        sampler = asyncio.create_task(watcher.run())
        try:
            lines, ok = await _phases(
                opts, log, log_url, consumer, watcher, flight_rows, planes, expected
            )
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        total = time.perf_counter() - started
        lines.append(
            f"total                    {total:.1f} s wall, {_cpu_seconds() - cpu_before:.1f} s CPU "
            "(this process and the consumer runs)"
        )
        lines.append("VERIFIED" if ok else "NOT VERIFIED")
        progress.close()
        progress = None
        for line in lines:
            out(line)
        if opts.plot is not None and watcher.chaos is not None:
            from .plot import plot_run

            plot_run(watcher.progress, watcher.chaos, opts, opts.plot)
            out(f"plot                     {opts.plot}")
        return 0 if ok else 1
    finally:
        if progress is not None:
            progress.close()
        await log.close()


async def _phases(
    opts: DemoOptions,
    log: Log,
    log_url: str,
    consumer: ConsumerProcess,
    watcher: Watcher,
    flight_rows: Sequence[FlightRow],
    planes: Sequence[PlaneRow],
    expected: Expected,
) -> tuple[list[str], bool]:
    """Produce and consume (with the chaos), verify, replay and verify again.

    :returns: the report's lines and whether every check passed.
    """
    progress, produced = watcher.progress, watcher.produced
    registered = {p.tailnum for p in planes}
    chaos = watcher.chaos = Chaos()
    monkey = (
        asyncio.create_task(
            chaos_monkey(opts, consumer, watcher, expected.rows, progress.started, chaos)
        )
        if opts.chaos
        else None
    )
    lines: list[str] = []
    await produce(log, flight_rows, produced, planes)
    progress.finish("produce", produced.events)
    # The replay phase reuses the running consumer; without it, it stops.
    token = "phase1" if opts.replay else "stop"
    try:
        if monkey is not None:
            # The consumer hears that the phase is over only after the lock
            # and the SIGKILL: every chaos run has both, however fast it is.
            try:
                await asyncio.wait_for(asyncio.shield(monkey), CONSUMER_TIMEOUT)
            except TimeoutError:
                raise TimeoutError(
                    f"the chaos (lock and SIGKILL) did not happen in {CONSUMER_TIMEOUT:.0f} s"
                ) from None
        consumer.tell(token)
        await consumer.wait_idle(token, CONSUMER_TIMEOUT)
    except TimeoutError as exc:
        lines.append(f"the consumer failed: {exc}; see {opts.workdir / 'consumer.log'}")
        return lines, False
    finally:
        if monkey is not None:
            monkey.cancel()
            await asyncio.gather(monkey, return_exceptions=True)
    if opts.chaos and chaos.kill_at is None:
        chaos.notes.append("the consumer was not running at the planned SIGKILL")
    seconds = progress.now()
    dead = await list_dead_letters(log, FLIGHTS_TOPIC, group=GROUP)
    await watcher.sample()
    # Exact at the end: the consumer's dead-letter counters are per run.
    dead_ids = {i for d in dead if d.source is not None for i in d.source.ids}
    progress.finish("consume", watcher.applied + len(dead_ids) + produced.refused)
    lines.append("wakuwaku demo flights: report")
    report(
        lines.append,
        opts=opts,
        log_url=log_url,
        produced=produced,
        stats=consumer.stats(),
        dead=Counter(d.reason or "?" for d in dead),
        chaos=chaos,
        seconds=seconds,
        runs=consumer.runs,
    )
    lines.extend(f"note                     {note}" for note in chaos.notes)
    progress.start("verify")
    lines.append("verification (from the CSV files, without wakuwaku)")
    checked = await verify(
        dead, watcher.projection, expected, registered, produced.refused, after_replay=False
    )
    progress.update("verify", len(checked.lines))
    lines.extend(checked.lines)
    ok = checked.ok
    if opts.replay:
        replayed, checked = await replay_phase(
            log, consumer, watcher, expected, registered, produced, dead
        )
        lines.extend(replayed)
        progress.update("verify", progress.phases["verify"].count + len(checked.lines))
        lines.extend(checked.lines)
        ok = ok and checked.ok
    else:
        await consumer.wait(CONSUMER_TIMEOUT)
    progress.finish("verify")
    return lines, ok


async def replay_phase(
    log: Log,
    consumer: ConsumerProcess,
    watcher: Watcher,
    expected: Expected,
    registered: set[str],
    produced: Produced,
    dead: Sequence[DeadLetter],
) -> tuple[list[str], Verification]:
    """Register the missing aircraft, replay the dead letters ``dead``, verify every flight.

    The consumer of the first phase is still running (idle); it applies the
    replayed flights and is then told to stop.

    :returns: the report's replay lines and the verification.
    """
    started = time.perf_counter()
    progress = watcher.progress
    missing = sorted(set(expected.totals) - registered)
    watcher.replay_base = watcher.applied
    progress.start("replay", sum(len(d.source.ids) for d in dead if d.source is not None))
    planes = Producer(log, PLANES_TOPIC)
    await planes.publish_many(
        [PlaneRegistered(t, None, "unknown", "unknown", None) for t in missing]
    )
    listed = len(registered) + len(missing)
    await planes.publish(RegisterPublished(REGISTER, listed))
    progress.event("replay", f"replay: {len(missing):,} missing aircraft registered")
    # An operator replays once the amended register is in the projection;
    # replayed flights of a plane still loading would wait (Transient) anyway.
    await wait_for_register(consumer, watcher.projection, listed)
    replayed = await replay_dead_letters(log, FLIGHTS_TOPIC, group=GROUP, reason="gave_up_retry")
    progress.event("replay", f"replay: {len(replayed.replayed):,} dead letters replayed")
    consumer.tell("stop")
    code = await consumer.wait(CONSUMER_TIMEOUT)
    await watcher.sample()
    progress.finish("replay")
    result = Verification()
    if code != 0:
        result.check(False, f"the consumer failed with exit status {code} in the replay phase")
        return [], result
    wanted = {(r.dlq_partition, r.dlq_offset) for r in replayed.replayed}
    records = sum(
        len(d.source.ids)
        for d in dead
        if (d.partition, d.offset) in wanted and d.source is not None
    )
    lines = [
        "replay of the dead letters",
        f"registered               {len(missing):,} missing aircraft as unknown models",
        f"replayed                 {len(replayed.replayed):,} dead letters ({records:,} flights)"
        f", skipped {len(replayed.skipped):,}, replayed before {replayed.already_replayed:,}"
        f", in {time.perf_counter() - started:.1f} s "
        "(by the running consumer)",
    ]
    checked = await verify(
        await list_dead_letters(log, FLIGHTS_TOPIC, group=GROUP),
        watcher.projection,
        expected,
        registered | set(missing),
        produced.refused,
        after_replay=True,
    )
    return lines, checked


async def wait_for_register(consumer: ConsumerProcess, projection: Projection, planes: int) -> None:
    """Wait until the projection holds the register of ``planes`` planes, complete.

    :raises TimeoutError: after :data:`CONSUMER_TIMEOUT` seconds, or when the
        consumer exits first.
    """
    deadline = time.monotonic() + CONSUMER_TIMEOUT
    while await asyncio.to_thread(projection.register_size) < planes:
        if consumer.process is None or consumer.process.poll() is not None:
            raise TimeoutError("the demo consumer exited before the register was stored")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the register was not stored within {CONSUMER_TIMEOUT:.0f} s")
        await asyncio.sleep(0.05)
