"""The planner: batch -> decoded items -> segments per key -> reduction -> runs -> chunks.

Pure functions, no I/O (SPEC 2, 4, 5.1-5.3). Every input record ends up in
exactly one place: an item's ``sources`` (to be handled, routed or retried)
or a :class:`Reject` (to be dead-lettered). Reduction merges only adjacent
items of one key and one type, and a merged item remembers every offset and
message id it stands for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from .._events import Algebra, EventType
from .._records import (
    H_ALG,
    H_KEY,
    H_TYPE,
    H_VERSION,
    WIRE_VERSION,
    InvalidHeaders,
    ReasonCode,
    Record,
    Source,
    header_text,
    message_id,
    validate_headers,
)

log = logging.getLogger("wakuwaku.consumer")


class Item(msgspec.Struct, gc=False):
    """One event on its way to a handler: a decoded record, or several reduced into one.

    :param key: the ordering key.
    :param event_type: the registered type.
    :param event: the (possibly combined) event.
    :param sources: the records it stands for, in order (main-topic records, or
        retry-topic records during a retry attempt).
    :param origins: per source record, where it comes from in the main topic
        (topic, partition, main offsets, message ids of SPEC 9).
    :param props: the ``wk-props`` of its first record.
    :param failed_at: for retry records, the key's first failure (seconds since epoch).
    :param reduced: true when ``event`` is not the decoded body of one record.
    """

    key: str
    event_type: EventType[Any]
    event: Any
    sources: tuple[Record, ...]
    origins: tuple[Source, ...]
    props: dict[str, str] = msgspec.field(default_factory=dict)
    failed_at: float | None = None
    reduced: bool = False

    @property
    def offsets(self) -> tuple[int, ...]:
        """Offsets of :attr:`sources` in the partition being processed."""
        return tuple(r.offset for r in self.sources)

    @property
    def ids(self) -> tuple[str, ...]:
        """The message ids (SPEC 9) of every main-topic record it stands for."""
        return tuple(i for o in self.origins for i in o.ids)

    @property
    def main_offsets(self) -> tuple[int, ...]:
        """The main-topic offsets it stands for."""
        return tuple(off for o in self.origins for off in o.offsets)

    @property
    def tag(self) -> str:
        return self.event_type.tag


@dataclass(frozen=True, slots=True)
class Reject:
    """A record that cannot reach a handler, and why (SPEC 8)."""

    record: Record
    reason: ReasonCode
    detail: str
    key: str | None = None


@dataclass(slots=True)
class Run:
    """A maximal sequence of one key's items of one type, after reduction (SPEC 2)."""

    key: str
    event_type: EventType[Any]
    items: list[Item]

    def chunks(self, max_batch: int) -> list[list[Item]]:
        """The run cut into chunks of at most ``max_batch`` items, in order."""
        return [self.items[i : i + max_batch] for i in range(0, len(self.items), max_batch)]


@dataclass(slots=True)
class Segment:
    """One key's runs within one batch or one retry attempt, in order."""

    key: str
    runs: list[Run]

    def items(self) -> list[Item]:
        return [item for run in self.runs for item in run.items]


def decode_records(
    records: Iterable[Record],
    topic: str,
    partition: int,
    types: Mapping[str, EventType[Any]],
    *,
    from_retry: bool = False,
) -> tuple[list[Item], list[Reject]]:
    """Validate headers and decode bodies (SPEC 3, 5.1, 8).

    :param topic: / :param partition: where the records were read (the main
        topic; for retry records the main topic they belong to).
    :param from_retry: true for records of the retry topic: their message ids
        and main offsets come from ``wk-src``, which must be present.
    :returns: items in input order, and rejects with their reason codes.
    """
    items: list[Item] = []
    rejects: list[Reject] = []
    fast = _fast_signatures(types)
    prefix = f"{topic}/{partition}/"  # message_id() of a record without its own id
    append = items.append
    for record in records:
        headers = record.headers
        entry = fast.get((headers.get(H_VERSION), headers.get(H_TYPE), headers.get(H_ALG)))
        raw_key = headers.get(H_KEY)
        if entry is not None and raw_key and len(headers) == 4 and not from_retry:
            # The common case: exactly the four headers a producer stamps, all
            # known good; only the key and the body need decoding.
            etype, decode, has_id = entry
            try:
                key = raw_key.decode("utf-8")
                value = decode(record.body)
            except Exception:  # noqa: BLE001 - the slow path below names the problem
                pass
            else:
                ident = (message_id(topic, partition, record.offset, etype.id_of(value),
                                    etype.tag) if has_id else prefix + str(record.offset))
                append(Item(key, etype, value, (record,),
                            (Source(topic, partition, (record.offset,), (ident,)),),
                            _NO_PROPS, None))
                continue
        item = _decode_one(record, topic, partition, types, from_retry, rejects)
        if item is not None:
            append(item)
    return items, rejects


_NO_PROPS: dict[str, str] = {}
"""Shared by every item without properties; never mutated."""


