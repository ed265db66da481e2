"""Fixtures for the reliability tests: a Redis client on db 15 with a unique
key prefix per test, and a Redis server owned by one test (for restarts)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.conftest import REDIS_URL


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnRedis:
    """A redis-server on a loopback port, started and stopped by one test only."""

    def __init__(self, binary: str, port: int) -> None:
        self.binary = binary
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert self.process is None, "already running"
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10.0
        while True:  # waiting for real I/O: the server to accept connections
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill this server (SIGKILL: nothing is saved, clients see a reset)."""
        if self.process is None:
            return
        self.process.kill()
        self.process.wait(timeout=10)
        self.process = None


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    """A private redis-server for tests that stop and restart it."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("redis-server binary not found; CI must run every service test")
        pytest.skip("redis-server binary not found")
    server = OwnRedis(binary, _free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
