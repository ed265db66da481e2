"""One failing key next to good ones, against a same-run baseline (issue 12 item 7).

One partition, keys k0..k4 x ``--events`` events (interleaved), no-op handler
(``max_batch=100``), k4 always Retryable with ``retry_delays=(0.01, 0.02)``.
Each round runs the baseline (k0..k3 alone) and the mixed log, each on a
fresh SQLite log (fsync off), and prints

- the good keys' speed with k4 as a share of their speed without it
  (target >= 80 %): time until the consumer has handled all good events;
- the cost of one k4 record (routed or failed, copied to the retry topic,
  read back, attempted twice, dead-lettered) over the cost of one handled
  record (target <= 3x): (mixed drain - baseline drain) / k4 events over
  baseline drain / good events.

The median over ``--rounds`` pairs is the verdict (the machine is shared).

    python benchmarks/bench_failing_key.py [--events N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs.sqlite import SQLiteLog

TOPIC = "ticks"


@wk.event("bench.tick", key="key")
class Tick(msgspec.Struct, frozen=True):
    key: str
    n: int


async def run(path: Path, events: int, failing: bool) -> tuple[float, float, int]:
    """Returns (seconds until the good events are handled, seconds to drain, dead letters)."""
    log = SQLiteLog(path, fsync=False)
    await log.create_topic(TOPIC, 1)
    producer = wk.Producer(log, TOPIC)
    keys = [f"k{i}" for i in range(5 if failing else 4)]
    batch = [Tick(k, n) for n in range(events) for k in keys]
    for start in range(0, len(batch), 5000):
        await producer.publish_many(batch[start : start + 5000])
    good = 4 * events
    handled = 0
    done_at = 0.0
    started = 0.0

    async def handle(ticks: Sequence[Tick]) -> None:
        nonlocal handled, done_at
        if ticks[0].key == "k4":
            raise wk.Retryable("k4 never works")
        handled += len(ticks)
        if handled == good:
            done_at = time.perf_counter()

    config = ConsumerConfig(
        topic=TOPIC, group="bench", retry_delays=(0.01, 0.02), max_pending_retry=10 * events
    )
    consumer = Consumer(config, [Handler(Tick, handle, max_batch=100)], log)
    started = time.perf_counter()
    stats = await consumer.drain()
    drained = time.perf_counter() - started
    await log.close()
    return done_at - started, drained, sum(stats.dead_letters.values())


async def main(events: int, rounds: int) -> None:
    logging.basicConfig(level=logging.CRITICAL)
    shares: list[float] = []
    costs: list[float] = []
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            base_good, base_drain, _ = await run(Path(tmp) / "a.db", events, False)
            mixed_good, mixed_drain, dead = await run(Path(tmp) / "b.db", events, True)
        share = base_good / mixed_good
        per_handled = base_drain / (4 * events)
        per_failing = (mixed_drain - base_drain) / events
        cost = per_failing / per_handled
        shares.append(share)
        costs.append(cost)
        print(
            f"round {r + 1}: good keys {4 * events / base_good:,.0f}/s alone, "
            f"{4 * events / mixed_good:,.0f}/s with k4 ({share:.0%}); "
            f"handled record {per_handled * 1e6:.1f} us, k4 record "
            f"{per_failing * 1e6:.1f} us ({cost:.1f}x); {dead} dead letters"
        )
    share, cost = statistics.median(shares), statistics.median(costs)
    print(
        f"median: good keys keep {share:.0%} of their speed (target >= 80 %): "
        f"{'meets' if share >= 0.8 else 'MISSES'}"
    )
    print(
        f"median: a failing record costs {cost:.1f}x a handled one (target <= 3x): "
        f"{'meets' if cost <= 3 else 'MISSES'}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000, help="events per key")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.rounds))
