"""Fixtures for the Python code blocks of README.md and docs/*.md.

`pytest --markdown-docs` (pytest-markdown-docs) runs every ```python block
of those files as a test. Each block runs in a fresh
temporary directory. A block that needs an object a page cannot build in a
few lines names it as a fixture in its info string (```python fixture:redis);
the fixtures are here. A block marked ``notest`` must be a verbatim excerpt
of a file under examples/ (tests/test_docs.py checks it), and those files
run as tests themselves.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

REDIS_URL = "redis://127.0.0.1:6379/15"


def _is_markdown_block(request: pytest.FixtureRequest) -> bool:
    return Path(str(request.node.path)).suffix == ".md"


@pytest.fixture(autouse=True)
def _docs_block_in_tmp_dir(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A docs block writes its files (shop.db, budget.db) in a temporary directory
    and registers its event types in an empty registry, as a fresh program would
    (tests that ran before may hold the same type tags)."""
    if _is_markdown_block(request):
        import wakuwaku

        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(wakuwaku.default_registry, "_by_tag", {})


@pytest.fixture
async def consumer() -> AsyncIterator[Any]:
    """A consumer of topic ``payments`` on an in-memory log, for blocks that take one."""
    import msgspec

    import wakuwaku as wk

    class Payment(msgspec.Struct, frozen=True):
        account: str

    event = wk.event(f"docs.payment-{uuid.uuid4().hex}", key="account")(Payment)

    @wk.handler(event)
    async def ignore(run: Any) -> None:
        return None

    log = wk.MemoryLog()
    await log.create_topic("payments", 1)
    yield wk.Consumer(wk.ConsumerConfig(topic="payments", group="docs"), [ignore], log)
    await log.close()


@pytest.fixture
async def redis() -> AsyncIterator[Any]:
    """A client of the shared test Redis (database 15); the keys it wrote are deleted after."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL, socket_timeout=5)
    try:
        await client.ping()
    except OSError as error:  # the service markers' rule: fail in CI, skip locally
        import os

        if os.environ.get("CI") == "true":
            raise
        pytest.skip(
            f"Redis is not answering at {REDIS_URL}: {error} (start it with: make services)"
        )
    before = {key async for key in client.scan_iter(match="wk:budget:*")}
    yield client
    written = [key async for key in client.scan_iter(match="wk:budget:*") if key not in before]
    if written:
        await client.delete(*written)
    await client.aclose()
