"""design §6: in-process state per pending key is small and
bounded; record bodies stay in the retry log and are read when an attempt
runs, also after a restart."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator

import pytest

import wakuwaku as wk
from wakuwaku._records import H_DUE, H_FAILED_AT, H_KEY, H_SRC, Source, encode_source
from wakuwaku.engine import Handler, _attempts
from wakuwaku.engine._retry import RetryState, ms_text
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import T0, Item, Running, Script, consumer, setup_topic, wait_until

BODY = b"x" * 1024


def work_records(key: str, count: int) -> Iterator[wk.Record]:
    """``count`` retry work records of ``key`` with 1 KiB bodies, made one at a time."""
    for offset in range(count):
        headers = {
            H_KEY: key.encode(),
            H_FAILED_AT: ms_text(T0),
            H_DUE: ms_text(T0 + 3600),
            H_SRC: encode_source(Source("t", 0, (offset,), (f"id-{offset}",))),
        }
        yield wk.Record(offset, headers, BODY[8:] + offset.to_bytes(8), T0)


def reachable(root: object, limit: int = 100_000) -> Iterator[object]:
    """Every object reachable from ``root`` (at most ``limit`` of them)."""
    seen = {id(root)}
    todo = [root]
    while todo and len(seen) < limit:
        obj = todo.pop()
        yield obj
        for ref in gc.get_referents(obj):
            if id(ref) not in seen and not isinstance(ref, type):
                seen.add(id(ref))
                todo.append(ref)


def test_pending_keys_keep_offsets_not_bodies() -> None:
    """40 000 pending 1 KiB records cost a few bytes each,
    not their 40 MiB of bodies, and no record or body is held (before: a
    list of every Record, +64 MiB)."""
    clock = FakeClock(T0)
    state = RetryState(lambda failures: 3600.0, clock)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        state.apply_all(work_records("k", 40_000))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert state.pending_count == 40_000 and list(state.keys) == ["k"]
    assert held < 40_000 * 32, f"{held / 40_000:.0f} bytes per pending record"
    for obj in reachable((state.keys, state.routed)):
        assert not isinstance(obj, wk.Record)
        assert not (isinstance(obj, bytes) and len(obj) >= 1024)
    assert state.low_watermark() == 0
    assert state.keys["k"].max_main_offset == 39_999


def holds_records(state: RetryState) -> bool:
    return any(isinstance(o, wk.Record) for o in reachable((state.keys, state.routed)))


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of 3 records, rounds of at most 5: every path of the bounded reads."""
    monkeypatch.setattr(_attempts, "READ_PAGE", 3)
    monkeypatch.setattr(_attempts, "ROUND_RECORDS", 5)


@pytest.mark.usefixtures("small_pages")
async def test_bodies_are_read_from_the_retry_log_when_the_attempt_runs_also_after_a_restart(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    script = Script(clock)
    # Keys a and b interleaved, c in between and fine; a and b fail once each.
    events = [Item(k, n) for n in range(0, 24, 3) for k in ("a", "b", "c")]
    events = [Item(e.key, i) for i, e in enumerate(events)]
    for event in events:
        await producer.publish(event)
    script.fail[0] = [wk.Retryable("not yet")]
    script.fail[1] = [wk.Retryable("not yet")]
    first = consumer(log, clock, [Handler(Item, script)], retry_delays=[60.0])
    async with Running(first):
        await wait_until(clock, lambda: bool(first.assignment()))
        [worker] = first.workers.values()
        await wait_until(clock, lambda: worker.retry.pending_count == 16 and worker.caught_up)
        assert {k: len(s.offsets) for k, s in worker.retry.keys.items()} == {"a": 8, "b": 8}
        assert not holds_records(worker.retry)
    assert [e.n for e in script.handled] == [e.n for e in events if e.key == "c"]

    script.handled.clear()
    second = consumer(log, clock, [Handler(Item, script)], retry_delays=[60.0])
    async with Running(second):
        await wait_until(
            clock, lambda: bool(second.assignment()) and all(v.started for v in second.partitions())
        )
        [worker] = second.workers.values()
        assert worker.retry.pending_count == 16
        assert not holds_records(worker.retry)
        await wait_until(clock, lambda: not worker.retry.keys)
    for key in ("a", "b"):
        assert script.handled_ns(key) == [e.n for e in events if e.key == key]
    assert second.stats.attempts == 2 and second.stats.attempts_failed == 0


async def test_an_attempt_reads_its_own_pending_records_not_the_stretches_between(
    memory_log: Log, clock: FakeClock
) -> None:
    """A due key whose pending records lie far apart in the retry
    partition (another key's routed records in between) reads those records,
    not every record from its first to its last (a page per pending record).

    How the engine reads is the same on every log: the memory log shows it
    (the test steps the consumer poll by poll, too slow on Kafka's group join).
    """
    log = memory_log
    producer = await setup_topic(log)
    script = Script(clock)
    script.fail[0] = [wk.Retryable("not yet")]  # a0: a quarantined first
    script.fail[1] = [wk.Retryable("not yet")] * 5  # b0: b quarantined 30 s later
    retry_reads: list[int] = []
    read = log.read

    async def counting_read(
        topic: str, partition: int, offset: int, limit: int = 500, wait: float = 0.0
    ) -> list[wk.Record]:
        records = await read(topic, partition, offset, limit, wait)
        if topic.startswith("wk-retry."):
            retry_reads.extend(r.offset for r in records)
        return records

    log.read = counting_read  # type: ignore[method-assign,assignment]
    c = consumer(log, clock, [Handler(Item, script)], retry_delays=[3600.0])
    async with Running(c):
        await producer.publish(Item("a", 0))
        await wait_until(clock, lambda: bool(c.workers))
        [worker] = c.workers.values()
        await wait_until(clock, lambda: worker.retry.quarantined("a"))
        clock.advance(30.0)
        n = 1
        await producer.publish(Item("b", n))
        pending = 2

        async def routed() -> None:
            # One poll per step, so the retry partition interleaves a and b.
            await wait_until(
                clock, lambda: worker.retry.pending_count == pending and worker.caught_up
            )

        await routed()
        for _ in range(3):
            await producer.publish_many([Item("b", n + i) for i in range(1, 41)])
            n, pending = n + 40, pending + 40
            await routed()
            n, pending = n + 1, pending + 1
            await producer.publish(Item("a", n))
            await routed()
        retry_reads.clear()
        clock.advance(T0 + 3600.0 - clock.now())  # a is due, b (due 30 s later) is not
        await wait_until(clock, lambda: not worker.retry.quarantined("a"))
        assert worker.retry.quarantined("b")  # not due yet: a's attempt ran alone
        read_for_a = list(retry_reads)
    assert script.handled_ns("a") == [0, 42, 83, 124]
    # a's four records and the few markers near them, never b's 120.
    assert len(read_for_a) <= 8, read_for_a
