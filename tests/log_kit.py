"""A fresh, empty log of each engine for a test, and its cleanup afterwards.

The servers (Redis, NATS, Kafka, Iggy) are shared with other runs, so each
log gets a namespace of its own (a key prefix, a stream prefix, a topic and
group prefix, an Iggy stream) that is deleted when the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import wakuwaku as wk
from wakuwaku.logs import Log

ENGINES = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("nats", marks=pytest.mark.nats),
    pytest.param("kafka", marks=pytest.mark.kafka),
    pytest.param("iggy", marks=pytest.mark.iggy),
]
"""Every log, for ``pytest.fixture(params=...)``; each server's marks its test."""


@contextlib.asynccontextmanager
async def fresh_log(engine: str, tmp_path: Path) -> AsyncIterator[Log]:
    """A new empty log of ``engine`` (one of :data:`ENGINES`), closed and
    deleted on exit. Another process (or a CLI command) opens the same log
    with ``log.url``."""
    prefix = None
    if engine == "memory":
        created: Log = wk.MemoryLog()
    elif engine == "sqlite":
        from wakuwaku.logs.sqlite import SQLiteLog

        created = SQLiteLog(tmp_path / "log.db")
    elif engine == "redis":
        from wakuwaku.logs.redis import RedisLog

        from .conftest import REDIS_URL

        prefix = f"wktest-{uuid.uuid4().hex}"
        created = RedisLog(REDIS_URL, prefix=prefix)
    elif engine == "kafka":
        from .kafka_support import fresh_prefix as kafka_prefix
        from .kafka_support import kafka_log

        prefix = kafka_prefix()
        created = kafka_log(prefix)
    elif engine == "iggy":
        from .iggy_support import fresh_stream, iggy_log

        prefix = fresh_stream()
        created = iggy_log(prefix)
    else:
        from .nats_support import fresh_prefix, nats_log

        prefix = fresh_prefix()
        created = nats_log(prefix)
    try:
        yield created
    finally:
        await created.close()
        if prefix is not None:
            await _drop(engine, prefix)


async def _drop(engine: str, prefix: str) -> None:
    if engine == "kafka":
        from .kafka_support import drop_prefix as drop_kafka_prefix

        await asyncio.to_thread(drop_kafka_prefix, prefix)
    elif engine == "iggy":
        from .iggy_support import drop_stream

        await drop_stream(prefix)
    elif engine == "redis":
        from .conftest import REDIS_URL
        from .logs.test_redis import purge

        await purge(REDIS_URL, prefix)
    else:
        from .conftest import NATS_URL
        from .nats_support import drop_prefix

        await drop_prefix(NATS_URL, prefix)
