"""The retry path of a failing key costs little, and its
shortcuts change nothing a reader of the retry topic can see.

- work records written by this process are kept (bounded) for an attempt
  that comes soon, and not read back; a restart, or a record past the
  bound, reads them from the retry log (design §6);
- every attempt decodes the bodies again, so an event a handler changed is
  never seen by the next attempt;
- the retry state a live consumer builds from what it wrote is the state a
  restart reads back from the retry topic;
- the short decode path of retry records accepts exactly what the careful
  path accepts, with the same items, and rejects the rest for the same
  reasons (design §8).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wakuwaku as wk
from wakuwaku._events import event_type
from wakuwaku._records import (
    H_ALG,
    H_DUE,
    H_ERROR,
    H_FAILED_AT,
    H_GROUP,
    H_KEY,
    H_PROPS,
    H_SRC,
    H_TYPE,
    H_UNREADABLE,
    H_VERSION,
    Record,
    Source,
    build_headers,
    encode_source,
    message_id,
)
from wakuwaku.engine import Handler, _shared
from wakuwaku.engine._outbox import _MARK, _bare_ident, _bare_source
from wakuwaku.engine._plan import decode_batch, decode_records
from wakuwaku.engine._retry import (
    RetryState,
    Written,
    WrittenCache,
    attempt_failed_marker,
    load_retry_state,
    ms_text,
    resolved_marker,
)
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import T0, Item, Running, Script, consumer, read_all, setup_topic, wait_until

ITEM = event_type(Item)
TYPES = {ITEM.tag: ITEM}
SOURCE = Source("t", 0, (1,), ("t/0/1",))


def counting_retry_reads(log: Log) -> list[int]:
    """Patch ``log.read``: the offsets of every retry-topic record read."""
    reads: list[int] = []
    read = log.read

    async def counted(
        topic: str, partition: int, offset: int, limit: int = 500, wait: float = 0.0
    ) -> list[wk.Record]:
        records = await read(topic, partition, offset, limit, wait)
        if topic.startswith("wk-retry."):
            reads.extend(r.offset for r in records)
        return records

    log.read = counted  # type: ignore[method-assign,assignment]
    return reads


async def run_failing_key(log: Log, clock: FakeClock) -> tuple[Script, list[int]]:
    """Key a: event 0 fails twice (the first call and attempt 1), events 1-4
    are routed behind it; attempt 2 handles all five. Returns the script and
    the retry records read once the worker had started."""
    reads = counting_retry_reads(log)
    producer = await setup_topic(log)
    script = Script(clock)
    script.fail[0] = [wk.Retryable("not yet")] * 2
    c = consumer(log, clock, [Handler(Item, script)], retry_delays=[1.0, 2.0])
    async with Running(c):
        await producer.publish(Item("a", 0))
        await wait_until(clock, lambda: bool(c.workers))
        [worker] = c.workers.values()
        await wait_until(clock, lambda: worker.started and worker.retry.quarantined("a"))
        reads.clear()
        await producer.publish_many([Item("a", n) for n in range(1, 5)])
        await wait_until(clock, lambda: worker.retry.pending_count == 5)
        await wait_until(clock, lambda: not worker.retry.keys)
    return script, reads


#: The first call, attempt 1 (the head fails again), attempt 2 (max_batch 1).
CALLS = [[0], [0], [0], [1], [2], [3], [4]]


async def test_an_attempt_of_records_this_process_wrote_reads_nothing_back(
    memory_log: Log, clock: FakeClock
) -> None:
    """The memory log shows how the engine reads (the same on every log)."""
    script, reads = await run_failing_key(memory_log, clock)
    assert script.handled_ns("a") == [0, 1, 2, 3, 4]
    assert [[e.n for e in call[2]] for call in script.calls] == CALLS
    assert reads == []


async def test_records_past_the_bound_are_read_from_the_retry_log(
    memory_log: Log, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for two records, the oldest three are read back: the same
    calls, the same events."""
    monkeypatch.setattr(_shared, "WrittenCache", functools.partial(WrittenCache, 2))
    script, reads = await run_failing_key(memory_log, clock)
    assert script.handled_ns("a") == [0, 1, 2, 3, 4]
    assert [[e.n for e in call[2]] for call in script.calls] == CALLS
    # Both attempts read the three records that did not fit (offsets 0-2; the
    # others are kept), never a marker beyond them.
    assert reads and set(reads) <= {0, 1, 2}


@wk.event("test.mutable", key="key")
class Mutable(msgspec.Struct):
    """Not frozen: a handler can change what it is given."""

    key: str
    n: int
    touched: int = 0


