"""A standalone consumer that test_crash.py SIGKILLs at chosen points (design §7, §9).

Usage::

    python crash_consumer.py LOG_FILE PROJECTION SUFFIX

It reads topic ``amounts`` (2 partitions) of the log in ``LOG_FILE`` in
batches of 10 records. For every record, ONE transaction of the projection
database (a SQLite file path or a ``postgresql://`` DSN) claims the record's
inbox key and, when the claim is new, adds the record's value to a running
sum (else counts a duplicate). After each batch it commits the log offset.
It exits 0 when every partition is consumed.

Environment:

- ``WK_KILL_AT=N`` and ``WK_KILL_PHASE``: at the N-th record of this run,
  SIGKILL itself either ``after`` the projection commit (before the offset
  commit, so the batch is delivered again) or ``mid`` transaction (after the
  claim and the addition, before the commit);
- ``WK_NO_INBOX=1``: add every record without claiming (the negative
  control: the sum must come out wrong).

The log is :class:`wakuwaku.logs.sqlite.SQLiteLog` when that module exists,
otherwise a plain SQLite table of messages (:class:`PlainLog`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from typing import Any

from wakuwaku._records import Record
from wakuwaku.inbox import InboxKey, SQLiteInbox, record_keys

TOPIC = "amounts"
PARTITIONS = 2
GROUP = "summer"
BATCH = 10


class PlainLog:
    """The few log calls this script needs, over a plain SQLite table."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS messages (topic TEXT, part INTEGER, "
            "off INTEGER, body BLOB, PRIMARY KEY (topic, part, off))"
        )
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS offsets (grp TEXT, topic TEXT, "
            "part INTEGER, off INTEGER, PRIMARY KEY (grp, topic, part))"
        )

    async def create_topic(self, topic: str, partitions: int) -> None:
        return None

    async def append(
        self, topic: str, partition: int, records: list[tuple[dict[str, bytes], bytes]]
    ) -> list[int]:
        start = self.conn.execute(
            "SELECT count(*) FROM messages WHERE topic = ? AND part = ?", (topic, partition)
        ).fetchone()[0]
        self.conn.executemany(
            "INSERT INTO messages VALUES (?, ?, ?, ?)",
            [(topic, partition, start + i, body) for i, (_, body) in enumerate(records)],
        )
        return list(range(start, start + len(records)))

    async def read(
        self, topic: str, partition: int, offset: int, max_records: int = 500
    ) -> list[Record]:
        rows = self.conn.execute(
            "SELECT off, body FROM messages WHERE topic = ? AND part = ? AND off >= ? "
            "ORDER BY off LIMIT ?",
            (topic, partition, offset, max_records),
        ).fetchall()
        return [Record(off, {}, body) for off, body in rows]

    async def commit(self, group: str, topic: str, partition: int, offset: int) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO offsets VALUES (?, ?, ?, ?)", (group, topic, partition, offset)
        )

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        row = self.conn.execute(
            "SELECT off FROM offsets WHERE grp = ? AND topic = ? AND part = ?",
            (group, topic, partition),
        ).fetchone()
        return None if row is None else int(row[0])

    async def close(self) -> None:
        self.conn.close()


def open_log(path: str) -> Any:
    """SQLiteLog when the module exists, else :class:`PlainLog`."""
    try:
        from wakuwaku.logs.sqlite import SQLiteLog
    except ImportError:
        return PlainLog(path)
    return SQLiteLog(path)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class SQLiteProjection:
    def __init__(self, path: str, suffix: str) -> None:
        self.path = path
        self.inbox = SQLiteInbox(path, GROUP, table=f"inbox_{suffix}")
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)

    async def setup(self) -> None:
        await self.inbox.ensure_schema()
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS total (id INTEGER PRIMARY KEY, "
            "sum INTEGER, applied INTEGER, duplicates INTEGER)"
        )
        self.conn.execute("INSERT OR IGNORE INTO total VALUES (1, 0, 0, 0)")

    async def apply(
        self, keys: list[InboxKey], value: int, use_inbox: bool, kill_mid: bool
    ) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        new = self.inbox.claim(conn, keys).new if use_inbox else [k.message_key for k in keys]
        if new:
            conn.execute("UPDATE total SET sum = sum + ?, applied = applied + 1", (value,))
        else:
            conn.execute("UPDATE total SET duplicates = duplicates + 1")
        if kill_mid:
            die()
        conn.execute("COMMIT")

    async def close(self) -> None:
        self.conn.close()


class PostgresProjection:
    def __init__(self, dsn: str, suffix: str) -> None:
        from wakuwaku.inbox.postgres import PostgresInbox

        self.dsn = dsn
        self.total = f"wk_crash_total_{suffix}"
        self.inbox = PostgresInbox(dsn, GROUP, table=f"wk_crash_inbox_{suffix}")
        self.conn: Any = None

    async def setup(self) -> None:
        import psycopg

        await self.inbox.ensure_schema()
        self.conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        await self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.total} (id integer PRIMARY "
            "KEY, sum bigint, applied integer, duplicates integer)"
        )
        await self.conn.execute(
            f"INSERT INTO {self.total} VALUES (1, 0, 0, 0) ON CONFLICT DO NOTHING"
        )

    async def apply(
        self, keys: list[InboxKey], value: int, use_inbox: bool, kill_mid: bool
    ) -> None:
        conn = self.conn
        async with conn.transaction():
            if use_inbox:
                new = (await self.inbox.claim(conn, keys)).new
            else:
                new = [k.message_key for k in keys]
            if new:
                await conn.execute(
                    f"UPDATE {self.total} SET sum = sum + %s, applied = applied + 1", (value,)
                )
            else:
                await conn.execute(f"UPDATE {self.total} SET duplicates = duplicates + 1")
            if kill_mid:
                die()

    async def close(self) -> None:
        await self.conn.close()


async def main(log_path: str, projection_target: str, suffix: str) -> None:
    kill_at = int(os.environ.get("WK_KILL_AT", "0"))
    phase = os.environ.get("WK_KILL_PHASE", "after")
    use_inbox = os.environ.get("WK_NO_INBOX") != "1"
    projection: SQLiteProjection | PostgresProjection
    if projection_target.startswith("postgresql://"):
        projection = PostgresProjection(projection_target, suffix)
    else:
        projection = SQLiteProjection(projection_target, suffix)
    await projection.setup()
    log = open_log(log_path)
    seen = 0
    try:
        for partition in range(PARTITIONS):
            while True:
                offset = await log.committed(GROUP, TOPIC, partition) or 0
                records = await log.read(TOPIC, partition, offset, max_records=BATCH)
                if not records:
                    break
                for record in records:
                    seen += 1
                    keys = record_keys(TOPIC, partition, record)
                    await projection.apply(
                        keys,
                        int(record.body),
                        use_inbox,
                        kill_mid=seen == kill_at and phase == "mid",
                    )
                    if seen == kill_at and phase == "after":
                        die()
                await log.commit(GROUP, TOPIC, partition, records[-1].offset + 1)
    finally:
        await log.close()
        await projection.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
