"""design §15: consumers of one group share partitions; a partition has one owner; fencing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs import Lease
from wakuwaku.testing import FakeClock

from .conftest import Item


def group_consumer(
    log: wk.MemoryLog, member: str, seen: list[tuple[str, int]], ttl: float = 0.5
) -> Consumer:
    async def handle(run: Sequence[Item]) -> None:
        seen.extend((member, e.n) for e in run)

    config = ConsumerConfig(
        topic="t",
        group="g",
        member_id=member,
        lease_ttl=ttl,
        poll_interval=0.01,
        shutdown_timeout=5.0,
    )
    return Consumer(config, [Handler(Item, handle)], log)


async def wait_for(condition: object, seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_two_members_share_partitions_and_each_partition_has_one_owner() -> None:
    log = wk.MemoryLog()
    await log.create_topic("t", 4)
    producer = wk.Producer(log, "t")
    seen: list[tuple[str, int]] = []
    first = group_consumer(log, "a", seen)
    second = group_consumer(log, "b", seen)
    tasks = [asyncio.create_task(c.run(install_signal_handlers=False)) for c in (first, second)]
    try:
        await wait_for(lambda: len(first.assignment()) + len(second.assignment()) == 4)
        assert not set(first.assignment()) & set(second.assignment())
        await producer.publish_many([Item(f"k{i}", i) for i in range(200)])
        await wait_for(lambda: len(seen) >= 200)
    finally:
        for c in (first, second):
            c.stop()
        await asyncio.gather(*tasks)
    assert sorted(n for _, n in seen) == list(range(200))  # each event once


async def test_a_stopped_members_partitions_move_to_the_other_one() -> None:
    log = wk.MemoryLog()
    await log.create_topic("t", 2)
    producer = wk.Producer(log, "t")
    seen: list[tuple[str, int]] = []
    first = group_consumer(log, "a", seen)
    first_task = asyncio.create_task(first.run(install_signal_handlers=False))
    await wait_for(lambda: len(first.assignment()) == 2)
    second = group_consumer(log, "b", seen)
    second_task = asyncio.create_task(second.run(install_signal_handlers=False))
    # b joins: a gives one partition back for balance (_balance.py).
    await wait_for(lambda: len(first.assignment()) == len(second.assignment()) == 1)
    first.stop()
    await first_task  # releases its leases
    await producer.publish_many([Item(f"k{i}", i) for i in range(50)])
    await wait_for(lambda: len(seen) == 50)
    second.stop()
    await second_task
    assert {member for member, _ in seen} == {"b"}


async def test_a_stale_owner_cannot_commit() -> None:
    log = wk.MemoryLog()
    await log.create_topic("t", 1)
    old = await log.acquire_partition("g", "t", 0, "a", ttl=0.05)
    assert old is not None
    await asyncio.sleep(0.1)  # a's lease expires; b takes over
    new = await log.acquire_partition("g", "t", 0, "b", ttl=10.0)
    assert new is not None and new.generation > old.generation
    try:
        await log.commit("g", "t", 0, 5, fence=old)
    except wk.FencedError as exc:
        assert exc.partition == 0 and exc.generation == old.generation
    else:
        raise AssertionError("a stale generation committed")
    await log.commit("g", "t", 0, 5, fence=new)
    assert await log.committed("g", "t", 0) == 5


async def _steal(log: wk.logs.Log, member: str) -> wk.logs.Lease:
    """Take partition t/0 of group g away from ``member`` for member "thief"."""
    current = await log.acquire_partition("g", "t", 0, member, 60.0)
    assert current is not None
    await log.release_partition(current)
    taken = await log.acquire_partition("g", "t", 0, "thief", 3600.0)
    assert taken is not None and taken.generation > current.generation
    return taken


async def test_a_member_that_lost_its_partition_writes_no_retry_state_and_no_offset(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    """A's handler stalls past its lease, B takes over, then A's handler
    raises Retryable: A's retry work, markers and offset are refused."""
    for log in (wk.MemoryLog(), wk.logs.SQLiteLog(f"{tmp_path}/fence.db")):
        await log.create_topic("t", 1)
        await wk.Producer(log, "t").publish_many([Item("x", n) for n in range(3)])
        gate = asyncio.Event()
        entered = asyncio.Event()

        async def handle(
            run: Sequence[Item], gate: asyncio.Event = gate, entered: asyncio.Event = entered
        ) -> None:
            entered.set()
            await gate.wait()
            raise wk.Retryable("row not there yet")

        config = ConsumerConfig(
            topic="t",
            group="g",
            member_id="a",
            lease_ttl=3600.0,
            poll_interval=0.01,
            shutdown_timeout=5.0,
        )
        member = Consumer(config, [Handler(Item, handle)], log)
        task = asyncio.create_task(member.run(install_signal_handlers=False))
        try:
            await asyncio.wait_for(entered.wait(), 10)
            await _steal(log, "a")
            caplog.clear()
            gate.set()
            await wait_for(lambda: "partition lease lost; stopping" in caplog.text, 10)
        finally:
            member.stop()
            await task
        retry = await log.read("wk-retry.g.t", 0, 0, 100)
        dead = await log.read("wk-dlq.g.t", 0, 0, 100)
        assert (retry, dead) == ([], []), type(log).__name__
        assert await log.committed("g", "t", 0) is None
        assert await log.committed("g", "wk-retry.g.t", 0) is None
        await log.close()


