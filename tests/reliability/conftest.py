"""Fixtures for the reliability tests: a Redis client on db 15 with a unique
key prefix per test, and a Redis server owned by one test (for restarts)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL
from tests.faults.servers import RedisServer


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test (or engineer) uses."""
    return f"wktest-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis_client(prefix: str) -> AsyncIterator[object]:
    """A ``redis.asyncio.Redis`` on the shared server, db 15; deletes this test's keys after."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        yield client
    finally:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server for tests that kill and restart it; it keeps
    nothing (no persistence), so a restart comes back empty."""
    server = RedisServer(tmp_path / "redis", durable=False)
    server.start()
    try:
        yield server
    finally:
        server.close()
