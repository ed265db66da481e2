"""Pipelining across batches (``docs/engine.md``, "Pipelining across batches").

A partition starts its next batch while the last keys of the running one
finish, at most two batches in flight. These tests hold one key's handler on
an ``asyncio.Event`` and watch what else runs meanwhile:

- the other keys of the next batch run at once;
- the slow key's segment of the next batch starts only after its segment of
  the batch before ended (per-key order), and is routed to the retry topic
  instead when that one quarantined the key;
- the stored offset never passes a record not done: a stop or a crash while
  the slow key runs loses nothing, and after a restart every key's events
  come in order.

Every poll asks for 4 records (``max_poll_records``), so the batches are
known: ``A0 B1 B2 B3 | A4 B5 C6 C7 | C8 C9 B10 B11`` (letter: key, number:
the event's ``n`` and its offset).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

import wakuwaku as wk
from wakuwaku._records import H_MARKER
from wakuwaku.engine import Consumer, ConsumerStats, Handler
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import Item, Script, consumer, read_all, setup_topic, wait_until

BATCHES = [["A", "B", "B", "B"], ["A", "B", "C", "C"], ["C", "C", "B", "B"]]
KEYS = [key for batch in BATCHES for key in batch]
SIZE = len(BATCHES[0])


def expected(key: str, ns: range | None = None) -> list[int]:
    """The ``n`` of ``key``'s events, in order (of those in ``ns``)."""
    return [n for n, k in enumerate(KEYS) if k == key and (ns is None or n in ns)]


async def start(log: Log, clock: FakeClock, script: Script, **overrides: object) -> Consumer:
    producer = await setup_topic(log)
    await producer.publish_many(Item(key, n) for n, key in enumerate(KEYS))
    options: dict[str, object] = {
        "max_poll_records": SIZE,
        "max_concurrency": 4,
        "retry_delays": [3600.0],
        "log_retry_delays": [0],
        "shutdown_timeout": 3600.0,
    }
    options.update(overrides)
    return consumer(log, clock, [Handler(Item, script)], **options)


async def hold_a(
    log: Log, clock: FakeClock, **overrides: object
) -> tuple[Consumer, Script, asyncio.Task[ConsumerStats]]:
    """A consumer running with key A's handler held on its first event, once
    the second batch's other keys (B5, C6, C7) are handled beside it."""
    script = Script(clock)
    script.gate["A"] = asyncio.Event()
    c = await start(log, clock, script, **overrides)
    runner = asyncio.create_task(c.run(install_signal_handlers=False))
    await wait_until(
        clock,
        lambda: {5, 6, 7} <= set(script.handled_ns()) or runner.done(),
    )
    assert not runner.done()
    return c, script, runner


async def test_a_slow_key_does_not_hold_up_the_next_batchs_other_keys(
    log: Log, clock: FakeClock
) -> None:
    c, script, runner = await hold_a(log, clock)
    # A0 still runs, and the second batch's B and C are done beside it.
    assert script.handled_ns("A") == []
    assert script.handled_ns("B") == [1, 2, 3, 5]
    assert script.handled_ns("C") == [6, 7]
    # At most two batches in flight: the third waits for the first to be stored.
    for _ in range(20):
        await clock.sleep(0.01)
    assert not set(script.handled_ns()) & {8, 9, 10, 11}
    script.gate["A"].set()
    await wait_until(clock, lambda: len(script.handled) == len(KEYS))
    c.stop()
    await runner
    assert await log.committed("g", "t", 0) == len(KEYS)


async def test_a_keys_segments_run_in_order_across_batches(log: Log, clock: FakeClock) -> None:
    c, script, runner = await hold_a(log, clock)
    # A4 (second batch) waits for A0 (first batch) to end: not even called.
    assert [call[1] for call in script.calls].count("A") == 1
    script.gate["A"].set()
    await wait_until(clock, lambda: len(script.handled) == len(KEYS))
    c.stop()
    await runner
    for key in "ABC":
        assert script.handled_ns(key) == expected(key), key
    assert [e.n for _, k, run in script.calls if k == "A" for e in run] == [0, 4]


async def test_a_stop_while_a_slow_key_runs_stores_the_first_record_not_done(
    log: Log, clock: FakeClock
) -> None:
    c, script, runner = await hold_a(log, clock)
    # B5, C6 and C7 are done, but A0 is not: nothing past it is stored.
    assert await log.committed("g", "t", 0) in (None, 0)
    c.stop()
    script.gate["A"].set()  # the running chunk finishes; A4 never starts
    await runner
    assert script.handled_ns("A") == [0]
    assert await log.committed("g", "t", 0) == 4
    restarted = Script(clock)
    await (await start_again(log, clock, restarted)).drain()
    # A4 comes again with the records after it (B5, C6, C7: at-least-once).
    assert restarted.handled_ns() == list(range(4, len(KEYS)))
    for key in "ABC":
        assert restarted.handled_ns(key) == expected(key, range(4, len(KEYS))), key


async def test_a_crash_while_a_slow_key_runs_loses_nothing(log: Log, clock: FakeClock) -> None:
    c, script, runner = await hold_a(log, clock)
    assert await log.committed("g", "t", 0) in (None, 0)
    c.force_stop()  # what a crash leaves: the running chunk is cancelled
    await asyncio.wait_for(runner, timeout=60.0)
    assert script.handled_ns("A") == []
    assert await log.committed("g", "t", 0) in (None, 0)
    restarted = Script(clock)
    await (await start_again(log, clock, restarted)).drain()
    for key in "ABC":
        assert restarted.handled_ns(key) == expected(key), key


