"""What fencing an append costs on the NATS log, measured in pairs.

The engine writes retry work, markers and dead letters with ``fence=lease``.
Each round runs, one right after the other on the same streams:

- **unfenced**: ``append`` without a fence (a producer's append);
- **fenced**: ``append(..., fence=lease)``, refused by the server itself once
  the lease moved (``Nats-Expected-Last-Sequence`` on every publish);
- **check, then publish**: what fenced appends did before, a lease read
  from the state bucket and then the unfenced publish (one round trip more,
  and a window in which a taken-over member could still write).

``--appends`` appends of ``--records`` records (1 and 100 by default) each;
medians of ``--rounds`` rounds. Then the price of a takeover: taking a lease
whose holders wrote to two streams (two fence records written) next to
taking one that never wrote anywhere.

    python benchmarks/bench_nats_fence.py [--url nats://127.0.0.1:4222]
        [--appends N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

from _args import positive_int
from bench_nats import purge
from wakuwaku.logs import Lease
from wakuwaku.logs.nats import NatsLog

HEADERS = {"wk-v": b"1", "wk-type": b"tick", "wk-key": b"k1", "wk-alg": b"plain"}
BODY = b"x" * 200


async def timed(appends: int, call: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    for _ in range(appends):
        await call()
    return time.perf_counter() - started


async def takeover(log: NatsLog, topic: str, member: str, lease: Lease) -> tuple[float, Lease]:
    await log.release_partition(lease)
    started = time.perf_counter()
    taken = await log.acquire_partition(lease.group, topic, 0, member, ttl=60.0)
    elapsed = time.perf_counter() - started
    assert taken is not None
    return elapsed, taken


async def main(url: str, appends: int, rounds: int) -> None:
    prefix = f"wkbench-{uuid.uuid4().hex[:12]}"
    log = NatsLog(url, prefix=prefix)
    try:
        for topic in ("main", "retry", "dlq", "idle"):
            await log.create_topic(topic, 1)
        lease = await log.acquire_partition("g", "main", 0, "m0", ttl=600.0)
        assert lease is not None
        await log.append("retry", 0, [(HEADERS, BODY)], fence=lease)  # registers the stream

        async def check_then_publish(records: list[tuple[dict[str, bytes], bytes]]) -> None:
            await log._check_fence(lease)  # the former fenced append
            await log.append("retry", 0, records)

        for size in (1, 100):
            records = [(HEADERS, BODY)] * size
            rows: dict[str, list[float]] = {"unfenced": [], "fenced": [], "check, then publish": []}
            for n in range(rounds):
                got = {
                    "unfenced": await timed(appends, partial(log.append, "retry", 0, records)),
                    "fenced": await timed(
                        appends, partial(log.append, "retry", 0, records, fence=lease)
                    ),
                    "check, then publish": await timed(
                        appends, partial(check_then_publish, records)
                    ),
                }
                for name, seconds in got.items():
                    rows[name].append(seconds)
                print(
                    f"{size} record(s) per append, round {n + 1}: "
                    + ", ".join(f"{k} {appends * size / s:,.0f} records/s" for k, s in got.items())
                )
            base = statistics.median(rows["unfenced"])
            for name, times in rows.items():
                took = statistics.median(times)
                print(
                    f"  {size} record(s) per append, {name}: median "
                    f"{took / appends * 1e3:.2f} ms per append, "
                    f"{appends * size / took:,.0f} records/s ({took / base:.0%} of unfenced)"
                )
        # A takeover: the new holder fences the streams the lease wrote to first.
        await log.append("dlq", 0, [(HEADERS, BODY)], fence=lease)
        idle = await log.acquire_partition("g", "idle", 0, "m0", ttl=600.0)
        assert idle is not None
        pairs: list[tuple[float, float]] = []
        holder, idle_holder = lease, idle
        for n in range(rounds):
            member = f"m{n + 1}"
            fencing, holder = await takeover(log, "main", member, holder)
            plain, idle_holder = await takeover(log, "idle", member, idle_holder)
            pairs.append((fencing, plain))
        print(
            "takeover of a lease whose holders wrote to 2 streams: median "
            f"{statistics.median(f for f, _ in pairs) * 1e3:.2f} ms, of one that never wrote: "
            f"{statistics.median(p for _, p in pairs) * 1e3:.2f} ms"
        )
    finally:
        await log.close()
        await purge(url, prefix)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--appends", type=positive_int, default=200)
    parser.add_argument("--rounds", type=positive_int, default=5)
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.url, args.appends, args.rounds))
