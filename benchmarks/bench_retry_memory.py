"""Consumer memory with a large retry backlog, next to a same-run baseline.

design §6: in-process state per pending key is small and bounded; record
bodies stay in the retry log. Target: 1 000 000 pending retry records across
10 000 keys, consumer RSS under 100 MB, and a restart that handles its
first main record within 5 s.

A child process fills a SQLite log (fsync off) with the retry partition as
the consumer writes it: per key a work record that quarantined it, then the
records routed to it, each a main-topic record's headers and body plus
``wk-failed-at``, ``wk-due-at`` (an hour away: no attempt is due),
``wk-error`` and ``wk-src``. This process then measures

- the baseline: its RSS with wakuwaku imported and the log open, before any
  retry state exists;
- the restart: a consumer starts, rebuilds its state from the retry
  partition and handles one new event of a key with no retry work (the
  time from its start to that handler call);
- the RSS and peak RSS (VmRSS, VmHWM of /proc/self/status) with the whole
  backlog pending, and then after ``--route`` more events of the quarantined
  keys are consumed from the main topic and routed to the retry topic.

    python benchmarks/bench_retry_memory.py [--records N] [--keys K] [--body BYTES]
        [--route M]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

import wakuwaku as wk
from _args import non_negative_int, positive_int
from wakuwaku._records import H_DUE, H_ERROR, H_FAILED_AT, H_SRC, Source, encode_source, message_id
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.engine._retry import ms_text

TOPIC = "ticks"
GROUP = "bench"


@wk.event("bench.tick", key="key")
class Tick(msgspec.Struct, frozen=True):
    key: str
    n: int
    payload: str


def status(field: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


async def until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` every 10 ms until it holds."""
    while True:
        if condition():
            return
        await asyncio.sleep(0.01)


def mb(value: int) -> str:
    return f"{value / 1e6:7.1f} MB"


async def fill(url: str, records: int, keys: int, body: int) -> None:
    """Write the main topic (the originals, consumed) and a retry partition of ``records`` pending
    work records over ``keys`` keys, as the consumer would have."""
    log = wk.open_log(url)
    await log.create_topic(TOPIC, 1)
    config = ConsumerConfig(topic=TOPIC, group=GROUP)
    retry_topic = config.retry_topic(TOPIC)
    await log.create_topic(retry_topic, 1)
    # One real main-topic record gives the producer's headers.
    probe = wk.MemoryLog()
    await probe.create_topic(TOPIC, 1)
    await wk.Producer(probe, TOPIC).publish(Tick("k", 0, ""))
    [template] = await probe.read(TOPIC, 0, 0, 1)
    now = time.time()
    common = {H_FAILED_AT: ms_text(now), H_DUE: ms_text(now + 3600), H_ERROR: b"row not there yet"}
    payload = "x" * body
    batch: list[tuple[dict[str, bytes], bytes]] = []
    main: list[tuple[dict[str, bytes], bytes]] = []
    for n in range(records):
        key = f"key-{n % keys}"
        headers = dict(template.headers)
        headers["wk-key"] = key.encode()
        body_bytes = msgspec.json.encode(Tick(key, n, payload))
        main.append((dict(headers), body_bytes))
        headers.update(common)
        headers[H_SRC] = encode_source(Source(TOPIC, 0, (n,), (message_id(TOPIC, 0, n),)))
        batch.append((headers, body_bytes))
        if len(batch) == 10_000:
            await log.append(TOPIC, 0, main)
            await log.append(retry_topic, 0, batch)
            batch, main = [], []
    if batch:
        await log.append(TOPIC, 0, main)
        await log.append(retry_topic, 0, batch)
    # The originals were consumed and routed: the group's main offset is past them.
    await log.commit(GROUP, TOPIC, 0, records)
    await log.commit(GROUP, retry_topic, 0, 0)
    await log.close()


