"""Which Python Kafka client the Kafka log uses: batch consume + decode, measured.

The same topic (``--events`` records over 1 000 keys,
4 partitions, 40-byte payloads with the wakuwaku headers) read from offset 0
to the end in pages of ``--page`` records by

- confluent-kafka (librdkafka): ``Consumer.consume(page)`` called from the
  event loop through ``asyncio.to_thread`` (as the log calls it), each
  message turned into headers dict + decoded body;
- confluent-kafka the same, called directly (no thread hop: its ceiling);
- aiokafka: ``getmany(max_records=page)``, the same decoding.

Each figure is the median of ``--rounds`` runs, in records per second. The
topic is made under a fresh name and deleted afterwards.

    python benchmarks/bench_kafka_clients.py [--bootstrap 127.0.0.1:9092]
        [--events N] [--page P] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

try:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AIOTopicPartition
except ImportError:  # optional: the comparison column is skipped without it
    AIOKafkaConsumer = None

from _args import positive_int
from _ticks import Tick

PARTITIONS = 4


def fill(bootstrap: str, topic: str, events: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2_random"}
    )
    rng = random.Random(7)
    encode = msgspec.json.Encoder().encode
    for n in range(events):
        key = f"key-{rng.randrange(1000)}"
        headers: list[tuple[str, str | bytes | None]] = [
            ("wk-v", b"1"),
            ("wk-type", b"bench.tick"),
            ("wk-alg", b"plain"),
        ]
        while True:
            try:
                producer.produce(
                    topic, encode(Tick(key, n, "x" * 40)), key.encode(), headers=headers
                )
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)


def _decode(msgs: list[Any], decoder: msgspec.json.Decoder[Tick]) -> int:
    for msg in msgs:
        dict(msg.headers() or ())
        decoder.decode(msg.value())
    return len(msgs)


def _confluent(bootstrap: str, topic: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    return consumer


async def confluent_read(bootstrap: str, topic: str, events: int, page: int, hop: bool) -> float:
    consumer = _confluent(bootstrap, topic)
    decoder = msgspec.json.Decoder(Tick)
    count = 0
    started = time.perf_counter()
    while count < events:
        if hop:
            msgs = await asyncio.to_thread(consumer.consume, page, 1.0)
        else:
            msgs = consumer.consume(page, 1.0)
        count += _decode([m for m in msgs if m.error() is None], decoder)
    elapsed = time.perf_counter() - started
    consumer.close()
    return events / elapsed


async def aiokafka_read(bootstrap: str, topic: str, events: int, page: int) -> float:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    parts = [AIOTopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(parts)
    await consumer.seek_to_beginning(*parts)
    decoder = msgspec.json.Decoder(Tick)
    count = 0
    started = time.perf_counter()
    while count < events:
        batches = await consumer.getmany(timeout_ms=1000, max_records=page)
        for msgs in batches.values():
            for msg in msgs:
                dict(msg.headers)
                decoder.decode(msg.value)
            count += len(msgs)
    elapsed = time.perf_counter() - started
    await consumer.stop()
    return events / elapsed


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--events", type=positive_int, default=200_000)
    parser.add_argument("--page", type=positive_int, default=2000)
    parser.add_argument("--rounds", type=positive_int, default=3)
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    topic = f"bench-clients-{uuid.uuid4().hex[:8]}"
    fill(args.bootstrap, topic, args.events)
    try:
        runs: dict[str, list[float]] = {"confluent (to_thread)": [], "confluent (direct)": []}
        if AIOKafkaConsumer is not None:
            runs["aiokafka"] = []
        for _ in range(args.rounds):
            runs["confluent (to_thread)"].append(
                await confluent_read(args.bootstrap, topic, args.events, args.page, True)
            )
            runs["confluent (direct)"].append(
                await confluent_read(args.bootstrap, topic, args.events, args.page, False)
            )
            if AIOKafkaConsumer is not None:
                runs["aiokafka"].append(
                    await aiokafka_read(args.bootstrap, topic, args.events, args.page)
                )
        print(f"batch consume + decode, {args.events} records, 4 partitions, page {args.page}")
        for name, rates in runs.items():
            print(f"  {name:24} {statistics.median(rates):>10,.0f} records/s")
        if AIOKafkaConsumer is None:
            print("  aiokafka: not installed (pip install aiokafka) - skipped")
    finally:
        admin = AdminClient({"bootstrap.servers": args.bootstrap})
        admin.delete_topics([topic])[topic].result(30)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
