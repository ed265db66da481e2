"""End-to-end consumer throughput on the Redis log, next to redis-py's own read loop.

A no-op handler over 200 000 events on 1 000 keys and 4
partitions, ``max_poll_records`` at 500 and at its default (2 000), next to
(a) redis-py reading the same streams with ``XRANGE ... COUNT <page>`` and
decoding every body with msgspec (target: at least 70 % of (a) at 2 000),
and (b) FastStream's Redis Streams batch subscriber (consumer group, one
subscriber per stream, ``max_records`` = the page size, a no-op handler
typed with a pydantic model, acking each batch) over copies of the same
four streams in FastStream's message format, timed from ``broker.start()``
until every event was handled (target: at least 2 x (b) at 2 000).
FastStream is optional (``pip install 'wakuwaku[bench]'``): without it the
(b) column is skipped with a note.

Runs on its own key prefix on the Redis at ``--url`` and deletes its keys
afterwards.

    python benchmarks/bench_redis.py [--url redis://127.0.0.1:6379/15] [--events N]
        [--keys K] [--partitions P] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

import msgspec
import redis.asyncio as aioredis

try:
    import pydantic
    from faststream.redis import RedisBroker, StreamSub
except ImportError:  # the optional peer baseline
    HAVE_FASTSTREAM = False
else:
    HAVE_FASTSTREAM = True

from _args import add_workload
from _ticks import Tick, consume, fill, verdict
from wakuwaku.logs.redis import RedisLog

NO_LOGGER: Any = None
"""FastStream's ``logger``: None turns its logging off (its type says a logger)."""

Entries = list[tuple[bytes, dict[bytes, bytes]]]


async def xrange_page(
    client: aioredis.Redis, stream: str, start: bytes | str, page: int
) -> Entries:
    """One XRANGE page, typed as a client without ``decode_responses`` returns it."""
    return cast(Entries, await client.xrange(stream, start, "+", page))


async def raw_read(url: str, log: RedisLog, partitions: int, page: int) -> tuple[float, int]:
    """redis-py alone: XRANGE pages of every stream, each body decoded."""
    client: aioredis.Redis = aioredis.Redis.from_url(url)
    decoder = msgspec.json.Decoder(Tick)
    started = time.perf_counter()
    count = 0
    for p in range(partitions):
        stream = f"{log._tag('ticks', p)}:s"
        start: bytes | str = "-"
        while entries := await xrange_page(client, stream, start, page):
            for _ident, fields in entries:
                decoder.decode(fields[b"b"])
            count += len(entries)
            start = b"(" + entries[-1][0]
    elapsed = time.perf_counter() - started
    await client.aclose()
    return elapsed, count


class TickModel(pydantic.BaseModel if HAVE_FASTSTREAM else object):  # type: ignore[misc]
    key: str
    n: int
    payload: str


def fs_stream(prefix: str, partition: int) -> str:
    return f"{prefix}:fs:{partition}"


async def fill_faststream(url: str, log: RedisLog, prefix: str, partitions: int) -> None:
    """Copy every stream's bodies, in order, into FastStream-format streams."""
    client: aioredis.Redis = aioredis.Redis.from_url(url)
    broker = RedisBroker(url, logger=NO_LOGGER)
    await broker.connect()
    for p in range(partitions):
        stream = f"{log._tag('ticks', p)}:s"
        start: Any = "-"
        while entries := await xrange_page(client, stream, start, 2000):
            connection = broker._connection
            assert connection is not None, "connected above"
            async with connection.pipeline() as pipe:
                for _ident, fields in entries:
                    await broker.publish(
                        fields[b"b"],
                        stream=fs_stream(prefix, p),
                        pipeline=pipe,
                        headers={"content-type": "application/json"},
                    )
                await pipe.execute()
            start = b"(" + entries[-1][0]
    await broker.stop()
    await client.aclose()


async def faststream_read(
    url: str, prefix: str, partitions: int, events: int, group: str, page: int
) -> float:
    """FastStream's batch subscribers until every event was handled."""
    broker = RedisBroker(url, logger=NO_LOGGER)
    done = asyncio.Event()
    seen = 0
    for p in range(partitions):

        @broker.subscriber(
            stream=StreamSub(
                fs_stream(prefix, p),
                group=group,
                consumer="c1",
                batch=True,
                max_records=page,
                last_id="0",
            )
        )
        async def handle(batch: list[TickModel]) -> None:
            nonlocal seen
            seen += len(batch)
            if seen >= events:
                done.set()

    started = time.perf_counter()
    await broker.start()
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - started
    await broker.stop()
    assert seen == events, seen
    return elapsed


async def purge(url: str, prefix: str) -> None:
    client: aioredis.Redis = aioredis.Redis.from_url(url)
    for pattern in (f"{prefix}:*", f"{{{prefix}:*"):
        keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
        for i in range(0, len(keys), 1000):
            await client.delete(*keys[i : i + 1000])
    await client.aclose()


async def main(url: str, events: int, keys: int, partitions: int, rounds: int) -> None:
    logging.basicConfig(level=logging.ERROR)
    prefix = f"wkbench-{uuid.uuid4().hex}"
    log = RedisLog(url, prefix=prefix)
    try:
        started = time.perf_counter()
        await fill(log, events, keys, partitions)
        print(f"filled {events} events in {time.perf_counter() - started:.1f} s")
        if not HAVE_FASTSTREAM:
            print(
                "FastStream is not installed (pip install 'wakuwaku[bench]'): its column is skipped"
            )
        else:
            started = time.perf_counter()
            await fill_faststream(url, log, prefix, partitions)
            print(f"copied them to FastStream streams in {time.perf_counter() - started:.1f} s")
        for poll in (500, 2000):
            shares, versus = [], []
            for n in range(rounds):
                raw, count = await raw_read(url, log, partitions, poll)
                assert count == events, count
                elapsed, handled = await consume(log, f"g-{poll}-{n}", poll)
                assert handled == events, handled
                shares.append(raw / elapsed)
                line = (
                    f"max_poll_records {poll}, round {n + 1}: consumer "
                    f"{events / elapsed:,.0f} events/s, redis-py XRANGE+decode "
                    f"{events / raw:,.0f} events/s, share {raw / elapsed:.0%}"
                )
                if HAVE_FASTSTREAM:
                    fs = await faststream_read(
                        url, prefix, partitions, events, f"fs-{poll}-{n}", poll
                    )
                    versus.append(fs / elapsed)
                    line += (
                        f", FastStream {events / fs:,.0f} events/s, "
                        f"consumer/FastStream {fs / elapsed:.2f}x"
                    )
                print(line)
            share = statistics.median(shares)
            print(
                f"max_poll_records {poll}: median share {share:.0%}, best {max(shares):.0%}"
                + (f" (target >= 70 %): {verdict(share, 0.7)}" if poll == 2000 else "")
            )
            if versus:
                ratio = statistics.median(versus)
                print(
                    f"max_poll_records {poll}: median consumer/FastStream "
                    f"{ratio:.2f}x, best {max(versus):.2f}x"
                    + (f" (target >= 2x): {verdict(ratio, 2.0)}" if poll == 2000 else "")
                )
    finally:
        await log.close()
        await purge(url, prefix)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    add_workload(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.url, args.events, args.keys, args.partitions, args.rounds))
