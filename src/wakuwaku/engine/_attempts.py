"""Retry attempt rounds: one attempt for each due quarantined key (design §6).

Owns the rounds: which due keys one round takes (at most
:data:`ROUND_RECORDS` pending records), reading their pending work records
back from the retry partition, decoding and planning them as one new batch
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

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .._errors import ErrorClass
from .._records import H_KEY, ReasonCode, Record, header_text
from .._sanitize import sanitize
from ._executor import ChunkExecutor, SegmentOutcome
from ._outbox import Outbox
from ._plan import Item, Run, Segment, decode_records, plan
from ._retry import Outgoing, attempt_failed_marker, resolved_marker
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

#: A retry-topic marker and the (wall, monotonic) time its times were taken at.
Marker = tuple[Outgoing, tuple[float, float]]


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
        at any time are those of one round (design §6, issue 12 item 3).
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
        one segment per key (empty when nothing of it is left to run)."""
        retry = self.services.retry
        records = await self._read_pending(snapshots)
        by_key: dict[str, list[Item]] = {}
        fresh: list[Item] = []
        for key in keys:
            state = retry.keys[key]
            checked, skip = state.checked_through, state.skip
            usable = [r for r in records[key] if r.offset > checked or r.offset not in skip]
            items, rejects = decode_records(
                usable, self.services.topic, self.services.partition, self.types, from_retry=True
            )
            self.outbox.dead_letter_rejects(rejects)  # once: they count as done from now on
            skip.update(r.record.offset for r in rejects)
            by_key[key] = items
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

    async def _read_pending(self, snapshots: Mapping[str, array[int]]) -> dict[str, list[Record]]:
        """Read the pending work records of a round's keys from the retry partition.

        :param snapshots: per key, the retry offsets of its pending records
            (increasing).
        :returns: per key, its records in offset order. Reads page through the
            partition with at most :data:`READ_PAGE` records a call, each from
            a wanted offset through the last wanted one that follows it with
            gaps of at most :data:`READ_GAP` (longer stretches nobody waits
            for are not read); a record is kept when its offset is pending
            and its ``wk-key`` is the key it is pending for (design §6, issue 12
            item 3). A pending record the log no longer holds (deleted by
            retention) is logged and missing from the attempt.
        """
        services = self.services
        log, retry_topic, partition = services.log, services.retry_topic, services.partition
        owner: dict[int, str] = {o: key for key, offsets in snapshots.items() for o in offsets}
        wanted = sorted(owner)
        found: dict[str, list[Record]] = {key: [] for key in snapshots}
        index = 0
        while index < len(wanted):
            start = wanted[index]
            # Read through the pending records close to each other, never far
            # past the last one: a lone pending record far from the next costs
            # one record read, not a page (issue 18: a retry round read and
            # decoded up to READ_PAGE unrelated records per pending record).
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
                key = owner.get(record.offset)
                if key is not None and header_text(record.headers, H_KEY) == key:
                    found[key].append(record)
            index = bisect_right(wanted, page[-1].offset, index)
        missing = len(wanted) - sum(map(len, found.values()))
        if missing:
            logger.warning(
                "pending retry records are missing from the retry topic",
                extra={
                    **services.fields,
                    "records": missing,
                    "keys": [k for k, r in found.items() if len(r) != len(snapshots[k])],
                },
            )
        return found

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

    def _finish_attempt(
        self, key: str, pending: array[int], outcome: SegmentOutcome
    ) -> list[Marker]:
        """The markers of ``key``'s attempt, whose pending retry offsets were
        ``pending`` (increasing) when it started; a give-up's dead letters go
        to the outbox."""
        services = self.services
        config = services.config
        services.stats.attempts += 1
        at = services.times()
        now = at[0]
        state = services.retry.keys[key]
        fields: dict[str, Any] = {**services.fields, "key": key}
        if outcome.error is None:
            logger.info("quarantine lifted", extra=fields)
            return [(resolved_marker(key, pending[-1], now, group=config.group), at)]
        services.stats.attempts_failed += 1
        error = sanitize(outcome.error, config.error_text_limit)
        first_undone = min(r.offset for i in outcome.rest for r in i.sources)
        done_before = pending[: bisect_left(pending, first_undone)]
        # The counter belongs to the head of the key's pending work (design §6): an
        # attempt that got past the head starts the new head at its first
        # failure, so progress is never punished (issue 12 item 5).
        failures = 1 if done_before else state.failures + 1
        fields.update(
            {
                "type": outcome.rest[0].tag,
                "error_class": ErrorClass.RETRYABLE.value,
                "error": error,
                "attempt": failures - 1,
            }
        )
        markers: list[Outgoing] = []
        if failures > len(tuple(config.retry_delays)):
            gave_up = [r.offset for i in outcome.rest for r in i.sources]
            fields["offsets"] = [o for i in outcome.rest for o in i.main_offsets]
            logger.error("giving up retry", extra=fields)
            services.stats.gave_up_keys += 1
            self.outbox.dead_letter_items(outcome.rest, ReasonCode.GAVE_UP_RETRY, error)
            markers.append(resolved_marker(key, max(gave_up), now, group=config.group, reset=True))
        else:
            if done_before:
                markers.append(resolved_marker(key, max(done_before), now, group=config.group))
            delay = config.retry_delay(failures)
            markers.append(
                attempt_failed_marker(key, failures, now, now + delay, group=config.group)
            )
            logger.warning(
                "retry attempt failed",
                extra={
                    **fields,
                    "offsets": [o for i in outcome.rest for o in i.main_offsets],
                    "next_attempt_in": delay,
                },
            )
        return [(marker, at) for marker in markers]
