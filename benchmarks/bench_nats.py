"""End-to-end consumer throughput on the NATS JetStream log, next to nats-py's own loop.

A no-op handler over events on 1 000 keys and 4 partitions,
``max_poll_records`` at 500 and at its default (2 000), next to nats-py
alone reading the same streams: per partition stream a pull consumer
(``js.pull_subscribe``, no acks; the streams read at once, as the consumer
reads its partitions) fetched in batches of the poll size, each
message's msgpack envelope ``[headers, body]`` and its msgspec JSON body
decoded (the work the adapter has to do too). Target: at least 80 % of that
loop at 2 000. Next to it, FastStream's NATS JetStream batch subscriber
(a durable pull consumer per stream, ``PullSub(batch_size=<page>,
timeout=0.1, batch=True)``, ``max_ack_pending`` of 4 pages, a no-op
handler typed with a pydantic model, FastStream's default acks) over
copies of the same bodies in streams of its own, timed from
``broker.start()`` until every event was handled (target: the
consumer at least 2 x as fast at 2 000). FastStream is optional (``pip
install 'wakuwaku[bench]'``): without it that column is skipped with a note.

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
from collections.abc import Sequence
from typing import Any

import msgspec
import nats
from nats.js.api import AckPolicy, DeliverPolicy, StreamConfig
from nats.js.api import ConsumerConfig as JsConsumerConfig

try:
    import pydantic
    from faststream.nats import JStream, NatsBroker, PullSub
except ImportError:  # the optional peer baseline
    HAVE_FASTSTREAM = False
else:
    HAVE_FASTSTREAM = True

from _args import add_workload
from _ticks import Tick, consume, fill, verdict
from wakuwaku.logs.nats import NatsLog

NO_LOGGER: Any = None
"""FastStream's ``logger``: None turns its logging off (its type says a logger)."""


class Envelope(msgspec.Struct, array_like=True):
    """The adapter's message body: ``[headers, body, chunks]`` (docs/logs.md)."""

    headers: dict[str, bytes]
    body: bytes
    chunks: list[int] | None = None


async def raw_read(url: str, log: NatsLog, partitions: int, page: int) -> tuple[float, int]:
    """nats-py alone: a pull consumer per stream fetched in pages, every
    message decoded, the streams read at once (as the consumer reads its
    partitions)."""
    envelope = msgspec.msgpack.Decoder(Envelope)
    body = msgspec.json.Decoder(Tick)
    nc = await nats.connect(url, connect_timeout=5)
    js = nc.jetstream()

    async def one(p: int) -> int:
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
        return read

    started = time.perf_counter()
    count = sum(await asyncio.gather(*(one(p) for p in range(partitions))))
    elapsed = time.perf_counter() - started
    await nc.close()
    return elapsed, count


class TickModel(pydantic.BaseModel if HAVE_FASTSTREAM else object):  # type: ignore[misc]
    """The event as FastStream's handler gets it: every field of ``Tick``."""

    key: str
    n: int
    payload: str


def fs_stream(prefix: str, partition: int) -> tuple[str, str]:
    """The name and subject of one partition's FastStream copy."""
    return f"{prefix}_fs{partition}", f"{prefix}.fs.{partition}"


async def fill_faststream(url: str, log: NatsLog, prefix: str, partitions: int) -> None:
    """Copy every partition's bodies, in order, into a plain JetStream stream,
    as FastStream publishes them (the JSON body, a content type and a
    correlation id)."""
    envelope = msgspec.msgpack.Decoder(Envelope)
    nc = await nats.connect(url, connect_timeout=5)
    js = nc.jetstream()
    for p in range(partitions):
        source = log.stream_name("ticks", p)
        total = (await js.stream_info(source)).state.messages
        name, subject = fs_stream(prefix, p)
        await js.add_stream(StreamConfig(name=name, subjects=[subject]))
        config = JsConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        sub = await js.pull_subscribe(source, stream=source, config=config)
        copied = 0
        while copied < total:
            page = await sub.fetch(min(2000, total - copied), timeout=5)
            # The headers FastStream's own publisher writes.
            headers = [
                {"content-type": "application/json", "correlation_id": str(uuid.uuid4())}
                for _ in page
            ]
            acks = [
                await js.publish_async(subject, envelope.decode(msg.data).body, headers=h)
                for msg, h in zip(page, headers, strict=True)
            ]
            await asyncio.gather(*acks)
            copied += len(page)
        await sub.unsubscribe()
    await nc.close()


async def faststream_read(
    url: str, prefix: str, partitions: int, events: int, group: str, page: int
) -> float:
    """FastStream's batch subscribers until every event was handled."""
    broker = NatsBroker(url, logger=NO_LOGGER)
    done = asyncio.Event()
    seen = 0
    for p in range(partitions):
        name, subject = fs_stream(prefix, p)

        @broker.subscriber(
            subject,
            stream=JStream(name, declare=False),
            pull_sub=PullSub(batch_size=page, timeout=0.1, batch=True),
            durable=f"{group}-{p}",
            # Tuned, or FastStream measures its waits: a fetch waits up to its
            # timeout (5 s by default) for a full batch, and the server's
            # default of 1 000 unacknowledged messages keeps a fetch of 2 000
            # from ever filling (500-700 events/s at the defaults here).
            config=JsConsumerConfig(max_ack_pending=4 * page),
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
        if not HAVE_FASTSTREAM:
            print(
                "FastStream is not installed (pip install 'wakuwaku[bench]'): its column is skipped"
            )
        else:
            started = time.perf_counter()
            await fill_faststream(url, log, prefix, partitions)
            print(f"copied them to FastStream streams in {time.perf_counter() - started:.1f} s")
        for poll in (500, 2000):
            pairs: list[tuple[float, float]] = []
            versus: list[float] = []
            for n in range(rounds):
                raw, count = await raw_read(url, log, partitions, poll)
                assert count == events, count
                took, handled = await consume(log, f"g-{poll}-{n}", poll)
                assert handled == events, handled
                pairs.append((raw, took))
                line = (
                    f"max_poll_records {poll}, round {n + 1}: consumer "
                    f"{events / took:,.0f} events/s, nats-py fetch+decode "
                    f"{events / raw:,.0f} events/s, share {raw / took:.0%}"
                )
                if HAVE_FASTSTREAM:
                    fs = await faststream_read(
                        url, prefix, partitions, events, f"fs-{poll}-{n}", poll
                    )
                    versus.append(fs / took)
                    line += (
                        f", FastStream {events / fs:,.0f} events/s, "
                        f"consumer/FastStream {fs / took:.2f}x"
                    )
                print(line, flush=True)
            raw = statistics.median(r for r, _ in pairs)
            took = statistics.median(t for _, t in pairs)
            share = statistics.median(r / t for r, t in pairs)
            target = f" (target >= 80 %): {verdict(share, 0.8)}" if poll == 2000 else ""
            print(
                f"max_poll_records {poll}: median consumer {events / took:,.0f} events/s, "
                f"nats-py {events / raw:,.0f} events/s, median share {share:.0%}{target}"
            )
            if versus:
                ratio = statistics.median(versus)
                print(
                    f"max_poll_records {poll}: median consumer/FastStream {ratio:.2f}x"
                    + (f" (target >= 2x): {verdict(ratio, 2.0)}" if poll == 2000 else "")
                )
    finally:
        await log.close()
        await purge(url, prefix)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    add_workload(
        parser,
        events=50_000,
        events_help="events produced once and read by every run (default 50 000)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.url, args.events, args.keys, args.partitions, args.rounds))
