"""A fault no retry can fix stops the consumer with one clear line (design §7).

An inbox whose table was never created made ``wakuwaku run ... --drain``
print ``log call failed; retrying ... operation='inbox lookup' error=
'OperationalError: no such table: wk_inbox'`` sixty times a minute, forever.
A missing table, a missing topic, a refused credential or permission is a
setup error: logged once at error, raised by ``run()``/``drain()`` as
:class:`wakuwaku.SetupError`, and the CLI exits non-zero. A lost server is
not one: it is retried (tested in the fault suites).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import wakuwaku as wk
from wakuwaku import LogUnavailableError, SetupError, UnknownTopicError
from wakuwaku.cli import ExitCode, main
from wakuwaku.engine import Handler
from wakuwaku.engine._setup import setup_fault
from wakuwaku.inbox import SQLiteInbox
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import Item, consumer, setup_topic


async def _noop(run: Sequence[Item]) -> None:
    return None


async def _one_event() -> tuple[Log, list[int], Callable[[Sequence[Item]], Awaitable[None]]]:
    """A memory log with one event on ``t``, and a handler noting what it handled."""
    log = wk.MemoryLog()
    producer = await setup_topic(log)
    await producer.publish(Item("k", 1))
    handled: list[int] = []

    async def apply(run: Sequence[Item]) -> None:
        handled.extend(e.n for e in run)

    return log, handled, apply


async def _drive(task: asyncio.Task[Any], clock: FakeClock, step: float) -> None:
    """Move the fake clock on by ``step`` until ``task`` ends (its waits are on it)."""
    while not task.done():
        clock.advance(step)
        await asyncio.sleep(0.01)


async def test_an_inbox_without_its_table_stops_the_consumer_with_one_line(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    log = wk.MemoryLog()
    producer = await setup_topic(log)
    await producer.publish_many([Item("k", n) for n in range(3)])
    inbox = SQLiteInbox(tmp_path / "effects.db", "g")  # ensure_schema() never awaited
    drain = consumer(log, clock, [Handler(Item, _noop, inbox=inbox)]).drain()
    with caplog.at_level(logging.WARNING, logger="wakuwaku"), pytest.raises(SetupError) as caught:
        await asyncio.wait_for(drain, 60)
    error = caught.value
    assert error.operation == "inbox lookup"
    assert (error.topic, error.partition) == ("t", 0)
    assert "no such table" in str(error) and "ensure_schema" in str(error)
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("setup error; stopping the consumer") == 1
    assert not any("call failed; retrying" in m for m in messages)
    assert await log.committed("g", "t", 0) is None  # nothing was handled
    # The partition was let go: the fixed consumer, started again at once,
    # does not wait out lease_ttl (3600 s here) for its own lease.
    lease = await log.acquire_partition("g", "t", 0, "another-member", 10.0)
    assert lease is not None


async def test_a_lost_inbox_database_is_retried_as_an_inbox_call(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure a retry can fix (a locked database) keeps the Transient
    retry, named for the inbox, not the log."""

    class Flaky(SQLiteInbox):
        failures = 2

        async def claimed(self, keys: Sequence[str]) -> set[str]:
            if Flaky.failures:
                Flaky.failures -= 1
                raise sqlite3.OperationalError("database is locked")
            return set()

    log, handled, apply = await _one_event()

    inbox = Flaky(":memory:", "g")
    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        task = asyncio.create_task(
            consumer(log, clock, [Handler(Item, apply, inbox=inbox)], retry_delays=[0.5]).drain()
        )
        await _drive(task, clock, 0.5)
        await task
    assert handled == [1]
    retries = [r for r in caplog.records if r.getMessage() == "inbox call failed; retrying"]
    assert len(retries) == 2


