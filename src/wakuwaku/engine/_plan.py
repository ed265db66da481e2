"""The planner: batch -> decoded items -> segments per key -> reduction -> runs -> chunks.

Pure functions, no I/O (design §2, §4, §5.1-5.3). Every input record ends up in
exactly one place: an item's ``sources`` (to be handled, routed or retried)
or a :class:`Reject` (to be dead-lettered). Reduction merges only adjacent
items of one key and one type, and a merged item remembers every offset and
message id it stands for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, overload

import msgspec

from .._events import Algebra, EventType
from .._records import (
    H_ALG,
    H_DUE,
    H_ERROR,
    H_FAILED_AT,
    H_GROUP,
    H_KEY,
    H_SRC,
    H_TYPE,
    H_VERSION,
    RETRY_ONLY_HEADERS,
    WIRE_VERSION,
    InvalidHeaders,
    ReasonCode,
    Record,
    Source,
    ValidHeaders,
    checked_source,
    key_or_none,
    message_id,
    parse_ms,
    validate_headers,
)
from .._sanitize import sanitize

logger = logging.getLogger("wakuwaku.consumer")


class Where(msgspec.Struct, frozen=True, gc=False):
    """Where a batch's records were read: the main topic and partition.

    Shared by every item decoded from one poll, so that an item's message
    identity (design §9) is only built when something asks for it (the inbox,
    a retry or dead-letter copy, a handler reading its chunk context).
    """

    topic: str
    partition: int


class Item(msgspec.Struct, gc=False):
    """One event on its way to a handler: a decoded record, or several reduced into one.

    :param key: the ordering key.
    :param event_type: the registered type.
    :param event: the (possibly combined) event.
    :param record: the first record it stands for (of the main topic, or of
        the retry topic during a retry attempt).
    :param origin: where that record comes from in the main topic: a
        :class:`Where` for a main-topic record whose identity is its own
        offset or id, or an explicit :class:`Source` (a retry record's or a
        replayed dead letter's ``wk-src``).
    :param props: the ``wk-props`` of its first record.
    :param parts: for a reduced item, the single-record items it stands
        for, in order; None otherwise.
    :param failed_at: for retry records, the key's first failure (seconds since epoch).
    :param count: how many main-topic records it stands for.
    """

    key: str
    event_type: EventType[Any]
    event: Any
    record: Record
    origin: Where | Source
    props: dict[str, str]
    parts: tuple[Item, ...] | None = None
    failed_at: float | None = None
    count: int = 1

    @property
    def reduced(self) -> bool:
        """True when :attr:`event` is not the decoded body of one record."""
        return self.parts is not None

    @property
    def sources(self) -> tuple[Record, ...]:
        """The records it stands for, in order."""
        if self.parts is None:
            return (self.record,)
        return tuple(part.record for part in self.parts)

    @property
    def origins(self) -> tuple[Source, ...]:
        """Per source record, where it comes from in the main topic (topic,
        partition, main offsets, message ids of design §9)."""
        if self.parts is None:
            return (self._source(),)
        return tuple(part._source() for part in self.parts)

    def _source(self) -> Source:
        origin = self.origin
        if isinstance(origin, Source):
            return origin
        offset = self.record.offset
        ident = message_id(origin.topic, origin.partition, offset)
        return Source(origin.topic, origin.partition, (offset,), (ident,))

    @property
    def offsets(self) -> tuple[int, ...]:
        """Offsets of :attr:`sources` in the partition being processed."""
        return tuple(r.offset for r in self.sources)

    @property
    def ids(self) -> tuple[str, ...]:
        """The message ids (design §9) of every main-topic record it stands for."""
        origin = self.origin
        if self.parts is None:
            # The common case without building a Source: the inbox filter
            # and the chunk context ask once per item.
            if isinstance(origin, Source):
                return origin.ids
            return (message_id(origin.topic, origin.partition, self.record.offset),)
        return tuple(i for o in self.origins for i in o.ids)

    @property
    def main_offsets(self) -> tuple[int, ...]:
        """The main-topic offsets it stands for."""
        if self.parts is None:
            origin = self.origin
            return origin.offsets if isinstance(origin, Source) else (self.record.offset,)
        return tuple(off for o in self.origins for off in o.offsets)

    @property
    def tag(self) -> str:
        return self.event_type.tag


@dataclass(frozen=True, slots=True)
class Reject:
    """A record that cannot reach a handler, and why (design §8)."""

    record: Record
    reason: ReasonCode | None
    """Why it is dead-lettered; None for a record addressed to another
    consumer group (``wk-for-group``), which is skipped, not dead-lettered."""
    detail: str
    key: str | None = None


class Run(msgspec.Struct, gc=False):
    """A maximal sequence of one key's items of one type (design §2), read as a
    sequence of :class:`Item` (``len``, indexing, slicing, iteration).

    Held as the events and, per event, its item or only its record: a record
    of the main topic decoded on the short path (no own id, no props) needs
    no item until something asks for it (a failure, the chunk context, a
    graceful stop), so the common path builds none. Items built on demand
    are new objects each time, equal to each other.

    :param key: the key.
    :param event_type: the type.
    :param where: the main topic and partition of the bare records.
    :param events: the events, in order (handlers get a copy).
    :param entries: per event, its :class:`Item`, or its :class:`Record`
        when the item is the plain one of that record.
    """

    key: str
    event_type: EventType[Any]
    where: Where
    events: list[Any]
    entries: list[Item | Record]

    @classmethod
    def of(cls, items: Sequence[Item]) -> Run:
        """A run of existing items (non-empty, one key, one type)."""
        first = items[0]
        return cls(first.key, first.event_type, _NOWHERE, [i.event for i in items], list(items))

    def __len__(self) -> int:
        return len(self.events)

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> Run: ...
    def __getitem__(self, index: int | slice) -> Item | Run:
        if isinstance(index, slice):
            return Run(
                self.key, self.event_type, self.where, self.events[index], self.entries[index]
            )
        return self._item(self.events[index], self.entries[index])

    def __iter__(self) -> Iterator[Item]:
        for event, entry in zip(self.events, self.entries, strict=True):
            yield self._item(event, entry)

    def __contains__(self, item: object) -> bool:
        return any(item == mine for mine in self)

    def _item(self, event: Any, entry: Item | Record) -> Item:
        if isinstance(entry, Item):
            return entry
        return Item(self.key, self.event_type, event, entry, self.where, _NO_PROPS)


_NOWHERE = Where("", -1)
"""The ``where`` of runs whose every entry is an item (never used to build one)."""


class Segment(msgspec.Struct, gc=False):
    """One key's runs within one batch or one retry attempt, in order.

    Each run is non-empty and reduced by its type's algebra; consecutive
    runs have different types (design §2).
    """

    key: str
    runs: list[Run]

    def items(self) -> list[Item]:
        return [item for run in self.runs for item in run]


def chunks(run: Run, max_batch: int) -> list[Run]:
    """``run`` cut into chunks of at most ``max_batch`` items, in order (a run
    that fits is its own only chunk: the same run, not a copy)."""
    if len(run) <= max_batch:
        return [run]
    return [run[i : i + max_batch] for i in range(0, len(run), max_batch)]


Groups = dict[str, list[Run]]
"""Items by key in first-seen key order, each key's items cut into maximal
runs of one type, in order (the planner's step before reduction)."""


def decode_records(
    records: Iterable[Record],
    topic: str,
    partition: int,
    types: Mapping[str, EventType[Any]],
    *,
    from_retry: bool = False,
    group: str | None = None,
) -> tuple[list[Item], list[Reject]]:
    """Validate headers and decode bodies (design §3, §5.1, §8).

    :param topic: / :param partition: where the records were read (the main
        topic; for retry records the main topic they belong to).
    :param from_retry: true for records of the retry topic: their message ids
        and main offsets come from ``wk-src``, which must be present; false
        for the main topic, where the retry topic's own headers
        (:data:`~wakuwaku._records.RETRY_ONLY_HEADERS`) make a record
        ``malformed_header``.
    :param group: the reading consumer group: a main-topic record whose
        ``wk-for-group`` names another group is a reject with reason None.
    :returns: items in input order, and rejects with their reason codes.
    """
    if from_retry:
        return _decode_retry(records, Where(topic, partition), types)
    items, _, rejects = decode_batch(records, topic, partition, types, group=group)
    return items, rejects


RETRY_WORK_HEADERS = frozenset(
    {H_VERSION, H_TYPE, H_KEY, H_ALG, H_FAILED_AT, H_DUE, H_ERROR, H_GROUP, H_SRC}
)
"""The headers of a retry work record as the engine writes it for a main
record with only the four producer headers (``wk-due-at`` is the retry
state's own, see :mod:`._retry`; ``wk-group`` is the writer, checked when
the state is built, not here)."""


def _decode_retry(
    records: Iterable[Record], where: Where, types: Mapping[str, EventType[Any]]
) -> tuple[list[Item], list[Reject]]:
    """:func:`decode_records` of retry-topic records.

    A work record with exactly :data:`RETRY_WORK_HEADERS`, a known
    ``(wk-v, wk-type, wk-alg)``, a UTF-8 key, a usable ``wk-failed-at`` and
    ``wk-src`` and a body that decodes takes a short path (the careful path
    cost a failing key's attempts 4 us a record). Anything
    else, or any exception on the way, takes the careful path of the main
    topic's records, which gives every problem its reason (design §8): the
    short path only ever accepts records the careful one accepts, with the
    same item.
    """
    items: list[Item] = []
    rejects: list[Reject] = []
    fast = _fast_signatures(types)
    expected = RETRY_WORK_HEADERS
    append = items.append
    for record in records:
        headers = record.headers
        try:
            if headers.keys() != expected:
                raise KeyError(H_SRC)
            etype, decode, _ = fast[_signature(headers)]
            key = headers[H_KEY].decode("utf-8")
            failed_at = parse_ms(headers[H_FAILED_AT])
            source = checked_source(headers[H_SRC])
            if not key or failed_at is None or source is None:
                raise ValueError(H_SRC)
            value = decode(record.body)
        except Exception:  # noqa: BLE001 - the careful path names the problem
            careful = _decode_one(record, where, types, True, rejects, None)
            if careful is not None:
                append(careful)
            continue
        append(
            Item(key, etype, value, record, source, _NO_PROPS, None, failed_at, len(source.offsets))
        )
    return items, rejects


def decode_batch(
    records: Iterable[Record],
    topic: str,
    partition: int,
    types: Mapping[str, EventType[Any]],
    *,
    from_retry: bool = False,
    compact: bool = False,
    group: str | None = None,
) -> tuple[list[Item], Groups, list[Reject]]:
    """:func:`decode_records`, and the items grouped as :func:`runs_by_key` does, in one pass.

    :param compact: build no item for a record on the short path whose type
        has no own id: its run keeps the record (see :class:`Run`), and the
        list of items in input order is not built (empty).
    :returns: items in input order (the runs hold the same objects), the
        items as :data:`Groups`, and rejects with their reason codes.
    """
    items: list[Item] = []
    groups: Groups = {}
    rejects: list[Reject] = []
    where = Where(topic, partition)
    # When compact, items are not listed (a list thrown away takes the few built).
    append = ([] if compact else items).append
    # The common case takes a short path: exactly the four headers a
    # producer stamps, with a (version, type, algebra) triple known good, so
    # only the key and the body need decoding. Anything else (retry records
    # carry more headers) takes the careful path, which names the problem.
    # Logs may hand out one headers dict for equal headers (SQLiteLog does),
    # so a dict found good is not checked again within the batch, and its
    # entry leads straight to its key's runs.
    fast = {} if from_retry else _fast_signatures(types)
    # id(headers) -> (headers, type, decode, has_id, key, the key's runs).
    # Each entry holds its dict, so no other dict gets that id meanwhile.
    known: dict[int, tuple[Any, EventType[Any], Callable[[bytes], Any], bool, str, list[Run]]] = {}
    runs_of: dict[str, list[Run]] = {}  # per key; in groups once it has an item
    get = known.get
    entry: Item | Record
    for record in records:
        headers = record.headers
        memo = get(id(headers))
        try:
            if memo is None:
                etype, decode, has_id = fast[_signature(headers)]
                key = headers[H_KEY].decode("utf-8")
                if len(headers) != 4 or not key:
                    raise KeyError(H_KEY)
                memo = known[id(headers)] = (
                    headers,
                    etype,
                    decode,
                    has_id,
                    key,
                    runs_of.setdefault(key, []),
                )
            _, etype, decode, has_id, key, runs = memo
            value = decode(record.body)
        except Exception:  # noqa: BLE001 - the careful path names the problem
            careful = _decode_one(record, where, types, from_retry, rejects, group)
            if careful is None:
                continue
            entry, key, etype, value = careful, careful.key, careful.event_type, careful.event
            runs = runs_of.setdefault(key, [])
            append(careful)
        else:
            if has_id:
                origin = _own_origin(record, where, etype, value, key, rejects)
                if origin is None:
                    continue
                entry = Item(key, etype, value, record, origin, _NO_PROPS)
                append(entry)
            elif compact:
                entry = record
            else:
                entry = Item(key, etype, value, record, where, _NO_PROPS)
                append(entry)
        # Grouping as runs_by_key() does, inline: this loop runs once per record.
        if runs and (last := runs[-1]).event_type is etype:
            last.events.append(value)
            last.entries.append(entry)
        else:
            if not runs:
                groups[key] = runs
            runs.append(Run(key, etype, where, [value], [entry]))
    return items, groups, rejects


_signature = itemgetter(H_VERSION, H_TYPE, H_ALG)
"""The raw ``(wk-v, wk-type, wk-alg)`` of a record's headers; KeyError when one is missing."""

_NO_PROPS: dict[str, str] = {}
"""Shared by every item without properties; never mutated."""
NO_PROPS = _NO_PROPS


def _decode_one(
    record: Record,
    where: Where,
    types: Mapping[str, EventType[Any]],
    from_retry: bool,
    rejects: list[Reject],
    group: str | None,
) -> Item | None:
    """Decode one record the careful way: every header checked, every problem named.

    Any exception while parsing dead-letters the record (design §8): a record
    must never stop its partition.
    """
    try:
        checked = _checked_headers(record, types, from_retry)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a broken header
        checked = InvalidHeaders(
            ReasonCode.MALFORMED_HEADER, f"headers cannot be parsed: {type(exc).__name__}: {exc}"
        )
    if isinstance(checked, InvalidHeaders):
        rejects.append(Reject(record, checked.reason, checked.detail, key_or_none(record.headers)))
        return None
    if not from_retry and checked.for_group is not None and checked.for_group != group:
        rejects.append(
            Reject(record, None, f"addressed to group {checked.for_group!r}", checked.key)
        )
        return None
    etype, key, source = checked.event_type, checked.key, checked.source
    try:
        value = etype.decode(record.body)
    except Exception as exc:  # noqa: BLE001 - any codec failure is a bad body
        rejects.append(
            Reject(
                record,
                ReasonCode.UNDECODABLE_BODY,
                f"cannot decode {etype.tag!r}: {type(exc).__name__}: {exc}",
                key,
            )
        )
        return None
    origin: Where | Source = where
    if from_retry:
        if source is None:
            rejects.append(
                Reject(record, ReasonCode.MALFORMED_HEADER, "retry record without wk-src", key)
            )
            return None
        origin = source
    elif source is not None:
        # A replayed dead letter keeps the identity of the record it was (design §9).
        origin = Source(where.topic, where.partition, (record.offset,), source.ids)
    elif etype.id_name is not None:
        own = _own_origin(record, where, etype, value, key, rejects)
        if own is None:
            return None
        origin = own
    return Item(
        key,
        etype,
        value,
        record,
        origin,
        checked.props or _NO_PROPS,
        None,
        checked.failed_at,
        len(origin.offsets) if isinstance(origin, Source) else 1,
    )


def _checked_headers(
    record: Record, types: Mapping[str, EventType[Any]], from_retry: bool
) -> ValidHeaders | InvalidHeaders:
    if not from_retry:
        internal = sorted(RETRY_ONLY_HEADERS.intersection(record.headers))
        if internal:
            return InvalidHeaders(
                ReasonCode.MALFORMED_HEADER,
                f"the retry topic's own header {internal[0]} is not allowed on a main-topic record",
            )
    return validate_headers(record.headers, types)


def _own_origin(
    record: Record, where: Where, etype: EventType[Any], value: Any, key: str, rejects: list[Reject]
) -> Source | None:
    """The origin of a main-topic record whose type declares its own id (design §9);
    None, with a reject, when the id cannot be read from the event."""
    try:
        own_id = etype.id_of(value)
    except Exception as exc:  # noqa: BLE001 - a failing id accessor makes the body unusable
        rejects.append(
            Reject(
                record,
                ReasonCode.UNDECODABLE_BODY,
                f"cannot read the id of {etype.tag!r}: {type(exc).__name__}: {exc}",
                key,
            )
        )
        return None
    ident = message_id(where.topic, where.partition, record.offset, own_id, etype.tag)
    return Source(where.topic, where.partition, (record.offset,), (ident,))


_Fast = dict[tuple[Any, ...], tuple[EventType[Any], Callable[[bytes], Any], bool]]
_FAST: dict[int, tuple[Mapping[str, EventType[Any]], _Fast]] = {}


def _fast_signatures(types: Mapping[str, EventType[Any]]) -> _Fast:
    """``(wk-v, wk-type, wk-alg)`` raw values known to be valid, per type table,
    with the type's decode function and whether it declares its own id."""
    cached = _FAST.get(id(types))
    if cached is not None and cached[0] is types:
        return cached[1]
    table: _Fast = {
        (WIRE_VERSION, tag.encode(), etype.algebra.value.encode()): (
            etype,
            etype.codec.decode,
            etype.id_name is not None,
        )
        for tag, etype in types.items()
    }
    if len(_FAST) > 64:
        _FAST.clear()
    _FAST[id(types)] = (types, table)
    return table


def merge(first: Item, second: Item, event: Any) -> Item:
    """One item standing for ``first`` then ``second`` with the given event."""
    return Item(
        key=first.key,
        event_type=first.event_type,
        event=event,
        record=first.record,
        origin=first.origin,
        props=first.props,
        parts=(first.parts or (first,)) + (second.parts or (second,)),
        failed_at=first.failed_at if first.failed_at is not None else second.failed_at,
        count=first.count + second.count,
    )


def reduce_run(items: Sequence[Item]) -> list[Item]:
    """Reduce one run by its type's algebra (design §4).

    ``idempotent``: consecutive equal events collapse into one. ``associative``:
    fold left to right with ``combine``; ``None`` (or an exception from
    ``combine``, which is logged) keeps the two apart. ``plain``: unchanged.
    Records whose ``wk-props`` differ are never merged: a combined event has
    one set of properties (a tenant, a trace id), so merging would credit the
    second record to the first's.
    """
    if len(items) < 2 or items[0].event_type.algebra is Algebra.PLAIN:
        return items if isinstance(items, list) else list(items)
    etype = items[0].event_type
    out: list[Item] = [items[0]]
    for item in items[1:]:
        last = out[-1]
        if last.props != item.props:
            out.append(item)
            continue
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
        logger.error(
            "combine failed; events kept apart",
            extra={
                "topic": a.origin.topic,
                "partition": a.origin.partition,
                "type": etype.tag,
                "key": a.key,
                "offsets": list(a.main_offsets + b.main_offsets),
                "error": sanitize(exc),
            },
        )
        return None


def runs_by_key(items: Iterable[Item]) -> Groups:
    """Group items by key and cut each key's items into runs of one type (design §5.3).

    :func:`decode_batch` does the same inline, for the records it decodes.
    """
    groups: Groups = {}
    for item in items:
        runs = groups.setdefault(item.key, [])
        if runs and (last := runs[-1]).event_type is item.event_type:
            last.events.append(item.event)
            last.entries.append(item)
        else:
            runs.append(Run(item.key, item.event_type, _NOWHERE, [item.event], [item]))
    return groups


def plan_groups(groups: Groups, *, reduces: bool = True) -> list[Segment]:
    """One segment per key, its runs reduced by their types' algebra (design §4).

    A key whose runs are all plain keeps the very list ``groups`` holds
    (nothing is copied for it); ``groups`` itself is not changed.

    :param reduces: false when no type of ``groups`` has an algebra other
        than plain (the caller knows its handlers' types): nothing is checked.
    """
    if not reduces:
        return [Segment(key, runs) for key, runs in groups.items()]
    plain = Algebra.PLAIN
    segments: list[Segment] = []
    append = segments.append
    for key, runs in groups.items():
        planned = runs
        for index, run in enumerate(runs):
            if len(run.events) > 1 and run.event_type.algebra is not plain:
                if planned is runs:
                    planned = list(runs)
                planned[index] = Run.of(reduce_run(list(run)))
        append(Segment(key, planned))
    return segments


def plan(items: Iterable[Item]) -> list[Segment]:
    """Segments per key, each a list of reduced runs, in first-seen key order (design §5.3)."""
    return plan_groups(runs_by_key(items))


def chunk_plan(
    segments: Sequence[Segment], max_batch_of: Callable[[str], int]
) -> list[list[list[Item]]]:
    """For inspection and tests: every segment's chunks as item lists, flattened per segment."""
    return [
        [list(chunk) for run in seg.runs for chunk in chunks(run, max_batch_of(run.event_type.tag))]
        for seg in segments
    ]
