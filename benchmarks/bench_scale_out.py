"""One consumer process against two of one group, on every log, in the same run.

For each log (``--logs``: an SQLite file, Redis, NATS, Kafka, Iggy) the
parent fills a fresh 4-partition ``ticks`` topic with a backlog (``--events``
over ``--keys`` keys), then, per round and per handler, times

(a) one consumer process draining it as a fresh group, and
(b) two consumer processes of one fresh group draining it (the order of (a)
    and (b) alternates between rounds),

each with a no-op handler and with an I/O-like one (``await
asyncio.sleep(0.002)`` per chunk). A consumer process runs
``Consumer.run()`` at the library's defaults: ``ConsumerConfig(topic=,
group=)`` and ``Handler(Tick, handle)`` (``max_batch`` 1, so a chunk is one
event). It reports on stdout, every 20 ms, the numbers of the events it
handled and its CPU time. The parent starts the processes of a run together
once they are ready (interpreter start, imports and the group's retry and
dead-letter topics, which the parent creates, are not timed), times from
that start until the processes have reported every event at least once, then
stops them with SIGTERM. Each run names the partitions each process handled
records of and counts the events handled more than once.

(c) Join: a member A starts alone (I/O handler, fresh group); once it has
handled its first event, member B starts. The run reports when B's
``Consumer.start()`` returned, when B first owned a partition and when it
handled its first event (seconds from B's start; "never" when the backlog
was drained before a partition moved to B), and goes on
until every event is handled and ``--join-wait`` seconds have passed since B
started. Over that run, each member counts in its own process the calls that
keep or seek ownership: ``Log.acquire_partition`` (a lease taken, renewed or
refused: SQLite, Redis and NATS; on Kafka and Iggy the supervisors' look at
the assignment) and ``release_partition``; on the lease logs the renewals
of the member's place among the group's members and the ``partition_owners``
listings the balance reads (``engine/_balance.py``); on Kafka the group requests its
librdkafka member consumer sent (``Heartbeat``, ``JoinGroup``,
``SyncGroup``...: librdkafka's own statistics); on Iggy the assignment syncs
(``SyncConsumerGroup``: every 0.5 s and before each fenced write); and its
``Log.read`` calls per topic role (idle partitions poll every
``poll_interval``; the control topic is read every ``poll_interval``).

CPU: each process's CPU seconds from its start to the moment every event was
handled, the server's (the process listening on the log's port, from
``/proc``) over the same span, and how busy the machine's CPUs were.

Each process also counts the warnings it logged (a worker stopped by a
refused store, a lease that ran out), printed with the run.

    python benchmarks/bench_scale_out.py [--logs sqlite redis nats kafka iggy]
        [--handlers no-op io] [--events N] [--keys K] [--rounds R]
        [--join-wait S] [--timeout S] [--redis URL] [--nats URL] [--kafka URL]
        [--iggy URL]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from array import array
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _args import non_negative_float, positive_float, positive_int
from _ticks import TOPIC, Tick, fill, ticks
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.engine._balance import MEMBERS_SUFFIX
from wakuwaku.logs import Lease, Log, open_log

LOGS = ("sqlite", "redis", "nats", "kafka", "iggy")
PARTITIONS = 4
HANDLERS = ("no-op", "io")
IO_SECONDS = 0.002
"""The I/O-like handler's wait per chunk (seconds)."""
FRAME_EVERY = 0.02
"""How often a consumer process reports the events it handled (seconds)."""
BEAT_EVERY = 0.1
"""How often it reports its CPU time when it handled nothing new (seconds)."""
STOP_LIMIT = 45.0
"""How long a stopped process may take to exit (seconds; shutdown_timeout is 30)."""
READY_LIMIT = 120.0
"""How long a process may take to start (seconds)."""

REFUSED_STORE = "partition lease lost; stopping"
"""The warning of a worker whose store the log refused as fenced (it stops)."""

Emit = Callable[[str], None]


# --------------------------------------------------------------- the consumer process


