"""design §6: waits run on monotonic time, stored times round up, delays are
bounded, jitter only adds delay, sync handlers get a pool as large as
``max_concurrency``. Every schedule is measured on the fake clock; nothing
sleeps for real."""

from __future__ import annotations

import asyncio
import random
import reprlib
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

import wakuwaku as wk
from wakuwaku._partitioner import partition_for
from wakuwaku.engine import Handler
from wakuwaku.engine._config import MAX_RETRY_DELAY
from wakuwaku.engine._retry import ms_text
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import T0, Item, Running, config, consumer, dead_letters, read_all, setup_topic

HOUR = 3600.0


class Timed:
    """A handler that fails event ``n`` with Retryable as scripted and notes
    the (monotonic, wall) time of every call."""

    def __init__(
        self,
        clock: FakeClock,
        fails: dict[int, int] | None = None,
        on_first: Callable[[], None] | None = None,
    ) -> None:
        self.clock = clock
        self.fails = dict(fails or {})
        self.calls: list[tuple[str, float, float]] = []
        self.on_first = on_first

    async def __call__(self, run: Sequence[Item]) -> None:
        self.calls.append((run[0].key, self.clock.monotonic(), self.clock.now()))
        if self.on_first is not None:
            first, self.on_first = self.on_first, None
            first()
        for event in run:
            if self.fails.get(event.n, 0) > 0:
                self.fails[event.n] -= 1
                raise wk.Retryable("not yet")

    def mono(self, key: str = "a") -> list[float]:
        return [m for k, m, _ in self.calls if k == key]

    def since_first(self, key: str = "a") -> list[float]:
        """Each call's monotonic time less the first call's: the schedule
        itself, whatever the consumer's start took (on Kafka, the group join
        is real time during which the fake clock may move)."""
        times = self.mono(key)
        return [round(m - times[0], 6) for m in times]


def step_wall_later(clock: FakeClock, after: float, seconds: float) -> Callable[[], None]:
    """A callback that steps the wall clock by ``seconds`` ``after`` seconds
    (on the clock) from the moment it is called."""
    tasks: list[asyncio.Task[None]] = []

    async def step() -> None:
        await clock.sleep(after)
        clock.step_wall(seconds)

    return lambda: tasks.append(asyncio.get_running_loop().create_task(step()))


async def until(clock: FakeClock, condition: Callable[[], bool], limit: float) -> None:
    """Wait on the fake clock's monotonic time until ``condition()``, at most ``limit`` s."""
    start = clock.monotonic()
    while not condition():
        if clock.monotonic() - start > limit:
            raise AssertionError(f"condition not met within {limit} fake seconds")
        await clock.sleep(0.01)


# ------------------------------------------------------------ the fake clock


async def test_step_wall_moves_now_but_not_monotonic_time_nor_sleepers() -> None:
    clock = FakeClock(T0, autojump=False)
    woke: list[float] = []

    async def sleeper() -> None:
        await clock.sleep(1.0)
        woke.append(clock.monotonic())

    task = asyncio.create_task(sleeper())
    await asyncio.sleep(0)
    clock.step_wall(HOUR)
    await asyncio.sleep(0)
    assert (clock.now(), clock.monotonic(), woke) == (T0 + HOUR, 0.0, [])
    clock.step_wall(-2 * HOUR)
    clock.advance(1.0)
    await task
    assert woke == [1.0] and clock.now() == T0 - HOUR + 1.0


# --------------------------------------------------------------- clock steps


@pytest.mark.parametrize("step", [-HOUR, HOUR])
async def test_a_wall_clock_step_neither_stalls_nor_hurries_the_first_attempt(
    log: Log, clock: FakeClock, step: float
) -> None:
    # now() steps 0.1 s after the key is quarantined (schedule 0.3 s). Waits on
    # wall time made no attempt for an hour after a step back, one 0.2 s early
    # after a step forward.
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    handler = Timed(clock, {1: 1}, on_first=step_wall_later(clock, 0.1, step))
    c = consumer(log, clock, [Handler(Item, handler)], retry_delays=[0.3])
    async with Running(c):
        await until(clock, lambda: len(handler.mono()) == 2, limit=5.0)
    assert handler.since_first() == [0.0, 0.3]
    assert c.stats.attempts == 1 and await dead_letters(log) == []


