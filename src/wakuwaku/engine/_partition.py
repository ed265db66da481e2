"""One (topic, partition) task: poll, plan, execute, route, retry, commit (SPEC 5, 6, 8).

The loop, before every poll, makes one attempt for each due retry key, then
polls a batch of the main topic and runs it: keys concurrently (bounded by
``max_concurrency``), runs and chunks of a key strictly in order. The three
failure classes are handled here:

- ``Transient``: the same chunk is called again on the schedule, forever;
  the partition's *gate* closes, so no chunk of any key starts until it
  succeeds, and the partition does not poll (the batch is not finished).
  The consumer's own log calls get the same treatment.
- ``Retryable``: the key stops; its unfinished work goes to ``retry_<topic>``
  and the key is quarantined (or dead-lettered when the backlog is full).
- ``Unrecoverable``: the chunk is dead-lettered and the run goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from functools import partial
from operator import attrgetter, length_hint
from typing import Any, TypeVar

from .._errors import ErrorClass, FencedError, HandleError
from .._events import Algebra
from .._records import (
    H_KEY,
    ReasonCode,
    Record,
    Source,
    header_text,
    key_or_none,
    message_id,
)
from .._sanitize import sanitize
from ..logs._base import BatchWrite, Lease, Log
from ._config import ConsumerConfig, DeliveryMode
from ._context import ChunkContext, _current
from ._handler import Handler
from ._plan import (
    Groups,
    Item,
    Reject,
    Run,
    Segment,
    decode_batch,
    decode_records,
    group,
    plan,
    plan_groups,
)
from ._retry import (
    Outgoing,
    RetryState,
    attempt_failed_marker,
    dead_letter_record,
    resolved_marker,
    retry_source,
    retry_work_records,
)
from ._stats import ConsumerStats

log = logging.getLogger("wakuwaku.consumer")

_count = attrgetter("count")
_event = attrgetter("event")

R = TypeVar("R")

#: Pending retry records one attempt round reads and runs at most (a key with
#: more is a round alone): bounds the record bodies held in memory (SPEC 6).
ROUND_RECORDS = 10_000
#: Records one read of the retry partition returns at most.
READ_PAGE = 1000
#: Unwanted records between two pending ones that a read of the retry
#: partition reads through rather than starting a new read (one read call
#: costs about as much as decoding a few dozen records).
READ_GAP = 32

ROUTED_ERROR = "routed to the retry topic: the key is quarantined"


class Abandon(Exception):
    """The partition task stops without finishing its batch (shutdown or lost lease)."""


class Gate:
    """Open unless some chunk or log call of the partition is retrying in place (SPEC 5.6).

    :ivar is_open: true while nothing holds the gate closed (a plain
        attribute: it is read before every chunk).
    """

    def __init__(self) -> None:
        self._holders = 0
        self._open = asyncio.Event()
        self._open.set()
        self.is_open = True

    def close(self) -> None:
        self._holders += 1
        self._open.clear()
        self.is_open = False

    def reopen(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            self._open.set()
            self.is_open = True

    async def wait(self) -> None:
        await self._open.wait()


class SegmentOutcome:
    """How one key's segment ended, when a chunk failed or for a retry attempt.

    :ivar error: the Retryable failure that stopped the key, if any.
    :ivar rest: the failed chunk and the rest of its run.
    :ivar later: the key's later runs.
    """

    __slots__ = ("error", "later", "rest")

    def __init__(self) -> None:
        self.error: BaseException | None = None
        # Replaced (never appended to) when the segment stops on a failure.
        self.rest: list[Item] = _NO_ITEMS
        self.later: list[Item] = _NO_ITEMS


_NO_ITEMS: list[Item] = []


class PartitionWorker:
    """Consumes one partition of one main topic until stopped or fenced.

    :param log: the log.
    :param config: the consumer's configuration.
    :param topic: the (qualified) main topic.
    :param partition: the partition.
    :param handlers: handler per type tag.
    :param stats: counters shared by the consumer's workers.
    :param generation: the partition lease's generation (fences commits).
    :param lease_deadline: when the lease runs out unless renewed (the clock's
        monotonic seconds); no chunk starts past it (the consumer renews it).
    :param on_caught_up: called each time a poll finds nothing new (the
        consumer's :meth:`~wakuwaku.Consumer.drain` listens).
    :param executor: the thread pool sync handlers run on (None: asyncio's
        default one).
    """

    def __init__(
        self,
        *,
        log: Log,
        config: ConsumerConfig,
        topic: str,
        partition: int,
        handlers: Mapping[str, Handler[Any]],
        stats: ConsumerStats,
        generation: int | None = None,
        lease_deadline: float = math.inf,
        on_caught_up: Callable[[], None] | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.log = log
        self.config = config
        self.topic = topic
        self.partition = partition
        self.retry_topic = config.retry_topic(topic)
        self.dlq_topic = config.dead_letter_topic(topic)
        self.handlers = handlers
        self._executor = executor
        self.types = {tag: h.event_type for tag, h in handlers.items()}
        self._has_inbox = any(h.inbox is not None for h in handlers.values())
        self._reduces = any(h.event_type.algebra is not Algebra.PLAIN for h in handlers.values())
        self.stats = stats
        self.generation = generation
        # When the lease runs out unless renewed (the clock's monotonic time);
        # no chunk starts past it (the consumer's renewer moves it).
        self.lease_deadline = lease_deadline
        # Every write for this partition carries its lease (SPEC 15): the log
        # refuses it once another member owns the partition.
        self._fence = (
            None
            if generation is None
            else Lease(config.group, topic, partition, config.member_id, generation, 0.0)
        )
        self.clock = config.clock
        self.retry = RetryState(config.delay, config.clock)
        self.position = 0
        self.caught_up = False
        self._on_caught_up = on_caught_up
        self.started = False
        self._gate = Gate()
        self._stop = asyncio.Event()
        self._stopping = False  # mirrors _stop, read before every chunk
        self._retry_committed: int | None = None
        self._fields = {"topic": topic, "partition": partition}
        # Writes are buffered per batch or attempt round and flushed at its end,
        # dead letters first: one append per topic instead of one per key.
        self._dead_out: list[Outgoing] = []
        self._dead_counts: Counter[str] = Counter()
        self._retry_out: list[Outgoing] = []
        # Per buffered retry record, the (wall, monotonic) time its times were
        # taken at: applied with it, its due time becomes a monotonic deadline
        # however the wall clock steps meanwhile (SPEC 6).
        self._retry_at: list[tuple[float, float]] = []
        self._unflushed_work = 0
        # Offsets of the current main batch that are done (dead-lettered,
        # routed, skipped by the inbox), and its handled chunks: a graceful
        # stop stores the offset of the first record that is not done.
        self._done: set[int] | None = None
        self._handled: list[Run] = []

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Ask the worker to stop: no new chunk starts, waits are abandoned."""
        self._stop.set()
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def _sleep(self, seconds: float) -> None:
        """Sleep on the clock; raise :class:`Abandon` as soon as a stop is asked."""
        if self._stop.is_set():
            raise Abandon
        # The deadline is taken now, not when the sleeping task first runs: a
        # clock that moves in between (a FakeClock advanced by a test, shown
        # by asyncio debug mode's other task order) would push it later.
        sleeper = asyncio.ensure_future(self._sleep_until(self.clock.monotonic() + seconds))
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            stopper.cancel()
        if self._stop.is_set():
            raise Abandon

    async def _sleep_until(self, deadline: float) -> None:
        await self.clock.sleep(deadline - self.clock.monotonic())

    async def _through_gate(self) -> None:
        if self._stop.is_set():
            raise Abandon
        if self.clock.monotonic() >= self.lease_deadline:
            # A pause (SIGSTOP, a blocked event loop) outlived the lease: another
            # member may own the partition now; start nothing more (SPEC 15).
            log.warning(
                "partition lease ran out before it was renewed; stopping", extra=self._fields
            )
            self.stop()
            raise Abandon
        if self._gate.is_open:
            return
        opener = asyncio.ensure_future(self._gate.wait())
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({opener, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            opener.cancel()
            stopper.cancel()
        if self._stop.is_set():
            raise Abandon

    async def _log_call(self, operation: str, call: Callable[[], Awaitable[R]]) -> R:
        """Run one of the consumer's own log calls; on failure retry it on the
        schedule, forever, with the gate closed (SPEC 5.6)."""
        failures = 0
        try:
            while True:
                try:
                    return await call()
                except FencedError as exc:
                    log.warning(
                        "partition lease lost; stopping",
                        extra={**self._fields, "operation": operation, "error": str(exc)},
                    )
                    raise Abandon from exc
                except Exception as exc:  # noqa: BLE001 - every log failure is Transient here
                    failures += 1
                    self.stats.log_call_retries += 1
                    if failures == 1:
                        self._gate.close()
                    delay = self.config.retry_delay(failures)
                    log.warning(
                        "log call failed; retrying",
                        extra={
                            **self._fields,
                            "operation": operation,
                            "delay": delay,
                            "failures": failures,
                            "error_class": ErrorClass.TRANSIENT.value,
                            "error": sanitize(exc, self.config.error_text_limit),
                        },
                    )
                    await self._sleep(delay)
        finally:
            if failures:
                self._gate.reopen()

    # --------------------------------------------------------------------- loop

    async def run(self) -> None:
        """Consume until :meth:`stop` or a lost lease; returns quietly then."""
        prefetch: asyncio.Task[list[Record]] | None = None
        try:
            await self._restore()
            self.started = True
            while not self._stop.is_set():
                await self._run_due_attempts()
                if prefetch is not None:
                    records = await prefetch
                    prefetch = None
                else:
                    records = await self._poll(self.position)
                if not records:
                    self.caught_up = True
                    if self._on_caught_up is not None:
                        self._on_caught_up()
                    await self._commit_retry()
                    await self._sleep(self._idle_wait())
                    continue
                self.caught_up = False
                # Read the next batch while this one runs: the read only looks
                # ahead, it decides nothing (the batch is planned when it runs).
                prefetch = asyncio.ensure_future(self._poll(records[-1].offset + 1))
                await self._consume(records)
        except Abandon:
            return
        finally:
            if prefetch is not None:
                prefetch.cancel()
                await asyncio.gather(prefetch, return_exceptions=True)

    async def _poll(self, offset: int) -> list[Record]:
        return await self._log_call(
            "poll",
            lambda: self.log.read(self.topic, self.partition, offset, self.config.max_poll_records),
        )

    def _idle_wait(self) -> float:
        """Seconds until the next poll: ``poll_interval``, or less when a retry
        key is due sooner (on monotonic time, SPEC 6)."""
        wait = self.config.poll_interval
        next_due = self.retry.next_due()
        if next_due is not None:
            wait = min(wait, max(0.0, next_due - self.clock.monotonic()))
        return wait

    def _times(self) -> tuple[float, float]:
        """Wall and monotonic time (seconds), read together (see
        :meth:`RetryState.apply`)."""
        return self.clock.now(), self.clock.monotonic()

    async def _restore(self) -> None:
        """Rebuild retry state from the retry partition and find the start position."""
        committed = await self._log_call(
            "load retry offset",
            lambda: self.log.committed(self.config.group, self.retry_topic, self.partition),
        )
        if committed is None:
            starts = await self._log_call(
                "start offsets", lambda: self.log.start_offsets(self.retry_topic)
            )
            committed = starts.get(self.partition, 0)
        offset = committed
        self.retry.end_offset = offset
        while True:
            page = await self._log_call(
                "read retry topic",
                partial(self.log.read, self.retry_topic, self.partition, offset, 1000),
            )
            if not page:
                break
            self.retry.apply_all(page)
            offset = page[-1].offset + 1
        self._retry_committed = committed
        position = await self._log_call(
            "load offset",
            lambda: self.log.committed(self.config.group, self.topic, self.partition),
        )
        starts = await self._log_call("start offsets", lambda: self.log.start_offsets(self.topic))
        start = starts.get(self.partition, 0)
        if position is None:
            position = start
        elif position < start:
            # Retention deleted records this group never read (issue 12 item 10):
            # the log can only go on from its floor, but never in silence.
            log.warning(
                "committed offset is below the partition's retention floor; "
                "records were deleted before this group read them",
                extra={
                    **self._fields,
                    "committed": position,
                    "start": start,
                    "skipped": start - position,
                },
            )
            self.stats.offset_gaps += start - position
            position = start
        self.position = position
        for offset, key, what in self.retry.broken[:20]:
            log.warning(
                "broken retry record; going on without it",
                extra={**self._fields, "retry_offset": offset, "key": key, "error": what},
            )
        self.retry.broken.clear()
        if not self.log.atomic_store:
            await self._recover_dead_letters(position)
        self.retry.forget_routed(position)
        if self.retry.keys:
            log.info(
                "retry state restored",
                extra={
                    **self._fields,
                    "keys": len(self.retry.keys),
                    "pending": self.retry.pending_count,
                },
            )

    async def _recover_dead_letters(self, position: int) -> None:
        """On a log without an atomic store, find dead letters written by a
        batch whose main offset was never stored (a crash between the two
        calls), so that their main records, delivered again, are not run or
        dead-lettered a second time (issue 12 item 12; issue 14).

        The group's offset in its dead-letter partition is stored after the
        main offset; dead letters past it whose main offsets are at or past
        ``position`` stand for records already done. They are remembered
        like routed records (:attr:`RetryState.routed`). A partition without
        that offset yet gets its end stored, so tracking starts now.
        """
        group, dlq, partition = self.config.group, self.dlq_topic, self.partition
        offset = await self._log_call(
            "load dead-letter offset", lambda: self.log.committed(group, dlq, partition)
        )
        if offset is None:
            ends = await self._log_call("end offsets", lambda: self.log.end_offsets(dlq))
            end = ends.get(partition, 0)
            await self._log_call(
                "commit dead-letter offset",
                partial(self.log.commit, group, dlq, partition, end, fence=self._fence),
            )
            return
        routed = self.retry.routed
        while page := await self._log_call(
            "read dead letters", partial(self.log.read, dlq, partition, offset, 1000)
        ):
            for record in page:
                source = retry_source(record)
                key = key_or_none(record.headers)
                if (
                    source is None
                    or key is None
                    or source.topic != self.topic
                    or source.partition != partition
                    or not source.offsets
                ):
                    continue
                top = max(source.offsets)
                if top >= position:
                    routed[key] = max(routed.get(key, -1), top)
            offset = page[-1].offset + 1

    async def _consume(self, records: list[Record]) -> None:
        self.stats.polled += len(records)
        following = records[-1].offset + 1
        mode = self.config.delivery_mode
        if mode is DeliveryMode.NO_DOUBLE_CONSUME:
            await self._commit_main(following)
        self._done = set()
        self._handled = []
        try:
            await self._process_batch(records)
        except Abandon:
            await self._store_partial(records)
            raise
        finally:
            self._done = None
            self._handled = []
        # The batch's dead letters, retry work and offsets: one transaction
        # where the log allows it, so a crash leaves all or none of them.
        await self._flush(following if mode is DeliveryMode.NO_EVENT_LOSE else None)
        self.position = following
        self.retry.forget_routed(following)

    async def _store_partial(self, records: list[Record]) -> None:
        """At a stop in the middle of a batch, store what the delivery mode allows (SPEC 14).

        ``NO_EVENT_LOSE``: the offset of the first record that is not done, so
        nothing before it is delivered again (done records after it, of keys
        that ran concurrently, are: at-least-once). ``NO_DOUBLE_CONSUME``: the
        offset was stored after the batch before it ran; it moves back to the
        first record not done only when no record after that one was handled,
        so nothing is ever handled twice; otherwise the records not started
        are lost, as at-most-once allows, and their count is logged.
        """
        done = set(self._done or ())
        done.update(r.offset for chunk in self._handled for item in chunk for r in item.sources)
        following = records[-1].offset + 1
        first = next((r.offset for r in records if r.offset not in done), following)
        target = first
        stored = self.position  # what the log holds now
        if self.config.delivery_mode is DeliveryMode.NO_DOUBLE_CONSUME:
            stored = following
            if any(r.offset in done for r in records if r.offset > first):
                lost = sum(1 for r in records if r.offset not in done)
                if lost:
                    log.warning(
                        "stopped mid-batch: records not started are skipped (at-most-once)",
                        extra={**self._fields, "records": lost},
                    )
                target = following
        try:
            await self._flush(target if target != stored else None)
        except Abandon:
            return  # the log refused while stopping: store nothing more
        self.position = target

    async def _commit_main(self, offset: int) -> None:
        await self._log_call(
            "commit offset",
            lambda: self.log.commit(
                self.config.group, self.topic, self.partition, offset, generation=self.generation
            ),
        )

    async def _commit_retry(self) -> None:
        """Store the retry partition's lowest pending offset (SPEC 6).

        The retry partition has no lease of its own: it belongs to the main
        partition's owner, so the commit carries the main lease as its fence
        and is refused once another member owns the partition (SPEC 15).
        """
        await self._flush()

    # -------------------------------------------------------------------- batch

    async def _process_batch(self, records: list[Record]) -> None:
        # Without an inbox nothing needs the items of a batch that goes well:
        # the runs keep records instead (see Run).
        items, groups, rejects = decode_batch(
            records,
            self.topic,
            self.partition,
            self.types,
            compact=not self._has_inbox,
            group=self.config.group,
        )
        if rejects:
            self._dead_letter_rejects(rejects)
        if self._has_inbox:
            groups = group(await self._inbox_filter(items))
        if self.retry.keys or self.retry.routed:
            self._route_quarantined(groups)
        segments = plan_groups(groups, reduces=self._reduces)
        if self._reduces:
            self.stats.reduced_away += sum(
                len(run) for runs in groups.values() for run in runs
            ) - sum(len(run) for seg in segments for run in seg.runs)
        await self._run_segments(segments, self._after_main_segment, self._handled)

    def _route_quarantined(self, groups: Groups) -> None:
        """Take the items of quarantined keys out of ``groups`` and send them
        to the retry topic, unreduced and in order (SPEC 6).

        Items already in the retry topic (redelivered after a crash, at or
        below the key's routed main offset) are done: routed once, they are
        never routed or run again, also when the key's retry work has ended
        since (issue 12 item 12: one message, two outcomes).
        """
        quarantined = self.retry.keys
        routed_through = self.retry.routed
        for key in [key for key in groups if key in quarantined or key in routed_through]:
            state = quarantined.get(key)
            if state is None:
                kept = self._drop_routed(groups[key], routed_through[key])
                if kept:
                    groups[key] = kept
                else:
                    del groups[key]
                continue
            routed: list[Item] = []
            for run in groups.pop(key):
                for item in run:
                    if max(item.main_offsets) <= state.max_main_offset:
                        self._mark([item])  # redelivered after a crash: already routed
                    else:
                        routed.append(item)
                    self.stats.routed += 1
            if routed:
                self._write_retry(routed, state.first_failed_at, ROUTED_ERROR)

    def _drop_routed(self, runs: list[Run], through: int) -> list[Run]:
        """``runs`` without their items at or below main offset ``through`` (a
        prefix, offsets growing within a key), which are marked done."""
        for index, run in enumerate(runs):
            count = 0
            for item in run:
                if max(item.main_offsets) > through:
                    break
                count += 1
            self._mark(run[:count])
            if count < len(run):
                return [run[count:], *runs[index + 1 :]]
        return []

    def _mark(self, items: Iterable[Item]) -> None:
        """Note main-batch items as done (see :meth:`_store_partial`)."""
        if self._done is not None:
            self._done.update(r.offset for item in items for r in item.sources)

    async def _after_main_segment(self, segment: Segment, outcome: SegmentOutcome) -> None:
        if outcome.error is None:
            return
        key = segment.key
        work = outcome.rest + outcome.later
        error = sanitize(outcome.error, self.config.error_text_limit)
        records = sum(len(i.sources) for i in work)
        fields = {
            **self._fields,
            "key": key,
            "type": outcome.rest[0].tag,
            "offsets": [o for i in outcome.rest[:1] for o in i.main_offsets],
            "error_class": ErrorClass.RETRYABLE.value,
            "error": error,
        }
        pending = self.retry.pending_count + self._unflushed_work
        if pending + len(work) > self.config.max_pending_retry:
            log.error(
                "retry backlog full", extra={**fields, "records": records, "pending": pending}
            )
            self._dead_letter_items(work, ReasonCode.RETRY_BACKLOG_FULL, error)
            return
        self._write_retry(work, None, error)
        self.stats.quarantined_keys += 1
        self.stats.retry_written += records
        log.warning("key quarantined after retryable failure", extra=fields)

    async def _run_segments(
        self,
        segments: Sequence[Segment],
        after: Callable[[Segment, SegmentOutcome], Awaitable[None]],
        handled: list[Run],
        attempts: Mapping[str, int] | None = None,
    ) -> None:
        """Run segments, keys concurrently (up to ``max_concurrency`` workers
        sharing one queue) and each key's chunks in order (SPEC 5.4).

        ``after`` sees each outcome of a retry attempt (``attempts`` given),
        and each main-batch outcome that stopped on a Retryable failure.
        ``handled`` gets every chunk that succeeded, in order per key.

        :raises Abandon: when a stop or a lost lease ended a worker early.
        """
        pending = iter(segments)
        width = max(1, min(len(segments), self.config.max_concurrency))
        if width == 1:
            finished = [await self._work(pending, after, handled, attempts)]
        else:
            finished = await self._spread(pending, width, after, handled, attempts)
        if not all(finished):
            raise Abandon

    async def _spread(
        self,
        pending: Iterator[Segment],
        width: int,
        after: Callable[[Segment, SegmentOutcome], Awaitable[None]],
        handled: list[Run],
        attempts: Mapping[str, int] | None,
    ) -> list[bool]:
        """Run up to ``width`` workers on ``pending``, starting one more each
        time the running ones all wait while segments are left: handlers that
        never wait are run by one worker, without a task per idle worker."""
        workers = [asyncio.ensure_future(self._work(pending, after, handled, attempts))]
        try:
            while len(workers) < width:
                await asyncio.sleep(0)  # the workers run until they wait
                if not length_hint(pending) or all(w.done() for w in workers):
                    break
                workers.append(asyncio.ensure_future(self._work(pending, after, handled, attempts)))
            await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
            for worker in workers:
                if worker.done() and not worker.cancelled() and worker.exception() is not None:
                    raise worker.exception()  # type: ignore[misc]
        except BaseException:
            # A worker that fails (a bug, not a handler failure: those are
            # classified) or our own cancellation ends every sibling: the
            # partition restarts from its stored offset, and a chunk still
            # running here would then run twice at once.
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        return [worker.result() for worker in workers]

    async def _work(
        self,
        pending: Iterator[Segment],
        after: Callable[[Segment, SegmentOutcome], Awaitable[None]],
        handled: list[Run],
        attempts: Mapping[str, int] | None,
    ) -> bool:
        """One worker: run segments taken from ``pending`` until none is left.

        A segment's chunks run in order; a Retryable failure stops the segment
        (its outcome keeps the rest), an Unrecoverable one dead-letters the
        chunk and the segment goes on. Returns False when abandoned.
        """
        stats, handlers, gate = self.stats, self.handlers, self._gate
        topic, partition = self.topic, self.partition
        set_context, reset_context, perf_counter = _current.set, _current.reset, time.perf_counter
        monotonic = self.clock.monotonic
        # Main-topic items stand for one record each unless reduction merged them.
        single = attempts is None and not self._reduces
        # Counted here and added to the shared stats when the worker ends.
        calls = records = 0
        seconds = 0.0
        try:
            for seg in pending:
                outcome: SegmentOutcome | None = None
                stopped = False
                key = seg.key
                attempt = 0 if attempts is None else attempts.get(key, 0)
                for run in seg.runs:
                    tag = run.event_type.tag
                    handler = handlers[tag]
                    # An async handle is called directly (a frame less), looked up
                    # per run so that a replaced handle is honoured; a sync one
                    # goes through __call__ (a worker thread).
                    invoke = handler.handle if handler.is_async else self._sync_call(handler)
                    size = handler.max_batch
                    count = len(run.events)  # not len(run): a Python-level __len__
                    for start in range(0, count, size):
                        chunk = run if count <= size else run[start : start + size]
                        if self._stopping or not gate.is_open or monotonic() >= self.lease_deadline:
                            await self._through_gate()
                        # The handler call, as _call makes it, inline.
                        token = set_context(
                            ChunkContext(topic, partition, key, tag, chunk, attempt)
                        )
                        started = perf_counter()
                        try:
                            called = invoke(chunk.events.copy())
                            if called is not None:
                                await called
                            calls += 1
                            failure = None
                        except BaseException as exc:  # noqa: BLE001 - see _failure
                            failure = self._failure(exc, handler, key, chunk)
                        finally:
                            seconds += perf_counter() - started
                            reset_context(token)
                        if failure is None:
                            handled.append(chunk)
                            records += len(chunk.events) if single else sum(map(_count, chunk))
                            continue
                        outcome = outcome or SegmentOutcome()
                        stopped = await self._chunk_failed(
                            handler, seg, run, start, attempt, failure, outcome, handled
                        )
                        if stopped:
                            break
                    if stopped:
                        break
                if stopped or attempts is not None:
                    await after(seg, outcome or SegmentOutcome())
        except Abandon:
            return False
        finally:
            stats.handler_calls += calls
            stats.handled += records
            stats.handler_seconds += seconds
        return True

    async def _chunk_failed(
        self,
        handler: Handler[Any],
        seg: Segment,
        run: Run,
        start: int,
        attempt: int,
        failure: tuple[ErrorClass, BaseException],
        outcome: SegmentOutcome,
        handled: list[Run],
    ) -> bool:
        """Apply the class of a failed chunk, the one at ``start`` in ``run``
        (SPEC 5.5, 5.6); True when the segment stops.

        A Transient failure is retried in place first; a chunk that then
        succeeds goes to ``handled`` and the segment goes on.
        """
        chunk = run[start : start + handler.max_batch]
        if failure[0] is ErrorClass.TRANSIENT:
            again = await self._retry_in_place(handler, seg.key, chunk, attempt, failure)
            if again is None:
                handled.append(chunk)
                self.stats.handled += sum(map(_count, chunk))
                return False
            failure = again
        error_class, exc = failure
        self.stats.failed_by_class[error_class.value] += 1
        if error_class is ErrorClass.UNRECOVERABLE:
            error = sanitize(exc, self.config.error_text_limit)
            log.error(
                "dropping chunk after unrecoverable handler failure",
                extra={
                    **self._fields,
                    "key": seg.key,
                    "type": handler.event_type.tag,
                    "offsets": [o for i in chunk for o in i.main_offsets],
                    "error_class": error_class.value,
                    "error": error,
                },
            )
            self._dead_letter_items(chunk, ReasonCode.UNRECOVERABLE, error)
            return False
        index = next(n for n, r in enumerate(seg.runs) if r is run)
        outcome.error = exc
        outcome.rest = list(run[start:])
        outcome.later = [i for r in seg.runs[index + 1 :] for i in r]
        return True

    async def _retry_in_place(
        self,
        handler: Handler[Any],
        key: str,
        chunk: Run,
        attempt: int,
        failure: tuple[ErrorClass, BaseException],
    ) -> tuple[ErrorClass, BaseException] | None:
        """After a Transient failure, call the handler again on the schedule,
        forever, with the partition's gate closed (SPEC 5.6)."""
        self._gate.close()
        try:
            failures = 1
            while True:
                self.stats.transient_pauses += 1
                self.stats.failed_by_class[ErrorClass.TRANSIENT.value] += 1
                delay = self.config.retry_delay(failures)
                log.warning(
                    "transient failure; retrying chunk in place",
                    extra={
                        **self._fields,
                        "key": key,
                        "type": handler.event_type.tag,
                        "offsets": [o for i in chunk for o in i.main_offsets],
                        "error_class": ErrorClass.TRANSIENT.value,
                        "delay": delay,
                        "failures": failures,
                        "error": sanitize(failure[1], self.config.error_text_limit),
                    },
                )
                await self._sleep(delay)
                again = await self._call(handler, key, chunk, attempt)
                if again is None or again[0] is not ErrorClass.TRANSIENT:
                    return again
                failure = again
                failures += 1
        finally:
            self._gate.reopen()

    async def _call(
        self, handler: Handler[Any], key: str, chunk: Run, attempt: int
    ) -> tuple[ErrorClass, BaseException] | None:
        """Call the handler on one chunk; its failure, classified, or None.

        :meth:`_work` makes the first call of every chunk with the same steps
        inline (a coroutine less per chunk); this is the call of a retry in place.
        """
        token = _current.set(
            ChunkContext(self.topic, self.partition, key, handler.event_type.tag, chunk, attempt)
        )
        started = time.perf_counter()
        try:
            invoke = handler.handle if handler.is_async else self._sync_call(handler)
            called = invoke(chunk.events.copy())
            if called is not None:
                await called
        except BaseException as exc:  # noqa: BLE001 - _failure lets through what is no failure
            return self._failure(exc, handler, key, chunk)
        finally:
            self.stats.handler_seconds += time.perf_counter() - started
            _current.reset(token)
        self.stats.handler_calls += 1
        return None

    def _sync_call(self, handler: Handler[Any]) -> Callable[[list[Any]], Awaitable[None]]:
        """A sync handler's call on the consumer's thread pool."""
        return partial(handler.__call__, executor=self._executor)

    def _failure(
        self, exc: BaseException, handler: Handler[Any], key: str, chunk: Iterable[Item]
    ) -> tuple[ErrorClass, BaseException]:
        """The class of what a handler raised (SPEC 5.8).

        :raises: ``exc`` itself when it is not a failure of the chunk: a
            cancellation of the running task (shutdown deadline), or
            ``KeyboardInterrupt``/``SystemExit`` (logged with where it came from).
        """
        if isinstance(exc, HandleError):
            declared = getattr(exc, "error_class", None)
            if isinstance(declared, ErrorClass):
                return declared, exc
            # A HandleError subclass whose __init__ skipped HandleError's: it
            # says no class, so it is classified like any other exception.
            log.warning(
                "HandleError without an error_class (its __init__ did not call "
                "HandleError.__init__); classifying it",
                extra={
                    **self._fields,
                    "key": key,
                    "type": handler.event_type.tag,
                    "error": sanitize(exc, self.config.error_text_limit),
                },
            )
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise exc  # we are being cancelled (shutdown deadline): let it through
        elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
            # Not a failure to classify: the process is asked to end. Say where.
            log.error(
                "handler raised %s; the consumer stops without storing this batch's offset",
                type(exc).__name__,
                extra={
                    **self._fields,
                    "key": key,
                    "type": handler.event_type.tag,
                    "offsets": [o for i in chunk for o in i.main_offsets],
                },
            )
            raise exc
        # Any other exception, GeneratorExit & co., or a CancelledError the
        # handler raised itself.
        return self._classify(exc, key, handler, chunk), exc

    def _classify(
        self, exc: BaseException, key: str, handler: Handler[Any], chunk: Iterable[Item]
    ) -> ErrorClass:
        try:
            error_class = ErrorClass(self.config.classify(exc))
        except Exception as bad:  # noqa: BLE001 - a broken classifier must not lose the chunk
            log.error(
                "classifier failed; treating the exception as unrecoverable",
                extra={**self._fields, "key": key, "error": sanitize(bad)},
            )
            error_class = ErrorClass.UNRECOVERABLE
        log.warning(
            "handler raised an exception that is not a HandleError; classified as %s",
            error_class.value,
            extra={
                **self._fields,
                "key": key,
                "type": handler.event_type.tag,
                "offsets": [o for i in chunk for o in i.main_offsets],
                "error_class": error_class.value,
                "error": sanitize(exc, self.config.error_text_limit),
            },
        )
        return error_class

    # ------------------------------------------------------------------- inbox

    async def _inbox_filter(self, items: list[Item]) -> list[Item]:
        """Drop items whose every message id the handler's inbox already holds,
        or an earlier item of this batch already stands for (SPEC 9).

        Runs before reduction, so a combined event never mixes applied and
        unapplied records, nor stands for one message twice (a dead letter
        replayed twice, a retry record given up twice around a crash).
        """
        by_inbox: dict[int, tuple[Any, list[str]]] = {}
        for item in items:
            inbox = self.handlers[item.tag].inbox
            if inbox is not None:
                by_inbox.setdefault(id(inbox), (inbox, []))[1].extend(item.ids)
        if not by_inbox:
            return items
        claimed: set[str] = set()
        for inbox, ids in by_inbox.values():
            found: set[str] = await self._log_call("inbox lookup", partial(inbox.claimed, ids))
            claimed |= found
        kept = []
        for item in items:
            if self.handlers[item.tag].inbox is None:
                kept.append(item)
                continue
            item_ids = item.ids
            if item_ids and all(i in claimed for i in item_ids):
                self.stats.inbox_skipped += len(item.sources)
                self._mark([item])
                continue
            claimed.update(item_ids)
            kept.append(item)
        return kept

    # ------------------------------------------------------------- retry topic

    async def _flush(self, main_offset: int | None = None) -> None:
        """Store what the batch or attempt round buffered, under the partition's lease.

        Dead letters first, then retry records, then the retry partition's
        lowest pending offset (when it moved) and ``main_offset`` (when
        given). On a log with an atomic store (SQLite, memory) that is one
        transaction: a crash leaves all of it or none, so no record is both
        routed to the retry topic and delivered again, and no dead letter is
        written twice (issue 12, items 2 and 12). Elsewhere each write is its
        own fenced call, in that order, so an offset is never stored before
        what it covers. Every call is retried forever on failure (SPEC 5.6);
        a refused fence stops the worker (:class:`Abandon`).

        The retry offset stored is the low watermark *before* this flush's
        records are applied: never above the truth (at worst a restart reads
        a few resolved records again); the next flush stores the newer one.
        """
        dead, retry = self._dead_out, self._retry_out
        low = self.retry.low_watermark()
        commits: list[tuple[str, int, int]] = []
        if low != self._retry_committed:
            commits.append((self.retry_topic, self.partition, low))
        if main_offset is not None:
            commits.append((self.topic, self.partition, main_offset))
        appends: list[tuple[str, int, list[Outgoing]]] = []
        if dead:
            appends.append((self.dlq_topic, self.partition, dead))
        if retry:
            appends.append((self.retry_topic, self.partition, retry))
        if not appends and not commits:
            return
        offsets = await self._store(appends, commits)
        if dead:
            self.stats.dead_letters.update(self._dead_counts)
            self._dead_out = []
            self._dead_counts = Counter()
        if retry:
            now = self.clock.now()
            for (headers, body), offset, at in zip(retry, offsets, self._retry_at, strict=True):
                self.retry.apply(Record(offset, headers, body, now), at)
            self._retry_out = []
            self._retry_at = []
            self._unflushed_work = 0
        if low != self._retry_committed:
            self._retry_committed = low

    async def _store(
        self, appends: list[tuple[str, int, list[Outgoing]]], commits: list[tuple[str, int, int]]
    ) -> list[int]:
        """Write ``appends`` then ``commits`` fenced; returns the last append's offsets."""
        fence = self._fence
        if self.log.atomic_store:
            write = BatchWrite(self.config.group, appends, commits)
            assigned = await self._log_call("store", lambda: self.log.store(write, fence=fence))
            return assigned[-1] if assigned else []
        offsets: list[int] = []
        dead_end: list[tuple[str, int, int]] = []
        for topic, partition, records in appends:
            operation = "dead-letter write" if topic == self.dlq_topic else "retry write"
            offsets = await self._log_call(
                operation, partial(self.log.append, topic, partition, records, fence=fence)
            )
            if topic == self.dlq_topic and offsets:
                dead_end = [(topic, partition, offsets[-1] + 1)]
        # The dead-letter partition's own offset goes last, after the main one:
        # dead letters past it may have been written by a batch whose main
        # offset was never stored, and a restart reads them back
        # (_recover_dead_letters).
        for topic, partition, offset in [*commits, *dead_end]:
            await self._log_call(
                "commit offset",
                partial(self.log.commit, self.config.group, topic, partition, offset, fence=fence),
            )
        return offsets

    def _write_retry(self, items: list[Item], failed_at: float | None, error: str) -> None:
        """Buffer main-topic items for the retry topic, in order (SPEC 5.5).

        :param failed_at: the key's first failure (seconds since the epoch)
            for items routed to a quarantined key; None for the failure that
            quarantines it now, whose first attempt is due after the first
            (jittered) delay.
        """
        at = self._times()
        now = at[0]
        if failed_at is None:
            failed_at = now
            due = now + self.config.retry_delay(1)
        else:
            # The key's state already holds its due time; this one is not read.
            due = failed_at + self.config.delay(1)
        for item in items:
            records = retry_work_records(item, failed_at, error, due)
            self._retry_out.extend(records)
            self._retry_at.extend([at] * len(records))
            self._unflushed_work += len(records)
            self._mark([item])

    async def _run_due_attempts(self) -> None:
        """One attempt for every due retry key, before the next poll (SPEC 6).

        Due keys are taken in rounds of at most :data:`ROUND_RECORDS` pending
        records (a key with more is a round of its own: its pending work is
        one batch). A round reads its keys' pending records from the retry
        partition (:meth:`_read_pending`), runs them, and flushes its markers
        before the next round is read, so the bodies in memory at any time are
        those of one round (SPEC 6, issue 12 item 3).
        """
        while True:
            keys = self._round_keys(self.retry.due_keys(self.clock.monotonic()))
            if not keys:
                return
            snapshots: dict[str, array[int]] = {}
            attempts: dict[str, int] = {}
            for key in keys:
                state = self.retry.keys[key]
                snapshots[key] = array("q", state.offsets)
                attempts[key] = state.failures
            records = await self._read_pending(snapshots)
            by_key: dict[str, list[Item]] = {}
            fresh: list[Item] = []
            for key in keys:
                state = self.retry.keys[key]
                checked, skip = state.checked_through, state.skip
                usable = [r for r in records[key] if r.offset > checked or r.offset not in skip]
                items, rejects = decode_records(
                    usable, self.topic, self.partition, self.types, from_retry=True
                )
                self._dead_letter_rejects(rejects)  # once: they count as done from now on
                skip.update(r.record.offset for r in rejects)
                by_key[key] = items
                fresh.extend(i for i in items if i.record.offset > checked)
                state.checked_through = max(checked, snapshots[key][-1])
            # Pending records are looked up in the inbox once per process: only
            # our own handler calls claim them, and those resolve them.
            if fresh:
                kept = {id(item) for item in await self._inbox_filter(fresh)}
                dropped = {id(i) for i in fresh} - kept
                for key, items in by_key.items():
                    if any(id(i) in dropped for i in items):
                        self.retry.keys[key].skip.update(
                            i.record.offset for i in items if id(i) in dropped
                        )
                        by_key[key] = [i for i in items if id(i) not in dropped]
            decoded = [item for key in keys for item in by_key[key]]
            segments_by_key = {key: Segment(key, []) for key in keys}
            for seg in plan(decoded):
                segments_by_key[seg.key] = seg
            segments = list(segments_by_key.values())
            del records, by_key, fresh, decoded
            finished: set[str] = set()

            async def after(
                seg: Segment,
                outcome: SegmentOutcome,
                taken: dict[str, array[int]] = snapshots,
                ended: set[str] = finished,
            ) -> None:
                await self._finish_attempt(seg.key, taken[seg.key], outcome)
                ended.add(seg.key)

            handled: list[Run] = []
            try:
                await self._run_segments(segments, after, handled, attempts)
            except Abandon:
                await self._store_partial_attempts(handled, finished)
                raise
            await self._flush()
            await self._commit_retry()

    def _round_keys(self, due: list[str]) -> list[str]:
        """The first of the ``due`` keys whose pending records add up to at
        most :data:`ROUND_RECORDS` (at least one key)."""
        taken: list[str] = []
        total = 0
        for key in due:
            count = len(self.retry.keys[key].offsets)
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
            and its ``wk-key`` is the key it is pending for (SPEC 6, issue 12
            item 3). A pending record the log no longer holds (deleted by
            retention) is logged and missing from the attempt.
        """
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
            page = await self._log_call(
                "read retry topic",
                partial(self.log.read, self.retry_topic, self.partition, start, count),
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
            log.warning(
                "pending retry records are missing from the retry topic",
                extra={
                    **self._fields,
                    "records": missing,
                    "keys": [k for k, r in found.items() if len(r) != len(snapshots[k])],
                },
            )
        return found

    async def _store_partial_attempts(self, handled: list[Run], finished: set[str]) -> None:
        """At a stop in the middle of an attempt round, write what it did.

        Keys whose attempt ended have their markers buffered already; a key
        stopped between two chunks is resolved through the last retry record
        its handled chunks stand for (they are a prefix of its pending
        records, in order). Without this, a restart ran the whole round
        again: chunks that had succeeded were handled twice, even with
        ``NO_DOUBLE_CONSUME``.
        """
        through: dict[str, int] = {}
        for chunk in handled:
            if chunk.key not in finished:
                last = max(r.offset for item in chunk for r in item.sources)
                through[chunk.key] = max(through.get(chunk.key, last), last)
        at = self._times()
        now = at[0]
        self._retry_out.extend(resolved_marker(key, offset, now) for key, offset in through.items())
        self._retry_at.extend(at for _ in through)
        try:
            await self._flush()
            await self._commit_retry()
        except Abandon:
            return  # the log refused while stopping: store nothing more

    async def _finish_attempt(self, key: str, pending: array[int], outcome: SegmentOutcome) -> None:
        """Buffer the markers of ``key``'s attempt, whose pending retry offsets
        were ``pending`` (increasing) when it started."""
        self.stats.attempts += 1
        at = self._times()
        now = at[0]
        state = self.retry.keys[key]
        fields: dict[str, Any] = {**self._fields, "key": key}
        if outcome.error is None:
            self._retry_out.append(resolved_marker(key, pending[-1], now))
            self._retry_at.append(at)
            log.info("quarantine lifted", extra=fields)
            return
        self.stats.attempts_failed += 1
        error = sanitize(outcome.error, self.config.error_text_limit)
        first_undone = min(r.offset for i in outcome.rest for r in i.sources)
        done_before = pending[: bisect_left(pending, first_undone)]
        # The counter belongs to the head of the key's pending work (SPEC 6): an
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
        if failures > len(tuple(self.config.retry_delays)):
            gave_up = [r.offset for i in outcome.rest for r in i.sources]
            fields["offsets"] = [o for i in outcome.rest for o in i.main_offsets]
            log.error("giving up retry", extra=fields)
            self.stats.gave_up_keys += 1
            self._dead_letter_items(outcome.rest, ReasonCode.GAVE_UP_RETRY, error)
            markers.append(resolved_marker(key, max(gave_up), now, reset=True))
        else:
            if done_before:
                markers.append(resolved_marker(key, max(done_before), now))
            delay = self.config.retry_delay(failures)
            markers.append(attempt_failed_marker(key, failures, now, now + delay))
            log.warning(
                "retry attempt failed",
                extra={
                    **fields,
                    "offsets": [o for i in outcome.rest for o in i.main_offsets],
                    "next_attempt_in": delay,
                },
            )
        self._retry_out.extend(markers)
        self._retry_at.extend(at for _ in markers)

    # ------------------------------------------------------------ dead letters

    def _dead_letter_items(self, items: Iterable[Item], reason: ReasonCode, error: str) -> None:
        """Buffer the dead-letter copies of every record ``items`` stand for (SPEC 8)."""
        items = list(items)
        self._dead_out.extend(
            dead_letter_record(record, reason, error, origin)
            for item in items
            for record, origin in zip(item.sources, item.origins, strict=True)
        )
        self._dead_counts[reason.value] += sum(map(_count, items))
        self._mark(items)

    def _dead_letter_rejects(self, rejects: list[Reject]) -> None:
        """Buffer the dead-letter copies of records that cannot reach a handler (SPEC 8)."""
        for reject in rejects:
            if reject.reason is None:  # a replayed dead letter of another group
                self.stats.other_group_skipped += 1
                if self._done is not None:
                    self._done.add(reject.record.offset)
                continue
            origin = retry_source(reject.record)
            if origin is None:
                ident = message_id(self.topic, self.partition, reject.record.offset)
                origin = Source(self.topic, self.partition, (reject.record.offset,), (ident,))
            detail = sanitize(reject.detail, self.config.error_text_limit)
            log.error(
                "record dead-lettered: %s",
                reject.reason.value,
                extra={
                    **self._fields,
                    "key": reject.key,
                    "offsets": [reject.record.offset],
                    "reason": reject.reason.value,
                    "error": detail,
                },
            )
            self._dead_out.append(dead_letter_record(reject.record, reject.reason, detail, origin))
            self._dead_counts[reject.reason.value] += 1
            if self._done is not None:
                self._done.add(reject.record.offset)
