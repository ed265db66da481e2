"""Shared fixtures: service checks and the fake clock.

Service markers (``redis``, ``nats``, ``postgres``, ``kafka``): locally a
missing service skips its tests with a reason that names ``make services``
(which installs and starts them, ``ci/services.sh``); with ``CI=true`` a
missing service is a failure, never a skip (the dramatiq ``check_redis``
pattern).
"""

from __future__ import annotations

import os
import socket

import pytest

SERVICES: dict[str, tuple[str, int]] = {
    "redis": ("127.0.0.1", 6379),
    "nats": ("127.0.0.1", 4222),
    "postgres": ("127.0.0.1", 5432),
    "kafka": ("127.0.0.1", 9092),
}

REDIS_URL = os.environ.get("WAKUWAKU_TEST_REDIS", "redis://127.0.0.1:6379/15")
NATS_URL = os.environ.get("WAKUWAKU_TEST_NATS", "nats://127.0.0.1:4222")
POSTGRES_DSN = os.environ.get("WAKUWAKU_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
KAFKA_BOOTSTRAP = os.environ.get("WAKUWAKU_TEST_KAFKA", "127.0.0.1:9092")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str) -> None:
    """Skip (locally) or fail (CI=true) when service ``name`` is not reachable."""
    host, port = SERVICES[name]
    if _reachable(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{message}; CI must run every service test", pytrace=False)
    pytest.skip(f"{message} (start it with: make services)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for name in SERVICES:
        if item.get_closest_marker(name) is not None:
            require_service(name)
