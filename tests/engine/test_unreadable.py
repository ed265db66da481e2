"""A stored record its log cannot decode (design §8, docs/logs.md "Records a log
cannot read"): read as a record marked ``wk-unreadable``, dead-lettered as
``malformed_header``, and the partition goes on; never a read that fails forever.

Each bad record is written with the log's raw client (sqlite3, redis-py,
nats-py) the way the log lays records out; the behaviour checked is the same
for every log, so one parametrized test runs every case.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku._records import H_RAW_HEADERS, H_UNREADABLE, build_headers, validate_headers
from wakuwaku.admin.dead_letters import list_dead_letters
from wakuwaku.cli import main
from wakuwaku.engine import Handler
from wakuwaku.engine._plan import RETRY_WORK_HEADERS, decode_records
from wakuwaku.engine._retry import RetryState, load_retry_state
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from ..conftest import NATS_URL, REDIS_URL
from .conftest import Item, Script, consumer, dead_letters, read_all, reason, setup_topic

_pack = msgspec.msgpack.encode
BODY = b'{"key":"x","n":99}'

# -- raw writes, one small helper per log ---------------------------------------


def _sqlite_row(log: Log, topic: str, partition: int, headers: object, body: object) -> None:
    """Insert a ``wk_records`` row at the partition's next offset, as the log does."""
    path = getattr(log, "path")  # noqa: B009 - SQLiteLog only
    with closing(sqlite3.connect(path)) as db, db:
        (topic_id,) = db.execute("SELECT id FROM wk_topics WHERE name = ?", (topic,)).fetchone()
        (off,) = db.execute(
            "SELECT next_offset FROM wk_partitions WHERE topic_id = ? AND part = ?",
            (topic_id, partition),
        ).fetchone()
        db.execute(
            "INSERT INTO wk_records (topic_id, part, off, ts, headers, body)"
            " VALUES (?, ?, ?, 1700000000.0, ?, ?)",
            (topic_id, partition, off, headers, body),
        )
        db.execute(
            "UPDATE wk_partitions SET next_offset = ? WHERE topic_id = ? AND part = ?",
            (off + 1, topic_id, partition),
        )


async def _redis_entry(log: Log, topic: str, partition: int, fields: dict[bytes, bytes]) -> None:
    """Add the stream entry ``0-<next+1>`` and bump ``next`` in ``:meta`` (the script's way)."""
    import redis.asyncio as aioredis

    tag = log._tag(topic, partition)  # type: ignore[attr-defined]
    client = aioredis.from_url(REDIS_URL)
    try:
        nxt = int(await client.hget(f"{tag}:meta", "next") or 0)
        await client.xadd(f"{tag}:s", fields, id=f"0-{nxt + 1}")  # type: ignore[arg-type]
        await client.hset(f"{tag}:meta", "next", nxt + 1)
    finally:
        await client.aclose()


async def _nats_publish(
    log: Log, topic: str, partition: int, data: bytes, headers: dict[str, str] | None
) -> None:
    """A plain JetStream publish to the partition's stream."""
    import nats

    nc = await nats.connect(NATS_URL)
    try:
        js = nc.jetstream()
        await js.publish(log.stream_name(topic, partition), data, headers=headers)  # type: ignore[attr-defined]
    finally:
        await nc.close()


Write = Callable[[Log, str, int], Awaitable[None]]


@dataclass(frozen=True)
class Bad:
    """One way of storing a record the log cannot decode."""

    write: Write
    detail: str
    """Text the dead letter's ``wk-error`` holds."""
    body: bytes = BODY
    """The body the read record keeps."""
    raw_headers: bytes | None = None
    """Its ``wk-raw-headers``; None: not checked."""


def _sqlite(headers: bytes) -> Write:
    async def write(log: Log, topic: str, partition: int) -> None:
        await asyncio.to_thread(_sqlite_row, log, topic, partition, headers, BODY)

    return write


def _redis(fields: dict[bytes, bytes]) -> Write:
    async def write(log: Log, topic: str, partition: int) -> None:
        await _redis_entry(log, topic, partition, fields)

    return write


def _nats(data: bytes, headers: dict[str, str] | None = None) -> Write:
    async def write(log: Log, topic: str, partition: int) -> None:
        await _nats_publish(log, topic, partition, data, headers)

    return write


_NOT_UTF8_NAME = b"\x81\xa2\xff\xfe\xc4\x01x"  # msgpack {"\xff\xfe": b"x"}
_NATS_CHUNKS = _pack([{}, b"", [999_999]])  # the log's large-record message, naming no chunk

