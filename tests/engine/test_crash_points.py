"""A crash at every write of a drain: nothing lost, nothing applied twice, order
per key kept (design §6, §7, §9).

A drain over several batches (keys interleaved, one key failing Retryable
twice then once more, two Unrecoverable events, the second in a batch that
runs beside the slow key's, one Transient) is run once to count the consumer's writes
to the log (``store``, ``append``, ``commit``). Then, for every write and on
both of its sides (before it is sent: nothing written; after it returned:
written, the consumer not told), a fresh run crashes there and a second
consumer of the same member drains the rest. The handler applies each
event through the inbox, its claim and its effect in one transaction, so
what was applied is exactly what the inbox holds. Each run checks:

- every event was applied or dead-lettered, none both, none dead-lettered twice;
- no event reached the handler after it was applied (the inbox's lookup
  drops claimed records before the handler sees them);
- each key's events were applied in offset order.

The checks do not depend on how batches are cut or overlap: they hold for
any commit scheme that never stores an offset past a record not done.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import wakuwaku as wk
from wakuwaku.engine import Handler
from wakuwaku.inbox import SQLiteInbox
from wakuwaku.logs import BatchWrite, Lease, Log
from wakuwaku.logs.sqlite import SQLiteLog
from wakuwaku.testing import FakeClock

from .conftest import T0, Item, consumer, dead_letters, event_n, setup_topic

KEYS = ("a", "b", "r", "u")
PER_KEY = 6
RETRYABLE = 2  # r's first event (events are numbered in publish order, keys interleaved)
RETRYABLE_AGAIN = 10  # r's third event: Retryable once, in the attempt that applies 2 and 6
UNRECOVERABLE = 7  # u's second event: dead-lettered
UNRECOVERABLE_LATER = 15  # u's fourth event, in a batch that runs beside the slow key's
TRANSIENT = 21  # b's last event: Transient once (retried in place, the partition paused)
POLL = 5
"""``max_poll_records``: the drain spans several batches."""
SLOW_TURNS = 5000
"""Event loop turns a call of the slow key takes at most (see ``slow``)."""
RETRY_DELAYS = (5.0, 5.0, 5.0)
"""Fake seconds: batches go on while r is quarantined, so r's later events
are routed to the retry topic; the attempt that applies 2 and 6 stops at
10, so the retry partition's offset is stored while work is pending there."""


class Crash(BaseException):
    """Stands for a SIGKILL: nothing after it runs, nothing catches it."""


class Writes:
    """Passes every call to ``inner``; counts the writes and crashes at one.

    ``atomic=False`` stands for a log without an atomic store (NATS): the
    consumer then writes each append and commit with a call of its own.
    A write after the crash (nothing may run after a SIGKILL) is counted
    in :attr:`after_crash`.
    """

    def __init__(self, inner: Log, crash_at: int | None, side: str, atomic: bool) -> None:
        self.inner = inner
        self.crash_at = crash_at
        self.side = side
        self.atomic_store = atomic and getattr(inner, "atomic_store", True)
        self.count = 0
        self.after_crash = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _write(self, call: Callable[[], Awaitable[Any]]) -> Any:
        if self.crash_at is not None and self.count >= self.crash_at:
            self.after_crash += 1
        self.count += 1
        crash = self.count == self.crash_at
        if crash and self.side == "before":
            raise Crash
        result = await call()
        if crash:
            raise Crash
        return result

    async def store(self, write: BatchWrite, *, fence: Lease | None = None) -> list[list[int]]:
        assert self.atomic_store, "the consumer stores call by call on such a log"
        return await self._write(lambda: self.inner.store(write, fence=fence))  # type: ignore[no-any-return]

    async def append(self, topic: str, partition: int, records: Any, **kwargs: Any) -> list[int]:
        return await self._write(lambda: self.inner.append(topic, partition, records, **kwargs))  # type: ignore[no-any-return]

    async def commit(self, *args: Any, **kwargs: Any) -> None:
        await self._write(lambda: self.inner.commit(*args, **kwargs))


class Effects:
    """The handler: claims a chunk's message ids and records its events in one
    transaction of ``path`` (the application's database)."""

    def __init__(
        self, path: Path, inbox: SQLiteInbox, clock: FakeClock, slow: str | None = None
    ) -> None:
        self.path = path
        self.slow = slow
        self.inbox = inbox
        self.calls: dict[int, int] = {}  # event n -> handler calls
        self.fail: dict[int, list[BaseException]] = {
            RETRYABLE: [wk.Retryable("not yet"), wk.Retryable("not yet")],
            RETRYABLE_AGAIN: [wk.Retryable("not yet")],
            TRANSIENT: [wk.Transient("a moment")],
            UNRECOVERABLE: [wk.Unrecoverable("bad event")] * 10,
            UNRECOVERABLE_LATER: [wk.Unrecoverable("bad event")] * 10,
        }
        self.seen_applied: list[int] = []
        self.later: list[int] = []  # numbers applied of other keys than the slow one
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
            db.execute("CREATE TABLE IF NOT EXISTS applied (seq INTEGER PRIMARY KEY, key, n)")

    def applied(self) -> list[tuple[str, int]]:
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            return [(k, n) for k, n in db.execute("SELECT key, n FROM applied ORDER BY seq")]

    async def __call__(self, run: Sequence[Item]) -> None:
        if run[0].key == self.slow:
            # Until a key's event of a later batch is applied (or a bound):
            # other keys, and the next batch, run meanwhile.
            for _ in range(SLOW_TURNS):
                if any(n > run[-1].n + 1 for n in self.later):
                    break
                await asyncio.sleep(0)
        for event in run:
            self.calls[event.n] = self.calls.get(event.n, 0) + 1
            script = self.fail.get(event.n)
            if script:
                raise script.pop(0)
        chunk = wk.current_chunk()
        with contextlib.closing(sqlite3.connect(self.path, isolation_level=None)) as db:
            db.execute("BEGIN IMMEDIATE")
            claim = self.inbox.claim(db, chunk.all_message_ids)
            if claim.duplicate:
                self.seen_applied.extend(e.n for e in run)
            db.executemany(
                "INSERT INTO applied (key, n) VALUES (?, ?)", [(e.key, e.n) for e in run]
            )
            db.execute("COMMIT")
        if run[0].key != self.slow:
            self.later.extend(e.n for e in run)


