"""Throughput of the SQLite log next to raw sqlite3 on the same rows, in one run.

For N small records (a ~100-byte JSON body and the usual ``wk-*`` headers)
it measures:

- append: ``SQLiteLog.append`` in batches, against ``executemany`` INSERTs
  of the same rows (same columns, same blob sizes, same table layout, one
  transaction per batch) with plain sqlite3;
- read: ``SQLiteLog.read`` from offset 0 to the end in pages, against one
  raw ``SELECT`` of the same rows fetched in pages of the same size (rows
  as tuples, headers left as msgpack blobs: what the library adds is the
  ``Record`` objects, header decoding and the worker-thread hop).

Both sides use WAL and the same ``synchronous`` setting. The target
is read >= 60 % of the raw select. Run::

    .venv/bin/python benchmarks/bench_sqlite_log.py [--records N] [--batch B] [--page P]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sqlite3
import tempfile
import time
from collections.abc import Sequence

import msgspec

from _args import positive_int
from wakuwaku._records import WIRE_VERSION
from wakuwaku.logs._sqlite_file import schema_statements
from wakuwaku.logs.sqlite import SQLiteLog

TOPIC = "bench"


Rows = list[tuple[dict[str, bytes], bytes]]


def make_rows(count: int) -> Rows:
    """``count`` records: the producer's usual headers and a ~100-byte JSON body."""
    rows = []
    for i in range(count):
        key = f"sku-{i % 1000:05d}"
        headers = {
            "wk-v": WIRE_VERSION,
            "wk-type": b"inventory.stock-adjusted",
            "wk-key": key.encode(),
            "wk-alg": b"associative",
        }
        body = msgspec.json.encode(
            {
                "sku": key,
                "delta": i % 17 - 8,
                "warehouse": "tokyo-east-3",
                "seq": i,
                "note": "restock after the weekly count",
            }
        )
        rows.append((headers, body))
    return rows


async def lib_append(path: str, rows: Rows, batch: int, fsync: bool) -> float:
    async with SQLiteLog(path, fsync=fsync) as log:
        await log.create_topic(TOPIC, 1)
        started = time.perf_counter()
        for i in range(0, len(rows), batch):
            await log.append(TOPIC, 0, rows[i : i + batch])
        return time.perf_counter() - started


async def lib_read(path: str, count: int, page: int) -> float:
    async with SQLiteLog(path) as log:
        await log.describe_topic(TOPIC)  # open the file outside the timed part
        started = time.perf_counter()
        offset = got = 0
        while True:
            records = await log.read(TOPIC, 0, offset, max_records=page)
            if not records:
                break
            got += len(records)
            offset = records[-1].offset + 1
        elapsed = time.perf_counter() - started
    assert got == count, (got, count)
    return elapsed


def raw_connect(path: str, fsync: bool) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
    return db


def raw_append(path: str, rows: Rows, batch: int, fsync: bool) -> float:
    db = raw_connect(path, fsync)
    for statement in schema_statements():
        db.execute(statement)
    encode = msgspec.msgpack.encode
    started = time.perf_counter()
    for i in range(0, len(rows), batch):
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO wk_records (topic_id, part, off, ts, headers, body)"
            " VALUES (1, 0, ?, ?, ?, ?)",
            [(i + j, now, encode(h), b) for j, (h, b) in enumerate(rows[i : i + batch])],
        )
        db.execute("COMMIT")
    elapsed = time.perf_counter() - started
    db.close()
    return elapsed


def raw_read(path: str, count: int, page: int) -> float:
    db = raw_connect(path, True)
    started = time.perf_counter()
    offset = got = 0
    while True:
        found = db.execute(
            "SELECT off, headers, body, ts FROM wk_records"
            " WHERE topic_id = 1 AND part = 0 AND off >= ? ORDER BY off LIMIT ?",
            (offset, page),
        ).fetchall()
        if not found:
            break
        got += len(found)
        offset = found[-1][0] + 1
    elapsed = time.perf_counter() - started
    db.close()
    assert got == count, (got, count)
    return elapsed


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--records", type=positive_int, default=200_000)
    parser.add_argument("--batch", type=positive_int, default=500, help="records per append")
    parser.add_argument("--page", type=positive_int, default=500, help="max_records per read")
    parser.add_argument(
        "--repeat", type=positive_int, default=3, help="runs per figure; the best counts"
    )
    parser.add_argument("--no-fsync", action="store_true", help="synchronous=NORMAL on both sides")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    n, fsync = args.records, not args.no_fsync
    rows = make_rows(n)
    body = sum(len(b) for _, b in rows) / n
    times: dict[str, list[float]] = {
        "lib append": [],
        "raw append": [],
        "lib read": [],
        "raw read": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        lib_db, raw_db = os.path.join(tmp, "lib.db"), os.path.join(tmp, "raw.db")
        for run in range(args.repeat):
            for name in (lib_db, raw_db):
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(name + suffix):
                        os.remove(name + suffix)
            times["raw append"].append(raw_append(raw_db, rows, args.batch, fsync))
            times["lib append"].append(asyncio.run(lib_append(lib_db, rows, args.batch, fsync)))
            if run == args.repeat - 1:
                del rows  # read with the process as a consumer has it, not holding the input
                gc.collect()
        for _ in range(args.repeat):
            times["raw read"].append(raw_read(raw_db, n, args.page))
            times["lib read"].append(asyncio.run(lib_read(lib_db, n, args.page)))
    best = {name: min(values) for name, values in times.items()}
    print(
        f"{n} records, body {body:.0f} bytes, 4 wk-* headers, append batch {args.batch}, "
        f"read max_records {args.page}, synchronous={'FULL' if fsync else 'NORMAL'}, "
        f"best of {args.repeat}"
    )
    print(f"{'':8}{'SQLiteLog rec/s':>18}{'raw sqlite3 rec/s':>20}{'ratio':>8}")
    for what in ("append", "read"):
        lib, raw = best[f"lib {what}"], best[f"raw {what}"]
        print(f"{what:8}{n / lib:>18,.0f}{n / raw:>20,.0f}{raw / lib:>8.0%}")
    ratio = best["raw read"] / best["lib read"]
    verdict = "meets" if ratio >= 0.60 else "MISSES"
    print(f"read ratio {ratio:.1%} {verdict} the target of 60 %")


if __name__ == "__main__":
    main()