async def test_a_topic_deleted_under_the_consumer_stops_it(
    log: Log, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A main topic that is gone is certain after three failures in a row
    (a broker may answer "unknown topic" for a moment after a create)."""

    class Gone:
        """The log, whose main topic was deleted after the consumer started."""

        def __init__(self, inner: Log) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        async def read(self, topic: str, *args: object, **kwargs: object) -> object:
            if topic == "t":
                raise UnknownTopicError(topic)
            return await self.inner.read(topic, *args, **kwargs)  # type: ignore[arg-type]

    await setup_topic(log)
    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        task = asyncio.create_task(
            consumer(Gone(log), clock, [Handler(Item, _noop)], retry_delays=[1.0]).drain()  # type: ignore[arg-type]
        )
        await _drive(task, clock, 1.0)
        with pytest.raises(SetupError, match="topic 't' does not exist"):
            await task
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("log call failed; retrying") == 2
    assert messages.count("setup error; stopping the consumer") == 1


@pytest.mark.parametrize(
    ("exc", "setup"),
    [
        (sqlite3.OperationalError("no such table: wk_inbox"), True),
        (sqlite3.OperationalError("attempt to write a readonly database"), True),
        (sqlite3.OperationalError("database is locked"), False),
        (sqlite3.OperationalError("unable to open database file"), True),
        (LogUnavailableError("no answer within 10 s"), False),
        (ConnectionResetError("reset by peer"), False),
        (TimeoutError(), False),
        (type("AuthenticationError", (Exception,), {})("invalid password"), True),
        (Exception("WRONGPASS invalid username-password pair"), True),
        (Exception("nats: 'Authorization Violation'"), True),
        (Exception("KafkaError{code=TOPIC_AUTHORIZATION_FAILED,val=29}"), True),
        (type("UndefinedTable", (Exception,), {"sqlstate": "42P01"})("relation"), True),
        (type("SerializationFailure", (Exception,), {"sqlstate": "40001"})("retry"), False),
        (type("InvalidPassword", (Exception,), {"sqlstate": "28P01"})("denied"), True),
        # psycopg gives errors raised while connecting no SQLSTATE
        (Exception('connection failed: FATAL:  database "nosuch" does not exist'), True),
        (Exception('connection failed: FATAL:  role "nosuch" does not exist'), True),
        (Exception('relation "orders" does not exist'), False),  # 42P01 has its SQLSTATE
        (Exception("HELLO must be called with the client already authenticated"), True),
    ],
)
def test_setup_faults_are_told_apart_from_outages(exc: Exception, setup: bool) -> None:
    assert (setup_fault(exc) is not None) is setup


def test_a_setup_fault_is_found_behind_an_adapters_wrapper() -> None:
    try:
        try:
            raise Exception("NOAUTH Authentication required.")
        except Exception as inner:
            raise LogUnavailableError("redis: cannot reach the server") from inner
    except LogUnavailableError as wrapped:
        assert setup_fault(wrapped) is not None


def test_run_drain_exits_non_zero_on_a_missing_inbox_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "log.db"

    async def seed() -> None:
        from wakuwaku.logs.sqlite import SQLiteLog

        log = SQLiteLog(db)
        await log.create_topic("t", 2)
        await wk.Producer(log, "t").publish_many([Item(f"k{n}", n) for n in range(4)])
        await log.close()

    asyncio.run(seed())
    module = tmp_path / "wk_setup_fault_mod.py"
    module.write_text(
        "import os\n"
        "from wakuwaku import Consumer, ConsumerConfig, Handler\n"
        "from wakuwaku.inbox import SQLiteInbox\n"
        "from wakuwaku.logs import open_log\n"
        "from tests.engine.conftest import Item\n"
        "async def noop(run):\n"
        "    return None\n"
        f"inbox = SQLiteInbox({str(tmp_path / 'effects.db')!r}, 'g')\n"
        "def build(log):\n"
        "    config = ConsumerConfig(topic='t', group='g', retry_delays=(0.05,))\n"
        "    return Consumer(config, [Handler(Item, noop, inbox=inbox)], log)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        code = main(["run", "wk_setup_fault_mod:build", "--drain", "--log", f"sqlite:///{db}"])
    finally:
        sys.modules.pop("wk_setup_fault_mod", None)
    assert code == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "error: setup error during 'inbox lookup'" in err
    assert "no such table" in err
    assert "call failed; retrying" not in err


async def test_a_consumer_started_during_an_outage_starts_when_the_log_answers(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker restarting while the consumer starts: start() waits for it
    on the retry schedule instead of failing the process (design §7)."""

    class Restarting:
        def __init__(self, inner: Log) -> None:
            self.inner = inner
            self.down = 2

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        async def describe_topic(self, topic: str) -> object:
            if self.down:
                self.down -= 1
                raise LogUnavailableError("no answer within 1 s")
            return await self.inner.describe_topic(topic)

    log, handled, apply = await _one_event()

    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        task = asyncio.create_task(
            consumer(Restarting(log), clock, [Handler(Item, apply)], retry_delays=[1.0]).drain()  # type: ignore[arg-type]
        )
        await _drive(task, clock, 1.0)
        await task
    assert handled == [1]
    waits = [r for r in caplog.records if r.getMessage() == "log call failed; retrying"]
    assert [getattr(r, "operation", None) for r in waits] == ["describe topic"] * 2


async def test_failed_log_calls_wait_the_log_schedule_not_the_handlers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``log_retry_delays``, a failed log call (here the start's topic
    lookup, and a poll) waits that schedule, not ``retry_delays``: a
    broker back after an outage is polled again after seconds, not after
    the handlers' hour. On a clock that never moves, only a zero wait
    lets the drain end."""

    class Flaky:
        """Fails its first topic lookup and its first read of ``t``."""

        def __init__(self, inner: Log) -> None:
            self.inner = inner
            self.failing = {"describe": 1, "read": 1}

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def _fail(self, call: str) -> None:
            if self.failing[call]:
                self.failing[call] -= 1
                raise LogUnavailableError("no answer within 1 s")

        async def describe_topic(self, topic: str) -> object:
            self._fail("describe")
            return await self.inner.describe_topic(topic)

        async def read(self, topic: str, *args: Any, **kwargs: Any) -> object:
            if topic == "t":
                self._fail("read")
            return await self.inner.read(topic, *args, **kwargs)

    log, handled, apply = await _one_event()
    flaky = Flaky(log)
    still = FakeClock(autojump=False)
    drain = consumer(
        flaky,  # type: ignore[arg-type]
        still,
        [Handler(Item, apply)],
        retry_delays=[3600.0],
        log_retry_delays=[0.0],
    ).drain()
    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        await asyncio.wait_for(drain, timeout=20.0)
    assert handled == [1]
    assert flaky.failing == {"describe": 0, "read": 0}
    waits = [r for r in caplog.records if "call failed; retrying" in r.getMessage()]
    assert sorted(getattr(r, "operation", "") for r in waits) == ["describe topic", "poll"]
    assert {getattr(r, "delay", None) for r in waits} == {0.0}
    assert still.monotonic() == 0.0


def test_a_log_schedule_is_checked_like_the_handlers_schedule() -> None:
    with pytest.raises(wk.ConfigError, match=r"log_retry_delays must be a non-empty"):
        wk.ConsumerConfig(topic="t", group="g", log_retry_delays=[])
    with pytest.raises(wk.ConfigError, match=r"log_retry_delays must each be at most"):
        wk.ConsumerConfig(topic="t", group="g", log_retry_delays=[1e9])
    config = wk.ConsumerConfig(topic="t", group="g", retry_delays=[5.0], log_retry_delays=[1, 2])
    assert [config.log_retry_delay(n) for n in (1, 2, 3)] == [1.0, 2.0, 2.0]
    assert wk.ConsumerConfig(topic="t", group="g", retry_delays=[5.0]).log_retry_delay(1) == 5.0


@pytest.mark.parametrize(
    "engine",
    [pytest.param("redis", marks=pytest.mark.redis), pytest.param("nats", marks=pytest.mark.nats)],
)
async def test_a_refused_password_stops_the_consumer_at_start(engine: str, tmp_path: Path) -> None:
    """A server that refuses the password: one SetupError at start, naming
    it. Redis said LogUnavailableError (which reads as an outage); NATS
    retried forever with a bare TimeoutError (nats-py kept the server's
    "Authorization Violation" to its error callback)."""
    from wakuwaku.logs.nats import NatsLog
    from wakuwaku.logs.redis import RedisLog

    from ..faults.servers import NatsServer, RedisServer

    server: RedisServer | NatsServer
    if engine == "redis":
        server = RedisServer(tmp_path, password="secret")
    else:
        server = NatsServer(tmp_path, user="app", password="secret")
    await asyncio.to_thread(server.start)
    port = server.port
    log: Log = (
        RedisLog(f"redis://:wrong@127.0.0.1:{port}")
        if engine == "redis"
        else NatsLog(f"nats://app:wrong@127.0.0.1:{port}", timeout=2.0)
    )
    try:
        refused = wk.Consumer(wk.ConsumerConfig(topic="t", group="g"), [Handler(Item, _noop)], log)
        with pytest.raises(SetupError, match="refused the credentials"):
            await asyncio.wait_for(refused.drain(), 30)
    finally:
        await log.close()
        await asyncio.to_thread(server.close)
