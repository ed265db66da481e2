"""The partition worker: one (topic, partition) task, the poll/commit loop (design §5, §6, §8, §14).

Owns the loop of one partition under one lease: restore the retry state and
the start position, then, until stopped, run the due retry attempts
(:mod:`._attempts`), poll a batch of the main topic, decode and plan it
(:mod:`._plan`), route the records of quarantined keys to the retry topic,
run the rest (:mod:`._executor`), quarantine keys that failed Retryable,
and store the batch's dead letters, retry work and offset (:mod:`._outbox`).
A graceful stop in the middle of a batch stores what the delivery mode
allows.

Batches overlap (a pipeline, ``docs/engine.md`` "Pipelining across
batches"): once the running batch's last keys run, the next batch starts
beside it, at most two in flight; a key's segment waits for its segment of
the batch before, and the batches are stored in order.

The three failure classes:

- ``Transient``: the same chunk is called again on the schedule, forever;
  the partition's *gate* closes, so no chunk of any key starts until it
  succeeds, and the partition does not poll (the batch is not finished).
  The consumer's own log calls get the same treatment (:mod:`._shared`).
- ``Retryable``: the key stops; its unfinished work goes to ``wk-retry.<group>.<topic>``
  and the key is quarantined (or dead-lettered when the backlog is full).
- ``Unrecoverable``: the chunk is dead-lettered and the run goes on.

The offset is committed by the outbox's store (:meth:`Outbox.flush
<wakuwaku.engine._outbox.Outbox.flush>`), in the same fenced write as the
batch's dead letters and retry work where the log allows it.

May call: everything below it (:mod:`._attempts`, :mod:`._executor`,
:mod:`._outbox`, :mod:`._shared`) and the pure planner (:mod:`._plan`).
Called by the consumer (:mod:`._consumer`), which takes the partition's
lease (or is assigned the partition), renews it, and stops the worker when
it is lost.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor as ThreadPool
from functools import partial
from typing import Any

from .._control import Action
from .._errors import ErrorClass
from .._records import H_GROUP, ReasonCode, Record, key_or_none
from .._sanitize import sanitize
from ..logs import MAX_READ_RECORDS, Lease, Log
from ._attempts import Attempts
from ._config import ConsumerConfig, DeliveryMode
from ._control import NO_CONTROL, ControlReader
from ._executor import ChunkExecutor, Pipe, SegmentOutcome
from ._handler import Handler
from ._outbox import Outbox
from ._plan import Groups, Run, Segment, decode_batch, plan_groups, runs_by_key
from ._retry import RetryState, load_retry_state, retry_source
from ._shared import Abandon, LogHealth, PartitionServices, logger
from ._stats import ConsumerStats
from ._view import PartitionView, quarantined_keys

ROUTED_ERROR = "routed to the retry topic: the key is quarantined"
HELD_ERROR = "held in the retry topic: an operator paused the key"


FIRST_POLL_RECORDS = 100
"""Records a partition's first poll asks for (at most ``max_poll_records``),
and the least a later one may grow to (:func:`poll_size`)."""

RECORD_OVERHEAD = 64
"""Bytes a record is taken to hold beyond its body and headers (offset,
timestamp, the objects themselves) when a poll's size is worked out."""


def poll_size(page: Sequence[Record], max_records: int, max_bytes: int) -> int:
    """Records the next poll asks for after ``page``, the last one's answer.

    At most ``max_records``; at most as many as fit ``max_bytes`` at the
    mean size of ``page``'s records (body, plus headers as the first and
    last record hold them, plus :data:`RECORD_OVERHEAD`); and at most twice
    as many as ``page`` holds (or :data:`FIRST_POLL_RECORDS`, when that is
    more). At least one. An empty page (the partition is caught up) starts
    over at :data:`FIRST_POLL_RECORDS`.

    A poll's records stay in memory while its batch runs (and the next
    batch is read ahead), so bytes bound a partition's batch as Kafka's
    ``max.partition.fetch.bytes`` bounds its fetches; a log's read takes a
    count, not bytes, so the size of the records to come is taken to be
    that of the last ones. Growing by at most a factor of two keeps that
    guess from being far off when the records change: a partition that was
    caught up (pages of a few small records) asks for 100 first, not 2 000
    records that may turn out large. While a backlog lasts, the polls grow
    to ``max_records`` in a few pages (100, 200, 400, ...). It stays a
    guess: after a full page of small records, 2 000 large ones may come.
    """
    if not page:
        return max(1, min(max_records, FIRST_POLL_RECORDS))
    per = _record_bytes(page)
    return _next_poll(len(page), _page_bytes(page, per), max_records, max_bytes)


