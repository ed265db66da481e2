"""What every part of one partition's consumption uses: the bottom layer of the partition worker.

Owns, for one (topic, partition) owned under one lease: the stop request, the
pause *gate* (closed while a chunk or a log call retries in place, design §5.6),
the lease deadline and fence (design §15), the retrying log call, the retry
partition's state (:class:`~wakuwaku.engine._retry.RetryState`) and the
consumer's shared counters.

May call: the log, the clock, :mod:`._retry`, :mod:`._setup`. Nothing here calls the
partition loop (:mod:`._partition`), the attempts (:mod:`._attempts`), the
executor (:mod:`._executor`) or the outbox (:mod:`._outbox`): they all call
down into it, so the five modules form layers, not a ring. Each layer may
call any layer below it, never one above::

    _partition  (the loop: poll, plan, route, quarantine, store)
    _attempts   (retry attempt rounds; returns the markers the loop stores)
    _executor   (handler calls per key: the hot loop)
    _outbox     (buffered dead-letter and retry writes, the fenced store of them and the offsets)
    _shared     (this module)

Beside the layers, used by any of them: :mod:`._plan` (pure planning, no
I/O), :mod:`._retry` (retry-topic records and state), :mod:`._config`,
:mod:`._handler`, :mod:`._context`, :mod:`._stats`. Above them all:
:mod:`._consumer` (ownership, one worker per partition) and :mod:`._view`
(the read-only partition view).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

from .._errors import ErrorClass, FencedError, SetupError
from .._sanitize import sanitize
from ..logs import Lease, Log
from ._config import ConsumerConfig
from ._retry import RetryState, WrittenCache
from ._setup import SetupFault, setup_fault
from ._stats import ConsumerStats

logger = logging.getLogger("wakuwaku.consumer")

R = TypeVar("R")


def raise_if_cancelled() -> None:
    """Raise :class:`asyncio.CancelledError` when the current task was
    cancelled and the cancel did not surface: a log client swallowed it
    (redis-py and nats-py were seen to, cancelled inside a call).

    For loops that call the log until stopped: without it such a loop went
    on for ever, and a cancelled ``run()`` never returned.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class Abandon(Exception):
    """The partition task stops without finishing its batch (shutdown or lost lease)."""


class LogHealth:
    """Told by every partition of a consumer when the log answers again
    after failed calls, so that the others retry at once (design §7).

    A partition whose call failed during an outage waits its retry delay
    (up to the schedule's last, 16 s by default) before it asks again; the
    first partition whose call succeeds after the server came back wakes
    the ones still waiting instead of leaving them silent for the rest of
    their delay (a NATS restart: "reconnected", then nothing for 16 s).
    """

    def __init__(self) -> None:
        self._answered = asyncio.Event()
        self.waiting = 0

    def answered(self) -> None:
        """The log answered a call that had failed before: wake the waiters."""
        answered, self._answered = self._answered, asyncio.Event()
        answered.set()

    async def wait(self) -> None:
        """Return at the next :meth:`answered`."""
        self.waiting += 1
        try:
            await self._answered.wait()
        finally:
            self.waiting -= 1


