"""The Kafka log when its broker goes away: a broker this test starts on its own ports.

The shared broker (127.0.0.1:9092) is never touched: the test formats and
starts its own single-node KRaft broker (:class:`tests.faults.servers.KafkaBroker`)
from the same jars
(``$WAKUWAKU_SERVICES_DIR/kafka/lib``, default ``.services/kafka/lib``, as
``ci/services.sh`` installs them) with ``ci/kafka/server.properties`` on two
free loopback ports and a data folder of its own, stops it in the middle of
a consumer's run and starts it again on the same data.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs.kafka import KafkaLog

from ..faults.servers import KafkaBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    own = KafkaBroker(tmp_path)
    own.start()
    try:
        yield own
    finally:
        own.stop()
        own.close()


@pytest.fixture
async def log(broker: KafkaBroker) -> AsyncIterator[KafkaLog]:
    created = KafkaLog(broker.url, timeout=3.0)
    try:
        yield created
    finally:
        await created.close()


@wk.event("faults.step", key="key")
class Step(msgspec.Struct, frozen=True):
    key: str
    n: int


async def test_a_broker_restart_pauses_the_consumer_and_loses_nothing(
    broker: KafkaBroker, log: KafkaLog, caplog: pytest.LogCaptureFixture
) -> None:
    events = 600
    await log.create_topic("steps", 2)
    await wk.Producer(log, "steps").publish_many(
        [Step(f"k{i % 12}", i // 12) for i in range(events)]
    )
    seen: list[tuple[str, int]] = []
    restarted = asyncio.Event()
    quarter, complete = asyncio.Event(), asyncio.Event()

    async def handle(run: Sequence[Step]) -> None:
        seen.extend((s.key, s.n) for s in run)
        if len(seen) >= events // 4:
            quarter.set()
        if len(set(seen)) >= events:
            complete.set()
        await asyncio.sleep(0.02)

    config = ConsumerConfig(
        topic="steps",
        group="g",
        poll_interval=0.01,
        max_poll_records=20,
        retry_delays=(0.2, 0.5, 1.0),
        lease_ttl=30.0,
    )
    consumer = Consumer(config, [Handler(Step, handle, max_batch=5)], log)

    async def restart() -> None:
        await quarter.wait()
        await asyncio.to_thread(broker.stop)
        await asyncio.sleep(2.0)
        await asyncio.to_thread(broker.start)
        restarted.set()

    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        fault = asyncio.create_task(restart())
        runner = asyncio.create_task(consumer.run(install_signal_handlers=False))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(complete.wait(), 240)
        consumer.stop()
        stats = await runner
        await fault
    assert restarted.is_set()
    assert set(seen) == {(f"k{k}", n) for k in range(12) for n in range(events // 12)}
    for key in {k for k, _ in seen}:
        ns = [n for k, n in seen if k == key]
        assert all(b <= a + 1 for a, b in itertools.pairwise(ns)), key
    assert stats.log_call_retries > 0
    assert any(r.getMessage() == "log call failed; retrying" for r in caplog.records)
