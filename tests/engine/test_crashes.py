"""Crashes and stray exceptions: a partition never dies in silence, and a crash
never gives one message two outcomes (design §6, §7)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import wakuwaku as wk
from wakuwaku.admin import consumer_status
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

    async def append(
        self,
        topic: str,
        partition: int,
        records: Any,
        *,
        fence: Lease | None = None,
        token: str | None = None,
    ) -> list[int]:
        result = await self.inner.append(topic, partition, records, fence=fence, token=token)
        self._crash([topic])
        return result


async def test_a_crash_after_the_retry_write_never_gives_a_message_two_outcomes(
    log: Log, clock: FakeClock
) -> None:
    """Run 1 routes k and slow to the retry topic and is killed
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
    first = consumer(
        crashing,  # type: ignore[arg-type]
        clock,
        [Handler(Item, script)],
        retry_delays=(0.0, 0.0, 0.0, 0.0),
        member_id="m1",
    )
    with pytest.raises(Crash):
        await first.drain()
    assert crashing.crashed
    second = consumer(
        log, clock, [Handler(Item, script)], retry_delays=(0.0, 0.0, 0.0, 0.0), member_id="m1"
    )
    await second.drain()
    applied = script.handled_ns()
    dead = [event_n(r) for r in await dead_letters(log)]
    assert len(applied) == len(set(applied)), f"applied twice: {applied}"
    assert len(dead) == len(set(dead)), f"dead-lettered twice: {dead}"
    assert not set(applied) & set(dead), f"both applied and dead-lettered: {applied}, {dead}"
    assert sorted(applied + dead) == [1, 2]


class StrayCancel(Wrapped):
    """``read`` of a partition raises ``CancelledError`` once, as some drivers leak it."""

    leaked = False

    async def read(self, *args: Any, **kwargs: Any) -> list[wk.Record]:
        if not self.leaked and not args[0].startswith("wk-control."):
            self.leaked = True
            raise asyncio.CancelledError
        return await self.inner.read(*args, **kwargs)


