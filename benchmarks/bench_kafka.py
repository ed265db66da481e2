"""End-to-end consumer throughput on the Kafka log, next to the client's own loop and FastStream.

A no-op handler over 200 000 events on 1 000 keys and 4
partitions, ``max_poll_records`` at 500 and at its default (2 000), next to
(a) confluent-kafka alone reading the same topic (``consume(page)`` through
``asyncio.to_thread``, headers and body decoded with msgspec; target: the
consumer at >= 70 % of it at 2 000) and (b) FastStream's Kafka batch
subscriber (aiokafka, one subscriber, ``max_records`` = the page size, a
no-op handler typed with a pydantic model) over the same topic, timed from
``broker.start()`` until every event was handled (target: the consumer
at least 2 x as fast at 2 000). FastStream is optional (``pip install 'wakuwaku[bench]'``).

Then the retry path: the same events with 1 % of the keys failing once with
Retryable (each goes to the retry topic, then succeeds), with transactions
on (KIP-447, the default) and off, to give the transactions' cost.

Runs on a fresh topic prefix on the broker at ``--bootstrap`` and deletes
its topics and groups afterwards.

    python benchmarks/bench_kafka.py [--bootstrap 127.0.0.1:9092] [--events N]
        [--keys K] [--partitions P] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

try:
    import pydantic
    from faststream.kafka import KafkaBroker
except ImportError:  # the optional peer baseline
    HAVE_FASTSTREAM = False
else:
    HAVE_FASTSTREAM = True

from _args import add_workload
from _ticks import TOPIC, Tick, consume, fill, verdict
from wakuwaku import Retryable
from wakuwaku.engine import Consumer as WkConsumer
from wakuwaku.engine import ConsumerConfig, Handler
from wakuwaku.logs.kafka import KafkaLog

NO_LOGGER: Any = None
"""FastStream's ``logger``: None turns its logging off (its type says a logger)."""


async def raw_read(bootstrap: str, log: KafkaLog, partitions: int, events: int, page: int) -> float:
    """confluent-kafka alone: pages of every partition, headers and bodies decoded."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"raw-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(log._name(TOPIC), p, 0) for p in range(partitions)])
    decoder = msgspec.json.Decoder(Tick)
    count = 0
    started = time.perf_counter()
    while count < events:
        for msg in await asyncio.to_thread(consumer.consume, page, 1.0):
            if msg.error() is None:
                dict(msg.headers() or ())
                decoder.decode(msg.value() or b"")
                count += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


class TickModel(pydantic.BaseModel if HAVE_FASTSTREAM else object):  # type: ignore[misc]
    key: str
    n: int
    payload: str


async def faststream_read(bootstrap: str, log: KafkaLog, events: int, page: int) -> float:
    """FastStream's Kafka batch subscriber until every event was handled."""
    broker = KafkaBroker(bootstrap, logger=NO_LOGGER)
    done = asyncio.Event()
    seen = 0

    @broker.subscriber(  # type: ignore[untyped-decorator,unused-ignore]
        log._name(TOPIC),
        group_id=f"fs-{uuid.uuid4().hex}",
        batch=True,
        max_records=page,
        auto_offset_reset="earliest",
    )
    async def handle(batch: list[TickModel]) -> None:
        nonlocal seen
        seen += len(batch)
        if seen >= events:
            done.set()

    started = time.perf_counter()
    await broker.start()
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - started
    await broker.stop()
    return elapsed


async def retry_run(log: KafkaLog, group: str, events: int) -> float:
    """Drain with 1 % of the keys failing once (Retryable); seconds."""
    failing = {f"key-{k}" for k in range(0, 1000, 100)}
    failed: set[str] = set()

    async def handle(run: Sequence[Tick]) -> None:
        for tick in run:
            if tick.key in failing and tick.key not in failed:
                failed.add(tick.key)
                raise Retryable("once")

    config = ConsumerConfig(
        topic=TOPIC,
        group=group,
        poll_interval=0.01,
        max_poll_records=2000,
        retry_delays=(0.05,),
    )
    consumer = WkConsumer(config, [Handler(Tick, handle, max_batch=100)], log)
    started = time.perf_counter()
    stats = await consumer.drain()
    assert stats.handled >= events, stats.handled
    return time.perf_counter() - started


def drop(bootstrap: str, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    if topics:
        for future in admin.delete_topics(topics).values():
            with contextlib.suppress(Exception):
                future.result(30)
    groups = [g.group_id for g in admin.list_consumer_groups().result(10).valid]
    mine = [g for g in groups if g.startswith(prefix)]
    if mine:
        for future in admin.delete_consumer_groups(mine).values():
            with contextlib.suppress(Exception):
                future.result(10)


async def main(bootstrap: str, events: int, keys: int, partitions: int, rounds: int) -> None:
    logging.basicConfig(level=logging.ERROR)
    prefix = f"wkbench{uuid.uuid4().hex[:8]}."
    log = KafkaLog(bootstrap, prefix=prefix)
    try:
        started = time.perf_counter()
        await fill(log, events, keys, partitions)
        print(f"filled {events} events in {time.perf_counter() - started:.1f} s")
        if not HAVE_FASTSTREAM:
            print("FastStream is not installed (pip install 'wakuwaku[bench]'): skipped")
        for poll in (500, 2000):
            shares, versus = [], []
            for n in range(rounds):
                raw = await raw_read(bootstrap, log, partitions, events, poll)
                elapsed, handled = await consume(log, f"g-{poll}-{n}", poll)
                assert handled == events, handled
                shares.append(raw / elapsed)
                line = (
                    f"max_poll_records {poll}, round {n + 1}: consumer "
                    f"{events / elapsed:,.0f} events/s, confluent-kafka consume+decode "
                    f"{events / raw:,.0f} events/s, share {raw / elapsed:.0%}"
                )
                if HAVE_FASTSTREAM:
                    fs = await faststream_read(bootstrap, log, events, poll)
                    versus.append(fs / elapsed)
                    line += (
                        f", FastStream {events / fs:,.0f} events/s, "
                        f"consumer/FastStream {fs / elapsed:.2f}x"
                    )
                print(line, flush=True)
            share = statistics.median(shares)
            print(
                f"max_poll_records {poll}: median share {share:.0%}"
                + (f" (target >= 70 %): {verdict(share, 0.7)}" if poll == 2000 else "")
            )
            if versus:
                ratio = statistics.median(versus)
                print(
                    f"max_poll_records {poll}: median consumer/FastStream {ratio:.2f}x"
                    + (f" (target >= 2x): {verdict(ratio, 2.0)}" if poll == 2000 else "")
                )
        for transactions in (True, False):
            other = KafkaLog(bootstrap, prefix=prefix, transactions=transactions)
            try:
                seconds = await retry_run(other, f"retry-{transactions}", events)
            finally:
                await other.close()
            name = "transactions on " if transactions else "transactions off"
            print(
                f"1 % of keys Retryable once, {name}: {events / seconds:,.0f} events/s "
                f"({seconds:.2f} s)",
                flush=True,
            )
    finally:
        await log.close()
        await asyncio.to_thread(drop, bootstrap, prefix)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    add_workload(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.bootstrap, args.events, args.keys, args.partitions, args.rounds))
