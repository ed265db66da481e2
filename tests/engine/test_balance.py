"""design §15: the members of one group balance a topic's partitions.

On the lease logs the members balance themselves (``engine/_balance.py``):
a member that joins gets its share from the others, which give back their
highest partitions beyond theirs; one that leaves lets the others take
its share. Kafka's and Iggy's consumer groups balance on the server
(their own tests and ``benchmarks/bench_scale_out.py``), so the contract
here runs on the logs whose leases are the consumer's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.engine._balance import MEMBERS_SUFFIX, fair_shares
from wakuwaku.logs import Lease, Log, open_log
from wakuwaku.testing import FakeClock

from ..log_kit import ENGINES, fresh_log
from .conftest import Item

LEASE_LOGS = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("nats", marks=pytest.mark.nats),
]

TTL = 3.0
"""Short enough for quick joins (looks every 1 s, every 0.5 s while
waiting), long enough that a late renewal on a busy machine does not let a
place or a lease run out (at 1.5 s a member's lease ran out once in a
fresh clone's run and another member took the partition, first come)."""

WATCH = 300
"""Looks of 0.01 s in which nothing may move: 3 s, three looks of a member."""


def test_shares_split_evenly_and_the_remainder_stays_with_who_owns_most() -> None:
    assert fair_shares(4, ["a", "b"], {"a": 4}) == {"a": 2, "b": 2}
    # 5 over 2: the extra one stays with the member that owns 3 now.
    assert fair_shares(5, ["a", "b"], {"b": 3, "a": 2}) == {"b": 3, "a": 2}
    assert fair_shares(5, ["a", "b"], {}) == {"a": 3, "b": 2}  # then by name
    assert fair_shares(2, ["a", "b", "c"], {"c": 1}) == {"c": 1, "a": 1, "b": 0}
    assert fair_shares(3, ["a", "a"], {}) == {"a": 3}
    assert fair_shares(3, [], {}) == {}


def member(log: Log, name: str, seen: list[tuple[str, int]], **overrides: object) -> Consumer:
    async def handle(run: Sequence[Item]) -> None:
        seen.extend((name, e.n) for e in run)

    options: dict[str, object] = {
        "topic": "t",
        "group": "g",
        "member_id": name,
        "lease_ttl": TTL,
        "poll_interval": 0.01,
        "shutdown_timeout": 5.0,
    }
    options.update(overrides)
    return Consumer(ConsumerConfig(**options), [Handler(Item, handle)], log)  # type: ignore[arg-type]


async def wait_for(what: str, condition: Callable[[], bool], *checks: Callable[[], None]) -> None:
    """Wait until ``condition``, running ``checks`` at every look (they assert)."""
    deadline = asyncio.get_running_loop().time() + 30.0
    while not condition():
        for check in checks:
            check()
        assert asyncio.get_running_loop().time() < deadline, f"waited too long for {what}"
        await asyncio.sleep(0.01)


def owned(consumer: Consumer) -> set[int]:
    return {p for _, p in consumer.assignment()}


@pytest.mark.parametrize("engine", LEASE_LOGS)
async def test_a_member_that_joins_gets_its_share_and_one_that_leaves_gives_it_back(
    engine: str, tmp_path: Path
) -> None:
    seen: list[tuple[str, int]] = []
    tasks: list[asyncio.Task[object]] = []
    async with fresh_log(engine, tmp_path) as log:
        other = log if isinstance(log, wk.MemoryLog) else open_log(log.url)
        a = member(log, "a", seen)
        b = member(other, "b", seen)
        try:
            await log.create_topic("t", 4)
            producer = wk.Producer(log, "t")

            def one_owner_each() -> None:
                assert not owned(a) & owned(b), "a partition listed by both members"

            tasks.append(asyncio.create_task(a.run(install_signal_handlers=False)))
            await wait_for("a to own all four", lambda: owned(a) == {0, 1, 2, 3})
            await producer.publish_many([Item(f"k{i}", i) for i in range(200)])
            tasks.append(asyncio.create_task(b.run(install_signal_handlers=False)))
            await wait_for(
                "two partitions each",
                lambda: len(owned(a)) == len(owned(b)) == 2,
                one_owner_each,
            )
            # a gave back its highest partitions; what it keeps stays put.
            assert owned(a) == {0, 1} and owned(b) == {2, 3}
            await producer.publish_many([Item(f"k{i}", i) for i in range(200, 400)])
            await wait_for("every event", lambda: {n for _, n in seen} >= set(range(400)))
            assert {name for name, n in seen if n >= 200} == {"a", "b"}

            b.stop()
            await tasks.pop()
            await wait_for("a to own all four again", lambda: owned(a) == {0, 1, 2, 3})
            await producer.publish_many([Item(f"k{i}", i) for i in range(400, 500)])
            await wait_for("every event", lambda: {n for _, n in seen} >= set(range(500)))
        finally:
            # Also after a failed wait: a consumer left running would fail a
            # later test with its sockets.
            for consumer in (a, b):
                consumer.stop()
            await asyncio.gather(*tasks)
            if other is not log:
                await other.close()
    # At-least-once: a handed-over batch may come again, but nothing is lost
    # and the members' leases never overlapped (checked while waiting).
    assert {n for _, n in seen} == set(range(500))


@pytest.mark.parametrize("engine", LEASE_LOGS)
async def test_a_member_given_partitions_takes_no_part_in_the_balance(
    engine: str, tmp_path: Path
) -> None:
    """``partitions=[...]``: those partitions, first come, first served (as
    Kafka's assign()): such a member holds no place among the members, so
    the others do not give it a share, nor keep one for it."""
    async with fresh_log(engine, tmp_path) as log:
        other = log if isinstance(log, wk.MemoryLog) else open_log(log.url)
        try:
            await log.create_topic("t", 4)
            seen: list[tuple[str, int]] = []
            a = member(log, "a", seen)
            c = member(other, "c", seen, partitions=[0, 1])
            tasks = [asyncio.create_task(a.run(install_signal_handlers=False))]
            try:
                await wait_for("a to own all four", lambda: owned(a) == {0, 1, 2, 3})
                tasks.append(asyncio.create_task(c.run(install_signal_handlers=False)))
                # Several lease looks: a gives nothing back, c takes nothing.
                for _ in range(WATCH):
                    assert owned(a) == {0, 1, 2, 3} and owned(c) == set()
                    await asyncio.sleep(0.01)
                members = await log.partition_owners("g" + MEMBERS_SUFFIX, "t")
                assert members is not None
                assert {lease.member for lease in members.values()} == {"a"}
            finally:
                for consumer in (c, a):
                    consumer.stop()
                await asyncio.gather(*tasks)
        finally:
            if other is not log:
                await other.close()


async def test_a_log_that_cannot_list_leases_is_shared_first_come_first_served() -> None:
    """No :meth:`Log.partition_owners`: the members cannot see each other,
    so they do not balance (nothing is given back on a guess)."""

    class Unlisted:
        def __init__(self, inner: Log) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        async def partition_owners(self, group: str, topic: str) -> dict[int, Lease] | None:
            return None

    log = wk.MemoryLog()
    await log.create_topic("t", 2)
    seen: list[tuple[str, int]] = []
    a = member(Unlisted(log), "a", seen)  # type: ignore[arg-type]
    b = member(Unlisted(log), "b", seen)  # type: ignore[arg-type]
    tasks = [asyncio.create_task(a.run(install_signal_handlers=False))]
    await wait_for("a to own both", lambda: owned(a) == {0, 1})
    tasks.append(asyncio.create_task(b.run(install_signal_handlers=False)))
    for _ in range(WATCH):
        assert owned(a) == {0, 1} and owned(b) == set()
        await asyncio.sleep(0.01)
    for consumer in (b, a):
        consumer.stop()
    await asyncio.gather(*tasks)


async def test_a_partition_given_back_and_never_taken_is_taken_again() -> None:
    """The member a partition was given back for never takes it (a place
    still counted, its partitions' calls failing): the partition stays
    free for ``lease_ttl``, then a member above its share takes it back,
    and gives nothing back again while the members stay the same."""
    log = wk.MemoryLog()
    await log.create_topic("t", 2)
    seen: list[tuple[str, int]] = []
    a = member(log, "a", seen)
    task = asyncio.create_task(a.run(install_signal_handlers=False))
    await wait_for("a to own both", lambda: owned(a) == {0, 1})
    # A member that holds a place and never asks for a partition.
    ghost = await log.acquire_partition("g" + MEMBERS_SUFFIX, "t", 1, "ghost", 3600.0)
    assert ghost is not None
    await wait_for("a to give one back", lambda: owned(a) == {0})
    await wait_for("a to take it again", lambda: owned(a) == {0, 1})
    for _ in range(WATCH):
        assert owned(a) == {0, 1}
        await asyncio.sleep(0.01)
    a.stop()
    await task


async def test_a_partition_given_back_finishes_its_batch_so_nothing_comes_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker giving its partition back runs the batch it is in to its end
    and stores it whole; the new owner starts after it. (A graceful stop
    would cut the batch and deliver its undone records again.)"""
    log = wk.MemoryLog()
    await log.create_topic("t", 2)
    producer = wk.Producer(log, "t")
    keys = [k for k in (f"k{i}" for i in range(100)) if log.partition_for(k, 2) == 1][:20]
    await producer.publish_many([Item(key, n) for n, key in enumerate(keys)])
    gate = asyncio.Event()
    handed = asyncio.Event()

    class Handed(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("partition handed over"):
                handed.set()

    seen: list[tuple[str, int]] = []

    def consumer(name: str) -> Consumer:
        async def handle(run: Sequence[Item]) -> None:
            if name == "a":
                await gate.wait()  # the batch is in flight when b joins
            seen.extend((name, e.n) for e in run)

        config = ConsumerConfig(
            topic="t", group="g", member_id=name, lease_ttl=3.0, poll_interval=0.01
        )
        return Consumer(config, [Handler(Item, handle)], log)

    a, b = consumer("a"), consumer("b")
    watcher = Handed()
    logging.getLogger("wakuwaku").addHandler(watcher)
    caplog.set_level(logging.INFO, logger="wakuwaku")
    try:
        tasks = [asyncio.create_task(a.run(install_signal_handlers=False))]
        await wait_for("a to own both", lambda: owned(a) == {0, 1})
        tasks.append(asyncio.create_task(b.run(install_signal_handlers=False)))
        await asyncio.wait_for(handed.wait(), 30)
        gate.set()  # the batch ends well before a's next look would cut it
        await wait_for("b to own partition 1", lambda: owned(b) == {1})
        await producer.publish_many([Item(key, 100 + n) for n, key in enumerate(keys)])
        await wait_for(
            "every event", lambda: {n for _, n in seen} >= {*range(20), *range(100, 120)}
        )
        for c in (b, a):
            c.stop()
        await asyncio.gather(*tasks)
    finally:
        logging.getLogger("wakuwaku").removeHandler(watcher)
    assert sorted(n for name, n in seen if name == "a") == list(range(20))
    assert sorted(n for name, n in seen if name == "b") == list(range(100, 120))
    assert await log.committed("g", "t", 1) == 40


async def test_members_started_together_split_within_their_first_fast_looks() -> None:
    """Started together (b a second after a), the first member to look sees
    only itself and takes every partition; both look every 0.5 s during
    their first ``lease_ttl / 3``, so the split comes then, not at a's slow
    look 5 s after its last (time here is a fake clock moved by hand)."""
    log = wk.MemoryLog()
    await log.create_topic("t", 4)
    clock = FakeClock(autojump=False)
    seen: list[tuple[str, int]] = []
    a = member(log, "a", seen, lease_ttl=15.0, clock=clock)
    b = member(log, "b", seen, lease_ttl=15.0, clock=clock)
    tasks = [asyncio.create_task(a.run(install_signal_handlers=False))]
    await wait_for("a to own all four", lambda: owned(a) == {0, 1, 2, 3})
    while clock.monotonic() < 1.0:  # a's looks of a member that wants nothing more
        clock.advance(0.05)
        await asyncio.sleep(0.005)
    tasks.append(asyncio.create_task(b.run(install_signal_handlers=False)))
    await wait_for("b to take its place", lambda: b._ownership.memberships.get("t") is not None)  # type: ignore[attr-defined]
    while not len(owned(a)) == len(owned(b)) == 2:
        assert clock.monotonic() < 4.5, "split only at the slow look"
        clock.advance(0.05)
        await asyncio.sleep(0.005)
    for c in (b, a):
        c.stop()
    await asyncio.gather(*tasks)


@pytest.mark.parametrize("engine", ENGINES)
async def test_members_draining_together_all_return_once_the_group_consumed_everything(
    engine: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Parallel ``drain()`` workers of one group: each owns a share, so none
    owns every partition; each returns once its own partitions are read to
    their end and the others' are owned by a live member and committed to
    their end. (With balance alone, both waited for ever.) On the lease
    logs handlers wait until a partition is handed over or both members own
    some, so that the group is split before the backlog is consumed; Kafka's and Iggy's groups
    move a partition only once its worker stops, so there they do not
    wait, and the split may come before or after the backlog is gone."""
    async with fresh_log(engine, tmp_path) as log:
        other = log if isinstance(log, wk.MemoryLog) else open_log(log.url)
        try:
            await log.create_topic("t", 4)
            producer = wk.Producer(log, "t")
            await producer.publish_many([Item(f"k{i}", i) for i in range(400)])
            seen: list[tuple[str, int]] = []
            split = asyncio.Event()

            class Handed(logging.Handler):
                def emit(self, record: logging.LogRecord) -> None:
                    if record.getMessage().startswith("partition handed over"):
                        split.set()

            def consumer(on: Log, name: str) -> Consumer:
                async def handle(run: Sequence[Item]) -> None:
                    await split.wait()
                    seen.extend((name, e.n) for e in run)

                config = ConsumerConfig(
                    topic="t", group="g", member_id=name, lease_ttl=TTL, poll_interval=0.01
                )
                return Consumer(config, [Handler(Item, handle)], on)

            a, b = consumer(log, "a"), consumer(other, "b")
            leases = engine in ("memory", "sqlite", "redis", "nats")
            if not leases:
                split.set()
            watcher = Handed()
            logging.getLogger("wakuwaku").addHandler(watcher)
            caplog.set_level(logging.INFO, logger="wakuwaku")
            try:
                drains = asyncio.gather(a.drain(), b.drain())
                # Members started together may split at once (no handover).
                await wait_for("a split", lambda: split.is_set() or bool(owned(a) and owned(b)))
                split.set()
                await asyncio.wait_for(drains, 60)
            finally:
                logging.getLogger("wakuwaku").removeHandler(watcher)
        finally:
            if other is not log:
                await other.close()
    assert {n for _, n in seen} == set(range(400))
    if leases:
        assert {name for name, _ in seen} == {"a", "b"}
