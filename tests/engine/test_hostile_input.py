"""Bad input found by trying to break the engine: each ends in a dead letter or a
clear error, never in a stalled partition or a silent loss."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku._records import build_headers
from wakuwaku.engine import ConsumerConfig, DeliveryMode, Handler
from wakuwaku.logs import Log, MemoryLog
from wakuwaku.testing import FakeClock

from .conftest import Item, Script, consumer, dead_letters, reason, setup_topic


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ValueError("half a pair: \ud800 here"), id="lone-surrogate"),
        pytest.param(GeneratorExit(), id="generator-exit"),
        pytest.param(asyncio.CancelledError(), id="handler-raised-cancelled"),
    ],
)
async def test_odd_exceptions_from_a_handler_are_dead_lettered_and_the_key_goes_on(
    memory_log: Log, clock: FakeClock, error: BaseException
) -> None:
    producer = await setup_topic(memory_log)
    await producer.publish_many([Item("a", 1), Item("a", 2)])
    script = Script(clock)
    script.fail[1] = [error]
    await consumer(memory_log, clock, [Handler(Item, script)]).drain()
    assert script.handled_ns() == [2]
    dead = await dead_letters(memory_log)
    assert [reason(r) for r in dead] == ["unrecoverable"]
    dead[0].headers["wk-error"].decode("utf-8")  # always valid UTF-8


@pytest.mark.parametrize(
    "src",
    [
        b'["t",0,[],[]]',
        b'["t",0,[0],[]]',
        b'["t",-1,[0],["x"]]',
        b'["t",0,[-5],["x"]]',
        b'["t",0,[0],[""]]',
    ],
)
async def test_a_wk_src_without_identity_is_a_malformed_header_not_an_applied_record(
    memory_log: Log, clock: FakeClock, tmp_path: Any, src: bytes
) -> None:
    from wakuwaku.inbox import SQLiteInbox

    inbox = SQLiteInbox(tmp_path / "inbox.db", "g")
    await inbox.ensure_schema()
    await setup_topic(memory_log)
    headers = build_headers(wk.event_type(Item), "a")
    headers["wk-src"] = src
    await memory_log.append("t", 0, [(headers, msgspec.json.encode(Item("a", 1)))])
    script = Script(clock)
    c = consumer(memory_log, clock, [Handler(Item, script, inbox=inbox)])
    stats = await c.drain()
    assert stats.inbox_skipped == 0
    assert [reason(r) for r in await dead_letters(memory_log)] == ["malformed_header"]


@pytest.mark.parametrize("mode", list(DeliveryMode))
async def test_a_graceful_stop_with_concurrent_keys_never_handles_twice_in_at_most_once(
    mode: DeliveryMode,
) -> None:
    log = wk.MemoryLog()
    await log.create_topic("t", 1)
    await wk.Producer(log, "t").publish_many([Item(f"k{n % 4}", n) for n in range(40)])
    handled: list[int] = []
    consumers: list[wk.Consumer] = []

    async def handle(run: Sequence[Item]) -> None:
        handled.extend(e.n for e in run)
        await asyncio.sleep(0)
        if len(handled) == 10:
            consumers[-1].stop()

    config = ConsumerConfig(
        topic="t",
        group="g",
        delivery_mode=mode,
        max_concurrency=2,
        member_id="m",
        poll_interval=0.01,
    )
    consumers.append(wk.Consumer(config, [Handler(Item, handle)], log))
    await consumers[-1].run(install_signal_handlers=False)
    consumers.append(wk.Consumer(config, [Handler(Item, handle)], log))
    await consumers[-1].drain()
    if mode is DeliveryMode.NO_DOUBLE_CONSUME:
        assert len(handled) == len(set(handled)), "an event was handled twice"
    else:
        assert set(handled) == set(range(40)), "an event was lost"


@pytest.mark.parametrize(
    "overrides",
    [
        {"retry_delays": [float("nan")]},
        {"retry_delays": [0.1, float("inf")]},
        {"retry_delays": "2,4"},
        {"retry_delays": 5},
        {"retry_delays": []},
        {"poll_interval": float("nan")},
        {"delivery_mode": "x"},
        {"classify": 5},
        {"member_id": ""},
        {"topic": None},
        {"partitions": [True]},
    ],
)
def test_bad_consumer_config_values_are_config_errors(overrides: dict[str, Any]) -> None:
    options: dict[str, Any] = {"topic": "t", "group": "g"}
    options.update(overrides)
    with pytest.raises(wk.ConfigError):
        ConsumerConfig(**options)


def test_bad_event_declarations_are_config_errors() -> None:
    class Thing(msgspec.Struct):
        k: str

    for kwargs in ({"key": 5}, {"key": "k", "id": "nope"}, {"key": "k", "combine": 5}):
        with pytest.raises(wk.ConfigError):
            wk.event("test.bad-declaration", registry=wk.Registry(), **kwargs)(Thing)
    with pytest.raises(wk.ConfigError):
        wk.event("has space", key="k", registry=wk.Registry())(Thing)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str exploded")


async def test_a_retryable_whose_cause_cannot_be_printed_is_still_retried(
    memory_log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(memory_log)
    await producer.publish(Item("a", 1))
    script = Script(clock)
    script.fail[1] = [wk.Retryable(Unprintable())]
    stats = await consumer(memory_log, clock, [Handler(Item, script)]).drain()
    assert script.handled_ns() == [1]  # handled on the retry attempt, not dead-lettered
    assert stats.quarantined_keys == 1
    assert await dead_letters(memory_log) == []


async def test_changing_the_props_a_handler_sees_changes_no_other_record(
    memory_log: Log, clock: FakeClock
) -> None:
    producer = await setup_topic(memory_log)
    await producer.publish(Item("a", 1), properties={"tenant": "acme"})
    await producer.publish(Item("b", 2))
    seen: list[dict[str, str]] = []

    async def handle(run: Sequence[Item]) -> None:
        props = wk.current_chunk().props[0]
        seen.append(dict(props))
        props["tenant"] = "mutated"

    await consumer(memory_log, clock, [Handler(Item, handle)]).drain()
    await consumer(memory_log, clock, [Handler(Item, handle)], group="again").drain()
    assert seen == [{"tenant": "acme"}, {}, {"tenant": "acme"}, {}]


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt()])
def test_a_handler_that_ends_the_process_is_logged_with_its_place(
    caplog: pytest.LogCaptureFixture, error: BaseException
) -> None:
    # A sync test: SystemExit and KeyboardInterrupt leave asyncio.run() itself.
    log = MemoryLog()

    async def handle(run: Sequence[Item]) -> None:
        if run[0].n == 2:
            raise error

    async def main() -> None:
        producer = await setup_topic(log)
        await producer.publish_many([Item("a", 1), Item("b", 2)])
        await consumer(log, FakeClock(1_700_000_000.0), [Handler(Item, handle)]).drain()

    with pytest.raises(type(error)):
        asyncio.run(main())
    (line,) = [r for r in caplog.records if "the consumer stops" in r.getMessage()]
    assert type(error).__name__ in line.getMessage()
    assert (line.topic, line.partition, line.key, line.offsets) == (  # type: ignore[attr-defined]
        "t",
        0,
        "b",
        [1],
    )
    assert asyncio.run(log.committed("g", "t", 0)) is None
