"""Wait for out-of-band job results in Redis (docs/reliability.md, design §10).

A compute worker (here a task in the same process) finishes jobs and
publishes their results; the consumer waits for each one and reacts to the
outcome. Run against a Redis you may write to::

    python examples/reliability/wait_for_result.py [REDIS_URL]

(default ``redis://127.0.0.1:6379/15``; keys use a fresh prefix and are
deleted at the end).
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import redis.asyncio as aioredis

from wakuwaku import ProtocolError, StepError
from wakuwaku.reliability import (
    ReadMode,
    ResultTimeoutError,
    delete_result,
    publish_result,
    result_key,
    wait_for_result,
)


async def worker(redis: aioredis.Redis, prefix: str) -> None:
    """The other side: runs jobs and publishes results (key + nudge, one round trip)."""
    await publish_result(redis, "job-1", "thumbnail", "done", content={"width": 320}, prefix=prefix)
    await publish_result(
        redis,
        "job-2",
        "thumbnail",
        "error",
        message="GPU out of memory",
        retryable=True,
        prefix=prefix,
    )
    # A broken producer writes something that is not the contract at all.
    await redis.set(result_key("job-3", "thumbnail", prefix=prefix), b"Segmentation fault")


async def main(url: str = "redis://127.0.0.1:6379/15") -> None:
    redis = aioredis.Redis.from_url(url, socket_timeout=5)
    prefix = f"example-{uuid.uuid4().hex[:8]}"
    try:
        producer = asyncio.create_task(worker(redis, prefix))

        # Non-destructive (default): read, commit our own state, then ack.
        result = await wait_for_result(redis, "job-1", "thumbnail", timeout=10, prefix=prefix)
        print(f"job-1 done: {result.content}")
        await result.ack()  # after our commit; a crash before it means a re-read, not a loss

        try:
            await wait_for_result(redis, "job-2", "thumbnail", timeout=10, prefix=prefix)
        except StepError as error:
            print(f"job-2 failed: {error.message} (retryable={error.retryable})")
            await delete_result(redis, "job-2", "thumbnail", prefix=prefix)

        # Destructive: the read consumes the payload, so a bad one fails at once.
        try:
            await wait_for_result(
                redis,
                "job-3",
                "thumbnail",
                timeout=10,
                mode=ReadMode.DESTRUCTIVE,
                prefix=prefix,
            )
        except ProtocolError as error:
            print(f"job-3 broke the contract: {error.reason}")

        try:
            await wait_for_result(
                redis, "job-4", "thumbnail", timeout=0.3, poll_interval=0.1, prefix=prefix
            )
        except ResultTimeoutError:
            print("job-4: no result within 0.3 s")
        await producer
    finally:
        keys = [key async for key in redis.scan_iter(match=f"{prefix}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:2]))
