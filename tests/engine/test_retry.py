"""design §6: retry topic, quarantine and schedule, one test per rule, on memory and SQLite."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import wakuwaku as wk
from wakuwaku.engine import Handler
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import (
    T0,
    Item,
    Running,
    Script,
    consumer,
    dead_letters,
    event_n,
    read_all,
    reason,
    setup_topic,
    wait_until,
)

ALWAYS = [wk.Retryable("row not there yet")] * 100


async def test_6_retry_and_dead_letter_topics_are_created_with_the_main_partition_count(
    log: Log, clock: FakeClock
) -> None:
    await setup_topic(log, partitions=5)
    await consumer(log, clock, [Handler(Item, Script(clock))]).start()
    assert (await log.describe_topic("wk-retry.g.t")).partitions == 5
    assert (await log.describe_topic("wk-dlq.g.t")).partitions == 5


async def test_6_a_retry_topic_with_another_partition_count_fails_start(
    log: Log, clock: FakeClock
) -> None:
    await setup_topic(log, partitions=3)
    await log.create_topic("wk-retry.g.t", 2)
    with pytest.raises(wk.PartitionCountMismatch) as caught:
        await consumer(log, clock, [Handler(Item, Script(clock))]).start()
    assert caught.value.topic == "wk-retry.g.t"
    assert (caught.value.existing, caught.value.requested) == (2, 3)
    assert "2" in str(caught.value) and "3" in str(caught.value)


async def test_6_every_due_key_gets_one_attempt_before_the_next_poll(
    memory_log: Log, clock: FakeClock
) -> None:
    log = memory_log
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    script = Script(clock)
    script.fail[1] = [wk.Retryable("later")]
    timeline: list[tuple[str, float]] = []
    real_read = log.read

    async def read(*args: Any, **kwargs: Any) -> list[wk.Record]:
        if args[0] == "t":
            timeline.append(("poll", clock.now() - T0))
        return await real_read(*args, **kwargs)

    log.read = read  # type: ignore[method-assign]
    original = script.__call__

    async def body(run: Any) -> None:
        timeline.append(("handle", clock.now() - T0))
        await original(run)

    await consumer(log, clock, [Handler(Item, body)], retry_delays=[2.0]).drain()
    attempt = timeline.index(("handle", 2.0))
    polls_at_or_after_due = [
        i for i, (what, t) in enumerate(timeline) if what == "poll" and t >= 2.0
    ]
    assert polls_at_or_after_due and attempt < polls_at_or_after_due[0]
    assert script.handled_ns() == [1]


async def test_6_schedule_attempts_at_failure_plus_2_4_8_16_then_give_up(
    log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    script = Script(clock)
    script.fail[1] = list(ALWAYS)
    c = consumer(log, clock, [Handler(Item, script)])
    with caplog.at_level(logging.ERROR, logger="wakuwaku.consumer"):
        await c.drain()
    # The first failure at 0, then one attempt per delay: +2, +4, +8, +16.
    assert script.times("a") == [0.0, 2.0, 6.0, 14.0, 30.0]
    dead = await dead_letters(log)
    assert [reason(r) for r in dead] == ["gave_up_retry"]
    assert b"row not there yet" in dead[0].headers["wk-error"]
    source = wk._records.decode_source(dead[0].headers["wk-src"])
    assert (source.topic, source.partition, source.offsets) == ("t", 0, (0,))
    gave_up = [r for r in caplog.records if r.getMessage() == "giving up retry"]
    assert len(gave_up) == 1 and gave_up[0].levelno == logging.ERROR
    assert c.stats.gave_up_keys == 1 and c.stats.attempts == 4
    # Quarantine over: the retry partition's committed offset is past every
    # record (Kafka's offsets are not dense: a transaction marker may follow).
    end = (await log.end_offsets("wk-retry.g.t"))[0]
    committed = await log.committed("g", "wk-retry.g.t", 0)
    assert committed is not None and committed <= end
    assert await log.read("wk-retry.g.t", 0, committed) == []


async def test_6_events_routed_during_quarantine_are_attempted_at_once_after_give_up(
    log: Log, clock: FakeClock
) -> None:
    from .conftest import Add

    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    items, adds = Script(clock), Script(clock)
    items.fail[1] = list(ALWAYS)
    adds.fail[Add("a", 5)] = [wk.Retryable("once")]
    c = consumer(log, clock, [Handler(Item, items), Handler(Add, adds)])
    async with Running(c):
        await wait_until(clock, lambda: c.stats.quarantined_keys == 1)
        await producer.publish(Add("a", 5))  # routed: a later run of the key
        await wait_until(clock, lambda: [e.amount for e in adds.handled] == [5])
    # Given up at 30: the routed event runs at once, fails, and its counter
    # starts again (+2).
    assert adds.times("a") == [30.0, 32.0]
    assert items.times("a") == [0.0, 2.0, 6.0, 14.0, 30.0]
    assert [reason(r) for r in await dead_letters(log)] == ["gave_up_retry"]


async def test_6_events_routed_into_the_failed_run_are_given_up_with_it(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    script = Script(clock)
    script.fail[1] = list(ALWAYS)
    c = consumer(log, clock, [Handler(Item, script)])
    async with Running(c):
        await wait_until(clock, lambda: c.stats.quarantined_keys == 1)
        await producer.publish(Item("a", 2))  # same type: planned into the failed run
        await wait_until(clock, lambda: c.stats.gave_up_keys == 1)
    # The attempt plans all pending work as one batch: [1, 2] is one run, and
    # the failed run's remaining records are dead-lettered (design §6).
    assert [event_n(r) for r in await dead_letters(log)] == [1, 2]
    assert script.handled_ns() == []


async def test_6_quarantine_ends_when_the_key_has_no_pending_records(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    script = Script(clock)
    script.fail[1] = [wk.Retryable("once")]
    c = consumer(log, clock, [Handler(Item, script)])
    async with Running(c):
        await wait_until(clock, lambda: script.handled_ns() == [1])
        routed = c.stats.routed
        await producer.publish(Item("a", 2))
        await wait_until(clock, lambda: script.handled_ns() == [1, 2])
        assert c.stats.routed == routed  # handled from the main topic, not routed
        assert not any(view.quarantined for view in c.partitions())


async def test_6_work_that_succeeded_inside_a_failed_attempt_is_not_applied_again(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", 1), Item("a", 2), Item("a", 3)])
    script = Script(clock)
    script.fail[1] = [wk.Retryable("first")]
    script.fail[2] = [wk.Retryable("second"), wk.Retryable("third")]
    await consumer(log, clock, [Handler(Item, script)]).drain()
    assert script.handled_ns() == [1, 2, 3]
    ones = [t for t, _, run in script.calls if run[0].n == 1]
    assert ones == [0.0, 2.0]  # applied once, at the first attempt, never again


async def test_6_restart_in_the_middle_of_a_quarantine_rebuilds_keys_counters_and_schedule(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", 1), Item("a", 2), Item("b", 10)])
    first = Script(clock)
    first.fail[1] = [wk.Retryable("first")]
    first.fail[2] = [wk.Retryable("keeps failing")] * 100
    # A restarted process with the same member id takes its leases back at once.
    c1 = consumer(log, clock, [Handler(Item, first)], member_id="m1")
    task = asyncio.create_task(c1.run(install_signal_handlers=False))
    await wait_until(clock, lambda: c1.stats.attempts_failed == 1)
    # Attempt 1 at 2: event 1 succeeded, event 2 failed. The attempt got past the
    # head, so event 2 is the new head at its first failure: next attempt at 4.
    await clock.sleep(1.0)
    task.cancel()  # a crash: nothing graceful happens
    await asyncio.gather(task, return_exceptions=True)
    assert first.handled_ns() == [10, 1]
    before = {
        k: (s.failures, s.due_wall, s.due, list(s.offsets))
        for w in c1.workers.values()
        for k, s in w.retry.keys.items()
    }

    second = Script(clock)
    second.fail[2] = [wk.Retryable("keeps failing")] * 100
    c2 = consumer(log, clock, [Handler(Item, second)], member_id="m1")
    async with Running(c2):
        await wait_until(
            clock, lambda: all(v.started for v in c2.partitions()) and bool(c2.assignment())
        )
        after = {
            k: (s.failures, s.due_wall, s.due, list(s.offsets))
            for w in c2.workers.values()
            for k, s in w.retry.keys.items()
        }
        assert after == before
        # Stored at T0 + 4; on the monotonic clock (the fake one starts at 0): 4.
        assert after["a"][0:3] == (1, T0 + 4.0, 4.0)
        await wait_until(clock, lambda: c2.stats.gave_up_keys == 1)
    # Nothing resolved before the crash ran again; the counter was not reset:
    # event 2's attempts at 4, 8, 16 and 32, then give up.
    assert second.handled_ns() == []
    assert second.times("a") == [4.0, 8.0, 16.0, 32.0]
    assert [reason(r) for r in await dead_letters(log)] == ["gave_up_retry"]


async def test_6_the_retry_partitions_committed_offset_is_its_lowest_pending_offset(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", 1), Item("b", 2)])
    script = Script(clock)
    script.fail[1] = [wk.Retryable("a")] * 2
    script.fail[2] = [wk.Retryable("b")] * 100
    c = consumer(log, clock, [Handler(Item, script)], retry_delays=[2.0, 4.0, 8.0, 16.0])
    async with Running(c):
        await wait_until(clock, lambda: script.handled_ns() == [1])
        retry = await read_all(log, "wk-retry.g.t")
        work = [r for r in retry if "wk-marker" not in r.headers]
        b_record = next(r for r in work if r.headers["wk-key"] == b"b")
        # a is resolved; b's record is the lowest still pending.
        assert await log.committed("g", "wk-retry.g.t", 0) == b_record.offset


@pytest.mark.parametrize(("restart_at", "first_attempt"), [(1.0, 2.0), (10.0, 10.0)])
async def test_6_the_failure_time_keeps_the_first_attempt_after_a_restart(
    log: Log, clock: FakeClock, restart_at: float, first_attempt: float
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    first = Script(clock)
    first.fail[1] = [wk.Retryable("later")]
    c1 = consumer(log, clock, [Handler(Item, first)])
    async with Running(c1):
        await wait_until(clock, lambda: c1.stats.quarantined_keys == 1)
    clock.advance(restart_at - (clock.now() - T0))
    second = Script(clock)
    await consumer(log, clock, [Handler(Item, second)]).drain()
    assert second.times("a") == [first_attempt]
    assert second.handled_ns() == [1]


async def test_6_max_pending_retry_dead_letters_a_new_key_but_quarantined_keys_keep_routing(
    log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", 1), Item("a", 2)])
    script = Script(clock)
    script.fail[1] = [wk.Retryable("a")] * 100
    script.fail[3] = [wk.Retryable("b")]
    c = consumer(log, clock, [Handler(Item, script)], max_pending_retry=2, retry_delays=[1000.0])
    with caplog.at_level(logging.ERROR, logger="wakuwaku.consumer"):
        async with Running(c):
            await wait_until(clock, lambda: c.stats.quarantined_keys == 1)
            await producer.publish_many([Item("b", 3), Item("a", 4)])
            await wait_until(
                clock,
                lambda: c.stats.routed == 1 and c.stats.dead_letters["retry_backlog_full"] == 1,
            )
    dead = await dead_letters(log)
    assert [reason(r) for r in dead] == ["retry_backlog_full"]
    assert dead[0].headers["wk-key"] == b"b"
    retry_keys = [
        r.headers["wk-key"]
        for r in await read_all(log, "wk-retry.g.t")
        if "wk-marker" not in r.headers
    ]
    assert retry_keys == [b"a", b"a", b"a"]  # a's event 4 was routed past the bound
    assert any(r.getMessage() == "retry backlog full" for r in caplog.records)


async def test_6_retry_records_are_the_raw_records_reduced_again_in_the_first_plans_order(
    log: Log, clock: FakeClock
) -> None:
    from .conftest import Add

    producer = await setup_topic(log)
    await producer.publish_many([Add("a", 1), Add("a", 2), Item("a", 5), Add("a", 3), Add("a", 4)])
    adds, items = Script(clock), Script(clock)
    adds.fail[Add("a", 3)] = [wk.Retryable("first")]
    c = consumer(log, clock, [Handler(Add, adds), Handler(Item, items)])
    await c.drain()
    # The first plan: Add(3) fails; it, Item 5 and Add(7) go to the retry topic
    # as the records they stand for (design §6), and the attempt reduces them again.
    assert [[e.amount for e in run] for _, _, run in adds.calls] == [[3], [3], [7]]
    retry = [r for r in await read_all(log, "wk-retry.g.t") if "wk-marker" not in r.headers]
    assert [r.headers["wk-type"] for r in retry] == [
        b"test.add",
        b"test.add",
        b"test.item",
        b"test.add",
        b"test.add",
    ]
    assert items.handled_ns() == [5]
    assert [e.amount for e in adds.handled] == [3, 7]


@pytest.mark.parametrize("mode", [wk.DeliveryMode.NO_DOUBLE_CONSUME, wk.DeliveryMode.NO_EVENT_LOSE])
async def test_6_a_stop_during_an_attempt_keeps_what_the_attempt_did(
    log: Log, clock: FakeClock, mode: wk.DeliveryMode
) -> None:
    # Key "a" finishes its attempt; key "b" (attempted after "a": due keys go
    # by time, then key) stops between two chunks. Their markers used to be
    # dropped at the stop, so the restart ran the whole round again and
    # handled "a" 3 and "b" 1 twice.
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", 3), Item("b", 1), Item("b", 2)])
    failed: set[int] = set()
    handled: list[int] = []
    running: list[wk.Consumer] = []

    async def body(run: Any) -> None:
        (event,) = run
        if event.n not in failed:
            failed.add(event.n)
            raise wk.Retryable("not yet")
        handled.append(event.n)
        if event.n == 1 and wk.current_chunk().attempt == 1:
            running[0].stop()  # "b" 2 is not started

    def make() -> wk.Consumer:
        c = consumer(
            log,
            clock,
            [Handler(Item, body)],
            delivery_mode=mode,
            max_concurrency=1,
            retry_delays=[1.0, 1.0, 1.0],
        )
        running[:] = [c]
        return c

    await make().run(install_signal_handlers=False)
    assert sorted(handled) == [1, 3]
    await make().drain()
    # "b" 2 failed once on its own first call after the restart, then succeeded.
    assert sorted(handled) == [1, 2, 3], "an attempt's handled chunk ran again"


async def test_6_an_attempt_that_gets_past_the_head_starts_the_next_head_at_attempt_1(
    log: Log, clock: FakeClock
) -> None:
    """One key, events 1..20, each odd event fails Retryable on its first two
    tries; with four attempts and max_batch 1, 16 events were dead-lettered
    although every attempt made progress, when the next head kept the
    failure count of the one before."""
    producer = await setup_topic(log)
    await producer.publish_many([Item("k", n) for n in range(1, 21)])
    script = Script(clock)
    for n in range(1, 21, 2):
        script.fail[n] = [wk.Retryable("not yet"), wk.Retryable("not yet")]
    stats = await consumer(log, clock, [Handler(Item, script, max_batch=1)]).drain()
    assert await dead_letters(log) == []
    assert script.handled_ns("k") == list(range(1, 21))
    assert stats.gave_up_keys == 0