async def test_every_attempt_decodes_the_bodies_again(log: Log, clock: FakeClock) -> None:
    """A handler that changes its events and then fails never shows the
    change to the next attempt: kept records keep bytes, not events."""
    producer = wk.Producer(log, "t")
    await log.create_topic("t", 1)
    seen: list[list[tuple[int, int]]] = []

    async def handle(events: Sequence[Mutable]) -> None:
        seen.append([(e.n, e.touched) for e in events])
        for event in events:
            event.touched += 1
        if len(seen) < 3:
            raise wk.Retryable("not yet")

    c = consumer(log, clock, [Handler(Mutable, handle, max_batch=10)], retry_delays=[1.0, 1.0])
    async with Running(c):
        await producer.publish_many([Mutable("a", 0), Mutable("a", 1)])
        await wait_until(clock, lambda: len(seen) >= 3)
        await wait_until(clock, lambda: c.stats.attempts == 2)
    assert seen == [[(0, 0), (1, 0)]] * 3


def state_of(retry: RetryState) -> dict[str, Any]:
    """What a restart must rebuild (process-local fields left out)."""
    return {
        "keys": {
            key: (
                list(s.offsets),
                s.failures,
                s.due_wall,
                s.first_failed_at,
                s.max_main_offset,
            )
            for key, s in retry.keys.items()
        },
        "pending": retry.pending_count,
        "routed": retry.routed,
        "end": retry.end_offset,
    }


async def test_the_state_built_from_written_records_is_the_state_a_restart_reads(
    log: Log, clock: FakeClock
) -> None:
    """Live, a work record is folded in from what its writer knows
    (``RetryState.apply_written``); a restart parses the records. Two keys
    quarantined, more records routed behind both, one attempt failed."""
    producer = await setup_topic(log)
    script = Script(clock)
    script.fail[0] = [wk.Retryable("a")] * 100
    script.fail[1] = [wk.Retryable("b")] * 100
    c = consumer(log, clock, [Handler(Item, script)], retry_delays=[5.0, 3600.0])
    async with Running(c):
        await producer.publish_many([Item("a", 0), Item("b", 1), Item("c", 2)])
        await wait_until(clock, lambda: bool(c.workers))
        [worker] = c.workers.values()
        await wait_until(clock, lambda: worker.retry.pending_count == 2 and worker.caught_up)
        await producer.publish_many([Item(k, n) for n in range(3, 13) for k in "ab"])
        await wait_until(clock, lambda: worker.retry.pending_count == 22 and worker.caught_up)
        await wait_until(clock, lambda: c.stats.attempts_failed == 2)
        live = state_of(worker.retry)
    assert script.handled_ns() == [2]
    assert live["keys"]["a"][1] == 2  # one failed attempt folded in
    read = RetryState(c.config.delay, clock)
    await load_retry_state(log, "g", "wk-retry.g.t", 0, read)
    assert read.routed == {"a": 21, "b": 22}
    # What the worker does with it, as a restart does: the main offset is past them.
    read.forget_routed(await log.committed("g", "t", 0) or 0)
    assert state_of(read) == live
    assert not read.broken


def test_the_kept_records_stay_within_their_bound() -> None:
    """Oldest first out, by count and by bytes; dropped records free their bytes."""
    kept = WrittenCache(max_records=3, max_bytes=10_000)
    for offset in range(5):
        kept.put(Written(Record(offset, {}, b""), "k", ITEM, SOURCE, {}, 0.0), 100)
    assert len(kept) == 3 and [o for o in range(5) if kept.get(o)] == [2, 3, 4]
    kept.drop([3, 9])
    assert len(kept) == 2 and kept.get(3) is None
    by_bytes = WrittenCache(max_records=100, max_bytes=2_000)
    for offset in range(5):
        by_bytes.put(Written(Record(offset, {}, b""), "k", ITEM, SOURCE, {}, 0.0), 500)
    # Each counts 500 + a fixed overhead: only the newest fit in 2 000 bytes.
    assert [o for o in range(5) if by_bytes.get(o)] == [4]
    assert by_bytes.bytes <= 2_000
    by_bytes.put(Written(Record(4, {}, b""), "k", ITEM, SOURCE, {}, 0.0), 10)
    assert len(by_bytes) == 1 and by_bytes.bytes < 1_000
    by_bytes.clear()
    assert len(by_bytes) == 0 and by_bytes.bytes == 0