SQLITE = "sqlite"
REDIS = pytest.param("redis", marks=pytest.mark.redis)
NATS = pytest.param("nats", marks=pytest.mark.nats)

CASES = [
    pytest.param(
        SQLITE,
        Bad(_sqlite(b"\xc1"), "not a msgpack map", raw_headers=b"\xc1"),
        id="sqlite-not-msgpack",
    ),
    pytest.param(
        SQLITE,
        Bad(_sqlite(_pack([1])), "not a msgpack map", raw_headers=_pack([1])),
        id="sqlite-list",
    ),
    pytest.param(
        SQLITE,
        Bad(_sqlite(_pack({"wk-v": 1})), "Expected `bytes`, got `int`"),
        id="sqlite-int-value",
    ),
    pytest.param(
        SQLITE,
        Bad(_sqlite(_pack({"wk-v": "1"})), "Expected `bytes`, got `str`"),
        id="sqlite-str-value",
    ),
    pytest.param(
        SQLITE,
        Bad(_sqlite(_NOT_UTF8_NAME), "Invalid UTF-8", raw_headers=_NOT_UTF8_NAME),
        id="sqlite-name-not-utf8",
    ),
    pytest.param(
        "redis",
        Bad(
            _redis({b"t": b"1700000000000", b"b": BODY, b":\xff": b"x"}),
            "header field name of the stream entry is not UTF-8",
            raw_headers=_pack([b":\xff", b"x"]),
        ),
        marks=pytest.mark.redis,
        id="redis-name-not-utf8",
    ),
    pytest.param(
        "redis",
        Bad(
            _redis({b"t": b"1700000000000", b":wk-v": b"1"}),
            "the stream entry has no 'b' field",
            body=_pack([b"t", b"1700000000000", b":wk-v", b"1"]),
        ),
        marks=pytest.mark.redis,
        id="redis-no-body",
    ),
    pytest.param(
        "redis",
        Bad(_redis({b"b": BODY, b":wk-v": b"1"}), "the stream entry has no 't' field"),
        marks=pytest.mark.redis,
        id="redis-no-time",
    ),
    pytest.param(
        "nats",
        Bad(_nats(_NATS_CHUNKS), "chunk stream", body=_NATS_CHUNKS),
        marks=pytest.mark.nats,
        id="nats-missing-chunks",
    ),
]


