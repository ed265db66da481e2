"""Engine test kit: the logs (memory, SQLite, Redis, NATS, Kafka, Iggy), a fake clock, handlers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku import Clock
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from ..log_kit import ENGINES, fresh_log

T0 = 1_700_000_000.0


@wk.event("test.item", key="key")
class Item(msgspec.Struct, frozen=True):
    """A plain event; ``n`` is a unique number used by scripts."""

    key: str
    n: int


@wk.event("test.put", key="key", algebra="idempotent")
class Put(msgspec.Struct, frozen=True):
    key: str
    value: int


@wk.event("test.add", key="key", algebra="associative")
class Add(msgspec.Struct, frozen=True):
    """Associative: amounts add up; a negative amount never combines."""

    key: str
    amount: int

    def combine(self, other: Add) -> Add | None:
        if self.amount < 0 or other.amount < 0:
            return None
        return Add(self.key, self.amount + other.amount)


class FragileCodec:
    """Encodes a Fragile unless it is a combined one (n == -1)."""

    def encode(self, value: Fragile) -> bytes:
        if value.n < 0:
            raise ValueError("cannot encode a combined Fragile")
        return msgspec.json.encode(value)

    def decode(self, data: bytes) -> Fragile:
        return msgspec.json.decode(data, type=Fragile)


@wk.event("test.fragile", key="key", algebra="associative", codec=FragileCodec())
class Fragile(msgspec.Struct, frozen=True):
    """Combines into an event that its codec refuses to encode."""

    key: str
    n: int

    def combine(self, other: Fragile) -> Fragile:
        return Fragile(self.key, -1)


class Script:
    """A handler body that records calls and raises scripted failures.

    ``fail[n]`` is a list of exceptions raised, one per call, by the chunk
    holding event number ``n`` (events without ``n`` are keyed by value).
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: list[tuple[float, str, list[Any]]] = []
        self.handled: list[Any] = []
        self.fail: dict[Any, list[BaseException]] = {}
        self.gate: dict[str, asyncio.Event] = {}

    @staticmethod
    def ident(event: Any) -> Any:
        return getattr(event, "n", None) if hasattr(event, "n") else event

    async def __call__(self, run: Sequence[Any]) -> None:
        key = run[0].key
        self.calls.append((self.clock.now() - T0, key, list(run)))
        if key in self.gate:
            await self.gate[key].wait()
        for event in run:
            script = self.fail.get(self.ident(event))
            if script:
                raise script.pop(0)
        self.handled.extend(run)

    def times(self, key: str) -> list[float]:
        return [t for t, k, _ in self.calls if k == key]

    def handled_ns(self, key: str | None = None) -> list[int]:
        return [e.n for e in self.handled if key is None or e.key == key]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture(params=ENGINES)
async def log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Log]:
    async with fresh_log(request.param, tmp_path) as created:
        yield created


@pytest.fixture
def memory_log() -> Log:
    return wk.MemoryLog()


def config(clock: Clock, **overrides: Any) -> ConsumerConfig:
    # A poll interval of 0.5 fake seconds: a test that waits out a long fake
    # retry delay on a server log polls (a real read) once per interval.
    options: dict[str, Any] = {
        "topic": "t",
        "group": "g",
        "clock": clock,
        "lease_ttl": 3600.0,
        "poll_interval": 0.5,
    }
    options.update(overrides)
    return ConsumerConfig(**options)


async def setup_topic(log: Log, partitions: int = 1, topic: str = "t") -> wk.Producer:
    await log.create_topic(topic, partitions)
    return wk.Producer(log, topic)


def consumer(
    log: Log, clock: FakeClock, handlers: Sequence[Handler[Any]], **overrides: Any
) -> Consumer:
    return Consumer(config(clock, **overrides), handlers, log)


async def read_all(log: Log, topic: str, partition: int = 0) -> list[wk.Record]:
    out: list[wk.Record] = []
    offset = 0
    while True:
        page = await log.read(topic, partition, offset, 1000)
        if not page:
            return out
        out.extend(page)
        offset = page[-1].offset + 1


async def dead_letters(log: Log, topic: str = "t", partition: int = 0) -> list[wk.Record]:
    return await read_all(log, f"wk-dlq.g.{topic}", partition)


def event_n(record: wk.Record) -> int:
    """The ``n`` field of a record's JSON body."""
    return int(msgspec.json.decode(record.body)["n"])


def reason(record: wk.Record) -> str:
    return record.headers["wk-reason"].decode()


async def wait_until(clock: Clock, condition: Callable[[], bool], limit: float = 600.0) -> None:
    """Wait on ``clock`` (a fake one: so time can move) until ``condition()`` holds."""
    start = clock.now()
    while not condition():
        if clock.now() - start > limit:
            raise AssertionError(f"condition not met within {limit} fake seconds")
        await clock.sleep(0.01)


class Running:
    """A consumer running in a task, stopped on exit."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.task: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> Consumer:
        self.task = asyncio.create_task(self.consumer.run(install_signal_handlers=False))
        return self.consumer

    async def __aexit__(self, *exc: object) -> None:
        self.consumer.stop()
        assert self.task is not None
        await self.task
