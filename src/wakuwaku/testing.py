"""Helpers for users' own tests: a fake clock, a consumer running for a block, a
wait on the fake clock (and, re-exported, the memory log). docs/testing.md
shows them at work on a handler.

:class:`FakeClock` jumps time forward instead of sleeping: when every task of
the event loop is waiting and at least one waits on the fake clock, time moves
to the earliest deadline and that sleeper wakes. A retry schedule of
2, 4, 8, 16 s therefore runs in milliseconds, and the times a handler sees are
exact.

Wall time (:meth:`FakeClock.now`) and monotonic time
(:meth:`FakeClock.monotonic`) move together, except that
:meth:`FakeClock.step_wall` steps the wall clock alone, as NTP or an operator
does to a real one: the library waits on monotonic time only (design §6), so a
test can show that a step neither hurries nor stalls a retry.

:func:`running` runs a :class:`wakuwaku.Consumer` in a task for the length of
an ``async with`` block, and :func:`wait_until` waits on a clock until a
condition holds: together they let a test look at a consumer between a
failure and its retry, which :meth:`Consumer.drain <wakuwaku.Consumer.drain>`
(it returns only when no key is quarantined) cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Protocol, TypeVar

from ._clock import BLOCKING_CALLS, Clock
from .logs.memory import MemoryLog as MemoryLog

__all__ = ("FakeClock", "MemoryLog", "running", "wait_until")

_IDLE_YIELDS = 50
_US = 1_000_000


class FakeClock:
    """A :class:`wakuwaku.Clock` whose time moves only when everyone sleeps.

    :param start: the initial wall time (seconds since the epoch).
    :param autojump: when true (default), time jumps to the earliest sleeper's
        deadline as soon as the event loop has nothing else to run; when false,
        only :meth:`advance` moves time.
    """

    def __init__(self, start: float = 1_700_000_000.0, *, autojump: bool = True) -> None:
        # Whole microseconds: sums of float steps would drift, and a deadline
        # computed as ``due - now`` must land exactly on ``due``.
        self._now_us = round(start * _US)
        self._start_us = self._now_us
        self._wall_step_us = 0
        self._autojump = autojump
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._driver: asyncio.Task[None] | None = None

    def now(self) -> float:
        """Wall time (seconds since the epoch): ``start``, plus the time that
        passed, plus every :meth:`step_wall`."""
        return (self._now_us + self._wall_step_us) / _US

    def monotonic(self) -> float:
        return (self._now_us - self._start_us) / _US

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        deadline = self._now_us + max(1, round(seconds * _US))
        heapq.heappush(self._sleepers, (deadline, next(self._seq), future))
        if self._autojump and (self._driver is None or self._driver.done()):
            self._driver = loop.create_task(self._drive())
        await future

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and wake every sleeper now due."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now_us += round(seconds * _US)
        self._wake_due()

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock (:meth:`now`) by ``seconds``, forward or back,
        without moving monotonic time or waking any sleeper.

        Models a wall-clock step (NTP, an operator, a VM resume): waits and
        deadlines run on monotonic time, so nothing a sleeper waits for
        changes.
        """
        self._wall_step_us += round(seconds * _US)

    def _wake_due(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._now_us:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        while self._sleepers:
            # Let every runnable task run before deciding that all are asleep.
            for _ in range(_IDLE_YIELDS):
                await asyncio.sleep(0)
                ready = getattr(loop, "_ready", None)
                if ready is not None and len(ready) == 0:
                    break
            # Drop sleepers whose waiters were cancelled.
            while self._sleepers and self._sleepers[0][2].done():
                heapq.heappop(self._sleepers)
            if not self._sleepers:
                return
            ready = getattr(loop, "_ready", None)
            if ready is not None and len(ready) > 0:
                continue
            if BLOCKING_CALLS.in_flight:
                # A log call is running in a thread: real time must pass first.
                await asyncio.sleep(0.0005)
                continue
            deadline = self._sleepers[0][0]
            if deadline > self._now_us:
                self._now_us = deadline
            self._wake_due()


async def wait_until(
    clock: Clock,
    condition: Callable[[], object],
    *,
    timeout: float = 600.0,  # noqa: ASYNC109 - measured on ``clock``, not the loop's time
    poll_interval: float = 0.01,
) -> None:
    """Wait on ``clock`` until ``condition()`` is true.

    The condition is checked at once, then after every ``poll_interval``
    slept on ``clock``. On a :class:`FakeClock` each of those sleeps is a
    sleeper like the consumer's own, so time moves while the test waits: a
    retry due in 2 s runs after 200 checks, in milliseconds of real time. On
    the system clock it waits in real seconds (a test against a real log).

    :param clock: the clock the consumer runs on (``ConsumerConfig.clock``).
    :param condition: called with no arguments on the event loop; a true
        result ends the wait. Keep it quick: time does not move while it runs.
    :param timeout: give up after this much of ``clock``'s monotonic time
        (seconds; fake seconds on a :class:`FakeClock`).
    :param poll_interval: the time between two checks (seconds).
    :raises TimeoutError: when ``condition()`` is still false after ``timeout``.
    :raises ValueError: when ``poll_interval`` is not above 0 or ``timeout`` is below 0.
    """
    if not poll_interval > 0:
        raise ValueError(f"poll_interval must be above 0 seconds, got {poll_interval!r}")
    if not timeout >= 0:
        raise ValueError(f"timeout must be 0 seconds or more, got {timeout!r}")
    deadline = clock.monotonic() + timeout
    while not condition():
        if clock.monotonic() >= deadline:
            raise TimeoutError(f"condition not met within {timeout} s of the clock's time")
        await clock.sleep(poll_interval)


class _Runnable(Protocol):
    """What :func:`running` needs of a consumer (a :class:`wakuwaku.Consumer`).

    A protocol, not the class: this module sits beside the engine in the
    package's layers (pyproject.toml, import-linter) and does not import it.
    """

    async def run(self, *, install_signal_handlers: bool = ...) -> object: ...

    def stop(self) -> None: ...


_C = TypeVar("_C", bound=_Runnable)


@contextlib.asynccontextmanager
async def running(consumer: _C) -> AsyncIterator[_C]:
    """Run ``consumer`` in a task for the length of an ``async with`` block.

    For a test that looks at a consumer while it runs (a key in quarantine,
    a retry attempt not yet due), which :meth:`Consumer.drain
    <wakuwaku.Consumer.drain>` does not allow: it returns only once no key
    is quarantined. The block gets the consumer back. On leaving the block
    (also by an exception) the consumer is asked to stop (:meth:`Consumer.stop
    <wakuwaku.Consumer.stop>`: running chunks finish, offsets are stored) and
    its ``run()`` is awaited. No signal handler is installed. A consumer runs
    once: make a new one to consume again.

    :param consumer: a :class:`wakuwaku.Consumer` that has not run yet.
    :raises: what ``run()`` raised, on leaving the block: the errors of
        :meth:`Consumer.start <wakuwaku.Consumer.start>` (``UnknownTopicError``
        for a topic never created...), ``SetupError``, ``WakuwakuError`` for a
        consumer that already ran. When the block raised too, the block's
        exception is the ``__context__`` of that one.
    """
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    try:
        yield consumer
    finally:
        consumer.stop()
        await task
