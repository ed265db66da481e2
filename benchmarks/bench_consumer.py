"""End-to-end consumer throughput on the SQLite log, next to a same-run baseline.

The target: a no-op handler over 200 000 events on 1 000 keys must reach
at least 70 % of the raw read-and-decode speed of the same log (read every
record with ``SQLiteLog.read`` and decode its body with msgspec) at the
default poll (2 000), and at least 40 % when 1 % of the keys fail
Retryable once. The handler takes up to 100 events a call (``max_batch``
100, as FastStream's batch subscriber does), and, as ``per-event``,
``Handler``'s default of one event a call.

Each consumer run is paired with a bare read measured just before it, with
the consumer's poll size as its page size; the share of a pair is the bare
read's time over the consumer's. The verdict
uses the median share over the rounds, which one lucky or unlucky run does
not move (the machines are shared, and their speed drifts within seconds).

    python benchmarks/bench_consumer.py [--events N] [--keys K] [--partitions P]
        [--max-poll-records M [M ...]] [--rounds R] [--fsync]
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
from _args import positive_int
from _ticks import Tick, fill, ticks
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs.sqlite import SQLiteLog

MODES = (("no-op", False, 100), ("failing", True, 100), ("per-event", False, 1))
"""The handlers measured: (name, whether 1 % of the keys fail once, the
handler's ``max_batch``). ``no-op`` and ``failing`` take up to 100 events a
call, like FastStream's batch subscriber the server benchmarks compare
with; ``per-event`` is ``Handler``'s default, one event a call."""


async def fill_file(path: Path, events: int, keys: int, partitions: int) -> None:
    log = SQLiteLog(path)
    await fill(log, events, keys, partitions, batch_size=5000)
    await log.close()


async def baseline(path: Path, partitions: int, page: int) -> float:
    """Seconds to read every record, ``page`` records per read, and decode its
    body, without the consumer (the page is the consumer's poll size: bigger
    pages read faster)."""
    log = SQLiteLog(path)
    decoder = msgspec.json.Decoder(Tick)
    started = time.perf_counter()
    count = 0
    for p in range(partitions):
        offset = 0
        while True:
            records = await log.read("ticks", p, offset, page)
            if not records:
                break
            for record in records:
                decoder.decode(record.body)
            count += len(records)
            offset = records[-1].offset + 1
    elapsed = time.perf_counter() - started
    await log.close()
    return elapsed


async def consume(
    path: Path,
    failing_keys: set[str],
    group: str,
    max_poll: int,
    fsync: bool = False,
    max_batch: int = 100,
) -> tuple[float, wk.engine.ConsumerStats]:
    # Commits are not synced to disk by default here: the figure is the
    # engine's; --fsync measures with the log's default.
    log = SQLiteLog(path, fsync=fsync)
    failed: set[str] = set()

    async def handle(run: Sequence[Tick]) -> None:
        key = run[0].key
        if key in failing_keys and key not in failed:
            failed.add(key)
            raise wk.Retryable("once")

    config = ConsumerConfig(
        topic="ticks",
        group=group,
        retry_delays=[0.05],
        poll_interval=0.01,
        max_poll_records=max_poll,
    )
    consumer = Consumer(config, [Handler(Tick, handle, max_batch=max_batch)], log)
    started = time.perf_counter()
    stats = await consumer.drain()
    elapsed = time.perf_counter() - started
    await log.close()
    return elapsed, stats


async def main(
    events: int, keys: int, partitions: int, polls: list[int], rounds: int, fsync: bool
) -> None:
    logging.basicConfig(level=logging.ERROR)
    # 1 % of the keys fail once: every 100th key that some event draws (with
    # a few events per key, some keys draw none: 2 000 events over 1 000
    # keys reach 849 of them).
    drawn = {tick.key for tick in ticks(events, keys)}
    failing = {f"key-{k}" for k in range(0, keys, 100)} & drawn
    # (poll, mode) -> per round: (baseline seconds, consumer seconds)
    pairs: dict[tuple[int, str], list[tuple[float, float]]] = {
        (poll, mode): [] for poll in polls for mode, _, _ in MODES
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        await fill_file(path, events, keys, partitions)
        # The machine's speed drifts by tens of percent within seconds, so
        # every consumer run is paired with a bare read measured just before
        # it, and the shares of the pairs are compared.
        for n in range(rounds):
            line = [f"round {n + 1}:"]
            for poll in polls:
                for mode, fails, max_batch in MODES:
                    keys_failing = failing if fails else set()
                    raw = await baseline(path, partitions, poll)
                    elapsed, stats = await consume(
                        path, keys_failing, f"{mode}-{poll}-{n}", poll, fsync, max_batch
                    )
                    assert stats.handled == events, stats
                    assert stats.quarantined_keys == len(keys_failing), stats
                    pairs[(poll, mode)].append((raw, elapsed))
                    line.append(f"poll {poll} {mode} {elapsed:.2f} s (bare read {raw:.2f} s)")
            print(" ".join(line))
    print(f"\nevents: {events}, keys: {keys}, partitions: {partitions}, {rounds} rounds")
    for poll in polls:
        raw = min(r for mode, _, _ in MODES for r, _ in pairs[(poll, mode)])
        print(
            f"bare read+decode in pages of {poll}, best: {events / raw:,.0f} events/s ({raw:.2f} s)"
        )
    print("share = bare read time / consumer time of the same pair; the verdict uses the median")
    print("max_poll_records    handler  best events/s  share median (min-max)  target  verdict")
    for (poll, mode), runs in pairs.items():
        shares = sorted(r / c for r, c in runs)
        median = statistics.median(shares)
        target = 0.4 if mode == "failing" else 0.7
        best = events / min(c for _, c in runs)
        print(
            f"{poll:>16}  {mode:>9}  {best:>13,.0f}  {median:>12.0%} "
            f"({shares[0]:.0%}-{shares[-1]:.0%})  {target:>6.0%}  "
            f"{'met' if median >= target else 'MISSED'}"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=positive_int, default=200_000)
    parser.add_argument("--keys", type=positive_int, default=1_000)
    parser.add_argument("--partitions", type=positive_int, default=4)
    parser.add_argument(
        "--max-poll-records",
        type=positive_int,
        nargs="+",
        default=[500, 2000, 5000],
        help="one or more poll sizes to measure (default: 500 2000 5000)",
    )
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument(
        "--fsync",
        action="store_true",
        help="the consumer's log syncs its commits (SQLiteLog's default)",
    )
    args = parser.parse_args(argv)
    if args.events < args.keys:
        parser.error(
            f"--events {args.events} is fewer than --keys {args.keys}: "
            "most keys would have no event"
        )
    return args


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(
        main(
            args.events, args.keys, args.partitions, args.max_poll_records, args.rounds, args.fsync
        )
    )
