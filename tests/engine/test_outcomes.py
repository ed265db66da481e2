"""One record, one outcome, after any stop (design §7, §8), on every log.

A record is handled, dead-lettered or sent to the retry topic, once: a
graceful stop in the middle of a batch must not store an outcome for a
record whose offset it leaves undone (the restart delivers it again and
gives it a second one), a crash between a batch's dead letters and its
offset on a log that stores call by call must not either, and a dead letter
always names the record it is a copy of.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import wakuwaku as wk
from wakuwaku._records import build_headers, decode_source, encode_source
from wakuwaku.engine import Handler
from wakuwaku.engine._retry import dead_letter_record, main_source
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import Item, Put, Running, consumer, dead_letters, reason, setup_topic, wait_until
from .test_guards import CallByCall


def _mismatched(key: str) -> tuple[dict[str, bytes], bytes]:
    """A record of the idempotent type :class:`Put` marked ``plain``: it is
    dead-lettered ``algebra_mismatch`` before any handler sees it."""
    headers = dict(build_headers(wk.event_type(Put), key))
    headers["wk-alg"] = b"plain"
    return headers, b'{"key":"%s","value":1}' % key.encode()


async def _noop_put(run: Sequence[Put]) -> None:
    return None


async def test_a_stop_mid_batch_leaves_no_outcome_for_a_record_it_leaves_undone(
    log: Log, clock: FakeClock
) -> None:
    """SIGTERM while a batch ran: its dead letter of a record past the stored
    offset was written, the restart read the record again and dead-lettered
    it a second time (two dead letters, and a replay would send both)."""
    producer = await setup_topic(log)
    await producer.publish_many([Item("a", 0), Item("a", 1)])  # offsets 0, 1
    await log.append("t", 0, [_mismatched("b")])  # offset 2
    started, release = asyncio.Event(), asyncio.Event()
    handled: list[int] = []

    async def slow(run: Sequence[Item]) -> None:
        if run[0].n == 0 and not release.is_set():
            started.set()
            await release.wait()
        handled.extend(e.n for e in run)

    handlers: list[Handler[Any]] = [Handler(Item, slow, max_batch=1), Handler(Put, _noop_put)]
    first = consumer(log, clock, handlers, max_concurrency=4)
    runner = asyncio.create_task(first.run(install_signal_handlers=False))
    await asyncio.wait_for(started.wait(), 30)
    first.stop()  # what SIGTERM does: the running chunk finishes, nothing new starts
    release.set()
    await runner
    assert handled == [0]
    again = consumer(log, clock, handlers)
    await again.drain()
    assert handled == [0, 1]
    letters = await dead_letters(log)
    assert [reason(r) for r in letters] == ["algebra_mismatch"]
    assert decode_source(letters[0].headers["wk-src"]).offsets == (2,)


async def test_a_crash_between_dead_letters_and_offset_gives_no_second_dead_letter(
    log: Log, clock: FakeClock
) -> None:
    """A log that stores call by call (NATS, Redis), killed after a batch's
    dead letters and before its offset: the restart dead-lettered the
    record it had already dead-lettered as it read the batch again."""
    wrapped = CallByCall(log)
    producer = await setup_topic(log)
    await producer.publish(Item("a", 0))  # offset 0
    await log.append("t", 0, [_mismatched("b")])  # offset 1
    handlers = [Handler(Item, _noop_item), Handler(Put, _noop_put)]
    # The first run sets the group's dead-letter offset up (before any dead letter).
    await consumer(wrapped, clock, handlers, partitions=[0]).start()  # type: ignore[arg-type]
    await log.commit("g", "wk-dlq.g.t", 0, 0)
    # What the crash left: the batch's dead letter stored, its offset not.
    [record] = [r for r in await log.read("t", 0, 0, 10) if r.offset == 1]
    letter = dead_letter_record(
        record,
        wk.ReasonCode.ALGEBRA_MISMATCH,
        "registered idempotent",
        main_source(record, "t", 0, "t/0/1"),
        group="g",
    )
    await log.append("wk-dlq.g.t", 0, [letter])
    again = consumer(wrapped, clock, handlers)  # type: ignore[arg-type]
    await again.drain()
    assert len(await dead_letters(log)) == 1
    assert not again.stats.dead_letters


async def _noop_item(run: Sequence[Item]) -> None:
    return None


async def test_a_dead_letter_names_its_own_record_whatever_wk_src_says(
    log: Log, clock: FakeClock
) -> None:
    """A main record with valid headers plus ``wk-src: ["t", 0, [1], []]``
    at t/0/0 was dead-lettered ``malformed_header`` under the forged
    ``wk-src``: the dead-letter list showed its source as t/0/1, and a
    replay would have sent it under that identity (a fuzz found 175 in
    10 000). A broken ``wk-src`` that does not parse was already replaced."""
    await setup_topic(log)
    forged = [
        b'["t",0,[1],[]]',  # no ids
        b'["t",0,[],["t/0/1"]]',  # no offsets
        b'["elsewhere",3,[7],["elsewhere/3/7"]]',  # a valid source: a replay's identity
        b"not json",
    ]
    for raw in forged:
        headers = dict(build_headers(wk.event_type(Item), "k"))
        headers["wk-src"] = raw
        headers["wk-v"] = b"9"  # malformed: every one of them is dead-lettered
        await log.append("t", 0, [(headers, b'{"key":"k","n":1}')])
    await consumer(log, clock, [Handler(Item, _noop_item)]).drain()
    letters = await dead_letters(log)
    assert [reason(r) for r in letters] == ["malformed_header"] * len(forged)
    for offset, letter in enumerate(letters):
        source = decode_source(letter.headers["wk-src"])
        assert (source.topic, source.partition, source.offsets) == ("t", 0, (offset,))
        if offset == 2:  # a source that is valid keeps the replayed identity
            assert source.ids == ("elsewhere/3/7",)
        else:
            assert source.ids == (f"t/0/{offset}",)


async def test_a_quarantined_key_routed_past_a_stop_is_routed_once(
    log: Log, clock: FakeClock
) -> None:
    """The retry-topic side of the same rule: a record of a quarantined key
    that a batch cut short by a stop routed past the stored offset is
    routed or handled once, in its key's order, when the batch comes again."""
    producer = await setup_topic(log)
    await producer.publish(Item("q", 0))  # offset 0: fails, quarantines q
    fail = {0}
    handled: list[int] = []

    async def apply(run: Sequence[Item]) -> None:
        for event in run:
            if event.n in fail:
                raise wk.Retryable("not yet")
        handled.extend(e.n for e in run)

    handlers = [Handler(Item, apply, max_batch=1)]
    first = consumer(log, clock, handlers, retry_delays=[3600.0])
    async with Running(first):
        await wait_until(clock, lambda: bool(first.workers))
        [worker] = first.workers.values()
        await wait_until(clock, lambda: worker.retry.quarantined("q"))
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(run: Sequence[Item]) -> None:
        if run[0].n == 1 and not release.is_set():
            started.set()
            await release.wait()
        await apply(run)

    await producer.publish_many([Item("a", 1), Item("a", 2), Item("q", 3)])  # 1, 2, 3
    second = consumer(log, clock, [Handler(Item, slow, max_batch=1)], retry_delays=[3600.0])
    runner = asyncio.create_task(second.run(install_signal_handlers=False))
    await asyncio.wait_for(started.wait(), 30)
    second.stop()
    release.set()
    await runner
    fail.clear()
    clock.advance(3600.0)
    third = consumer(log, clock, handlers, retry_delays=[0.0])
    await third.drain()
    assert sorted(handled) == [0, 1, 2, 3]  # each once
    assert [n for n in handled if n in (0, 3)] == [0, 3]  # q's order kept
    copies = [
        decode_source(r.headers["wk-src"]).offsets
        for r in await log.read("wk-retry.g.t", 0, 0, 100)
        if "wk-marker" not in r.headers
    ]
    assert len(copies) == len(set(copies))  # no record routed twice