@pytest.mark.parametrize(("log", "bad"), CASES, indirect=["log"])
async def test_a_record_the_log_cannot_decode_is_dead_lettered_and_the_partition_goes_on(
    log: Log, clock: FakeClock, bad: Bad
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    await bad.write(log, "t", 0)
    await producer.publish_many([Item("a", 2), Item("b", 3)])

    (read,) = [r for r in await read_all(log, "t") if r.offset == 1]
    assert H_UNREADABLE in read.headers and read.body == bad.body
    if bad.raw_headers is not None:
        assert read.headers[H_RAW_HEADERS] == bad.raw_headers

    script = Script(clock)
    await consumer(log, clock, [Handler(Item, script)]).drain()
    assert script.handled_ns() == [1, 2, 3]
    (dead,) = await dead_letters(log)
    assert reason(dead) == "malformed_header"
    error = dead.headers["wk-error"].decode()
    assert "the log could not read the stored record" in error and bad.detail in error
    assert json.loads(dead.headers["wk-src"])[2] == [1]
    assert dead.body == bad.body  # kept, never dropped


# -- the read paths that are not a consumer's poll --------------------------------

ONE_PER_LOG = [
    pytest.param(SQLITE, Bad(_sqlite(b"\xc1"), "not a msgpack map"), id="sqlite"),
    pytest.param(
        "redis",
        Bad(
            _redis({b"t": b"1700000000000", b":wk-v": b"1"}),
            "no 'b' field",
            body=_pack([b"t", b"1700000000000", b":wk-v", b"1"]),
        ),
        marks=pytest.mark.redis,
        id="redis",
    ),
    pytest.param(
        "nats",
        Bad(_nats(_NATS_CHUNKS), "chunk stream", body=_NATS_CHUNKS),
        marks=pytest.mark.nats,
        id="nats",
    ),
]


@pytest.mark.parametrize(("log", "bad"), ONE_PER_LOG, indirect=["log"])
async def test_retry_state_load_dead_letter_listing_and_tail_take_an_unreadable_record(
    log: Log, bad: Bad, capsys: pytest.CaptureFixture[str]
) -> None:
    retry, dlq = "wk-retry.g.t", "wk-dlq.g.t"
    await setup_topic(log)
    for topic in (retry, dlq):
        await log.create_topic(topic, 1, derived_from="t")
        await bad.write(log, topic, 0)

    state = RetryState(lambda failures: 1.0, group="g")
    await load_retry_state(log, "g", retry, 0, state)
    assert not state.keys
    assert [(o, k) for o, k, _ in state.broken] == [(0, "")]
    assert "the log could not read it" in state.broken[0][2] and bad.detail in state.broken[0][2]

    (letter,) = await list_dead_letters(log, "t", group="g")
    assert letter.offset == 0 and letter.body == bad.body
    assert any("the log could not read this record" in p for p in letter.problems)

    capsys.readouterr()
    code = await asyncio.to_thread(main, ["tail", dlq, "--from-beginning", "--log", log.url])
    out, err = capsys.readouterr()
    assert code == 0, err
    (line,) = [json.loads(text) for text in out.splitlines()]
    assert line["offset"] == 0 and bad.detail in line["headers"][H_UNREADABLE]


# -- NATS: a plain message is a plain record ---------------------------------------


@pytest.mark.parametrize("log", [NATS], indirect=True)
async def test_a_plain_nats_message_is_read_with_its_nats_headers(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    headers = {k: v.decode() for k, v in build_headers(wk.event_type(Item), "a").items()}
    await _nats_publish(log, "t", 0, msgspec.json.encode(Item("a", 2)), headers)
    await _nats_publish(log, "t", 0, b'{"k":"x"}', {"wk-v": "1"})  # the fresh user's message
    await _nats_publish(log, "t", 0, b"not the log's envelope", None)
    await producer.publish(Item("a", 5))

    records = await read_all(log, "t")
    assert [r.offset for r in records] == [0, 1, 2, 3, 4]
    assert records[1].headers == {k: v.encode() for k, v in headers.items()}
    assert records[2].body == b'{"k":"x"}' and records[2].headers == {"wk-v": b"1"}
    assert records[3].headers == {} and records[3].body == b"not the log's envelope"

    script = Script(clock)
    await consumer(log, clock, [Handler(Item, script)]).drain()
    assert script.handled_ns() == [1, 2, 5]
    dead = await dead_letters(log)
    assert [reason(r) for r in dead] == ["malformed_header", "malformed_header"]
    assert [r.body for r in dead] == [b'{"k":"x"}', b"not the log's envelope"]
    assert "wk-type is missing" in dead[0].headers["wk-error"].decode()
    assert "wk-v is missing" in dead[1].headers["wk-error"].decode()


# -- the reserved header -----------------------------------------------------------


async def test_a_producer_s_wk_unreadable_header_is_refused_as_malformed(
    memory_log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(memory_log)
    headers = build_headers(wk.event_type(Item), "a")
    forged = {**headers, H_UNREADABLE: b"nothing wrong, really"}
    await memory_log.append("t", 0, [(forged, msgspec.json.encode(Item("a", 1)))])
    await producer.publish(Item("a", 2))
    script = Script(clock)
    await consumer(memory_log, clock, [Handler(Item, script)]).drain()
    assert script.handled_ns() == [2]
    (dead,) = await dead_letters(memory_log)
    assert reason(dead) == "malformed_header"
    assert H_UNREADABLE in dead.headers["wk-error"].decode()
    types = {"test.item": wk.event_type(Item)}
    checked = validate_headers(forged, types)
    assert isinstance(checked, wk.InvalidHeaders) and checked.reason == "malformed_header"


def test_the_retry_topic_s_short_decode_path_does_not_take_an_unreadable_record() -> None:
    etype = wk.event_type(Item)
    headers: dict[str, Any] = dict.fromkeys(RETRY_WORK_HEADERS, b"")
    headers.update(build_headers(etype, "a"))
    headers.update(
        {
            "wk-failed-at": b"1700000000000",
            "wk-due-at": b"1700000001000",
            "wk-error": b"e",
            "wk-group": b"g",
            "wk-src": b'["t",0,[0],["t/0/0"]]',
        }
    )
    body = msgspec.json.encode(Item("a", 1))
    good = wk.Record(0, headers, body)
    bad = wk.Record(1, {**headers, H_UNREADABLE: b"x"}, body)
    items, rejects = decode_records([good, bad], "t", 0, {"test.item": etype}, from_retry=True)
    assert [i.record.offset for i in items] == [0]
    assert [(r.record.offset, r.reason) for r in rejects] == [(1, "malformed_header")]