def _events() -> list[Item]:
    # Keys interleaved, numbered in publish order (= offset order).
    return [Item(key, i * len(KEYS) + k) for i in range(PER_KEY) for k, key in enumerate(KEYS)]


async def _log(kind: str, where: Path) -> Log:
    if kind == "memory":
        return wk.MemoryLog()
    return SQLiteLog(f"{where}-log.db")


async def _run(
    kind: str, where: Path, crash_at: int | None, side: str, atomic: bool, slow: str | None = None
) -> tuple[int, list[tuple[str, int]], list[int], list[int]]:
    """One drain crashing at write ``crash_at`` (None: never), then a second
    drain; the writes of the first, what was applied, dead-lettered, and
    handed to the handler after it was applied."""
    log = await _log(kind, where)
    clock = FakeClock(T0)
    try:
        producer = await setup_topic(log)
        await producer.publish_many(_events())
        inbox = SQLiteInbox(f"{where}-effects.db", "g")
        await inbox.ensure_schema()
        effects = Effects(Path(f"{where}-effects.db"), inbox, clock, slow)
        options: dict[str, Any] = {
            "retry_delays": RETRY_DELAYS,
            "max_poll_records": POLL,
            "member_id": "m1",
        }
        first = Writes(log, crash_at, side, atomic)
        handlers = [Handler(Item, effects, inbox=inbox, max_batch=2)]
        if crash_at is None:
            await consumer(first, clock, handlers, **options).drain()  # type: ignore[arg-type]
        else:
            with pytest.raises(Crash):
                await consumer(first, clock, handlers, **options).drain()  # type: ignore[arg-type]
            assert first.after_crash == 0, "a write after the crash"
            again = Writes(log, None, side, atomic)
            await consumer(again, clock, handlers, **options).drain()  # type: ignore[arg-type]
        dead = [event_n(r) for r in await dead_letters(log)]
        return first.count, effects.applied(), dead, effects.seen_applied
    finally:
        await log.close()


def _check(applied: list[tuple[str, int]], dead: list[int], seen_applied: list[int]) -> None:
    numbers = [n for _, n in applied]
    assert sorted(numbers) == sorted(set(numbers)), f"applied twice: {numbers}"
    assert sorted(dead) == sorted(set(dead)), f"dead-lettered twice: {dead}"
    assert not set(numbers) & set(dead), f"applied and dead-lettered: {applied}, {dead}"
    assert sorted(set(numbers) | set(dead)) == list(range(len(KEYS) * PER_KEY)), "lost"
    assert seen_applied == [], f"handed to the handler after being applied: {seen_applied}"
    for key in KEYS:
        mine = [n for k, n in applied if k == key]
        assert mine == sorted(mine), f"key {key} applied out of order: {mine}"


@pytest.mark.parametrize("slow", [None, "a"])
@pytest.mark.parametrize(
    ("kind", "atomic"), [("memory", True), ("memory", False), ("sqlite", True)]
)
async def test_a_crash_at_any_write_loses_nothing_and_applies_nothing_twice(
    tmp_path: Path, kind: str, atomic: bool, slow: str | None
) -> None:
    """With ``slow``, that key's calls take many event loop turns: the next
    batches start while it runs (a pipeline), and a crash falls between
    them."""
    writes, applied, dead, seen = await _run(kind, tmp_path / "clean", None, "after", atomic, slow)
    _check(applied, dead, seen)
    # A chunk is dead-lettered whole (max_batch 2): u's neighbours may go too.
    assert {UNRECOVERABLE, UNRECOVERABLE_LATER} <= set(dead) <= set(range(3, 24, 4))
    if slow is not None:
        # Overlap: an event of a later batch (polls of POLL records, offsets
        # = event numbers) applied before one of the slow key's.
        batch = {n: n // POLL for _, n in applied}
        assert any(
            k != slow and batch[n] > batch[m]
            for i, (k, n) in enumerate(applied)
            for key, m in applied[i + 1 :]
            if key == slow
        ), f"no overlap: {applied}"
    assert writes >= 6, f"the drain spans several batches and a retry: {writes} writes"
    for crash_at in range(1, writes + 1):
        for side in ("before", "after"):
            try:
                _, applied, dead, seen = await _run(
                    kind, tmp_path / f"{crash_at}-{side}", crash_at, side, atomic, slow
                )
                _check(applied, dead, seen)
            except AssertionError as exc:
                raise AssertionError(f"crash {side} write {crash_at} of {writes}: {exc}") from exc
