"""Operator controls, on every log: pause and resume a topic, a partition or a
key; a quarantined key's retry-now and give-up (design §13).

The commands are written with :mod:`wakuwaku.admin` (what the CLI and the
dashboard call) into the group's control topic, which every consumer of the
group reads every ``poll_interval``.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

import wakuwaku as wk
from wakuwaku import admin
from wakuwaku._clock import SYSTEM_CLOCK
from wakuwaku.engine import AssignmentLog, Consumer, Handler
from wakuwaku.engine._partition import PartitionWorker
from wakuwaku.logs import Log, open_log
from wakuwaku.testing import FakeClock

from .conftest import (
    T0,
    Item,
    Running,
    Script,
    config,
    consumer,
    dead_letters,
    event_n,
    read_all,
    reason,
    setup_topic,
    wait_until,
)

ALWAYS = [wk.Retryable("row not there yet")] * 100


def view(c: Consumer, partition: int = 0) -> wk.engine.PartitionView:
    found = c.partition("t", partition)
    assert found is not None
    return found


async def test_a_paused_key_waits_in_the_retry_topic_in_order_while_others_go_on(
    log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    producer = await setup_topic(log)
    await admin.pause(log, "g", "t", key="a", reason="bad deploy", by="ana")
    await producer.publish_many(
        [Item("a", n) for n in range(5)] + [Item("b", 10 + n) for n in range(3)]
    )
    script = Script(clock)
    c = consumer(log, clock, [Handler(Item, script)])
    with caplog.at_level(logging.WARNING, "wakuwaku.consumer"):
        async with Running(c):
            await wait_until(
                clock,
                lambda: (
                    c.partition("t", 0) is not None
                    and script.handled_ns("b") == [10, 11, 12]
                    and view(c).retry_pending == 5
                ),
            )
            assert script.handled_ns("a") == []
            assert view(c).position == 8  # the partition went on past the held key
            assert (view(c).paused_keys, view(c).paused_by) == (1, None)
            held = await read_all(log, "wk-retry.g.t")
            assert [event_n(r) for r in held] == [0, 1, 2, 3, 4]
            assert all(r.headers["wk-held"] == b"1" for r in held)
            await admin.resume(log, "g", "t", key="a", by="ana")
            await wait_until(clock, lambda: script.handled_ns("a") == [0, 1, 2, 3, 4])
            await wait_until(clock, lambda: view(c).retry_pending == 0)
    assert await dead_letters(log) == []
    # Held, not failed: its one attempt ran as attempt 0 (no failure counted).
    assert "key paused by an operator; its records wait in the retry topic" in caplog.text
    assert "key resumed by an operator" in caplog.text


async def test_a_paused_partition_is_not_polled_and_the_pause_outlives_a_restart(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log, partitions=2)
    p0 = log.partition_for("a", 2)
    await admin.pause(log, "g", "t", partition=p0)
    other = next(k for k in "bcdefghij" if log.partition_for(k, 2) != p0)
    await producer.publish_many([Item("a", 1), Item(other, 2)])
    script = Script(clock)
    c = consumer(log, clock, [Handler(Item, script)])
    async with Running(c):
        await wait_until(
            clock,
            lambda: (
                ("t", p0) in c.workers
                and c.workers[("t", p0)].paused_by is not None
                and script.handled_ns() == [2]
            ),
        )
        waited_from = clock.now()
        await wait_until(clock, lambda: clock.now() - waited_from > 5 * c.config.poll_interval)
        assert script.handled_ns() == [2]
        assert view(c, p0).position == 0
        assert view(c, p0).paused_by == f"partition {p0} of t"
    # Restarted, the pause holds: the record is still not handled.
    again = Script(clock)
    c = consumer(log, clock, [Handler(Item, again)])
    async with Running(c):
        await wait_until(
            clock, lambda: ("t", p0) in c.workers and c.workers[("t", p0)].paused_by is not None
        )
        waited_from = clock.now()
        await wait_until(clock, lambda: clock.now() - waited_from > 5 * c.config.poll_interval)
        assert again.handled_ns() == []
        await admin.resume(log, "g", "t")
        await wait_until(clock, lambda: again.handled_ns() == [1])
    assert [p.scope() for p in await admin.pauses(log, "g")] == []


async def test_a_topic_pause_reaches_every_consumer_of_the_group(log: Log) -> None:
    # The real clock: two members of one Kafka group rebalance in real time
    # (a fake clock would race ahead of the coordinator).
    clock = SYSTEM_CLOCK
    producer = await setup_topic(log, partitions=2)
    # Two members, each with its own connection (as two processes have).
    other = log if isinstance(log, wk.MemoryLog) else open_log(log.url)
    if isinstance(log, AssignmentLog):  # the group's coordinator splits the partitions
        split: list[dict[str, object]] = [{}, {}]
    else:
        split = [{"partitions": [0]}, {"partitions": [1]}]
    options = {"poll_interval": 0.1}
    first = Consumer(config(clock, **options, **split[0]), [Handler(Item, Script(clock))], log)
    second = Consumer(config(clock, **options, **split[1]), [Handler(Item, Script(clock))], other)
    both = (first, second)

    def live(c: Consumer) -> list[PartitionWorker]:
        return [w for w in c.workers.values() if not w.ended]

    try:
        async with Running(first), Running(second):
            await wait_until(
                clock,
                lambda: all(live(c) for c in both) and sum(len(live(c)) for c in both) == 2,
                limit=60,
            )
            await admin.pause(log, "g", "t")
            await wait_until(
                clock,
                lambda: all(w.paused_by == "topic t" for c in both for w in live(c)),
                limit=60,
            )
            await producer.publish_many([Item(k, n) for n, k in enumerate("abcdef")])
            waited_from = clock.monotonic()
            await wait_until(clock, lambda: clock.monotonic() - waited_from > 0.5, limit=60)
            assert first.stats.handled == second.stats.handled == 0
            await admin.resume(log, "g", "t")
            await wait_until(
                clock, lambda: first.stats.handled + second.stats.handled == 6, limit=60
            )
    finally:
        if other is not log:
            await other.close()


async def test_retry_now_runs_a_quarantined_keys_next_attempt_at_once(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    script = Script(clock)
    script.fail[1] = [wk.Retryable("once")]
    c = consumer(log, clock, [Handler(Item, script)], retry_delays=[3600.0])
    async with Running(c):
        await wait_until(
            clock, lambda: c.partition("t", 0) is not None and bool(view(c).quarantined)
        )
        command = await admin.retry_key_now(log, "g", "t", "a", by="ana")
        assert command.through == (await log.end_offsets("wk-retry.g.t"))[0]
        await wait_until(clock, lambda: script.handled_ns("a") == [1])
    assert script.times("a")[-1] < 600  # not the hour the schedule asked for
    assert await dead_letters(log) == []
    with pytest.raises(admin.KeyNotQuarantinedError, match="'a'"):
        await admin.retry_key_now(log, "g", "t", "a")


async def _failing_key(log: Log, clock: FakeClock) -> tuple[wk.Producer, Script, Consumer]:
    """A consumer whose key ``a`` always fails Retryable, its attempts an hour apart."""
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    script = Script(clock)
    script.fail[1] = list(ALWAYS)
    c = consumer(log, clock, [Handler(Item, script)], retry_delays=[3600.0, 3600.0])
    return producer, script, c


async def _three_pending(producer: wk.Producer, c: Consumer, clock: FakeClock) -> None:
    """Wait until ``a`` is quarantined, then give it three pending records."""
    await wait_until(clock, lambda: c.partition("t", 0) is not None and bool(view(c).quarantined))
    await producer.publish_many([Item("a", 2), Item("a", 3)])
    await wait_until(clock, lambda: view(c).retry_pending == 3)


async def test_two_give_ups_read_in_one_pass_dead_letter_the_work_once(
    log: Log, clock: FakeClock
) -> None:
    """An impatient operator gives a key up twice while the partition is busy:
    both commands were applied in one pass, before either's markers reached
    the retry state, and the pending work was dead-lettered twice."""
    producer, script, c = await _failing_key(log, clock)
    async with Running(c):
        await _three_pending(producer, c, clock)
        script.gate["x"] = asyncio.Event()  # the partition is busy with x meanwhile
        await producer.publish(Item("x", 9))
        await wait_until(clock, lambda: bool(script.times("x")))
        for _ in range(2):
            await admin.give_up_key(log, "g", "t", "a", by="ana", reason="bad row")
        await wait_until(clock, lambda: len(c._control.commands) >= 2)
        script.gate["x"].set()
        await wait_until(clock, lambda: not view(c).quarantined)
        letters = await dead_letters(log)
    assert sorted(event_n(r) for r in letters) == [1, 2, 3]


async def test_give_up_dead_letters_a_keys_pending_work_once_naming_the_operator(
    log: Log, clock: FakeClock
) -> None:
    producer, script, c = await _failing_key(log, clock)
    async with Running(c):
        await _three_pending(producer, c, clock)
        await admin.give_up_key(log, "g", "t", "a", by="ana", reason="bad row")
        await wait_until(clock, lambda: not view(c).quarantined)
        letters = await dead_letters(log)
    assert [event_n(r) for r in letters] == [1, 2, 3]
    assert {reason(r) for r in letters} == {"given_up_by_operator"}
    assert {r.headers["wk-operator"] for r in letters} == {b"ana"}
    assert b"bad row" in letters[0].headers["wk-error"]
    assert script.handled_ns("a") == []
    # A restart reads the command again and changes nothing.
    again = Script(clock)
    await consumer(log, clock, [Handler(Item, again)], retry_delays=[3600.0]).drain()
    assert len(await dead_letters(log)) == 3
    assert again.handled_ns() == []
    assert clock.now() - T0 < 3600
