"""The SQLite log's record rows: how a record goes into ``wk_records`` and comes back.

Owns the row format and the two hot loops over it:

- **encoding** (:func:`encode_record`): the headers as a msgpack map of str
  to bin and the body, both bound as bytearrays;
- **inserting** (:func:`insert`) one partition's records inside the
  caller's transaction: the partition's ``next_offset`` read and bumped,
  the rows written by multi-row INSERT statements;
- **selecting and decoding** (:func:`select`, :func:`fetch`): rows in
  offset order, turned into :class:`~wakuwaku.Record` objects a small chunk
  at a time, equal headers (except those with ``wk-src``) decoded once per
  fetch, a row whose columns are not what :func:`encode_record` writes
  kept whole and marked ``wk-unreadable`` (design §8).

It opens no transaction and knows no topic names, group offsets or leases.
May call: msgspec, :mod:`wakuwaku._records`, :mod:`._base` (the record
check) and :mod:`._sqlite_file` (:class:`~._sqlite_file.TopicGone`).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Mapping

import msgspec

from .._records import H_SRC, Record, unreadable_record
from ._base import check_record
from ._sqlite_file import TopicGone

__all__ = ("Row", "encode_record", "fetch", "insert", "select")

_encode_headers_into = msgspec.msgpack.Encoder().encode_into
_encode_headers = msgspec.msgpack.Encoder().encode
_decode_headers = msgspec.msgpack.Decoder(dict[str, bytes]).decode
_EMPTY_HEADERS = _encode_headers({})

_READ_SQL = (
    "SELECT off, headers, body, ts FROM wk_records"
    " WHERE topic_id = ? AND part = ? AND off >= ? ORDER BY off LIMIT ?"
)

_ROWS_PER_INSERT = 64
"""Rows one INSERT statement writes at most (6 parameters a row: far below
SQLite's oldest limit of 999 parameters)."""

_CHUNK = 250
"""Rows :func:`fetch` takes from the cursor at a time."""

Row = tuple[bytearray, bytearray]
"""An encoded record as it is bound: ``(msgpack headers, body)``."""


def encode_record(headers: Mapping[str, bytes], body: bytes) -> Row:
    """``(msgpack headers, body)`` of one record, checked by :func:`check_record`.

    Both are bytearrays: the ``sqlite3`` module binds a bytearray as a blob
    at once, while it looks a ``bytes`` value up in its adapter registry
    first (CPython's ``_need_adapt`` lists ``bytearray``, not ``bytes``),
    which costs more than the copy: half the binding time of a row (and
    every record of a failing key is written twice).
    """
    checked = check_record(headers, body)
    encoded = bytearray()
    if checked:
        _encode_headers_into(checked, encoded)
    else:
        encoded += _EMPTY_HEADERS
    return encoded, bytearray(body)


def insert(
    db: sqlite3.Connection,
    topic_id: int,
    partition: int,
    encoded: list[Row],
    now: float,
) -> list[int]:
    """Insert records inside the caller's transaction; returns their offsets.

    :raises TopicGone: when the partition's row is gone (another connection
        deleted the topic since its id was cached).
    """
    if not encoded:
        return []
    row = db.execute(
        "SELECT next_offset FROM wk_partitions WHERE topic_id = ? AND part = ?",
        (topic_id, partition),
    ).fetchone()
    if row is None:  # another connection deleted the topic since it was cached
        raise TopicGone(topic_id)
    first = int(row[0])
    # Rows go in by statements of up to _ROWS_PER_INSERT rows each (one
    # VALUES list): one statement step per 64 rows instead of one per
    # row, which the retry path of a failing key pays twice per record.
    done = 0
    count = len(encoded)
    while done < count:
        rows = min(_ROWS_PER_INSERT, 1 << ((count - done).bit_length() - 1))
        args: list[object] = []
        for i in range(done, done + rows):
            headers, body = encoded[i]
            args += (topic_id, partition, first + i, now, headers, body)
        db.execute(_insert_sql(rows), args)
        done += rows
    db.execute(
        "UPDATE wk_partitions SET next_offset = ? WHERE topic_id = ? AND part = ?",
        (first + len(encoded), topic_id, partition),
    )
    return list(range(first, first + len(encoded)))


@functools.cache
def _insert_sql(rows: int) -> str:
    """An INSERT of ``rows`` records, six anonymous parameters each.

    Anonymous, not numbered: the ``sqlite3`` module of Python 3.12+ asks
    SQLite for every parameter's name, a linear search for numbered ones.
    Called with powers of two up to :data:`_ROWS_PER_INSERT` only, so the
    connection's statement cache holds a few of them."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?)"] * rows)
    return f"INSERT INTO wk_records (topic_id, part, off, ts, headers, body) VALUES {values}"


def select(
    db: sqlite3.Connection, topic_id: int, partition: int, offset: int, limit: int
) -> sqlite3.Cursor:
    """A cursor over up to ``limit`` rows of one partition from ``offset`` on, in
    offset order, for :func:`fetch`; closing it ends the read snapshot."""
    return db.execute(_READ_SQL, (topic_id, partition, offset, limit))


def fetch(cursor: sqlite3.Cursor, count: int) -> list[Record]:
    """Up to ``count`` records from ``cursor``, built a small chunk at a time.

    Records of one fetch whose encoded headers are byte-for-byte equal share
    one decoded headers dict (the same key and type repeat a lot): fewer
    objects to build, and a consumer that checks headers checks each distinct
    dict once. Records and their headers are read-only.

    Headers that carry ``wk-src`` (retry and dead-letter records) are the
    exception: each names its own main-topic offsets, so they are never
    equal, and a retry partition's million records filled the shared dict
    for nothing (10 % of a fetch). They are not kept, and the row after
    one is decoded without looking it up (runs of them come together); a
    row without ``wk-src`` is still shared.
    """
    out: list[Record] = []
    shared: dict[bytes, dict[str, bytes]] = {}
    while len(out) < count:
        rows = cursor.fetchmany(min(_CHUNK, count - len(out)))
        if not rows:
            break
        out += _records(rows, shared)
    return out


def _records(
    rows: list[tuple[int, bytes, bytes, float]], shared: dict[bytes, dict[str, bytes]]
) -> list[Record]:
    """Records of ``(off, headers, body, ts)`` rows; ``shared`` maps encoded
    headers without ``wk-src`` to their decoded dict (see :func:`fetch`)."""
    out: list[Record] = []
    append = out.append
    get = shared.get
    decode = _decode_headers
    unique = False  # the last headers decoded carry wk-src
    for off, raw, body, ts in rows:
        headers = None if unique else get(raw)
        if headers is None:
            try:
                headers = decode(raw)
            except (msgspec.DecodeError, TypeError) as exc:
                append(_unreadable(off, raw, body, ts, exc))
                continue
            unique = H_SRC in headers
            if not unique:  # (an equal row is there when this one was not looked up)
                headers = shared.setdefault(raw, headers)
        append(Record(off, headers, body, ts))
    return out


def _unreadable(off: int, raw: object, body: object, ts: object, exc: Exception) -> Record:
    """The record of a row whose headers blob (or another column) is not what
    :func:`encode_record` writes: kept whole, marked ``wk-unreadable`` (design §8)."""
    what = f"SQLite log: the stored headers are not a msgpack map of str to bytes ({exc})"
    raw_headers = bytes(raw) if isinstance(raw, bytes | bytearray | memoryview) else None
    if raw_headers is None and raw is not None:
        what = f"SQLite log: the headers column holds a {type(raw).__name__}, not a blob"
        raw_headers = str(raw).encode("utf-8", "replace")
    if not isinstance(body, bytes | bytearray | memoryview):
        body = b"" if body is None else str(body).encode("utf-8", "replace")
    stamp = float(ts) if isinstance(ts, int | float) else 0.0
    return unreadable_record(int(off), what, bytes(body), raw_headers, stamp)
