"""Delivery modes under a crash (design §5.9, §7, §14): a real ``wakuwaku run`` process on
the SQLite log is SIGKILLed inside a batch, then restarted without the kill.

- ``NO_EVENT_LOSE`` stores a batch's offset after the batch: every event is
  handled at least once, those of the batch in flight twice;
- ``NO_DOUBLE_CONSUME`` stores it before: no event is handled twice, the
  rest of the batch in flight is lost.

The consumer is ``tests/engine/consumers/recorder.py``: batches of 10, one
key, each handled id appended to a file and fsynced before ``handle``
returns; with ``WK_TEST_KILL_AFTER=15`` it kills itself with SIGKILL inside
``handle`` right after id 14 reached the file (the second batch, 10..19,
is half done).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, DeliveryMode, Handler
from wakuwaku.testing import FakeClock

from .consumers import recorder

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 30
KILL_AFTER = 15
IN_FLIGHT = set(range(10, 20))


def run_consumer(
    db: Path, out: Path, mode: str, *, kill_after: int = 0
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "WK_TEST_OUT": str(out),
        "WK_TEST_MODE": mode,
        "WK_TEST_KILL_AFTER": str(kill_after),
    }
    env.pop("WAKUWAKU_LOG", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "wakuwaku",
            "run",
            "tests.engine.consumers.recorder:build",
            "--drain",
            "--log",
            f"sqlite:///{db}",
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def crash_and_restart(tmp_path: Path, mode: str) -> Counter[int]:
    db, out = tmp_path / "log.db", tmp_path / "handled.txt"
    asyncio.run(recorder.seed(str(db), EVENTS))
    crashed = run_consumer(db, out, mode, kill_after=KILL_AFTER)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert recorder.handled_ids(str(out)) == list(range(KILL_AFTER))
    restarted = run_consumer(db, out, mode)
    assert restarted.returncode == 0, restarted.stderr
    return Counter(recorder.handled_ids(str(out)))


@pytest.mark.slow
def test_no_event_lose_handles_every_event_at_least_once_after_a_kill(tmp_path: Path) -> None:
    counts = crash_and_restart(tmp_path, "NO_EVENT_LOSE")
    assert set(counts) == set(range(EVENTS)), "an event was lost"
    twice = {i for i, n in counts.items() if n > 1}
    assert twice, "the batch in flight was not delivered again"
    assert twice <= IN_FLIGHT and max(counts.values()) == 2
    assert twice == set(range(10, KILL_AFTER))


@pytest.mark.slow
def test_no_double_consume_never_handles_an_event_twice_after_a_kill(tmp_path: Path) -> None:
    counts = crash_and_restart(tmp_path, "NO_DOUBLE_CONSUME")
    assert max(counts.values()) == 1, f"handled twice: {[i for i, n in counts.items() if n > 1]}"
    lost = set(range(EVENTS)) - set(counts)
    assert lost, "nothing of the batch in flight was lost: the offset was not stored first"
    assert lost <= IN_FLIGHT
    assert lost == set(range(KILL_AFTER, 20))


# -------------------------------------------------------- graceful stop, in process


@wk.event("tests.delivery.step", key="key")
class Step(msgspec.Struct, frozen=True):
    key: str
    n: int


async def stop_after_three(
    mode: DeliveryMode,
) -> tuple[wk.MemoryLog, list[int], ConsumerConfig, Handler[Step], list[Consumer]]:
    """One key, one batch of 10; the handler asks for a stop (as SIGTERM does) after 3."""
    log = wk.MemoryLog()
    await log.create_topic("steps", 1)
    await wk.Producer(log, "steps").publish_many(Step("k", n) for n in range(10))
    handled: list[int] = []
    consumers: list[Consumer] = []

    async def handle(chunk: Sequence[Step]) -> None:
        handled.extend(s.n for s in chunk)
        if len(handled) == 3:
            consumers[-1].stop()

    config = ConsumerConfig(
        topic="steps",
        group="g",
        clock=FakeClock(),
        delivery_mode=mode,
        max_poll_records=10,
        lease_ttl=3600.0,
    )
    handler = Handler(Step, handle)
    consumers.append(Consumer(config, [handler], log))
    await consumers[-1].run(install_signal_handlers=False)
    assert handled == [0, 1, 2], "a chunk started after the stop"
    return log, handled, config, handler, consumers


async def test_no_event_lose_graceful_stop_mid_batch_stores_the_offset_of_what_was_handled() -> (
    None
):
    log, handled, config, handler, consumers = await stop_after_three(DeliveryMode.NO_EVENT_LOSE)
    assert await log.committed("g", "steps", 0) == 3
    consumers.append(Consumer(config, [handler], log))
    await consumers[-1].drain()
    assert handled == list(range(10)), "handled again after a graceful stop"


async def test_no_double_consume_graceful_stop_mid_batch_loses_nothing_it_did_not_start() -> None:
    log, handled, config, handler, consumers = await stop_after_three(
        DeliveryMode.NO_DOUBLE_CONSUME
    )
    consumers.append(Consumer(config, [handler], log))
    await consumers[-1].drain()
    assert handled == list(range(10)), "events never started were lost at a graceful stop"


async def test_graceful_stop_between_batches_neither_loses_nor_repeats() -> None:
    """The boundary the two tests above are about: a stop when a batch is done is exact."""
    for mode in DeliveryMode:
        log = wk.MemoryLog()
        await log.create_topic("steps", 1)
        await wk.Producer(log, "steps").publish_many(Step("k", n) for n in range(10))
        handled: list[int] = []
        consumers: list[Consumer] = []

        async def handle(
            chunk: Sequence[Step],
            handled: list[int] = handled,
            consumers: list[Consumer] = consumers,
        ) -> None:
            handled.extend(s.n for s in chunk)
            if len(handled) == 5:
                consumers[-1].stop()

        config = ConsumerConfig(
            topic="steps",
            group="g",
            clock=FakeClock(),
            delivery_mode=mode,
            max_poll_records=5,
            lease_ttl=3600.0,
        )
        consumers.append(Consumer(config, [Handler(Step, handle)], log))
        await consumers[-1].run(install_signal_handlers=False)
        assert await log.committed("g", "steps", 0) == 5
        consumers.append(Consumer(config, [Handler(Step, handle)], log))
        await consumers[-1].drain()
        assert handled == list(range(10)), mode