def _decode_one(record: Record, topic: str, partition: int,
                types: Mapping[str, EventType[Any]], from_retry: bool,
                rejects: list[Reject]) -> Item | None:
    """Decode one record the careful way: every header checked, every problem named."""
    checked = validate_headers(record.headers, types)
    if isinstance(checked, InvalidHeaders):
        rejects.append(Reject(record, checked.reason, checked.detail, _safe_key(record)))
        return None
    etype, key, source = checked.event_type, checked.key, checked.source
    try:
        value = etype.decode(record.body)
    except Exception as exc:  # noqa: BLE001 - any codec failure is a bad body
        rejects.append(
            Reject(record, ReasonCode.UNDECODABLE_BODY,
                   f"cannot decode {etype.tag!r}: {type(exc).__name__}: {exc}", key)
        )
        return None
    if from_retry:
        if source is None:
            rejects.append(Reject(record, ReasonCode.MALFORMED_HEADER,
                                  "retry record without wk-src", key))
            return None
        origin = source
    elif source is not None:
        # A replayed dead letter keeps the identity of the record it was (SPEC 9).
        origin = Source(topic, partition, (record.offset,), source.ids)
    else:
        ident = message_id(topic, partition, record.offset, etype.id_of(value), etype.tag)
        origin = Source(topic, partition, (record.offset,), (ident,))
    return Item(key, etype, value, (record,), (origin,), checked.props or _NO_PROPS,
                checked.failed_at)


_Fast = dict[tuple[Any, ...], tuple[EventType[Any], Callable[[bytes], Any], bool]]
_FAST: dict[int, tuple[Mapping[str, EventType[Any]], _Fast]] = {}


def _fast_signatures(types: Mapping[str, EventType[Any]]) -> _Fast:
    """``(wk-v, wk-type, wk-alg)`` raw values known to be valid, per type table,
    with the type's decode function and whether it declares its own id."""
    cached = _FAST.get(id(types))
    if cached is not None and cached[0] is types:
        return cached[1]
    table: _Fast = {
        (WIRE_VERSION, tag.encode(), etype.algebra.value.encode()):
            (etype, etype.codec.decode, etype.id_name is not None)
        for tag, etype in types.items()
    }
    if len(_FAST) > 64:
        _FAST.clear()
    _FAST[id(types)] = (types, table)
    return table


def _safe_key(record: Record) -> str | None:
    try:
        return header_text(record.headers, H_KEY)
    except Exception:  # noqa: BLE001 - a broken header value is reported elsewhere
        return None


def segment(items: Iterable[Item]) -> dict[str, list[Item]]:
    """Group items by key, keeping each key's order and the keys' first-seen order."""
    segments: dict[str, list[Item]] = {}
    for item in items:
        bucket = segments.get(item.key)
        if bucket is None:
            segments[item.key] = [item]
        else:
            bucket.append(item)
    return segments


def split_runs(items: Sequence[Item]) -> list[list[Item]]:
    """Cut one key's items into maximal runs of consecutive items of one type."""
    runs: list[list[Item]] = []
    for item in items:
        if runs and runs[-1][-1].event_type is item.event_type:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def merge(first: Item, second: Item, event: Any) -> Item:
    """One item standing for ``first`` then ``second`` with the given event."""
    return Item(
        key=first.key,
        event_type=first.event_type,
        event=event,
        sources=first.sources + second.sources,
        origins=first.origins + second.origins,
        props=first.props,
        failed_at=first.failed_at if first.failed_at is not None else second.failed_at,
        reduced=True,
    )


def reduce_run(items: Sequence[Item]) -> list[Item]:
    """Reduce one run by its type's algebra (SPEC 4).

    ``idempotent``: consecutive equal events collapse into one. ``associative``:
    fold left to right with ``combine``; ``None`` (or an exception from
    ``combine``, which is logged) keeps the two apart. ``plain``: unchanged.
    """
    if len(items) < 2:
        return list(items)
    etype = items[0].event_type
    if etype.algebra is Algebra.PLAIN:
        return list(items)
    out: list[Item] = [items[0]]
    for item in items[1:]:
        last = out[-1]
        if etype.algebra is Algebra.IDEMPOTENT:
            if _equal(last.event, item.event):
                out[-1] = merge(last, item, last.event)
            else:
                out.append(item)
            continue
        combined = _combine(etype, last, item)
        if combined is None:
            out.append(item)
        else:
            out[-1] = merge(last, item, combined)
    return out


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an event whose __eq__ fails is simply not equal
        return False


def _combine(etype: EventType[Any], a: Item, b: Item) -> Any:
    try:
        return etype.combine(a.event, b.event)
    except Exception as exc:  # noqa: BLE001 - a failing combine must not lose events
        log.error(
            "combine failed; events kept apart",
            extra={"type": etype.tag, "key": a.key, "offsets": list(a.offsets + b.offsets),
                   "error": f"{type(exc).__name__}: {exc}"},
        )
        return None


def plan(items: Iterable[Item]) -> list[Segment]:
    """Segments per key, each a list of reduced runs, in first-seen key order (SPEC 5.3)."""
    segments: list[Segment] = []
    for key, key_items in segment(items).items():
        runs = [
            Run(key, run[0].event_type, reduce_run(run)) for run in split_runs(key_items)
        ]
        segments.append(Segment(key, runs))
    return segments


def chunk_plan(
    segments: Sequence[Segment], max_batch_of: Callable[[str], int]
) -> list[list[list[Item]]]:
    """For inspection and tests: every segment's chunks, flattened per segment."""
    return [
        [chunk for run in seg.runs for chunk in run.chunks(max_batch_of(run.event_type.tag))]
        for seg in segments
    ]
