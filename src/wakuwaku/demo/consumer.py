"""The flights demo's consumer process: ``python -m wakuwaku.demo.consumer ...``.

It runs in its own process so the demo's chaos can kill it with SIGKILL and
start it again. It consumes ``planes`` and ``flights`` into the projection.
The demo drives it with the file named by ``--done``: once it exists and the
consumer is idle (every partition read to the log's end offsets, checked
after reading the file, and no key quarantined), the
consumer writes the file's text to ``<done>.ack``; when that text is
``stop`` it then stops, otherwise it goes on consuming (the replay phase
reuses it). Every 0.1 s, and before each ack and at exit, it writes its
counters to ``--stats`` as JSON (a killed run keeps its last snapshot).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..engine import Consumer, ConsumerConfig
from ..engine.classifiers import classify_sqlite
from ..logs import open_log
from .flights import FLIGHTS_TOPIC, GROUP, PLANES_TOPIC, Projection

STATS_EVERY = 0.1
LOG_URL_ENV = "WAKUWAKU_DEMO_LOG"
"""The environment variable that gives the consumer its log URL when ``--log``
is not given (the demo passes it there: a command line is visible to every
user of the machine, with the URL's password)."""


def build(
    log_url: str, projection: Projection, retry_delays: Sequence[float], partitions_owner: str
) -> Consumer:
    """The demo's consumer over the log at ``log_url``, writing ``projection``."""
    config = ConsumerConfig(
        topic=(PLANES_TOPIC, FLIGHTS_TOPIC),
        group=GROUP,
        retry_delays=tuple(retry_delays),
        classify=classify_sqlite,
        max_poll_records=10_000,
        poll_interval=0.02,
        member_id=partitions_owner,
        shutdown_timeout=10.0,
    )
    return Consumer(config, projection.handlers(), open_log(log_url))


def _dump(consumer: Consumer, path: Path) -> None:
    stats = consumer.stats.as_dict()
    # The keys quarantined now (the metrics' wakuwaku_quarantined_keys gauge).
    stats["quarantined_now"] = sum(len(w.retry.keys) for w in list(consumer.workers.values()))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats))
    os.replace(tmp, path)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


async def run(
    log_url: str, projection: Path, retry_delays: Sequence[float], stats: Path, done: Path
) -> int:
    """Consume until the producers are done and everything is handled."""
    # A stable member id: a restarted demo consumer takes its leases back at once.
    target = Projection(projection)
    consumer = build(log_url, target, retry_delays, "flights-demo-consumer")
    for handler in consumer.handlers.values():
        if handler.inbox is not None:
            await handler.inbox.ensure_schema()
    runner = asyncio.create_task(consumer.run())
    ack = done.with_name(done.name + ".ack")
    acked = ""
    try:
        while not runner.done():
            await asyncio.sleep(STATS_EVERY)
            _dump(consumer, stats)
            if not consumer.idle():
                continue
            token = await asyncio.to_thread(_read_text, done)
            # The token is written after the records it is about: checking the
            # log's end offsets after reading it covers them (a partition's
            # caught-up flag may date from a poll before they arrived).
            if token is not None and token != acked and await consumer.at_end():
                acked = token
                tmp = ack.with_suffix(".tmp")
                tmp.write_text(token)
                os.replace(tmp, ack)
                if token == "stop":
                    consumer.stop()
        await runner
    finally:
        _dump(consumer, stats)
        await consumer.log.close()
        target.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wakuwaku.demo.consumer")
    parser.add_argument("--log", default=os.environ.get(LOG_URL_ENV))
    parser.add_argument("--projection", type=Path, required=True)
    parser.add_argument("--retry-delays", required=True)
    parser.add_argument("--stats", type=Path, required=True)
    parser.add_argument("--done", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.log:
        parser.error(f"--log (or the environment variable {LOG_URL_ENV}) is required")
    logging.basicConfig(
        level=logging.ERROR, stream=sys.stderr, format="consumer %(levelname)s %(message)s"
    )
    logging.getLogger("wakuwaku.consumer").setLevel(logging.CRITICAL)
    delays = [float(d) for d in args.retry_delays.split(",")]
    return asyncio.run(run(args.log, args.projection, delays, args.stats, args.done))


if __name__ == "__main__":
    sys.exit(main())
