"""The consumer's public view of its partitions: assignment,
position, lag, quarantined keys and pending retry work, as frozen snapshots."""

from __future__ import annotations

import dataclasses

import pytest

import wakuwaku as wk
from wakuwaku.engine import Handler, PartitionView, QuarantinedKey
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import T0, Item, Running, Script, consumer, setup_topic, wait_until


async def test_the_view_shows_position_lag_and_a_quarantined_key(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log, partitions=2)
    p = wk.partition_for("a", 2)
    await producer.publish_many([Item("a", 1), Item("a", 2), Item("b", 3)])
    script = Script(clock)
    script.fail[1] = [wk.Retryable("down")] * 100
    c = consumer(log, clock, [Handler(Item, script)], retry_delays=(5.0, 5.0))
    assert c.assignment() == [] and c.partitions() == []
    async with Running(c):
        await wait_until(
            clock,
            lambda: (
                len(c.assignment()) == 2
                and all(v.caught_up for v in c.partitions())
                and c.stats.quarantined_keys == 1
            ),
        )
        assert c.assignment() == [("t", 0), ("t", 1)]
        view = c.partition("t", p)
        assert isinstance(view, PartitionView)
        assert view.started and view.retry_pending == 2
        [key] = view.quarantined
        [first_work] = await log.read("wk-retry.g.t", p, 0, 1)  # the key's first pending record
        assert key == QuarantinedKey(p, "a", 2, 1, key.next_attempt_at, T0, first_work.offset)
        assert key.next_attempt_at >= T0 + 5.0
        assert view.next_attempt_at == key.next_attempt_at
        assert await c.lag() == {("t", 0): 0, ("t", 1): 0}
        await producer.publish(Item("a", 4))  # routed behind the quarantined key
        await wait_until(clock, lambda: c.stats.routed == 1)
        routed = c.partition("t", p)
        assert routed is not None and routed.retry_pending == 3
        assert routed.position == view.position + 1
        assert c.partition("t", 7) is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.position = 0  # type: ignore[misc]
