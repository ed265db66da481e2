"""design §6: retry and dead-letter topic names can be set in the config.

``ConsumerConfig.retry_topics`` / ``dead_letter_topics`` name a main topic's
retry and dead-letter topics; everything that finds these topics (the
consumer and its restart, ``consumer_status``, ``list_dead_letters``,
``replay_dead_letters``) uses the configured names, found again in the
topic-names topic the consumer notes them in. Engine records carry
``wk-group``, so two groups in one topic never mix their work.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

import wakuwaku as wk
from wakuwaku.admin import consumer_status, list_dead_letters, replay_dead_letters
from wakuwaku.engine import (
    TOPIC_NAMES_TOPIC,
    ConsumerConfig,
    GroupTopics,
    Handler,
    group_topics,
    read_topic_names,
)
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import Item, Running, Script, consumer, read_all, setup_topic, wait_until

RETRY = "orders-retry-billing"
DLQ = "orders-dlt-billing"
NAMED: dict[str, Any] = {
    "topic": "orders",
    "group": "billing",
    "retry_topics": {"orders": RETRY},
    "dead_letter_topics": {"orders": DLQ},
}


async def topic_names(log: Log) -> set[str]:
    return {info.name for info in await log.list_topics()}


async def test_6_retry_work_and_dead_letters_land_in_the_configured_topics(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log, topic="orders")
    await producer.publish_many([Item("K", 1), Item("B", 2)])
    script = Script(clock)
    script.fail[1] = [wk.Retryable("row locked")] * 10
    script.fail[2] = [wk.Unrecoverable("bad")]
    stats = await consumer(
        log, clock, [Handler(Item, script)], retry_delays=(1.0, 2.0), **NAMED
    ).drain()
    assert stats.gave_up_keys == 1
    names = await topic_names(log)
    assert {RETRY, DLQ, TOPIC_NAMES_TOPIC} <= names
    assert not any(n.startswith(("wk-retry.", "wk-dlq.")) for n in names)
    retry = await read_all(log, RETRY)
    assert [r.headers["wk-key"] for r in retry if "wk-marker" not in r.headers] == [b"K"]
    assert all(r.headers["wk-group"] == b"billing" for r in retry)
    letters = await read_all(log, DLQ)
    assert sorted((r.headers["wk-key"], r.headers["wk-reason"]) for r in letters) == [
        (b"B", b"unrecoverable"),
        (b"K", b"gave_up_retry"),
    ]
    assert all(r.headers["wk-group"] == b"billing" for r in letters)
    assert len(script.times("K")) == 3  # the failure and two attempts, from the configured topic


async def test_6_a_restart_rebuilds_from_the_configured_retry_topic_and_status_finds_it(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log, topic="orders")
    await producer.publish_many([Item("K", 1), Item("K", 2)])
    broken = Script(clock)
    broken.fail[1] = [wk.Retryable("row not there yet")] * 100
    async with Running(
        consumer(log, clock, [Handler(Item, broken)], retry_delays=(60.0,), **NAMED)
    ) as c:
        await wait_until(clock, lambda: c.stats.quarantined_keys == 1)
        await wait_until(clock, lambda: all(v.caught_up for v in c.partitions()))
    status = await consumer_status(log, "orders", "billing")
    assert (status.retry_topic, status.dead_letter_topic) == (RETRY, DLQ)
    assert [(q.key, q.pending) for q in status.quarantined] == [("K", 2)]
    assert status.backlog == 2
    fixed = Script(clock)
    async with Running(consumer(log, clock, [Handler(Item, fixed)], retry_delays=(60.0,), **NAMED)):
        await wait_until(clock, lambda: fixed.handled_ns("K") == [1, 2])
    assert (await consumer_status(log, "orders", "billing")).quarantined == ()


async def test_8_dlq_list_and_replay_find_the_configured_dead_letter_topic(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log, topic="orders")
    await producer.publish(Item("K", 1))
    script = Script(clock)
    script.fail[1] = [wk.Unrecoverable("bug")]
    await consumer(log, clock, [Handler(Item, script)], **NAMED).drain()
    [letter] = await list_dead_letters(log, "orders", group="billing")
    assert (letter.key, letter.group) == ("K", "billing")
    report = await replay_dead_letters(log, "orders", group="billing")
    assert len(report.replayed) == 1
    assert f"{DLQ}.replayed" in await topic_names(log)
    assert not any(n.startswith("wk-replayed.") for n in await topic_names(log))
    again = await replay_dead_letters(log, "orders", group="billing")
    assert (again.replayed, again.already_replayed) == ([], 1)  # the ledger follows the name
    await consumer(log, clock, [Handler(Item, script)], **NAMED).drain()
    assert script.handled_ns("K") == [1]  # the replayed copy
    status = await consumer_status(log, "orders", "billing")
    assert (status.dead_letters, status.replayed) == ({"unrecoverable": 1}, {"unrecoverable": 1})


async def test_6_two_groups_may_share_a_dead_letter_topic_and_see_only_their_own(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log, topic="orders")
    await producer.publish_many([Item("A", 1), Item("B", 2)])
    for group, bad in (("billing", 1), ("shipping", 2)):
        script = Script(clock)
        script.fail[bad] = [wk.Unrecoverable(f"{group} cannot")]
        await consumer(
            log,
            clock,
            [Handler(Item, script)],
            topic="orders",
            group=group,
            dead_letter_topics={"orders": "errors"},
        ).drain()
    assert len(await read_all(log, "errors")) == 2
    for group, key in (("billing", "A"), ("shipping", "B")):
        assert [x.key for x in await list_dead_letters(log, "orders", group=group)] == [key]
        status = await consumer_status(log, "orders", group)
        assert status.dead_letters == {"unrecoverable": 1}
    report = await replay_dead_letters(log, "orders", group="shipping")
    assert [r.key for r in report.replayed] == ["B"]


async def test_6_a_retry_topic_another_group_noted_is_refused_at_start(
    log: Log, clock: FakeClock
) -> None:
    await setup_topic(log, topic="orders")
    script = Script(clock)
    await consumer(log, clock, [Handler(Item, script)], **NAMED).drain()
    shipping = consumer(
        log,
        clock,
        [Handler(Item, script)],
        topic="orders",
        group="shipping",
        retry_topics={"orders": RETRY},
    )
    with pytest.raises(
        wk.ConfigError,
        match=re.escape(
            f"topic '{RETRY}' cannot be the retry topic of group 'shipping' for 'orders': "
            "it is the retry topic of group 'billing' for 'orders'"
        ),
    ):
        await shipping.start()
    assert (await group_topics(log, "orders", "shipping")).retry == "wk-retry.shipping.orders"


async def test_6_a_main_topic_that_is_another_groups_configured_topic_is_refused(
    log: Log, clock: FakeClock
) -> None:
    await setup_topic(log, topic="orders")
    script = Script(clock)
    await consumer(log, clock, [Handler(Item, script)], **NAMED).drain()
    reader = consumer(log, clock, [Handler(Item, script)], topic=DLQ, group="audit")
    with pytest.raises(wk.ConfigError, match="cannot be the main topic 'orders-dlt-billing'"):
        await reader.start()


async def test_6_a_dead_letter_topic_named_like_another_groups_main_topic_is_refused(
    log: Log, clock: FakeClock
) -> None:
    """Found by a new user: the error advised deleting 'orders', a main
    topic full of another group's data."""
    await setup_topic(log, topic="orders")
    await setup_topic(log, topic="payments")
    script = Script(clock)
    await consumer(log, clock, [Handler(Item, script)], **NAMED).drain()
    payments = consumer(
        log,
        clock,
        [Handler(Item, script)],
        topic="payments",
        group="g6",
        dead_letter_topics={"payments": "orders"},
    )
    with pytest.raises(wk.ConfigError) as refused:
        await payments.start()
    text = str(refused.value)
    assert "it is the main topic 'orders' read by group 'billing'" in text
    assert "configure another name" in text
    assert "delete" not in text


