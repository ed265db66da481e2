"""A Redis server that dies mid-consumption: the consumer pauses, resumes, loses nothing.

The test starts its own ``redis-server`` on a free loopback port (append-only
file, fsync on every write, in ``tmp_path``: :class:`tests.faults.servers.RedisServer`),
never the shared one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs import OutgoingRecord
from wakuwaku.logs.redis import RedisLog

from ..engine.conftest import Item
from ..faults.servers import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.close()


async def until_up(log: RedisLog) -> None:
    for _ in range(500):
        try:
            await log.list_topics()
            return
        except wk.LogUnavailableError:
            await asyncio.sleep(0.01)
    raise AssertionError("the private redis-server did not start")


async def test_a_killed_and_restarted_server_pauses_the_consumer_and_loses_nothing(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    log = RedisLog(f"redis://127.0.0.1:{server.port}/0?timeout=1")
    await until_up(log)
    await log.create_topic("orders", 2)
    keys = [f"k{i}" for i in range(20)]
    await wk.Producer(log, "orders").publish_many(Item(keys[n % len(keys)], n) for n in range(2000))
    handled: list[Item] = []
    killed, done = asyncio.Event(), asyncio.Event()

    async def handle(run: Sequence[Item]) -> None:
        handled.extend(run)
        if len({item.n for item in handled}) == 2000:
            done.set()
        await asyncio.sleep(0.001)
        if len(handled) >= 400 and not killed.is_set():
            killed.set()
            server.kill()

    config = ConsumerConfig(
        topic="orders",
        group="g",
        retry_delays=(0.05, 0.1, 0.2),
        max_poll_records=50,
        poll_interval=0.02,
        lease_ttl=30.0,
    )
    consumer = Consumer(config, [Handler(Item, handle)], log)
    caplog.set_level(logging.WARNING, logger="wakuwaku")
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    await asyncio.wait_for(killed.wait(), 60)
    await asyncio.sleep(0.5)  # the consumer meets the dead server
    paused = len(handled)
    server.start()
    await until_up(log)

    await asyncio.wait_for(done.wait(), 60)
    consumer.stop()
    await asyncio.wait_for(task, 30)
    await log.close()
    assert paused < 2000
    for key in keys:  # at least once, in per-key order (a repeat restarts from a commit)
        ns = [item.n for item in handled if item.key == key]
        firsts = sorted(set(ns), key=ns.index)
        assert firsts == sorted(firsts), f"key {key} out of order"
    pauses = [r for r in caplog.records if r.getMessage() == "log call failed; retrying"]
    assert pauses and all(getattr(r, "error_class", None) == "transient" for r in pauses)
    assert len(pauses) < 200, "the consumer spun on the dead server"
    assert any("unavailable" in str(getattr(r, "error", "")) for r in pauses)


async def test_an_append_whose_reply_was_lost_is_not_stored_twice_by_its_retry(
    server: RedisServer,
) -> None:
    """A 3-record append to a server frozen mid-call (SIGSTOP) times out. Whether
    the thawed server (SIGCONT) ran the script it had received (redis-py drops
    a connection that timed out, and Redis then drops what it had not read: so
    far it never ran) or not, the append sent again with the same token leaves
    each record stored once: the script writes all or nothing, and a token it
    has seen returns the first run's offsets."""
    log = RedisLog(f"redis://127.0.0.1:{server.port}/0?timeout=1")
    try:
        await until_up(log)
        await log.create_topic("orders", 1)
        records: list[OutgoingRecord] = [({}, b"a"), ({}, b"b"), ({}, b"c")]
        server.freeze()
        try:
            with pytest.raises(wk.LogUnavailableError):
                await log.append("orders", 0, records, token="lost-reply")
        finally:
            server.thaw()
        assert (await log.end_offsets("orders"))[0] in (0, 3)  # all or nothing
        assert await log.append("orders", 0, records, token="lost-reply") == [0, 1, 2]
        stored = await log.read("orders", 0, 0)
        assert [r.body for r in stored] == [b"a", b"b", b"c"]
    finally:
        await log.close()
