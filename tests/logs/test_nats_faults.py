"""The NATS log when its server fails: a private nats-server the test starts on
another loopback port (never the shared one on 4222) is SIGKILLed while a
consumer runs, then started again on the same store directory."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku import LogUnavailableError
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs import OutgoingRecord
from wakuwaku.logs.nats import NatsLog

from ..faults.servers import NatsServer
from .contract import read_all

pytestmark = [pytest.mark.nats, pytest.mark.slow]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    started = NatsServer(tmp_path)
    started.start()
    try:
        yield started
    finally:
        started.close()


@wk.event("tests.nats.fault", key="key")
class Tick(msgspec.Struct, frozen=True):
    key: str
    n: int


async def test_calls_on_a_lost_server_are_log_unavailable_and_bounded(server: NatsServer) -> None:
    log = NatsLog(server.url, timeout=1.0)
    try:
        await log.create_topic("orders", 1)
        assert await log.append("orders", 0, [({}, b"a")]) == [0]
        server.kill()
        started = time.monotonic()
        for call in (
            log.append("orders", 0, [({}, b"b")]),
            log.read("orders", 0, 0),
            log.end_offsets("orders"),
            log.commit("g", "orders", 0, 1),
        ):
            with pytest.raises(LogUnavailableError):
                await call
        assert time.monotonic() - started < 4 * 1.0 + 2.0
        server.start()
        deadline = time.monotonic() + 20.0
        while True:  # the client reconnects in the background
            try:
                records = await log.read("orders", 0, 0)
                break
            except LogUnavailableError:
                assert time.monotonic() < deadline, "the log never came back"
                await asyncio.sleep(0.1)
        assert [r.body for r in records] == [b"a"]
    finally:
        await log.close()


async def test_a_server_killed_mid_consumption_loses_nothing_and_keeps_key_order(
    server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    keys, per_key = 8, 60
    log = NatsLog(server.url, timeout=1.0)
    await log.create_topic("ticks", 2)
    await wk.Producer(log, "ticks").publish_many(
        Tick(f"k{k}", n) for n in range(per_key) for k in range(keys)
    )
    handled: list[Tick] = []
    killed = asyncio.Event()

    async def handle(chunk: Sequence[Tick]) -> None:
        handled.extend(chunk)
        await asyncio.sleep(0.002)
        if len(handled) >= 100 and not killed.is_set():
            killed.set()

    config = ConsumerConfig(
        topic="ticks",
        group="g",
        max_poll_records=20,
        retry_delays=(0.1, 0.2, 0.4),
        poll_interval=0.02,
    )
    consumer = Consumer(config, [Handler(Tick, handle)], log)
    expected = {(f"k{k}", n) for k in range(keys) for n in range(per_key)}
    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        task = asyncio.create_task(consumer.run(install_signal_handlers=False))
        try:
            await asyncio.wait_for(killed.wait(), 30)
            server.kill()
            await asyncio.sleep(1.0)  # the outage, in real time
            server.start()
            deadline = time.monotonic() + 60
            while {(t.key, t.n) for t in handled} != expected:
                assert time.monotonic() < deadline, "not every event was handled"
                assert not task.done(), task
                await asyncio.sleep(0.05)
        finally:
            consumer.stop()
            await task
            await log.close()
    for k in range(keys):
        seen = [t.n for t in handled if t.key == f"k{k}"]
        first_seen = list(dict.fromkeys(seen))
        assert first_seen == list(range(per_key)), f"k{k} out of order: {seen}"
    pauses = [r for r in caplog.records if r.getMessage() == "log call failed; retrying"]
    assert pauses, "no Transient pause was logged"
    assert all(getattr(r, "error_class", None) == "transient" for r in pauses)


async def _until_answers(log: NatsLog, topic: str, limit: float = 30.0) -> None:
    """Wait until the server answers a request again (the client reconnects by itself)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            await log.end_offsets(topic)
            return
        except LogUnavailableError:
            assert time.monotonic() < deadline, "the log never came back"
            await asyncio.sleep(0.1)


async def test_a_read_after_a_server_restart_goes_on_at_once(server: NatsServer) -> None:
    """The pull consumer a read keeps lives in the server's memory, so a restart
    loses it; the first read after the reconnection must not wait for an answer
    that never comes (a whole ``timeout``, then a failure, then the consumer's
    backoff: the partition stood still with lag while the server answered)."""
    log = NatsLog(server.url, timeout=5.0)
    try:
        await log.create_topic("orders", 1)
        await log.append("orders", 0, [({}, b"%d" % i) for i in range(10)])
        assert [r.offset for r in await log.read("orders", 0, 0, 5)] == [0, 1, 2, 3, 4]
        server.kill()
        with pytest.raises(LogUnavailableError):
            await log.end_offsets("orders")
        server.start()
        await _until_answers(log, "orders")
        started = time.monotonic()
        records = await log.read("orders", 0, 5, 5)
        took = time.monotonic() - started
        assert [r.body for r in records] == [b"5", b"6", b"7", b"8", b"9"]
        assert took < 2.5, f"the read after the restart took {took:.1f} s"
    finally:
        await log.close()


