"""Liveness: a partition never stalls in silence (design §7), on every log.

A partition with records to read whose worker makes no progress while the
log answers is logged at error (``partition stalled; restarting its
worker`` with topic, partition, lag and for how long), counted
(``ConsumerStats.stalls``) and its worker restarted from the stored offsets.
The small input: a read whose reply never comes (what a NATS restart did to
a pull request), the consumer stuck on it for good while ``status`` showed
lag 1 600. Deliberate waits (an idle partition, a Transient retry in place)
are progress, never a stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.engine._balance import MEMBERS_SUFFIX
from wakuwaku.logs import Log

from .conftest import Item, setup_topic


class LostReply:
    """``inner``, except that main-topic reads from ``hang_at`` on hang
    once, forever, as a request whose reply is lost does."""

    def __init__(self, inner: Log, hang_at: int) -> None:
        self.inner = inner
        self.hang_at = hang_at
        self.hung = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read(self, topic: str, partition: int, offset: int, limit: int = 500) -> Any:
        if topic == "t" and offset >= self.hang_at and not self.hung.is_set():
            self.hung.set()
            await asyncio.Event().wait()  # the reply that never comes
        return await self.inner.read(topic, partition, offset, limit)


def _config(**overrides: Any) -> ConsumerConfig:
    options: dict[str, Any] = {
        "topic": "t",
        "group": "g",
        "max_poll_records": 10,
        "poll_interval": 0.01,
        "retry_delays": (0.05,),
        "stall_timeout": 0.5,
        "lease_ttl": 30.0,
    }
    options.update(overrides)
    return ConsumerConfig(**options)


async def test_a_read_whose_reply_never_comes_restarts_the_worker_loudly(
    log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    producer = await setup_topic(log, partitions=2)
    events = [Item(f"k{n % 6}", n) for n in range(120)]
    await producer.publish_many(events)
    seen: list[int] = []

    async def handle(run: Sequence[Item]) -> None:
        seen.extend(e.n for e in run)

    # Each key has 20 records, so a partition that has any has 20 or more,
    # and the read at offset 10 always has records behind it (lag), however
    # a log's key partitioning places the six keys. (At 20, Iggy's put the
    # hang at the end of a partition holding one key: no lag, so rightly no
    # stall, and the drain waited on the lost read.)
    wrapped = LostReply(log, hang_at=10)
    # A stall_timeout well above what a loaded machine's slow call takes:
    # at 0.5 s, a run beside two CPU burners counted a second stall (Iggy).
    consumer = Consumer(_config(stall_timeout=1.5), [Handler(Item, handle)], wrapped)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        stats = await asyncio.wait_for(consumer.drain(), 90)
    assert wrapped.hung.is_set()
    assert sorted(set(seen)) == list(range(120))
    assert stats.stalls == 1
    [stall] = [
        r for r in caplog.records if r.getMessage() == "partition stalled; restarting its worker"
    ]
    assert stall.levelno == logging.ERROR
    fields = stall.__dict__
    assert fields["topic"] == "t" and fields["partition"] in (0, 1)
    assert fields["lag"] > 0 and fields["stalled_for"] >= 1.5
    assert fields["operations"] == ["poll"]  # where the worker waited


async def test_a_stop_abandons_a_read_whose_reply_never_comes(log: Log) -> None:
    """A read has nothing to finish: a stop cancels one in flight at once.
    Here the lost read is at the partition's end (no lag, no stall); the
    stop waited for it the whole ``shutdown_timeout``."""
    producer = await setup_topic(log)
    await producer.publish_many([Item("k", n) for n in range(20)])
    handled: list[int] = []

    async def handle(run: Sequence[Item]) -> None:
        handled.extend(e.n for e in run)

    wrapped = LostReply(log, hang_at=20)
    consumer = Consumer(
        _config(shutdown_timeout=600.0),
        [Handler(Item, handle)],
        wrapped,  # type: ignore[arg-type]
    )
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    hung = asyncio.ensure_future(wrapped.hung.wait())
    await asyncio.wait([task, hung], return_when=asyncio.FIRST_COMPLETED)
    assert not task.done(), task
    consumer.stop()
    stats = await asyncio.wait_for(task, 60.0)  # well inside the 600 s shutdown_timeout
    assert handled == list(range(20))
    assert stats.stalls == 0


async def test_deliberate_waits_are_not_stalls(caplog: pytest.LogCaptureFixture) -> None:
    """A Transient retry in place that waits longer than ``stall_timeout``,
    and an idle partition, make progress: no restart."""
    log = wk.MemoryLog()
    producer = await setup_topic(log)
    await producer.publish_many([Item("k", n) for n in range(3)])
    failures = [wk.Transient("database down")] * 2
    handled: list[int] = []

    async def handle(run: Sequence[Item]) -> None:
        if failures:
            raise failures.pop()
        handled.extend(e.n for e in run)

    consumer = Consumer(
        _config(retry_delays=(0.8,), stall_timeout=0.3), [Handler(Item, handle)], log
    )
    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        task = asyncio.create_task(consumer.run(install_signal_handlers=False))
        while len(handled) < 3:
            assert not task.done()
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.8)  # the condition under test: idle for > stall_timeout
        consumer.stop()
        stats = await task
    assert handled == [0, 1, 2]
    assert stats.stalls == 0
    assert not [r for r in caplog.records if "stalled" in r.getMessage()]


def test_stall_timeout_is_checked() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), True, "5", None):
        with pytest.raises(wk.ConfigError, match="stall_timeout"):
            _config(stall_timeout=bad)
    with pytest.raises(wk.ConfigError, match="max_poll_records"):
        _config(max_poll_records=True)  # a bool is no count


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_stall_inside_a_handler_call_is_reported_once_and_never_run_twice(
    sync: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler call that outlives ``stall_timeout`` is logged at error and
    counted, but its worker is not restarted: a new one would run the same
    key beside the old call (a thread cannot be stopped)."""
    import threading

    log = wk.MemoryLog()
    producer = await setup_topic(log)
    await producer.publish_many([Item("k", n) for n in range(3)])
    calls: list[int] = []
    release = threading.Event()

    def blocking(run: Sequence[Item]) -> None:
        calls.extend(e.n for e in run)
        if run[0].n == 0:
            release.wait(60)

    async def waiting(run: Sequence[Item]) -> None:
        calls.extend(e.n for e in run)
        if run[0].n == 0:
            await asyncio.to_thread(release.wait, 60)

    consumer = Consumer(
        _config(stall_timeout=0.3), [Handler(Item, blocking if sync else waiting)], log
    )
    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        task = asyncio.create_task(consumer.drain())
        while consumer.stats.stalls == 0:
            assert not task.done()
            await asyncio.sleep(0.02)
        release.set()
        stats = await asyncio.wait_for(task, 30)
    assert calls == [0, 1, 2]  # the stuck chunk ran once, the key in order
    assert stats.stalls == 1
    [line] = [r for r in caplog.records if "stalled" in r.getMessage()]
    assert line.getMessage() == "partition stalled in a handler call; not restarted"
    assert line.levelno == logging.ERROR


