"""The log contract on :class:`wakuwaku.logs.redis.RedisLog`, and what only Redis has.

Every test uses its own key prefix on the shared server and deletes its keys
afterwards (other developers' runs use the same server at the same time).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from wakuwaku import (
    ConfigError,
    LogError,
    LogUnavailableError,
    Record,
    open_log,
    partition_for,
)
from wakuwaku.logs import Log
from wakuwaku.logs.redis import PASSWORD_ENV, RedisLog

from ..conftest import REDIS_URL
from ..ports import free_port
from .contract import LogContract

pytestmark = pytest.mark.redis


async def purge(url: str, prefix: str) -> None:
    """Delete every key of ``prefix`` (the log's own and its tagged ones)."""
    client = aioredis.Redis.from_url(url)
    try:
        for pattern in (f"{prefix}:*", f"{{{prefix}:*"):
            keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
            if keys:
                await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture
async def redis_log() -> AsyncIterator[RedisLog]:
    prefix = f"wktest-{uuid.uuid4().hex}"
    log = RedisLog(REDIS_URL, prefix=prefix)
    try:
        yield log
    finally:
        await log.close()
        await purge(REDIS_URL, prefix)


class TestRedisLog(LogContract):
    multiprocess = True

    @pytest.fixture
    async def log(self, redis_log: RedisLog) -> AsyncIterator[Log]:
        yield redis_log


HEADERS = {"wk-v": b"1", "wk-type": b"t", "wk-key": b"k", "wk-alg": b"plain"}


# -- URLs and secrets ---------------------------------------------------------


def test_url_options_and_the_password_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    log = RedisLog("redis://user:s3cret@127.0.0.1:6390/3?prefix=app1&timeout=0.5")
    # The URL another process opens the same log with: its options kept (the
    # timeout was dropped), its password never.
    assert (log.url, log.prefix, log.timeout) == (
        "redis://127.0.0.1:6390/3?prefix=app1&timeout=0.5",
        "app1",
        0.5,
    )
    assert "s3cret" not in repr(log) and "s3cret" not in log.url
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert open_log("rediss://localhost").url == "rediss://localhost:6379/0"
    for bad, why in [
        ("redis://h/x", "db number"),
        ("redis://h/0?fsync=1", "unknown option"),
        ("redis://:pw@h/0?timeout=0", "timeout"),
        ("redis:///0", "redis://host"),
        ("redis://h/0?prefix=a{b", "prefix"),
    ]:
        with pytest.raises(ConfigError, match=why) as caught:
            RedisLog(bad)
        assert "pw@" not in str(caught.value)


async def test_an_unreachable_server_is_unavailable_at_once_without_the_password() -> None:
    port = free_port()
    log = RedisLog(f"redis://:s3cret@127.0.0.1:{port}/0?timeout=1")
    started = time.monotonic()
    for call in (
        log.list_topics(),
        log.read("t", 0, 0, wait=5.0),
        log.commit("g", "t", 0, 1),
        log.append("t", 0, [(HEADERS, b"x")]),
    ):
        with pytest.raises(LogUnavailableError) as caught:
            await call
        assert "s3cret" not in str(caught.value)
        assert f"127.0.0.1:{port}" in str(caught.value)
    assert time.monotonic() - started < 5.0
    await log.close()
    with pytest.raises(LogError, match="closed"):
        await log.list_topics()


async def test_a_wrong_password_is_a_log_error_that_does_not_show_it() -> None:
    async with RedisLog(REDIS_URL.replace("redis://", "redis://nobody:wr0ng-pw@")) as log:
        with pytest.raises(LogError) as caught:
            await log.list_topics()
    assert "wr0ng-pw" not in str(caught.value)


# -- lost replies and cancelled reads -----------------------------------------


async def test_an_append_whose_reply_was_lost_is_stored_once(
    redis_log: RedisLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    await redis_log.create_topic("orders", 1)
    real = redis_log._write
    sent: list[int] = []

    async def lose_first_reply(keys: Any, args: Any) -> Any:
        reply = await real(keys, args)
        sent.append(1)
        if len(sent) == 1:
            raise redis_errors.ConnectionError("connection reset after the script ran")
        return reply

    monkeypatch.setattr(redis_log, "_write", lose_first_reply)
    assert await redis_log.append("orders", 0, [(HEADERS, b"a"), (HEADERS, b"b")]) == [0, 1]
    assert len(sent) == 2  # sent again on a new connection...
    records = await redis_log.read("orders", 0, 0)
    assert [r.body for r in records] == [b"a", b"b"]  # ...and stored once
    assert await redis_log.append("orders", 0, [(HEADERS, b"c")]) == [2]


async def test_cancelled_reads_leave_no_stray_reply_on_the_pool(redis_log: RedisLog) -> None:
    await redis_log.create_topic("orders", 1)
    await redis_log.create_topic("empty", 1)
    await redis_log.append("orders", 0, [(HEADERS, b"%d" % i) for i in range(300)])
    await redis_log.commit("g", "orders", 0, 7)
    rng = random.Random(13)
    for _ in range(60):
        topic = rng.choice(["orders", "empty"])
        reader = asyncio.create_task(redis_log.read(topic, 0, 0, max_records=300, wait=1.0))
        await asyncio.sleep(rng.random() * 0.003)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        # Every later reply answers its own command.
        assert await redis_log.committed("g", "orders", 0) == 7
        page = await redis_log.read("orders", 0, 5, max_records=2)
        assert [r.body for r in page] == [b"5", b"6"]


# -- hostile keys and headers ---------------------------------------------------

HOSTILE = [
    "{tag}",
    "}{",
    "a b",
    "line\nbreak",
    "nul\x00byte",
    "🎉emoji🎉",
    "x" * 1000,
    "{" * 3 + "}" * 2,
    "",
]


async def test_hostile_keys_topics_and_headers_round_trip_in_per_key_order(
    redis_log: RedisLog,
) -> None:
    topics = ["a{b}c", "}{", "plain"]
    for topic in topics:
        await redis_log.create_topic(topic, 4)
    keys = [k for k in HOSTILE if k]
    expected: dict[tuple[str, str], list[int]] = {}
    for n in range(200):
        key, topic = keys[n % len(keys)], topics[n % len(topics)]
        partition = partition_for(key, 4)
        props = json.dumps({"v": HOSTILE[n % len(HOSTILE)]}).encode()
        headers = {
            **HEADERS,
            "wk-key": key.encode(),
            "wk-props": props,
            "{x} y\n\x00🎉": HOSTILE[n % len(HOSTILE)].encode(),
        }
        await redis_log.append(topic, partition, [(headers, b"%d" % n)])
        expected.setdefault((topic, key), []).append(n)
    seen: dict[tuple[str, str], list[int]] = {}
    for topic in topics:
        for partition in range(4):
            for record in await read_everything(redis_log, topic, partition):
                key = record.headers["wk-key"].decode()
                assert partition_for(key, 4) == partition
                n = int(record.body)
                assert record.headers["{x} y\n\x00🎉"] == HOSTILE[n % len(HOSTILE)].encode()
                assert json.loads(record.headers["wk-props"]) == {"v": HOSTILE[n % len(HOSTILE)]}
                seen.setdefault((topic, key), []).append(n)
    assert seen == expected


async def test_topic_names_that_look_like_key_parts_stay_apart(redis_log: RedisLog) -> None:
    # Without the length in the hash tag these would share keys.
    await redis_log.create_topic("a:0}:off", 2)
    await redis_log.create_topic("a", 1)
    await redis_log.append("a:0}:off", 1, [(HEADERS, b"long")])
    await redis_log.append("a", 0, [(HEADERS, b"short")])
    await redis_log.commit("g", "a", 0, 1)
    assert [r.body for r in await redis_log.read("a", 0, 0)] == [b"short"]
    assert [r.body for r in await redis_log.read("a:0}:off", 1, 0)] == [b"long"]
    assert await redis_log.committed("g", "a:0}:off", 1) is None


async def read_everything(log: Log, topic: str, partition: int) -> list[Record]:
    out: list[Record] = []
    while page := await log.read(topic, partition, out[-1].offset + 1 if out else 0, 100):
        out.extend(page)
    return out


@pytest.mark.parametrize("main", ["orders", "shop.orders", "a.wk-retry.b.c"])
def test_a_partitions_retry_and_dead_letter_keys_share_its_cluster_slot(main: str) -> None:
    """A store writes a group's retry and dead-letter
    partitions under the main partition's lease in one script, so on a Redis
    Cluster their keys must hash to one slot."""
    from redis.crc import key_slot

    from wakuwaku.engine import ConsumerConfig

    log = RedisLog("redis://127.0.0.1:6379/15?prefix=slot-test")
    config = ConsumerConfig(topic=main, group="billing")
    family = [
        main,
        config.retry_topic(main),
        config.dead_letter_topic(main),
        f"wk-replayed.billing.{main}",
    ]
    for partition in (0, 3):
        keys = [f"{log._tag(topic, partition)}:lease" for topic in family]
        assert len(set(keys)) == len(family)  # one key per topic, still
        assert len({key_slot(key.encode()) for key in keys}) == 1, keys
    assert log._tag(main, 0) != log._tag(main, 1)
