"""design §15: a partition that changes owner, seen through the engine, on every log.

A new owner restores the retry work and finds the dead letters the old owner
wrote, and what a log keeps beside the records to fence the old owner (the
NATS log's fence records, written into the retry and dead-letter streams
when the lease moves) never shows in the status or the dead-letter listing.
"""

from __future__ import annotations

import wakuwaku as wk
from wakuwaku.admin import consumer_status, list_dead_letters
from wakuwaku.engine import Handler
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import Item, Running, Script, consumer, dead_letters, setup_topic, wait_until


async def test_15_a_new_owner_restores_the_old_owners_writes_and_listings_show_records_only(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log, topic="t")
    await producer.publish(Item("K", 1))
    await producer.publish(Item("D", 2))
    first = Script(clock)
    first.fail[1] = [wk.Retryable("row not there yet")] * 100
    first.fail[2] = [wk.Unrecoverable("bug")]
    old = consumer(log, clock, [Handler(Item, first)], group="g", retry_delays=(60.0, 60.0))
    async with Running(old) as c:
        await wait_until(
            clock, lambda: c.stats.quarantined_keys == 1 and c.stats.dead_lettered() == 1
        )
    # The old member released its lease when it stopped: the next one takes the
    # partition with a new generation, which fences the streams the old one wrote to.
    fixed = Script(clock)
    new = consumer(log, clock, [Handler(Item, fixed)], group="g", retry_delays=(60.0, 60.0))
    assert new.config.member_id != old.config.member_id
    async with Running(new) as c:
        await wait_until(clock, lambda: fixed.handled_ns("K") == [1])
        status = await consumer_status(log, "t", "g")
        letters = await list_dead_letters(log, "t", group="g")
    assert fixed.handled_ns("D") == []  # dead-lettered once, never run again
    assert [(d.key, d.reason, d.problems) for d in letters] == [("D", "unrecoverable", ())]
    assert status.dead_letters == {"unrecoverable": 1}
    assert status.problems == ()
    [row] = status.partitions
    assert (row.committed, row.lag, row.retry_pending) == (row.end_offset, 0, 0)
    [letter] = await dead_letters(log)
    assert letter.offset == letters[0].offset