class Gate:
    """Open unless some chunk or log call of the partition is retrying in place (design §5.6).

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


class PartitionServices:
    """The shared state and services of one partition's consumption.

    :param log: the log.
    :param config: the consumer's configuration.
    :param topic: the (qualified) main topic.
    :param partition: the partition.
    :param stats: counters shared by the consumer's partition workers.
    :param lease: the partition's lease: every write and commit carries it
        as its fence; None without a lease (no fence).
    :param lease_deadline: when the lease runs out unless renewed (the
        clock's monotonic seconds); no chunk starts past it.
    :param health: shared by the consumer's partitions (:class:`LogHealth`);
        None: this partition's own.

    :ivar stopping: true once :meth:`stop` was called (a plain attribute:
        it is read before every chunk).
    :ivar lease_deadline: moved by the consumer's lease renewer.
    :ivar retry: the retry partition's pending work (design §6).
    :ivar written: retry work records written by this process, kept for
        their attempt within a fixed bound (:class:`~._retry.WrittenCache`).
    """

    def __init__(
        self,
        *,
        log: Log,
        config: ConsumerConfig,
        topic: str,
        partition: int,
        stats: ConsumerStats,
        lease: Lease | None = None,
        lease_deadline: float = math.inf,
        health: LogHealth | None = None,
    ) -> None:
        self.log = log
        self.config = config
        self.topic = topic
        self.partition = partition
        self.retry_topic = config.retry_topic(topic)
        self.dead_letter_topic = config.dead_letter_topic(topic)
        self.stats = stats
        self.lease_deadline = lease_deadline
        # Every write for this partition carries its lease (design §15): the log
        # refuses it once another member owns the partition.
        self.fence = lease
        self.clock = config.clock
        self.health = health if health is not None else LogHealth()
        self.retry = RetryState(config.delay, config.clock, group=config.group)
        # Work records this process wrote, kept so attempts that come soon need not read them back.
        self.written = WrittenCache()
        self.fields = {"topic": topic, "partition": partition}
        self.gate = Gate()
        self._stop = asyncio.Event()
        self.stopping = False  # mirrors _stop, read before every chunk
        # The partition's last progress (a log call answered, a chunk
        # started, a deliberate wait's end), in the process's own monotonic
        # seconds (time.monotonic, never the configured clock: a stall is
        # real time passing, and a test's fake clock jumps): what the
        # consumer's watchdog reads (design §7).
        self.progress_at = time.monotonic()
        # Chunks retrying a Transient failure in place: a pause the handler
        # asked for, however long its delays, is no stall.
        self.paused = 0
        # Handler calls running now (first calls of chunks): a stall inside
        # one is reported, never cancelled (see Consumer._watchdog).
        self.in_handler = 0
        # The consumer's own calls under way ("poll", "store", "inbox
        # lookup"...; a poll reads ahead beside a store): a stall line says
        # where the worker waits.
        self.calling: list[str] = []

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Ask for a stop: no new chunk starts, waits are abandoned."""
        self._stop.set()
        self.stopping = True

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    async def read(self, operation: str, call: Callable[[], Awaitable[R]]) -> R:
        """:meth:`log_call` for a read, abandoned at once at a stop.

        A read has nothing to finish: a stop cancels one in flight instead of
        waiting for it. A read whose reply never comes (a request lost in a
        server restart) held a stop for the whole ``shutdown_timeout``, and
        a drain's caller for as long.

        :raises Abandon: at a stop (before or during the read), and as
            :meth:`log_call` does.
        :raises SetupError: as :meth:`log_call` does.
        """
        if self._stop.is_set():
            raise Abandon
        reading = asyncio.ensure_future(self.log_call(operation, call))
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((reading, stopper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not reading.done():
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
        if reading.cancelled():
            raise Abandon
        return reading.result()

    def times(self) -> tuple[float, float]:
        """Wall and monotonic time (seconds), read together (see
        :meth:`RetryState.apply`)."""
        return self.clock.now(), self.clock.monotonic()

    async def sleep(
        self, seconds: float, *, progress: bool = True, until_answered: bool = False
    ) -> None:
        """Sleep on the clock; raise :class:`Abandon` as soon as a stop is asked.

        :param progress: the wait is deliberate (an idle poll interval, a
            Transient retry's delay): the partition counts as progressing
            until it ends. False for a wait after a failed log call, which
            is no progress.
        :param until_answered: end the wait early when another partition's
            log call succeeds after failures (:class:`LogHealth`).
        """
        if self._stop.is_set():
            raise Abandon
        if progress:
            self.progress_at = max(self.progress_at, time.monotonic() + seconds)
        # The deadline is taken now, not when the sleeping task first runs: a
        # clock that moves in between (a FakeClock advanced by a test, shown
        # by asyncio debug mode's other task order) would push it later.
        sleeper = asyncio.ensure_future(self._sleep_until(self.clock.monotonic() + seconds))
        stopper = asyncio.ensure_future(self._stop.wait())
        waits = {sleeper, stopper}
        if until_answered:
            waits.add(asyncio.ensure_future(self.health.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if self._stop.is_set():
            raise Abandon

    async def _sleep_until(self, deadline: float) -> None:
        await self.clock.sleep(deadline - self.clock.monotonic())

    async def through_gate(self) -> None:
        """Return when a chunk may start: the gate is open, the lease holds.

        :raises Abandon: at a stop, or when the lease ran out before it was
            renewed (the partition stops then).
        """
        if self._stop.is_set():
            raise Abandon
        if self.clock.monotonic() >= self.lease_deadline:
            # A pause (SIGSTOP, a blocked event loop) outlived the lease: another
            # member may own the partition now; start nothing more (design §15).
            logger.warning(
                "partition lease ran out before it was renewed; stopping", extra=self.fields
            )
            self.stop()
            raise Abandon
        if self.gate.is_open:
            return
        opener = asyncio.ensure_future(self.gate.wait())
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({opener, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            opener.cancel()
            stopper.cancel()
        if self._stop.is_set():
            raise Abandon

    async def log_call(
        self, operation: str, call: Callable[[], Awaitable[R]], *, service: str = "log"
    ) -> R:
        """Run one of the consumer's own log (or inbox) calls; on failure retry
        it on the schedule, forever, with the gate closed (design §5.6).

        Each failure is logged at warning as ``<service> call failed;
        retrying``. A failure no retry can fix (:func:`~._setup.setup_fault`:
        a missing table or topic, a refused credential) is not retried: it
        is logged once at error, ``setup error; stopping the consumer``, and
        raised (design §7).

        :param service: what is called, for the log line: ``log`` or ``inbox``.
        :raises Abandon: when the log refuses the lease (another member owns
            the partition), or at a stop while waiting to retry.
        :raises SetupError: when the call meets a setup fault (as many times
            in a row as the fault's ``tries``).
        """
        failures = 0
        setup_failures = 0
        self.calling.append(operation)
        try:
            while True:
                try:
                    result = await call()
                except FencedError as exc:
                    logger.warning(
                        "partition lease lost; stopping",
                        extra={**self.fields, "operation": operation, "error": str(exc)},
                    )
                    raise Abandon from exc
                except Exception as exc:  # noqa: BLE001 - every log failure is Transient here
                    failures += 1
                    self.stats.log_call_retries += 1
                    if failures == 1:
                        self.gate.close()
                    error = sanitize(exc, self.config.error_text_limit)
                    fault = setup_fault(exc)
                    setup_failures = setup_failures + 1 if fault is not None else 0
                    if fault is not None and setup_failures >= fault.tries:
                        self._setup_failed(operation, service, fault, error, exc)
                    delay = self.config.log_retry_delay(failures)
                    logger.warning(
                        f"{service} call failed; retrying",
                        extra={
                            **self.fields,
                            "operation": operation,
                            "delay": delay,
                            "failures": failures,
                            "error_class": ErrorClass.TRANSIENT.value,
                            "error": error,
                        },
                    )
                    await self.sleep(delay, progress=False, until_answered=True)
                else:
                    self.progress_at = max(self.progress_at, time.monotonic())
                    if failures:
                        logger.info(
                            f"{service} call answered again",
                            extra={**self.fields, "operation": operation, "failures": failures},
                        )
                        if self.health.waiting:
                            self.health.answered()
                    return result
        finally:
            self.calling.remove(operation)
            if failures:
                self.gate.reopen()

    def _setup_failed(
        self, operation: str, service: str, fault: SetupFault, error: str, exc: Exception
    ) -> NoReturn:
        logger.error(
            "setup error; stopping the consumer",
            extra={
                **self.fields,
                "operation": operation,
                "service": service,
                "error": error,
                "hint": fault.hint,
            },
        )
        raise SetupError(
            sanitize(fault.what, self.config.error_text_limit),
            fault.hint,
            operation=operation,
            topic=self.topic,
            partition=self.partition,
        ) from exc
