"""Clocks: the one place the library reads time or sleeps.

Every component that waits (retry schedules, Transient backoff, breakers,
result waiters) takes a :class:`Clock`, so tests inject
:class:`wakuwaku.testing.FakeClock` and check schedules exactly without
sleeping for real.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Where time comes from. All values are float seconds."""

    def now(self) -> float:
        """Wall-clock time, seconds since the Unix epoch (stored in retry markers)."""
        ...

    def monotonic(self) -> float:
        """A clock that never goes backwards, for deadlines and durations (seconds)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a non-positive value only yields to the event loop)."""
        ...


class SystemClock:
    """The real clock: :func:`time.time`, :func:`time.monotonic`, :func:`asyncio.sleep`."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


SYSTEM_CLOCK = SystemClock()


class BlockingCalls:
    """Counts calls the library has handed to worker threads and not yet got back.

    Adapters wrap thread offloading in :meth:`track`; a fake clock does not
    jump time while such a call is in flight, so a schedule measured on it
    stays exact even when a log does real I/O in a thread.
    """

    def __init__(self) -> None:
        self.in_flight = 0

    def track(self) -> _Tracker:
        return _Tracker(self)

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` of real time while a server catches up (a commit
        becoming visible, a topic being created), counted as a call in
        flight: a fake clock must not jump meanwhile. Time jumped by a test's
        own 10 ms wait loop while a Kafka store polled for its commit
        markers: a retry measured on the fake clock came 10 ms late under
        load. Never for a read waiting for new records (that is idle time).
        """
        with self.track():
            await asyncio.sleep(seconds)


class _Tracker:
    def __init__(self, owner: BlockingCalls) -> None:
        self._owner = owner

    def __enter__(self) -> None:
        self._owner.in_flight += 1

    def __exit__(self, *exc: object) -> None:
        self._owner.in_flight -= 1


BLOCKING_CALLS = BlockingCalls()
