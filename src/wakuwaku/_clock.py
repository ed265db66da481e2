"""Clocks: the one place the library reads time or sleeps.

Every component that waits (retry schedules, Transient backoff, breakers,
result waiters) takes a :class:`Clock`, so tests inject
:class:`wakuwaku.testing.FakeClock` and check schedules exactly without
sleeping for real (issue "engine": "retry schedules are tested with a fake
clock").
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
