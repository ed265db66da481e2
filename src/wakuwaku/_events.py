"""Typed events: type tags, keys, algebras, codecs and the registry (design §2-4).

An event type is any class whose instances msgspec can encode (msgspec
``Struct``, ``dataclass``, ``attrs``) or a pydantic model, declared with
:func:`event`::

    @wakuwaku.event("inventory.stock-adjusted", key="sku", algebra="associative")
    class StockAdjusted(msgspec.Struct, frozen=True):
        sku: str
        delta: int

        def combine(self, other: "StockAdjusted") -> "StockAdjusted | None":
            return StockAdjusted(self.sku, self.delta + other.delta)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast, overload

import msgspec

from ._errors import ConfigError, DuplicateTypeTag, MissingKeyError

T = TypeVar("T")
C = TypeVar("C", bound=type)


class Algebra(enum.StrEnum):
    """How a run of one event type may be reduced before handling (design §4)."""

    PLAIN = "plain"
    """Every event is handled, in order."""

    IDEMPOTENT = "idempotent"
    """Handling an event twice equals handling it once: consecutive equal events
    of a run collapse to one."""

    ASSOCIATIVE = "associative"
    """``combine(a, b)`` equals handling ``a`` then ``b``; a run is folded left to
    right, ``None`` meaning "these two do not combine"."""


class Codec(Protocol[T]):
    """Turns events into body bytes and back."""

    def encode(self, value: T) -> bytes:
        """Encode ``value``; raise any exception when it cannot be encoded."""
        ...

    def decode(self, data: bytes) -> T:
        """Decode ``data``; raise any exception when it is not a valid body."""
        ...


class JsonCodec(Generic[T]):
    """The default codec: JSON via msgspec (pydantic models via their own JSON methods).

    :param cls: the event class; msgspec ``Struct``, ``dataclass``, ``attrs``
        class or pydantic ``BaseModel``.
    """

    def __init__(self, cls: type[T]) -> None:
        self.cls = cls
        self._pydantic = hasattr(cls, "model_validate_json") and hasattr(cls, "model_dump_json")
        self._encoder = msgspec.json.Encoder()
        self._decoder: msgspec.json.Decoder[T] | None = (
            None if self._pydantic else msgspec.json.Decoder(cls)
        )
        if self._decoder is not None:
            # The msgspec encoder's and decoder's own methods: no Python frame
            # per record on the hot path.
            self.encode = self._encoder.encode  # type: ignore[method-assign,assignment]
            self.decode = self._decoder.decode  # type: ignore[method-assign,assignment]

    def encode(self, value: T) -> bytes:
        if self._pydantic:
            return cast(str, value.model_dump_json()).encode()  # type: ignore[attr-defined]
        return self._encoder.encode(value)

    def decode(self, data: bytes) -> T:
        if self._decoder is None:
            return cast(T, self.cls.model_validate_json(data))  # type: ignore[attr-defined]
        return self._decoder.decode(data)


@dataclass(frozen=True, eq=False)
class EventType(Generic[T]):
    """Everything wakuwaku knows about one event class.

    Built by :func:`event`; read it back with :func:`event_type`.

    :param tag: the stable type tag written in ``wk-type``.
    :param cls: the event class.
    :param key_name: the field or method the key comes from (for error texts).
    :param algebra: the type's :class:`Algebra`.
    :param codec: the body codec.
    :param combine_fn: ``combine(a, b) -> T | None`` for associative types.
    :param id_name: the field or method giving the event's own id, if any; it
        becomes the message identity of design §9 instead of the record's offset.
    """

    tag: str
    cls: type[T]
    key_name: str
    algebra: Algebra
    codec: Codec[T]
    combine_fn: Callable[[T, T], T | None] | None = None
    id_name: str | None = None
    _key_getter: Callable[[T], object] = field(default=lambda e: None, repr=False)

    def key_of(self, value: T) -> str:
        """The event's key as a string.

        :raises MissingKeyError: when the key is None, empty, only whitespace
            (real data uses ``" "`` for "missing"), or not a
            str/int.
        """
        raw = self._key_getter(value)
        if isinstance(raw, bool) or raw is None:
            raise MissingKeyError(self.tag, self.key_name, raw)
        if isinstance(raw, int):
            return str(raw)
        if not isinstance(raw, str) or not raw or raw.isspace():
            raise MissingKeyError(self.tag, self.key_name, raw)
        return raw

    def id_of(self, value: T) -> str | None:
        """The event's own id (design §9), or None when the type declares none."""
        if self.id_name is None:
            return None
        raw = _read(value, self.id_name)
        if raw is None or raw == "":
            return None
        return str(raw)

    def encode(self, value: T) -> bytes:
        """Encode with the type's codec (exceptions of the codec propagate)."""
        return self.codec.encode(value)

    def decode(self, data: bytes) -> T:
        """Decode with the type's codec (exceptions of the codec propagate)."""
        return self.codec.decode(data)

    def combine(self, a: T, b: T) -> T | None:
        """Combine two events of an associative type; None means "do not combine"."""
        if self.combine_fn is None:
            return None
        return self.combine_fn(a, b)


def _read(value: object, name: str) -> object:
    attr = getattr(value, name)
    return attr() if callable(attr) else attr