async def test_a_restarted_server_is_read_again_by_every_partition_at_once(
    server: NatsServer,
) -> None:
    """A running consumer on 3 partitions, its server SIGKILLed three times and
    started again on the same store: within 20 s of each restart every partition
    handles 100 more events (or all it has), and in the end every event is handled.
    The fault cost a partition ``timeout`` (30 s) and the retry delay more; the
    margin below that is for a loaded machine (a partition stood still 8 s at a
    load of 11 on 2 cores, its neighbours busy).

    The retry delay (4 s) outlasts the outage (2 s), so a partition whose commit
    failed does not read during the outage: its next read, after the restart,
    is the one that finds its pull consumer gone with the server's memory. It
    used to wait ``timeout`` for an answer, fail, and wait the retry delay again.
    """
    partitions, keys, per_key = 3, 40, 100
    timeout = 30.0  # a read that waits for a lost consumer stands still this long
    log = NatsLog(server.url, timeout=timeout)
    await log.create_topic("ticks", partitions)
    await wk.Producer(log, "ticks").publish_many(
        Tick(f"k{k}", n) for n in range(per_key) for k in range(keys)
    )
    part_of = {f"k{k}": wk.partition_for(f"k{k}", partitions) for k in range(keys)}
    total = {p: per_key * sum(1 for v in part_of.values() if v == p) for p in range(partitions)}
    handled: set[tuple[str, int]] = set()
    count = dict.fromkeys(range(partitions), 0)

    async def handle(chunk: Sequence[Tick]) -> None:
        for t in chunk:
            if (t.key, t.n) not in handled:
                handled.add((t.key, t.n))
                count[part_of[t.key]] += 1
        await asyncio.sleep(0.005)

    config = ConsumerConfig(topic="ticks", group="g", max_poll_records=50, retry_delays=(4.0,))
    consumer = Consumer(config, [Handler(Tick, handle)], log)
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    try:
        for share in (0.2, 0.45, 0.7):
            deadline = time.monotonic() + 60
            while min(count[p] / total[p] for p in range(partitions)) < share:
                assert time.monotonic() < deadline, f"never got to {share:.0%}: {count}"
                assert not task.done(), task
                await asyncio.sleep(0.01)
            server.kill()
            await asyncio.sleep(2.0)  # the outage, in real time (shorter than the lease)
            server.start()
            await _until_answers(log, "ticks")
            back = time.monotonic()
            wanted = {p: min(total[p], count[p] + 100) for p in range(partitions)}
            while any(count[p] < wanted[p] for p in range(partitions)):
                stalled = [p for p in range(partitions) if count[p] < wanted[p]]
                waited = time.monotonic() - back
                assert waited < 20.0, f"partitions {stalled} stood still {waited:.1f} s: {count}"
                assert not task.done(), task
                await asyncio.sleep(0.02)
        deadline = time.monotonic() + 60
        while len(handled) < keys * per_key:
            assert time.monotonic() < deadline, f"not every event was handled: {count}"
            assert not task.done(), task
            await asyncio.sleep(0.05)
    finally:
        consumer.stop()
        await task
        await log.close()


@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
async def test_an_append_whose_reply_was_lost_is_completed_by_its_retry(
    server: NatsServer, fenced: bool
) -> None:
    """A 3-record append to a server frozen mid-call (SIGSTOP) gets no answer and
    raises; the server, thawed (SIGCONT), stores what reached it: a prefix of
    the records (the first one, or more when the signal landed late), which
    readers see. Sent again with the same token, the append stores the rest
    and nothing twice, and returns the offsets where the three are."""
    log = NatsLog(server.url, timeout=1.0)
    try:
        await log.create_topic("orders", 1)
        lease = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0) if fenced else None
        assert await log.append("orders", 0, [({}, b"before")], fence=lease) == [0]
        records: list[OutgoingRecord] = [({}, b"a"), ({}, b"b"), ({}, b"c")]
        token = uuid.uuid4().hex
        server.freeze()
        try:
            with pytest.raises(LogUnavailableError):  # no answer from the frozen server
                await log.append("orders", 0, records, fence=lease, token=token)
        finally:
            server.thaw()
        deadline = time.monotonic() + 20.0
        while (await log.end_offsets("orders"))[0] < 2:  # the frozen publish lands
            assert time.monotonic() < deadline, "the first record never landed"
            await asyncio.sleep(0.05)
        half = [r.body for r in await read_all(log, "orders", 0)]
        assert half == [b"before", b"a", b"b", b"c"][: len(half)]  # a prefix: readers see it
        assert await log.append("orders", 0, records, fence=lease, token=token) == [1, 2, 3]
        bodies = [r.body for r in await read_all(log, "orders", 0)]
        assert bodies == [b"before", b"a", b"b", b"c"]
    finally:
        await log.close()
