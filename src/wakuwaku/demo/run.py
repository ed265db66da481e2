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

This module is the orchestration: it runs the phases in order, with the
options of :mod:`.options`, the producers of :mod:`.producers`, the
processes of :mod:`.processes` and the report and verification of
:mod:`.verify`, and owns the log (topics, the reset, the dead letters'
replay) and the workdir. Its entry point is :func:`run_demo`, which the CLI
calls; none of the modules it uses imports it back.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections import Counter
from collections.abc import Sequence

from .._errors import ConfigError
from .._producer import Producer
from .._sanitize import redact_url
from .._text import plural
from ..admin import DeadLetter, list_dead_letters, replay_dead_letters
from ..engine import ConsumerConfig
from ..logs import Log, open_log
from .data import Expected, FlightRow, PlaneRow, expected_totals, read_flights, read_planes
from .flights import (
    FLIGHTS_TOPIC,
    GROUP,
    PLANES_TOPIC,
    PlaneRegistered,
    Projection,
    RegisterPublished,
)
from .options import DEFAULT_DELAYS as DEFAULT_DELAYS
from .options import DemoOptions as DemoOptions
from .processes import Chaos, ConsumerProcess, Watcher, chaos_monkey
from .producers import REGISTER, Produced, produce
from .progress import Progress, make_progress
from .verify import Print, Verification, report, verify

CONSUMER_TIMEOUT = 600.0
"""How long the demo waits for its consumer (a phase, the chaos, the register) (seconds)."""


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
    consumer: ConsumerProcess | None = None
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
        # A run that failed (an error, Ctrl-C) leaves no consumer behind: it
        # kept running, its parent gone, after the log failed mid-run.
        if consumer is not None and consumer.kill():
            out(f"stopped the consumer the failed run left running (see {workdir}/consumer.log)")
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
    count = len(replayed.replayed)
    progress.event("replay", f"replay: {count:,} {plural(count, 'dead letter')} replayed")
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
        f"replayed                 {count:,} {plural(count, 'dead letter')} "
        f"({records:,} {plural(records, 'flight')})"
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
