"""design §8: every record that never reaches a handler is dead-lettered, one test per reason."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku._records import build_headers, decode_source
from wakuwaku.engine import Handler
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import (
    Add,
    Fragile,
    Item,
    Put,
    Script,
    consumer,
    dead_letters,
    event_n,
    read_all,
    reason,
    setup_topic,
    wait_until,
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


async def run_one(
    log: Log, clock: FakeClock, headers: dict[str, bytes], body: bytes = BODY
) -> tuple[Script, list[wk.Record], wk.engine.Consumer]:
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
async def test_8_malformed_header(
    log: Log, clock: FakeClock, headers: dict[str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
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


async def test_6_a_combined_event_goes_to_the_retry_topic_as_its_raw_records(
    log: Log, clock: FakeClock
) -> None:
    """design §6: retry work keeps the original records. A combined event whose
    codec cannot encode it (Fragile) was dead-lettered as
    ``unserializable_retry_record``; its records now wait in the retry topic as
    they were read, and are combined again at the attempt."""
    producer = await setup_topic(log)
    await producer.publish_many([Fragile("a", 1), Fragile("a", 2)])
    originals = await read_all(log, "t")
    script = Script(clock)
    script.fail[-1] = [wk.Retryable("later")]  # the combined event fails once
    await consumer(log, clock, [Handler(Fragile, script)]).drain()
    assert await dead_letters(log) == []
    work = [r for r in await read_all(log, "wk-retry.g.t") if "wk-marker" not in r.headers]
    assert [r.body for r in work] == [r.body for r in originals]
    assert [n for _, _, run in script.calls for n in [e.n for e in run]] == [-1, -1]


async def test_6_dead_letters_of_a_combined_event_are_its_records_byte_for_byte(
    log: Log, clock: FakeClock
) -> None:
    """Associative events of one key, one with its own props and one with a
    custom header, combined, sent through the retry topic and given up: one
    re-encoded dead letter came out, the other records' props and custom
    header gone."""
    await log.create_topic("t", 1)
    producer = wk.Producer(log, "t")
    await producer.publish(Add("a", 1))
    await producer.publish(Add("a", 2), properties={"tenant": "t2"})
    await producer.publish(Add("a", 3))
    plain = (await read_all(log, "t"))[2]
    await log.append("t", 0, [({**plain.headers, "x-custom": b"kept"}, plain.body)])
    seen: list[list[Add]] = []

    async def never(run: Sequence[Add]) -> None:
        seen.append(list(run))
        raise wk.Retryable("never")

    await consumer(log, clock, [Handler(Add, never)], retry_delays=(1.0,)).drain()
    mains = await read_all(log, "t")
    dead = await dead_letters(log)
    assert len(dead) == len(mains) == 4
    for letter in dead:
        (offset,) = wk._records.decode_source(letter.headers["wk-src"]).offsets
        main = mains[offset]
        assert letter.body == main.body
        assert {k: v for k, v in letter.headers.items() if k in main.headers} == main.headers
    assert sorted(r.headers.get("x-custom", b"") for r in dead) == [b"", b"", b"", b"kept"]
    assert sorted(r.headers.get("wk-props", b"") for r in dead)[-1] == b'{"tenant":"t2"}'


async def test_4_records_whose_props_differ_are_never_combined(log: Log, clock: FakeClock) -> None:
    await log.create_topic("t", 1)
    producer = wk.Producer(log, "t")
    await producer.publish_many([Add("a", 1), Add("a", 2)])
    await producer.publish(Add("a", 4), properties={"tenant": "t2"})
    await producer.publish_many([Add("a", 8), Add("a", 16)])
    seen: list[list[int]] = []

    async def record(run: Sequence[Add]) -> None:
        seen.append([e.amount for e in run])
        if len(seen) == 1:
            raise wk.Retryable("once: the attempt plans the records again from the retry topic")

    await consumer(log, clock, [Handler(Add, record)]).drain()
    # From the main topic and again from the retry topic: the tenant-t2 event alone.
    assert [n for run in seen for n in run][-3:] == [3, 4, 24]
    assert seen[0] == [3]


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
    assert (source.topic, source.partition, source.offsets, source.ids) == (
        "t",
        0,
        (0,),
        ("t/0/0",),
    )
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


async def test_a_stop_after_an_unrecoverable_chunk_of_an_attempt_gives_it_one_outcome(
    log: Log, clock: FakeClock
) -> None:
    """A stop in a retry attempt right after a chunk was dead-lettered: the
    markers at the stop resolved the key only through its last chunk that
    succeeded, so the restart attempted the dead-lettered record again
    (dead-lettered twice, or dead-lettered and then handled)."""
    producer = await setup_topic(log)
    await producer.publish_many([Item("k", 0), Item("k", 1), Item("k", 2)])
    calls: list[int] = []
    in_one = asyncio.Event()
    go_on = asyncio.Event()

    async def handle(run: Sequence[Item]) -> None:
        [event] = run
        calls.append(event.n)
        if event.n == 0 and calls.count(0) == 1:
            raise wk.Retryable("not yet")  # all three go to the retry topic
        if event.n == 1 and calls.count(1) == 1:
            in_one.set()
            await go_on.wait()
            raise wk.Unrecoverable("bad event")

    first = consumer(log, clock, [Handler(Item, handle, max_batch=1)], retry_delays=[0.05])
    task = asyncio.create_task(first.run(install_signal_handlers=False))
    await wait_until(clock, in_one.is_set)
    first.stop()
    go_on.set()
    await task
    assert calls == [0, 0, 1]
    await consumer(log, clock, [Handler(Item, handle, max_batch=1)], retry_delays=[0.05]).drain()
    assert [event_n(r) for r in await dead_letters(log)] == [1]
    assert calls.count(1) == 1, f"handled again after its dead letter: {calls}"
    assert calls[-1] == 2
