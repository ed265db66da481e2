"""The NATS log when its server fails: a private nats-server the test starts on
another loopback port (never the shared one on 4222,
:class:`tests.faults.servers.NatsServer`) is SIGKILLed while a consumer runs,
then started again on the same store directory."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku import LogUnavailableError
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs.nats import NatsLog

from ..faults.servers import NatsServer

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
