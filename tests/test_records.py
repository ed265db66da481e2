"""Wire format 1: headers the producer stamps and the consumer checks (design §3-4, §8-9)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakuwaku import (
    ConfigError,
    EventType,
    InvalidHeaders,
    ReasonCode,
    Registry,
    Source,
    ValidHeaders,
    event,
    event_type,
    message_id,
    validate_headers,
)
from wakuwaku import Record as RecordType
from wakuwaku._records import (
    build_headers,
    checked_source,
    decode_source,
    encode_source,
    header_text,
    offsets_of,
    source_top,
)

registry = Registry()


@event("shop.order-placed", key="order", registry=registry)
class Placed(msgspec.Struct):
    order: str


@event(
    "shop.stock-added",
    key="sku",
    algebra="associative",
    registry=registry,
    combine=lambda a, b: None,
)
class StockAdded(msgspec.Struct):
    sku: str


TYPES: dict[str, EventType[Any]] = {t.tag: t for t in registry}
PLACED = event_type(Placed)

GOOD = {"wk-v": b"1", "wk-type": b"shop.order-placed", "wk-key": b"o-1", "wk-alg": b"plain"}


def without(name: str) -> dict[str, bytes]:
    return {k: v for k, v in GOOD.items() if k != name}


def invalid(headers: dict[str, bytes]) -> InvalidHeaders:
    result = validate_headers(headers, TYPES)
    assert isinstance(result, InvalidHeaders), result
    return result


def test_valid_headers_are_parsed() -> None:
    result = validate_headers(GOOD, TYPES)
    assert result == ValidHeaders("shop.order-placed", "o-1", {}, PLACED.algebra, PLACED)


def test_props_failed_at_and_source_are_parsed() -> None:
    src = Source("orders", 2, (10, 11), ("orders/2/10", "orders/2/11"))
    result = validate_headers(
        {
            **GOOD,
            "wk-props": '{"tenant":"東京"}'.encode(),
            "wk-failed-at": b"1700000000123",
            "wk-src": encode_source(src),
        },
        TYPES,
    )
    assert isinstance(result, ValidHeaders)
    assert result.props == {"tenant": "東京"}
    assert result.failed_at == pytest.approx(1_700_000_000.123)
    assert result.source == src


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        pytest.param(without("wk-v"), "wk-v is missing", id="no-version"),
        pytest.param({**GOOD, "wk-v": b"2"}, "unknown header version", id="version-2"),
        pytest.param({**GOOD, "wk-v": b""}, "unknown header version", id="version-empty"),
        pytest.param(without("wk-type"), "wk-type", id="no-type"),
        pytest.param({**GOOD, "wk-type": b""}, "wk-type", id="empty-type"),
        pytest.param(without("wk-key"), "wk-key", id="no-key"),
        pytest.param({**GOOD, "wk-key": b""}, "wk-key", id="empty-key"),
        pytest.param({**GOOD, "wk-key": b"\xff\xfe"}, "UTF-8", id="key-not-utf8"),
        pytest.param({**GOOD, "wk-props": b"{not json"}, "wk-props", id="props-not-json"),
        pytest.param({**GOOD, "wk-props": b'{"n": 1}'}, "wk-props", id="props-not-strings"),
        pytest.param({**GOOD, "wk-props": b'["a"]'}, "wk-props", id="props-not-object"),
        pytest.param(without("wk-alg"), "wk-alg is missing", id="no-algebra"),
        pytest.param({**GOOD, "wk-alg": b"commutative"}, "unknown marker", id="bad-algebra"),
        pytest.param({**GOOD, "wk-failed-at": b"yesterday"}, "wk-failed-at", id="bad-failed-at"),
        pytest.param({**GOOD, "wk-src": b"[1,2]"}, "wk-src", id="broken-source"),
    ],
)
def test_each_broken_header_is_malformed(headers: dict[str, bytes], detail: str) -> None:
    result = invalid(headers)
    assert result.reason is ReasonCode.MALFORMED_HEADER
    assert detail in result.detail


def test_unknown_type_tag() -> None:
    result = invalid({**GOOD, "wk-type": b"shop.nobody-handles-this"})
    assert result.reason is ReasonCode.UNKNOWN_TYPE
    assert "shop.nobody-handles-this" in result.detail


def test_a_malformed_header_wins_over_an_unknown_type() -> None:
    assert invalid({**GOOD, "wk-type": b"nobody", "wk-v": b"9"}).reason is (
        ReasonCode.MALFORMED_HEADER
    )


@pytest.mark.parametrize(
    ("tag", "marker"),
    [
        (b"shop.order-placed", b"associative"),
        (b"shop.order-placed", b"idempotent"),
        (b"shop.stock-added", b"plain"),
    ],
)
def test_algebra_mismatch(tag: bytes, marker: bytes) -> None:
    result = invalid({**GOOD, "wk-type": tag, "wk-alg": marker})
    assert result.reason is ReasonCode.ALGEBRA_MISMATCH
    assert marker.decode() in result.detail


def test_build_headers_stamps_every_wk_header() -> None:
    headers = build_headers(PLACED, "o-1")
    assert headers == GOOD
    with_props = build_headers(PLACED, "o-1", {"tenant": "東京", "trace": "t-1"})
    assert msgspec.json.decode(with_props["wk-props"]) == {"tenant": "東京", "trace": "t-1"}
    assert "東京".encode() in with_props["wk-props"]  # UTF-8, not \\u escapes


@pytest.mark.parametrize("props", [{"n": 1}, {1: "x"}, {"x": None}])
def test_build_headers_refuses_non_string_props(props: dict[Any, Any]) -> None:
    with pytest.raises(ConfigError, match="properties must map str to str"):
        build_headers(PLACED, "o-1", props)


@given(
    key=st.text(st.characters(codec="utf-8"), min_size=1),
    props=st.dictionaries(
        st.text(st.characters(codec="utf-8")), st.text(st.characters(codec="utf-8")), max_size=5
    ),
)
def test_built_headers_validate_back_to_the_same_key_and_props(
    key: str, props: dict[str, str]
) -> None:
    result = validate_headers(build_headers(PLACED, key, props), TYPES)
    assert isinstance(result, ValidHeaders)
    assert (result.type_tag, result.key, result.props) == ("shop.order-placed", key, props)


@given(
    topic=st.text(min_size=1),
    partition=st.integers(0, 10_000),
    offsets=st.lists(st.integers(0, 2**62), max_size=5),
    ids=st.lists(st.text(), max_size=5),
)
def test_source_round_trips(topic: str, partition: int, offsets: list[int], ids: list[str]) -> None:
    src = Source(topic, partition, tuple(offsets), tuple(ids))
    assert decode_source(encode_source(src)) == src


def _top_by_checked_source(raw: bytes) -> int | None:
    source = checked_source(raw)
    return None if source is None else max(source.offsets)


@given(
    topic=st.text(),
    partition=st.integers(-3, 2**64),
    offsets=st.lists(st.integers(-3, 2**64), max_size=4),
    ids=st.lists(st.text(max_size=3), max_size=4),
)
def test_source_top_accepts_what_checked_source_accepts(
    topic: str, partition: int, offsets: list[int], ids: list[str]
) -> None:
    raw = encode_source(Source(topic, partition, tuple(offsets), tuple(ids)))
    assert source_top(raw) == _top_by_checked_source(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'["t",0,[3,9,2],["a","b","c"]]',
        b'["t",0,[1],["a"],5]',
        b'  ["t",-0,[1],["\\u0000"]]  ',
        b"",
        b"[]",
        b"null",
        b'["t",0,[1],["a"]',
        b'["t",0,[1],["a"]]x',
        b'["t",null,[1],["a"]]',
        b'[1,0,[1],["a"]]',
        b'["t",0,[1.0],["a"]]',
        b'["t",0,[true],["a"]]',
        b'["t",0,[1e3],["a"]]',
        b'["t",0,[1],["\\ud800"]]',
        b'["t",0,[1],["\xff"]]',
        b'{"topic":"t","partition":0,"offsets":[1],"ids":["a"]}',
    ],
)
def test_source_top_agrees_with_checked_source_on_odd_values(raw: bytes) -> None:
    assert source_top(raw) == _top_by_checked_source(raw)


def test_source_top_is_the_highest_offset() -> None:
    assert source_top(b'["t",0,[3,9,2],["a","b","c"]]') == 9


def test_message_id_forms() -> None:
    assert message_id("orders", 3, 17) == "orders/3/17"
    assert message_id("orders", 3, 17, own_id="e-9", type_tag="shop.order-placed") == (
        "id:shop.order-placed:e-9"
    )


def test_header_text_replaces_invalid_utf8() -> None:
    assert header_text({"a": b"ok \xff"}, "a") == "ok \ufffd"
    assert header_text({}, "a") is None


def test_offsets_of() -> None:
    records = [RecordType(5, {}, b""), RecordType(9, {}, b"")]
    assert offsets_of(records) == [5, 9]
