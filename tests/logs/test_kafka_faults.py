"""The Kafka log when its broker goes away: a broker this test starts on its own ports.

The shared broker (127.0.0.1:9092) is never touched: the test formats and
starts its own single-node KRaft broker from the same jars
(``$WAKUWAKU_SERVICES_DIR/kafka/lib``, default ``.services/kafka/lib``, as
``ci/services.sh`` installs them) with ``ci/kafka/server.properties`` on two
free loopback ports and a data folder of its own, stops it in the middle of
a consumer's run and starts it again on the same data.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import confluent_kafka
import msgspec
import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs import BatchWrite
from wakuwaku.logs.kafka import KafkaLog

from ..faults.servers import KafkaBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

_T = TypeVar("_T")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    own = KafkaBroker(tmp_path)
    own.start()
    try:
        yield own
    finally:
        own.close()


@pytest.fixture
async def log(broker: KafkaBroker) -> AsyncIterator[KafkaLog]:
    created = KafkaLog(f"127.0.0.1:{broker.port}", timeout=3.0)
    try:
        yield created
    finally:
        await created.close()


@wk.event("faults.step", key="key")
class Step(msgspec.Struct, frozen=True):
    key: str
    n: int


# Over the 120 s default: on a loaded 2-core machine the broker's stop and its
# start again each take up to a minute; the test waits on what it observes.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_a_broker_restart_pauses_the_consumer_and_loses_nothing(
    broker: KafkaBroker, log: KafkaLog, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    # The broker stopped (SIGTERM: a controlled shutdown) or killed (SIGKILL:
    # the group coordinator and the transaction state are reloaded from the
    # log at the restart) while a consumer runs, started again on its data
    # a moment later: the consumer pauses, retries, and handles every event
    # once the broker answers, in key order. Completion is waited on, never
    # a fixed time.
    events = 600
    await log.create_topic("steps", 2)
    await wk.Producer(log, "steps").publish_many(
        [Step(f"k{i % 12}", i // 12) for i in range(events)]
    )
    seen: list[tuple[str, int]] = []
    restarted = asyncio.Event()
    quarter, complete = asyncio.Event(), asyncio.Event()
    after: list[tuple[str, int]] = []

    async def handle(run: Sequence[Step]) -> None:
        seen.extend((s.key, s.n) for s in run)
        if restarted.is_set():
            after.extend((s.key, s.n) for s in run)
        if len(seen) >= events // 4:
            quarter.set()
        if len(set(seen)) >= events:
            complete.set()
        await asyncio.sleep(0.02)

    config = ConsumerConfig(
        topic="steps",
        group="g",
        poll_interval=0.01,
        max_poll_records=20,
        retry_delays=(0.2, 0.5, 1.0),
        lease_ttl=30.0,
    )
    consumer = Consumer(config, [Handler(Step, handle, max_batch=5)], log)

    async def restart() -> None:
        await quarter.wait()
        await asyncio.to_thread(broker.kill if how == "kill" else broker.stop)
        await asyncio.sleep(4.0)  # the outage lasts
        await asyncio.to_thread(broker.start)
        restarted.set()

    with caplog.at_level(logging.WARNING, logger="wakuwaku"):
        fault = asyncio.create_task(restart())
        runner = asyncio.create_task(consumer.run(install_signal_handlers=False))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(complete.wait(), 240)
        consumer.stop()
        stats = await runner
        await fault
    assert restarted.is_set()
    handled = f"{len(set(seen))} of {events} handled, {len(after)} after the restart"
    assert complete.is_set(), handled
    assert set(seen) == {(f"k{k}", n) for k in range(12) for n in range(events // 12)}
    for key in {k for k, _ in seen}:
        ns = [n for k, n in seen if k == key]
        assert all(b <= a + 1 for a, b in itertools.pairwise(ns)), key
    assert stats.log_call_retries > 0
    assert any(r.getMessage() == "log call failed; retrying" for r in caplog.records)


async def test_a_commit_on_a_fresh_broker_is_read_back_at_once(log: KafkaLog) -> None:
    # A broker started fresh creates __consumer_offsets at the first group
    # call, and loads its partitions one by one: a coordinator still loading
    # answers the commit of its groups with COORDINATOR_LOAD_IN_PROGRESS for
    # the partition. A commit that returns is stored: read back at once,
    # every time, never "no offset" (the groups spread over the partitions
    # of __consumer_offsets).
    await log.create_topic("fresh", 1)
    groups = [f"g{n}" for n in range(8)]
    await asyncio.gather(*(log.commit(g, "fresh", 0, 1) for g in groups))
    for g in groups:
        assert [await log.committed(g, "fresh", 0) for _ in range(3)] == [1, 1, 1], g


async def _answer(what: str, call: Callable[[], Awaitable[_T]]) -> _T:
    """Ask until ``call`` answers; meanwhile it may only raise
    LogUnavailableError (never another error), for 60 s at most."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await call()
        except wk.LogUnavailableError as exc:
            assert time.monotonic() < deadline, f"{what}: still unavailable after 60 s: {exc}"