def within_bytes(page: list[Record], max_bytes: int) -> list[Record]:
    """The first records of ``page`` that together fit ``max_bytes``, at least one.

    Each record is sized as :func:`poll_size` sizes them (its body, headers
    as the first and last record hold them, :data:`RECORD_OVERHEAD`). A
    poll's guess of how many records fit can be far off when the records
    grow (a first poll of 100 large ones, a full page of small ones before
    large ones); what the poll hands on as a batch is cut here, so two
    batches in flight hold at most 2 x ``max_bytes`` (or a record each,
    when one alone is larger): the at-least-once window that
    ``docs/engine.md`` states. The records cut off are read again by the
    next poll. Headers are an estimate (sizing each record's would cost
    about a tenth of the engine's time per record): records in the middle
    of a page whose headers are much larger than its ends' count as small.
    """
    return fit_poll(page, MAX_READ_RECORDS, max_bytes)[0]


def fit_poll(page: list[Record], max_records: int, max_bytes: int) -> tuple[list[Record], int]:
    """:func:`within_bytes` of ``page``, and :func:`poll_size` of what it
    keeps: what a poll's answer becomes, with its records sized once."""
    if len(page) < 2:
        return page, poll_size(page, max_records, max_bytes)
    per = _record_bytes(page)
    total = _page_bytes(page, per)
    if total <= max_bytes:
        return page, _next_poll(len(page), total, max_records, max_bytes)
    size, kept = 0, len(page)
    for index, record in enumerate(page):
        size += len(record.body) + per
        if size > max_bytes:
            kept = max(1, index)
            break
    cut = page[:kept]
    return cut, poll_size(cut, max_records, max_bytes)


def _record_bytes(page: Sequence[Record]) -> int:
    """What a record of ``page`` holds besides its body: headers as the first
    and last record hold them, and :data:`RECORD_OVERHEAD`. Headers are sized
    on two records, not all of them: per record, that work would cost about
    a tenth of what the engine spends on a record."""
    return RECORD_OVERHEAD + (_header_bytes(page[0]) + _header_bytes(page[-1])) // 2


def _page_bytes(page: Sequence[Record], per: int) -> int:
    return sum(len(r.body) for r in page) + per * len(page)


def _next_poll(count: int, total: int, max_records: int, max_bytes: int) -> int:
    """How many records fit ``max_bytes`` at the size of the last poll's
    ``count`` records (``total`` bytes), within the bounds of :func:`poll_size`."""
    fit = max_bytes * count // total
    return max(1, min(max_records, fit, max(FIRST_POLL_RECORDS, 2 * count)))


def _header_bytes(record: Record) -> int:
    return sum(len(name) + len(value) for name, value in record.headers.items())


class _Batch:
    """One polled batch of the main partition while it is in flight.

    :ivar records: its records.
    :ivar following: the offset after its last record (stored once it is
        done and every batch before it is).
    :ivar handled: its chunks whose outcome is final (a stop stores the
        first record neither handled nor done).
    :ivar pipe: what its lanes note for a batch that runs beside it.
    :ivar task: the task running it (decode, plan, execute).
    """

    __slots__ = ("following", "handled", "pipe", "records", "task")

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.following = records[-1].offset + 1
        self.handled: list[Run] = []
        self.pipe = Pipe()
        self.task: asyncio.Future[None] | None = None


