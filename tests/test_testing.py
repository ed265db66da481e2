"""wakuwaku.testing's helpers for users' tests: ``wait_until`` on a clock, and
``running`` a consumer for a block (docs/testing.md)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku.testing import FakeClock, MemoryLog, running, wait_until


@wk.event("testing-kit.order", key="key")
class Order(msgspec.Struct, frozen=True):
    key: str
    n: int


def consumer_of(log: MemoryLog, clock: FakeClock, seen: list[int]) -> wk.Consumer:
    @wk.handler(Order)
    async def note(run: Sequence[Order]) -> None:
        seen.extend(order.n for order in run)

    config = wk.ConsumerConfig(topic="orders", group="kit", clock=clock, lease_ttl=3600.0)
    return wk.Consumer(config, [note], log)


# -------------------------------------------------------------- wait_until


async def test_wait_until_returns_at_once_when_the_condition_holds() -> None:
    clock = FakeClock()
    await wait_until(clock, lambda: True)
    assert clock.monotonic() == 0.0


async def test_wait_until_lets_the_fake_clock_move_to_what_the_condition_waits_for() -> None:
    clock = FakeClock()
    woke: list[float] = []

    async def sleeper() -> None:
        await clock.sleep(2.0)
        woke.append(clock.monotonic())

    task = asyncio.create_task(sleeper())
    await wait_until(clock, lambda: bool(woke))
    await task
    # The sleeper woke exactly at 2 s; the wait saw it at its next check.
    assert woke == [2.0]
    assert 2.0 <= clock.monotonic() <= 2.01


async def test_wait_until_raises_timeout_error_after_timeout_seconds_of_the_clock() -> None:
    clock = FakeClock()
    with pytest.raises(TimeoutError, match=r"condition not met within 1\.5 s"):
        await wait_until(clock, lambda: False, timeout=1.5, poll_interval=0.5)
    assert clock.monotonic() == 1.5


async def test_wait_until_measures_its_timeout_on_monotonic_time() -> None:
    clock = FakeClock()
    calls = 0

    def step_back_an_hour() -> bool:
        nonlocal calls
        calls += 1
        clock.step_wall(-3600.0)  # a wall-clock step neither extends nor ends the wait
        return False

    with pytest.raises(TimeoutError):
        await wait_until(clock, step_back_an_hour, timeout=1.0, poll_interval=0.25)
    assert calls == 5 and clock.monotonic() == 1.0


async def test_wait_until_runs_on_the_system_clock_in_real_seconds() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    await wait_until(wk.SYSTEM_CLOCK, lambda: loop.time() - start >= 0.02, poll_interval=0.005)
    assert loop.time() - start >= 0.02


@pytest.mark.parametrize(
    ("limit", "poll"),
    [(1.0, 0.0), (1.0, -0.1), (1.0, math.nan), (-1.0, 0.1), (math.nan, 0.1)],
)
async def test_wait_until_refuses_a_poll_interval_not_above_0_and_a_negative_timeout(
    limit: float, poll: float
) -> None:
    with pytest.raises(ValueError, match="must be"):
        await wait_until(FakeClock(), lambda: True, timeout=limit, poll_interval=poll)


# ---------------------------------------------------------------- running


async def test_running_consumes_during_the_block_and_stops_the_consumer_after_it() -> None:
    clock, log = FakeClock(), MemoryLog()
    seen: list[int] = []
    await log.create_topic("orders", 2)
    producer = wk.Producer(log, "orders")
    consumer = consumer_of(log, clock, seen)
    async with running(consumer) as same:
        assert same is consumer
        await producer.publish_many([Order("a", 1), Order("b", 2)])
        await wait_until(clock, lambda: sorted(seen) == [1, 2])
        await producer.publish(Order("a", 3))  # published while it runs: consumed too
        await wait_until(clock, lambda: len(seen) == 3)
    assert sorted(seen) == [1, 2, 3]
    # Stopped gracefully: the offsets are stored, nothing is delivered again.
    assert await consumer_of(log, clock, seen).drain() == wk.ConsumerStats()
    assert len(seen) == 3


async def test_running_raises_what_run_raised_when_the_block_ends() -> None:
    clock, log = FakeClock(), MemoryLog()  # the topic was never created
    with pytest.raises(wk.UnknownTopicError):
        async with running(consumer_of(log, clock, [])):
            pass


async def test_running_raises_the_consumers_error_over_the_blocks_own() -> None:
    clock, log = FakeClock(), MemoryLog()
    with pytest.raises(wk.UnknownTopicError) as raised:
        async with running(consumer_of(log, clock, [])):
            await wait_until(clock, lambda: False, timeout=0.1)
    assert isinstance(raised.value.__context__, TimeoutError)


async def test_running_lets_the_blocks_error_through_when_the_consumer_stopped_cleanly() -> None:
    clock, log = FakeClock(), MemoryLog()
    await log.create_topic("orders", 1)
    consumer = consumer_of(log, clock, [])
    with pytest.raises(KeyError):
        async with running(consumer):
            raise KeyError("from the block")
    with pytest.raises(wk.WakuwakuError, match="already run"):  # it did run, and stopped
        await consumer.run(install_signal_handlers=False)


class StubConsumer:
    """Records how ``running`` calls a consumer."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.stopped = asyncio.Event()

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        self.calls.append(f"run(install_signal_handlers={install_signal_handlers})")
        await self.stopped.wait()
        self.calls.append("run returned")

    def stop(self) -> None:
        self.calls.append("stop")
        self.stopped.set()


async def test_running_installs_no_signal_handler_and_waits_for_run_to_return() -> None:
    stub = StubConsumer()
    async with running(stub):
        await asyncio.sleep(0)
        assert stub.calls == ["run(install_signal_handlers=False)"]
    assert stub.calls == ["run(install_signal_handlers=False)", "stop", "run returned"]
