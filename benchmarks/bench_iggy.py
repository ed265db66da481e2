"""End-to-end consumer throughput on the Apache Iggy log, next to apache-iggy's own poll loop.

A no-op handler over 200 000 events on 1 000 keys and 4 partitions,
``max_poll_records`` and ``max_poll_bytes`` at their defaults (2 000 records,
1 MiB; the polls grow to 2 000 from 100), timed until every event was
handled (``Consumer.drain``, as in ``_ticks.consume``), next to the
apache-iggy client alone reading the same topic over one connection: every
partition polled at once (a task each, as the consumer reads them), by
offset with ``poll_messages`` in pages of the same size, every
message's user headers turned into ``dict[str, bytes]`` and its JSON body
decoded with msgspec (the work the consumer has to do too). Each round
pairs a baseline run with a consumer run of a fresh group; the median share
of ``--rounds`` rounds (default 3: a single round moves by tens of points on
a busy machine) is printed. Target: the consumer at >= 70 % of the client's
loop, as on the other logs; the Iggy log's own target is 50 %.

Runs in an Iggy stream of its own (``IggyLog(stream=...)``) on the server
at ``--url`` and deletes it afterwards.

    python benchmarks/bench_iggy.py [--url iggy://iggy:iggy@127.0.0.1:8090] [--events N]
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

import msgspec
from apache_iggy import Consumer, IggyClient, PollingStrategy

from _args import add_workload
from _ticks import TOPIC, Tick, consume, fill, verdict
from wakuwaku.engine import ConsumerConfig
from wakuwaku.logs.iggy import IggyLog

DEFAULT_POLL = ConsumerConfig.max_poll_records
"""The consumer's own ``max_poll_records``: this benchmark does not tune it."""

MAX_IGGY_PARTITIONS = 1000
"""The most partitions the Iggy log makes a topic with (``IggyLog.create_topic``)."""


async def read_partition(
    client: IggyClient, stream: str, partition: int, page: int, decoder: msgspec.json.Decoder[Tick]
) -> int:
    """Poll one partition by offset in pages to its end, decoding every message; the count."""
    reader = Consumer.Single(f"raw-{uuid.uuid4().hex[:8]}")
    count = offset = 0
    while got := await client.poll_messages(
        stream,
        TOPIC,
        consumer=reader,
        polling_strategy=PollingStrategy.Offset(offset),
        count=page,
        auto_commit=False,
        partition_id=partition,
    ):
        for message in got:
            found = message.user_headers()
            if found:
                {str(k.value): v.value for k, v in found.items()}
            decoder.decode(message.payload())
        count += len(got)
        offset = got[-1].offset() + 1
    return count


async def raw_read(
    client: IggyClient, stream: str, partitions: int, page: int
) -> tuple[float, int]:
    """apache-iggy alone: every partition read at once (one task each), as the consumer does."""
    decoder = msgspec.json.Decoder(Tick)
    started = time.perf_counter()
    counts = await asyncio.gather(
        *(read_partition(client, stream, p, page, decoder) for p in range(partitions))
    )
    return time.perf_counter() - started, sum(counts)


async def main(url: str, events: int, keys: int, partitions: int, rounds: int) -> None:
    logging.basicConfig(level=logging.ERROR)
    stream = f"wkbench{uuid.uuid4().hex[:8]}"
    log = IggyLog.from_url(f"{url}?stream={stream}")
    client = IggyClient.from_connection_string(url)
    await client.connect()
    try:
        started = time.perf_counter()
        await fill(log, events, keys, partitions)
        print(f"filled {events} events in {time.perf_counter() - started:.1f} s", flush=True)
        shares = []
        for n in range(rounds):
            raw, count = await raw_read(client, stream, partitions, DEFAULT_POLL)
            assert count == events, count
            elapsed, handled = await consume(log, f"g-{n}", DEFAULT_POLL)
            assert handled == events, handled
            shares.append(raw / elapsed)
            print(
                f"max_poll_records {DEFAULT_POLL} (default), round {n + 1}: consumer "
                f"{events / elapsed:,.0f} events/s, apache-iggy poll+decode "
                f"{events / raw:,.0f} events/s, share {raw / elapsed:.0%}",
                flush=True,
            )
        share = statistics.median(shares)
        print(
            f"max_poll_records {DEFAULT_POLL}: median share {share:.0%}, "
            f"best {max(shares):.0%} (target >= 70 %): {verdict(share, 0.7)}; "
            f"the Iggy log's own target (>= 50 %): {verdict(share, 0.5)}"
        )
    finally:
        await log.close()
        await client.delete_stream(stream)
        # Let the dropped client's Rust runtime end before the interpreter
        # does (IggyLog.close waits for its own client the same way).
        del client
        await asyncio.sleep(0.1)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="iggy://iggy:iggy@127.0.0.1:8090")
    add_workload(parser)
    args = parser.parse_args(argv)
    if args.partitions > MAX_IGGY_PARTITIONS:
        parser.error(
            f"--partitions must be at most {MAX_IGGY_PARTITIONS} on Iggy, got {args.partitions}"
        )
    return args


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.url, args.events, args.keys, args.partitions, args.rounds))
