"""Producer.publish_many next to each client's own batch publish, on Redis, NATS, Kafka and Iggy.

``--events`` events (default 200 000; ``_ticks.Tick``: a key drawn from
``--keys`` keys, 40-byte payloads) go out in batches of ``--batch`` (2 000)
over ``--partitions`` (4) partitions, once through ``Producer.publish_many``
at the library's defaults (a topic ``ticks``) and once through the
engine's client alone (a topic ``raw``), in the same run, and each engine
prints both rates in events per second and their ratio (target: at least
50 %). The client side gets the very records the producer writes (headers,
body, partition: ``Producer.encode`` and ``partition_for``), made before
its clock starts, so it is the client's ceiling:

- redis: one pipelined ``XADD`` per record (``transaction=False``, one
  pipeline per batch), the fields the Redis log stores (``b``, ``:<name>``);
- nats: nats-py ``js.publish_async`` of each record's envelope (the NATS
  log's message format, with a ``Nats-Msg-Id``), the batch's acks awaited
  together;
- kafka: confluent-kafka ``produce`` of the batch (the log's producer
  settings: ``enable.idempotence``, ``acks=all``) then one ``flush``;
- iggy: apache-iggy ``send_messages`` of each partition's share of the batch.

With ``--rounds R`` (default 3: a single round moves by tens of points on a
busy machine) the two alternate R times (the client first); the medians are
printed, and the median of the rounds' ratios.
Each engine runs under a fresh prefix (an Iggy stream of its own) and
removes what it wrote. An engine whose server does not answer is reported
and skipped.

    python benchmarks/bench_producer.py [--engines redis,nats,kafka,iggy] [--events N]
        [--batch B] [--keys K] [--partitions P] [--rounds R] [--redis URL] [--nats URL]
        [--bootstrap HOST:PORT] [--iggy URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import wakuwaku as wk
from _args import add_workload, positive_int
from _ticks import Tick, verdict
from wakuwaku.logs import Log

RAW = "raw"
ENGINES = ("redis", "nats", "kafka", "iggy")
MAX_IGGY_PARTITIONS = 1000
"""The most partitions the Iggy log makes a topic with (``IggyLog.create_topic``)."""
Batch = list[tuple[int, dict[str, bytes], bytes]]  # (partition, headers, body) per record
Publish = Callable[[Batch], Awaitable[None]]
Client = tuple[Publish, Callable[[], Awaitable[None]]]  # publish a batch, clean up


def make_events(events: int, keys: int, batch: int) -> list[list[Tick]]:
    rng = random.Random(7)
    ticks = [Tick(f"key-{rng.randrange(keys)}", n, "x" * 40) for n in range(events)]
    return [ticks[i : i + batch] for i in range(0, events, batch)]


def encoded(log: Log, batches: list[list[Tick]], partitions: int) -> list[Batch]:
    """The records the producer writes for ``batches``, with their partitions."""
    producer = wk.Producer(log, RAW)
    out: list[Batch] = []
    for batch in batches:
        rows = []
        for event in batch:
            key, record = producer.encode(event)
            rows.append((log.partition_for(key, partitions), dict(record[0]), record[1]))
        out.append(rows)
    return out


async def timed(publish: Callable[[Any], Awaitable[Any]], batches: list[Any]) -> float:
    started = time.perf_counter()
    for batch in batches:
        await publish(batch)
    return time.perf_counter() - started


# -- the clients' own batch publish ------------------------------------------------------


async def redis_client(url: str, prefix: str) -> Client:
    import redis.asyncio as aioredis

    client: Any = aioredis.Redis.from_url(url)

    async def publish(batch: Batch) -> None:
        pipe = client.pipeline(transaction=False)
        for partition, headers, body in batch:
            fields: dict[bytes | str, bytes] = {"b": body}
            for name, value in headers.items():
                fields[":" + name] = value
            pipe.xadd(f"{prefix}:raw:{partition}", fields)
        await pipe.execute()

    async def close() -> None:
        keys = [key async for key in client.scan_iter(f"{prefix}:raw:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()

    return publish, close


async def nats_client(url: str, log: Any) -> Client:
    import nats

    from wakuwaku.logs._nats_streams import encode_record

    nc = await nats.connect(url, connect_timeout=5)
    js = nc.jetstream()
    streams = [log.stream_name(RAW, p) for p in range(await wk.Producer(log, RAW).partitions())]

    async def publish(batch: Batch) -> None:
        base = uuid.uuid4().hex
        acks = [
            await js.publish_async(
                streams[partition],
                encode_record(headers, body),
                headers={"Nats-Msg-Id": f"{base}:{i}"},
            )
            for i, (partition, headers, body) in enumerate(batch)
        ]
        await asyncio.gather(*acks)

    return publish, nc.close


async def kafka_client(bootstrap: str, prefix: str) -> Client:
    from confluent_kafka import Producer

    from wakuwaku.logs.kafka._append import to_message

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    topic = prefix + RAW

    def produce_and_flush(batch: Batch) -> None:
        for partition, headers, body in batch:
            key, rest = to_message(headers)
            while True:
                try:
                    producer.produce(topic, body, key, partition, headers=rest)  # type: ignore[arg-type]
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(30)

    async def publish(batch: Batch) -> None:
        produce_and_flush(batch)  # blocking, as a script would call it

    async def close() -> None:
        producer.flush(10)

    return publish, close


async def iggy_client(url: str, stream: str) -> Client:
    from apache_iggy import IggyClient, SendMessage

    client = IggyClient.from_connection_string(url)
    await client.connect()

    async def publish(batch: Batch) -> None:
        by_partition: dict[int, list[Any]] = {}
        for partition, headers, body in batch:
            by_partition.setdefault(partition, []).append(SendMessage(body, headers))
        for partition, messages in by_partition.items():
            await client.send_messages(stream, RAW, partition, messages)

    async def close() -> None:
        await client.delete_stream(stream)

    return publish, close


# -- one engine ----------------------------------------------------------------------------


async def engine(name: str, args: argparse.Namespace, batches: list[list[Tick]]) -> None:
    tag = uuid.uuid4().hex[:8]
    log: Any
    if name == "redis":
        from wakuwaku.logs.redis import RedisLog

        prefix = f"wkbench-{tag}"
        log = RedisLog(args.redis, prefix=prefix)
        what = "pipelined XADD"
    elif name == "nats":
        from wakuwaku.logs.nats import NatsLog

        log = NatsLog(args.nats, prefix=f"wkbench-{tag}")
        what = "nats-py publish_async"
    elif name == "kafka":
        from wakuwaku.logs.kafka import KafkaLog

        prefix = f"wkbench{tag}."
        log = KafkaLog(args.bootstrap, prefix=prefix)
        what = "confluent produce+flush"
    else:
        from wakuwaku.logs.iggy import IggyLog

        stream = f"wkbench{tag}"
        log = IggyLog.from_url(f"{args.iggy}?stream={stream}")
        what = "apache-iggy send_messages"
    close: Callable[[], Awaitable[None]] | None = None
    try:
        await log.create_topic("ticks", args.partitions)
        await log.create_topic(RAW, args.partitions)
        records = encoded(log, batches, args.partitions)
        if name == "redis":
            raw, close = await redis_client(args.redis, prefix)
        elif name == "nats":
            raw, close = await nats_client(args.nats, log)
        elif name == "kafka":
            raw, close = await kafka_client(args.bootstrap, prefix)
        else:
            raw, close = await iggy_client(args.iggy, stream)
        producer = wk.Producer(log, "ticks")
        events = sum(len(b) for b in batches)
        ours: list[float] = []
        theirs: list[float] = []
        for n in range(args.rounds):
            theirs.append(events / await timed(raw, records))
            ours.append(events / await timed(producer.publish_many, batches))
            print(
                f"{name} round {n + 1}: publish_many {ours[-1]:,.0f} events/s, "
                f"{what} {theirs[-1]:,.0f} events/s, ratio {ours[-1] / theirs[-1]:.0%}",
                flush=True,
            )
        ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
        print(
            f"{name}: publish_many {statistics.median(ours):,.0f} events/s, {what} "
            f"{statistics.median(theirs):,.0f} events/s, median ratio of the pairs "
            f"{ratio:.0%} (target >= 50 %): {verdict(ratio, 0.5)}",
            flush=True,
        )
    finally:
        with contextlib.suppress(Exception):
            await log.delete_topic("ticks")
            await log.delete_topic(RAW)
        if close is not None:
            await close()
        await log.close()


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR)
    batches = make_events(args.events, args.keys, args.batch)
    print(
        f"{args.events} events over {args.keys} keys, {args.partitions} partitions, "
        f"batches of {args.batch}, {args.rounds} round(s)",
        flush=True,
    )
    for name in args.engines:
        try:
            await engine(name, args, batches)
        except Exception as exc:  # noqa: BLE001 - a server that is not there skips its engine
            print(f"{name}: skipped ({type(exc).__name__}: {exc})", flush=True)


def engine_names(text: str) -> list[str]:
    """``--engines``: a comma-separated list of known engines."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in ENGINES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown engine(s) {', '.join(map(repr, unknown))}: choose from {', '.join(ENGINES)}"
        )
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=engine_names, default=list(ENGINES))
    add_workload(parser)
    parser.add_argument("--batch", type=positive_int, default=2_000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--iggy", default="iggy://iggy:iggy@127.0.0.1:8090")
    args = parser.parse_args(argv)
    if "iggy" in args.engines and args.partitions > MAX_IGGY_PARTITIONS:
        parser.error(
            f"--partitions must be at most {MAX_IGGY_PARTITIONS} on Iggy, got "
            f"{args.partitions} (or leave iggy out of --engines)"
        )
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