class Traffic:
    """What one member counts in its own process: ownership calls and reads."""

    def __init__(self, emit: Emit) -> None:
        self.calls: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        """Seconds spent waiting for the counted calls, by name."""
        self.kafka: dict[str, int] = {}
        """librdkafka's requests of the member's group consumer, by type (cumulative)."""
        self.owned: dict[int, bool] = {}
        self.emit = emit

    def held(self, partition: int, held: bool) -> None:
        """Note what an acquire answered; a change is reported to the parent."""
        if self.owned.get(partition, False) != held:
            self.owned[partition] = held
            self.emit(f"o {time.monotonic():.6f} {partition} {int(held)}")


class Warnings(logging.Handler):
    """Counts the consumer's warnings by message (a worker stopped by a refused
    store logs ``partition lease lost; stopping``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.getMessage()] += 1


def topic_role(topic: str) -> str:
    """``main``, ``retry``, ``dead-letter``, ``control`` or ``names`` (wakuwaku's own)."""
    for prefix, role in (
        ("wk-retry.", "retry"),
        ("wk-dlq.", "dead-letter"),
        ("wk-control.", "control"),
        ("wk-topic-names", "names"),
    ):
        if topic.startswith(prefix):
            return role
    return "main"


def count_calls(log: Log, traffic: Traffic) -> None:
    """Count ``log``'s acquire, release and read calls (the log itself is unchanged)."""
    acquire, release, read = log.acquire_partition, log.release_partition, log.read
    owners = log.partition_owners

    async def acquire_counted(
        group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        if group.endswith(MEMBERS_SUFFIX):  # the member's place, not a partition
            traffic.calls["place"] += 1
            return await acquire(group, topic, partition, member, ttl)
        traffic.calls["acquire"] += 1
        held = traffic.owned.get(partition, False)
        started = time.perf_counter()
        lease = await acquire(group, topic, partition, member, ttl)
        traffic.seconds["acquire"] += time.perf_counter() - started
        if lease is None:
            traffic.calls["acquire refused"] += 1
        elif held:
            traffic.calls["acquire renewed"] += 1
        traffic.held(partition, lease is not None)
        return lease

    async def owners_counted(group: str, topic: str) -> dict[int, Lease] | None:
        traffic.calls["owners"] += 1
        return await owners(group, topic)

    async def release_counted(lease: Lease) -> None:
        if lease.group.endswith(MEMBERS_SUFFIX):
            await release(lease)
            return
        traffic.calls["release"] += 1
        traffic.held(lease.partition, False)
        await release(lease)

    async def read_counted(
        topic: str, partition: int, offset: int, max_records: int = 500, wait: float = 0.0
    ) -> Any:
        traffic.calls[f"read {topic_role(topic)}"] += 1
        return await read(topic, partition, offset, max_records, wait)

    log.acquire_partition = acquire_counted  # type: ignore[method-assign]
    log.release_partition = release_counted  # type: ignore[method-assign]
    log.partition_owners = owners_counted  # type: ignore[method-assign]
    log.read = read_counted  # type: ignore[method-assign]


def count_iggy_syncs(log: Log, traffic: Traffic) -> None:
    """Count the Iggy log's assignment syncs (``SyncConsumerGroup``), all and
    those made before a fenced write."""
    from wakuwaku.logs.iggy import IggyLog

    assert isinstance(log, IggyLog)
    groups = log._groups
    sync, fence_owner = groups._sync, groups.fence_owner

    async def sync_counted(member: Any, topic: str) -> Any:
        traffic.calls["iggy sync"] += 1
        started = time.perf_counter()
        try:
            return await sync(member, topic)
        finally:
            traffic.seconds["iggy sync"] += time.perf_counter() - started

    async def fence_counted(fence: Lease, *, ask: bool = True) -> Any:
        if ask:
            traffic.calls["iggy sync before a write"] += 1
        return await fence_owner(fence, ask=ask)

    groups._sync = sync_counted  # type: ignore[method-assign]
    groups.fence_owner = fence_counted  # type: ignore[method-assign]


def count_kafka_requests(traffic: Traffic) -> None:
    """Give the Kafka log's member consumers librdkafka statistics every 0.5 s;
    the last report's request counts (summed over brokers) land in ``traffic``."""
    from confluent_kafka import Consumer as KafkaConsumer

    from wakuwaku.logs.kafka import _member

    def stats(text: str) -> None:
        totals: Counter[str] = Counter()
        for broker in json.loads(text).get("brokers", {}).values():
            totals.update(broker.get("req", {}))
        traffic.kafka = {name: n for name, n in totals.items() if n}

    def member_consumer(conf: dict[str, Any]) -> Any:
        return KafkaConsumer({**conf, "statistics.interval.ms": 500, "stats_cb": stats})

    vars(_member)["Consumer"] = member_consumer  # the name _member.Member calls


def tick_handler(kind: str, handled: array[int]) -> Handler[Tick]:
    """A handler at its defaults that notes every event number it handled;
    ``io`` waits :data:`IO_SECONDS` per chunk first."""

    async def no_op(run: Sequence[Tick]) -> None:
        handled.extend(tick.n for tick in run)

    async def io(run: Sequence[Tick]) -> None:
        await asyncio.sleep(IO_SECONDS)
        handled.extend(tick.n for tick in run)

    return Handler(Tick, io if kind == "io" else no_op)


def frame(handled: array[int], cpu_start: float) -> str:
    """The report line of the events handled since the last one (then forgotten)."""
    data = base64.b64encode(handled.tobytes()).decode() if handled else "-"
    del handled[:]
    return f"t {time.monotonic():.6f} {time.process_time() - cpu_start:.4f} {data}"


async def report(handled: array[int], emit: Emit, cpu_start: float) -> None:
    """Report new events every :data:`FRAME_EVERY` s, the CPU time at least
    every :data:`BEAT_EVERY` s."""
    beat = time.monotonic()
    while True:
        await asyncio.sleep(FRAME_EVERY)
        if handled or time.monotonic() - beat >= BEAT_EVERY:
            emit(frame(handled, cpu_start))
            beat = time.monotonic()


async def child(url: str, group: str, kind: str) -> None:
    """One consumer process: ready, wait for ``go`` on stdin, run until SIGTERM."""
    logging.basicConfig(level=logging.WARNING)
    warnings = Warnings()
    logging.getLogger().addHandler(warnings)

    def emit(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    traffic = Traffic(emit)
    if url.startswith("kafka:"):
        count_kafka_requests(traffic)
    log = open_log(url)
    count_calls(log, traffic)
    if url.startswith("iggy:"):
        count_iggy_syncs(log, traffic)
    handled: array[int] = array("I")
    config = ConsumerConfig(topic=TOPIC, group=group)
    consumer = Consumer(config, [tick_handler(kind, handled)], log)
    emit("ready")
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    started, cpu_start = time.monotonic(), time.process_time()
    reporter = asyncio.create_task(report(handled, emit, cpu_start))
    try:
        await consumer.start()
        emit(f"s {time.monotonic():.6f}")
        stats = await consumer.run()
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
    emit(frame(handled, cpu_start))
    end = {
        "ran": time.monotonic() - started,
        "calls": traffic.calls,
        "seconds": traffic.seconds,
        "warnings": warnings.counts,
        "kafka": traffic.kafka,
        "handled": stats.handled,
        "member": config.member_id,
    }
    emit(f"end {json.dumps(end)}")
    await log.close()


# --------------------------------------------------------------- CPU time from /proc


def server_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` of this machine, from ``/proc``, or None."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                cells = line.split()
                if cells[3] == "0A" and int(cells[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{cells[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
    return None


TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) ``pid`` has used; 0 without one."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            cells = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(cells[11]) + int(cells[12])) / TICK


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from ``/proc/stat``."""
    with open("/proc/stat") as stat:
        cells = [int(c) for c in stat.readline().split()[1:]]
    idle = cells[3] + cells[4]
    return (sum(cells) - idle) / TICK, sum(cells) / TICK


@dataclass
class Usage:
    """CPU counters read at a run's start, for what the run's span used."""

    server: int | None
    server_cpu: float = 0.0
    machine: tuple[float, float] = (0.0, 0.0)

    def start(self) -> None:
        self.server_cpu = process_cpu(self.server)
        self.machine = machine_cpu()

    def since(self) -> tuple[float, float]:
        """(server CPU seconds, share of the machine's CPUs busy) since :meth:`start`."""
        busy, total = machine_cpu()
        share = (busy - self.machine[0]) / max(total - self.machine[1], 1e-9)
        return process_cpu(self.server) - self.server_cpu, share


# --------------------------------------------------------------- the parent's view


@dataclass
class Member:
    """The parent's view of one consumer process."""

    proc: asyncio.subprocess.Process
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    first: asyncio.Event = field(default_factory=asyncio.Event)
    go_at: float = 0.0
    started_at: float | None = None
    """When its ``Consumer.start()`` returned (topics checked; monotonic seconds)."""
    first_at: float | None = None
    owned_at: float | None = None
    """When it first owned a partition (monotonic seconds)."""
    cpu: float = 0.0
    """Its CPU seconds since its start, as last reported before every event was handled."""
    cpu_end: float = 0.0
    """Its CPU seconds since its start, as last reported."""
    handled: int = 0
    partitions: Counter[int] = field(default_factory=Counter)
    """Records it handled, per partition."""
    end: dict[str, Any] | None = None
    stderr: bytearray = field(default_factory=bytearray)

    def go(self) -> None:
        """Start consuming now."""
        self.go_at = time.monotonic()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")

    def warned(self, message: str) -> int:
        """How many times it logged the warning ``message``."""
        return 0 if self.end is None else int(self.end["warnings"].get(message, 0))

    def count(self, name: str) -> int:
        """How many ``name`` calls it made in its run (from its final report)."""
        if self.end is None:
            return 0
        return int({**self.end["calls"], **self.end["kafka"]}.get(name, 0))

    def rate(self, name: str) -> str:
        """``name`` calls in its run, per second, and the mean wait for one when timed."""
        ran = float(self.end["ran"]) if self.end is not None else float("nan")
        count = self.count(name)
        text = f"{count:6,} ({count / ran:6.2f}/s)"
        waited = float(self.end["seconds"].get(name, 0.0)) if self.end is not None else 0.0
        return text + (f" {waited / count * 1000:5.2f} ms each" if waited and count else " " * 14)


class Run:
    """One timed run: every event the processes of one group handled, and when."""

    def __init__(self, partition_of: bytes) -> None:
        self.partition_of = partition_of
        self.counts = bytearray(len(partition_of))
        self.distinct = 0
        self.done = asyncio.Event()
        self.done_at: float | None = None
        self.members: list[Member] = []

    def on_frame(self, member: Member, stamp: float, cpu: float, data: str) -> None:
        """A report of ``member``: its CPU time, the events it handled."""
        member.cpu_end = cpu
        if not self.done.is_set():
            member.cpu = cpu
        if data == "-":
            return
        numbers: array[int] = array("I")
        numbers.frombytes(base64.b64decode(data))
        if member.first_at is None:
            member.first_at = stamp
            member.first.set()
        member.handled += len(numbers)
        counts, partition_of = self.counts, self.partition_of
        for n in numbers:
            if not counts[n]:
                self.distinct += 1
            counts[n] = min(counts[n] + 1, 255)
            member.partitions[partition_of[n]] += 1
        if self.distinct == len(counts) and not self.done.is_set():
            self.done_at = stamp
            self.done.set()

    async def follow(self, member: Member) -> None:
        """Read ``member``'s reports until it exits."""
        assert member.proc.stdout is not None
        while line := await member.proc.stdout.readline():
            kind, _, rest = line.decode().rstrip("\n").partition(" ")
            if kind == "ready":
                member.ready.set()
            elif kind == "t":
                stamp, cpu, data = rest.split(" ")
                self.on_frame(member, float(stamp), float(cpu), data)
            elif kind == "s":
                member.started_at = float(rest)
            elif kind == "o" and rest.endswith(" 1") and member.owned_at is None:
                member.owned_at = float(rest.split(" ")[0])
            elif kind == "end":
                member.end = json.loads(rest)

    @property
    def duplicates(self) -> int:
        """Handlings beyond each event's first."""
        return sum(m.handled for m in self.members) - self.distinct


async def keep_tail(member: Member) -> None:
    """Keep the last 20 000 bytes of ``member``'s stderr (its log lines)."""
    assert member.proc.stderr is not None
    while chunk := await member.proc.stderr.read(65536):
        member.stderr += chunk
        del member.stderr[:-20_000]


async def spawn(
    run: Run, url: str, group: str, kind: str
) -> tuple[Member, list[asyncio.Task[None]]]:
    """Start one consumer process of ``group`` and follow it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--child",
        url,
        group,
        kind,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=1 << 24,
    )
    member = Member(proc)
    run.members.append(member)
    tasks = [asyncio.create_task(run.follow(member)), asyncio.create_task(keep_tail(member))]
    return member, tasks


async def stop(members: Sequence[Member]) -> list[str]:
    """SIGTERM every process (a graceful stop); what went wrong, if anything."""
    for member in members:
        if member.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                member.proc.send_signal(signal.SIGTERM)
    problems = []
    for n, member in enumerate(members):
        try:
            await asyncio.wait_for(member.proc.wait(), STOP_LIMIT)
        except TimeoutError:
            member.proc.kill()
            await member.proc.wait()
            problems.append(f"process {n + 1} did not stop within {STOP_LIMIT:.0f} s; killed")
        if member.proc.returncode not in (0, None) or member.end is None:
            tail = member.stderr.decode(errors="replace").strip().splitlines()[-5:]
            problems.append(f"process {n + 1} exited {member.proc.returncode}: {tail}")
    return problems


@dataclass
class Outcome:
    """What one run measured."""

    members: list[Member]
    seconds: float | None
    """From the start until every event was handled; None: not within the timeout."""
    handled: int
    events: int
    duplicates: int
    server_cpu: float
    busy: float
    problems: list[str]

    @property
    def split(self) -> str:
        """Partitions each process handled records of (``2+2``; a partition
        that moved counts for both)."""
        return "+".join(str(len(m.partitions)) for m in self.members)

    @property
    def consumer_cpu(self) -> float:
        return sum(m.cpu for m in self.members)

    @property
    def refused_stores(self) -> int:
        """Workers stopped because the log refused their store as fenced."""
        return sum(m.warned(REFUSED_STORE) for m in self.members)

    @property
    def first_event(self) -> float | None:
        """Seconds from the start to the first event any process handled."""
        firsts = [m.first_at - m.go_at for m in self.members if m.first_at is not None]
        return min(firsts, default=None)

    def describe(self) -> str:
        """One line: time, split, duplicates, CPU, problems."""
        took = "did not finish" if self.seconds is None else f"{self.seconds:.2f} s"
        text = (
            f"{took} (first event {seconds_text(self.first_event)} s, "
            f"split {self.split}, {self.duplicates} duplicates, "
            f"{self.refused_stores} stores refused, CPU s: "
            f"consumers {self.consumer_cpu:.2f}, server {self.server_cpu:.2f}, "
            f"machine {self.busy:.0%} busy)"
        )
        if self.seconds is None:
            text += f" [{self.handled:,} of {self.events:,} handled]"
        return text + warnings_text(self.members) + "".join(f" [{p}]" for p in self.problems)


def warnings_text(members: Sequence[Member]) -> str:
    """The warnings the processes logged, but refused stores (counted apart), with counts."""
    counts: Counter[str] = Counter()
    for member in members:
        if member.end is not None:
            counts.update(member.end["warnings"])
    counts.pop(REFUSED_STORE, None)
    return "".join(f" [warning {message!r} x{n}]" for message, n in sorted(counts.items()))


@dataclass(frozen=True)
class Target:
    """One log under test, in a namespace of its own."""

    name: str
    url: str
    port: int | None
    purge: Callable[[], Awaitable[None]]


async def timed(
    target: Target, group: str, kind: str, processes: int, partition_of: bytes, limit: float
) -> Outcome:
    """``processes`` consumer processes of ``group`` started together, until
    every event is handled (or ``limit`` seconds)."""
    run, tasks = Run(partition_of), []
    for _ in range(processes):
        tasks += (await spawn(run, target.url, group, kind))[1]
    members = run.members
    await asyncio.wait_for(asyncio.gather(*(m.ready.wait() for m in members)), READY_LIMIT)
    usage = Usage(target.port and server_pid(target.port))
    usage.start()
    for member in members:
        member.go()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(run.done.wait(), limit)
    server_cpu, busy = usage.since()
    problems = await stop(members)
    await asyncio.gather(*tasks)
    seconds = None if run.done_at is None else run.done_at - members[0].go_at
    return Outcome(
        members,
        seconds,
        run.distinct,
        len(partition_of),
        run.duplicates,
        server_cpu,
        busy,
        problems,
    )


async def join(
    target: Target, group: str, partition_of: bytes, limit: float, join_wait: float
) -> Outcome:
    """Member A alone, member B once A handled its first event; both run until
    every event is handled and ``join_wait`` seconds have passed since B started."""
    run, tasks = Run(partition_of), []
    for _ in range(2):
        tasks += (await spawn(run, target.url, group, "io"))[1]
    first, second = run.members
    await asyncio.wait_for(asyncio.gather(first.ready.wait(), second.ready.wait()), READY_LIMIT)
    usage = Usage(target.port and server_pid(target.port))
    usage.start()
    first.go()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(first.first.wait(), limit)
    second.go()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(run.done.wait(), limit)
    await asyncio.sleep(max(0.0, second.go_at + join_wait - time.monotonic()))
    server_cpu, busy = usage.since()
    problems = await stop(run.members)
    await asyncio.gather(*tasks)
    seconds = None if run.done_at is None else run.done_at - first.go_at
    return Outcome(
        run.members,
        seconds,
        run.distinct,
        len(partition_of),
        run.duplicates,
        server_cpu,
        busy,
        problems,
    )


# --------------------------------------------------------------- the logs


def port_of(url: str) -> int | None:
    """The port of a server URL (its process's CPU time is read), None without one."""
    return urlsplit(url).port


def targets(args: argparse.Namespace, folder: Path) -> dict[str, Callable[[], Target]]:
    """Per log name, a maker of its :class:`Target` in a fresh namespace."""

    def sqlite() -> Target:
        async def purge() -> None:
            return None  # the temporary folder goes at the end

        path = folder / f"{uuid.uuid4().hex[:8]}.db"
        return Target("sqlite", f"sqlite:///{path}", None, purge)

    def redis() -> Target:
        prefix = f"wkscale{uuid.uuid4().hex[:8]}"

        async def purge() -> None:
            from bench_redis import purge as purge_prefix

            await purge_prefix(args.redis, prefix)

        return Target("redis", f"{args.redis}?prefix={prefix}", port_of(args.redis), purge)

    def nats() -> Target:
        prefix = f"wkscale{uuid.uuid4().hex[:8]}"

        async def purge() -> None:
            from bench_nats import purge as purge_prefix

            await purge_prefix(args.nats, prefix)

        return Target("nats", f"{args.nats}?prefix={prefix}", port_of(args.nats), purge)

    def kafka() -> Target:
        prefix = f"wkscale{uuid.uuid4().hex[:8]}."

        async def purge() -> None:
            from bench_kafka import drop

            await asyncio.to_thread(drop, args.kafka.removeprefix("kafka://"), prefix)

        return Target("kafka", f"{args.kafka}?prefix={prefix}", port_of(args.kafka), purge)

    def iggy() -> Target:
        stream = f"wkscale{uuid.uuid4().hex[:8]}"

        async def purge() -> None:
            from apache_iggy import IggyClient

            client = IggyClient.from_connection_string(args.iggy)
            await client.connect()
            await client.delete_stream(stream)
            del client
            await asyncio.sleep(0.1)  # the client's Rust runtime ends in the background

        return Target("iggy", f"{args.iggy}?stream={stream}", port_of(args.iggy), purge)

    return {"sqlite": sqlite, "redis": redis, "nats": nats, "kafka": kafka, "iggy": iggy}


async def prepare(target: Target, events: int, keys: int) -> bytes:
    """Fill the backlog; each event's partition, by event number."""
    log = open_log(target.url)
    started = time.perf_counter()
    await fill(log, events, keys, PARTITIONS)
    print(f"{target.name}: {events:,} events filled in {time.perf_counter() - started:.1f} s")
    partition_of = bytes(log.partition_for(t.key, PARTITIONS) for t in ticks(events, keys))
    await log.close()
    return partition_of


async def make_group_topics(target: Target, group: str) -> None:
    """Create ``group``'s retry and dead-letter topics, so that no run times their creation."""
    log = open_log(target.url)
    names = ConsumerConfig(topic=TOPIC, group=group).group_topics(TOPIC)
    for name in (names.retry, names.dead_letter):
        await log.create_topic(name, PARTITIONS, derived_from=TOPIC)
    await log.close()


@dataclass
class LogResult:
    """Every outcome of one log: per handler, (one process, two processes) per round."""

    name: str
    pairs: dict[str, list[tuple[Outcome, Outcome]]]
    joined: Outcome | None = None


async def bench_log(target: Target, args: argparse.Namespace) -> LogResult:
    """Rounds of (a) and (b) per handler, then the join run, on one log."""
    partition_of = await prepare(target, args.events, args.keys)
    result = LogResult(target.name, {kind: [] for kind in args.handlers})
    for n in range(args.rounds):
        for kind in args.handlers:
            outcomes: dict[int, Outcome] = {}
            for processes in (1, 2) if n % 2 == 0 else (2, 1):
                group = f"r{n}-{kind}-{processes}"
                await make_group_topics(target, group)
                outcomes[processes] = await timed(
                    target, group, kind, processes, partition_of, args.timeout
                )
            result.pairs[kind].append((outcomes[1], outcomes[2]))
            print(
                f"  round {n + 1}, {kind}: 1 process {outcomes[1].describe()}; "
                f"2 processes {outcomes[2].describe()}",
                flush=True,
            )
    await make_group_topics(target, "join")
    result.joined = await join(target, "join", partition_of, args.timeout, args.join_wait)
    print(f"  join: {describe_join(result.joined)}", flush=True)
    return result


# --------------------------------------------------------------- the report


def after(member: Member, moment: float | None) -> str:
    return "never" if moment is None else f"{moment - member.go_at:.2f} s"


def describe_join(outcome: Outcome) -> str:
    """One line: when B started, owned a partition and handled an event; the outcome."""
    first, second = outcome.members
    return (
        f"B's Consumer.start() returned after {after(second, second.started_at)}, B owned a "
        f"partition after {after(second, second.owned_at)} and handled its first event "
        f"after {after(second, second.first_at)} (from B's start); split {outcome.split}; "
        f"A handled {first.handled:,}, B {second.handled:,}, {outcome.duplicates} "
        "duplicates; all handled "
        + ("never" if outcome.seconds is None else f"{outcome.seconds:.2f} s after A's start")
        + f"; CPU s over the run: A {first.cpu_end:.2f}, B {second.cpu_end:.2f}, server "
        f"{outcome.server_cpu:.2f}; {outcome.refused_stores} workers stopped by a refused "
        "store" + warnings_text(outcome.members) + "".join(f" [{p}]" for p in outcome.problems)
    )


TRAFFIC = (
    ("acquire", "acquire_partition"),
    ("acquire renewed", "  of which renewals"),
    ("acquire refused", "  of which refused"),
    ("release", "release_partition"),
    ("place", "place among the members (lease logs)"),
    ("owners", "partition_owners (members and owners)"),
    ("Heartbeat", "Kafka Heartbeat"),
    ("JoinGroup", "Kafka JoinGroup"),
    ("SyncGroup", "Kafka SyncGroup"),
    ("OffsetCommit", "Kafka OffsetCommit"),
    ("iggy sync", "Iggy SyncConsumerGroup"),
    ("iggy sync before a write", "  of which before a fenced write"),
    ("read main", "reads of the main topic"),
    ("read retry", "reads of the retry topic"),
    ("read dead-letter", "reads of the dead-letter topic"),
    ("read control", "reads of the control topic"),
)


def print_traffic(result: LogResult) -> None:
    """Calls per second per member over the join run (A, B)."""
    outcome = result.joined
    if outcome is None or any(m.end is None for m in outcome.members):
        return
    first, second = outcome.members
    assert first.end is not None and second.end is not None
    print(
        f"{result.name}: calls per second per member over the join run "
        f"(A {first.end['ran']:.1f} s, B {second.end['ran']:.1f} s)"
    )
    for name, label in TRAFFIC:
        if first.count(name) or second.count(name):
            print(f"  {label:<34} A {first.rate(name)}   B {second.rate(name)}")


def median(values: Sequence[float | None]) -> float | None:
    """The median, None when a run did not finish."""
    if any(v is None for v in values):
        return None
    return statistics.median(v for v in values if v is not None)


def seconds_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def cpu_text(outcomes: Sequence[Outcome]) -> str:
    """Medians: CPU seconds of the processes + the server's, the cores they
    kept busy (that CPU over the run's time), and how busy the machine was."""
    cpu = statistics.median(o.consumer_cpu for o in outcomes)
    server = statistics.median(o.server_cpu for o in outcomes)
    cores = median(
        [None if not o.seconds else (o.consumer_cpu + o.server_cpu) / o.seconds for o in outcomes]
    )
    busy = statistics.median(o.busy for o in outcomes)
    return f"{cpu:5.2f}+{server:<5.2f} {seconds_text(cores):>5} {busy:>4.0%}"


def print_summary(results: Sequence[LogResult], args: argparse.Namespace) -> None:
    """The table: per log and handler, medians of the rounds."""
    print(
        f"\n{args.events:,} events over {args.keys:,} keys, {PARTITIONS} partitions, "
        f"default ConsumerConfig; median of {args.rounds} rounds; ratio = median of the "
        "rounds' one/two; CPU = CPU seconds of the processes + the server's from the start "
        "until all were handled, cores = that CPU / time, busy = the machine's CPUs; "
        "1st event = median seconds from the start of one process to its first event"
    )
    print(
        f"{'log':<7} {'handler':<7} {'1 proc s':>8} {'2 procs s':>9} {'ratio':>6} "
        f"{'1st event':>9} {'splits':<15} {'dups':>5}  "
        f"{'1 proc: CPU, cores, busy':<24}  2 procs: CPU, cores, busy"
    )
    for result in results:
        for kind, pairs in result.pairs.items():
            ones, twos = [one for one, _ in pairs], [two for _, two in pairs]
            ratio = median(
                [None if not (a.seconds and b.seconds) else a.seconds / b.seconds for a, b in pairs]
            )
            print(
                f"{result.name:<7} {kind:<7} {seconds_text(median([o.seconds for o in ones])):>8} "
                f"{seconds_text(median([o.seconds for o in twos])):>9} {seconds_text(ratio):>6} "
                f"{seconds_text(median([o.first_event for o in ones])):>9} "
                f"{','.join(o.split for o in twos):<15} "
                f"{sum(o.duplicates for o in ones + twos):>5}  "
                f"{cpu_text(ones):<24}  {cpu_text(twos)}"
            )
    print()
    for result in results:
        if result.joined is not None:
            print(f"{result.name} join: {describe_join(result.joined)}")
    for result in results:
        print_traffic(result)


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        makers = targets(args, Path(tmp))
        for name in args.logs:
            target = makers[name]()
            try:
                results.append(await bench_log(target, args))
            finally:
                await target.purge()
    print_summary(results, args)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", nargs="+", choices=LOGS, default=list(LOGS))
    parser.add_argument("--handlers", nargs="+", choices=HANDLERS, default=list(HANDLERS))
    parser.add_argument("--events", type=positive_int, default=40_000)
    parser.add_argument("--keys", type=positive_int, default=1_000)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument(
        "--join-wait",
        type=non_negative_float,
        default=20.0,
        help="seconds the join run lasts after B starts (default 20: past a 15 s lease_ttl)",
    )
    parser.add_argument(
        "--timeout", type=positive_float, default=120.0, help="seconds a run may take (default 120)"
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--kafka", default="kafka://127.0.0.1:9092")
    parser.add_argument("--iggy", default="iggy://iggy:iggy@127.0.0.1:8090")
    parser.add_argument(
        "--child", nargs=3, metavar=("URL", "GROUP", "HANDLER"), help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    parsed = parse_args()
    if parsed.child:
        asyncio.run(child(*parsed.child))
    else:
        asyncio.run(main(parsed))
