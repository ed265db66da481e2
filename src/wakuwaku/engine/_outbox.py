"""The outbox: buffered dead-letter and retry writes of one partition, and their fenced store.

Owns the records a main batch or an attempt round produces for the
dead-letter topic (design §8) and the retry topic (design §5.5, §6), the offsets of
the current main batch that are done without a handler (dead-lettered,
routed, skipped), and the store that writes all of it, with the partition's
offsets, under the partition's lease: one transaction where the log has an
atomic store, ordered fenced calls elsewhere (:meth:`Outbox.flush`).

May call: :mod:`._shared` (the retrying log call, the counters, the retry
state it applies written retry records to), :mod:`._retry` (record
builders). Called by the executor, the attempts and the partition loop.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache, partial
from operator import attrgetter, itemgetter
from typing import Any, Protocol, TypeVar, cast

from .._events import EventType
from .._records import (
    H_ERROR,
    H_FAILED_AT,
    H_GROUP,
    H_HELD,
    H_MARKER,
    H_REASON,
    H_SRC,
    ReasonCode,
    Record,
    Source,
    checked_source,
    encode_source,
    message_id,
    parse_ms,
)
from .._sanitize import sanitize
from ..logs import BatchWrite
from ._plan import NO_PROPS, Item, Reject, Run, Where
from ._retry import (
    WRITTEN_HORIZON,
    Outgoing,
    Written,
    dead_letter_record,
    work_common,
)
from ._shared import PartitionServices, logger

_count = attrgetter("count")
# Of a work record's _Meta: its origin, the origin's main offsets, its size.
_origin = itemgetter(2)
_main_offsets = attrgetter("offsets")
_size = itemgetter(5)
_T = TypeVar("_T")

#: What the writer of one retry work record knows of it: key, type, origin
#: (``wk-src``), props, stored ``wk-failed-at`` (seconds) and its size in
#: bytes (body and header values).
_Meta = tuple[str, EventType[Any], Source, dict[str, str], float, int]


_MARK = 7_340_981_225_603_119_847
"""An offset no template below holds otherwise (checked)."""


@lru_cache(maxsize=64)
def _bare_source(topic: str, partition: int) -> bytes | None:
    """The ``wk-src`` of a bare main record of ``topic``/``partition`` as a
    ``%`` template of its offset (twice): the bytes :func:`encode_source`
    makes of ``Source(topic, partition, (o,), (message_id(topic, partition, o),))``,
    without building and encoding a source per record. Made by those very
    functions for one offset; None when that offset's digits are not found
    exactly twice (then every record's source is encoded). Kept per
    partition: every routed run and failed segment asks."""
    raw = encode_source(Source(topic, partition, (_MARK,), (message_id(topic, partition, _MARK),)))
    digits = str(_MARK).encode()
    if raw.count(digits) != 2:
        return None
    return raw.replace(b"%", b"%%").replace(digits, b"%d")


@lru_cache(maxsize=64)
def _bare_ident(topic: str, partition: int) -> str | None:
    """The message id of a bare main record of ``topic``/``partition`` as a
    ``%`` template of its offset: what :func:`message_id` returns, at about
    half its cost per routed record. Made by that very function for one
    offset; None when that offset's digits are not found exactly once
    (then every record's id is made by it)."""
    ident = message_id(topic, partition, _MARK)
    digits = str(_MARK)
    if ident.count(digits) != 1:
        return None
    return ident.replace("%", "%%").replace(digits, "%d")


def _records_of(items: Iterable[Item]) -> list[Record]:
    """The records ``items`` stand for (:attr:`Item.sources`), in order,
    without a tuple per item."""
    out: list[Record] = []
    for item in items:
        if item.parts is None:
            out.append(item.record)
        else:
            out += [part.record for part in item.parts]
    return out


def _all_below(metas: list[_Meta | None], main_offset: int) -> bool:
    """Whether every buffered work record of ``metas`` (markers: None) is the
    copy of main records from below ``main_offset``: a flush asks at every
    main batch, over every record routed in it (C-level maps, not a
    generator per record)."""
    work = [m for m in metas if m is not None]
    return not work or max(map(min, map(_main_offsets, map(_origin, work)))) < main_offset


def _split(values: list[_T], now: list[bool]) -> tuple[list[_T], list[_T]]:
    """``values`` whose ``now`` is true, and the others, each in order."""
    return (
        [v for v, n in zip(values, now, strict=True) if n],
        [v for v, n in zip(values, now, strict=True) if not n],
    )


class _Page:
    """Buffered records one flush takes out of the outbox to store."""

    __slots__ = ("dead", "dead_counts", "dead_meta", "retry", "retry_at", "retry_meta")

    def __init__(
        self,
        dead: list[Outgoing],
        dead_meta: list[tuple[str, int | None]],
        dead_counts: Counter[str],
        retry: list[Outgoing],
        retry_at: list[tuple[float, float]],
        retry_meta: list[_Meta | None],
    ) -> None:
        self.dead = dead
        self.dead_meta = dead_meta
        self.dead_counts = dead_counts
        self.retry = retry
        self.retry_at = retry_at
        self.retry_meta = retry_meta


class _AddWork(Protocol):
    """Buffers one retry work record (see :meth:`Outbox._work`).

    :ivar failed_at: the stored ``wk-failed-at`` of its records (seconds).
    """

    failed_at: float

    def __call__(
        self,
        record: Record,
        key: str,
        etype: EventType[Any],
        origin: Source,
        props: dict[str, str],
        src: bytes | None,
        /,
    ) -> None: ...


class Outbox:
    """Dead letters and retry records waiting to be stored, and the store itself.

    :param services: the partition's shared services.

    :ivar done: offsets of the current main batch that are done without a
        handler call (None between batches): a graceful stop stores the
        offset of the first record that is not done (design §14).
    :ivar unflushed_work: buffered retry *work* records (markers excluded):
        they count against ``max_pending_retry`` before they are stored.
    """

    def __init__(self, services: PartitionServices) -> None:
        self.services = services
        self.done: set[int] | None = None
        self.unflushed_work = 0
        # Writes are buffered per batch or attempt round and flushed at its end,
        # dead letters first: one append per topic instead of one per key.
        self._dead_out: list[Outgoing] = []
        self._dead_counts: Counter[str] = Counter()
        # Per buffered dead letter: its reason and the main offset it is a
        # copy of (None for a record read from the retry topic).
        self._dead_meta: list[tuple[str, int | None]] = []
        self._retry_out: list[Outgoing] = []
        # Per buffered retry record, the (wall, monotonic) time its times were
        # taken at: applied with it, its due time becomes a monotonic deadline
        # however the wall clock steps meanwhile (design §6).
        self._retry_at: list[tuple[float, float]] = []
        # Per buffered retry record, what its writer knows of it (None for a
        # marker): applied and kept without parsing the record again.
        self._retry_meta: list[_Meta | None] = []
        # The retry partition's offset as last stored (or found at a restart).
        self.retry_committed: int | None = None
        # Main offsets at or past the stored one whose dead letters a restart
        # found already written (a crash between a batch's dead letters and
        # its offset, on a log that stores call by call): delivered again,
        # they are done, never dead-lettered twice.
        self.recovered: set[int] = set()

    def mark(self, items: Iterable[Item]) -> None:
        """Note main-batch items as done (see :attr:`done`)."""
        if self.done is not None:
            self.done.update(r.offset for item in items for r in item.sources)

    # ------------------------------------------------------------ dead letters

    def dead_letter_items(
        self, items: Iterable[Item], reason: ReasonCode, error: str, *, from_retry: bool = False
    ) -> None:
        """Buffer the dead-letter copies of every record ``items`` stand for (design §8).

        :param from_retry: the items were read from the retry topic (an
            attempt): each record keeps its own ``wk-src`` bytes, which say
            where it comes from, instead of having them decoded and encoded
            again.
        """
        items = list(items)
        group = self.services.config.group
        meta = self._dead_meta
        if from_retry:
            self._dead_retry(_records_of(items), reason, error)
        else:
            for item in items:
                for record, origin in zip(item.sources, item.origins, strict=True):
                    self._dead_out.append(
                        dead_letter_record(record, reason, error, origin, group=group)
                    )
                    meta.append((reason.value, record.offset))
        self._dead_counts[reason.value] += sum(map(_count, items))
        self.mark(items)

    def dead_letter_retry_records(
        self,
        records: list[Record],
        reason: ReasonCode,
        error: str,
        extra: dict[str, bytes] | None = None,
    ) -> None:
        """Buffer the dead-letter copies of pending retry work records as
        they are (each keeps its own ``wk-src``), with ``extra`` headers
        added (an operator's give-up names the operator)."""
        self._dead_retry(records, reason, error, extra)
        self._dead_counts[reason.value] += len(records)

    def _dead_retry(
        self,
        records: list[Record],
        reason: ReasonCode,
        error: str,
        extra: dict[str, bytes] | None = None,
    ) -> None:
        group = self.services.config.group
        added = {
            H_GROUP: group.encode(),
            H_REASON: reason.value.encode(),
            H_ERROR: error.encode(),
            **(extra or {}),
        }
        # One comprehension, and one meta tuple for all: a failing key's
        # give-up dead-letters every record it was routed (a list of a
        # round's records at a time).
        self._dead_out += [
            ({**record.headers, **added}, record.body)
            # A pending retry record is a work record: never a marker.
            if H_MARKER not in record.headers
            else self._dead_marker(record, reason, error, extra)
            for record in records
        ]
        self._dead_meta += [(reason.value, None)] * len(records)

    def _dead_marker(
        self, record: Record, reason: ReasonCode, error: str, extra: dict[str, bytes] | None
    ) -> Outgoing:
        """The dead-letter copy of a marker met where work was expected."""
        letter, body = dead_letter_record(
            record, reason, error, None, group=self.services.config.group
        )
        return {**letter, **(extra or {})}, body

    def dead_letter_rejects(self, rejects: list[Reject], *, from_retry: bool = False) -> None:
        """Buffer the dead-letter copies of records that cannot reach a handler (design §8).

        :param from_retry: the records were read from the retry partition: one
            without a usable ``wk-src`` is identified by its place there
            (``wk-retry.<group>.<topic>/<partition>/<offset>``), never as the
            main record at the same offset (whose identity, already handled,
            a replay would then carry), and it marks no main offset done.
        """
        services = self.services
        done = self.done
        for reject in rejects:
            main_offset = None if from_retry else reject.record.offset
            if reject.reason is None:  # a replayed dead letter of another group
                services.stats.other_group_skipped += 1
                if done is not None and main_offset is not None:
                    done.add(main_offset)
                continue
            if main_offset is not None and main_offset in self.recovered:
                done = self._done_again(main_offset)
                continue
            origin = self._reject_origin(reject.record, from_retry)
            detail = sanitize(reject.detail, services.config.error_text_limit)
            logger.error(
                "record dead-lettered: %s",
                reject.reason.value,
                extra={
                    **services.fields,
                    "key": reject.key,
                    "offsets": [reject.record.offset],
                    "reason": reject.reason.value,
                    "error": detail,
                },
            )
            self._dead_out.append(
                dead_letter_record(
                    reject.record, reject.reason, detail, origin, group=services.config.group
                )
            )
            self._dead_meta.append((reject.reason.value, main_offset))
            self._dead_counts[reject.reason.value] += 1
            if done is not None and main_offset is not None:
                done.add(main_offset)

    def _done_again(self, main_offset: int) -> set[int] | None:
        """Note a main record whose dead letter a restart found as done (see
        :attr:`recovered`); returns :attr:`done`."""
        self.recovered.discard(main_offset)
        if self.done is not None:
            self.done.add(main_offset)
        return self.done

    def _reject_origin(self, record: Record, from_retry: bool) -> Source:
        """The ``wk-src`` of a rejected record's dead letter: always the
        record's own place (design §8: a dead letter names the record it is
        a copy of).

        A main-topic record is named by its topic, partition and offset; it
        keeps the message ids of a ``wk-src`` that passes the consumer's
        check (a replayed dead letter's identity, design §9), never the
        offsets or place such a header claims: a forged or broken one must
        not give the dead letter, or its replay, another record's name. A
        retry record keeps the ``wk-src`` that says where it comes from when
        that one is valid, and is otherwise named by its place in the retry
        partition (never as the main record at the same offset, whose
        identity, already handled, a replay would then carry).
        """
        services = self.services
        offset = record.offset
        raw = record.headers.get(H_SRC)
        claimed = None if raw is None else checked_source(bytes(raw))
        if from_retry:
            if claimed is not None:
                return claimed
            topic = services.retry_topic
            return Source(
                topic,
                services.partition,
                (offset,),
                (message_id(topic, services.partition, offset),),
            )
        topic, partition = services.topic, services.partition
        ids = claimed.ids if claimed is not None else (message_id(topic, partition, offset),)
        return Source(topic, partition, (offset,), ids)

    # ------------------------------------------------------------- retry topic

    def write_retry(self, items: Iterable[Item], failed_at: float | None, error: str) -> float:
        """Buffer main-topic items for the retry topic, in order (design §5.5).

        :param failed_at: the key's first failure (seconds since the epoch)
            for items routed to a quarantined key; None for the failure that
            quarantines it now, whose first attempt is due after the first
            (jittered) delay.
        :returns: the failure time the records carry, as a reader finds it
            (what later records routed to the key before this write is
            stored pass as ``failed_at``).
        """
        work = self._work(failed_at, error)
        for item in items:
            where = item.origin
            if item.parts is None and isinstance(where, Where):
                # A bare main record (a failed segment's rest): as a routed one.
                record = item.record
                offset = record.offset
                topic, partition = where.topic, where.partition
                ids, src = _bare_ident(topic, partition), _bare_source(topic, partition)
                ident = ids % offset if ids else message_id(topic, partition, offset)
                origin = Source(topic, partition, (offset,), (ident,))
                work(
                    record,
                    item.key,
                    item.event_type,
                    origin,
                    item.props,
                    src and src % (offset, offset),
                )
                continue
            for record, origin in zip(item.sources, item.origins, strict=True):
                work(record, item.key, item.event_type, origin, item.props, None)
        return work.failed_at

    def write_retry_run(
        self, run: Run, failed_at: float | None, error: str, *, held: bool = False
    ) -> None:
        """:meth:`write_retry` of a main batch's run, without building an item
        for a record the run holds bare (see :class:`~._plan.Run`): routing a
        quarantined key's records costs a few dict operations each."""
        work = self._work(failed_at, error, held=held)
        key, etype, where = run.key, run.event_type, run.where
        topic, partition = where.topic, where.partition
        ids, src = _bare_ident(topic, partition), _bare_source(topic, partition)
        for entry in run.entries:
            if isinstance(entry, Record):
                offset = entry.offset
                ident = ids % offset if ids else message_id(topic, partition, offset)
                origin = Source(topic, partition, (offset,), (ident,))
                work(entry, key, etype, origin, NO_PROPS, src and src % (offset, offset))
            else:
                for record, source in zip(entry.sources, entry.origins, strict=True):
                    work(record, key, etype, source, entry.props, None)

    def _work(self, failed_at: float | None, error: str, *, held: bool = False) -> _AddWork:
        """The function that buffers one work record of this write: its common
        headers and times are taken once for all of them.

        One work record per main record (design §3, §5.5, §6), with that
        record's headers and body bytes as they were read, then the common
        headers (:func:`~._retry.work_common`), then its own ``wk-src``: a
        combined event is never encoded again, so a dead letter is
        byte-identical to what was consumed, keeps every record's own props
        and custom headers, and the next attempt plans the reduction again.

        ``held``: the records of a key an operator paused (``wk-held: 1``):
        due at once, attempted when the key is resumed.
        """
        config = self.services.config
        at = self.services.times()
        now = at[0]
        if held:
            failed_at = due = now
        elif failed_at is None:
            failed_at = now
            due = now + config.retry_delay(1)
        else:
            # The key's state already holds its due time; this one is not read.
            due = failed_at + config.delay(1)
        common = work_common(failed_at, error, due, group=config.group)
        if held:
            common[H_HELD] = b"1"
        failed = parse_ms(common[H_FAILED_AT]) or 0.0  # as a reader finds it
        out, times, meta, done = self._retry_out, self._retry_at, self._retry_meta, self.done
        common_size = sum(map(len, common.values()))
        # Per main headers dict (logs share them, and hold them while this
        # write lasts): the dict itself (so that no other gets its id
        # meanwhile), its merge with the common headers and its bytes. A
        # record's headers are a copy of that merge with its own wk-src set:
        # the same names in the same order, and the same values, as
        # ``{**headers, **common, H_SRC: src}``, at half the cost.
        merged: dict[int, tuple[dict[str, bytes], dict[str, bytes], int]] = {}

        def add(
            record: Record,
            key: str,
            etype: EventType[Any],
            origin: Source,
            props: dict[str, str],
            src: bytes | None,
        ) -> None:
            headers = record.headers
            if src is None:
                src = encode_source(origin)
            known = merged.get(id(headers))
            if known is None:
                size = sum(map(len, headers.values())) + common_size
                known = merged[id(headers)] = (headers, {**headers, **common}, size)
            _, both, size = known
            written = both.copy()
            written[H_SRC] = src
            out.append((written, record.body))
            times.append(at)
            meta.append((key, etype, origin, props, failed, size + len(src) + len(record.body)))
            if done is not None:
                done.add(record.offset)
            self.unflushed_work += 1

        add.failed_at = failed  # type: ignore[attr-defined]
        return add  # type: ignore[return-value]

    def add_markers(self, markers: Iterable[tuple[Outgoing, tuple[float, float]]]) -> None:
        """Buffer retry-topic markers, each with the (wall, monotonic) time
        its times were taken at (what an attempt round returns)."""
        for marker, at in markers:
            self._retry_out.append(marker)
            self._retry_at.append(at)
            self._retry_meta.append(None)

    def drop_from(self, main_offset: int) -> None:
        """Forget the buffered dead letters and retry work of main records at
        or past ``main_offset``: a stop in the middle of a batch stores that
        offset, so those records are delivered again and get their outcome
        then (design §7, §14: one record, one outcome).

        Written now, each would get a second outcome at the restart: a
        dead letter written twice, retry work routed twice. Every buffered
        copy stands for one main record, so a reduced run that straddles the
        offset keeps the copies below it and loses the rest. Dead letters of
        retry records and markers are kept: they belong to no main offset.
        """
        kept = [
            (out, meta)
            for out, meta in zip(self._dead_out, self._dead_meta, strict=True)
            if meta[1] is None or meta[1] < main_offset
        ]
        if len(kept) != len(self._dead_out):
            self._dead_out = [out for out, _ in kept]
            self._dead_meta = [meta for _, meta in kept]
            self._dead_counts = Counter(reason for reason, _ in self._dead_meta)
        keep = [meta is None or min(meta[2].offsets) < main_offset for meta in self._retry_meta]
        if not all(keep):
            self._retry_out = [r for r, k in zip(self._retry_out, keep, strict=True) if k]
            self._retry_at = [r for r, k in zip(self._retry_at, keep, strict=True) if k]
            self._retry_meta = [r for r, k in zip(self._retry_meta, keep, strict=True) if k]
            self.unflushed_work = sum(1 for meta in self._retry_meta if meta is not None)

    # ------------------------------------------------------------------- store

    async def flush(self, main_offset: int | None = None) -> None:
        """Store what the batch or attempt round buffered, under the partition's lease.

        Dead letters first, then retry records, then the retry partition's
        lowest pending offset (when it moved) and ``main_offset`` (when
        given). On a log with an atomic store (SQLite, memory) that is one
        transaction: a crash leaves all of it or none, so no record is both
        routed to the retry topic and delivered again, and no dead letter is
        written twice. Elsewhere each write is its
        own fenced call, in that order, so an offset is never stored before
        what it covers. Every call is retried forever on failure (design §5.6).

        With ``main_offset``, only the copies of main records below it are
        stored (and the retry records of no main record, markers): the
        copies of a later batch that runs meanwhile (a pipeline) wait for
        its own store. What is stored is taken out of the buffers before
        the log is awaited, so lanes that run meanwhile buffer into fresh
        ones; put back if the store fails.

        The retry offset stored is the low watermark *before* this flush's
        records are applied: never above the truth (at worst a restart reads
        a few resolved records again); the next flush stores the newer one.

        :raises Abandon: when the log refuses the lease (the partition stops).
        """
        services = self.services
        low = services.retry.low_watermark()
        commits: list[tuple[str, int, int]] = []
        if low != self.retry_committed:
            commits.append((services.retry_topic, services.partition, low))
        if main_offset is not None:
            commits.append((services.topic, services.partition, main_offset))
        page = self._take(main_offset)
        dead, retry = page.dead, page.retry
        appends: list[tuple[str, int, list[Outgoing]]] = []
        if dead:
            appends.append((services.dead_letter_topic, services.partition, dead))
        if retry:
            appends.append((services.retry_topic, services.partition, retry))
        if not appends and not commits:
            return
        try:
            offsets = await self._store(appends, commits)
        except BaseException:
            self._put_back(page)
            raise
        if dead:
            services.stats.dead_letters.update(page.dead_counts)
        if retry:
            self._apply_written(page, offsets)
        if low != self.retry_committed:
            self.retry_committed = low

    def _take(self, main_offset: int | None) -> _Page:
        """Take the buffered records a flush up to ``main_offset`` stores (see
        :meth:`flush`) out of the buffers."""
        dead_meta, retry_meta = self._dead_meta, self._retry_meta
        if main_offset is None or (
            all(m[1] is None or m[1] < main_offset for m in dead_meta)
            and _all_below(retry_meta, main_offset)
        ):
            page = _Page(
                self._dead_out,
                dead_meta,
                self._dead_counts,
                self._retry_out,
                self._retry_at,
                retry_meta,
            )
            self._dead_out, self._dead_meta, self._dead_counts = [], [], Counter()
            self._retry_out, self._retry_at, self._retry_meta = [], [], []
            return page
        dead_now = [m[1] is None or m[1] < main_offset for m in dead_meta]
        retry_now = [m is None or min(m[2].offsets) < main_offset for m in retry_meta]
        out, meta = _split(self._dead_out, dead_now), _split(dead_meta, dead_now)
        work = _split(self._retry_out, retry_now)
        times = _split(self._retry_at, retry_now)
        work_meta = _split(retry_meta, retry_now)
        self._dead_out, self._dead_meta = out[1], meta[1]
        self._dead_counts = Counter(reason for reason, _ in meta[1])
        self._retry_out, self._retry_at, self._retry_meta = work[1], times[1], work_meta[1]
        return _Page(
            out[0],
            meta[0],
            Counter(reason for reason, _ in meta[0]),
            work[0],
            times[0],
            work_meta[0],
        )

    def _put_back(self, page: _Page) -> None:
        """A store failed: its records go back in front of what was buffered since."""
        self._dead_out[:0] = page.dead
        self._dead_meta[:0] = page.dead_meta
        self._dead_counts.update(page.dead_counts)
        self._retry_out[:0] = page.retry
        self._retry_at[:0] = page.retry_at
        self._retry_meta[:0] = page.retry_meta

    def _apply_written(self, page: _Page, offsets: list[int]) -> None:
        """Fold the retry records just stored at ``offsets`` into the retry
        state, and keep the work records whose key is due soon for its
        attempt (:class:`~._retry.WrittenCache`).

        Work records come in runs of one key (a routed run, a failed
        segment's rest): each run past a key's first record is folded in
        with one state lookup and kept with one cache call, the same state
        and cache as record by record."""
        services = self.services
        state, written = services.retry, services.written
        now = services.clock.now()
        soon = services.clock.monotonic() + WRITTEN_HORIZON
        keys = state.keys
        retry, metas, ats = page.retry, page.retry_meta, page.retry_at
        index, end = 0, len(metas)
        while index < end:
            meta = metas[index]
            if meta is None:  # a marker
                headers, body = retry[index]
                state.apply(Record(offsets[index], headers, body, now), ats[index])
                index += 1
                continue
            key = meta[0]
            pending = keys.get(key)
            if pending is None:
                # The key's first record: its stored times set the schedule.
                state.apply_written(
                    key, offsets[index], retry[index][0], max(meta[2].offsets), ats[index]
                )
                stop = index + 1
                pending = keys.get(key)
            else:
                stop = index + 1
                while stop < end and (later := metas[stop]) is not None and later[0] == key:
                    stop += 1
                run = cast("list[_Meta]", metas[index:stop])
                top = max(map(max, map(_main_offsets, map(_origin, run))))
                state.add_written(key, pending, offsets[index:stop], top)
            if pending is not None and pending.due <= soon:
                run = cast("list[_Meta]", metas[index:stop])
                written.put_many(
                    [
                        Written(
                            Record(offset, headers, body, now), key, etype, origin, props, failed
                        )
                        for (headers, body), offset, (key, etype, origin, props, failed, _) in zip(
                            retry[index:stop], offsets[index:stop], run, strict=True
                        )
                    ],
                    list(map(_size, run)),
                )
            index = stop
        # Counted until now: while it was written, the state did not hold it yet.
        self.unflushed_work -= end - metas.count(None)

    async def _store(
        self, appends: list[tuple[str, int, list[Outgoing]]], commits: list[tuple[str, int, int]]
    ) -> list[int]:
        """Write ``appends`` then ``commits`` fenced; returns the last append's offsets."""
        services = self.services
        log, group, fence = services.log, services.config.group, services.fence
        dead_letter_topic = services.dead_letter_topic
        if log.atomic_store:
            write = BatchWrite(group, appends, commits)
            assigned = await services.log_call("store", lambda: log.store(write, fence=fence))
            return assigned[-1] if assigned else []
        offsets: list[int] = []
        dead_end: list[tuple[str, int, int]] = []
        for topic, partition, records in appends:
            operation = "dead-letter write" if topic == dead_letter_topic else "retry write"
            # One token per append, kept across its retries: an append whose
            # reply was lost (a NATS server frozen mid-call stored a prefix)
            # is completed by the retry, never stored twice (design §7).
            token = uuid.uuid4().hex
            offsets = await services.log_call(
                operation,
                partial(log.append, topic, partition, records, fence=fence, token=token),
            )
            if topic == dead_letter_topic and offsets:
                dead_end = [(topic, partition, offsets[-1] + 1)]
        # The dead-letter partition's own offset goes last, after the main one:
        # dead letters past it may have been written by a batch whose main
        # offset was never stored, and a restart reads them back
        # (PartitionWorker._recover_dead_letters).
        for topic, partition, offset in [*commits, *dead_end]:
            await services.log_call(
                "commit offset",
                partial(log.commit, group, topic, partition, offset, fence=fence),
            )
        return offsets
