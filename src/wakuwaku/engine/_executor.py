"""The executor: runs planned segments through their handlers, the hot path (design §5.4-5.8).

Owns the handlers of one partition and everything about calling them: keys
run concurrently (up to ``max_concurrency`` *lanes* sharing one queue of
segments), each key's chunks strictly in order; the classification of what
a handler raised; a Transient failure retried in place with the partition's
gate closed; an Unrecoverable chunk dead-lettered; a Retryable failure
stopping its key (the caller's ``after`` decides what becomes of the rest).
Also the inbox lookup (:meth:`ChunkExecutor.inbox_filter`, design §9) that the
loop and the attempts call on decoded records, to drop those a handler's
inbox already holds before they are planned into runs.

May call: :mod:`._shared` (gate, stop, lease deadline, retrying log call,
counters) and :mod:`._outbox` (dead letters, done offsets). Called by the
partition loop (:mod:`._partition`) and the attempts (:mod:`._attempts`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor as ThreadPool
from functools import partial
from operator import attrgetter, length_hint
from typing import Any

from .._errors import ErrorClass, HandleError
from .._events import Algebra
from .._records import ReasonCode
from .._sanitize import sanitize
from ..tracing import chunk_span
from ._context import ChunkContext, _current
from ._handler import Handler
from ._outbox import Outbox
from ._plan import Item, Run, Segment
from ._shared import Abandon, PartitionServices, logger

_count = attrgetter("count")


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

#: Called with each segment that stopped on a Retryable failure (main batch)
#: or with every segment (an attempt round), and its outcome.
After = Callable[[Segment, SegmentOutcome], Awaitable[None]]


class Pipe:
    """What a main batch's lanes tell the partition loop while another batch
    of the partition may run beside theirs (see ``docs/engine.md``,
    "Pipelining across batches").

    :ivar running: the keys whose segment of this batch has not ended (filled
        by the partition when it plans the batch); a value is the future a
        later batch's segment of that key waits on (None until one waits).
        A lane takes the key out when the segment ends; the waits of
        segments that never end (a stop, a cancellation) fail with
        :class:`Abandon` (:meth:`release`).
    :ivar drained: done once a lane of the batch found no segment left to
        start while others still run (or the batch ended): its last keys run,
        and a lane is free.
    """

    __slots__ = ("drained", "running")

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Future[None] | None] = {}
        self.drained: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def end(self, key: str) -> None:
        """The batch's segment of ``key`` ended: its waiter goes on."""
        waiter = self.running.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def drain(self, _: object = None) -> None:
        if not self.drained.done():
            self.drained.set_result(None)

    def lane_ended(self, _: object = None) -> None:
        """A lane ended (no segment was left to start): the batch is drained
        if other segments still run (when none does, the batch ends: no one
        need wake for it)."""
        if self.running:
            self.drain()

    async def wait_for(self, key: str) -> None:
        """Return once this batch's segment of ``key`` ended (at once when it
        has none, or it ended already).

        :raises Abandon: when it never will (the batch stopped or failed).
        """
        running = self.running
        if key not in running:
            return
        waiter = running[key]
        if waiter is None:
            waiter = running[key] = asyncio.get_running_loop().create_future()
        await waiter

    def release(self) -> None:
        """The batch ended: fail the waits of segments that never ended."""
        for waiter in self.running.values():
            if waiter is not None and not waiter.done():
                waiter.set_exception(Abandon())
        self.running.clear()
        self.drain()


def _ignore(_: str) -> None:
    pass