class PartitionWorker:
    """Consumes one partition of one main topic until stopped or fenced.

    :param log: the log.
    :param config: the consumer's configuration.
    :param topic: the (qualified) main topic.
    :param partition: the partition.
    :param handlers: handler per type tag.
    :param stats: counters shared by the consumer's partition workers.
    :param lease: the partition's lease; its writes and commits are fenced
        by it (None: no lease, no fence).
    :param lease_deadline: when the lease runs out unless renewed (the clock's
        monotonic seconds); no chunk starts past it (the consumer renews it).
    :param on_caught_up: called each time a poll finds nothing new (the
        consumer's :meth:`~wakuwaku.Consumer.drain` listens).
    :param health: the consumer's :class:`~._shared.LogHealth`, shared by its
        partitions (a partition whose log call succeeds after an outage
        wakes the others' retries).
    :param thread_pool: the thread pool sync handlers run on (None: asyncio's
        default one); not to be confused with :attr:`chunk_executor`, the
        :class:`ChunkExecutor` that calls the handlers.
    :param control: the consumer's reader of operator commands (pauses,
        a quarantined key's retry-now and give-up); default: none ever.

    :ivar position: the main partition's offset as stored (next to read).
    :ivar started: true once the retry state and position are restored.
    :ivar caught_up: true while the last poll found nothing new.
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
        lease: Lease | None = None,
        lease_deadline: float = math.inf,
        on_caught_up: Callable[[], None] | None = None,
        thread_pool: ThreadPool | None = None,
        health: LogHealth | None = None,
        control: ControlReader = NO_CONTROL,
    ) -> None:
        self.services = services = PartitionServices(
            log=log,
            config=config,
            topic=topic,
            partition=partition,
            stats=stats,
            lease=lease,
            lease_deadline=lease_deadline,
            health=health,
        )
        self.log = log
        self.config = config
        self.topic = topic
        self.partition = partition
        self.stats = stats
        self.clock = config.clock
        self.retry_topic = services.retry_topic
        self.dead_letter_topic = services.dead_letter_topic
        self._fields = services.fields
        self.outbox = Outbox(services)
        self.chunk_executor = ChunkExecutor(services, self.outbox, handlers, thread_pool)
        self.attempts = Attempts(services, self.chunk_executor, self.outbox)
        self.control = control
        # What the worker last saw of the pauses (their version) and how far
        # it applied the one-shot commands.
        self._pauses_seen = -1
        self._commands_seen = 0
        self.paused_by: str | None = None
        self.types = self.attempts.types
        self.position = 0
        # Records the next poll asks for (poll_size): few until a page shows
        # how large the partition's records are.
        self._poll_records = min(config.max_poll_records, FIRST_POLL_RECORDS)
        self.caught_up = False
        self._on_caught_up = on_caught_up
        self.started = False
        self._finishing = False  # finish(): no batch after the running one
        # Set by the consumer's watchdog when it cancels this worker as stalled.
        self.stalled = False
        # The main batches in flight, oldest first: at most two (a pipeline,
        # see _may_overlap), stored in that order.
        self._inflight: list[_Batch] = []
        self._prefetch: asyncio.Future[list[Record]] | None = None
        # Keys that failed Retryable in a batch in flight whose retry work is
        # not stored yet (their quarantine is not in the retry state): a later
        # batch routes their records, with this failure time.
        self._failing: dict[str, float] = {}

    # ------------------------------------------------------------------ control

    @property
    def retry(self) -> RetryState:
        """The retry partition's pending work (design §6)."""
        return self.services.retry

    @property
    def lease_deadline(self) -> float:
        """When the lease runs out unless renewed (monotonic seconds); the
        consumer's renewer moves it."""
        return self.services.lease_deadline

    @lease_deadline.setter
    def lease_deadline(self, deadline: float) -> None:
        self.services.lease_deadline = deadline

    ended = False
    """Set by the consumer once :meth:`run` has returned: the loops beside the
    worker (lease renewal, assignment watch) end on it."""

    def stop(self) -> None:
        """Ask the worker to stop: no new chunk starts, waits are abandoned."""
        self.services.stop()

    def finish(self) -> None:
        """Ask the worker to stop after the batch it runs: no batch starts
        after it, and the one running is stored whole (nothing of it is
        delivered again, unlike a :meth:`stop` in its middle). A partition
        given back for balance ends so."""
        self._finishing = True

    @property
    def stopping(self) -> bool:
        return self.services.stopping

    def view(self) -> PartitionView:
        """A frozen snapshot of the partition's position and retry state."""
        retry = self.retry
        keys = sorted(
            quarantined_keys(retry, self.partition), key=lambda q: (q.next_attempt_at, q.key)
        )
        return PartitionView(
            self.topic,
            self.partition,
            self.started,
            self.position,
            self.caught_up,
            retry.pending_count,
            tuple(keys),
            self.paused_by,
            len(retry.held),
        )

    # --------------------------------------------------------------------- loop

    async def run(self) -> None:
        """Consume until :meth:`stop` or a lost lease; returns quietly then."""
        services = self.services
        try:
            await self._restore()
            self.started = True
            while not services.stop_requested() and not self._finishing:
                if self.control.pauses.version != self._pauses_seen:
                    self._follow_pauses()
                if self.paused_by is not None:
                    await services.sleep(self.config.poll_interval)
                    continue
                if len(self.control.commands) > self._commands_seen:
                    await self._follow_commands()
                await self._run_due_attempts()
                if self._prefetch is not None:
                    records = await self._prefetch
                    self._prefetch = None
                else:
                    records = await self._poll(self.position)
                if not records:
                    await self._skip_undelivered(records)
                    self.caught_up = True
                    if self._on_caught_up is not None:
                        self._on_caught_up()
                    await self._store_retry_offset()
                    await services.sleep(self._idle_wait())
                    continue
                await self._consume(records)
        except Abandon:
            return
        finally:
            await self._cancel_inflight()

    async def _cancel_inflight(self) -> None:
        """Cancel the read ahead and what still runs of the batches in flight
        (a lost lease, a crash, a cancelled worker): no chunk of this worker
        runs on after it."""
        tasks: list[asyncio.Future[Any]] = [
            b.task for b in self._inflight if b.task is not None and not b.task.done()
        ]
        if self._prefetch is not None:
            tasks.append(self._prefetch)
            self._prefetch = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight = []
        self.outbox.done = None

    def _follow_pauses(self) -> None:
        """Take in the operator's pauses (design §14): is the partition paused,
        which of its keys are; each change is logged once."""
        pauses = self.control.pauses
        self._pauses_seen = pauses.version
        pause = pauses.partition_pause(self.topic, self.partition)
        was = self.paused_by
        self.paused_by = None if pause is None else pause.scope()
        if pause is not None and was is None:
            logger.warning(
                "partition paused by an operator",
                extra={
                    **self._fields,
                    "scope": pause.scope(),
                    "by": pause.by,
                    "reason": pause.reason,
                },
            )
        elif pause is None and was is not None:
            logger.warning("partition resumed by an operator", extra=self._fields)
        retry = self.retry
        keys = pauses.paused_keys(self.topic, self.partition)
        if keys.keys() == retry.held:
            return
        for key in keys.keys() - retry.held:
            logger.warning(
                "key paused by an operator; its records wait in the retry topic",
                extra={**self._fields, "key": key, "by": keys[key].by, "reason": keys[key].reason},
            )
        for key in retry.held - keys.keys():
            logger.warning("key resumed by an operator", extra={**self._fields, "key": key})
        retry.held = set(keys)

    async def _follow_commands(self) -> None:
        """Apply the operator's new ``retry-now`` and ``give-up`` commands of
        this partition's keys (design §14); each is bounded by its
        ``through`` offset, so one applied before (by this worker or an
        earlier owner) changes nothing. A give-up is stored (its dead
        letters and markers) before the next command is applied: two
        give-ups of one key read in one pass dead-lettered its work twice,
        the second applied before the first's markers reached the retry
        state."""
        commands = self.control.commands
        new = commands[self._commands_seen :]
        self._commands_seen = len(commands)
        for _, command in new:
            key, through = command.key, command.through
            if (
                command.topic != self.topic
                or command.partition != self.partition
                or key is None
                or through is None
            ):
                continue
            state = self.retry.keys.get(key)
            if state is None:
                continue
            if command.action is Action.GIVE_UP:
                markers = await self.attempts.give_up_now(key, through, command.by, command.reason)
                if markers:
                    self.outbox.add_markers(markers)
                    await self.outbox.flush()
                    await self._store_retry_offset()
            elif state.due_from < through and state.due > self.clock.monotonic():
                state.due = self.clock.monotonic()
                state.due_wall = self.clock.now()
                logger.warning(
                    "retry attempt moved to now by an operator",
                    extra={**self._fields, "key": key, "by": command.by},
                )

    async def _skip_undelivered(self, page: list[Record]) -> None:
        """Store a position past offsets the log holds but never delivers.

        An empty read on Kafka may have moved over transaction markers and
        aborted records (a :class:`~wakuwaku.logs.Page` says so): with no
        record to end a batch at, the position is moved and stored here, or
        a partition that ends with a marker would never reach its end offset
        (a drain that never ends, a lag that never goes to 0).
        """
        following = getattr(page, "next_offset", None)
        if following is None or following <= self.position:
            return
        await self._commit_main(following)
        self.position = following
        self.retry.forget_routed(following)

    async def _poll(self, offset: int) -> list[Record]:
        count = self._poll_records
        page = await self.services.read(
            "poll", lambda: self.log.read(self.topic, self.partition, offset, count)
        )
        config = self.config
        page, self._poll_records = fit_poll(page, config.max_poll_records, config.max_poll_bytes)
        return page

    def _idle_wait(self) -> float:
        """Seconds until the next poll: ``poll_interval``, or less when a retry
        key is due sooner (on monotonic time, design §6)."""
        wait = self.config.poll_interval
        next_due = self.retry.next_due()
        if next_due is not None:
            wait = min(wait, max(0.0, next_due - self.clock.monotonic()))
        return wait

    async def _run_due_attempts(self) -> None:
        """One attempt for every due retry key, before the next poll (design §6).

        Each round's markers are stored before the next round is read, so the
        record bodies in memory at any time are those of one round.
        """
        outbox = self.outbox
        while (result := await self.attempts.run_round()) is not None:
            outbox.add_markers(result.markers)
            if result.stopped:
                try:
                    await outbox.flush()
                    await self._store_retry_offset()
                except Abandon:
                    pass  # the log refused while stopping: store nothing more
                raise Abandon
            await outbox.flush()
            await self._store_retry_offset()

    async def _restore(self) -> None:
        """Rebuild retry state from the retry partition and find the start position."""
        log_call = self.services.log_call
        _, retry_start = await load_retry_state(
            self.log, self.config.group, self.retry_topic, self.partition, self.retry, call=log_call
        )
        self.outbox.retry_committed = retry_start
        position = await log_call(
            "load offset",
            lambda: self.log.committed(self.config.group, self.topic, self.partition),
        )
        starts = await log_call("start offsets", lambda: self.log.start_offsets(self.topic))
        start = starts.get(self.partition, 0)
        if position is None:
            position = start
        elif position < start:
            # Retention deleted records this group never read:
            # the log can only go on from its floor, but never in silence.
            logger.warning(
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
            logger.warning(
                "broken retry record; going on without it",
                extra={**self._fields, "retry_offset": offset, "key": key, "error": what},
            )
        self.retry.broken.clear()
        if self.retry.foreign:
            logger.warning(
                "retry topic holds records of other consumer groups; skipped",
                extra={
                    **self._fields,
                    "retry_topic": self.retry_topic,
                    "records": self.retry.foreign,
                    "hint": "two groups were configured with one retry topic "
                    "(ConsumerConfig.retry_topics); give each its own",
                },
            )
            self.retry.foreign = 0
        if not self.log.atomic_store:
            await self._recover_dead_letters(position)
        self.retry.forget_routed(position)
        if self.retry.keys:
            logger.info(
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
        dead-lettered a second time.

        The group's offset in its dead-letter partition is stored after the
        main offset; dead letters past it whose main offsets are at or past
        ``position`` stand for records already done. They are remembered
        like routed records (:attr:`RetryState.routed`); their message ids
        (:attr:`RetryState.dead_lettered`) keep a retry round from giving the
        same retry work up again when the crash came between a give-up's dead
        letters and its resolved marker. A partition without that offset yet
        gets its end stored, so tracking starts now; on a log that cannot
        tell a committed 0 from none (:attr:`Log.commits_zero`, Iggy), the
        dead letters are read from the partition's start instead (storing
        0 there would read back as none, and the dead letters written before
        a crash would be skipped).
        """
        log_call = self.services.log_call
        group, dead_letter_topic, partition = (
            self.config.group,
            self.dead_letter_topic,
            self.partition,
        )
        offset = await log_call(
            "load dead-letter offset",
            lambda: self.log.committed(group, dead_letter_topic, partition),
        )
        if offset is None and not self.log.commits_zero:
            starts = await log_call(
                "start offsets", lambda: self.log.start_offsets(dead_letter_topic)
            )
            offset = starts.get(partition, 0)
        if offset is None:
            ends = await log_call("end offsets", lambda: self.log.end_offsets(dead_letter_topic))
            end = ends.get(partition, 0)
            await log_call(
                "commit dead-letter offset",
                partial(
                    self.log.commit,
                    group,
                    dead_letter_topic,
                    partition,
                    end,
                    fence=self.services.fence,
                ),
            )
            return
        routed = self.retry.routed
        ours = group.encode()
        while page := await log_call(
            "read dead letters", partial(self.log.read, dead_letter_topic, partition, offset, 1000)
        ):
            for record in page:
                source = retry_source(record)
                key = key_or_none(record.headers)
                owner = record.headers.get(H_GROUP)
                if (
                    (owner is not None and bytes(owner) != ours)
                    or source is None
                    or key is None
                    or source.topic != self.topic
                    or source.partition != partition
                    or not source.offsets
                ):
                    continue
                top = max(source.offsets)
                if top >= position:
                    routed[key] = max(routed.get(key, -1), top)
                    # A record that never reached a handler (a reject) is
                    # dead-lettered before planning, where routing is not
                    # asked: its offset says it is done.
                    self.outbox.recovered.update(o for o in source.offsets if o >= position)
                # A give-up's dead letters (main offsets long stored) whose
                # resolved marker the crash kept from the retry topic.
                self.retry.dead_lettered.update(source.ids)
            offset = page[-1].offset + 1

    async def _consume(self, records: list[Record]) -> None:
        """Run ``records`` as a batch, and the batches a pipeline starts
        beside it, until none is in flight; each is stored in order.

        A pipeline (``docs/engine.md``, "Pipelining across batches"): once
        no segment of the running batch is left to start (its last keys
        run, a lane is free) and the next poll has answered, the next batch
        starts beside it (:meth:`_may_overlap`); at most two are in flight.
        A batch's offset is stored once it is done *and* the one before it
        is stored: the stored offset never passes a record not done.
        """
        inflight = self._inflight
        if self.config.delivery_mode is DeliveryMode.NO_DOUBLE_CONSUME:
            # Stored before it runs (no pipeline in this mode).
            await self._commit_main(records[-1].offset + 1)
        self.outbox.done = set()
        self._start(records)
        try:
            while inflight:
                head = inflight[0]
                assert head.task is not None
                if head.task.done():
                    await self._store_head(head)
                    continue
                self._raise_failed()
                if len(inflight) == 1 and self._may_overlap(head):
                    prefetch = self._prefetch
                    assert prefetch is not None
                    self._prefetch = None
                    self._start(prefetch.result(), head)
                    continue
                await asyncio.wait(self._waits(head), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not inflight:
                self.outbox.done = None

    def _start(self, records: list[Record], before: _Batch | None = None) -> None:
        """Start running ``records`` as a batch (after ``before``, still in
        flight, when given), and read the next batch ahead."""
        self.stats.polled += len(records)
        self.caught_up = False
        batch = _Batch(records)
        task = asyncio.ensure_future(self._process_batch(batch, before))
        task.add_done_callback(lambda _: batch.pipe.release())
        batch.task = task
        self._inflight.append(batch)
        # Read the next batch while this one runs: the read only looks ahead,
        # it decides nothing (the batch is planned when it runs).
        self._prefetch = asyncio.ensure_future(self._poll(batch.following))

    def _may_overlap(self, head: _Batch) -> bool:
        """Whether the next batch may start beside ``head`` now: no segment of
        ``head`` is left to start, the next poll answered with records, and
        nothing asks the partition to wait between batches (a stop, a
        finish, a Transient failure or log outage closing the gate, an
        operator's pause or command, a retry key due: those are dealt with
        when nothing is in flight). At-least-once only: at-most-once stores
        a batch's offset before it runs."""
        prefetch = self._prefetch
        return (
            head.pipe.drained.done()
            # Some key of it still runs (else it is about to end: no need).
            and bool(head.pipe.running)
            and prefetch is not None
            and prefetch.done()
            and not prefetch.cancelled()
            and prefetch.exception() is None
            and bool(prefetch.result())
            and self.config.delivery_mode is DeliveryMode.NO_EVENT_LOSE
            and self.config.max_concurrency > 1
            and self.services.gate.is_open
            and not self.services.stop_requested()
            and not self._finishing
            and self.control.pauses.version == self._pauses_seen
            and len(self.control.commands) == self._commands_seen
            and not self._retry_due()
        )

    def _retry_due(self) -> bool:
        due = self.retry.next_due()
        return due is not None and due <= self.clock.monotonic()

    def _waits(self, head: _Batch) -> list[asyncio.Future[Any]]:
        """What the pipeline loop waits on: a batch ending, and, with one
        batch in flight, its last segments starting, then the next poll."""
        waits: list[asyncio.Future[Any]] = [
            b.task for b in self._inflight if b.task is not None and not b.task.done()
        ]
        if len(self._inflight) == 1:
            if not head.pipe.drained.done():
                waits.append(head.pipe.drained)
            elif self._prefetch is not None and not self._prefetch.done():
                waits.append(self._prefetch)
        return waits

    def _raise_failed(self) -> None:
        """A later batch that crashed (a bug: not Abandon) ends the worker
        now, not after the batches before it."""
        for batch in self._inflight:
            task = batch.task
            if task is not None and task.done() and not task.cancelled():
                exc = task.exception()
                if exc is not None and not isinstance(exc, Abandon):
                    raise exc

    async def _store_head(self, head: _Batch) -> None:
        """The oldest batch in flight ended: store it (its dead letters, retry
        work and offset), or, when it was abandoned (a stop), wait for the
        others and store the first record not done across all of them."""
        assert head.task is not None
        exc = None if head.task.cancelled() else head.task.exception()
        if head.task.cancelled():
            raise asyncio.CancelledError
        if exc is not None and not isinstance(exc, Abandon):
            raise exc
        if exc is not None:
            inflight = self._inflight
            await asyncio.gather(*(b.task for b in inflight if b.task), return_exceptions=True)
            self._raise_failed()
            try:
                await self._store_partial(inflight)
            finally:
                inflight.clear()
            raise Abandon
        following = head.following
        # Done: what a stop would need of it goes now, not after the store
        # (the chunks and records of a batch are most of what a partition holds).
        head.handled = []
        head.records = []
        # The batch's dead letters, retry work and offsets: one transaction
        # where the log allows it, so a crash leaves all or none of them. With
        # a later batch running beside it, the offset stored is that batch's
        # first record not done, and the outcomes of its records before it go
        # with this store; the rest wait for the later batch's own store.
        stored = following
        if self.config.delivery_mode is DeliveryMode.NO_EVENT_LOSE:
            if len(self._inflight) > 1:
                stored = self._first_not_done(self._inflight[1])
            await self.outbox.flush(stored)
        else:
            await self.outbox.flush(None)
        self._inflight.pop(0)
        self.position = stored
        self.retry.forget_routed(following)
        if self.outbox.recovered:
            self.outbox.recovered = {o for o in self.outbox.recovered if o >= following}
        if self._inflight:
            done = self.outbox.done
            if done:
                self.outbox.done = {o for o in done if o >= following}
        if self._failing:
            keys = self.retry.keys
            self._failing = {k: at for k, at in self._failing.items() if k not in keys}

    def _first_not_done(self, batch: _Batch) -> int:
        """The offset of ``batch``'s first record (it runs beside the batch
        being stored) that is neither handled nor done, or of its last
        record when every one is (its own store follows when it ends)."""
        done = self.outbox.done or ()
        handled = {r.offset for chunk in batch.handled for item in chunk for r in item.sources}
        return next(
            (r.offset for r in batch.records if r.offset not in done and r.offset not in handled),
            batch.records[-1].offset,
        )

    async def _store_partial(self, batches: list[_Batch]) -> None:
        """At a stop in the middle of a batch, store what the delivery mode allows (design §14).

        ``NO_EVENT_LOSE``: the offset of the first record that is not done, so
        nothing before it is delivered again (done records after it, of keys
        that ran concurrently, are: at-least-once). ``NO_DOUBLE_CONSUME``: the
        offset was stored after the batch before it ran; it moves back to the
        first record not done only when no record after that one was handled,
        so nothing is ever handled twice; otherwise the records not started
        are lost, as at-most-once allows, and their count is logged.
        """
        done = set(self.outbox.done or ())
        for batch in batches:
            done.update(r.offset for chunk in batch.handled for item in chunk for r in item.sources)
        records = [r for batch in batches for r in batch.records]
        following = batches[-1].following
        first = next((r.offset for r in records if r.offset not in done), following)
        target = first
        stored = self.position  # what the log holds now
        if self.config.delivery_mode is DeliveryMode.NO_DOUBLE_CONSUME:
            stored = following
            if any(r.offset in done for r in records if r.offset > first):
                lost = sum(1 for r in records if r.offset not in done)
                if lost:
                    logger.warning(
                        "stopped mid-batch: records not started are skipped (at-most-once)",
                        extra={**self._fields, "records": lost},
                    )
                target = following
        # Outcomes of records the stored offset leaves undone are not stored:
        # delivered again, they get theirs then, once (design §7).
        self.outbox.drop_from(target)
        try:
            await self.outbox.flush(target if target != stored else None)
        except Abandon:
            return  # the log refused while stopping: store nothing more
        self.position = target

    async def _commit_main(self, offset: int) -> None:
        await self.services.log_call(
            "commit offset",
            lambda: self.log.commit(
                self.config.group, self.topic, self.partition, offset, fence=self.services.fence
            ),
        )

    async def _store_retry_offset(self) -> None:
        """Store the retry partition's lowest pending offset (design §6).

        An outbox flush stores the low watermark from *before* the records it
        writes (never above the truth); called right after a flush that wrote
        records, this one stores the watermark they moved, and is a no-op
        otherwise. The retry partition has no lease of its own: it belongs to
        the main partition's owner, so the commit carries the main lease as
        its fence and is refused once another member owns the partition
        (design §15).
        """
        await self.outbox.flush()

    # -------------------------------------------------------------------- batch

    async def _process_batch(self, batch: _Batch, before: _Batch | None) -> None:
        records = batch.records
        chunk_executor = self.chunk_executor
        # Without an inbox nothing needs the items of a batch that goes well:
        # the runs keep records instead (see Run).
        items, groups, rejects = decode_batch(
            records,
            self.topic,
            self.partition,
            self.types,
            compact=not chunk_executor.has_inbox,
            group=self.config.group,
        )
        if rejects:
            self.outbox.dead_letter_rejects(rejects)
        if chunk_executor.has_inbox:
            groups = runs_by_key(await chunk_executor.inbox_filter(items))
        if self.retry.keys or self.retry.routed or self.retry.held or self._failing:
            self._route_quarantined(groups)
        segments = plan_groups(groups, reduces=chunk_executor.reduces)
        if chunk_executor.reduces:
            self.stats.reduced_away += sum(
                len(run) for runs in groups.values() for run in runs
            ) - sum(len(run) for seg in segments for run in seg.runs)
        pipe = batch.pipe
        pipe.running = dict.fromkeys((seg.key for seg in segments), None)
        after = self._after_main_segment
        if before is None or not before.pipe.running:
            await chunk_executor.run_segments(segments, after, batch.handled, pipe=pipe)
            return
        # Beside the batch before: a key whose segment there has not ended
        # starts here once it has (per-key order), the others at once.
        waiting = before.pipe.running
        free = [seg for seg in segments if seg.key not in waiting]
        jobs = [self._after_turn(before.pipe, seg, batch) for seg in segments if seg.key in waiting]
        if free:
            jobs.append(chunk_executor.run_segments(free, after, batch.handled, pipe=pipe))
        else:
            pipe.drain()
        await _all(jobs)

    async def _after_turn(self, before: Pipe, seg: Segment, batch: _Batch) -> None:
        """Run ``seg`` once the batch before ended its segment of the key; or
        route it to the retry topic when that one failed Retryable and
        quarantined the key (decided now, not when the batch was planned)."""
        await before.wait_for(seg.key)
        failed_at = self._failing.get(seg.key)
        if failed_at is None:
            await self.chunk_executor.run_segments(
                [seg], self._after_main_segment, batch.handled, pipe=batch.pipe
            )
            return
        for run in seg.runs:
            self.stats.routed += sum(
                1 if isinstance(entry, Record) else len(entry.sources) for entry in run.entries
            )
            self.outbox.write_retry_run(run, failed_at, ROUTED_ERROR)
        batch.pipe.end(seg.key)

    def _route_quarantined(self, groups: Groups) -> None:
        """Take the items of quarantined keys out of ``groups`` and send them
        to the retry topic, unreduced and in order (design §6); the same for
        keys an operator paused, as held work (design §14).

        Items already in the retry topic (redelivered after a crash, at or
        below the key's routed main offset) are done: routed once, they are
        never routed or run again, also when the key's retry work has ended
        since (otherwise one message gets two outcomes). Main offsets grow
        along a key's runs, so those items are a prefix of them.
        """
        quarantined = self.retry.keys
        routed_through = self.retry.routed
        held = self.retry.held
        failing = self._failing
        for key in [
            key
            for key in groups
            if key in quarantined or key in routed_through or key in held or key in failing
        ]:
            if key in failing and key not in held:
                # Quarantined by a batch in flight, not stored yet.
                runs = self._drop_routed(groups.pop(key), routed_through.get(key, -1))
                self.stats.routed += sum(len(run.entries) for run in runs)
                for run in runs:
                    self.outbox.write_retry_run(run, failing[key], ROUTED_ERROR)
                continue
            state = quarantined.get(key)
            if state is None and key in held:
                # Paused by an operator: its records wait in the retry topic, in order.
                runs = self._drop_routed(groups.pop(key), routed_through.get(key, -1))
                self.stats.routed += sum(len(run.entries) for run in runs)
                for run in runs:
                    self.outbox.write_retry_run(run, None, HELD_ERROR, held=True)
                continue
            if state is None:
                kept = self._drop_routed(groups[key], routed_through[key])
                if kept:
                    groups[key] = kept
                else:
                    del groups[key]
                continue
            runs = groups.pop(key)
            self.stats.routed += sum(len(run.entries) for run in runs)
            for run in self._drop_routed(runs, state.max_main_offset):
                self.outbox.write_retry_run(run, state.first_failed_at, ROUTED_ERROR)

    def _drop_routed(self, runs: list[Run], through: int) -> list[Run]:
        """``runs`` without their items at or below main offset ``through`` (a
        prefix, offsets growing within a key), which are marked done."""
        for index, run in enumerate(runs):
            count = 0
            for entry in run.entries:
                top = entry.offset if isinstance(entry, Record) else max(entry.main_offsets)
                if top > through:
                    break
                count += 1
            if count == 0:
                return runs[index:]
            self.outbox.mark(run[:count])
            if count < len(run):
                return [run[count:], *runs[index + 1 :]]
        return []

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
        pending = self.retry.pending_count + self.outbox.unflushed_work
        if pending + len(work) > self.config.max_pending_retry:
            logger.error(
                "retry backlog full", extra={**fields, "records": records, "pending": pending}
            )
            self.outbox.dead_letter_items(work, ReasonCode.RETRY_BACKLOG_FULL, error)
            return
        self._failing[key] = self.outbox.write_retry(work, None, error)
        self.stats.quarantined_keys += 1
        self.stats.retry_written += records
        logger.warning("key quarantined after retryable failure", extra=fields)


async def _all(jobs: Sequence[Awaitable[None]]) -> None:
    """Run ``jobs`` to their ends; then raise the first failure that is not
    :class:`Abandon`, else :class:`Abandon` if one was abandoned. A job that
    fails otherwise (a bug) cancels the others at once; so does a
    cancellation of the caller."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        pending: set[asyncio.Future[None]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                exc = task.exception()
                if exc is not None and not isinstance(exc, Abandon):
                    raise exc
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    if any(task.exception() is not None for task in tasks):
        raise Abandon
