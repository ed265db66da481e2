"""Retry attempt rounds: one attempt for each due quarantined key (design §6).

Owns the rounds: which due keys one round takes (at most
:data:`ROUND_RECORDS` pending records), reading their pending work records
back from the retry partition (or taking those this process wrote and still
keeps, :class:`~._retry.WrittenCache`), decoding and planning them as one new batch
per key, running them, and turning each key's outcome into retry-topic
markers (``resolved``; ``attempt-failed``; a give-up is a ``resolved``
marker with ``wk-reset``, see :mod:`._retry`). A round *returns* its markers
(:class:`RoundResult`); the partition loop stores them through the outbox,
so the round never calls up into the loop. The dead letters of a round
(records that cannot be decoded, give-ups) are only *buffered* in the
outbox, like the executor's; nothing is written before the loop stores.

May call: :mod:`._shared` (retry state, retrying log call, counters),
:mod:`._plan` (planning), :mod:`._executor` (running the segments, the
inbox lookup) and :mod:`._outbox` (buffering dead letters). Called by the
partition loop (:mod:`._partition`) before every poll.
"""

from __future__ import annotations

import logging
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from .._errors import ErrorClass
from .._records import H_KEY, H_OPERATOR, ReasonCode, Record, header_text
from .._sanitize import sanitize
from ._executor import ChunkExecutor, SegmentOutcome
from ._outbox import Outbox
from ._plan import Item, Reject, Run, Segment, decode_records, plan
from ._retry import WRITTEN_HORIZON, Outgoing, Written, attempt_failed_marker, resolved_marker
from ._shared import Abandon, PartitionServices, logger

#: Pending retry records one attempt round reads and runs at most (a key with
#: more is a round alone): bounds the record bodies held in memory (design §6).
ROUND_RECORDS = 10_000
#: Records one read of the retry partition returns at most.
READ_PAGE = 1000
#: Unwanted records between two pending ones that a read of the retry
#: partition reads through rather than starting a new read (one read call
#: costs about as much as decoding a few dozen records).
READ_GAP = 32
#: How many times pending records the retry partition still holds but a read
#: did not return are read again before their keys go on without them.
MISSING_READS = 5

#: A retry-topic marker and the (wall, monotonic) time its times were taken at.
Marker = tuple[Outgoing, tuple[float, float]]

#: A key's pending work records in offset order, and per record what its
#: writer knew when this process kept it (:class:`~._retry.WrittenCache`;
#: None: read from the retry partition). Two lists rather than a pair per
#: record: every record of an always-failing key is looked up at each attempt.
Pending = tuple[list[Record], list[Written | None]]


@dataclass(slots=True)
class RoundResult:
    """What one attempt round leaves for the partition loop to store.

    :param markers: the round's retry-topic markers, in order.
    :param stopped: the round was abandoned (a stop or a lost lease) before
        every key's attempt ended; ``markers`` then also resolve, for each
        unfinished key, the chunks it handled before the stop.
    """

    markers: list[Marker] = field(default_factory=list)
    stopped: bool = False


