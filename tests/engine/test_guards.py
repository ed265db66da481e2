"""Rules that a changed line in the source once broke without any test failing;
each test here fails on the changed rule."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import msgspec

import wakuwaku as wk
from wakuwaku._records import H_MARKER, Source, build_headers, decode_source, encode_source
from wakuwaku.engine import Handler
from wakuwaku.engine._retry import (
    MARKER_RESOLVED,
    RetryState,
    dead_letter_record,
    resolved_marker,
)
from wakuwaku.inbox import SQLiteInbox
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import Item, Running, Script, consumer, read_all, setup_topic, wait_until


@wk.event("test.other", key="key")
class Other(msgspec.Struct, frozen=True):
    """A second plain type, to share keys with :class:`Item`."""

    key: str
    n: int


async def test_two_plain_types_of_one_key_form_separate_runs(log: Log, clock: FakeClock) -> None:
    producer = await setup_topic(log)
    await producer.publish_many([Item("k", 1), Other("k", 2), Item("k", 3), Other("k", 4)])
    items: list[list[object]] = []
    others: list[list[object]] = []

    async def on_items(run: Sequence[Item]) -> None:
        items.append(list(run))

    async def on_others(run: Sequence[Other]) -> None:
        others.append(list(run))

    await consumer(
        log, clock, [Handler(Item, on_items, max_batch=10), Handler(Other, on_others, max_batch=10)]
    ).drain()
    assert items == [[Item("k", 1)], [Item("k", 3)]]
    assert others == [[Other("k", 2)], [Other("k", 4)]]


async def test_redelivered_records_of_a_quarantined_key_are_not_routed_twice(
    log: Log, clock: FakeClock
) -> None:
    """After a crash the main records a1 a2 come again while a is still
    quarantined: the retry topic must not read a1 a2 a1 a2."""
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", 1), Item("a", 2)])
    script = Script(clock)
    script.fail[1] = [wk.Retryable("not yet")] * 100
    first = consumer(log, clock, [Handler(Item, script)], retry_delays=(3600.0,), member_id="m1")
    async with Running(first) as c:
        await wait_until(clock, lambda: c.stats.quarantined_keys == 1)
    await log.commit("g", "t", 0, 0)  # as if the main offset never got stored
    second = consumer(log, clock, [Handler(Item, script)], retry_delays=(3600.0,), member_id="m1")
    async with Running(second) as c:
        await wait_until(
            clock, lambda: bool(c.assignment()) and all(v.caught_up for v in c.partitions())
        )
    work = [r for r in await read_all(log, "wk-retry.g.t") if H_MARKER not in r.headers]
    assert [msgspec.json.decode(r.body)["n"] for r in work] == [1, 2]


async def test_the_inbox_drops_an_item_only_when_all_its_message_ids_are_claimed(
    tmp_path: Path, clock: FakeClock
) -> None:
    db = tmp_path / "effects.db"
    inbox = SQLiteInbox(db, "g")
    await inbox.ensure_schema()
    log = wk.MemoryLog()
    await log.create_topic("t", 1)
    # A replayed dead letter of a combined event: one record, two message ids.
    headers = dict(build_headers(wk.event_type(Item), "a"))
    headers["wk-src"] = encode_source(Source("t", 0, (5, 6), ("t/0/5", "t/0/6")))
    await log.append("t", 0, [(headers, b'{"key":"a","n":1}')])
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    inbox.claim(conn, ["t/0/5"])  # only one of the two was applied
    conn.execute("COMMIT")
    seen: list[tuple[str, ...]] = []

    def apply(run: Sequence[Item]) -> None:
        seen.extend(wk.current_chunk().message_ids)

    stats = await consumer(log, clock, [Handler(Item, apply, inbox=inbox)]).drain()
    assert seen == [("t/0/5", "t/0/6")]
    assert stats.inbox_skipped == 0


def test_the_retry_offset_is_the_lowest_pending_one_over_several_keys() -> None:
    state = RetryState(lambda failures: 2.0)
    for offset, key in [(10, "b"), (11, "a"), (12, "b"), (13, "c")]:
        state.apply(_work(offset, key))
    assert state.low_watermark() == 10
    state.apply(_record(14, *resolved_marker("b", 12, 1_700_000_000.0, group="g")))
    assert state.low_watermark() == 11
    state.apply(_record(15, *resolved_marker("a", 11, 1_700_000_000.0, group="g")))
    assert state.low_watermark() == 13


def test_a_resolved_marker_applies_to_its_own_key_only() -> None:
    state = RetryState(lambda failures: 2.0)
    state.apply(_work(1, "a"))
    state.apply(_work(2, "b"))
    headers, body = resolved_marker("a", 2, 1_700_000_000.0, group="g")
    assert headers[H_MARKER] == MARKER_RESOLVED
    state.apply(_record(3, headers, body))
    assert sorted(state.keys) == ["b"]
    assert list(state.keys["b"].offsets) == [2]


def test_a_key_is_due_at_its_due_time_not_only_after_it() -> None:
    clock = FakeClock(1_700_000_000.0)
    state = RetryState(lambda failures: 2.0, clock)
    state.apply(_work(1, "a"))  # failed at the clock's time: due 2 s later
    due = state.keys["a"].due
    assert state.due_keys(due - 0.000001) == []
    assert state.due_keys(due) == ["a"]  # never earlier, and not later either


def _work(offset: int, key: str) -> wk.Record:
    headers = dict(build_headers(wk.event_type(Item), key))
    headers["wk-failed-at"] = b"1700000000000"
    headers["wk-src"] = encode_source(Source("t", 0, (offset,), (f"t/0/{offset}",)))
    return wk.Record(offset, headers, b"{}", 1_700_000_000.0)


def _record(offset: int, headers: dict[str, bytes], body: bytes) -> wk.Record:
    return wk.Record(offset, headers, body, 1_700_000_000.0)


async def test_a_message_in_one_batch_twice_is_applied_once_on_an_empty_inbox(
    tmp_path: Path, clock: FakeClock
) -> None:
    # A dead letter replayed twice lands twice in one batch: nothing is claimed
    # yet, and still the second copy must not reach the handler (design §9).
    db = tmp_path / "effects.db"
    inbox = SQLiteInbox(db, "g")
    await inbox.ensure_schema()
    log = wk.MemoryLog()
    await log.create_topic("t", 1)
    headers = dict(build_headers(wk.event_type(Item), "a"))
    headers["wk-src"] = encode_source(Source("t", 0, (5,), ("t/0/5",)))
    await log.append("t", 0, [(headers, b'{"key":"a","n":1}')] * 2)
    seen: list[tuple[str, ...]] = []

    def apply(run: Sequence[Item]) -> None:
        seen.extend(wk.current_chunk().message_ids)

    stats = await consumer(log, clock, [Handler(Item, apply, inbox=inbox)]).drain()
    assert seen == [("t/0/5",)]
    assert stats.inbox_skipped == 1


async def test_a_retry_record_without_wk_src_is_dead_lettered_as_itself(
    log: Log, clock: FakeClock
) -> None:
    """A work record in the retry topic without ``wk-src`` (written by hand)
    was dead-lettered as the *main* record at its offset: a replay would have
    carried the identity of a record already handled (found by a new user)."""
    producer = await setup_topic(log)
    seen: list[int] = []

    def apply(run: Sequence[Item]) -> None:
        seen.extend(e.n for e in run)

    await consumer(log, clock, [Handler(Item, apply)]).drain()  # creates the retry topic
    forged = dict(build_headers(wk.event_type(Item), "x"))
    forged["wk-failed-at"] = b"1700000000000"
    await log.append("wk-retry.g.t", 0, [(forged, b'{"key":"x","n":99}')] * 3)
    await producer.publish_many([Item("m", n) for n in range(5)])
    await consumer(log, clock, [Handler(Item, apply)], retry_delays=[1.0]).drain()
    assert seen == [0, 1, 2, 3, 4]  # the main records, each handled once
    dead = await read_all(log, "wk-dlq.g.t")
    assert len(dead) == 3
    for offset, letter in enumerate(dead):
        source = decode_source(letter.headers["wk-src"])
        assert source.topic == "wk-retry.g.t"
        assert source.ids == (f"wk-retry.g.t/0/{offset}",)
        assert letter.headers["wk-reason"] == b"malformed_header"


class CallByCall:
    """A log that stores a batch call by call, as NATS does (``atomic_store``
    false), whatever log it wraps."""

    atomic_store = False

    def __init__(self, inner: Log) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_a_give_up_cut_short_by_a_crash_is_not_given_up_or_run_again(
    log: Log, clock: FakeClock
) -> None:
    """A SIGKILL between a give-up's dead letters and its resolved marker, on
    a log that stores call by call: the restarted consumer gave the same
    retry work up again (NATS demo: 931 dead letters for 808 flights), or,
    with a handler that now succeeds, applied a dead-lettered record."""
    wrapped = CallByCall(log)
    producer = await setup_topic(log)
    script = Script(clock)
    script.fail[1] = [wk.Retryable("not yet")] * 100
    first = consumer(wrapped, clock, [Handler(Item, script)], retry_delays=[3600.0])  # type: ignore[arg-type]
    async with Running(first):
        await producer.publish(Item("k", 1))
        await wait_until(clock, lambda: bool(first.workers))
        [worker] = first.workers.values()
        await wait_until(clock, lambda: worker.retry.quarantined("k"))
    # What the crashed give-up left: its dead letter, no resolved marker, and
    # the dead-letter partition's offset not stored past it.
    [work] = [r for r in await read_all(log, "wk-retry.g.t") if H_MARKER not in r.headers]
    letter = dead_letter_record(work, wk.ReasonCode.GAVE_UP_RETRY, "gave up", None, group="g")
    await log.append("wk-dlq.g.t", 0, [letter])
    clock.advance(3600.0)  # the attempt is due
    again = Script(clock)
    second = consumer(wrapped, clock, [Handler(Item, again)], retry_delays=[0.0])  # type: ignore[arg-type]
    async with Running(second):
        await wait_until(clock, lambda: bool(second.workers))
        [worker] = second.workers.values()
        await wait_until(clock, lambda: worker.started and not worker.retry.keys)
    assert again.handled_ns("k") == []  # dead-lettered once, never applied
    assert len(await read_all(log, "wk-dlq.g.t")) == 1
    assert not second.stats.dead_letters