def test_encode_source_round_trip_guard() -> None:
    """The forged sources above are encoded by hand; the valid one is what
    :func:`encode_source` makes (so the test feeds real wire bytes)."""
    valid = encode_source(wk.Source("elsewhere", 3, (7,), ("elsewhere/3/7",)))
    assert valid == b'["elsewhere",3,[7],["elsewhere/3/7"]]'


class LostReplies(CallByCall):
    """A log that stores call by call and loses the reply of each first
    append to a dead-letter or retry topic: the records are stored, the
    caller sees ``LogUnavailableError`` (a server frozen mid-call)."""

    def __init__(self, inner: Log) -> None:
        super().__init__(inner)
        self.lost = 0

    async def append(self, topic: str, partition: int, records: Any, **kwargs: Any) -> Any:
        offsets = await self.inner.append(topic, partition, records, **kwargs)
        if topic.startswith(("wk-dlq.", "wk-retry.")) and self.lost < 2:
            self.lost += 1
            raise wk.LogUnavailableError(f"{topic}: no answer within 1 s")
        return offsets


async def test_a_dead_letter_write_whose_reply_was_lost_is_stored_once(
    log: Log, clock: FakeClock
) -> None:
    """The consumer's own append retried after a lost reply stored every
    dead letter and retry record a second time; it sends its retry with the
    first try's token (``Log.append(token=)``), so each is stored once."""
    wrapped = LostReplies(log)
    producer = await setup_topic(log)
    await producer.publish_many([Item("q", 0), Item("ok", 1)])
    await log.append("t", 0, [_mismatched("b")])  # offset 2

    failed: list[int] = []

    async def apply(run: Sequence[Item]) -> None:
        if run[0].key == "q" and not failed:
            failed.append(run[0].n)
            raise wk.Retryable("not yet")

    handlers: list[Handler[Any]] = [Handler(Item, apply), Handler(Put, _noop_put)]
    first = consumer(wrapped, clock, handlers, retry_delays=[1.0])  # type: ignore[arg-type]
    async with Running(first):
        await wait_until(clock, lambda: bool(first.workers))
        [worker] = first.workers.values()
        await wait_until(clock, lambda: worker.position == 3 and not worker.retry.keys)
    assert wrapped.lost == 2  # the dead letter's append and the retry work's
    assert [reason(r) for r in await dead_letters(log)] == ["algebra_mismatch"]
    work = [r for r in await log.read("wk-retry.g.t", 0, 0, 100) if "wk-marker" not in r.headers]
    assert len(work) == 1
