"""The derived topic-name rule, read the same way by the engine and every log."""

from __future__ import annotations

import pytest

from wakuwaku._topics import split_derived_topic
from wakuwaku.engine import split_internal_topic
from wakuwaku.logs.kafka import derived_main_topic
from wakuwaku.logs.redis import slot_topic

CASES = [
    ("wk-retry.g.orders", ("", "retry", "g", "orders")),
    ("wk-dlq.g.orders", ("", "dlq", "g", "orders")),
    ("wk-replayed.g.orders", ("", "replayed", "g", "orders")),
    ("ns.wk-retry.g.orders", ("ns.", "retry", "g", "orders")),
    ("wk-retry.g.a.b", ("", "retry", "g", "a.b")),
    ("wk-replayed.g.wk-dlq.h.t", ("", "replayed", "g", "wk-dlq.h.t")),
    ("orders", None),
    ("wk-retry.g", None),  # no main topic
    ("wk-retry..orders", None),  # no group
    ("xwk-retry.g.orders", None),  # the prefix inside a word
    ("wk-retryx.g.orders", None),
]


@pytest.mark.parametrize(("name", "split"), CASES)
def test_one_rule_for_derived_names(name: str, split: tuple[str, str, str, str] | None) -> None:
    assert split_derived_topic(name) == split
    main = None if split is None else split[0] + split[3]
    assert derived_main_topic(name) == main
    internal = None if split is None or split[0] else split[1:]
    assert split_internal_topic(name) == internal


def test_a_redis_slot_follows_derived_names_to_the_main_topic() -> None:
    assert slot_topic("ns.wk-replayed.g.wk-dlq.h.orders") == "ns.orders"
    assert slot_topic("orders") == "orders"


def test_the_leftmost_derived_prefix_counts() -> None:
    assert split_derived_topic("ns.wk-dlq.g.wk-retry.h.t") == ("ns.", "dlq", "g", "wk-retry.h.t")
    assert split_derived_topic("wk-dlq..x.wk-retry.h.t") == ("wk-dlq..x.", "retry", "h", "t")