class Registry:
    """Maps type tags to event types; one tag names one class."""

    def __init__(self) -> None:
        self._by_tag: dict[str, EventType[Any]] = {}

    def register(self, event_type: EventType[Any]) -> None:
        """Add ``event_type``.

        :raises DuplicateTypeTag: when another class already holds the tag
            (registering the same class again is allowed, for module reloads).
        """
        existing = self._by_tag.get(event_type.tag)
        if existing is not None and existing.cls is not event_type.cls:
            same_name = (
                existing.cls.__module__ == event_type.cls.__module__
                and existing.cls.__qualname__ == event_type.cls.__qualname__
            )
            if not same_name:
                raise DuplicateTypeTag(event_type.tag, existing.cls, event_type.cls)
        self._by_tag[event_type.tag] = event_type

    def get(self, tag: str) -> EventType[Any] | None:
        """The event type registered under ``tag``, or None."""
        return self._by_tag.get(tag)

    def __contains__(self, tag: object) -> bool:
        return tag in self._by_tag

    def __iter__(self) -> Iterator[EventType[Any]]:
        return iter(list(self._by_tag.values()))

    def __len__(self) -> int:
        return len(self._by_tag)


default_registry = Registry()
"""The registry :func:`event` uses when none is given."""


def event(
    tag: str,
    *,
    key: str | Callable[[Any], object],
    algebra: Algebra | str = Algebra.PLAIN,
    codec: Codec[Any] | None = None,
    combine: Callable[[Any, Any], Any] | None = None,
    id: str | None = None,
    registry: Registry | None = None,
) -> Callable[[C], C]:
    """Declare a class as an event type and register it.

    :param tag: stable type tag (``wk-type``); never change it once published.
    :param key: the name of the field or zero-argument method that gives the
        key, or a function ``event -> key``.
    :param algebra: ``plain`` (default), ``idempotent`` or ``associative``.
    :param codec: the body codec; default :class:`JsonCodec` of the class.
    :param combine: for associative types, ``combine(a, b) -> T | None``;
        default the class's own ``combine`` method.
    :param id: the field or method holding the event's unique id, if any.
    :param registry: where to register; default :data:`default_registry`.
    :raises ConfigError: for an empty tag, an unknown algebra, or an
        associative type without ``combine``.
    :raises DuplicateTypeTag: when another class already holds ``tag``.
    """
    if not isinstance(tag, str) or not tag or any(c.isspace() or ord(c) < 32 for c in tag):
        raise ConfigError(
            f"an event type tag must be a non-empty string without whitespace "
            f"or control characters, got {tag!r}"
        )
    if not isinstance(key, str) and not callable(key):
        raise ConfigError(
            f"event type {tag!r}: key must be a field or method name or a function, got {key!r}"
        )
    if combine is not None and not callable(combine):
        raise ConfigError(f"event type {tag!r}: combine must be callable, got {combine!r}")
    try:
        alg = Algebra(algebra)
    except ValueError:
        raise ConfigError(
            f"event type {tag!r}: unknown algebra {algebra!r} "
            f"(use one of {', '.join(a.value for a in Algebra)})"
        ) from None

    def decorate(cls: C) -> C:
        combine_fn = combine
        if alg is Algebra.ASSOCIATIVE and combine_fn is None:
            method = getattr(cls, "combine", None)
            if method is None:
                raise ConfigError(
                    f"event type {tag!r} is associative but {cls.__qualname__} has no "
                    "combine(self, other) method and no combine= was given"
                )
            if not callable(method):
                raise ConfigError(f"event type {tag!r}: {cls.__qualname__}.combine is not callable")
            combine_fn = method
        if id is not None and not _has_member(cls, id):
            raise ConfigError(f"event type {tag!r}: {cls.__qualname__} has no id field {id!r}")
        if isinstance(key, str):
            key_name = key
            key_getter: Callable[[Any], object] = lambda e: _read(e, key)  # noqa: E731
            if not _has_member(cls, key):
                raise ConfigError(f"event type {tag!r}: {cls.__qualname__} has no field {key!r}")
        else:
            key_name = getattr(key, "__name__", "key function")
            key_getter = key
        event_type: EventType[Any] = EventType(
            tag=tag,
            cls=cls,
            key_name=key_name,
            algebra=alg,
            codec=codec if codec is not None else JsonCodec(cls),
            combine_fn=combine_fn,
            id_name=id,
            _key_getter=key_getter,
        )
        (registry if registry is not None else default_registry).register(event_type)
        setattr(cls, "__wakuwaku_event__", event_type)  # noqa: B010 - dynamic attribute
        return cls

    return decorate


def _has_member(cls: type, name: str) -> bool:
    if hasattr(cls, name):
        return True
    for attr in ("__struct_fields__", "__dataclass_fields__", "model_fields", "__annotations__"):
        members = getattr(cls, attr, None)
        if members is not None and name in members:
            return True
    return False


@overload
def event_type(cls_or_event: type[T]) -> EventType[T]: ...
@overload
def event_type(cls_or_event: T) -> EventType[T]: ...
def event_type(cls_or_event: type[T] | T) -> EventType[T]:
    """The :class:`EventType` of an event class or instance.

    :raises ConfigError: when the class was not declared with :func:`event`.
    """
    cls = cls_or_event if isinstance(cls_or_event, type) else type(cls_or_event)
    found = getattr(cls, "__wakuwaku_event__", None)
    if not isinstance(found, EventType) or found.cls is not cls:
        raise ConfigError(f"{cls.__qualname__} is not an event type; declare it with @event(...)")
    return cast(EventType[T], found)
