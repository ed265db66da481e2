"""The log contract on :class:`wakuwaku.logs.redis.RedisLog`, and what only Redis has.

Every test uses its own key prefix on the shared server and deletes its keys
afterwards (other developers' runs use the same server at the same time).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from wakuwaku.logs import Log
from wakuwaku.logs.redis import RedisLog

from ..conftest import REDIS_URL
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