async def _settled(what: str, call: Callable[[], Awaitable[object]], expected: object) -> None:
    """Ask until ``call`` answers, which must be ``expected`` (see :func:`_answer`)."""
    assert await _answer(what, call) == expected, what


async def test_after_a_freeze_the_log_answers_again(broker: KafkaBroker, log: KafkaLog) -> None:
    # SIGSTOP for longer than the broker's session with its own controller
    # (9 s): once it runs again it is fenced for a moment, its partitions
    # without a leader and the group coordinator reloading. Every call
    # answers right or raises LogUnavailableError, until it answers right.
    await log.create_topic("frozen", 1)
    await log.append("frozen", 0, [({"wk-key": b"k"}, b"0")])
    await log.commit("g", "frozen", 0, 1)
    broker.freeze()
    try:
        await asyncio.sleep(15)
    finally:
        broker.thaw()
    await _settled("append", lambda: log.append("frozen", 0, [({"wk-key": b"k"}, b"1")]), [1])
    await _settled("committed", lambda: log.committed("g", "frozen", 0), 1)
    await _settled("start offsets", lambda: log.start_offsets("frozen"), {0: 0})
    await _settled("end offsets", lambda: log.end_offsets("frozen"), {0: 2})
    await _settled("commit", lambda: log.commit("g", "frozen", 0, 2), None)
    assert await log.committed("g", "frozen", 0) == 2


@pytest.mark.parametrize(("outcome", "failing"), [("commit", True), ("abort", False)])
async def test_a_drain_ends_past_a_transaction_marker(
    broker: KafkaBroker, log: KafkaLog, outcome: str, failing: bool
) -> None:
    # Three events of ours, then one of a plain transactional producer,
    # committed or aborted: the partition ends with a transaction marker (an
    # offset no reader is given), after an aborted record or not. The drain
    # still ends, at lag 0, with a key failing Retryable once or not.
    await log.create_topic("marked", 1)
    await wk.Producer(log, "marked").publish_many([Step("k", n) for n in range(3)])
    _, (outgoing, body) = wk.Producer(log, "marked").encode(Step("k", 3))
    plain = confluent_kafka.Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{broker.port}",
            "transactional.id": "plain",
            "log_level": 2,
        }
    )
    plain.init_transactions(30)
    plain.begin_transaction()
    headers: list[tuple[str, str | bytes | None]] = [
        (k, v) for k, v in outgoing.items() if k != "wk-key"
    ]
    plain.produce("marked", body, b"k", 0, headers=headers)
    plain.flush(30)
    (plain.commit_transaction if outcome == "commit" else plain.abort_transaction)(30)
    del plain
    deadline = time.monotonic() + 30  # the markers are written after the commit returns
    while await log.end_offsets("marked") != {0: 5}:
        assert time.monotonic() < deadline, await log.end_offsets("marked")
        await asyncio.sleep(0.05)
    seen: list[int] = []
    failed: list[int] = []

    async def handle(run: Sequence[Step]) -> None:
        if failing and not failed and run[0].n == 1:
            failed.append(1)
            raise wk.Retryable("once")
        seen.extend(s.n for s in run)

    config = ConsumerConfig(topic="marked", group="g", poll_interval=0.05, retry_delays=(0.1,))
    consumer = Consumer(config, [Handler(Step, handle)], log)
    await asyncio.wait_for(consumer.drain(), 60)
    assert sorted(seen) == ([0, 1, 2, 3] if outcome == "commit" else [0, 1, 2])
    assert len(failed) == int(failing)
    assert await log.committed("g", "marked", 0) == 5


