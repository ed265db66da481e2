"""End-to-end consumer throughput on the NATS JetStream log, next to nats-py's own loop.

A no-op handler over events on 1 000 keys and 4 partitions,
``max_poll_records`` at 500 and at its default (2 000), next to nats-py
alone reading the same streams: per partition stream a pull consumer
(``js.pull_subscribe``, no acks) fetched in batches of the poll size, each
message's msgpack envelope ``[headers, body]`` and its msgspec JSON body
decoded (the work the adapter has to do too). Target: at least 80 % of that
loop at 2 000.

Appends are slow on NATS (one publish and answer per record, a few thousand
per second), so the events are produced once (``--events``, default 50 000;
the SQLite, Redis and Kafka runs use 200 000) and every measurement reads
them again: each consumer run uses a fresh group and is paired with a
baseline run just before it; the median of ``--rounds`` (3) pairs is
printed.

Runs under its own stream prefix on the server at ``--url`` and deletes its
streams (the state bucket included) afterwards.

    python benchmarks/bench_nats.py [--url nats://127.0.0.1:4222] [--events N]
        [--keys K] [--partitions P] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
import uuid

import msgspec
import nats
from nats.js.api import AckPolicy, DeliverPolicy
from nats.js.api import ConsumerConfig as JsConsumerConfig

from _ticks import Tick, consume, fill
from wakuwaku.logs.nats import NatsLog


class Envelope(msgspec.Struct, array_like=True):
    """The adapter's message body: ``[headers, body, chunks]`` (docs/logs.md)."""

    headers: dict[str, bytes]
    body: bytes
    chunks: list[int] | None = None


async def raw_read(url: str, log: NatsLog, partitions: int, page: int) -> tuple[float, int]:
    """nats-py alone: a pull consumer per stream fetched in pages, every message decoded."""
    envelope = msgspec.msgpack.Decoder(Envelope)
    body = msgspec.json.Decoder(Tick)
    nc = await nats.connect(url, connect_timeout=5)
    js = nc.jetstream()
    started = time.perf_counter()
    count = 0
    for p in range(partitions):
        stream = log.stream_name("ticks", p)
        total = (await js.stream_info(stream)).state.messages
        config = JsConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
            mem_storage=True,
            inactive_threshold=60.0,
        )
        sub = await js.pull_subscribe(stream, stream=stream, config=config)
        read = 0
        while read < total:
            for msg in await sub.fetch(min(page, total - read), timeout=5):
                body.decode(envelope.decode(msg.data).body)
                read += 1
        await sub.unsubscribe()
        count += read
    elapsed = time.perf_counter() - started
    await nc.close()
    return elapsed, count


async def purge(url: str, prefix: str) -> None:
    """Delete every stream of ``prefix``: partitions, chunks, the state bucket."""
    nc = await nats.connect(url, connect_timeout=5)
    try:
        names: list[str] = []
        while True:
            msg = await nc.request(
                "$JS.API.STREAM.NAMES", json.dumps({"offset": len(names)}).encode(), timeout=5
            )
            answer = json.loads(msg.data)
            page = answer.get("streams") or []
            names += page
            if not page or len(names) >= int(answer.get("total", 0)):
                break
        for name in names:
            if name.startswith(f"{prefix}_") or name == f"KV_{prefix}_state":
                await nc.request(f"$JS.API.STREAM.DELETE.{name}", b"", timeout=5)
    finally:
        await nc.close()


async def main(url: str, events: int, keys: int, partitions: int, rounds: int) -> None:
    logging.basicConfig(level=logging.ERROR)
    prefix = f"wkbench-{uuid.uuid4().hex[:12]}"
    log = NatsLog(url, prefix=prefix)
    try:
        started = time.perf_counter()
        await fill(log, events, keys, partitions)
        elapsed = time.perf_counter() - started
        print(
            f"produced {events:,} events over {keys:,} keys, {partitions} partitions in "
            f"{elapsed:.1f} s ({events / elapsed:,.0f}/s); every run below reads all "
            f"{events:,}"
        )
        for poll in (500, 2000):
            pairs: list[tuple[float, float]] = []
            for n in range(rounds):
                raw, count = await raw_read(url, log, partitions, poll)
                assert count == events, count
                took, handled = await consume(log, f"g-{poll}-{n}", poll)
                assert handled == events, handled
                pairs.append((raw, took))
                print(
                    f"max_poll_records {poll}, round {n + 1}: consumer "
                    f"{events / took:,.0f} events/s, nats-py fetch+decode "
                    f"{events / raw:,.0f} events/s, share {raw / took:.0%}"
                )
            raw = statistics.median(r for r, _ in pairs)
            took = statistics.median(t for _, t in pairs)
            share = statistics.median(r / t for r, t in pairs)
            target = " (target >= 80 %)" if poll == 2000 else ""
            print(
                f"max_poll_records {poll}: median consumer {events / took:,.0f} events/s, "
                f"nats-py {events / raw:,.0f} events/s, median share {share:.0%}{target}"
            )
    finally:
        await log.close()
        await purge(url, prefix)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument(
        "--events",
        type=int,
        default=50_000,
        help="events produced once and read by every run (default 50 000)",
    )
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.events, args.keys, args.partitions, args.rounds))
