"""The consumer: topics, ownership, a worker per partition, shutdown (design §5-6, §14-15).

Takes each partition's lease (renewed every ``lease_ttl / 3``; the worker
stops once it is lost), runs one partition worker (:mod:`._partition`) per
owned partition, and offers the read-only partition view (:mod:`._view`).

::

    consumer = Consumer(ConsumerConfig(topic="orders", group="billing"), [handle_order], log)
    await consumer.run()        # until SIGINT/SIGTERM or consumer.stop()
    await consumer.drain()      # until every partition is caught up and no key is quarantined
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from .._errors import (
    ConfigError,
    ErrorClass,
    LogError,
    LogUnavailableError,
    PartitionCountMismatch,
    SetupError,
    UnknownPartitionError,
    WakuwakuError,
)
from ..logs import Lease, Log
from ._config import ConsumerConfig
from ._control import ControlReader
from ._handler import Handler
from ._ownership import ownership_for
from ._partition import PartitionWorker
from ._registry import check_and_note
from ._setup import setup_fault
from ._shared import LogHealth, raise_if_cancelled
from ._stats import ConsumerStats
from ._view import PartitionView

logger = logging.getLogger("wakuwaku.consumer")

_RELEASE_LIMIT = 5.0
"""Seconds a forced stop waits for each partition's lease release."""

R = TypeVar("R")