@pytest.mark.parametrize("step", [-HOUR, HOUR])
async def test_a_wall_clock_step_between_attempts_keeps_the_schedule(
    log: Log, clock: FakeClock, step: float
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    handler = Timed(clock, {1: 3})
    c = consumer(log, clock, [Handler(Item, handler)], retry_delays=[1.0, 2.0, 4.0])
    async with Running(c):
        await until(clock, lambda: len(handler.mono()) == 2, limit=5.0)
        await clock.sleep(0.5)
        clock.step_wall(step)  # after attempt 1 failed at 1.0; attempt 2 due at 3.0
        await until(clock, lambda: len(handler.mono()) == 4, limit=20.0)
    assert handler.since_first() == [0.0, 1.0, 3.0, 7.0]


async def test_a_restart_converts_stored_times_once_and_ignores_later_steps(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    first = Timed(clock, {1: 100})
    c1 = consumer(log, clock, [Handler(Item, first)], retry_delays=[10.0], member_id="m1")
    task = asyncio.create_task(c1.run(install_signal_handlers=False))
    await until(clock, lambda: c1.stats.quarantined_keys == 1, limit=5.0)
    await clock.sleep(1.0)
    task.cancel()  # a crash at 1 s; the first attempt is stored as due at T0 + 10
    await asyncio.gather(task, return_exceptions=True)

    second = Timed(clock, {1: 0})
    c2 = consumer(log, clock, [Handler(Item, second)], retry_delays=[10.0], member_id="m1")
    async with Running(c2):
        await until(
            clock,
            lambda: bool(c2.assignment()) and all(v.started for v in c2.partitions()),
            limit=5.0,
        )
        await clock.sleep(1.0)
        clock.step_wall(-HOUR)  # after the restart read T0 + 10: no effect
        await until(clock, lambda: len(second.mono()) == 1, limit=20.0)
    start = first.mono()[0]  # 0.0 but on Kafka, whose group join may take fake time
    assert second.mono() == [pytest.approx(start + 10.0, abs=1e-6)]
    assert [wall for _, _, wall in second.calls] == [
        pytest.approx(T0 + start + 10.0 - HOUR, abs=1e-6)
    ]


async def test_a_stored_due_time_already_past_at_a_restart_is_due_at_once(
    memory_log: Log, clock: FakeClock
) -> None:
    log = memory_log
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    first = Timed(clock, {1: 100})
    c1 = consumer(log, clock, [Handler(Item, first)], retry_delays=[10.0], member_id="m1")
    task = asyncio.create_task(c1.run(install_signal_handlers=False))
    await until(clock, lambda: c1.stats.quarantined_keys == 1, limit=5.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    clock.step_wall(HOUR)  # the process was down for an hour of wall time
    second = Timed(clock)
    c2 = consumer(log, clock, [Handler(Item, second)], retry_delays=[10.0], member_id="m1")
    start = clock.monotonic()
    await c2.drain()
    assert second.mono() == [start]


# --------------------------------------------------------------- rounding up


def test_stored_times_round_up_to_the_millisecond() -> None:
    assert ms_text(T0 + 0.0004) == b"1700000000001"  # round() gave ...000: 0.4 ms early
    assert ms_text(T0 + 2.0004) == b"1700000002001"
    assert ms_text(T0 + 0.1) == b"1700000000100"  # float noise adds nothing
    assert ms_text(T0 + 0.3) == b"1700000000300"
    assert ms_text(T0) == b"1700000000000"
    assert ms_text(2.0) == b"2000" and ms_text(0.0000001) == b"0"


async def test_a_failure_at_a_fraction_of_a_ms_is_stored_rounded_up_and_attempted_no_earlier(
    log: Log,
) -> None:
    # Rounded down, a failure at ...000.0004 got its first attempt at ...002.000.
    clock = FakeClock(T0 + 0.0004)
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    first = Timed(clock, {1: 100})
    c1 = consumer(log, clock, [Handler(Item, first)], retry_delays=[2.0], member_id="m1")
    task = asyncio.create_task(c1.run(install_signal_handlers=False))
    await until(clock, lambda: c1.stats.quarantined_keys == 1, limit=5.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    [work] = await read_all(log, "wk-retry.g.t")
    start = first.mono()[0]  # 0.0 but on Kafka, whose group join may take fake time
    assert work.headers["wk-failed-at"] == ms_text(T0 + 0.0004 + start)
    assert work.headers["wk-due-at"] == ms_text(T0 + 0.0004 + start + 2.0)
    if start == 0.0:
        assert work.headers["wk-failed-at"] == b"1700000000001"

    second = Timed(clock)
    c2 = consumer(log, clock, [Handler(Item, second)], retry_delays=[2.0], member_id="m1")
    await c2.drain()
    [(_, _, wall)] = second.calls
    assert wall >= T0 + 0.0004 + start + 2.0
    due = int(ms_text(T0 + 0.0004 + start + 2.0))
    markers = [r for r in await read_all(log, "wk-retry.g.t") if "wk-marker" in r.headers]
    assert all(int(r.headers["wk-at"]) >= due for r in markers)


# ------------------------------------------------------------ bounded delays


@pytest.mark.parametrize("delays", [[1e12], [2.0, MAX_RETRY_DELAY + 1]])
def test_a_retry_delay_above_30_days_is_refused(delays: list[float]) -> None:
    with pytest.raises(wk.ConfigError, match="at most 2592000 seconds"):
        config(FakeClock(T0), retry_delays=delays)


@pytest.mark.parametrize(
    "delays", [["5"], [True], [1.0, False], {1.0, 2.0}, "12", b"1", (d for d in [1.0]), [None]]
)
@pytest.mark.parametrize("name", ["retry_delays", "log_retry_delays"])
def test_a_schedule_of_anything_but_numbers_in_order_is_refused(delays: Any, name: str) -> None:
    """A string, a boolean, a set or a generator is refused, not converted
    (``["5"]`` was 5 s, ``[True]`` 1 s, a set some order); the error names
    the schedule and shows the value, shortened."""
    with pytest.raises(wk.ConfigError, match=f"^{name} must be a non-empty sequence") as caught:
        config(FakeClock(T0), **{name: delays})
    assert reprlib.repr(delays) in str(caught.value)


def test_a_schedule_of_other_numbers_is_taken_in_order_and_a_huge_one_is_refused() -> None:
    delays = [Fraction(1, 2), Decimal("1.5"), -0.0, 2]
    assert config(FakeClock(T0), retry_delays=delays).retry_delays == (0.5, 1.5, 0.0, 2.0)
    assert config(FakeClock(T0), retry_delays=range(1, 4)).retry_delays == (1.0, 2.0, 3.0)
    with pytest.raises(wk.ConfigError, match="at most 2592000 seconds") as caught:
        config(FakeClock(T0), retry_delays=[10**309])  # OverflowError as a float
    assert len(str(caught.value)) < 200
    with pytest.raises(wk.ConfigError, match=r"got \[0, 0, 0, 0, 0, 0, \.\.\.\]"):
        config(FakeClock(T0), retry_delays=[0] * 10**5 + ["x"])


def test_a_retry_delay_of_30_days_is_accepted() -> None:
    assert config(FakeClock(T0), retry_delays=[MAX_RETRY_DELAY]).retry_delays == (MAX_RETRY_DELAY,)


# -------------------------------------------------------------------- jitter


@pytest.mark.parametrize("jitter", [-0.1, 1.5, float("nan"), "0.5", True])
def test_retry_jitter_must_be_a_fraction(jitter: Any) -> None:
    with pytest.raises(wk.ConfigError, match="retry_jitter"):
        config(FakeClock(T0), retry_jitter=jitter)


def test_jitter_source_must_be_callable() -> None:
    with pytest.raises(wk.ConfigError, match="jitter_source"):
        config(FakeClock(T0), jitter_source=0.5)


@pytest.mark.parametrize(
    ("u", "expected"), [(0.0, 2.0), (0.5, 2.5), (0.999, 2.999), (-3.0, 2.0), (7.0, 3.0)]
)
def test_jitter_only_adds_delay(u: float, expected: float) -> None:
    cfg = config(FakeClock(T0), retry_delays=[2.0], retry_jitter=0.5, jitter_source=lambda: u)
    assert cfg.retry_delay(1) == pytest.approx(expected)
    assert cfg.delay(1) == 2.0
    assert config(FakeClock(T0), retry_delays=[2.0]).retry_delay(1) == 2.0  # off by default


async def test_keys_failing_together_retry_spread_by_jitter_never_earlier(
    memory_log: Log, clock: FakeClock
) -> None:
    # Without jitter, keys failing together retry in lockstep.
    log = memory_log
    producer = await setup_topic(log)
    keys = [f"k{i}" for i in range(30)]
    await producer.publish_many([Item(k, i) for i, k in enumerate(keys)])
    handler = Timed(clock, {i: 1 for i in range(len(keys))})
    c = consumer(
        log,
        clock,
        [Handler(Item, handler)],
        retry_delays=[2.0],
        retry_jitter=0.5,
        jitter_source=random.Random(12).random,
    )
    await c.drain()
    firsts = [handler.mono(k)[1] for k in keys]
    assert all(2.0 <= t <= 3.0 for t in firsts)
    assert len(set(firsts)) > 20  # spread, not in lockstep


async def test_the_stored_due_time_includes_the_jitter_and_a_restart_keeps_it(
    log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    first = Timed(clock, {1: 100})
    c1 = consumer(
        log,
        clock,
        [Handler(Item, first)],
        retry_delays=[2.0, 4.0],
        member_id="m1",
        retry_jitter=0.5,
        jitter_source=lambda: 0.5,
    )
    task = asyncio.create_task(c1.run(install_signal_handlers=False))
    await until(clock, lambda: c1.stats.attempts_failed == 1, limit=10.0)
    task.cancel()  # attempt 1 at 2.5 failed; attempt 2 due at 2.5 + 5
    await asyncio.gather(task, return_exceptions=True)
    assert first.since_first() == [0.0, 2.5]
    start = first.mono()[0]  # 0.0 but on Kafka, whose group join may take fake time
    retry = await read_all(log, "wk-retry.g.t")
    assert retry[0].headers["wk-due-at"] == ms_text(T0 + start + 2.5)
    assert retry[-1].headers["wk-due-at"] == ms_text(T0 + start + 7.5)

    second = Timed(clock)
    c2 = consumer(
        log, clock, [Handler(Item, second)], retry_delays=[2.0, 4.0], member_id="m1"
    )  # no jitter now: the stored time still holds
    await c2.drain()
    assert second.mono() == [pytest.approx(start + 7.5, abs=1e-6)]


async def test_transient_retries_in_place_are_jittered_too(
    memory_log: Log, clock: FakeClock
) -> None:
    log = memory_log
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    calls: list[float] = []

    async def body(run: Sequence[Item]) -> None:
        calls.append(clock.monotonic())
        if len(calls) < 3:
            raise wk.Transient("down")

    c = consumer(
        log,
        clock,
        [Handler(Item, body)],
        retry_delays=[2.0, 4.0],
        retry_jitter=0.25,
        jitter_source=lambda: 1.0,
    )
    await c.drain()
    assert calls == [0.0, 2.5, 7.5]


# --------------------------------------------------------------- thread pool


async def test_max_concurrency_sync_handlers_all_run_at_once(memory_log: Log) -> None:
    # asyncio's default pool (min(32, cpus + 4) threads) capped sync handlers
    # whatever max_concurrency said. 40 handlers that block on one barrier
    # only get through when all 40 run at once.
    log = memory_log
    clock = FakeClock(T0)
    width = 40
    producer = await setup_topic(log)
    await producer.publish_many([Item(f"k{i}", i) for i in range(width)])
    barrier = threading.Barrier(width, timeout=10.0)
    threads: set[str] = set()

    def body(run: Sequence[Item]) -> None:
        threads.add(threading.current_thread().name)
        barrier.wait()

    c = consumer(log, clock, [Handler(Item, body)], max_concurrency=width)
    stats = await c.drain()
    assert stats.handled == width and await dead_letters(log) == []
    assert len(threads) == width and all(t.startswith("wakuwaku-g") for t in threads)


async def test_max_concurrency_sync_handlers_of_every_partition_run_at_once(
    memory_log: Log,
) -> None:
    # max_concurrency is per partition: with one pool of max_concurrency
    # threads for the whole consumer, a partition's sync calls waited behind
    # the other partitions' and these keys, no more than max_concurrency in
    # any partition, could never all meet at the barrier.
    log = memory_log
    clock = FakeClock(T0)
    partitions = 4
    keys = [f"k{i}" for i in range(24)]
    width = max(Counter(partition_for(k, partitions) for k in keys).values())
    assert width < len(keys)
    producer = await setup_topic(log, partitions)
    await producer.publish_many([Item(k, i) for i, k in enumerate(keys)])
    barrier = threading.Barrier(len(keys), timeout=10.0)

    def body(run: Sequence[Item]) -> None:
        barrier.wait()

    c = consumer(log, clock, [Handler(Item, body)], max_concurrency=width)
    stats = await c.drain()
    assert stats.handled == len(keys)
    assert [await dead_letters(log, partition=p) for p in range(partitions)] == [[]] * partitions


async def test_sync_handlers_see_the_chunk_context_on_the_pool(memory_log: Log) -> None:
    log = memory_log
    clock = FakeClock(T0)
    producer = await setup_topic(log)
    await producer.publish(Item("a", 1))
    seen: list[tuple[str, int]] = []

    def body(run: Sequence[Item]) -> None:
        context = wk.current_chunk()
        seen.append((context.key, context.attempt))

    await consumer(log, clock, [Handler(Item, body)]).drain()
    assert seen == [("a", 0)]
