"""The producer: stamped headers, murmur2 partitions, atomic refusal, sync wrapper (design §2-3)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from wakuwaku import (
    ConfigError,
    MemoryLog,
    MissingKeyError,
    Producer,
    Published,
    Registry,
    SyncProducer,
    UnknownTopicError,
    event,
    partition_for,
)
from wakuwaku.logs.sqlite import SQLiteLog

registry = Registry()


@event("shop.order-placed", key="order", registry=registry)
class Placed(msgspec.Struct):
    order: str | None
    total: int = 0


@event("shop.stock-added", key="sku", algebra="idempotent", registry=registry)
class StockAdded(msgspec.Struct):
    sku: str
    n: int


class NotAnEvent(msgspec.Struct):
    order: str


@pytest.fixture
async def log() -> MemoryLog:
    log = MemoryLog()
    await log.create_topic("orders", 4)
    return log


async def test_publish_stamps_headers_and_picks_the_murmur2_partition(log: MemoryLog) -> None:
    producer = Producer(log, "orders")
    published = await producer.publish(Placed("o-17", 5), properties={"tenant": "t1"})
    partition = partition_for("o-17", 4)
    assert published == Published("orders", partition, 0, "o-17")
    (record,) = await log.read("orders", partition, 0)
    assert record.headers == {
        "wk-v": b"1",
        "wk-type": b"shop.order-placed",
        "wk-key": b"o-17",
        "wk-alg": b"plain",
        "wk-props": b'{"tenant":"t1"}',
    }
    assert msgspec.json.decode(record.body) == {"order": "o-17", "total": 5}


async def test_algebra_marker_comes_from_the_type(log: MemoryLog) -> None:
    published = await Producer(log, "orders").publish(StockAdded("sku-1", 2))
    (record,) = await log.read("orders", published.partition, 0)
    assert record.headers["wk-alg"] == b"idempotent"
    assert "wk-props" not in record.headers


async def test_publish_many_keeps_input_order_and_per_key_order(log: MemoryLog) -> None:
    producer = Producer(log, "orders")
    events = [Placed(f"o-{i % 5}", i) for i in range(20)]
    published = await producer.publish_many(events)
    assert [p.key for p in published] == [e.order for e in events]
    assert all(p.partition == partition_for(p.key, 4) for p in published)
    for partition in range(4):
        records = await log.read("orders", partition, 0)
        totals = [msgspec.json.decode(r.body)["total"] for r in records]
        assert totals == sorted(totals)  # one append per partition, in input order
        assert [r.offset for r in records] == sorted(
            p.offset for p in published if p.partition == partition
        )


async def test_publish_many_returns_what_published_would_build(log: MemoryLog) -> None:
    # publish_many sets Published's slots itself (its __init__ was a sixth of
    # the call's time): a field added to Published must be set there too.
    assert [f.name for f in dataclasses.fields(Published)] == [
        "topic",
        "partition",
        "offset",
        "key",
    ]
    published = await Producer(log, "orders").publish_many([Placed(f"o-{i}", i) for i in range(8)])
    for p in published:
        assert type(p) is Published
        assert p == Published("orders", p.partition, p.offset, p.key)
        assert hash(p) == hash(Published("orders", p.partition, p.offset, p.key))
        assert repr(p) == repr(Published("orders", p.partition, p.offset, p.key))
    with pytest.raises(dataclasses.FrozenInstanceError):
        published[0].offset = 1  # type: ignore[misc]


@pytest.mark.parametrize("bad_key", [None, "", "   ", "\t", "\n"])
async def test_one_event_without_a_key_refuses_the_whole_call(
    log: MemoryLog, bad_key: str | None
) -> None:
    producer = Producer(log, "orders")
    events = [Placed("o-1"), Placed("o-2"), Placed(bad_key), Placed("o-3")]
    with pytest.raises(MissingKeyError) as caught:
        await producer.publish_many(events)
    assert (caught.value.type_tag, caught.value.field) == ("shop.order-placed", "order")
    assert "'shop.order-placed'" in str(caught.value) and "'order'" in str(caught.value)
    assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0, 3: 0}


async def test_an_undeclared_class_is_refused(log: MemoryLog) -> None:
    with pytest.raises(ConfigError, match="not an event type"):
        await Producer(log, "orders").publish_many([Placed("o-1"), NotAnEvent("o-2")])
    assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0, 3: 0}


async def test_an_unencodable_event_is_refused_naming_type_and_key(log: MemoryLog) -> None:
    with pytest.raises(ConfigError, match=re.escape("'shop.order-placed' with key 'o-1'")):
        await Producer(log, "orders").publish(Placed("o-1", object()))  # type: ignore[arg-type]
    assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0, 3: 0}


@event("shop.price-set", key="sku", registry=registry)
class PriceSet(msgspec.Struct):
    sku: str
    price: float
    note: str | None = None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
async def test_a_float_json_cannot_carry_is_refused_instead_of_written_as_null(
    log: MemoryLog, bad: float
) -> None:
    with pytest.raises(ConfigError, match=re.escape("'shop.price-set' with key 'p-1'")):
        await Producer(log, "orders").publish_many([PriceSet("p-2", 1.0), PriceSet("p-1", bad)])
    assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0, 3: 0}


@event("shop.reading", key="sku", registry=registry)
class Reading(msgspec.Struct):
    sku: str
    value: float | None = None
    series: list[float | None] = []
    extra: dict[str, Any] = {}


@pytest.mark.parametrize(
    "reading",
    [
        Reading("r-1", float("nan")),
        Reading("r-1", 1.0, [1.0, float("inf")]),
        Reading("r-1", None, [], {"deep": [{"x": float("-inf")}]}),
    ],
)
async def test_a_nan_where_null_is_allowed_is_refused_too(log: MemoryLog, reading: Reading) -> None:
    with pytest.raises(ConfigError, match="NaN or infinite float"):
        await Producer(log, "orders").publish(reading)
    assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0, 3: 0}


async def test_a_body_that_would_not_decode_back_is_refused_naming_the_problem(
    log: MemoryLog,
) -> None:
    import pydantic

    @event("shop.hidden", key="key", registry=registry)
    class Hidden(pydantic.BaseModel):
        key: str
        required: int = pydantic.Field(exclude=True)  # never written, always required

    with pytest.raises(ConfigError, match=r"(?s)would not decode back.*required"):
        await Producer(log, "orders").publish(Hidden(key="k", required=3))
    assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0, 3: 0}


async def test_a_none_field_written_as_null_is_still_published(log: MemoryLog) -> None:
    published = await Producer(log, "orders").publish(PriceSet("p-1", 2.5, None))
    (record,) = await log.read("orders", published.partition, published.offset)
    assert msgspec.json.decode(record.body) == {"sku": "p-1", "price": 2.5, "note": None}


async def test_non_string_properties_are_refused(log: MemoryLog) -> None:
    with pytest.raises(ConfigError, match="properties"):
        await Producer(log, "orders").publish(Placed("o-1"), properties={"n": 1})  # type: ignore[dict-item]
    assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0, 3: 0}


async def test_unknown_topic() -> None:
    with pytest.raises(UnknownTopicError):
        await Producer(MemoryLog(), "missing").publish(Placed("o-1"))


async def test_encode_writes_nothing(log: MemoryLog) -> None:
    key, (headers, body) = Producer(log, "orders").encode(Placed("o-9", 1))
    assert key == "o-9" and headers["wk-key"] == b"o-9" and body == b'{"order":"o-9","total":1}'
    assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0, 3: 0}


def test_sync_producer_from_plain_code_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "log.db"

    async def create() -> None:
        async with SQLiteLog(path) as log:
            await log.create_topic("orders", 2)

    asyncio.run(create())
    with SyncProducer(SQLiteLog(path), "orders") as producer:
        one = producer.publish(Placed("o-1", 1))
        many = producer.publish_many([Placed("o-1", 2), Placed("o-2", 3)])
    assert one.offset == 0 and [p.key for p in many] == ["o-1", "o-2"]

    async def read() -> list[Any]:
        async with SQLiteLog(path) as log:
            return [
                msgspec.json.decode(r.body)["total"]
                for p in (0, 1)
                for r in await log.read("orders", p, 0)
            ]

    assert sorted(asyncio.run(read())) == [1, 2, 3]


def test_sync_producer_raises_the_producers_errors(tmp_path: Path) -> None:
    log = MemoryLog()
    asyncio.run(log.create_topic("orders", 1))
    producer = SyncProducer(log, "orders")
    try:
        with pytest.raises(MissingKeyError):
            producer.publish(Placed(None))
    finally:
        producer.close()
        producer.close()  # closing twice is harmless
    assert asyncio.run(log.end_offsets("orders")) == {0: 0}
