"""A consumer for subprocess tests: records every handled event id in a file.

Settings come from the environment (a subprocess test sets them):

- ``WK_TEST_OUT``: the file each handled event id is appended to, one per
  line, flushed and fsynced before ``handle`` returns;
- ``WK_TEST_TOPIC`` (default ``ticks``), ``WK_TEST_GROUP`` (default ``recorder``);
- ``WK_TEST_MODE``: a :class:`~wakuwaku.engine.DeliveryMode` member name;
- ``WK_TEST_KILL_AFTER``: after handling this many events, the process
  SIGKILLs itself inside ``handle`` (after the ids are on disk), mid-batch;
- ``WK_TEST_HANDLE_SECONDS``: how long each ``handle`` call takes (real seconds),
  so a signal can arrive while a batch is being processed;
- ``WK_TEST_CALLS``: a file a line is appended to (and fsynced) when each
  ``handle`` call starts, before its pause: a test waits on it to know a
  chunk is running;
- ``WK_TEST_FAIL``: comma-separated ids whose handling raises Unrecoverable;
- ``WK_TEST_MEMBER`` (default ``recorder``): the member id;
- ``WK_TEST_LEASE_TTL`` (default the config's): the partition lease TTL, seconds;
- ``WK_TEST_PARTITIONS``: comma-separated partitions to consume (default all);
- ``WK_TEST_RETRY_TOPIC``, ``WK_TEST_DEAD_LETTER_TOPIC``: configured retry and
  dead-letter topic names (default: the derived ones).

The member id defaults to a fixed one (``recorder``), so a process restarted
after a SIGKILL takes its partition lease back at once instead of waiting for
the dead process's lease to expire (design §15). Two processes of one group that
must compete for partitions get distinct ids through ``WK_TEST_MEMBER``.

``build(log)`` is the ``wakuwaku run`` target; the log is the one ``--log`` names.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

import msgspec

from wakuwaku import Unrecoverable, event
from wakuwaku.engine import Consumer, ConsumerConfig, DeliveryMode, Handler
from wakuwaku.logs import Log

POLL_RECORDS = 10
"""Records per batch: a kill after N events with N % 10 != 0 is mid-batch."""


@event("tests.recorder.tick", key="key")
class Tick(msgspec.Struct, frozen=True):
    """One event; ``id`` is unique."""

    key: str
    id: int


def build(log: Log) -> Consumer:
    """The consumer described in the module docstring."""
    out = os.environ["WK_TEST_OUT"]
    kill_after = int(os.environ.get("WK_TEST_KILL_AFTER", "0"))
    pause = float(os.environ.get("WK_TEST_HANDLE_SECONDS", "0"))
    failing = {int(x) for x in os.environ.get("WK_TEST_FAIL", "").split(",") if x}
    handled = 0
    lease_ttl = float(os.environ.get("WK_TEST_LEASE_TTL") or 15.0)  # 15.0: the config's default
    partitions = [int(x) for x in os.environ.get("WK_TEST_PARTITIONS", "").split(",") if x]
    calls = os.environ.get("WK_TEST_CALLS")

    def handle(events: Sequence[Tick]) -> None:
        nonlocal handled
        if calls:
            with open(calls, "a", encoding="utf-8") as file:
                file.write(f"{events[0].key}\n")
                file.flush()
                os.fsync(file.fileno())
        if pause:
            time.sleep(pause)
        for tick in events:
            if tick.id in failing:
                raise Unrecoverable(f"tick {tick.id} is poison")
        with open(out, "a", encoding="utf-8") as file:
            file.writelines(f"{tick.id}\n" for tick in events)
            file.flush()
            os.fsync(file.fileno())
        handled += len(events)
        if kill_after and handled >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    topic = os.environ.get("WK_TEST_TOPIC", "ticks")
    retry, dead = os.environ.get("WK_TEST_RETRY_TOPIC"), os.environ.get("WK_TEST_DEAD_LETTER_TOPIC")
    config = ConsumerConfig(
        topic=topic,
        retry_topics={topic: retry} if retry else {},
        dead_letter_topics={topic: dead} if dead else {},
        group=os.environ.get("WK_TEST_GROUP", "recorder"),
        delivery_mode=DeliveryMode[os.environ.get("WK_TEST_MODE", "NO_EVENT_LOSE")],
        max_poll_records=POLL_RECORDS,
        max_concurrency=1,
        poll_interval=0.01,
        retry_delays=(0.05,),
        member_id=os.environ.get("WK_TEST_MEMBER", "recorder"),
        partitions=partitions or None,
        lease_ttl=lease_ttl,
    )
    return Consumer(config, [Handler(Tick, handle)], log)


def not_a_consumer() -> int:
    """A factory that returns the wrong thing (for the CLI's error test)."""
    return 42


def broken() -> Consumer:
    """A factory that raises (for the CLI's error test)."""
    raise RuntimeError("the factory is broken")


NOT_CALLABLE = "just a string"


async def seed(
    path: str, count: int, *, partitions: int = 1, keys: int = 1, topic: str = "ticks"
) -> list[int]:
    """Create ``topic`` in the SQLite log at ``path`` and publish ``count`` ticks
    (ids 0..count-1, keys ``k0``..); returns the ids."""
    from wakuwaku import Producer
    from wakuwaku.logs.sqlite import SQLiteLog

    log = SQLiteLog(path)
    try:
        await log.create_topic(topic, partitions)
        await Producer(log, topic).publish_many(Tick(f"k{i % keys}", i) for i in range(count))
    finally:
        await log.close()
    return list(range(count))


def handled_ids(out: str) -> list[int]:
    """The ids the consumer wrote to ``out``, in order (empty when it wrote none)."""
    if not os.path.exists(out):
        return []
    with open(out, encoding="utf-8") as file:
        return [int(line) for line in file if line.strip()]
