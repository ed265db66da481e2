"""design §9 in the engine: claimed records are dropped before reduction, and counted."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import wakuwaku as wk
from wakuwaku.engine import Handler
from wakuwaku.inbox import SQLiteInbox
from wakuwaku.testing import FakeClock

from .conftest import Add, consumer, setup_topic


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
