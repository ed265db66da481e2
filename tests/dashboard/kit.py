"""A log with quarantined keys and dead letters, made by a real consumer, for the
dashboard's tests; and a dashboard served on a free loopback port."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs import open_log
from wakuwaku.testing import FakeClock

from ..conftest import NATS_URL, REDIS_URL
from ..ports import free_port

TOPIC = "orders"
GROUP = "billing"
SCRIPT_KEY = '<script>alert("key")</script>'
"""A key that is markup: it must render as text."""
STUCK = "stuck"
"""A key whose handling raises Retryable: quarantined, next attempt in an hour."""
POISON_KEYS = ("k-poison", SCRIPT_KEY)
"""Keys whose handling raises Unrecoverable: their records are dead-lettered."""
DEAD = 3
"""Dead letters the log holds: k-poison twice, SCRIPT_KEY once (reason unrecoverable)."""


@wk.event("tests.dashboard.order", key="key")
class Order(msgspec.Struct, frozen=True):
    key: str
    n: int
    note: str = ""


async def _handle(chunk: Sequence[Order]) -> None:
    for order in chunk:
        if order.key in POISON_KEYS:
            raise wk.Unrecoverable(f"order {order.n}: <b>bad</b> total")
        if order.key == STUCK:
            raise wk.Retryable(f"order {order.n}: row locked")


def log_urls() -> list[object]:
    """The logs a dashboard reads from another process (memory:// cannot be)."""
    return [
        pytest.param("sqlite", id="sqlite"),
        pytest.param("redis", id="redis", marks=pytest.mark.redis),
        pytest.param("nats", id="nats", marks=pytest.mark.nats),
    ]


def url_for(kind: str, tmp_path: object) -> str:
    """A fresh log of ``kind``: a new SQLite file, or a new prefix on the shared server."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/log.db"
    prefix = f"wkdash-{uuid.uuid4().hex[:12]}"
    base = REDIS_URL if kind == "redis" else NATS_URL
    return f"{base}?prefix={prefix}"


async def purge(kind: str, url: str) -> None:
    """Remove what a test made on a shared server."""
    if kind == "sqlite":
        return
    prefix = url.split("prefix=", 1)[1]
    if kind == "redis":
        from ..logs.test_redis import purge as purge_redis

        await purge_redis(REDIS_URL, prefix)
    else:
        from ..nats_support import drop_prefix

        await drop_prefix(NATS_URL, prefix)


@dataclass
class Built:
    url: str
    dead: int = DEAD


CONFIGURED = {"retry_topics": {TOPIC: "orders-retry"}, "dead_letter_topics": {TOPIC: "orders-dlt"}}
"""Configured names (design §6) a :func:`build` consumer may use."""


async def build(url: str, **names: object) -> Built:
    """``orders`` (2 partitions) consumed by group ``billing``: 3 dead letters
    (``unrecoverable``), key ``stuck`` quarantined with 2 pending records, lag 0.

    :param names: ``retry_topics``/``dead_letter_topics`` of the consumer.
    """
    log = open_log(url)
    try:
        await log.create_topic(TOPIC, 2)
        producer = wk.Producer(log, TOPIC)
        await producer.publish_many(
            [
                Order("k-ok", 1),
                Order("k-poison", 2),
                Order(STUCK, 3),
                Order(SCRIPT_KEY, 4, note="<img src=x onerror=alert(1)>"),
                Order("k-poison", 5),
                Order(STUCK, 6),
                Order("k-ok", 7),
            ]
        )
        clock = FakeClock(time.time(), autojump=False)  # the retry is never due here
        config = ConsumerConfig(
            topic=TOPIC,
            group=GROUP,
            clock=clock,
            retry_delays=(3600.0,),
            log_retry_delays=(0.0,),  # a failed log call must not wait on the still clock
            lease_ttl=3600.0,
            **names,  # type: ignore[arg-type]
        )
        consumer = Consumer(config, [Handler(Order, _handle)], log)
        task = asyncio.create_task(consumer.run(install_signal_handlers=False))
        for _ in range(3000):
            if (
                consumer.stats.quarantined_keys == 1
                and sum(consumer.stats.dead_letters.values()) == DEAD
                and len(consumer.workers) == 2
                and all(w.caught_up for w in consumer.workers.values())
            ):
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError(f"the consumer did not get there: {consumer.stats}")
        consumer.stop()
        await task
    finally:
        await log.close()
    return Built(url)


@contextmanager
def served(app: object) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on a free loopback port in a thread;
    yields its base URL, stops it at the end."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")  # type: ignore[arg-type]
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the dashboard did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30.0)