async def test_a_key_quarantined_in_a_batch_has_its_next_batchs_records_routed(
    log: Log, clock: FakeClock
) -> None:
    """A0 fails Retryable after the second batch was planned: A4 was planned
    to run, and is routed to the retry topic when its turn comes instead."""
    script = Script(clock)
    script.gate["A"] = asyncio.Event()
    script.fail[0] = [wk.Retryable("row not there yet")]
    c = await start(log, clock, script)
    runner = asyncio.create_task(c.run(install_signal_handlers=False))
    await wait_until(clock, lambda: {5, 6, 7} <= set(script.handled_ns()) or runner.done())
    assert not runner.done()
    script.gate["A"].set()
    await wait_until(clock, lambda: set(script.handled_ns()) == set(range(len(KEYS))) - {0, 4})
    c.stop()
    await runner
    assert await log.committed("g", "t", 0) == len(KEYS)
    # A was called once (A0, failed); A4 never ran: it waits behind A0 in the retry topic.
    assert [k for _, k, _ in script.calls].count("A") == 1
    work = [r for r in await read_all(log, "wk-retry.g.t") if H_MARKER not in r.headers]
    assert [msgspec.json.decode(r.body)["n"] for r in work] == [0, 4]
    for key in "BC":
        assert script.handled_ns(key) == expected(key), key


async def start_again(log: Log, clock: FakeClock, script: Script) -> Consumer:
    return consumer(
        log,
        clock,
        [Handler(Item, script)],
        max_poll_records=SIZE,
        max_concurrency=4,
        retry_delays=[3600.0],
        log_retry_delays=[0],
    )


async def test_the_two_batches_lanes_together_stay_within_max_concurrency(
    log: Log, clock: FakeClock
) -> None:
    """``A0 B1 B2 B3 | C4 D5 C6 D7`` at ``max_concurrency`` 2: while A0 runs,
    the second batch gets the one lane left; C takes it, D waits for it."""
    keys = ["A", "B", "B", "B", "C", "D", "C", "D"]
    producer = await setup_topic(log)
    await producer.publish_many(Item(key, n) for n, key in enumerate(keys))
    script = Script(clock)
    script.gate["A"] = asyncio.Event()
    script.gate["C"] = asyncio.Event()
    running: set[str] = set()
    most = 0

    async def handle(run: Sequence[Item]) -> None:
        nonlocal most
        running.add(run[0].key)
        most = max(most, len(running))
        try:
            await script(run)
        finally:
            running.discard(run[0].key)

    c = consumer(
        log,
        clock,
        [Handler(Item, handle)],
        max_poll_records=4,
        max_concurrency=2,
        retry_delays=[3600.0],
        log_retry_delays=[0],
        shutdown_timeout=3600.0,
    )
    runner = asyncio.create_task(c.run(install_signal_handlers=False))
    await wait_until(clock, lambda: running == {"A", "C"} or runner.done())
    assert not runner.done()
    for _ in range(20):
        await clock.sleep(0.01)
    assert [k for _, k, _ in script.calls] == ["A", "B", "B", "B", "C"]  # D waits for a lane
    script.gate["C"].set()
    await wait_until(clock, lambda: script.handled_ns("D") == [5, 7])
    assert script.handled_ns("A") == []
    script.gate["A"].set()
    await wait_until(clock, lambda: len(script.handled) == len(keys))
    c.stop()
    await runner
    assert most == 2
    assert await log.committed("g", "t", 0) == len(keys)


async def test_a_batch_stored_beside_a_running_one_stores_that_ones_first_record_not_done(
    log: Log, clock: FakeClock
) -> None:
    """``A0 B1 B2 B3 | B4 C5 D6 D7``, A and D held: when A0 ends, the first
    batch is stored at D6 (B4 and C5 of the second batch are done), not at 4,
    so a crash then delivers again from D6 only."""
    keys = ["A", "B", "B", "B", "B", "C", "D", "D"]
    script = Script(clock)
    script.gate["A"] = asyncio.Event()
    script.gate["D"] = asyncio.Event()
    producer = await setup_topic(log)
    await producer.publish_many(Item(key, n) for n, key in enumerate(keys))
    c = consumer(
        log,
        clock,
        [Handler(Item, script)],
        max_poll_records=SIZE,
        max_concurrency=4,
        shutdown_timeout=3600.0,
    )
    runner = asyncio.create_task(c.run(install_signal_handlers=False))
    await wait_until(clock, lambda: {4, 5} <= set(script.handled_ns()) or runner.done())
    assert not runner.done()
    assert await log.committed("g", "t", 0) in (None, 0)
    script.gate["A"].set()
    await wait_until(
        clock,
        lambda: ((view := c.partition("t", 0)) is not None and view.position == 6) or runner.done(),
    )
    assert await log.committed("g", "t", 0) == 6
    assert script.handled_ns("D") == []
    c.force_stop()  # a crash: D6's running chunk is cancelled
    await asyncio.wait_for(runner, timeout=60.0)
    assert await log.committed("g", "t", 0) == 6
    restarted = Script(clock)
    await (await start_again(log, clock, restarted)).drain()
    assert restarted.handled_ns() == [6, 7]
