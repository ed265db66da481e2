"""How many records a poll asks for: ``max_poll_records``, fewer for large records.

A batch is one poll of a partition, held in memory while it runs (and the
next one, read ahead). A larger batch costs the engine less per record, so
the default is 2 000 records; ``max_poll_bytes`` (1 MiB) keeps a partition
of large records from holding thousands of them at once: after each page,
the next poll asks for as many records as fit at that page's mean size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.engine._partition import (
    FIRST_POLL_RECORDS,
    RECORD_OVERHEAD,
    poll_size,
    within_bytes,
)
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import consumer, setup_topic, wait_until

BIG = 150_000
"""Bytes of a large event's data: 1 MiB holds 6 of them."""


@wk.event("test.blob", key="key")
class Blob(msgspec.Struct, frozen=True):
    key: str
    n: int
    data: str


class CountedReads:
    """``inner``, recording what each read of the main topic ``t`` asked for
    and the page it got."""

    def __init__(self, inner: Log) -> None:
        self.inner = inner
        self.reads: list[tuple[int, list[wk.Record]]] = []  # (asked, page)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read(
        self, topic: str, partition: int, offset: int, max_records: int = 500, wait: float = 0.0
    ) -> Any:
        page = await self.inner.read(topic, partition, offset, max_records, wait)
        if topic == "t":
            self.reads.append((max_records, list(page)))
        return page


def _record(size: int) -> wk.Record:
    return wk.Record(0, {}, b"x" * size, 0.0)


def test_a_poll_asks_for_what_fits_its_bytes_and_at_most_twice_the_last_page() -> None:
    small = [_record(36)] * 1000  # 100 bytes each with the overhead
    assert poll_size(small, 2000, 1 << 20) == 2000  # records bound it
    assert poll_size(small, 2000, 10_000) == 100  # bytes bound it
    assert poll_size(small[:300], 2000, 1 << 20) == 600  # twice the last page
    assert poll_size(small[:3], 2000, 1 << 20) == FIRST_POLL_RECORDS  # from 100
    assert poll_size(small[:3], 50, 1 << 20) == 50
    big = [_record(BIG - RECORD_OVERHEAD)] * 3
    assert poll_size(big, 2000, 1 << 20) == (1 << 20) // BIG == 6
    assert poll_size([_record(5 << 20)], 2000, 1 << 20) == 1  # never fewer than one
    mixed = [_record(100 - RECORD_OVERHEAD), _record(BIG - RECORD_OVERHEAD)]
    assert poll_size(mixed, 2000, 1 << 20) == 2 * (1 << 20) // (100 + BIG)
    # Headers count (sized on the first and last record) as bodies do.
    headed = [wk.Record(0, {"h": b"x" * (BIG - RECORD_OVERHEAD - 1)}, b"", 0.0)] * 3
    assert poll_size(headed, 2000, 1 << 20) == (1 << 20) // BIG
    # A caught-up partition (an empty page) starts over.
    assert poll_size([], 2000, 1 << 20) == FIRST_POLL_RECORDS
    assert poll_size([], 10, 1 << 20) == 10


def test_a_batch_is_cut_to_what_fits_its_bytes() -> None:
    """What a poll hands on: the records that fit ``max_poll_bytes``, at least one."""
    small = [_record(100 - RECORD_OVERHEAD)] * 50
    assert within_bytes(small, 1 << 20) is small  # fits: the page itself
    assert within_bytes(small, 1000) == small[:10]
    assert within_bytes(small, 999) == small[:9]
    big = [_record(BIG - RECORD_OVERHEAD)] * 10
    assert within_bytes(big, 1 << 20) == big[:6]
    assert within_bytes(big, 100) == big[:1]  # never fewer than one
    assert within_bytes(big[:1], 100) == big[:1]
    assert within_bytes([], 100) == []
    # Small records, then large ones: cut where the large ones go past.
    mixed = small[:20] + big
    assert within_bytes(mixed, 3 * BIG) == mixed[: 20 + 2]


