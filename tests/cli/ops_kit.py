"""A SQLite log with dead letters of every kind, built by a real consumer, for the
operations CLI tests (``dlq``, ``status``)."""

from __future__ import annotations

from collections.abc import Sequence
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