async def test_cancelled_waiting_reads_cost_little(log: KafkaLog) -> None:
    # A waiting read that is cancelled (a consumer stopping, a prefetch
    # dropped) stops its fetch. Its fetch thread used to go on for the whole
    # wait: 50 of them held the default executor's few workers for about
    # 40 s, and consumed what the next read was waiting for. Now 50
    # cancelled reads and a read of a record appended after them take a
    # few seconds (3 s measured on a loaded machine).
    await log.create_topic("idle", 1)
    assert await log.read("idle", 0, 0) == []
    started = time.monotonic()
    for _ in range(50):
        read = asyncio.ensure_future(log.read("idle", 0, 0, wait=5.0))
        await asyncio.sleep(0.01)
        read.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await read
    await log.append("idle", 0, [({"wk-key": b"k"}, b"x")])
    records = await log.read("idle", 0, 0, wait=30.0)
    took = time.monotonic() - started
    assert [r.body for r in records] == [b"x"]
    assert took < 20, f"50 cancelled reads and one read took {took:.1f} s"


_ASKING = """
import asyncio, sys, time
from wakuwaku import LogUnavailableError
from wakuwaku.logs.kafka import KafkaLog

async def main() -> int:
    log = KafkaLog(sys.argv[1], timeout=10.0)
    await log.create_topic("asked", 2)
    for p in (0, 1):
        await log.commit("g", "asked", p, 1)
    print("ready", flush=True)
    failed = False
    deadline = time.monotonic() + 90

    async def ask(p: int) -> bool:
        nonlocal failed
        while time.monotonic() < deadline:
            try:
                found = await log.committed("g", "asked", p)
            except LogUnavailableError:
                failed = True
                continue
            assert found == 1, found
            if failed:
                return True
            await asyncio.sleep(0.01)
        return False

    answered = await asyncio.gather(*(ask(p) for p in (0, 1, 0, 1)))
    await log.close()
    return 0 if all(answered) else 1

sys.exit(asyncio.run(main()))
"""


async def test_committed_asked_through_a_broker_kill_answers_again(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    # committed() asked all the time (as partition workers do while they wait
    # out an outage) while the broker is SIGKILLed and started again: the
    # process survives and reads the offsets once the broker is back. Run in
    # a child process: through librdkafka's admin API the calls in flight
    # when the connection dropped aborted the process (an assertion in
    # librdkafka, 3 of 3 runs).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with await asyncio.to_thread((tmp_path / "child.err").open, "wb") as err:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _ASKING,
            f"127.0.0.1:{broker.port}",
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env,
        )
        try:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            assert line.strip() == b"ready", line
            await asyncio.sleep(0.5)  # calls in flight
            await asyncio.to_thread(broker.kill)
            await asyncio.sleep(4.0)  # the outage lasts
            await asyncio.to_thread(broker.start)
            code = await asyncio.wait_for(child.wait(), 110)
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
    lines = [x for x in (tmp_path / "child.err").read_text().splitlines() if x[:1] != "%"]
    assert code == 0, "\n".join(lines[-20:])


async def test_a_store_whose_abort_did_not_finish_stores_again(
    broker: KafkaBroker, log: KafkaLog
) -> None:
    # A store while the broker is frozen: commit_transaction times out, and
    # so does the abort that follows. librdkafka keeps that abort in
    # progress, and every later call of the producer failed with "Conflicting
    # abort_transaction API call is already in progress": the member's
    # partitions paused forever once the broker was back (seen in the fault
    # suite's Kafka kill case). Once the broker answers again, a store works.
    for topic in ("orders", "retry_orders"):
        await log.create_topic(topic, 1)
    lease = await _answer("acquire", lambda: log.acquire_partition("g", "orders", 0, "a", 60.0))
    assert lease is not None

    def write(n: int) -> BatchWrite:
        body = b"%d" % n
        return BatchWrite(
            "g", appends=[("retry_orders", 0, [({"wk-key": b"k"}, body)])], commits=[]
        )

    assert await log.store(write(0), fence=lease) == [[0]]
    broker.freeze()
    try:
        with pytest.raises(wk.LogUnavailableError):
            await log.store(write(1), fence=lease)
    finally:
        broker.thaw()
    [[offset]] = await _answer("store", lambda: log.store(write(2), fence=lease))
    bodies = [r.body for r in await log.read("retry_orders", 0, 0, 10)]
    assert bodies[0] == b"0" and bodies[-1] == b"2" and offset >= 1