async def test_no_chunk_starts_after_a_pause_that_outlived_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new user's run: a member SIGSTOPped past its lease kept starting chunks
    after SIGCONT (its last renewal had been answered before the pause), and
    applied records the new owner had handled. A handler that blocks the event
    loop for longer than the lease stands for the pause here."""
    import time

    log = wk.MemoryLog()
    await log.create_topic("t", 1)
    await wk.Producer(log, "t").publish_many([Item("x", n) for n in range(4)])
    seen: list[int] = []
    workers: list[object] = []

    async def handle(run: Sequence[Item]) -> None:
        seen.extend(e.n for e in run)
        workers.append(consumer.workers[("t", 0)])
        if seen == [0]:
            time.sleep(1.2)  # noqa: ASYNC251 - blocks the loop on purpose: the pause

    config = ConsumerConfig(
        topic="t", group="g", member_id="a", lease_ttl=0.5, poll_interval=0.01, shutdown_timeout=5.0
    )
    consumer = Consumer(config, [Handler(Item, handle, max_batch=1)], log)
    await asyncio.wait_for(consumer.drain(), 20)
    assert "partition lease ran out before it was renewed; stopping" in caplog.text
    # Nothing after 0 ran in the paused worker: a new worker, after taking the
    # lease again (nobody else had), went on from the offset stored for 0.
    assert seen == [0, 1, 2, 3]
    assert workers[1] is not workers[0]


class AssignedMemoryLog(wk.MemoryLog):
    """A memory log whose partitions a coordinator assigns, as Kafka's and
    Iggy's groups do (the engine's ``AssignmentLog``): always this member's,
    looked at again every ``within`` seconds of the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    async def ownership_changed(self, group: str, member: str, within: float) -> None:
        await self.clock.sleep(within)

    def ownership_state(self, lease: Lease) -> str:
        return "owned"


async def test_an_assigned_partitions_worker_runs_past_lease_ttl(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On Kafka and Iggy the coordinator, not a renewed lease, decides who owns
    a partition; the worker's lease deadline was set once, at acquire, so every
    busy worker stopped itself ``lease_ttl`` after taking its partition
    ('partition lease ran out before it was renewed; stopping': seen every 15 s
    on Iggy drains longer than that, each stop a restart from the stored offset)."""
    clock = FakeClock()
    log = AssignedMemoryLog(clock)
    await log.create_topic("t", 1)
    await wk.Producer(log, "t").publish_many([Item("k", n) for n in range(3)])
    workers: list[object] = []
    seen: list[int] = []

    async def handle(run: Sequence[Item]) -> None:
        workers.append(member.workers[("t", 0)])
        await clock.sleep(30.0)  # three lease_ttl of the fake clock
        seen.extend(e.n for e in run)

    config = ConsumerConfig(topic="t", group="g", clock=clock, lease_ttl=10.0, poll_interval=0.5)
    member = Consumer(config, [Handler(Item, handle)], log)
    task = asyncio.create_task(member.run(install_signal_handlers=False))
    try:
        while len(seen) < 3:
            await clock.sleep(1.0)
    finally:
        member.stop()
        await task
    assert "partition lease ran out" not in caplog.text
    assert seen == [0, 1, 2]
    assert len({id(w) for w in workers}) == 1, "the worker was stopped and started again"
