"""Crashes and stray exceptions: a partition never dies in silence, and a crash
never gives one message two outcomes (issue 12, items 9 and 12; SPEC 6, 7)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import wakuwaku as wk
from wakuwaku.engine import Handler
from wakuwaku.logs import BatchWrite, Lease, Log
from wakuwaku.testing import FakeClock

from .conftest import Item, Script, consumer, dead_letters, event_n, setup_topic


class Crash(BaseException):
    """Stands for a SIGKILL: nothing after it runs, nothing catches it."""


class Wrapped:
    """Passes every call to ``inner``; subclasses override what they break."""

    def __init__(self, inner: Log) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CrashAfterRetryWrite(Wrapped):
    """Crashes the consumer right after its first write to the retry topic returned."""

    crashed = False

    def _crash(self, topics: list[str]) -> None:
        if not self.crashed and any(t.startswith("wk-retry.") for t in topics):
            self.crashed = True
            raise Crash

    async def store(self, write: BatchWrite, *, fence: Lease | None = None) -> list[list[int]]:
        result = await self.inner.store(write, fence=fence)
        self._crash([topic for topic, _, _ in write.appends])
        return result

    async def append(self, topic: str, partition: int, records: Any, *,
                     fence: Lease | None = None) -> list[int]:
        result = await self.inner.append(topic, partition, records, fence=fence)
        self._crash([topic])
        return result


async def test_12_a_crash_after_the_retry_write_never_gives_a_message_two_outcomes(
    log: Log, clock: FakeClock
) -> None:
    """Issue 12 item 12: run 1 routes k and slow to the retry topic and is killed
    right after that write; run 2 gives both up or applies them, and must not
    also apply or dead-letter the same main records again from offset 0."""
    producer = await setup_topic(log)
    await producer.publish_many([Item("k", 1), Item("slow", 2)])
    script = Script(clock)
    script.fail[1] = [wk.Retryable("row not there yet")] * 5  # appears on the 6th call
    script.fail[2] = [wk.Retryable("never there")] * 100
    crashing = CrashAfterRetryWrite(log)
    # The restarted process has the same member id (a pod name), so it takes
    # its own unexpired lease back at once.
    first = consumer(crashing, clock, [Handler(Item, script)],  # type: ignore[arg-type]
                     retry_delays=(0.0, 0.0, 0.0, 0.0), member_id="m1")
    with pytest.raises(Crash):
        await first.drain()
    assert crashing.crashed
    second = consumer(log, clock, [Handler(Item, script)], retry_delays=(0.0, 0.0, 0.0, 0.0),
                      member_id="m1")
    await second.drain()
    applied = script.handled_ns()
    dead = [event_n(r) for r in await dead_letters(log)]
    if not log.atomic_store:
        # A call-by-call store (NATS: docs/logs.md, "Offsets, leases and
        # fencing") can crash between the retry write and the offsets, so
        # run 2 reads the main records again: at-least-once, every message
        # gets an outcome, but one may get two.
        assert sorted(set(applied) | set(dead)) == [1, 2]
        return
    assert len(applied) == len(set(applied)), f"applied twice: {applied}"
    assert len(dead) == len(set(dead)), f"dead-lettered twice: {dead}"
    assert not set(applied) & set(dead), f"both applied and dead-lettered: {applied}, {dead}"
    assert sorted(applied + dead) == [1, 2]


class StrayCancel(Wrapped):
    """``read`` raises ``CancelledError`` once, as some drivers leak it."""

    leaked = False

    async def read(self, *args: Any, **kwargs: Any) -> list[wk.Record]:
        if not self.leaked:
            self.leaked = True
            raise asyncio.CancelledError
        return await self.inner.read(*args, **kwargs)


async def test_9_a_stray_cancelled_error_restarts_the_partition_with_a_log_line(
    memory_log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    producer = await setup_topic(memory_log)
    await producer.publish_many([Item("a", n) for n in range(5)])
    script = Script(clock)
    stray = StrayCancel(memory_log)
    c = consumer(stray, clock, [Handler(Item, script)])  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, "wakuwaku.consumer"):
        await asyncio.wait_for(c.drain(), 60)
    assert stray.leaked
    assert script.handled_ns() == [0, 1, 2, 3, 4]
    assert "stray CancelledError" in caplog.text


class Exploding(Wrapped):
    """``read`` raises a BaseException that is not an Exception."""

    async def read(self, *args: Any, **kwargs: Any) -> list[wk.Record]:
        raise Crash


async def test_9_a_base_exception_in_a_partition_fails_the_consumer_loudly(
    memory_log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    await setup_topic(memory_log, partitions=2)
    c = consumer(Exploding(memory_log), clock,  # type: ignore[arg-type]
                 [Handler(Item, Script(clock))])
    with caplog.at_level(logging.CRITICAL, "wakuwaku.consumer"), pytest.raises(Crash):
        await asyncio.wait_for(c.drain(), 60)
    assert "partition worker ended by Crash; stopping the consumer" in caplog.text