@settings(max_examples=100, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.tuples(st.integers(0, 30), st.integers(0, 900)), max_size=12), max_size=6
    ),
    max_records=st.integers(0, 8),
)
def test_keeping_a_run_at_once_keeps_what_one_by_one_keeps(
    batches: list[list[tuple[int, int]]], max_records: int
) -> None:
    """``put_many`` (a routed run) keeps and drops the records ``put`` would, one by one."""
    one = WrittenCache(max_records=max_records, max_bytes=4_000)
    many = WrittenCache(max_records=max_records, max_bytes=4_000)
    for batch in batches:
        kept = [Written(Record(offset, {}, b""), "k", ITEM, SOURCE, {}, 0.0) for offset, _ in batch]
        for written, (_, size) in zip(kept, batch, strict=True):
            one.put(written, size)
        many.put_many(kept, [size for _, size in batch])
        assert [(o, one.get(o)) for o in range(31)] == [(o, many.get(o)) for o in range(31)]
        assert (len(one), one.bytes) == (len(many), many.bytes)
        assert many.get_many(range(31)) == [one.get(o) for o in range(31)]


# ------------------------------------------------------------ retry decoding


def work_record(offset: int, n: int) -> tuple[dict[str, bytes], bytes]:
    """A retry work record as the engine writes it for main record ``n``."""
    headers = build_headers(ITEM, "k")
    headers.update(
        {
            H_FAILED_AT: ms_text(T0),
            H_DUE: ms_text(T0 + 2),
            H_ERROR: b"routed",
            H_GROUP: b"g",
            H_SRC: encode_source(Source("t", 0, (n,), (message_id("t", 0, n),))),
        }
    )
    return headers, msgspec.json.encode(Item("k", n))


#: Ways a retry record can differ from what the engine writes.
CHANGES: dict[str, Any] = {
    "none": lambda h, b: (h, b),
    "no wk-due-at": lambda h, b: ({k: v for k, v in h.items() if k != H_DUE}, b),
    "no wk-src": lambda h, b: ({k: v for k, v in h.items() if k != H_SRC}, b),
    "no wk-failed-at": lambda h, b: ({k: v for k, v in h.items() if k != H_FAILED_AT}, b),
    "no wk-group": lambda h, b: ({k: v for k, v in h.items() if k != H_GROUP}, b),
    "another wk-group": lambda h, b: ({**h, H_GROUP: b"other"}, b),
    "props": lambda h, b: ({**h, H_PROPS: b'{"tenant":"x"}'}, b),
    "broken props": lambda h, b: ({**h, H_PROPS: b"[1]"}, b),
    "custom header": lambda h, b: ({**h, "x-trace": b"abc"}, b),
    "version 2": lambda h, b: ({**h, H_VERSION: b"2"}, b),
    "unknown type": lambda h, b: ({**h, H_TYPE: b"test.nobody"}, b),
    "algebra mismatch": lambda h, b: ({**h, H_ALG: b"idempotent"}, b),
    "empty key": lambda h, b: ({**h, H_KEY: b""}, b),
    "key not utf-8": lambda h, b: ({**h, H_KEY: b"\xff\xfe"}, b),
    "huge failed-at": lambda h, b: ({**h, H_FAILED_AT: b"9" * 400}, b),
    "failed-at not a number": lambda h, b: ({**h, H_FAILED_AT: b"soon"}, b),
    "src not json": lambda h, b: ({**h, H_SRC: b"[1,"}, b),
    "src without ids": lambda h, b: ({**h, H_SRC: b'["t",0,[1],[]]'}, b),
    "src negative offset": lambda h, b: ({**h, H_SRC: b'["t",0,[-1],["x"]]'}, b),
    "src of two records": lambda h, b: ({**h, H_SRC: b'["t",0,[1,2],["a","b"]]'}, b),
    "body not json": lambda h, b: (h, b"{"),
    "body of another shape": lambda h, b: (h, b'{"key":"k"}'),
    "values as memoryview": lambda h, b: ({k: memoryview(v) for k, v in h.items()}, b),
}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(sorted(CHANGES)), min_size=1, max_size=12))
def test_the_short_retry_decode_path_agrees_with_the_careful_one(changes: list[str]) -> None:
    records = [
        Record(offset, *CHANGES[change](*work_record(offset, 100 + offset)))
        for offset, change in enumerate(changes)
    ]
    got = decode_records(records, "t", 0, TYPES, from_retry=True)
    # decode_batch without a short path for retry records: every record the careful way.
    items, _, rejects = decode_batch(records, "t", 0, TYPES, from_retry=True)
    assert got == (items, rejects)
    assert len(got[0]) + len(got[1]) == len(records)
    for item in got[0]:
        assert isinstance(item.origin, Source) and item.failed_at in (T0, None)