async def test_a_partition_waiting_out_a_long_retry_delay_goes_on_when_the_log_answers_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After an outage a partition whose call failed often waits out a long
    retry delay (16 s with the defaults) with the server long back: the NATS
    log said "reconnected", then nothing. The first partition whose call
    succeeds again wakes the others' retries."""

    class Outage:
        def __init__(self, inner: Log) -> None:
            self.inner = inner
            self.down: set[int] = set()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def read(self, topic: str, partition: int, offset: int, limit: int = 500) -> Any:
            if topic == "t" and partition in self.down:
                raise wk.LogUnavailableError("no answer within 1 s")
            return await self.inner.read(topic, partition, offset, limit)

    log = wk.MemoryLog()
    await log.create_topic("t", 2)
    outage = Outage(log)
    handled: list[tuple[int, int]] = []

    async def handle(run: Sequence[Item]) -> None:
        handled.extend((wk.current_chunk().partition, e.n) for e in run)

    def failures(partition: int) -> int:
        return sum(
            1
            for r in caplog.records
            if r.getMessage() == "log call failed; retrying"
            and r.__dict__.get("partition") == partition
        )

    async def until(condition: Any, limit: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + limit
        while not condition():
            assert loop.time() < end, "condition not met"
            await asyncio.sleep(0.01)

    config = _config(retry_delays=(0.05, 0.1, 60.0), stall_timeout=300.0)
    consumer = Consumer(config, [Handler(Item, handle)], outage)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        task = asyncio.create_task(consumer.run(install_signal_handlers=False))
        await until(
            lambda: len(consumer.workers) == 2 and all(w.started for w in consumer.workers.values())
        )
        outage.down = {1}
        await until(lambda: failures(1) >= 3)  # partition 1 now waits 60 s
        outage.down = {0, 1}
        await until(lambda: failures(0) >= 1)  # partition 0 waits 0.05 s
        outage.down = set()  # the server is back
        back = asyncio.get_running_loop().time()
        producer = wk.Producer(log, "t")
        await producer.publish_many([Item(f"k{n}", n) for n in range(20)])
        await until(lambda: {n for _, n in handled} == set(range(20)), limit=20.0)
        took = asyncio.get_running_loop().time() - back
        consumer.stop()
        await task
    assert {p for p, _ in handled} == {0, 1}
    assert took < 20.0  # not the 60 s partition 1 was waiting out


class CancelSwallowingLeases:
    """``inner``, except that lease renewals wait for an answer that never
    comes and, when cancelled, return the lease as if nothing happened: what
    redis-py was seen to do with a cancel delivered during a command."""

    def __init__(self, inner: Log) -> None:
        self.inner = inner
        self.acquired = 0
        self.calls: dict[tuple[Any, ...], int] = {}
        self.renewing = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def acquire_partition(self, *args: Any, **kwargs: Any) -> Any:
        # Per lease: the partition's, and the member's place in the group
        # (engine/_balance.py), renewed by a task of its own.
        lease = args[:3]
        self.calls[lease] = self.calls.get(lease, 0) + 1
        self.acquired += 1
        if self.calls[lease] > 1:  # a renewal
            self.renewing.set()
            with contextlib.suppress(asyncio.CancelledError):  # swallowed
                await asyncio.Event().wait()
        return await self.inner.acquire_partition(*args, **kwargs)


async def test_a_lease_renewer_whose_cancel_the_log_swallowed_still_ends() -> None:
    # The worker ended (the drain is done), its renewer was cancelled inside a
    # renewal, the log swallowed the cancel and the renewer renewed on: the
    # supervisor waited for it forever and drain() never returned.
    log = wk.MemoryLog()
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    seen: list[int] = []

    leases = CancelSwallowingLeases(log)

    async def handle(run: Sequence[Item]) -> None:
        await leases.renewing.wait()  # the drain ends while a renewal hangs
        seen.extend(e.n for e in run)

    consumer = Consumer(_config(lease_ttl=0.6), [Handler(Item, handle)], leases)  # type: ignore[arg-type]
    await asyncio.wait_for(consumer.drain(), 10)
    assert seen == [1] and leases.acquired >= 2


class ScriptedLeases:
    """``inner``, except that ``acquire_partition`` follows ``script`` first:
    ``"down"`` raises LogUnavailableError, ``"lost"`` answers None (another
    member holds the partition), ``"ok"`` asks ``inner``."""

    def __init__(self, inner: Log, script: list[str]) -> None:
        self.inner = inner
        self.script = script

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def acquire_partition(self, *args: Any, **kwargs: Any) -> Any:
        if args[0].endswith(MEMBERS_SUFFIX):  # a place among the members: not scripted
            return await self.inner.acquire_partition(*args, **kwargs)
        step = self.script.pop(0) if self.script else "ok"
        if step == "down":
            raise wk.LogUnavailableError("memory log down (scripted)")
        if step == "lost":
            return None
        return await self.inner.acquire_partition(*args, **kwargs)


def _ownership_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    said = {
        "cannot take partition lease; retrying",
        "partition owned by another member; waiting for its lease",
        "partition lease taken",
        "partition lease lost; stopping its worker",
    }
    return [r.getMessage() for r in caplog.records if r.getMessage() in said]


async def test_an_unreachable_log_is_never_said_to_be_another_members_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Seen against an Iggy server that was down: every failed take was
    # followed by "owned by another member", and there was no other member.
    log = wk.MemoryLog()
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    leases = ScriptedLeases(log, ["down", "down"])
    consumer = Consumer(_config(lease_ttl=0.06), [Handler(Item, _noop)], leases)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="wakuwaku"):
        await asyncio.wait_for(consumer.drain(), 10)
    assert consumer.stats.handled == 1
    assert _ownership_lines(caplog) == [
        "cannot take partition lease; retrying",
        "cannot take partition lease; retrying",
        "partition lease taken",
    ]


