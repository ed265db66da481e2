"""design §6 and 8: retry and dead-letter topics belong to one consumer group.

Without this, two groups reading one topic shared ``retry_<topic>``; a
group that ran while another was quarantining a key handled that group's
retry copy as its own and resolved it, so the first group never handled or
dead-lettered its key.
"""

from __future__ import annotations

import pytest

import wakuwaku as wk
from wakuwaku.admin import consumer_status, list_dead_letters, replay_dead_letters
from wakuwaku.engine import (
    ConsumerConfig,
    Handler,
    dead_letter_topic_name,
    retry_topic_name,
    split_internal_topic,
)
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import Item, Running, Script, consumer, read_all, setup_topic, wait_until


async def test_6_groups_never_see_each_others_retry_work(log: Log, clock: FakeClock) -> None:
    producer = await setup_topic(log, topic="orders")
    await producer.publish(Item("K", 1))
    billing = Script(clock)
    billing.fail[1] = [wk.Retryable("row not there yet")] * 100
    first = consumer(
        log, clock, [Handler(Item, billing)], topic="orders", group="billing", retry_delays=(60.0,)
    )
    async with Running(first) as c:
        await wait_until(clock, lambda: c.stats.quarantined_keys == 1)
    # billing stopped with K quarantined; shipping runs to the end on its own.
    shipping = Script(clock)
    await consumer(log, clock, [Handler(Item, shipping)], topic="orders", group="shipping").drain()
    assert shipping.handled_ns("K") == [1]  # its own K, once: not billing's retry copy
    assert await read_all(log, retry_topic_name("orders", "shipping")) == []
    status = await consumer_status(log, "orders", "shipping")
    assert status.quarantined == ()
    # billing restarts with a fixed handler: K is handled.
    fixed = Script(clock)
    async with Running(
        consumer(
            log,
            clock,
            [Handler(Item, fixed)],
            topic="orders",
            group="billing",
            retry_delays=(60.0,),
        )
    ):
        await wait_until(clock, lambda: fixed.handled_ns("K") == [1])
    assert (await consumer_status(log, "orders", "billing")).quarantined == ()


async def test_8_a_replay_reaches_only_the_group_whose_dead_letter_it_is(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log, topic="orders")
    await producer.publish(Item("K", 1))
    billing = Script(clock)
    billing.fail[1] = [wk.Unrecoverable("bug")]
    shipping = Script(clock)
    for group, script in (("billing", billing), ("shipping", shipping)):
        await consumer(log, clock, [Handler(Item, script)], topic="orders", group=group).drain()
    assert [d.key for d in await list_dead_letters(log, "orders", group="billing")] == ["K"]
    assert await list_dead_letters(log, "orders", group="shipping") == []
    report = await replay_dead_letters(log, "orders", group="billing")
    assert len(report.replayed) == 1
    skipped = {}
    for group, script in (("billing", billing), ("shipping", shipping)):
        stats = await consumer(
            log, clock, [Handler(Item, script)], topic="orders", group=group
        ).drain()
        skipped[group] = stats.other_group_skipped
    assert skipped == {"billing": 0, "shipping": 1}
    assert billing.handled_ns("K") == [1]  # the replayed copy
    assert shipping.handled_ns("K") == [1]  # the original only, not billing's copy
    assert await list_dead_letters(log, "orders", group="shipping") == []


def test_6_names_are_an_unambiguous_function_of_topic_and_group() -> None:
    assert retry_topic_name("orders", "billing") == "wk-retry.billing.orders"
    assert dead_letter_topic_name("a.b", "g-1") == "wk-dlq.g-1.a.b"
    assert split_internal_topic("wk-retry.billing.orders.eu") == ("retry", "billing", "orders.eu")
    assert split_internal_topic("wk-dlq.g.t") == ("dlq", "g", "t")
    assert split_internal_topic("orders") is None
    config = ConsumerConfig(topic="orders", group="billing", namespace="shop")
    assert config.retry_topic("shop.orders") == "shop.wk-retry.billing.orders"
    assert config.dead_letter_topic("shop.orders") == "shop.wk-dlq.billing.orders"


@pytest.mark.parametrize("group", ["", "a.b", "a b", "é", "x/y", "g" * 101, "a:b"])
def test_a_group_name_that_cannot_name_a_topic_is_refused(group: str) -> None:
    with pytest.raises(wk.ConfigError, match="consumer group name"):
        ConsumerConfig(topic="orders", group=group)


@pytest.mark.parametrize("topic", ["wk-retry.billing.orders", "wk-dlq.billing.orders"])
def test_a_retry_or_dead_letter_topic_is_refused_as_a_main_topic(topic: str) -> None:
    with pytest.raises(wk.ConfigError, match="topic of group 'billing' for topic 'orders'"):
        ConsumerConfig(topic=topic, group="shipping")


def test_a_group_and_topic_whose_derived_names_are_too_long_are_refused() -> None:
    with pytest.raises(wk.ConfigError, match="at most 200 characters"):
        ConsumerConfig(topic="t" * 150, group="g" * 100)


@pytest.mark.parametrize("addressee", [b"bad.name", b"", b"x" * 101])
async def test_8_a_record_for_a_group_that_cannot_exist_is_malformed(
    log: Log, clock: FakeClock, addressee: bytes
) -> None:
    await log.create_topic("orders", 1)
    headers = dict(wk._records.build_headers(wk.event_type(Item), "K"))
    headers["wk-for-group"] = addressee
    await log.append("orders", 0, [(headers, b'{"key":"K","n":1}')])
    script = Script(clock)
    await consumer(log, clock, [Handler(Item, script)], topic="orders", group="billing").drain()
    assert script.handled_ns() == []
    [letter] = await list_dead_letters(log, "orders", group="billing")
    assert letter.reason == "malformed_header" and "wk-for-group" in (letter.error or "")