async def test_6_records_of_another_group_in_a_retry_topic_are_skipped(
    log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Two consumers that pass the start check together (or a topic-names topic
    that was deleted) can still write one retry topic: wk-group keeps their work apart."""
    producer = await setup_topic(log, topic="orders")
    await producer.publish(Item("K", 1))
    broken = Script(clock)
    broken.fail[1] = [wk.Retryable("locked")] * 100
    async with Running(
        consumer(log, clock, [Handler(Item, broken)], retry_delays=(60.0,), **NAMED)
    ) as c:
        await wait_until(clock, lambda: c.stats.quarantined_keys == 1)
    await log.delete_topic(TOPIC_NAMES_TOPIC)
    shipping = Script(clock)
    second = consumer(
        log,
        clock,
        [Handler(Item, shipping)],
        topic="orders",
        group="shipping",
        retry_topics={"orders": RETRY},
    )
    await second.start()  # passes: the note of billing's name is gone
    status = await consumer_status(log, "orders", "shipping")
    assert status.retry_topic == RETRY and status.quarantined == ()
    assert status.problems == (
        f"{RETRY} partition 0: 1 record of other consumer groups, skipped (two groups "
        "were configured with one retry topic)",
    )
    with caplog.at_level(logging.WARNING, logger="wakuwaku.consumer"):
        stats = await second.drain()
    assert shipping.handled_ns("K") == [1]  # its own K, once: not billing's retry copy
    assert stats.quarantined_keys == 0
    [warning] = [r for r in caplog.records if "other consumer groups" in r.getMessage()]
    assert warning.records == 1  # type: ignore[attr-defined]
    # billing's start would now be refused (shipping noted the name); without the note
    # it gets its own work back, untouched by shipping.
    await log.delete_topic(TOPIC_NAMES_TOPIC)
    fixed = Script(clock)
    async with Running(consumer(log, clock, [Handler(Item, fixed)], retry_delays=(60.0,), **NAMED)):
        await wait_until(clock, lambda: fixed.handled_ns("K") == [1])


async def test_6_configured_topics_are_created_with_the_main_topics_partition_count(
    log: Log, clock: FakeClock
) -> None:
    await setup_topic(log, partitions=2, topic="orders")
    await log.create_topic(RETRY, 3)
    script = Script(clock)
    with pytest.raises(wk.PartitionCountMismatch) as caught:
        await consumer(log, clock, [Handler(Item, script)], **NAMED).start()
    assert (caught.value.topic, caught.value.existing, caught.value.requested) == (RETRY, 3, 2)
    await log.delete_topic(RETRY)
    await consumer(log, clock, [Handler(Item, script)], **NAMED).start()
    for name in (RETRY, DLQ):
        assert (await log.describe_topic(name)).partitions == 2


async def test_6_consumers_note_their_names_and_a_change_is_warned_about(
    log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    await setup_topic(log, topic="orders")
    script = Script(clock)
    await consumer(log, clock, [Handler(Item, script)], topic="orders", group="billing").start()
    assert TOPIC_NAMES_TOPIC not in await topic_names(log)  # derived names need no note
    with caplog.at_level(logging.WARNING, logger="wakuwaku.consumer"):
        await consumer(log, clock, [Handler(Item, script)], **NAMED).start()
    changed = [r for r in caplog.records if "topic changed" in r.getMessage()]
    assert [(r.old, r.new) for r in changed] == [  # type: ignore[attr-defined]
        ("wk-retry.billing.orders", RETRY),
        ("wk-dlq.billing.orders", DLQ),
    ]
    assert await read_topic_names(log) == {
        ("orders", "billing"): GroupTopics(
            "orders", "billing", RETRY, DLQ, f"{DLQ}.replayed", configured=True
        )
    }
    # Back to derived names: noted too, so no tool keeps reading the old ones.
    await consumer(log, clock, [Handler(Item, script)], topic="orders", group="billing").start()
    assert await group_topics(log, "orders", "billing") == GroupTopics(
        "orders",
        "billing",
        "wk-retry.billing.orders",
        "wk-dlq.billing.orders",
        "wk-replayed.billing.orders",
    )
    assert len(await read_all(log, TOPIC_NAMES_TOPIC)) == 2
    await consumer(log, clock, [Handler(Item, script)], topic="orders", group="billing").start()
    assert len(await read_all(log, TOPIC_NAMES_TOPIC)) == 2  # unchanged: nothing noted


async def test_6_configured_names_take_the_namespace(log: Log, clock: FakeClock) -> None:
    await setup_topic(log, topic="shop.orders")
    script = Script(clock)
    script.fail[1] = [wk.Unrecoverable("bug")]
    await wk.Producer(log, "shop.orders").publish(Item("K", 1))
    await consumer(log, clock, [Handler(Item, script)], namespace="shop", **NAMED).drain()
    assert {f"shop.{RETRY}", f"shop.{DLQ}", f"shop.{TOPIC_NAMES_TOPIC}"} <= await topic_names(log)
    letters = await list_dead_letters(log, "orders", group="billing", namespace="shop")
    assert [x.key for x in letters] == ["K"]
    with pytest.raises(wk.UnknownTopicError):  # without the namespace: no such main topic
        await list_dead_letters(log, "orders", group="billing")


# ------------------------------------------------------------------ validation


def names_of(**options: Any) -> GroupTopics:
    config = ConsumerConfig(**{"topic": "orders", "group": "billing", **options})
    return config.group_topics(config.topics[0])


def test_6_configured_names_and_the_replay_ledger_that_follows_them() -> None:
    assert names_of(**NAMED) == GroupTopics(
        "orders", "billing", RETRY, DLQ, f"{DLQ}.replayed", configured=True
    )
    assert names_of(retry_topics={"orders": RETRY}) == GroupTopics(
        "orders",
        "billing",
        RETRY,
        "wk-dlq.billing.orders",
        "wk-replayed.billing.orders",
        configured=True,
    )
    assert names_of() == GroupTopics(
        "orders",
        "billing",
        "wk-retry.billing.orders",
        "wk-dlq.billing.orders",
        "wk-replayed.billing.orders",
    )
    assert names_of(namespace="shop", dead_letter_topics={"orders": "dlt"}) == GroupTopics(
        "shop.orders",
        "billing",
        "shop.wk-retry.billing.orders",
        "shop.dlt",
        "shop.dlt.replayed",
        configured=True,
    )
    config = ConsumerConfig(
        topic=["orders", "payments"], group="billing", retry_topics={"payments": "pay-retry"}
    )
    assert config.retry_topic("orders") == "wk-retry.billing.orders"
    assert config.retry_topic("payments") == "pay-retry"


def test_6_configured_names_cannot_be_changed_after_the_config_is_made() -> None:
    given = {"orders": RETRY}
    config = ConsumerConfig(topic="orders", group="billing", retry_topics=given)
    given["orders"] = "elsewhere"
    assert config.retry_topic("orders") == RETRY
    with pytest.raises(TypeError):
        config.retry_topics["orders"] = "x"  # type: ignore[index]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retry_topics": {"orders": "a b"}}, "retry_topics['orders'] = 'a b': a topic name of"),
        ({"retry_topics": {"orders": "é"}}, "valid on every engine"),
        ({"retry_topics": {"orders": "x:y"}}, "valid on every engine"),
        ({"dead_letter_topics": {"orders": ""}}, "dead_letter_topics['orders'] = ''"),
        ({"dead_letter_topics": {"orders": ".."}}, "not '.' or '..'"),
        ({"retry_topics": {"orders": 7}}, "retry_topics['orders'] = 7"),
        ({"retry_topics": {"orders": "wk-retry.x"}}, "belong to the engine"),
        ({"dead_letter_topics": {"orders": "wk-dlq.billing.orders"}}, "belong to the engine"),
        ({"retry_topics": {"orders": "wk-replayed.a.b"}}, "belong to the engine"),
        ({"retry_topics": {"orders": TOPIC_NAMES_TOPIC}}, "belong to the engine"),
        ({"retry_topics": ["orders-retry"]}, "must map main topics to topic names"),
        (
            {"retry_topics": {"order": "x"}},
            "retry_topics names topic 'order', which the consumer does not read",
        ),
        (
            {"retry_topics": {"orders": "orders"}},
            "topic 'orders' would be both the main topic 'orders' and the retry topic "
            "of group 'billing' for 'orders'",
        ),
        (
            {"topic": ["orders", "payments"], "dead_letter_topics": {"orders": "payments"}},
            "'payments' would be both the main topic 'payments' and the dead-letter topic",
        ),
        (
            {"retry_topics": {"orders": "x"}, "dead_letter_topics": {"orders": "x"}},
            "'x' would be both the retry topic of group 'billing' for 'orders' and the "
            "dead-letter topic of group 'billing' for 'orders'",
        ),
        (
            {"retry_topics": {"orders": "x.replayed"}, "dead_letter_topics": {"orders": "x"}},
            "'x.replayed' would be both the retry topic",
        ),
        (
            {
                "topic": ["orders", "payments"],
                "retry_topics": {"orders": "retry", "payments": "retry"},
            },
            "'retry' would be both the retry topic of group 'billing' for 'orders' and the "
            "retry topic of group 'billing' for 'payments'",
        ),
        (
            {"dead_letter_topics": {"orders": "d" * 195}},
            "the replay ledger of group 'billing' for 'orders' would be the 204-character",
        ),
        (
            {"namespace": "n" * 10, "retry_topics": {"orders": "r" * 190}},
            "would be the 201-character topic name",
        ),
        ({"topic": TOPIC_NAMES_TOPIC}, "where consumers note their configured topic names"),
    ],
)
def test_6_a_configured_name_that_breaks_a_rule_is_a_config_error(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(wk.ConfigError, match=re.escape(message)):
        ConsumerConfig(**{"topic": "orders", "group": "billing", **options})


def test_6_a_configured_name_of_200_characters_is_accepted() -> None:
    config = ConsumerConfig(topic="orders", group="billing", retry_topics={"orders": "r" * 200})
    assert config.retry_topic("orders") == "r" * 200


async def test_6_another_groups_dead_letter_in_a_shared_topic_never_marks_a_record_done(
    log: Log, clock: FakeClock
) -> None:
    """A log that stores call by call (NATS) reads the dead letters past the group's
    offset at a restart to find records already done: another group's dead
    letter of the same main record is not this group's outcome."""
    producer = await setup_topic(log, topic="orders")
    shared = {"topic": "orders", "dead_letter_topics": {"orders": "errors"}}
    shipping = Script(clock)
    await consumer(log, clock, [Handler(Item, shipping)], group="shipping", **shared).drain()
    await producer.publish(Item("K", 1))
    billing = Script(clock)
    billing.fail[1] = [wk.Unrecoverable("billing cannot")]
    await consumer(log, clock, [Handler(Item, billing)], group="billing", **shared).drain()
    assert [x.key for x in await list_dead_letters(log, "orders", group="billing")] == ["K"]
    await consumer(log, clock, [Handler(Item, shipping)], group="shipping", **shared).drain()
    assert shipping.handled_ns("K") == [1]
    assert await list_dead_letters(log, "orders", group="shipping") == []