class Consumer:
    """Consumes the configured topics with one handler per event type.

    :param config: the :class:`ConsumerConfig`.
    :param handlers: the handlers, one per event type tag.
    :param log: the log to read from and write retry and dead-letter records to.
    :raises ConfigError: when two handlers are given for one type tag, or none.
    """

    def __init__(
        self,
        config: ConsumerConfig,
        handlers: Iterable[Handler[Any]],
        log: Log,
    ) -> None:
        self.config = config
        self.log = log
        by_tag: dict[str, Handler[Any]] = {}
        for handler in handlers:
            if not isinstance(handler, Handler):
                raise ConfigError(f"not a wakuwaku Handler: {handler!r}")
            tag = handler.event_type.tag
            if tag in by_tag:
                raise ConfigError(
                    f"two handlers for event type {tag!r}: {by_tag[tag]!r} and {handler!r}"
                )
            by_tag[tag] = handler
        if not by_tag:
            raise ConfigError("a Consumer needs at least one handler")
        self.handlers: Mapping[str, Handler[Any]] = by_tag
        self.stats = ConsumerStats()
        # Internal: other packages and tests read assignment()/partitions().
        self.workers: dict[tuple[str, int], PartitionWorker] = {}
        self._assignment: list[tuple[str, int]] = []
        self._stop = asyncio.Event()
        # Set by force_stop() (a second SIGINT/SIGTERM): the chunks still
        # running are cancelled without waiting for shutdown_timeout.
        self._forced = asyncio.Event()
        # The running partitions' supervisors (while run() runs), for what a
        # forced stop says it leaves undone.
        self._supervisors: dict[asyncio.Task[None], tuple[str, int]] = {}
        self._started = False
        self._ran = False
        # Set by a worker each time it reads to the end of its partition, so
        # that drain() notices idleness at once instead of on its next tick.
        self._caught_up = asyncio.Event()
        # Sync handlers' threads, made by run().
        self._thread_pool: ThreadPoolExecutor | None = None
        # Leases of ours, or assignments the log pushes (Kafka): _ownership.py.
        self._ownership = ownership_for(log, config)
        # One for all partitions: the first to reach the log after an outage
        # wakes the others' retries (design §7).
        self._health = LogHealth()
        # The group's operator commands (pauses, a key's retry-now or give-up).
        self._control = ControlReader(log, config)

    # ------------------------------------------------------------------ setup

    async def start(self) -> list[tuple[str, int]]:
        """Check the topics and create the retry and dead-letter topics (design §6).

        Each main topic's retry and dead-letter topics (derived or configured,
        :meth:`ConsumerConfig.group_topics`) are created with its partition
        count. Configured names are checked against, then noted in, the
        topic-names topic (:mod:`._registry`), where the operations tools
        find them.

        :returns: the (topic, partition) pairs this consumer will consume.
        :raises UnknownTopicError: when a main topic does not exist.
        :raises PartitionCountMismatch: when a retry or dead-letter topic exists
            with another partition count than its main topic.
        :raises UnknownPartitionError: when a configured partition does not exist.
        :raises SetupError: when the log refuses the credentials or a
            permission (a log that cannot be reached is waited for, logged
            as ``log call failed; retrying``, until it answers or
            :meth:`stop` is called).
        :raises ConfigError: when a configured name is a topic another
            consumer group or main topic noted in a role it may not share
            (:func:`check_and_note`).
        """
        counts = {}
        for topic in self.config.topics:
            info = await self._start_call("describe topic", partial(self.log.describe_topic, topic))
            counts[topic] = info.partitions
        await self._start_call("note topic names", partial(check_and_note, self.log, self.config))
        # Before any partition starts: a pause outlives a restart (design §14).
        await self._start_call("read control topic", self._control.load)
        assignment: list[tuple[str, int]] = []
        for topic, partitions in counts.items():
            names = self.config.group_topics(topic)
            for extra in (names.retry, names.dead_letter):
                try:
                    await self._start_call(
                        "create topic",
                        partial(self.log.create_topic, extra, partitions, derived_from=topic),
                    )
                except PartitionCountMismatch as exc:
                    raise PartitionCountMismatch(extra, exc.existing, partitions) from None
            wanted = self.config.partitions
            if wanted is None:
                # Members that consume a whole topic balance it (leases:
                # _balance.py); one given partitions takes those, as
                # Kafka's assign() does.
                self._ownership.balance(topic, partitions)
            parts = range(partitions) if wanted is None else wanted
            for p in parts:
                if not 0 <= p < partitions:
                    raise UnknownPartitionError(topic, p, partitions)
                assignment.append((topic, p))
        self._assignment = assignment
        self._started = True
        return assignment

    async def _start_call(self, operation: str, call: Callable[[], Awaitable[R]]) -> R:
        """One log call of :meth:`start`: a log that cannot be reached is
        waited for on the retry schedule (logged at warning, like the
        workers' calls), so a consumer started during a broker restart
        starts once it is back; a refused credential or permission raises
        :class:`SetupError` at once; any other error is raised as it is.

        :raises LogUnavailableError: when :meth:`stop` was asked while waiting.
        """
        failures = 0
        while True:
            try:
                return await call()
            except LogUnavailableError as exc:
                fault = setup_fault(exc)
                if fault is not None:
                    logger.error(
                        "setup error; stopping the consumer",
                        extra={"operation": operation, "error": str(exc), "hint": fault.hint},
                    )
                    raise SetupError(fault.what, fault.hint, operation=operation) from exc
                if self._stop.is_set():
                    raise
                failures += 1
                delay = self.config.log_retry_delay(failures)
                logger.warning(
                    "log call failed; retrying",
                    extra={
                        "operation": operation,
                        "delay": delay,
                        "failures": failures,
                        "error_class": ErrorClass.TRANSIENT.value,
                        "error": str(exc),
                    },
                )
                await self._wait_or_stop(delay)

    # -------------------------------------------------------------------- run

    def stop(self) -> None:
        """Ask for a graceful stop: no new chunks, running chunks finish (design §14)."""
        self._stop.set()
        for worker in self.workers.values():
            worker.stop()

    def force_stop(self) -> None:
        """Stop now: as :meth:`stop`, and the chunks still running are cancelled
        at once instead of being given ``shutdown_timeout`` seconds (what a
        second SIGINT or SIGTERM does). A cancelled chunk is handled as at
        the shutdown deadline: its batch's offset is not stored past it
        (docs/engine.md, "Delivery modes and shutdown"); leases are released.
        """
        self._forced.set()
        self.stop()

    @property
    def forced(self) -> bool:
        """True once :meth:`force_stop` was called (or a second signal came)."""
        return self._forced.is_set()

    async def run(self, *, install_signal_handlers: bool = True) -> ConsumerStats:
        """Consume until :meth:`stop`, SIGINT or SIGTERM; returns the counters.

        A consumer runs once, like a closed Kafka consumer: make a new one to
        consume again (its workers, counters and stop request are spent).

        :param install_signal_handlers: install SIGINT/SIGTERM handlers that
            call :meth:`stop` (only possible in the main thread).
        :raises WakuwakuError: when this consumer has already run (its
            workers are spent: a second run would consume nothing).
        :raises SetupError: when one of its log or inbox calls met a fault no
            retry fixes (a missing table or topic, a refused credential); the
            other partitions stop gracefully first (design §7).
        :raises: what :meth:`start` raises.
        """
        if self._ran:
            raise WakuwakuError(
                f"this Consumer of group {self.config.group!r} has already run; "
                "create a new Consumer to consume again"
            )
        self._ran = True
        if not self._started:
            await self.start()
        installed = self._install_signals() if install_signal_handlers else []
        # max_concurrency keys of each partition may run a sync handler at
        # once, so no call waits for a thread behind another partition's
        # (asyncio's default pool, min(32, cpus + 4) threads, capped them
        # whatever the config said). Threads start only when used: at most
        # as many as ever ran at once.
        self._thread_pool = thread_pool = ThreadPoolExecutor(
            max_workers=self.config.max_concurrency * max(1, len(self._assignment)),
            thread_name_prefix=f"wakuwaku-{self.config.group}",
        )
        # The group's members are seen once before any partition is asked
        # for (members started together split the partitions at once).
        member = asyncio.create_task(self._ownership.maintain(self._stop), name="wakuwaku:members")
        self._supervisors = {
            asyncio.create_task(self._supervise(topic, p), name=f"wakuwaku:{topic}/{p}"): (topic, p)
            for topic, p in self._assignment
        }
        supervisors = list(self._supervisors)
        follower = asyncio.create_task(self._follow_control(), name="wakuwaku:control")
        try:
            # Supervisors end only at a stop; one that ends first failed loudly
            # (a partition must never die without a word).
            stopper = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait([stopper, *supervisors], return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not self._stop.is_set():
                self.stop()
            logger.info("consumer stopping", extra={"group": self.config.group})
            done, still = await self._until_stopped(supervisors)
            for task in still:
                task.cancel()
            if still:
                logger.warning(
                    "stop forced; cancelled running chunks"
                    if self.forced
                    else "shutdown deadline passed; cancelled running chunks",
                    extra={"partitions": len(still)},
                )
                await asyncio.gather(*still, return_exceptions=True)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            follower.cancel()
            member.cancel()
            for task in supervisors:
                task.cancel()
            await asyncio.gather(follower, member, *supervisors, return_exceptions=True)
            self._supervisors = {}
            # After the partitions were let go: the others' shares grow now.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ownership.leave(), _RELEASE_LIMIT)
            loop = asyncio.get_running_loop()
            for sig in installed:
                loop.remove_signal_handler(sig)
            # Never blocks the loop: a chunk cancelled at the shutdown deadline
            # may leave its thread running until the handler returns.
            thread_pool.shutdown(wait=False, cancel_futures=True)
        return self.stats

    async def _until_stopped(
        self, supervisors: list[asyncio.Task[None]]
    ) -> tuple[set[asyncio.Task[None]], set[asyncio.Task[None]]]:
        """Wait for ``supervisors`` to end, at most ``shutdown_timeout`` seconds
        and not past :meth:`force_stop`; returns ``(done, still running)``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_timeout
        pending = set(supervisors)
        forced = asyncio.ensure_future(self._forced.wait())
        try:
            while pending and not forced.done() and (left := deadline - loop.time()) > 0:
                await asyncio.wait(
                    pending | {forced}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                pending = {t for t in pending if not t.done()}
        finally:
            forced.cancel()
        return set(supervisors) - pending, pending

    async def drain(self, *, install_signal_handlers: bool = False) -> ConsumerStats:
        """Consume until every partition has read to its end and no key is quarantined.

        For batch jobs, tests and the demo. Records appended while draining
        are consumed too when they arrive before the consumer goes idle.
        Idleness is checked each time a partition reads to its end, and at
        least every ``poll_interval`` seconds on the configured clock; the
        call returns as soon as the consumer has stopped.

        Several members of a group may drain together (the partitions are
        shared between them): each returns once the partitions it owns are
        read to their end with no key quarantined, and every other one is
        owned by another live member and committed by the group to its
        end. A partition nobody owns is waited for (its retry work may be
        pending); a quarantined key of another member's partition is that
        member's drain to wait for.
        """
        runner = asyncio.create_task(self.run(install_signal_handlers=install_signal_handlers))
        try:
            while not runner.done():
                self._caught_up.clear()
                if await self._drained():
                    self.stop()
                    break
                await self._until_progress(runner)
            return await runner
        finally:
            if not runner.done():
                self.stop()
                await runner

    async def at_end(self) -> bool:
        """True when every owned partition's position is its log's end offset now.

        :meth:`idle` trusts each partition's last poll; records appended since
        that poll are not behind it. A caller that appended records (or was
        told someone did) and wants them consumed checks ``idle() and await
        at_end()``, as :meth:`drain` does. A log that cannot answer counts as
        not at the end.
        """
        return await self._at_end()

    async def _at_end(self, only: set[tuple[str, int]] | None = None) -> bool:
        """True when every partition's position (of ``only``, when given) is
        its log's end offset.

        A partition flags itself caught up when a poll finds nothing; records
        appended since (a handler of another partition publishing, say) are
        not behind that flag, so :meth:`drain` checks the log before stopping.
        """
        workers = {
            where: worker for where, worker in self.workers.items() if only is None or where in only
        }
        ends: dict[str, dict[int, int]] = {}
        try:
            for topic, _ in workers:
                if topic not in ends:
                    ends[topic] = await self.log.end_offsets(topic)
        except Exception:  # noqa: BLE001 - cannot tell: not at the end; the next check asks again
            return False
        return all(
            worker.position >= ends[topic].get(partition, 0)
            for (topic, partition), worker in workers.items()
        )

    async def _drained(self) -> bool:
        """What :meth:`drain` waits for (see there)."""
        if self.idle():
            return await self._at_end()
        if not self._started:
            return False
        owned = {where for where, worker in self.workers.items() if not worker.ended}
        if not all(
            w.started and w.caught_up and not w.retry.keys
            for where, w in self.workers.items()
            if where in owned
        ):
            return False
        others: dict[str, list[int]] = {}
        for topic, partition in self._assignment:
            if (topic, partition) not in owned:
                others.setdefault(topic, []).append(partition)
        if not others or not await self._at_end(owned):
            return False
        return await self._consumed_elsewhere(others)

    async def _consumed_elsewhere(self, others: dict[str, list[int]]) -> bool:
        """True when each of ``others`` (topic -> partitions) is owned by
        another live member and committed by the group to its end."""
        group, me = self.config.group, self.config.member_id
        try:
            for topic, partitions in others.items():
                # A live lease expires after this moment (Iggy, which shows no
                # expiry, gives the time of the answer).
                asked = time.time()
                owners = await self.log.partition_owners(group, topic)
                if owners is None:
                    return False  # cannot tell who owns them: wait to own them
                ends = await self.log.end_offsets(topic)
                for partition in partitions:
                    lease = owners.get(partition)
                    if lease is None or lease.member == me or lease.expires_at < asked:
                        return False
                    committed = await self.log.committed(group, topic, partition)
                    if (committed or 0) < ends.get(partition, 0):
                        return False
        except Exception:  # noqa: BLE001 - cannot tell: not drained; the next check asks again
            return False
        return True

    async def _until_progress(self, runner: asyncio.Task[ConsumerStats]) -> None:
        """Wait until a partition catches up, ``runner`` ends, or ``poll_interval`` passes."""
        caught_up = asyncio.ensure_future(self._caught_up.wait())
        tick = asyncio.ensure_future(self.config.clock.sleep(self.config.poll_interval))
        try:
            await asyncio.wait({runner, caught_up, tick}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            caught_up.cancel()
            tick.cancel()

    def idle(self) -> bool:
        """True when every partition is owned, has read to its end, and has no
        quarantined key (what :meth:`drain` waits for)."""
        if not self._started or len(self.workers) < len(self._assignment):
            return False
        return all(w.started and w.caught_up and not w.retry.keys for w in self.workers.values())

    # ------------------------------------------------------------------- view

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this consumer has taken a lease on and
        runs a partition worker for, sorted (like a Kafka consumer's
        ``assignment()``). Empty before :meth:`run`. A partition whose lease
        was lost stays listed, with its worker's last state, until the lease
        is taken again; after :meth:`run` returned, every partition it owned
        is listed with its last state."""
        return sorted(self.workers)

    def partitions(self) -> list[PartitionView]:
        """A frozen snapshot of every partition this consumer owns, sorted by
        (topic, partition): position, retry backlog, quarantined keys.

        Safe to call from another thread (the metrics server's): a snapshot
        taken while the event loop changes the state may be a moment old,
        never broken; :class:`RuntimeError` from a dict changing size while
        read is the caller's to retry.
        """
        owned = sorted(list(self.workers.items()), key=lambda item: item[0])
        return [worker.view() for _, worker in owned]

    def partition(self, topic: str, partition: int) -> PartitionView | None:
        """The snapshot of one owned partition (``topic`` as :meth:`assignment`
        names it: with the namespace prefix), or None when this consumer does
        not own it now."""
        worker = self.workers.get((topic, partition))
        return None if worker is None else worker.view()

    async def lag(self) -> dict[tuple[str, int], int]:
        """Records after each owned partition's position, from the log's end
        offsets (one ``end_offsets`` call per topic).

        :raises LogError: what the log raises.
        """
        views = [v for v in self.partitions() if v.started]
        ends: dict[str, dict[int, int]] = {}
        for view in views:
            if view.topic not in ends:
                ends[view.topic] = await self.log.end_offsets(view.topic)
        return {(v.topic, v.partition): v.lag(ends[v.topic].get(v.partition, 0)) for v in views}

    def _install_signals(self) -> list[signal.Signals]:
        if threading.current_thread() is not threading.main_thread():
            return []
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
        return installed

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self._stop.is_set():
            logger.info(
                "signal received; stopping gracefully (a second signal stops at once)",
                extra={"signal": sig.name, "shutdown_timeout": self.config.shutdown_timeout},
            )
            self.stop()
            return
        running = sorted(
            f"{topic}/{p}" for task, (topic, p) in self._supervisors.items() if not task.done()
        )
        logger.warning(
            "second signal; stopping now: cancelling the chunks still running "
            "(as at the shutdown deadline)",
            extra={"signal": sig.name, "draining": running},
        )
        # A third signal is not ours: Python's default (KeyboardInterrupt) ends it.
        loop = asyncio.get_running_loop()
        for other in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(other)
        self.force_stop()

    # -------------------------------------------------------------- ownership

    async def _supervise(self, topic: str, partition: int) -> None:
        """Own the partition while alive: take it, run a worker while it is ours (design §15)."""
        clock = self.config.clock
        ttl = self.config.lease_ttl
        # waiting: a take is logged (the partition was not ours, or was lost);
        # said_owned: "owned by another member" was said in this wait.
        waiting = said_owned = False
        while not self._stop.is_set():
            sent = clock.monotonic()
            lease = await self._ownership.acquire(topic, partition)
            if lease is None:
                waiting = True
                # An unreachable log was logged by acquire: nobody else owns it.
                if not said_owned and (topic, partition) not in self._ownership.unreachable:
                    # Once per wait: a dead member's lease runs out by itself.
                    logger.info(
                        "partition left to another member: this one holds its share"
                        if (topic, partition) in self._ownership.deferred
                        else "partition owned by another member; waiting for its lease",
                        extra={"topic": topic, "partition": partition, "lease_ttl": ttl},
                    )
                    said_owned = True
                await self._until_stop(self._ownership.wait(topic, partition))
                continue
            if waiting:
                logger.info(
                    "partition lease taken",
                    extra={"topic": topic, "partition": partition, "generation": lease.generation},
                )
                waiting = said_owned = False
            worker = PartitionWorker(
                log=self.log,
                config=self.config,
                topic=topic,
                partition=partition,
                handlers=self.handlers,
                stats=self.stats,
                lease=lease,
                lease_deadline=sent + ttl,
                on_caught_up=self._caught_up.set,
                health=self._health,
                thread_pool=self._thread_pool,
                control=self._control,
            )
            self.workers[(topic, partition)] = worker
            if self._stop.is_set():
                worker.stop()
            try:
                lost = await self._run_worker(worker, lease)
            except SetupError:
                # Let the partition go, as a graceful stop does: the fixed
                # consumer, started again, must not wait out lease_ttl.
                await self._ownership.release(lease)
                raise
            except asyncio.CancelledError:
                if self._stop.is_set():
                    # Stopped on purpose (forced, or past shutdown_timeout):
                    # let the partition go too, or the restarted member waits
                    # out lease_ttl (bounded: a log that does not answer lets
                    # the lease lapse by itself).
                    with contextlib.suppress(TimeoutError, LogError):
                        await asyncio.wait_for(self._ownership.release(lease), _RELEASE_LIMIT)
                raise
            if self._stop.is_set():
                await self._ownership.release(lease)
                return
            if (topic, partition) in self._ownership.handed_over:
                # Given back for balance: the worker stored what was done; the
                # partition is no longer this member's (a lost lease's worker
                # stays listed until taken again).
                await self._ownership.release(lease)
                self._ownership.handed_over.discard((topic, partition))
                self.workers.pop((topic, partition), None)
                waiting = True
            elif lost:
                # Revoked: the worker stored what was done; let the partition go now.
                await self._ownership.release(lease)
                waiting = True  # taking it back is logged
            await clock.sleep(0)

    async def _run_worker(self, worker: PartitionWorker, lease: Lease) -> bool:
        """Run ``worker`` beside its lease renewer and its watchdog until it
        ends; True when the renewer found the lease lost.

        A crash is logged and the worker is started again by the caller after
        the first retry delay (a bug must not stall a partition silently); a
        stall the watchdog found is started again at once.

        :raises SetupError: what the worker raised (the consumer stops).
        :raises BaseException: SystemExit, KeyboardInterrupt and the like
            (the consumer stops and run() raises it).
        """
        topic, partition = worker.topic, worker.partition
        renewer = asyncio.create_task(self._ownership.watch(lease, worker))
        running = asyncio.ensure_future(worker.run())
        watchdog = asyncio.create_task(self._watchdog(worker, running))
        try:
            await running
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this supervisor is being cancelled for real
            if not worker.stalled:
                # A driver leaked a CancelledError nobody asked for: a crash.
                logger.error(
                    "partition worker ended by a stray CancelledError; restarting it",
                    extra={"topic": topic, "partition": partition},
                )
                await self._wait_or_stop(self.config.delay(1))
        except SetupError:
            # No retry fixes it (design §7): the consumer stops, run() raises it.
            self.stop()
            raise
        except Exception:
            logger.exception(
                "partition worker crashed; restarting it",
                extra={"topic": topic, "partition": partition},
            )
            await self._wait_or_stop(self.config.delay(1))
        except BaseException as exc:
            logger.critical(
                "partition worker ended by %s; stopping the consumer",
                type(exc).__name__,
                extra={"topic": topic, "partition": partition},
            )
            self.stop()
            raise
        finally:
            lost = renewer.done() and not renewer.cancelled()
            # The renewer stops on this flag, not only on its cancel: a log
            # client can swallow a cancel delivered during a call (redis-py
            # was seen to), and a renewer that went on would keep the lease
            # of a worker that ended, and this gather would never return.
            worker.ended = True
            renewer.cancel()
            watchdog.cancel()
            await asyncio.gather(renewer, watchdog, return_exceptions=True)
        return lost

    async def _watchdog(self, worker: PartitionWorker, running: asyncio.Future[None]) -> None:
        """Restart ``worker`` when its partition stalls in silence (design §7).

        Every ``min(stall_timeout / 4, 5)`` seconds: when the worker has made
        no progress (:attr:`PartitionServices.progress_at
        <wakuwaku.engine._shared.PartitionServices.progress_at>`) for
        ``stall_timeout`` seconds, the log is asked for the partition's end
        offset (bounded by 10 s). When it answers and the partition has
        records to read (or the worker never finished restoring, or keys
        wait in its retry partition) and no chunk is retrying a Transient
        failure in place (a pause the handler asked for), ``partition stalled; restarting its
        worker`` is logged at error with the lag and for how long, counted
        in :attr:`ConsumerStats.stalls`, and the worker is cancelled: the
        supervisor starts a new one from the stored offsets and retry state.
        A log that does not answer is an outage, which the worker's own
        retried calls report; no restart helps it.

        A stall inside a handler call (a call running longer than
        ``stall_timeout``) is logged at error once, ``partition stalled in
        a handler call; not restarted``, and counted, but the worker is left
        running: a sync handler's thread cannot be stopped, so a new worker
        would run the same key's chunk beside it, twice at once and out of
        order (design §5.4); an async one might be mid-effect.
        """
        limit = self.config.stall_timeout
        check = min(limit / 4, 5.0)
        services = worker.services
        reported = -1.0  # the progress_at of the last stall reported in a handler call
        while not running.done():
            # Real time, not the configured clock: see PartitionServices.progress_at.
            await asyncio.sleep(check)
            stalled_for = time.monotonic() - services.progress_at
            if services.stopping or services.paused or stalled_for < limit:
                continue
            try:
                ends = await asyncio.wait_for(self.log.end_offsets(worker.topic), 10.0)
            except Exception:  # noqa: BLE001 - the log does not answer: an outage
                continue
            lag = ends.get(worker.partition, 0) - worker.position
            if lag <= 0 and worker.started and not worker.retry.keys:
                continue
            fields = {
                "topic": worker.topic,
                "partition": worker.partition,
                "operations": sorted(services.calling),
                "lag": lag,
                "stalled_for": round(stalled_for, 3),
                "position": worker.position,
                "stall_timeout": limit,
            }
            if services.in_handler:
                if reported != services.progress_at:
                    reported = services.progress_at
                    self.stats.stalls += 1
                    logger.error(
                        "partition stalled in a handler call; not restarted",
                        extra={**fields, "calls": services.in_handler},
                    )
                continue
            logger.error("partition stalled; restarting its worker", extra=fields)
            self.stats.stalls += 1
            worker.stalled = True
            running.cancel()
            return

    async def _follow_control(self) -> None:
        """Read new operator commands every ``poll_interval`` until stopped (design §14)."""
        task = asyncio.current_task()
        while not self._stop.is_set():
            raise_if_cancelled()
            try:
                await self._wait_or_stop(self.config.poll_interval)
                if not self._stop.is_set():
                    await self._control.refresh()
            except asyncio.CancelledError:
                if task is None or task.cancelling():
                    raise
                # A driver leaked a CancelledError nobody asked for: commands
                # must keep coming, so the loop goes on (logged).
                logger.warning(
                    "stray CancelledError while reading the control topic; going on",
                    extra={"group": self.config.group},
                )

    async def _wait_or_stop(self, seconds: float) -> None:
        await self._until_stop(self.config.clock.sleep(seconds))

    async def _until_stop(self, waiting: Coroutine[Any, Any, None]) -> None:
        """Await ``waiting`` until it ends or :meth:`stop` is called."""
        stopper = asyncio.ensure_future(self._stop.wait())
        sleeper = asyncio.ensure_future(waiting)
        try:
            await asyncio.wait({stopper, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            sleeper.cancel()