async def measure(url: str, records: int, keys: int, route: int, body: int) -> None:
    logging.basicConfig(level=logging.ERROR)
    log = wk.open_log(url)
    await log.read(TOPIC, 0, 0, 1)
    baseline = status("VmRSS")
    print(f"baseline RSS (imported, log open, no retry state): {mb(baseline)}")

    # One new event of a key with no retry work: its handling is the first
    # main record after the restart (the figure the target is about).
    await wk.Producer(log, TOPIC).publish(Tick("fresh", -1, ""))
    first: list[float] = []

    async def handle(events: Sequence[Tick]) -> None:
        if not first and any(e.key == "fresh" for e in events):
            first.append(time.perf_counter())

    config = ConsumerConfig(
        topic=TOPIC,
        group=GROUP,
        retry_delays=[3600.0],
        max_pending_retry=10_000_000,
        poll_interval=0.05,
    )
    consumer = Consumer(config, [Handler(Tick, handle, max_batch=100)], log)
    started = time.perf_counter()
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    await until(lambda: bool(first))  # cheap: the views cost O(pending) to build
    restart = first[0] - started
    [view] = consumer.partitions()
    pending, quarantined = view.retry_pending, len(view.quarantined)
    rss, peak = status("VmRSS"), status("VmHWM")
    verdict = "meets" if restart < 5.0 else "MISSES"
    print(
        f"restart: {restart:.2f} s to the first main record, {pending} pending records of "
        f"{quarantined} keys rebuilt ({pending / restart:,.0f} records/s): {verdict} the "
        "target (< 5 s at 1 000 000)"
    )
    print(
        f"RSS with the backlog pending:   {mb(rss)}  (+{mb(rss - baseline).strip()} "
        f"over baseline; peak {mb(peak).strip()}); bodies in the log: "
        f"{mb(pending * (body + 40)).strip()}"
    )
    if route:
        producer = wk.Producer(log, TOPIC)
        payload = "x" * body
        for start in range(0, route, 5000):
            await producer.publish_many(
                [
                    Tick(f"key-{n % keys}", n, payload)
                    for n in range(start, min(route, start + 5000))
                ]
            )
        began = time.perf_counter()
        await until(lambda: consumer.partitions()[0].position >= records + 1 + route)
        took = time.perf_counter() - began
        rss, peak = status("VmRSS"), status("VmHWM")
        left = consumer.partitions()[0].retry_pending
        print(f"routed {route} more events in {took:.2f} s; pending {left}")
        print(
            f"RSS after routing:              {mb(rss)}  (+{mb(rss - baseline).strip()} "
            f"over baseline; peak {mb(peak).strip()})"
        )
    consumer.stop()
    await task
    if not url.startswith("sqlite:"):  # a shared server: leave nothing behind
        config = ConsumerConfig(topic=TOPIC, group=GROUP)
        for topic in (TOPIC, config.retry_topic(TOPIC), config.dead_letter_topic(TOPIC)):
            await log.delete_topic(topic)
    await log.close()
    verdict = "meets" if peak < 100e6 else "MISSES"
    print(f"peak RSS {mb(peak).strip()}: {verdict} the target (< 100 MB)")


def log_url(text: str) -> str:
    """``--log``: a URL :func:`wakuwaku.open_log` takes, of a log that outlives the
    process that fills it (the log is opened, not connected, and closed again)."""
    try:
        log = wk.open_log(text)
    except (ValueError, ImportError) as exc:  # ConfigError, UnsupportedLogURL; a missing extra
        raise argparse.ArgumentTypeError(str(exc)) from None
    asyncio.run(log.close())
    if isinstance(log, wk.MemoryLog):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a memory log lives in one process, and another one fills it"
        )
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=positive_int, default=1_000_000)
    parser.add_argument("--keys", type=positive_int, default=10_000)
    parser.add_argument(
        "--body", type=non_negative_int, default=200, help="payload bytes per event"
    )
    parser.add_argument(
        "--route",
        type=non_negative_int,
        default=50_000,
        help="main-topic events routed while the keys are quarantined (0: none)",
    )
    parser.add_argument(
        "--log",
        type=log_url,
        default=None,
        metavar="URL",
        help="a log URL with its own prefix (redis://...?prefix=..., "
        "nats://...?prefix=...); default: a new SQLite file, fsync off",
    )
    parser.add_argument("--fill", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.records < args.keys:
        parser.error(
            f"--records {args.records} is fewer than --keys {args.keys}: "
            "every key holds at least one pending record"
        )
    return args


def main() -> None:
    args = parse_args()
    if args.fill is not None:
        asyncio.run(fill(args.fill, args.records, args.keys, args.body))
        return
    with tempfile.TemporaryDirectory() as tmp:
        url = args.log or f"sqlite:///{Path(tmp) / 'log.db'}?fsync=0"
        began = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--fill",
                url,
                "--records",
                str(args.records),
                "--keys",
                str(args.keys),
                "--body",
                str(args.body),
            ],
            check=True,
        )
        print(
            f"filled {args.records} pending retry records over {args.keys} keys "
            f"({args.body}-byte payloads, {url.split(':', 1)[0]}) in "
            f"{time.perf_counter() - began:.1f} s (another process)"
        )
        asyncio.run(measure(url, args.records, args.keys, args.route, args.body))


if __name__ == "__main__":
    main()
