"""Result-waiter latency on the local Redis, next to a raw redis-py baseline.

What is timed, per round trip (all on 127.0.0.1, db 15, keys under a fresh
prefix that is deleted at the end):

* ``raw SET+PUBLISH -> GET``: a subscriber is already confirmed on the
  channel; the clock starts, a MULTI/EXEC pipeline does SET + PUBLISH, the
  subscriber receives the message and GETs the key; the clock stops. No
  wakuwaku code at all.
* ``waiter <mode>``: a :func:`wait_for_result` task is already subscribed
  (its observer says so) and has done its first read; the clock starts,
  :func:`publish_result` runs (one Lua script: SET + PUBLISH), the waiter
  wakes on the nudge, reads, parses and returns; the clock stops.
  ``poll_interval`` is 60 s, so only nudges can end a wait.
* ``waiter call, result already there``: the whole cost of one call whose
  result is already stored (subscribe, confirm, read, parse, tear down).

Run::

    python benchmarks/bench_waiter.py [ROUNDS] [REDIS_URL]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

import redis.asyncio as aioredis

from _args import positive_int
from wakuwaku.reliability.waiter import (
    ReadMode,
    Verdict,
    WaitObserver,
    publish_result,
    result_key,
    wait_for_result,
)

PAYLOAD = b'{"status":"done","content":{"pages":3}}'


def summary(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return (
        f"{name:<40} n={len(ms):<5} median {statistics.median(ms):7.3f} ms"
        f"   p99 {p99:7.3f} ms   mean {statistics.fmean(ms):7.3f} ms"
    )


async def raw_round_trip(redis: aioredis.Redis, prefix: str, i: int) -> float:
    key, channel = f"{prefix}:raw:{i}", f"{prefix}:rawnudge:{i}"
    pubsub = redis.pubsub()
    await pubsub.subscribe(channel)
    while (await pubsub.get_message(timeout=None) or {}).get("type") != "subscribe":
        pass
    start = time.perf_counter()
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(key, PAYLOAD, px=60_000)
        pipe.publish(channel, b"done")
        await pipe.execute()
    while (await pubsub.get_message(timeout=None) or {}).get("type") != "message":
        pass
    value = await redis.get(key)
    elapsed = time.perf_counter() - start
    assert value == PAYLOAD
    close: Callable[[], Awaitable[None]] = pubsub.aclose  # untyped in older redis-py
    await close()
    return elapsed


class FirstRead(WaitObserver):
    def __init__(self) -> None:
        self.event = asyncio.Event()

    def read(self, job_id: str, step: str, verdict: Verdict) -> None:
        self.event.set()


def waiter_round_trip(mode: ReadMode) -> Callable[[aioredis.Redis, str, int], Awaitable[float]]:
    async def one(redis: aioredis.Redis, prefix: str, i: int) -> float:
        job = f"job-{i}"
        first_read = FirstRead()
        waiting = asyncio.create_task(
            wait_for_result(
                redis,
                job,
                "bench",
                30,
                mode=mode,
                poll_interval=60,
                prefix=prefix,
                observer=first_read,
            )
        )
        await first_read.event.wait()  # subscribed and found nothing yet
        start = time.perf_counter()
        await publish_result(redis, job, "bench", "done", content={"pages": 3}, prefix=prefix)
        result = await waiting
        elapsed = time.perf_counter() - start
        assert result.content == {"pages": 3}
        await result.ack()
        return elapsed

    return one


async def call_with_result_present(redis: aioredis.Redis, prefix: str, i: int) -> float:
    job = f"ready-{i}"
    await redis.set(result_key(job, "bench", prefix=prefix), PAYLOAD, px=60_000)
    start = time.perf_counter()
    result = await wait_for_result(redis, job, "bench", 30, poll_interval=60, prefix=prefix)
    elapsed = time.perf_counter() - start
    await result.ack()
    return elapsed


async def measure(
    redis: aioredis.Redis,
    prefix: str,
    rounds: int,
    one: Callable[[aioredis.Redis, str, int], Awaitable[float]],
) -> list[float]:
    for i in range(20):  # warm-up: connections, script cache
        await one(redis, f"{prefix}w", i)
    return [await one(redis, prefix, i) for i in range(rounds)]


async def main(rounds: int = 500, url: str = "redis://127.0.0.1:6379/15") -> None:
    redis = aioredis.Redis.from_url(url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        print(f"result waiter latency, publish -> return, {rounds} round trips, {url}")
        cases: list[tuple[str, Callable[[aioredis.Redis, str, int], Awaitable[float]]]] = [
            ("baseline: raw SET+PUBLISH -> GET", raw_round_trip),
            ("waiter non_destructive (GET)", waiter_round_trip(ReadMode.NON_DESTRUCTIVE)),
            ("waiter destructive (EXISTS+GETDEL)", waiter_round_trip(ReadMode.DESTRUCTIVE)),
            ("waiter call, result already there", call_with_result_present),
        ]
        for name, one in cases:
            print(summary(name, await measure(redis, prefix, rounds, one)))
    finally:
        keys = [key async for key in redis.scan_iter(match=f"{prefix}*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "rounds", nargs="?", type=positive_int, default=500, help="round trips per case"
    )
    parser.add_argument("url", nargs="?", default="redis://127.0.0.1:6379/15", help="Redis URL")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.rounds, args.url))