async def test_a_partition_taken_back_after_it_was_lost_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Seen after an outage: "partition lost" was logged, the partition was
    # owned again and consumed, and nothing said so.
    log = wk.MemoryLog()
    await setup_topic(log)
    # The first take, a renewal that finds another member's lease, then
    # the next take of the supervisor (and every later renewal) succeed.
    leases = ScriptedLeases(log, ["ok", "lost"])
    consumer = Consumer(_config(lease_ttl=0.06), [Handler(Item, _noop)], leases)  # type: ignore[arg-type]
    retaken = asyncio.Event()

    class Retaken(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "partition lease taken":
                retaken.set()

    watcher = Retaken()
    logging.getLogger("wakuwaku").addHandler(watcher)
    with caplog.at_level(logging.INFO, logger="wakuwaku"):
        task = asyncio.create_task(consumer.run())
        try:
            await asyncio.wait_for(retaken.wait(), 10)
        finally:
            logging.getLogger("wakuwaku").removeHandler(watcher)
            consumer.stop()
            await asyncio.wait_for(task, 10)
    assert _ownership_lines(caplog)[:2] == [
        "partition lease lost; stopping its worker",
        "partition lease taken",
    ]


async def _noop(run: Sequence[Item]) -> None:
    return None


class CancelSwallowingControl:
    """``inner``, except that reads of the control topic after the first wait
    for an answer that never comes and, when cancelled, answer nothing as if
    nothing happened (as ``CancelSwallowingLeases``)."""

    def __init__(self, inner: Log) -> None:
        self.inner = inner
        self.control_reads = 0
        self.hanging = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic.startswith("wk-control."):
            self.control_reads += 1
            if self.control_reads > 1:
                self.hanging.set()
                with contextlib.suppress(asyncio.CancelledError):  # swallowed
                    await asyncio.Event().wait()
                return []
        return await self.inner.read(topic, *args, **kwargs)


async def test_a_cancelled_consumer_ends_though_its_control_reads_cancel_was_swallowed() -> None:
    """Cancelling ``run()`` (a TaskGroup's shutdown) hung on Redis and NATS:
    the control topic's reader was cancelled inside a read, the client
    swallowed the cancel, and the reader read on, forever."""
    log = wk.MemoryLog()
    await setup_topic(log)
    control = CancelSwallowingControl(log)
    consumer = Consumer(_config(), [Handler(Item, _noop)], control)  # type: ignore[arg-type]
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    await asyncio.wait_for(control.hanging.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
