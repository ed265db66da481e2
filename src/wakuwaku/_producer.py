"""The producer: typed events in, records with every ``wk-*`` header out (design §2, §3).

Partition = Kafka's murmur2 of the key bytes mod the topic's partition count.
An event without a usable key is refused before anything is written.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ._errors import ConfigError
from ._events import EventType, JsonCodec, event_type
from ._records import H_KEY, build_headers
from .logs import Log, OutgoingRecord
from .tracing import inject


@dataclass(frozen=True, slots=True)
class Published:
    """Where one published event was written."""

    topic: str
    partition: int
    offset: int
    key: str


# Published's slots, to make many at once (publish_many).
_new = object.__new__
_set_topic = Published.__dict__["topic"].__set__
_set_partition = Published.__dict__["partition"].__set__
_set_offset = Published.__dict__["offset"].__set__
_set_key = Published.__dict__["key"].__set__


class Producer:
    """Publishes events of declared types to one topic of a log.

    :param log: the log to write to.
    :param topic: the topic; it must exist (``wakuwaku topic create`` or
        :meth:`Log.create_topic`).

    The topic's partition count is read once and cached.
    """

    def __init__(self, log: Log, topic: str) -> None:
        self.log = log
        self.topic = topic
        self._partitions: int | None = None

    async def partitions(self) -> int:
        """The topic's partition count.

        :raises UnknownTopicError: when the topic does not exist.
        """
        if self._partitions is None:
            self._partitions = (await self.log.describe_topic(self.topic)).partitions
        return self._partitions

    def encode(
        self, event: Any, properties: Mapping[str, str] | None = None
    ) -> tuple[str, OutgoingRecord]:
        """The key and ``(headers, body)`` of ``event``, without writing anything.

        :raises ConfigError: when ``event``'s class is not a declared event type,
            or a property is not str -> str.
        :raises MissingKeyError: when the event's key is None or empty (the error
            names the type and the field).
        :raises ConfigError: when the codec cannot encode the event, or (JSON
            codec) when its body holds a NaN or infinite float (JSON has
            neither; msgspec would write ``null``) or would not decode back
            into the type (a consumer would dead-letter it as
            ``undecodable_body``).
        """
        key, record, _ = _Encoder(properties).encode(event)
        return key, record

    async def publish(
        self, event: Any, *, properties: Mapping[str, str] | None = None
    ) -> Published:
        """Write one event; returns where it went.

        :param properties: string properties (tenant, trace id...) for ``wk-props``;
            with the ``otel`` extra the current trace context is added
            (``traceparent``, :mod:`wakuwaku.tracing`).
        :raises MissingKeyError: when the event has no usable key; nothing is written.
        :raises UnknownTopicError: when the topic does not exist.
        """
        return (await self.publish_many([event], properties=properties))[0]

    async def publish_many(
        self,
        events: Iterable[Any],
        *,
        properties: Mapping[str, str] | None = None,
    ) -> list[Published]:
        """Write several events, one append per partition; returns one entry per event.

        Every event is encoded and checked before anything is written, so one
        bad event refuses the whole call and writes nothing. The partitions'
        appends then run together; the call returns when the log has
        acknowledged every record (what that means per log: docs/logs.md,
        "What publish_many acknowledges"), each partition's records in the
        order given. It is not atomic across partitions: when one append
        fails, the error is raised once all the others have finished, and
        they may have stored their records (each append is as
        :meth:`Log.append` says: all or nothing on memory, SQLite and Redis,
        possibly a prefix on NATS and Kafka).

        Publishing the same events again after an error can store some of
        them twice: the other partitions' records, and a failed append's own
        when the log stored it but its answer was lost (a server that froze
        past the call's time limit: ``LogUnavailableError``). This is
        at-least-once, as a Kafka producer's retries across calls are; keys
        keep their order (a copy follows its original). A consumer drops
        such copies only for event types that declare their own id
        (``@event(..., id=...)``), through a handler's inbox (design §9).

        :raises MissingKeyError: naming the first event without a usable key.
        :raises UnknownTopicError: when the topic does not exist.
        :raises ConfigError: when a record is larger than the log's
            ``max_record_size`` (logs that have one, such as NATS: the
            server's message limit less room for retry headers); the error
            names the size and the limit, and nothing is written.
        """
        partitions = await self.partitions()
        properties = inject(properties)  # the current trace context, when tracing (otel extra)
        limit = self.log.max_record_size
        encode = _Encoder(properties).encode
        partition_for = self.log.partition_for
        seen: dict[str, int] = {}  # key -> partition, for this call (keys repeat)
        # partition -> (the events' indexes, their keys, their records)
        by_partition: dict[int, tuple[list[int], list[str], list[OutgoingRecord]]] = {}
        count = 0
        for event in events:
            key, record, size = encode(event)
            if limit and size > limit:
                _refuse_size(key, size, limit, self.log)
            partition = seen.get(key)
            if partition is None:
                partition = seen[key] = partition_for(key, partitions)
            found = by_partition.get(partition)
            if found is None:
                found = by_partition[partition] = ([], [], [])
            found[0].append(count)
            found[1].append(key)
            found[2].append(record)
            count += 1
        results: list[Published | None] = [None] * count
        topic = self.topic

        async def append(
            partition: int, items: tuple[list[int], list[str], list[OutgoingRecord]]
        ) -> None:
            indexes, keys, records = items
            offsets = await self.log.append(topic, partition, records)
            for index, key, offset in zip(indexes, keys, offsets, strict=True):
                # Published(topic, partition, offset, key) without the frozen
                # dataclass's __init__ (four setattrs through Python, a sixth
                # of this call's time): its slots set directly.
                published = _new(Published)
                _set_topic(published, topic)
                _set_partition(published, partition)
                _set_offset(published, offset)
                _set_key(published, key)
                results[index] = published

        if len(by_partition) == 1:
            [(partition, items)] = by_partition.items()
            await append(partition, items)
        else:
            # Every partition's append in flight at once; the call returns (or
            # raises the first error) only when all of them have finished.
            done = await asyncio.gather(
                *(append(p, items) for p, items in by_partition.items()), return_exceptions=True
            )
            for outcome in done:
                if isinstance(outcome, BaseException):
                    raise outcome
        return [r for r in results if r is not None]


def _refuse_size(key: str, size: int, limit: int, log: Log) -> None:
    """:raises ConfigError: for a record of ``size`` bytes (body and headers) over ``limit``."""
    raise ConfigError(
        f"the record of key {key!r} is {size} bytes (body and headers); the log "
        f"{log.url or type(log).__name__} takes records of at most {limit} bytes "
        f"(max_record_size)"
    )


class _Encoder:
    """Encodes the events of one call with the same ``properties``: the headers
    but ``wk-key`` are made once per event type (see :meth:`Producer.encode`)."""

    def __init__(self, properties: Mapping[str, str] | None) -> None:
        self._properties = properties
        self._types: dict[type, _Kind] = {}

    def _type(self, cls: type, event: Any) -> _Kind:
        etype = event_type(event)
        etype.key_of(event)  # a missing key is reported before a bad property
        headers = build_headers(etype, "", self._properties)
        size = sum(len(name) + len(value) for name, value in headers.items())
        codec = etype.codec
        # The codec's own methods (EventType.encode and decode call them): one
        # Python frame less per event.
        decode = codec.decode if isinstance(codec, JsonCodec) else None
        found = self._types[cls] = (etype, headers, size, codec.encode, decode)
        return found

    def encode(self, event: Any) -> tuple[str, OutgoingRecord, int]:
        """The key and record of ``event`` (as :meth:`Producer.encode`), and the
        record's size: body plus header names and values, in bytes."""
        cls = type(event)
        found = self._types.get(cls)
        etype, template, size, encode, decode = (
            found if found is not None else self._type(cls, event)
        )
        key = etype.key_of(event)
        try:
            body = encode(event)
        except Exception as exc:
            raise ConfigError(
                f"cannot encode an event of type {etype.tag!r} with key {key!r}: {exc}"
            ) from exc
        if decode is not None:
            # A JSON body must carry the event to a consumer (checked here, not
            # in a function of its own: one Python frame less per event).
            if b"null" in body:
                _refuse_non_finite(etype.tag, key, event)
            try:
                decode(body)
            except Exception as exc:
                raise ConfigError(
                    f"an event of type {etype.tag!r} with key {key!r} would not decode back "
                    f"from its JSON body: {exc}"
                ) from exc
        headers = template.copy()  # the order of build_headers: wk-key keeps its place
        headers[H_KEY] = raw_key = key.encode()
        return key, (headers, body), len(body) + size + len(raw_key)


# An event class's type, headers with an empty wk-key and their size in bytes,
# its codec's encode, and its decode when the body must be checked to decode
# back (JSON codec).
_Kind = tuple[
    EventType[Any], dict[str, bytes], int, Callable[[Any], bytes], Callable[[bytes], Any] | None
]


class SyncProducer:
    """A blocking wrapper of :class:`Producer` for scripts (its own event loop thread).

    :param log: the log to write to; it is used only from this wrapper's loop.
    :param topic: the topic (must exist).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, log: Log, topic: str) -> None:
        self._producer = Producer(log, topic)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="wakuwaku-sync-producer"
        )
        self._thread.start()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def publish(self, event: Any, *, properties: Mapping[str, str] | None = None) -> Published:
        """Blocking :meth:`Producer.publish`."""
        result: Published = self._run(self._producer.publish(event, properties=inject(properties)))
        return result

    def publish_many(
        self, events: Sequence[Any], *, properties: Mapping[str, str] | None = None
    ) -> list[Published]:
        """Blocking :meth:`Producer.publish_many`."""
        result: list[Published] = self._run(
            self._producer.publish_many(events, properties=inject(properties))
        )
        return result

    def close(self) -> None:
        """Close the log and stop the loop thread."""
        if self._loop.is_closed():
            return
        self._run(self._producer.log.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _refuse_non_finite(tag: str, key: str, event: Any) -> None:
    """:raises ConfigError: when ``event`` holds a NaN or infinite float, which a
    JSON body cannot carry (msgspec writes ``null``; see :meth:`Producer.encode`)."""
    if _has_non_finite(_builtins(event)):
        raise ConfigError(
            f"an event of type {tag!r} with key {key!r} holds a NaN or infinite float, "
            f"which JSON cannot carry (it would be written as null)"
        )


def _builtins(event: Any) -> Any:
    dump = getattr(event, "model_dump", None)  # pydantic
    if callable(dump):
        return dump()
    try:
        return msgspec.to_builtins(event)
    except Exception:  # noqa: BLE001 - a type msgspec cannot walk is checked by decoding
        return None


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_has_non_finite(v) for v in value)
    return False
