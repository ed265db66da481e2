"""What waiting for the commit markers costs a transactional store on the Kafka log.

``KafkaLog.store`` of a batch with retry or dead-letter records is one
Kafka transaction. ``commit_transaction`` returns before the commit markers
reach the partitions, so the store waits until the last stable offset has
passed what it wrote (read-your-writes, ``docs/logs.md``). Each round
times, one right after the other on fresh topics of the same broker:

- **waits for the markers**: the log as it is;
- **returns at commit**: the same log with that wait taken out (what the
  store did before; its records may be invisible for a moment).

``--stores`` stores of ``--records`` retry records (40-byte bodies) and two
offsets each, back to back; median and mean per store of ``--rounds`` rounds.

    python benchmarks/bench_kafka_store.py [--bootstrap 127.0.0.1:9092]
        [--stores N] [--records R] [--rounds K]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Mapping, Sequence

from confluent_kafka.admin import AdminClient

from _args import positive_int
from wakuwaku.logs import BatchWrite
from wakuwaku.logs.kafka import KafkaLog

HEADERS = {"wk-v": b"1", "wk-type": b"tick", "wk-key": b"k1", "wk-alg": b"plain"}
BODY = b"x" * 40


class ReturnsAtCommit(KafkaLog):
    """The log with the wait for the commit markers taken out (the baseline)."""

    async def _wait_visible(self, ends: Mapping[tuple[str, int], int]) -> None:
        return None


async def timed(log: KafkaLog, stores: int, records: int) -> list[float]:
    """Seconds per store of ``stores`` back-to-back transactional stores."""
    await log.create_topic("orders", 1)
    await log.create_topic("retry", 1)
    lease = await log.acquire_partition("g", "orders", 0, "m", ttl=60.0)
    assert lease is not None
    out: list[float] = []
    for n in range(stores):
        write = BatchWrite(
            "g",
            appends=[("retry", 0, [(HEADERS, BODY)] * records)],
            commits=[("orders", 0, n + 1), ("retry", 0, n * records)],
        )
        started = time.perf_counter()
        await log.store(write, fence=lease)
        out.append(time.perf_counter() - started)
    return out


def drop(bootstrap: str, prefixes: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(tuple(prefixes))]
    for future in admin.delete_topics(topics).values() if topics else ():
        future.result(30)
    groups = [g.group_id for g in admin.list_consumer_groups().result(10).valid]
    mine = [g for g in groups if g.startswith(tuple(prefixes))]
    for future in admin.delete_consumer_groups(mine).values() if mine else ():
        # A group still being left: the broker expires it.
        with contextlib.suppress(Exception):
            future.result(10)


async def main(bootstrap: str, stores: int, records: int, rounds: int) -> None:
    prefixes: list[str] = []
    results: dict[str, list[float]] = {"waits for the markers": [], "returns at commit": []}
    try:
        for n in range(rounds):
            for name, kind in (
                ("waits for the markers", KafkaLog),
                ("returns at commit", ReturnsAtCommit),
            ):
                prefix = f"wkbench{uuid.uuid4().hex[:8]}."
                prefixes.append(prefix)
                log = kind(bootstrap, prefix=prefix)
                try:
                    seconds = await timed(log, stores, records)
                finally:
                    await log.close()
                results[name].extend(seconds)
                print(
                    f"round {n + 1}, {name}: median {statistics.median(seconds) * 1000:.2f} ms, "
                    f"mean {statistics.mean(seconds) * 1000:.2f} ms per store",
                    flush=True,
                )
        for name, seconds in results.items():
            print(
                f"{name} ({len(seconds)} stores of {records} records): median "
                f"{statistics.median(seconds) * 1000:.2f} ms, mean "
                f"{statistics.mean(seconds) * 1000:.2f} ms"
            )
    finally:
        await asyncio.to_thread(drop, bootstrap, prefixes)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--stores", type=positive_int, default=200)
    parser.add_argument("--records", type=positive_int, default=20)
    parser.add_argument("--rounds", type=positive_int, default=3)
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.bootstrap, args.stores, args.records, args.rounds))