class Attempts:
    """Runs the attempt rounds of one partition's quarantined keys.

    :param services: the partition's shared services.
    :param executor: runs the planned attempts.
    :param outbox: where dead letters go.
    """

    def __init__(
        self, services: PartitionServices, executor: ChunkExecutor, outbox: Outbox
    ) -> None:
        self.services = services
        self.executor = executor
        self.outbox = outbox
        self.types = {tag: h.event_type for tag, h in executor.handlers.items()}

    async def run_round(self) -> RoundResult | None:
        """One round of attempts for due keys; None when no key is due.

        Due keys are taken in rounds of at most :data:`ROUND_RECORDS` pending
        records (a key with more is a round of its own: its pending work is
        one batch). A round reads its keys' pending records from the retry
        partition (:meth:`_read_pending`) and runs them; the caller stores
        its markers before asking for the next round, so the bodies in memory
        at any time are those of one round (design §6).
        """
        services = self.services
        retry = services.retry
        keys = self._round_keys(retry.due_keys(services.clock.monotonic()))
        if not keys:
            return None
        snapshots: dict[str, array[int]] = {}
        attempts: dict[str, int] = {}
        for key in keys:
            state = retry.keys[key]
            snapshots[key] = array("q", state.offsets)
            attempts[key] = state.failures
        segments = await self._plan_round(keys, snapshots)
        result = RoundResult()
        finished: set[str] = set()

        async def after(
            seg: Segment,
            outcome: SegmentOutcome,
            taken: dict[str, array[int]] = snapshots,
            ended: set[str] = finished,
        ) -> None:
            result.markers.extend(self._finish_attempt(seg.key, taken[seg.key], outcome))
            ended.add(seg.key)

        handled: list[Run] = []
        try:
            await self.executor.run_segments(segments, after, handled, attempts)
        except Abandon:
            result.markers.extend(self._partial_markers(handled, finished))
            result.stopped = True
        return result

    async def _plan_round(
        self, keys: list[str], snapshots: Mapping[str, array[int]]
    ) -> list[Segment]:
        """Read, decode, filter and plan the pending work of a round's keys:
        one segment per key (empty when nothing of it is left to run).

        A pending record this process wrote and still keeps
        (:class:`~._retry.WrittenCache`) is not read back: its item is
        rebuilt from what the writer knew, its body decoded again.
        """
        retry = self.services.retry
        topic, partition = self.services.topic, self.services.partition
        found = await self._read_pending(snapshots)
        # Only the inbox lookup below needs them.
        has_inbox = self.executor.has_inbox
        by_key: dict[str, list[Item]] = {}
        fresh: list[Item] = []
        for key in keys:
            state = retry.keys[key]
            checked, skip = state.checked_through, state.skip
            records, writers = found[key]
            if skip:
                usable = [r.offset > checked or r.offset not in skip for r in records]
                records = [r for r, use in zip(records, usable, strict=True) if use]
                writers = [w for w, use in zip(writers, usable, strict=True) if use]
            items, rejects = self._items(records, writers, topic, partition)
            # Once: they count as done from now on.
            self.outbox.dead_letter_rejects(rejects, from_retry=True)
            skip.update(r.record.offset for r in rejects)
            gone = retry.dead_lettered
            if gone:
                # Dead-lettered before a crash that kept their resolved marker
                # from the retry topic (a log that stores call by call): done.
                done = [i for i in items if i.ids and gone.issuperset(i.ids)]
                if done:
                    skip.update(i.record.offset for i in done)
                    items = [i for i in items if not (i.ids and gone.issuperset(i.ids))]
                    logger.info(
                        "retry records dead-lettered before a restart are not run again",
                        extra={**self.services.fields, "key": key, "records": len(done)},
                    )
            by_key[key] = items
            if has_inbox:
                fresh.extend(i for i in items if i.record.offset > checked)
            state.checked_through = max(checked, snapshots[key][-1])
        # Pending records are looked up in the inbox once per process: only
        # our own handler calls claim them, and those resolve them.
        if fresh:
            kept = {id(item) for item in await self.executor.inbox_filter(fresh)}
            dropped = {id(i) for i in fresh} - kept
            for key, items in by_key.items():
                if any(id(i) in dropped for i in items):
                    retry.keys[key].skip.update(i.record.offset for i in items if id(i) in dropped)
                    by_key[key] = [i for i in items if id(i) not in dropped]
        decoded = [item for key in keys for item in by_key[key]]
        segments_by_key = {key: Segment(key, []) for key in keys}
        for seg in plan(decoded):
            segments_by_key[seg.key] = seg
        return list(segments_by_key.values())

    def _items(
        self, records: list[Record], writers: list[Written | None], topic: str, partition: int
    ) -> tuple[list[Item], list[Reject]]:
        """The items of one key's pending records in order (see
        :data:`Pending`): those read decoded (:func:`~._plan.decode_records`),
        those kept rebuilt."""
        read = (
            [r for r, w in zip(records, writers, strict=True) if w is None]
            if None in writers
            else []
        )
        items, rejects = decode_records(read, topic, partition, self.types, from_retry=True)
        if len(read) == len(records):
            return items, rejects
        decoded = iter(items)
        upcoming = next(decoded, None)
        out: list[Item] = []
        for record, written in zip(records, writers, strict=True):
            if written is None:
                if upcoming is not None and upcoming.record is record:
                    out.append(upcoming)
                    upcoming = next(decoded, None)
                continue
            key, etype, origin = written.key, written.event_type, written.origin
            props, failed_at = written.props, written.failed_at
            try:
                value = etype.decode(record.body)
            except Exception:  # noqa: BLE001 - the careful path names the problem
                again, refused = decode_records(
                    [record], topic, partition, self.types, from_retry=True
                )
                out += again
                rejects += refused
                continue
            out.append(
                Item(key, etype, value, record, origin, props, None, failed_at, len(origin.offsets))
            )
        return out, rejects

    def _round_keys(self, due: list[str]) -> list[str]:
        """The first of the ``due`` keys whose pending records add up to at
        most :data:`ROUND_RECORDS` (at least one key)."""
        taken: list[str] = []
        total = 0
        keys = self.services.retry.keys
        for key in due:
            count = len(keys[key].offsets)
            if taken and total + count > ROUND_RECORDS:
                break
            taken.append(key)
            total += count
        return taken

    async def _read_pending(self, snapshots: Mapping[str, array[int]]) -> dict[str, Pending]:
        """The pending work records of a round's keys: kept ones
        (:class:`~._retry.WrittenCache`), the others read from the retry
        partition (:meth:`_read_records`).

        :param snapshots: per key, the retry offsets of its pending records
            (increasing).
        :returns: per key, its records in offset order with what their
            writer knew when they were kept (:data:`Pending`). A pending
            record the log no longer holds (deleted by retention) is logged
            and missing from the attempt.
        """
        services = self.services
        kept = services.written
        known = {key: kept.get_many(offsets) for key, offsets in snapshots.items()}
        owner: dict[int, str] = {}
        for key, offsets in snapshots.items():
            writers = known[key]
            if None in writers:
                for offset, written in zip(offsets, writers, strict=True):
                    if written is None:
                        owner[offset] = key
        read = await self._read_unread(owner) if owner else {}
        found: dict[str, Pending] = {}
        for key, offsets in snapshots.items():
            writers = known[key]
            if None not in writers:  # all kept: the usual case
                found[key] = ([cast("Written", w).record for w in writers], writers)
                continue
            records: list[Record] = []
            present: list[Written | None] = []
            for offset, written in zip(offsets, writers, strict=True):
                record = read.get(offset) if written is None else written.record
                if record is not None:
                    records.append(record)
                    present.append(written)
            found[key] = (records, present)
        missing = len(owner) - len(read)
        if missing:
            logger.error(
                "pending retry records are missing from the retry topic",
                extra={
                    **services.fields,
                    "records": missing,
                    "keys": [k for k, r in found.items() if len(r[0]) != len(snapshots[k])],
                },
            )
        return found

    async def _read_unread(self, owner: Mapping[int, str]) -> dict[int, Record]:
        """:meth:`_read_records`, read again while the log still holds a
        wanted record that the read did not return.

        A pending record below the retry partition's start offset was
        deleted by retention: it is gone, and the caller logs it. One at or
        above it must be there: a read that missed it (a store not yet
        visible to readers, as Kafka's transaction markers can be) must not
        close its key unhandled, losing its events. Such records are read again on
        the retry schedule, up to :data:`MISSING_READS` times, with the
        partition's gate closed as for any failing log call.
        """
        services = self.services
        read = await self._read_records(owner)
        for failures in range(1, MISSING_READS + 1):
            absent = {offset: key for offset, key in owner.items() if offset not in read}
            if not absent:
                break
            starts = await services.log_call(
                "retry topic start offsets",
                partial(services.log.start_offsets, services.retry_topic),
            )
            start = starts.get(services.partition, 0)
            held = {offset: key for offset, key in absent.items() if offset >= start}
            if not held:
                break
            delay = services.config.log_retry_delay(failures)
            logger.warning(
                "pending retry records not read; reading them again",
                extra={
                    **services.fields,
                    "records": len(held),
                    "first_offset": min(held),
                    "delay": delay,
                    "failures": failures,
                },
            )
            services.gate.close()
            try:
                await services.sleep(delay)
            finally:
                services.gate.reopen()
            read.update(await self._read_records(held))
        return read

    async def _read_records(self, owner: Mapping[int, str]) -> dict[int, Record]:
        """Read pending records from the retry partition.

        :param owner: the key each wanted offset is pending for.
        :returns: the records found, by offset. Reads page through the
            partition with at most :data:`READ_PAGE` records a call, each from
            a wanted offset through the last wanted one that follows it with
            gaps of at most :data:`READ_GAP` (longer stretches nobody waits
            for are not read); a record is kept when its offset is wanted
            and its ``wk-key`` is the key it is pending for (design §6).
        """
        services = self.services
        log, retry_topic, partition = services.log, services.retry_topic, services.partition
        wanted = sorted(owner)
        read: dict[int, Record] = {}
        index = 0
        while index < len(wanted):
            start = wanted[index]
            # Read through the pending records close to each other, never far
            # past the last one: a lone pending record far from the next costs
            # one record read, not a page (a retry round read and decoded up to
            # READ_PAGE unrelated records per pending record).
            last = index
            while (
                last + 1 < len(wanted)
                and wanted[last + 1] - wanted[last] <= READ_GAP + 1
                and wanted[last + 1] - start < READ_PAGE
            ):
                last += 1
            count = wanted[last] - start + 1
            page = await services.log_call(
                "read retry topic", partial(log.read, retry_topic, partition, start, count)
            )
            if not page:
                break
            for record in page:
                pending_for = owner.get(record.offset)
                if pending_for is not None and header_text(record.headers, H_KEY) == pending_for:
                    read[record.offset] = record
            index = bisect_right(wanted, page[-1].offset, index)
        return read

    def _partial_markers(self, handled: list[Run], finished: set[str]) -> list[Marker]:
        """At a stop in the middle of an attempt round, the markers of what it did.

        Keys whose attempt ended have their markers already; a key stopped
        between two chunks is resolved through the last retry record its
        handled chunks stand for (they are a prefix of its pending records,
        in order). Without this, a restart ran the whole round again: chunks
        that had succeeded were handled twice, even with ``NO_DOUBLE_CONSUME``.
        """
        through: dict[str, int] = {}
        for chunk in handled:
            if chunk.key not in finished:
                last = max(r.offset for item in chunk for r in item.sources)
                through[chunk.key] = max(through.get(chunk.key, last), last)
        at = self.services.times()
        now = at[0]
        group = self.services.config.group
        return [
            (resolved_marker(key, offset, now, group=group), at) for key, offset in through.items()
        ]

    async def give_up_now(self, key: str, through: int, by: str, reason: str) -> list[Marker]:
        """An operator's give-up (design §14): dead-letter ``key``'s pending
        work below retry offset ``through`` with reason
        ``given_up_by_operator`` (``wk-operator``: ``by``) and resolve it with
        a reset, so its later work is due at once with its counter reset, as
        after any give-up. Nothing when the key has no work below ``through``
        (the command was applied before: reading it again changes nothing).

        :returns: the resolved marker to store, or nothing.
        """
        services = self.services
        state = services.retry.keys.get(key)
        if state is None:
            return []
        offsets = [o for o in state.offsets if o < through]
        if not offsets:
            return []
        skip = state.skip
        wanted = {o: key for o in offsets if o not in skip}
        read = await self._read_unread(wanted)
        text = f"given up by an operator ({by})" + (f": {reason}" if reason else "")
        error = sanitize(text, services.config.error_text_limit)
        self.outbox.dead_letter_retry_records(
            [read[o] for o in offsets if o in read],
            ReasonCode.GIVEN_UP_BY_OPERATOR,
            error,
            {H_OPERATOR: by.encode()},
        )
        services.written.drop(offsets)
        services.stats.gave_up_keys += 1
        logger.warning(
            "key given up by an operator",
            extra={
                **services.fields,
                "key": key,
                "records": len(offsets),
                "by": by,
                "reason": reason,
            },
        )
        at = services.times()
        group = services.config.group
        return [(resolved_marker(key, offsets[-1], at[0], group=group, reset=True), at)]

    def _finish_attempt(
        self, key: str, pending: array[int], outcome: SegmentOutcome
    ) -> list[Marker]:
        """The markers of ``key``'s attempt, whose pending retry offsets were
        ``pending`` (increasing) when it started; a give-up's dead letters go
        to the outbox. Kept records (:class:`~._retry.WrittenCache`) that
        the markers resolve, or whose next attempt is not soon, are dropped."""
        services = self.services
        config = services.config
        kept = services.written
        services.stats.attempts += 1
        at = services.times()
        now = at[0]
        state = services.retry.keys[key]
        fields: dict[str, Any] = {**services.fields, "key": key}
        if outcome.error is None:
            logger.info("quarantine lifted", extra=fields)
            kept.drop(pending)
            return [(resolved_marker(key, pending[-1], now, group=config.group), at)]
        services.stats.attempts_failed += 1
        error = sanitize(outcome.error, config.error_text_limit)
        rest = outcome.rest
        undone = _record_offsets(rest)
        done_before = pending[: bisect_left(pending, min(undone))]
        kept.drop(done_before)
        # The counter belongs to the head of the key's pending work (design §6): an
        # attempt that got past the head starts the new head at its first
        # failure, so progress is never punished.
        failures = 1 if done_before else state.failures + 1
        fields.update(
            {
                "type": rest[0].tag,
                "error_class": ErrorClass.RETRYABLE.value,
                "error": error,
                "attempt": failures - 1,
                "records": len(undone),
            }
        )
        markers: list[Outgoing] = []
        if failures > len(tuple(config.retry_delays)):
            if logger.isEnabledFor(logging.ERROR):
                fields["offsets"] = _main_offsets(rest)
            logger.error("giving up retry", extra=fields)
            services.stats.gave_up_keys += 1
            # The records as they are in the retry topic: their own wk-src is kept.
            self.outbox.dead_letter_items(rest, ReasonCode.GAVE_UP_RETRY, error, from_retry=True)
            kept.drop(undone)
            markers.append(resolved_marker(key, max(undone), now, group=config.group, reset=True))
        else:
            if done_before:
                markers.append(resolved_marker(key, max(done_before), now, group=config.group))
            delay = config.retry_delay(failures)
            if delay > WRITTEN_HORIZON:
                kept.drop(pending)
            markers.append(
                attempt_failed_marker(key, failures, now, now + delay, group=config.group)
            )
            if logger.isEnabledFor(logging.WARNING):
                fields["offsets"] = _main_offsets(rest)
                fields["next_attempt_in"] = delay
                logger.warning("retry attempt failed", extra=fields)
        return [(marker, at) for marker in markers]


def _record_offsets(items: list[Item]) -> list[int]:
    """The offsets of the records ``items`` stand for (:attr:`Item.sources`), in order."""
    out: list[int] = []
    for item in items:
        if item.parts is None:
            out.append(item.record.offset)
        else:
            out += [part.record.offset for part in item.parts]
    return out


def _main_offsets(items: list[Item]) -> list[int]:
    """The main-topic offsets ``items`` stand for (a log line's ``offsets``)."""
    return [offset for item in items for source in item.origins for offset in source.offsets]