def test_the_defaults_and_the_bound_checks() -> None:
    config = ConsumerConfig(topic="t", group="g")
    assert (config.max_poll_records, config.max_poll_bytes) == (2000, 1 << 20)
    bads: list[Any] = [0, -1, True, 1.5, "1"]
    for bad in bads:
        with pytest.raises(wk.ConfigError, match="max_poll_bytes"):
            ConsumerConfig(topic="t", group="g", max_poll_bytes=bad)
    # One poll is one read, and no log reads more than a million records at once.
    assert ConsumerConfig(topic="t", group="g", max_poll_records=1_000_000)
    with pytest.raises(wk.ConfigError, match="max_poll_records must be at most 1000000"):
        ConsumerConfig(topic="t", group="g", max_poll_records=1_000_001)


async def test_each_poll_asks_for_what_the_last_page_allows_and_every_event_is_handled(
    log: Log,
) -> None:
    """Small events, then large ones, then small ones again (one partition,
    ``max_poll_bytes`` 64 KiB): the first poll asks for 100 records, each
    later one for what :func:`poll_size` makes of the page before it (so
    for 16 records of 4 000 bytes among the large ones, and more again
    after them), and every event is handled once, in order per key."""
    producer = await setup_topic(log)
    events = [Blob(f"k{n % 7}", n, 4000 * "x" if 150 <= n < 550 else "") for n in range(850)]
    for start in range(0, len(events), 50):
        await producer.publish_many(events[start : start + 50])
    seen: list[Blob] = []

    async def handle(run: Sequence[Blob]) -> None:
        seen.extend(run)

    counted = CountedReads(log)
    limit = 64 << 10
    consumer = Consumer(
        ConsumerConfig(topic="t", group="g", poll_interval=0.01, max_poll_bytes=limit),
        [Handler(Blob, handle)],
        counted,  # type: ignore[arg-type]
    )
    await consumer.drain()
    assert sorted(e.n for e in seen) == list(range(850))
    for key in {e.key for e in events}:
        ns = [e.n for e in seen if e.key == key]
        assert ns == sorted(ns), f"key {key} out of order"
    asked = [a for a, _ in counted.reads]
    assert asked[0] == FIRST_POLL_RECORDS
    assert asked[1:] == [
        poll_size(within_bytes(p, limit), 2000, limit) for _, p in counted.reads[:-1]
    ]
    assert min(asked) <= limit // 4000  # pages of large records asked for few
    assert asked[-1] > limit // 4000  # and small ones for more again


async def test_two_batches_in_flight_hold_at_most_twice_max_poll_bytes(
    log: Log, clock: FakeClock
) -> None:
    """The at-least-once window in bytes (``docs/engine.md``, "Pipelining
    across batches"): with the first key's handler held, the records
    handled past the stored offset (a crash delivers them again) fit in 2
    x ``max_poll_bytes``, although the first poll (100 records) reads all
    40 events of 8 000 bytes at once."""
    producer = await setup_topic(log)
    await producer.publish_many(Blob(f"k{n}", n, 8000 * "x") for n in range(40))
    gate = asyncio.Event()
    seen: list[Blob] = []

    async def handle(run: Sequence[Blob]) -> None:
        if run[0].n == 0:
            await gate.wait()
        seen.extend(run)

    limit = 64 << 10
    c = consumer(log, clock, [Handler(Blob, handle)], max_poll_bytes=limit, max_concurrency=4)
    runner = asyncio.create_task(c.run(install_signal_handlers=False))
    try:
        await wait_until(clock, lambda: len(seen) >= 5 or runner.done())
        # Whatever else runs while event 0 is held has to stop at two batches.
        settled = -1
        while settled != len(seen) and not runner.done():
            settled = len(seen)
            for _ in range(20):
                await clock.sleep(0.01)
        assert not runner.done()
        assert 0 not in {e.n for e in seen}
        assert await log.committed("g", "t", 0) in (None, 0)
        assert sum(len(e.data) for e in seen) <= 2 * limit
        assert len(seen) < 39
        gate.set()
        await wait_until(clock, lambda: len(seen) == 40 or runner.done())
    finally:
        gate.set()
        c.stop()
        await runner
    assert sorted(e.n for e in seen) == list(range(40))