class ChunkExecutor:
    """Calls the handlers of one partition on planned segments.

    :param services: the partition's shared services.
    :param outbox: where dead letters go.
    :param handlers: handler per type tag.
    :param pool: the thread pool sync handlers run on (None: asyncio's
        default one).
    """

    def __init__(
        self,
        services: PartitionServices,
        outbox: Outbox,
        handlers: Mapping[str, Handler[Any]],
        pool: ThreadPool | None = None,
    ) -> None:
        self.services = services
        self.outbox = outbox
        self.handlers = handlers
        self._pool = pool
        self.has_inbox = any(h.inbox is not None for h in handlers.values())
        self.reduces = any(h.event_type.algebra is not Algebra.PLAIN for h in handlers.values())
        # Lanes left of the partition's max_concurrency: two main batches may
        # run at once (a pipeline), their lanes together bounded by it.
        self.free_lanes = services.config.max_concurrency
        self._lane_freed: asyncio.Future[None] | None = None

    async def run_segments(
        self,
        segments: Sequence[Segment],
        after: After,
        handled: list[Run],
        attempts: Mapping[str, int] | None = None,
        pipe: Pipe | None = None,
    ) -> None:
        """Run segments, keys concurrently (up to ``max_concurrency`` lanes
        sharing one queue) and each key's chunks in order (design §5.4).

        ``after`` sees each outcome of a retry attempt (``attempts`` given),
        and each main-batch outcome that stopped on a Retryable failure.
        ``handled`` gets every chunk whose outcome is final (it succeeded,
        or was dead-lettered as Unrecoverable), in order per key.
        ``pipe``: a main batch that may run beside another one (see
        :class:`Pipe`); the lanes of both share ``max_concurrency``.

        :raises Abandon: when a stop or a lost lease ended a lane early.
        """
        pending = iter(segments)
        width = max(1, min(len(segments), self.services.config.max_concurrency))
        if width == 1:
            await self._free_lane()
            self.free_lanes -= 1
            try:
                finished = [await self._lane(pending, after, handled, attempts, pipe)]
            finally:
                self._lane_ended()
        else:
            finished = await self._spread(pending, width, after, handled, attempts, pipe)
        if not all(finished):
            raise Abandon

    async def _free_lane(self) -> None:
        """Return once a lane may start (another batch's lanes may hold all)."""
        while self.free_lanes <= 0:
            if self._lane_freed is None:
                self._lane_freed = asyncio.get_running_loop().create_future()
            await self._lane_freed

    def _lane_ended(self, _: object = None) -> None:
        self.free_lanes += 1
        freed = self._lane_freed
        if freed is not None:
            self._lane_freed = None
            if not freed.done():
                freed.set_result(None)

    def _start_lane(self, lane: Awaitable[bool], pipe: Pipe | None) -> asyncio.Future[bool]:
        self.free_lanes -= 1
        task = asyncio.ensure_future(lane)
        task.add_done_callback(self._lane_ended)
        if pipe is not None:
            # A lane ends when no segment is left to start (or it was abandoned).
            task.add_done_callback(pipe.lane_ended)
        return task

    async def _spread(
        self,
        pending: Iterator[Segment],
        width: int,
        after: After,
        handled: list[Run],
        attempts: Mapping[str, int] | None,
        pipe: Pipe | None,
    ) -> list[bool]:
        """Run up to ``width`` lanes on ``pending``, starting one more each
        time the running ones all wait while segments are left: handlers that
        never wait are run by one lane, without a task per idle lane. Lanes
        start only while the partition has some free (:attr:`free_lanes`)."""
        await self._free_lane()
        lanes = [self._start_lane(self._lane(pending, after, handled, attempts, pipe), pipe)]
        try:
            while len(lanes) < width:
                await asyncio.sleep(0)  # the lanes run until they wait
                if not length_hint(pending) or all(lane.done() for lane in lanes):
                    break
                if self.free_lanes <= 0:
                    await self._free_lane()
                    continue
                lanes.append(
                    self._start_lane(self._lane(pending, after, handled, attempts, pipe), pipe)
                )
            await asyncio.wait(lanes, return_when=asyncio.FIRST_EXCEPTION)
            for lane in lanes:
                if lane.done() and not lane.cancelled() and lane.exception() is not None:
                    raise lane.exception()  # type: ignore[misc]
        except BaseException:
            # A lane that fails (a bug, not a handler failure: those are
            # classified) or our own cancellation ends every sibling: the
            # partition restarts from its stored offset, and a chunk still
            # running here would then run twice at once.
            for lane in lanes:
                lane.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
            raise
        return [lane.result() for lane in lanes]

    async def _lane(
        self,
        pending: Iterator[Segment],
        after: After,
        handled: list[Run],
        attempts: Mapping[str, int] | None,
        pipe: Pipe | None = None,
    ) -> bool:
        """One lane: run segments taken from ``pending`` until none is left.

        A segment's chunks run in order; a Retryable failure stops the segment
        (its outcome keeps the rest), an Unrecoverable one dead-letters the
        chunk and the segment goes on. Returns False when abandoned. With a
        ``pipe``, each segment's end is noted there (see :class:`Pipe`).
        """
        services = self.services
        stats, handlers, gate = services.stats, self.handlers, services.gate
        topic, partition = services.topic, services.partition
        set_context, reset_context, perf_counter = _current.set, _current.reset, time.perf_counter
        monotonic, real_now = services.clock.monotonic, time.monotonic
        # Main-topic items stand for one record each unless reduction merged them.
        single = attempts is None and not self.reduces
        ended = _ignore if pipe is None else pipe.end
        # Counted here and added to the shared stats when the lane ends.
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
                    # goes through __call__ (a pool thread).
                    invoke = handler.handle if handler.is_async else self._sync_call(handler)
                    size = handler.max_batch
                    count = len(run.events)  # not len(run): a Python-level __len__
                    for start in range(0, count, size):
                        chunk = run if count <= size else run[start : start + size]
                        # A chunk starting is the partition's progress (the watchdog
                        # restarts a worker that makes none: design §7).
                        services.progress_at = real_now()
                        if (
                            services.stopping
                            or not gate.is_open
                            or monotonic() >= services.lease_deadline
                        ):
                            await services.through_gate()
                        # The handler call, as _call makes it, inline.
                        span = chunk_span(topic, partition, key, tag, chunk, attempt)
                        token = set_context(
                            ChunkContext(topic, partition, key, tag, chunk, attempt)
                        )
                        started = perf_counter()
                        failure = None
                        services.in_handler += 1
                        try:
                            called = invoke(chunk.events.copy())
                            if called is not None:
                                await called
                            calls += 1
                        except BaseException as exc:  # noqa: BLE001 - see _failure
                            failure = self._failure(exc, handler, key, chunk)
                        finally:
                            services.in_handler -= 1
                            seconds += perf_counter() - started
                            reset_context(token)
                            span.end(failure)
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
                ended(key)
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
        (design §5.5, §5.6); True when the segment stops.

        A Transient failure is retried in place first; a chunk that then
        succeeds goes to ``handled`` and the segment goes on.
        """
        services = self.services
        chunk = run[start : start + handler.max_batch]
        if failure[0] is ErrorClass.TRANSIENT:
            again = await self._retry_in_place(handler, seg.key, chunk, attempt, failure)
            if again is None:
                handled.append(chunk)
                services.stats.handled += sum(map(_count, chunk))
                return False
            failure = again
        error_class, exc = failure
        services.stats.failed_by_class[error_class.value] += 1
        if error_class is ErrorClass.UNRECOVERABLE:
            error = sanitize(exc, services.config.error_text_limit)
            logger.error(
                "dropping chunk after unrecoverable handler failure",
                extra={
                    **services.fields,
                    "key": seg.key,
                    "type": handler.event_type.tag,
                    "offsets": [o for i in chunk for o in i.main_offsets],
                    "error_class": error_class.value,
                    "error": error,
                },
            )
            self.outbox.dead_letter_items(chunk, ReasonCode.UNRECOVERABLE, error)
            # Its outcome is final, as a success's: a stop after it resolves
            # the key through it (an attempt's markers), or a restart runs
            # it again after its dead letter.
            handled.append(chunk)
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
        forever, with the partition's gate closed (design §5.6)."""
        services = self.services
        services.gate.close()
        services.paused += 1
        try:
            failures = 1
            while True:
                services.stats.transient_pauses += 1
                services.stats.failed_by_class[ErrorClass.TRANSIENT.value] += 1
                delay = services.config.retry_delay(failures)
                logger.warning(
                    "transient failure; retrying chunk in place",
                    extra={
                        **services.fields,
                        "key": key,
                        "type": handler.event_type.tag,
                        "offsets": [o for i in chunk for o in i.main_offsets],
                        "error_class": ErrorClass.TRANSIENT.value,
                        "delay": delay,
                        "failures": failures,
                        "error": sanitize(failure[1], services.config.error_text_limit),
                    },
                )
                await services.sleep(delay)
                again = await self._call(handler, key, chunk, attempt)
                if again is None or again[0] is not ErrorClass.TRANSIENT:
                    return again
                failure = again
                failures += 1
        finally:
            services.paused -= 1
            services.gate.reopen()

    async def _call(
        self, handler: Handler[Any], key: str, chunk: Run, attempt: int
    ) -> tuple[ErrorClass, BaseException] | None:
        """Call the handler on one chunk; its failure, classified, or None.

        :meth:`_lane` makes the first call of every chunk with the same steps
        inline (a coroutine less per chunk); this is the call of a retry in place.
        """
        services = self.services
        topic, partition, tag = services.topic, services.partition, handler.event_type.tag
        span = chunk_span(topic, partition, key, tag, chunk, attempt)
        token = _current.set(ChunkContext(topic, partition, key, tag, chunk, attempt))
        started = time.perf_counter()
        failure = None
        try:
            invoke = handler.handle if handler.is_async else self._sync_call(handler)
            called = invoke(chunk.events.copy())
            if called is not None:
                await called
        except BaseException as exc:  # noqa: BLE001 - _failure lets through what is no failure
            failure = self._failure(exc, handler, key, chunk)
            return failure
        finally:
            services.stats.handler_seconds += time.perf_counter() - started
            _current.reset(token)
            span.end(failure)
        services.stats.handler_calls += 1
        return None

    def _sync_call(self, handler: Handler[Any]) -> Callable[[list[Any]], Awaitable[None]]:
        """A sync handler's call on the consumer's thread pool."""
        return partial(handler.__call__, thread_pool=self._pool)

    def _failure(
        self, exc: BaseException, handler: Handler[Any], key: str, chunk: Iterable[Item]
    ) -> tuple[ErrorClass, BaseException]:
        """The class of what a handler raised (design §5.8).

        :raises: ``exc`` itself when it is not a failure of the chunk: a
            cancellation of the running task (shutdown deadline), or
            ``KeyboardInterrupt``/``SystemExit`` (logged with where it came from).
        """
        fields = self.services.fields
        if isinstance(exc, HandleError):
            declared = getattr(exc, "error_class", None)
            if isinstance(declared, ErrorClass):
                return declared, exc
            # A HandleError subclass whose __init__ skipped HandleError's: it
            # says no class, so it is classified like any other exception.
            logger.warning(
                "HandleError without an error_class (its __init__ did not call "
                "HandleError.__init__); classifying it",
                extra={
                    **fields,
                    "key": key,
                    "type": handler.event_type.tag,
                    "error": sanitize(exc, self.services.config.error_text_limit),
                },
            )
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise exc  # we are being cancelled (shutdown deadline): let it through
        elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
            # Not a failure to classify: the process is asked to end. Say where.
            logger.error(
                "handler raised %s; the consumer stops without storing this batch's offset",
                type(exc).__name__,
                extra={
                    **fields,
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
        services = self.services
        try:
            error_class = ErrorClass(services.config.classify(exc))
        except Exception as bad:  # noqa: BLE001 - a broken classifier must not lose the chunk
            logger.error(
                "classifier failed; treating the exception as unrecoverable",
                extra={**services.fields, "key": key, "error": sanitize(bad)},
            )
            error_class = ErrorClass.UNRECOVERABLE
        logger.warning(
            "handler raised an exception that is not a HandleError; classified as %s",
            error_class.value,
            extra={
                **services.fields,
                "key": key,
                "type": handler.event_type.tag,
                "offsets": [o for i in chunk for o in i.main_offsets],
                "error_class": error_class.value,
                "error": sanitize(exc, services.config.error_text_limit),
            },
        )
        return error_class

    # ------------------------------------------------------------------- inbox

    async def inbox_filter(self, items: list[Item]) -> list[Item]:
        """Drop items whose every message id the handler's inbox already holds,
        or an earlier item of this batch already stands for (design §9).

        Runs before reduction, so a combined event never mixes applied and
        unapplied records, nor stands for one message twice (a dead letter
        replayed twice, a retry record given up twice around a crash).
        """
        handlers = self.handlers
        by_inbox: dict[int, tuple[Any, list[str]]] = {}
        # Per item, its ids when its handler has an inbox (asked once per item).
        item_ids: list[tuple[str, ...] | None] = []
        for item in items:
            inbox = handlers[item.tag].inbox
            if inbox is None:
                item_ids.append(None)
                continue
            ids = item.ids
            item_ids.append(ids)
            entry = by_inbox.get(id(inbox))
            if entry is None:
                entry = by_inbox[id(inbox)] = (inbox, [])
            entry[1].extend(ids)
        if not by_inbox:
            return items
        claimed: set[str] = set()
        for inbox, wanted in by_inbox.values():
            found: set[str] = await self.services.log_call(
                "inbox lookup", partial(inbox.claimed, wanted), service="inbox"
            )
            claimed |= found
        if not claimed:
            everything = [i for _, wanted in by_inbox.values() for i in wanted]
            if len(set(everything)) == len(everything):
                return items  # nothing applied yet, and no id stands twice in the batch
        kept = []
        for item, its_ids in zip(items, item_ids, strict=True):
            if its_ids is None:
                kept.append(item)
                continue
            if its_ids and all(i in claimed for i in its_ids):
                self.services.stats.inbox_skipped += len(item.sources)
                self.outbox.mark([item])
                continue
            claimed.update(its_ids)
            kept.append(item)
        return kept
