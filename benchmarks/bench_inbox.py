"""Claims per second of the inbox, next to a plain INSERT of the same rows, in one run.

For SQLite and PostgreSQL, and for chunks of 1 and of 100 keys, it measures:

- ``claim (new)``: ``inbox.claim`` of keys never seen, one transaction per
  chunk (``BEGIN`` / claim / ``COMMIT``), as a handler does it;
- ``claim (duplicate)``: the same keys claimed again (every one a duplicate);
- ``plain INSERT``: the baseline, the same rows inserted into a table of the
  same layout with the same statement shape but without ``ON CONFLICT`` and
  ``RETURNING``, one transaction per chunk, rows in the claim's (sorted) order.

Each measurement starts from fresh tables (a fresh SQLite file) and is run
``--repeat`` times (default 3); the fastest run is reported.

SQLite runs in WAL mode with ``synchronous=NORMAL`` on both sides (a commit
is not an fsync), PostgreSQL with the server's defaults. Run::

    .venv/bin/python benchmarks/bench_inbox.py [--keys N] [--dsn postgresql://...] [--no-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _args import positive_int
from wakuwaku.inbox import InboxKey, SQLiteInbox

DEFAULT_DSN = os.environ.get("WAKUWAKU_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
GROUP = "bench"


def make_keys(count: int, prefix: str) -> list[InboxKey]:
    return [InboxKey.for_message(f"{prefix}-orders", i % 8, i) for i in range(count)]


def chunked(keys: Sequence[InboxKey], size: int) -> list[Sequence[InboxKey]]:
    return [keys[i : i + size] for i in range(0, len(keys), size)]


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>12,.0f} keys/s"


# -- SQLite ---------------------------------------------------------------------------------


def sqlite_baseline_sql(table: str, rows: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?, ?, 'done', 0)"] * rows)
    return (
        f"INSERT INTO {table} (consumer_group, message_key, claimed_at, source_topic, "
        f"source_partition, source_offset, status, attempts) VALUES {values}"
    )


def bench_sqlite(keys: int, chunk: int) -> list[tuple[str, float, int]]:
    """One measurement of each kind, each in a fresh database file."""
    chunks = chunked(make_keys(keys, f"c{chunk}"), chunk)
    with tempfile.TemporaryDirectory() as directory:
        plain_db, inbox_db = Path(directory) / "plain.db", Path(directory) / "inbox.db"
        inbox = SQLiteInbox(inbox_db, GROUP)
        base = SQLiteInbox(plain_db, GROUP)  # the same table layout, for the baseline
        asyncio.run(inbox.ensure_schema())
        asyncio.run(base.ensure_schema())

        def transactions(
            path: Path,
            work: Callable[[sqlite3.Connection, Sequence[InboxKey]], Any],
            repeat: int = 1,
        ) -> list[float]:
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            timings = []
            for _ in range(repeat):
                started = time.perf_counter()
                for part in chunks:
                    conn.execute("BEGIN IMMEDIATE")
                    work(conn, part)
                    conn.execute("COMMIT")
                timings.append(time.perf_counter() - started)
            conn.close()
            return timings

        def plain(conn: sqlite3.Connection, part: Sequence[InboxKey]) -> None:
            now = time.time()  # claimed_at as the claim writes it (its index grows at the end)
            params: list[Any] = []
            for k in sorted(part, key=lambda k: k.message_key):  # the claim's order
                params += [GROUP, k.message_key, now, k.topic, k.partition, k.offset]
            conn.execute(sqlite_baseline_sql(base.table, len(part)), params)

        def claim(conn: sqlite3.Connection, part: Sequence[InboxKey]) -> None:
            inbox.claim(conn, part)

        plain_time = transactions(plain_db, plain)[0]
        new_time, duplicate_time = transactions(inbox_db, claim, repeat=2)
    return [
        ("plain INSERT", plain_time, keys),
        ("claim (new)", new_time, keys),
        ("claim (duplicate)", duplicate_time, keys),
    ]


# -- PostgreSQL -----------------------------------------------------------------------------


async def bench_postgres(dsn: str, keys: int, chunk: int) -> list[tuple[str, float, int]]:
    import psycopg

    from wakuwaku.inbox.postgres import PostgresInbox

    suffix = uuid.uuid4().hex[:10]
    inbox = PostgresInbox(dsn, GROUP, table=f"wk_bench_{suffix}")
    base = PostgresInbox(dsn, GROUP, table=f"wk_bplain_{suffix}")
    await inbox.ensure_schema()
    await base.ensure_schema()
    plain_sql = (
        f"INSERT INTO {base.table} (consumer_group, message_key, claimed_at, source_topic, "
        "source_partition, source_offset, status, attempts) "
        "SELECT %(grp)s, k.message_key, %(now)s, k.topic, k.part, k.off, 'done', 0 "
        "FROM unnest(%(keys)s::text[], %(topics)s::text[], %(parts)s::integer[], "
        "%(offs)s::bigint[]) WITH ORDINALITY AS k(message_key, topic, part, off, ord) "
        "ORDER BY k.ord"
    )
    chunks = chunked(make_keys(keys, f"c{chunk}"), chunk)
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:

        async def plain(part: Sequence[InboxKey]) -> None:
            part = sorted(part, key=lambda k: k.message_key)  # the claim's order
            await conn.execute(
                plain_sql,
                {
                    "grp": GROUP,
                    "now": time.time(),
                    "keys": [k.message_key for k in part],
                    "topics": [k.topic for k in part],
                    "parts": [k.partition for k in part],
                    "offs": [k.offset for k in part],
                },
            )

        async def claim(part: Sequence[InboxKey]) -> None:
            await inbox.claim(conn, part)

        async def transactions(work: Callable[[Sequence[InboxKey]], Any]) -> float:
            started = time.perf_counter()
            for part in chunks:
                async with conn.transaction():
                    await work(part)
            return time.perf_counter() - started

        return [
            ("plain INSERT", await transactions(plain), keys),
            ("claim (new)", await transactions(claim), keys),
            ("claim (duplicate)", await transactions(claim), keys),
        ]
    finally:
        await conn.execute(
            f"DROP TABLE IF EXISTS {inbox.table}, {inbox.dead_table}, "
            f"{base.table}, {base.dead_table}"
        )
        await conn.close()


def report(backend: str, chunk: int, results: list[tuple[str, float, int]]) -> None:
    baseline = results[0][2] / results[0][1]
    for name, seconds, count in results:
        share = (count / seconds) / baseline
        print(
            f"{backend:<10} chunk={chunk:<4} {name:<18} {rate(count, seconds)}"
            f"   {share:6.0%} of plain INSERT"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=positive_int, default=20_000, help="keys per measurement")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL DSN")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument(
        "--repeat",
        type=positive_int,
        default=3,
        help="runs per measurement; the fastest is reported",
    )
    args = parser.parse_args(argv)
    if args.keys < 4:
        parser.error(
            f"--keys must be 4 or more, got {args.keys}: chunks of 1 claim --keys / 4 keys"
        )
    return args


def main() -> None:
    args = parse_args()
    for chunk in (1, 100):
        # Chunks of 1 are one transaction per key: fewer keys keep the run short.
        count = args.keys // 4 if chunk == 1 else args.keys
        runs = [bench_sqlite(count, chunk) for _ in range(args.repeat)]
        report("sqlite", chunk, [min(r[i] for r in runs) for i in range(3)])
    if args.no_postgres:
        return
    try:
        for chunk in (1, 100):
            count = args.keys // 4 if chunk == 1 else args.keys
            runs = [asyncio.run(bench_postgres(args.dsn, count, chunk)) for _ in range(args.repeat)]
            report("postgres", chunk, [min(r[i] for r in runs) for i in range(3)])
    except (ImportError, OSError) as exc:
        print(f"postgres   skipped: {exc}")
    except Exception as exc:
        if type(exc).__module__.startswith("psycopg"):
            print(f"postgres   skipped: {type(exc).__name__}")
            return
        raise


if __name__ == "__main__":
    main()
