"""A SQLite log with dead letters of every kind, and a quarantined key, built by a
real consumer, for the operations CLI tests (``dlq``, ``status``, ``key``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

import wakuwaku as wk
from wakuwaku._records import H_KEY, H_REASON, H_SRC, build_headers
from wakuwaku.engine import Consumer, ConsumerConfig, Handler, current_chunk
from wakuwaku.logs import Log
from wakuwaku.logs.sqlite import SQLiteLog
from wakuwaku.testing import FakeClock

T0 = 1_700_000_000.0
TOPIC = "orders"
GROUP = "billing"
POISON = {3, 8}
"""Order numbers whose handling raises Unrecoverable while the handler is broken."""
STUCK = "stuck"
"""A key whose handling raises Retryable until it gives up."""


@wk.event("tests.cli.order", key="key")
class Order(msgspec.Struct, frozen=True):
    key: str
    n: int


@wk.event("tests.cli.unhandled", key="key")
class Unhandled(msgspec.Struct, frozen=True):
    """Declared but given no handler: its records are dead-lettered ``unknown_type``."""

    key: str


class Recorder:
    """Handles orders; fails POISON and STUCK while ``broken``; remembers message ids."""

    def __init__(self, broken: bool = True) -> None:
        self.broken = broken
        self.handled: list[Order] = []
        self.ids: list[tuple[str, ...]] = []

    async def __call__(self, chunk: Sequence[Order]) -> None:
        for order in chunk:
            if self.broken and order.n in POISON:
                raise wk.Unrecoverable(f"order {order.n} is poison")
            if self.broken and order.key == STUCK:
                raise wk.Retryable(f"order {order.n}: row locked")
        self.handled.extend(chunk)
        self.ids.extend(current_chunk().message_ids)


def make_consumer(
    log: Log, recorder: Recorder, clock: FakeClock | None = None, **overrides: object
) -> Consumer:
    options: dict[str, object] = {
        "topic": TOPIC,
        "group": GROUP,
        "clock": clock or FakeClock(T0),
        "retry_delays": (10.0, 20.0),
        # A failed log call (a server slow to answer on a loaded machine) is
        # tried again at once: on a clock moved by hand, a wait on the
        # handlers' schedule would last until the test moved it.
        "log_retry_delays": (0.0,),
        "lease_ttl": 3600.0,
    }
    options.update(overrides)
    return Consumer(ConsumerConfig(**options), [Handler(Order, recorder)], log)  # type: ignore[arg-type]


@dataclass
class DeadLog:
    """The log built by :func:`build_dead_log` and what it holds."""

    path: Path
    url: str
    corrupt_offset: int
    """Offset of the hand-written corrupt record in ``wk-dlq.billing.orders`` partition 0."""


async def build_dead_log(path: Path) -> DeadLog:
    """``orders`` (2 partitions) consumed by a broken handler: dead letters with reasons
    unrecoverable (POISON), gave_up_retry (key STUCK), unknown_type, malformed_header
    (no key), plus a corrupt record written straight into ``wk-dlq.billing.orders``."""
    log = SQLiteLog(path)
    try:
        await log.create_topic(TOPIC, 2)
        producer = wk.Producer(log, TOPIC)
        orders = [Order(f"k{n % 3}", n) for n in range(10)]
        orders += [Order(STUCK, 100), Order(STUCK, 101)]
        await producer.publish_many(orders)
        await producer.publish(Unhandled("k1"))
        no_key = build_headers(wk.event_type(Order), "k0")
        del no_key[H_KEY]
        await log.append(TOPIC, 0, [(no_key, b'{"key": "k0", "n": 50}')])
        await make_consumer(log, Recorder()).drain()
        await log.create_topic(f"wk-dlq.{GROUP}.{TOPIC}", 2)
        corrupt = {H_KEY: b"\xff\xfe", H_SRC: b"[broken"}
        [offset] = await log.append(f"wk-dlq.{GROUP}.{TOPIC}", 0, [(corrupt, b"\xff\x00")])
        assert H_REASON not in corrupt
    finally:
        await log.close()
    return DeadLog(path, f"sqlite:///{path}", offset)


DELAYS = (10.0, 20.0, 40.0)


async def until(condition: Callable[[], bool], clock: FakeClock | None = None) -> None:
    """Let the consumer's tasks (and the SQLite worker thread) run until ``condition``.

    With ``clock``, fake time also moves by 0.05 s per round, so an idle
    partition polls again (never close to a retry's due time here).
    """
    for _ in range(2000):
        if condition():
            return
        if clock is not None:
            clock.advance(0.05)
        await asyncio.sleep(0.002)
    raise AssertionError("condition not met")


async def quarantine(log: Log, *, attempts: int = 0) -> Consumer:
    """Publish, consume with a clock that only moves by hand, stop with ``STUCK`` quarantined.

    ``attempts`` retry attempts are made (each one fails) before stopping.
    """
    await log.create_topic(TOPIC, 2)
    producer = wk.Producer(log, TOPIC)
    await producer.publish_many([Order("k1", 1), Order(STUCK, 2), Order(STUCK, 3), Order("k2", 4)])
    clock = FakeClock(T0, autojump=False)
    consumer = make_consumer(log, Recorder(), clock, retry_delays=DELAYS)
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    await until(
        lambda: (
            consumer.stats.quarantined_keys == 1
            and all(v.caught_up for v in consumer.partitions())
            and len(consumer.assignment()) == 2
        )
    )
    p = wk.partition_for(STUCK, 2)
    for n in range(attempts):
        # Exactly to the due time: the attempt runs then, and its marker says so.
        view = consumer.partition(TOPIC, p)
        assert view is not None and view.next_attempt_at is not None
        clock.advance(view.next_attempt_at - clock.now())
        await until(lambda n=n: consumer.stats.attempts_failed == n + 1)  # type: ignore[misc]
    await producer.publish(Order(STUCK, 5))  # routed behind the pending ones
    await until(lambda: consumer.stats.routed == 1, clock)
    consumer.stop()
    await task
    return consumer
