"""What the throughput benchmarks share: the event, the data and the timed consumer.

``bench_consumer.py`` (SQLite), ``bench_redis.py`` and ``bench_nats.py`` fill
a ``ticks`` topic with the same events (a fixed random key per event, 40-byte
payloads) and time the same no-op consumer over it, each next to its own
log's bare read as the same-run baseline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence

import msgspec

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs import Log

TOPIC = "ticks"


@wk.event("bench.tick", key="key")
class Tick(msgspec.Struct, frozen=True):
    key: str
    n: int
    payload: str


def ticks(events: int, keys: int) -> Iterator[Tick]:
    """The ``events`` ticks :func:`fill` publishes, in order: tick ``n`` has
    ``n`` and a key drawn from ``keys`` keys by a fixed seed, so every run
    (and a reader that needs each tick's key) gets the same ones."""
    rng = random.Random(7)
    for n in range(events):
        yield Tick(f"key-{rng.randrange(keys)}", n, "x" * 40)


async def fill(log: Log, events: int, keys: int, partitions: int, batch_size: int = 2000) -> None:
    """Create ``ticks`` with ``partitions`` and publish ``events`` over ``keys`` keys."""
    await log.create_topic(TOPIC, partitions)
    producer = wk.Producer(log, TOPIC)
    batch: list[Tick] = []
    for tick in ticks(events, keys):
        batch.append(tick)
        if len(batch) == batch_size:
            await producer.publish_many(batch)
            batch = []
    if batch:
        await producer.publish_many(batch)


async def consume(log: Log, group: str, max_poll: int) -> tuple[float, int]:
    """Drain ``ticks`` with a no-op handler (``max_batch=100``) as ``group``:
    (seconds, records handled)."""

    async def handle(run: Sequence[Tick]) -> None:
        return None

    config = ConsumerConfig(topic=TOPIC, group=group, poll_interval=0.01, max_poll_records=max_poll)
    consumer = Consumer(config, [Handler(Tick, handle, max_batch=100)], log)
    started = time.perf_counter()
    stats = await consumer.drain()
    return time.perf_counter() - started, stats.handled


def verdict(median: float, target: float) -> str:
    """The verdict on a median against its target, as the benchmarks print it."""
    return "met" if median >= target else "MISSED"
