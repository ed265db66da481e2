"""design §9 in the engine: claimed records are dropped before reduction, and counted."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import wakuwaku as wk
from wakuwaku.engine import Handler
from wakuwaku.inbox import SQLiteInbox
from wakuwaku.testing import FakeClock

from .conftest import Add, Item, consumer, dead_letters, setup_topic


async def test_claimed_records_are_dropped_before_reduction_and_counted(
    tmp_path: Path, clock: FakeClock
) -> None:
    db = tmp_path / "effects.db"
    inbox = SQLiteInbox(db, "g")
    await inbox.ensure_schema()
    log = wk.MemoryLog()
    producer = await setup_topic(log)
    await producer.publish_many([Add("a", 1), Add("a", 10), Add("a", 100)])
    # The middle record was applied before (say, before a crash).
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    inbox.claim(conn, ["t/0/1"])
    conn.execute("COMMIT")
    seen: list[tuple[int, tuple[str, ...]]] = []

    def apply(run: Sequence[Add]) -> None:
        chunk = wk.current_chunk()
        with sqlite3.connect(db, isolation_level=None) as effects:
            effects.execute("BEGIN IMMEDIATE")
            claim = inbox.claim(effects, chunk.all_message_ids)
            assert claim.duplicate == []  # nothing already applied reaches the handler
            effects.execute("COMMIT")
        seen.extend((e.amount, ids) for e, ids in zip(run, chunk.message_ids, strict=True))

    c = consumer(log, clock, [Handler(Add, apply, inbox=inbox)])
    stats = await c.drain()
    # 10 was dropped before reduction: the run is [1, 100] and combines to 101,
    # never to 111 (a combined event must not mix applied and unapplied records).
    assert seen == [(101, ("t/0/0", "t/0/2"))]
    assert stats.inbox_skipped == 1
    assert await inbox.claimed(["t/0/0", "t/0/1", "t/0/2"]) == {"t/0/0", "t/0/1", "t/0/2"}


async def test_sync_handlers_on_128_threads_apply_exactly_the_amounts_the_inbox_claimed(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The configuration once blamed for a loss: 8 partitions x max_concurrency
    16, 128 pool threads, each chunk claiming its ids and adding its amounts
    on its own connection in one transaction. The sums are exactly the
    amounts of the ids the inbox holds, and it holds every id."""
    from wakuwaku.logs.sqlite import SQLiteLog

    db = tmp_path / "effects.db"
    inbox = SQLiteInbox(db, "g")
    await inbox.ensure_schema()
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE sums (key TEXT PRIMARY KEY, total INTEGER NOT NULL)")
    setup.close()
    log = SQLiteLog(tmp_path / "log.db")
    partitions, keys, count = 8, 128, 2_000
    producer = await setup_topic(log, partitions)
    events = [Item(f"k{i % keys}", i % 97 + 1) for i in range(count)]
    published = await producer.publish_many(events)
    amount_of = {f"t/{p.partition}/{p.offset}": e.n for p, e in zip(published, events, strict=True)}

    def add(run: Sequence[Item]) -> None:
        chunk = wk.current_chunk()
        with contextlib.closing(sqlite3.connect(db, timeout=30.0, isolation_level=None)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                new = set(inbox.claim(conn, chunk.all_message_ids).new)
                conn.executemany(
                    "INSERT INTO sums VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET total = total + excluded.total",
                    [
                        (e.key, e.n)
                        for e, ids in zip(run, chunk.message_ids, strict=True)
                        if ids[0] in new
                    ],
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    try:
        c = consumer(log, clock, [Handler(Item, add, max_batch=3, inbox=inbox)], max_concurrency=16)
        stats = await c.drain()
        assert [await dead_letters(log, partition=p) for p in range(partitions)] == [
            []
        ] * partitions
    finally:
        await log.close()
    check = sqlite3.connect(db)
    try:
        sums = dict(check.execute("SELECT key, total FROM sums"))
        claimed = {row[0] for row in check.execute("SELECT message_key FROM wk_inbox")}
    finally:
        check.close()
    assert claimed == set(amount_of) and stats.handled == count
    assert sum(sums.values()) == sum(amount_of[i] for i in claimed)
    expected: dict[str, int] = {}
    for e in events:
        expected[e.key] = expected.get(e.key, 0) + e.n
    assert sums == expected