def retry_record(offset: int, step: tuple[str, str]) -> Record:
    """Record ``offset`` of a retry partition: a work record of key ``k`` or
    ``j`` changed as ``CHANGES`` says, or one of that key's markers."""
    what, key = step
    if what == "resolved":
        return Record(offset, *resolved_marker(key, offset - 1, T0 + offset, group="g"))
    if what == "attempt failed":
        return Record(offset, *attempt_failed_marker(key, 2, T0, T0 + 60, group="g"))
    if what == "unreadable":
        headers, body = work_record(offset, 100 + offset)
        return Record(offset, {**headers, H_KEY: key.encode(), H_UNREADABLE: b"bad row"}, body)
    headers, body = CHANGES[what](*work_record(offset, 100 + offset))
    return Record(
        offset, {**headers, H_KEY: key.encode()} if what != "empty key" else headers, body
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*sorted(CHANGES), "resolved", "attempt failed", "unreadable"]),
            st.sampled_from("kj"),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_folding_a_page_at_once_builds_the_state_record_by_record_does(
    steps: list[tuple[str, str]],
) -> None:
    """``RetryState.apply_all`` takes a short path for more work of a key
    already quarantined (what nearly every record of a restart is); the
    state, the broken records and the foreign count are those of
    ``apply`` record by record."""
    records = [retry_record(offset, step) for offset, step in enumerate(steps)]
    clock = FakeClock()
    one_by_one = RetryState(lambda n: 10.0 * n, clock, group="g")
    for record in records:
        one_by_one.apply(record)
    at_once = RetryState(lambda n: 10.0 * n, clock, group="g")
    at_once.apply_all(records)
    assert state_of(at_once) == state_of(one_by_one)
    assert (at_once.broken, at_once.foreign) == (one_by_one.broken, one_by_one.foreign)


@settings(max_examples=200, deadline=None)
@given(
    topic=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20),
    partition=st.integers(0, 10_000),
    offset=st.integers(0, 2**62),
)
def test_the_wk_src_template_of_a_bare_record_is_what_encode_source_writes(
    topic: str, partition: int, offset: int
) -> None:
    want = encode_source(
        Source(topic, partition, (offset,), (message_id(topic, partition, offset),))
    )
    template = _bare_source(topic, partition)
    assert template is not None
    assert template % (offset, offset) == want
    ident = _bare_ident(topic, partition)
    assert ident is not None
    assert ident % offset == message_id(topic, partition, offset)


def test_a_topic_holding_the_template_offset_gets_no_template() -> None:
    """Then every record's source is encoded (the template would be wrong)."""
    assert _bare_source(f"t{_MARK}", 0) is None
    assert _bare_ident(f"t{_MARK}", 0) is None


async def test_pending_records_a_read_missed_are_read_again_not_dropped(
    log: Log, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store not yet visible to readers (Kafka's transaction
    markers) made an attempt find none of its key's pending records, and the
    key was closed without handling or dead-lettering them. A record the
    retry partition still holds (at or above its start offset) is read again
    on the retry schedule instead."""
    monkeypatch.setattr(_shared, "WrittenCache", functools.partial(WrittenCache, 0))
    producer = await setup_topic(log)
    script = Script(clock)
    script.fail[0] = [wk.Retryable("not yet")]
    read = log.read
    hidden = {"reads": 2}

    async def lagging(
        topic: str, partition: int, offset: int, limit: int = 500, wait: float = 0.0
    ) -> list[wk.Record]:
        records = await read(topic, partition, offset, limit, wait)
        if topic.startswith("wk-retry.") and records and hidden["reads"] > 0:
            hidden["reads"] -= 1
            return []  # written, but not visible to this read yet
        return records

    log.read = lagging  # type: ignore[method-assign,assignment]
    c = consumer(log, clock, [Handler(Item, script)], retry_delays=[1.0, 2.0])
    async with Running(c):
        await wait_until(clock, lambda: bool(c.workers))
        [worker] = c.workers.values()
        await wait_until(clock, lambda: worker.started)
        await producer.publish_many([Item("a", 0), Item("a", 1)])
        await wait_until(clock, lambda: worker.retry.quarantined("a"))
        await wait_until(clock, lambda: not worker.retry.keys)
    assert hidden["reads"] == 0
    assert script.handled_ns("a") == [0, 1]
    assert await read_all(log, "wk-dlq.g.t") == []
