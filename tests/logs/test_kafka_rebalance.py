"""Rebalances of a Kafka consumer group across processes.

Two consumer processes of one group share a 4-partition topic; a third
joins mid-run and one of the first two is SIGKILLed. Every event must be
handled at least once, each process must see each key's events in order,
and no two processes may run one key at the same time.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest

import wakuwaku as wk

from ..conftest import KAFKA_BOOTSTRAP
from ..kafka_support import drop_prefix, fresh_prefix, kafka_log

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

EVENTS, KEYS = 2000, 40

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    import msgspec
    import wakuwaku as wk
    from wakuwaku.engine import Consumer, ConsumerConfig, Handler
    from wakuwaku.logs import open_log

    url, group, out = sys.argv[1:4]

    @wk.event("rebalance.step", key="key")
    class Step(msgspec.Struct, frozen=True):
        key: str
        n: int

    async def main() -> None:
        sink = open(out, "a", buffering=1)

        async def handle(run):
            started = time.time()
            await asyncio.sleep(0.05)
            for step in run:
                sink.write(f"{step.key} {step.n} {started} {time.time()}\\n")

        config = ConsumerConfig(
            topic="steps", group=group, poll_interval=0.01, max_poll_records=50,
            lease_ttl=3.0, shutdown_timeout=10.0, max_concurrency=1,
        )
        await Consumer(config, [Handler(Step, handle, max_batch=5)], open_log(url)).run()

    asyncio.run(main())
    """
)


@wk.event("rebalance.step", key="key")
class Step(msgspec.Struct, frozen=True):
    key: str
    n: int


def _handled(paths: list[Path]) -> dict[Path, list[tuple[str, int, float, float]]]:
    out: dict[Path, list[tuple[str, int, float, float]]] = {}
    for path in paths:
        rows = []
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 4:
                    rows.append((parts[0], int(parts[1]), float(parts[2]), float(parts[3])))
        out[path] = rows
    return out


def _check_key_order(handled: dict[Path, list[tuple[str, int, float, float]]]) -> None:
    """Each process handles a key's events in order: a step back is a
    redelivery after a rebalance (at-least-once); a step forward only over
    events another process handled in between (the partition went there and
    came back: seen, member 1 handled k34 0-5, member 0 6-18 and was
    killed, and member 1 went on at 15, after member 0's last commit)."""
    starts: dict[tuple[str, int], list[tuple[Path, float]]] = defaultdict(list)
    for path, rows in handled.items():
        for key, n, start, _ in rows:
            starts[(key, n)].append((path, start))
    for path, rows in handled.items():
        last: dict[str, tuple[int, float]] = {}
        for key, n, start, _ in rows:
            if key in last and n > last[key][0] + 1:
                before, since = last[key]
                for skipped in range(before + 1, n):
                    assert any(
                        other != path and since <= at <= start
                        for other, at in starts[(key, skipped)]
                    ), f"{key}: {n} after {before}, and no other member ran {skipped} between"
            last[key] = (n, start)


def _check_no_key_ran_twice_at_once(
    handled: dict[Path, list[tuple[str, int, float, float]]],
) -> None:
    """No two live members ran one key at the same time (member 0 was
    SIGKILLed: its last chunk may overlap its successor's redelivery)."""
    spans: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for index, rows in enumerate(handled.values()):
        for key, _, start, end in rows:
            spans[key].append((start, end, index))
    for key, items in spans.items():
        items.sort()
        for (_, e1, p1), (s2, _, p2) in itertools.pairwise(items):
            if p1 != p2 and 0 not in (p1, p2):
                assert s2 >= e1, f"{key} ran in members {p1} and {p2} at once"


async def _until(paths: list[Path], count: int, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        seen = {(k, n) for rows in _handled(paths).values() for k, n, _, _ in rows}
        if len(seen) >= count:
            return
        await asyncio.sleep(0.2)


async def test_members_join_and_die_and_every_event_is_handled_in_key_order(
    tmp_path: Path,
) -> None:
    prefix = fresh_prefix()
    log = kafka_log(prefix)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await log.create_topic("steps", 4)
        producer = wk.Producer(log, "steps")
        await producer.publish_many([Step(f"k{i % KEYS}", i // KEYS) for i in range(EVENTS)])
        url = f"kafka://{KAFKA_BOOTSTRAP}?prefix={prefix}"
        paths = [tmp_path / f"member{n}.txt" for n in range(3)]

        def spawn(n: int) -> None:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", CHILD, url, "g", str(paths[n])],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

        spawn(0)
        spawn(1)
        await _until(paths, EVENTS // 4, 60)
        spawn(2)
        await _until(paths, EVENTS // 2, 60)
        os.kill(procs[0].pid, signal.SIGKILL)
        await _until(paths, EVENTS, 120)
        for proc in procs[1:]:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            await asyncio.to_thread(proc.wait, 30)
        handled = _handled(paths)
        seen = {(k, n) for rows in handled.values() for k, n, _, _ in rows}
        assert seen == {(f"k{k}", n) for k in range(KEYS) for n in range(EVENTS // KEYS)}
        assert handled[paths[2]], "the member that joined got no partition"
        _check_key_order(handled)
        _check_no_key_ran_twice_at_once(handled)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        await log.close()
        await asyncio.to_thread(drop_prefix, prefix)
