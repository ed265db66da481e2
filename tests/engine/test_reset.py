"""A log reset (the demo's ``--reset``, ``wakuwaku topics delete`` / ``group delete``).

A reset once lost retry-path flights (the flights demo re-run on Kafka
with ``--reset``). A reset deletes the group, then the main, retry and
dead-letter topics, and creates them again: the next run must start from
nothing, read the new topics from their first offset, and attempt, then
apply or dead-letter, the retry work written in the new incarnation, on
every log.
"""

from __future__ import annotations

import wakuwaku as wk
from wakuwaku.engine import Handler
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import (
    Item,
    Running,
    Script,
    consumer,
    event_n,
    read_all,
    reason,
    setup_topic,
    wait_until,
)

TOPICS = ("t", "wk-retry.g.t", "wk-dlq.g.t")
KEYS = ("k0", "k1", "k2", "k3", "k4", "k5")


async def test_a_reset_log_starts_the_next_run_from_scratch(log: Log, clock: FakeClock) -> None:
    # First incarnation: stopped with keys quarantined, retry work pending and
    # offsets committed on all three topics.
    producer = await setup_topic(log, partitions=2)
    for n in range(24):
        await producer.publish(Item(KEYS[n % len(KEYS)], n))
    old = Script(clock)
    for n in range(0, 24, 5):
        old.fail[n] = [wk.Retryable("not yet")] * 100
    first = consumer(log, clock, [Handler(Item, old)], retry_delays=(3600.0,))
    async with Running(first) as c:
        await wait_until(clock, lambda: c.stats.quarantined_keys >= 3 and len(old.handled) > 0)
    # The reset, in the demo's order: the group, then its topics.
    await log.delete_group("g")
    for topic in TOPICS:
        assert await log.delete_topic(topic), topic
    assert {t.name for t in await log.list_topics()} & set(TOPICS) == set()

    # Second incarnation: the same names; some keys fail once, one key always.
    producer = await setup_topic(log, partitions=2)
    fresh = range(100, 148)
    for n in fresh:
        await producer.publish(Item(KEYS[n % len(KEYS)], n))
    new = Script(clock)
    for n in fresh:
        if n % len(KEYS) == 1:
            new.fail[n] = [wk.Retryable("never")] * 100  # key k1: dead-lettered
        elif n % 7 == 0:
            new.fail[n] = [wk.Retryable("once")]  # applied on an attempt
    stats = await consumer(log, clock, [Handler(Item, new)], retry_delays=(1.0, 2.0)).drain()

    doomed = {n for n in fresh if n % len(KEYS) == 1}
    # Read from offset 0 of the new topics: every event, none of the old ones.
    assert sorted(new.handled_ns()) == sorted(set(fresh) - doomed)
    assert stats.attempts > 0 and stats.gave_up_keys == 1
    dead = [r for p in range(2) for r in await read_all(log, "wk-dlq.g.t", p)]
    assert {reason(r) for r in dead} == {"gave_up_retry"}
    assert sorted(event_n(r) for r in dead) == sorted(doomed)
    # Everything read: the group's offsets are the new topics' ends.
    ends = await log.end_offsets("t")
    assert {p: await log.committed("g", "t", p) for p in range(2)} == ends
