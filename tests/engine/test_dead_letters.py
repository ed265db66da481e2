"""SPEC 8: every record that never reaches a handler is dead-lettered, one test per reason."""

from __future__ import annotations

import logging

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku._records import build_headers, decode_source
from wakuwaku.engine import Handler
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import (
    Fragile,
    Item,
    Put,
    Script,
    consumer,
    dead_letters,
    read_all,
    reason,
    setup_topic,
)

GOOD = build_headers(wk.event_type(Item), "a")
BODY = b'{"key":"a","n":7}'


def without(name: str) -> dict[str, bytes]:
    headers = dict(GOOD)
    del headers[name]
    return headers


def with_(name: str, value: bytes) -> dict[str, bytes]:
    headers = dict(GOOD)
    headers[name] = value
    return headers


async def run_one(log: Log, clock: FakeClock, headers: dict[str, bytes],
                  body: bytes = BODY) -> tuple[Script, list[wk.Record], wk.engine.Consumer]:
    producer = await setup_topic(log)
    await log.append("t", 0, [(headers, body)])
    await producer.publish(Item("a", 8))
    script = Script(clock)
    c = consumer(log, clock, [Handler(Item, script), Handler(Put, Script(clock))])
    await c.drain()
    return script, await dead_letters(log), c


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(without("wk-v"), id="no-version"),
        pytest.param(with_("wk-v", b"2"), id="unknown-version"),
        pytest.param(without("wk-type"), id="no-type"),
        pytest.param(with_("wk-type", b""), id="empty-type"),
        pytest.param(without("wk-key"), id="no-key"),
        pytest.param(with_("wk-key", b"\xff\xfe"), id="key-not-utf8"),
        pytest.param(with_("wk-props", b"{not json"), id="props-not-json"),
        pytest.param(with_("wk-props", b'{"tenant": 5}'), id="props-not-strings"),
        pytest.param(without("wk-alg"), id="no-algebra"),
        pytest.param(with_("wk-alg", b"commutative"), id="unknown-algebra"),
    ],
)
async def test_8_malformed_header(log: Log, clock: FakeClock, headers: dict[str, bytes],
                                  caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="wakuwaku.consumer"):
        script, dead, c = await run_one(log, clock, headers)
    assert script.handled_ns() == [8]  # the next record went on
    assert [reason(r) for r in dead] == ["malformed_header"]
    record = dead[0]
    assert record.body == BODY
    for name, value in headers.items():  # the raw headers are kept byte for byte
        assert record.headers[name] == value
    assert record.headers["wk-error"]
    assert decode_source(record.headers["wk-src"]).offsets == (0,)
    assert c.stats.dead_letters["malformed_header"] == 1
    assert any("malformed_header" in r.getMessage() for r in caplog.records)


async def test_8_unknown_type(log: Log, clock: FakeClock) -> None:
    script, dead, _ = await run_one(log, clock, with_("wk-type", b"test.nobody-handles-this"))
    assert [reason(r) for r in dead] == ["unknown_type"]
    assert b"test.nobody-handles-this" in dead[0].headers["wk-error"]
    assert script.handled_ns() == [8]


async def test_8_algebra_mismatch(log: Log, clock: FakeClock) -> None:
    headers = build_headers(wk.event_type(Put), "a")
    headers["wk-alg"] = b"plain"  # a producer built with another algebra
    _, dead, _ = await run_one(log, clock, headers, b'{"key":"a","value":1}')
    assert [reason(r) for r in dead] == ["algebra_mismatch"]
    assert dead[0].headers["wk-alg"] == b"plain"


async def test_8_undecodable_body(log: Log, clock: FakeClock) -> None:
    script, dead, _ = await run_one(log, clock, dict(GOOD), b"\x00not json\xff")
    assert [reason(r) for r in dead] == ["undecodable_body"]
    assert dead[0].body == b"\x00not json\xff"
    assert script.handled_ns() == [8]


async def test_8_unserializable_retry_record(log: Log, clock: FakeClock) -> None:
    producer = await setup_topic(log)
    await producer.publish_many([Fragile("a", 1), Fragile("a", 2)])
    script = Script(clock)
    script.fail[-1] = [wk.Retryable("later")]  # the combined event fails
    c = consumer(log, clock, [Handler(Fragile, script)])
    await c.drain()
    dead = await dead_letters(log)
    # The combined event cannot be encoded for the retry topic: both records it
    # stands for are dead-lettered, raw.
    assert [reason(r) for r in dead] == ["unserializable_retry_record"] * 2
    assert [msgspec.json.decode(r.body)["n"] for r in dead] == [1, 2]
    assert [r for r in await read_all(log, "wk-retry.g.t") if "wk-marker" not in r.headers] == []


async def test_8_retry_backlog_full(log: Log, clock: FakeClock) -> None:
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", 1), Item("a", 2)])
    script = Script(clock)
    script.fail[1] = [wk.Retryable("later")]
    c = consumer(log, clock, [Handler(Item, script)], max_pending_retry=1)
    await c.drain()
    dead = await dead_letters(log)
    assert [reason(r) for r in dead] == ["retry_backlog_full"] * 2
    assert b"later" in dead[0].headers["wk-error"]


async def test_8_gave_up_retry_keeps_the_main_topic_identity(log: Log, clock: FakeClock) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1), properties={"tenant": "t1"})
    script = Script(clock)
    script.fail[1] = [wk.Retryable("never")] * 10
    await consumer(log, clock, [Handler(Item, script)], retry_delays=[1.0]).drain()
    dead = await dead_letters(log)
    assert [reason(r) for r in dead] == ["gave_up_retry"]
    source = decode_source(dead[0].headers["wk-src"])
    assert (source.topic, source.partition, source.offsets, source.ids) == ("t", 0, (0,),
                                                                            ("t/0/0",))
    assert dead[0].headers["wk-props"] == b'{"tenant":"t1"}'
    assert msgspec.json.decode(dead[0].body) == {"key": "a", "n": 1}


async def test_8_unrecoverable_error_text_is_sanitized(log: Log, clock: FakeClock) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    script = Script(clock)
    secret = "fetch https://user:pw@db.internal/x failed at /srv/app/secret.py\x1b[31m\u202e!"
    script.fail[1] = [wk.Unrecoverable(secret + "x" * 5000)]
    await consumer(log, clock, [Handler(Item, script)], error_text_limit=200).drain()
    dead = await dead_letters(log)
    assert [reason(r) for r in dead] == ["unrecoverable"]
    error = dead[0].headers["wk-error"].decode()
    assert "db.internal" not in error and "pw@" not in error and "/srv/app" not in error
    assert "\x1b" not in error and "\u202e" not in error
    assert len(error) <= 200
