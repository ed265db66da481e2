"""Declaring event types: classes, keys, algebras, codecs, the registry (design §2-4)."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from wakuwaku import (
    Algebra,
    ConfigError,
    DuplicateTypeTag,
    EventType,
    JsonCodec,
    MissingKeyError,
    Registry,
    event,
    event_type,
)


@pytest.fixture
def registry() -> Registry:
    return Registry()


def test_msgspec_struct_event(registry: Registry) -> None:
    @event("stock.adjusted", key="sku", registry=registry)
    class Adjusted(msgspec.Struct, frozen=True):
        sku: str
        delta: int

    etype = event_type(Adjusted)
    assert (etype.tag, etype.cls, etype.key_name, etype.algebra) == (
        "stock.adjusted",
        Adjusted,
        "sku",
        Algebra.PLAIN,
    )
    assert registry.get("stock.adjusted") is etype
    assert event_type(Adjusted("a", 1)) is etype
    body = etype.encode(Adjusted("sku-1", -3))
    assert msgspec.json.decode(body) == {"sku": "sku-1", "delta": -3}
    assert etype.decode(body) == Adjusted("sku-1", -3)
    assert etype.key_of(Adjusted("sku-1", 0)) == "sku-1"


def test_dataclass_event(registry: Registry) -> None:
    @event("order.placed", key="order_id", algebra="idempotent", registry=registry)
    @dataclasses.dataclass(frozen=True)
    class Placed:
        order_id: int
        total: float

    etype = event_type(Placed)
    assert etype.algebra is Algebra.IDEMPOTENT
    assert etype.key_of(Placed(42, 1.5)) == "42"  # int keys become text
    assert etype.decode(etype.encode(Placed(42, 1.5))) == Placed(42, 1.5)


def test_pydantic_model_event(registry: Registry) -> None:
    pydantic = pytest.importorskip("pydantic")

    @event("user.renamed", key="user_id", registry=registry)
    class Renamed(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        user_id: str
        name: str

    etype = event_type(Renamed)
    value = Renamed(user_id="u1", name="Ann")
    assert etype.key_of(value) == "u1"
    assert etype.decode(etype.encode(value)) == value


def test_key_from_a_method(registry: Registry) -> None:
    @event("line.added", key="routing_key", registry=registry)
    class Added(msgspec.Struct):
        order: str
        line: int

        def routing_key(self) -> str:
            return f"{self.order}#{self.line}"

    assert event_type(Added).key_of(Added("o1", 3)) == "o1#3"


def test_key_from_a_callable(registry: Registry) -> None:
    def tenant_and_sku(e: Any) -> str:
        return f"{e.tenant}/{e.sku}"

    @event("stock.moved", key=tenant_and_sku, registry=registry)
    class Moved(msgspec.Struct):
        tenant: str
        sku: str

    etype = event_type(Moved)
    assert etype.key_of(Moved("t1", "s1")) == "t1/s1"
    assert etype.key_name == "tenant_and_sku"


@pytest.mark.parametrize("bad", [None, "", True, b"bytes", 1.5])
def test_unusable_keys_raise_missing_key_naming_type_and_field(
    registry: Registry, bad: object
) -> None:
    @event("maybe.keyed", key="k", registry=registry)
    class Maybe(msgspec.Struct):
        k: Any

    with pytest.raises(MissingKeyError) as caught:
        event_type(Maybe).key_of(Maybe(bad))
    assert (caught.value.type_tag, caught.value.field, caught.value.value) == (
        "maybe.keyed",
        "k",
        bad,
    )
    assert "'maybe.keyed'" in str(caught.value) and "'k'" in str(caught.value)


def test_a_key_field_that_does_not_exist_is_refused(registry: Registry) -> None:
    with pytest.raises(ConfigError, match="no field 'skuu'"):

        @event("typo", key="skuu", registry=registry)
        class Typo(msgspec.Struct):
            sku: str

    assert "typo" not in registry


def test_duplicate_type_tag_is_refused_at_declaration(registry: Registry) -> None:
    @event("dup.tag", key="k", registry=registry)
    class First(msgspec.Struct):
        k: str

    with pytest.raises(DuplicateTypeTag) as caught:

        @event("dup.tag", key="k", registry=registry)
        class Second(msgspec.Struct):
            k: str

    assert caught.value.tag == "dup.tag"
    assert caught.value.existing is First
    assert "First" in str(caught.value) and "Second" in str(caught.value)
    assert registry.get("dup.tag") is event_type(First)


def test_registering_the_same_class_again_is_allowed(registry: Registry) -> None:
    @event("same", key="k", registry=registry)
    class Same(msgspec.Struct):
        k: str

    event("same", key="k", registry=registry)(Same)
    assert len(registry) == 1


def test_associative_type_takes_its_combine_method(registry: Registry) -> None:
    @event("counter.added", key="name", algebra=Algebra.ASSOCIATIVE, registry=registry)
    class Added(msgspec.Struct, frozen=True):
        name: str
        n: int

        def combine(self, other: Added) -> Added | None:
            return Added(self.name, self.n + other.n) if other.name == self.name else None

    etype = event_type(Added)
    assert etype.combine(Added("a", 1), Added("a", 2)) == Added("a", 3)
    assert etype.combine(Added("a", 1), Added("b", 2)) is None


def test_associative_type_with_a_combine_function(registry: Registry) -> None:
    def add(a: Any, b: Any) -> Any:
        return type(a)(a.n + b.n)

    @event("sum", key=lambda e: "one", algebra="associative", combine=add, registry=registry)
    class Sum(msgspec.Struct, frozen=True):
        n: int

    assert event_type(Sum).combine(Sum(1), Sum(4)) == Sum(5)


def test_associative_without_combine_is_a_config_error(registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"associative.*combine"):

        @event("no.combine", key="k", algebra="associative", registry=registry)
        class NoCombine(msgspec.Struct):
            k: str

    assert "no.combine" not in registry


def test_plain_type_never_combines(registry: Registry) -> None:
    @event("plain", key="k", registry=registry)
    class Plain(msgspec.Struct):
        k: str

    assert event_type(Plain).combine(Plain("a"), Plain("a")) is None


@pytest.mark.parametrize("tag", ["", "   ", None])
def test_empty_tag_is_refused(registry: Registry, tag: Any) -> None:
    with pytest.raises(ConfigError, match="tag"):
        event(tag, key="k", registry=registry)


def test_unknown_algebra_is_refused(registry: Registry) -> None:
    with pytest.raises(ConfigError, match="unknown algebra 'commutative'"):
        event("x", key="k", algebra="commutative", registry=registry)


def test_event_type_of_an_undeclared_class_is_a_config_error() -> None:
    class Plain(msgspec.Struct):
        k: str

    with pytest.raises(ConfigError, match="not an event type"):
        event_type(Plain)


def test_a_subclass_is_not_its_parents_event_type(registry: Registry) -> None:
    @event("parent", key="k", registry=registry)
    class Parent(msgspec.Struct):
        k: str

    class Child(Parent):
        pass

    with pytest.raises(ConfigError):
        event_type(Child)


def test_event_id_from_a_field(registry: Registry) -> None:
    @event("with.id", key="k", id="event_id", registry=registry)
    class WithId(msgspec.Struct):
        k: str
        event_id: str | None

    etype = event_type(WithId)
    assert etype.id_of(WithId("k", "e-1")) == "e-1"
    assert etype.id_of(WithId("k", None)) is None
    assert etype.id_of(WithId("k", "")) is None


def test_custom_codec_is_used(registry: Registry) -> None:
    class Upper:
        def encode(self, value: Any) -> bytes:
            return str(value.k).upper().encode()

        def decode(self, data: bytes) -> Any:
            return Raw(data.decode().lower())

    @event("raw", key="k", codec=Upper(), registry=registry)
    class Raw(msgspec.Struct):
        k: str

    etype: EventType[Raw] = event_type(Raw)
    assert etype.encode(Raw("abc")) == b"ABC"
    assert etype.decode(b"ABC") == Raw("abc")


def test_json_codec_refuses_a_body_of_the_wrong_shape() -> None:
    class Shape(msgspec.Struct):
        n: int

    codec = JsonCodec(Shape)
    with pytest.raises(msgspec.ValidationError):
        codec.decode(b'{"n": "not a number"}')
    with pytest.raises(msgspec.DecodeError):
        codec.decode(b"not json")


def test_registry_iterates_its_types(registry: Registry) -> None:
    @event("a", key="k", registry=registry)
    class A(msgspec.Struct):
        k: str

    @event("b", key="k", registry=registry)
    class B(msgspec.Struct):
        k: str

    assert sorted(t.tag for t in registry) == ["a", "b"]
    assert "a" in registry and "c" not in registry
    assert registry.get("c") is None