async def test_a_stray_cancelled_error_restarts_the_partition_with_a_log_line(
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
    """``read`` of a partition raises a BaseException that is not an Exception."""

    async def read(self, *args: Any, **kwargs: Any) -> list[wk.Record]:
        if args[0].startswith("wk-control."):
            return await self.inner.read(*args, **kwargs)
        raise Crash


async def test_a_base_exception_in_a_partition_fails_the_consumer_loudly(
    memory_log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    await setup_topic(memory_log, partitions=2)
    c = consumer(
        Exploding(memory_log),  # type: ignore[arg-type]
        clock,
        [Handler(Item, Script(clock))],
    )
    with caplog.at_level(logging.CRITICAL, "wakuwaku.consumer"), pytest.raises(Crash):
        await asyncio.wait_for(c.drain(), 60)
    assert "partition worker ended by Crash; stopping the consumer" in caplog.text


async def test_a_gap_left_by_retention_is_logged_and_counted(
    log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The group's committed offset is below the retention floor: not in silence."""
    if type(log).__name__ == "IggyLog":
        pytest.skip(
            "Iggy deletes records by the server's retention only (whole segments, by a "
            "topic's expiry or size), never below an offset: docs/logs.md"
        )
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", n) for n in range(8)])
    await log.commit("other", "t", 0, 5)
    assert await log.apply_retention("t") == 5
    await log.commit("g", "t", 0, 1)  # stopped long ago at offset 1
    script = Script(clock)
    with caplog.at_level(logging.WARNING, "wakuwaku.consumer"):
        stats = await consumer(log, clock, [Handler(Item, script)]).drain()
    assert script.handled_ns() == [5, 6, 7]
    assert stats.offset_gaps == 4
    gap = next(r for r in caplog.records if "retention floor" in r.getMessage())
    assert (gap.partition, gap.committed, gap.start, gap.skipped) == (  # type: ignore[attr-defined]
        0,
        1,
        5,
        4,
    )


class CrashAfterDeadLetterWrite(CrashAfterRetryWrite):
    """Stores call by call (as NATS does) and crashes right after the first
    dead-letter append returned, before any offset is stored."""

    atomic_store = False

    def _crash(self, topics: list[str]) -> None:
        if not self.crashed and any(t.startswith("wk-dlq.") for t in topics):
            self.crashed = True
            raise Crash


@pytest.mark.parametrize("wrapper", [CrashAfterRetryWrite, CrashAfterDeadLetterWrite])
async def test_on_a_log_that_stores_call_by_call_a_crash_gives_no_second_outcome(
    log: Log, clock: FakeClock, wrapper: type[CrashAfterRetryWrite]
) -> None:
    """The same crash on a log without an atomic store (NATS): dead letters or
    retry work written, the main offset not; the restart must not run or
    dead-letter the same main records again."""
    producer = await setup_topic(log)
    await producer.publish_many([Item("bad", 1), Item("k", 2), Item("slow", 3), Item("ok", 4)])
    script = Script(clock)
    script.fail[1] = [wk.Unrecoverable("bug")] * 100
    script.fail[2] = [wk.Retryable("row not there yet")] * 5
    script.fail[3] = [wk.Retryable("never there")] * 100
    crashing = wrapper(log)
    crashing.atomic_store = False  # type: ignore[attr-defined]
    first = consumer(
        crashing,  # type: ignore[arg-type]
        clock,
        [Handler(Item, script)],
        retry_delays=(0.0, 0.0, 0.0, 0.0),
        member_id="m1",
    )
    with pytest.raises(Crash):
        await first.drain()
    handled_before = script.handled_ns()
    again = Wrapped(log)
    again.atomic_store = False  # type: ignore[attr-defined]
    second = consumer(
        again,  # type: ignore[arg-type]
        clock,
        [Handler(Item, script)],
        retry_delays=(0.0, 0.0, 0.0, 0.0),
        member_id="m1",
    )
    await second.drain()
    applied = script.handled_ns()
    dead = [event_n(r) for r in await dead_letters(log)]
    assert sorted(dead) == sorted(set(dead)), f"dead-lettered twice: {dead}"
    assert not set(applied) & set(dead), f"both applied and dead-lettered: {applied}, {dead}"
    assert sorted(set(applied) | set(dead)) == [1, 2, 3, 4]
    # Records handled before the crash (event 4, "ok") may be handled again:
    # that is at-least-once; none of them may also be dead-lettered.
    assert set(handled_before) <= set(applied)


async def test_broken_retry_records_never_stop_the_partition(
    log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A retry record with a broken wk-failed-at, or a marker with broken
    numbers, crash-looped the worker: the partition must go on past them."""
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", 1), Item("b", 2)])
    await log.create_topic("wk-retry.g.t", 1)
    work = dict(wk._records.build_headers(wk.event_type(Item), "k"))
    work["wk-failed-at"] = b"9" * 400
    work["wk-src"] = wk._records.encode_source(wk._records.Source("t", 0, (0,), ("t/0/0",)))
    await log.append(
        "wk-retry.g.t",
        0,
        [
            (work, b'{"key":"k","n":9}'),
            (
                {
                    "wk-v": b"1",
                    "wk-marker": b"resolved",
                    "wk-key": b"k",
                    "wk-through": b"x",
                    "wk-at": b"1",
                },
                b"",
            ),
            (
                {
                    "wk-v": b"1",
                    "wk-marker": b"attempt-failed",
                    "wk-key": b"k",
                    "wk-failures": b"-1",
                    "wk-at": b"zz",
                },
                b"",
            ),
        ],
    )
    # `wakuwaku status` loads the retry partition with the worker's own
    # loader: it names the same three broken records and the same key.
    status = await consumer_status(log, "t", "g")
    assert len(status.problems) == 3, status.problems
    assert [(q.key, q.pending) for q in status.quarantined] == [("k", 1)]
    script = Script(clock)
    with caplog.at_level(logging.WARNING, "wakuwaku.consumer"):
        stats = await asyncio.wait_for(consumer(log, clock, [Handler(Item, script)]).drain(), 60)
    assert script.handled_ns() == [1, 2]
    assert [r.headers["wk-reason"] for r in await dead_letters(log)] == [b"malformed_header"]
    assert (await consumer_status(log, "t", "g")).quarantined == ()
    broken = [r for r in caplog.records if r.getMessage().startswith("broken retry record")]
    assert len(broken) == 3
    assert "partition worker crashed" not in caplog.text
    assert stats.dead_lettered() == 1
