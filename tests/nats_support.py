"""NATS test kit: a log under a fresh prefix on the shared server, removed afterwards.

The shared server on 127.0.0.1:4222 serves other developers' runs at the same
time, so every test works under its own prefix (``t`` + 12 hex digits) and
deletes every stream it made, the state bucket included.
"""

from __future__ import annotations

import json
import uuid

import nats

from wakuwaku.logs.nats import NatsLog

from .conftest import NATS_URL


def fresh_prefix() -> str:
    return "t" + uuid.uuid4().hex[:12]


async def drop_prefix(url: str, prefix: str) -> int:
    """Delete every stream of ``prefix`` (partitions, chunks, bucket); returns how many."""
    nc = await nats.connect(url, connect_timeout=5)
    try:
        names: list[str] = []
        offset = 0
        while True:
            msg = await nc.request(
                "$JS.API.STREAM.NAMES", json.dumps({"offset": offset}).encode(), timeout=5
            )
            answer = json.loads(msg.data)
            page = answer.get("streams") or []
            names += page
            offset += len(page)
            if not page or offset >= int(answer.get("total", 0)):
                break
        mine = [n for n in names if n.startswith(f"{prefix}_") or n == f"KV_{prefix}_state"]
        for name in mine:
            await nc.request(f"$JS.API.STREAM.DELETE.{name}", b"", timeout=5)
        return len(mine)
    finally:
        await nc.close()


def nats_log(prefix: str, url: str = NATS_URL, **options: object) -> NatsLog:
    return (
        NatsLog.from_url(f"{url}?prefix={prefix}")
        if not options
        else NatsLog(url, prefix=prefix, **options)  # type: ignore[arg-type]
    )
