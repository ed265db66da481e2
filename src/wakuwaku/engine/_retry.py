"""Retry-topic state: quarantined keys, pending work, attempt counters, schedules (design §6).

The retry topic is the durable truth. It holds *work records* (events waiting
for a retry, already reduced, with ``wk-failed-at`` and ``wk-src``) and small
*marker records*:

======================  ======================================================
``wk-marker``           meaning
======================  ======================================================
``resolved``            key ``wk-key`` is done through retry offset ``wk-through``;
                        with ``wk-reset: 1`` (a give-up) the key's other pending
                        work is due at once with its counter reset
``attempt-failed``      the key's ``wk-failures``-th failure in a row happened at
                        ``wk-at`` (ms since the epoch); its next attempt is due
                        at ``wk-due-at`` (ms)
======================  ======================================================

The first work record of a key carries ``wk-due-at`` too. The due time is
stored, not only derived from the schedule, so that ``wakuwaku status``
shows the time the consumer will use without being told its schedule;
a record without ``wk-due-at`` (written by an older release) is read with
the configured schedule.

An attempt plans all of a key's pending work records as one new batch
(design §6), so records routed during a quarantine join the failed run when
they are of its type (and are given up with it), and form later runs when
they are not (and are attempted at once after a give-up).

Stored times are whole milliseconds since the epoch, rounded **up**
(:func:`ms_text`), so a stored due time is never earlier than the one the
consumer computed (design §6: "stored times round up, never down").

Wall time is only stored. In a process every due time is a deadline on the
clock's monotonic time: :meth:`RetryState.apply` converts a stored wall time
once, ``due_mono = mono + (due_wall - wall)`` with the two clocks read
together when the record was written (live records) or when it is read (a
restart), so a later step of the wall
clock neither hurries nor stalls an attempt (design §6).

State per pending key is small and bounded (design §6): the
offsets of its pending work records (a compact ``array('q')``, 8 bytes
each), counters, due times and the highest main offset. Record bodies stay
in the retry log: :meth:`RetryState.apply` keeps none of a record's headers
or body, neither live nor when a restart reads the partition back, and the
attempts (:mod:`._attempts`) read a key's pending records from the retry
partition when its attempt runs. The one exception is bounded and outside
the state: :class:`WrittenCache` keeps the work records a process wrote
itself for an attempt due within :data:`WRITTEN_HORIZON` (at most 10 000
records and 8 MiB per partition), so a failing key's records are not read
back and checked again a second later.

One function, :meth:`RetryState.apply`, turns a record into state. The live
consumer writes a record, then applies it with its assigned offset; a
restart reads the retry partition from its committed offset and applies the
same records in the same order, so pending keys, attempt counters and
schedules come back exactly (a restart never resets a counter).
:meth:`RetryState.apply_written` is its shortcut for a work record the
process has just written: the same state, from what the writer knows.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

import msgspec

from .._clock import SYSTEM_CLOCK, Clock
from .._events import EventType
from .._records import (
    H_AT,
    H_DUE,
    H_ERROR,
    H_FAILED_AT,
    H_FAILURES,
    H_GROUP,
    H_HELD,
    H_KEY,
    H_MARKER,
    H_REASON,
    H_RESET,
    H_SRC,
    H_THROUGH,
    H_UNREADABLE,
    H_VERSION,
    WIRE_VERSION,
    ReasonCode,
    Record,
    Source,
    checked_source,
    decode_checked_source,
    encode_source,
    header_text,
    key_or_none,
    parse_ms,
    source_top,
)
from ..logs import Log

R = TypeVar("R")

#: Records one read of a retry partition returns at most.
READ_PAGE = 1000


MARKER_RESOLVED = b"resolved"
MARKER_ATTEMPT_FAILED = b"attempt-failed"

Outgoing = tuple[dict[str, bytes], bytes]


def ms_text(seconds: float) -> bytes:
    """``seconds`` since the epoch as stored: whole milliseconds, rounded up.

    Rounded to the microsecond first (float noise of today's epoch times is
    below it), so that ``1.7e9 + 0.1`` computed as ``…100.00000002 ms``
    does not gain a millisecond; any real fraction of a
    millisecond rounds up, never down (design §6): rounded down, a failure at
    ``…000.0004`` had its first attempt stored at ``…002.000``, too early.
    """
    micros = round(seconds * 1_000_000)
    return str(-(-micros // 1000)).encode()


def resolved_marker(
    key: str, through: int, at: float, *, group: str, reset: bool = False
) -> Outgoing:
    """A marker of ``group``: ``key`` is resolved through retry offset ``through``."""
    return (
        {
            H_VERSION: WIRE_VERSION,
            H_GROUP: group.encode(),
            H_MARKER: MARKER_RESOLVED,
            H_KEY: key.encode(),
            H_THROUGH: str(through).encode(),
            H_RESET: b"1" if reset else b"0",
            H_AT: ms_text(at),
        },
        b"",
    )


def attempt_failed_marker(
    key: str, failures: int, at: float, due: float, *, group: str
) -> Outgoing:
    """A marker of ``group``: the ``failures``-th failure in a row of ``key``
    happened at ``at``; its next attempt is due at ``due`` (seconds since the epoch)."""
    return (
        {
            H_VERSION: WIRE_VERSION,
            H_GROUP: group.encode(),
            H_MARKER: MARKER_ATTEMPT_FAILED,
            H_KEY: key.encode(),
            H_FAILURES: str(failures).encode(),
            H_AT: ms_text(at),
            H_DUE: ms_text(due),
        },
        b"",
    )


def work_common(failed_at: float, error: str, due: float, *, group: str) -> dict[str, bytes]:
    """The headers every retry work record of one write shares: ``wk-failed-at``
    and ``wk-due-at`` (seconds since the epoch, stored as ms rounded up),
    ``wk-error`` and ``wk-group`` (``group``, the writer).

    ``due`` is when the key's first attempt is due, were these records to
    quarantine it.
    """
    return {
        H_FAILED_AT: ms_text(failed_at),
        H_DUE: ms_text(due),
        H_ERROR: error.encode(),
        H_GROUP: group.encode(),
    }


def dead_letter_record(
    record: Record,
    reason: ReasonCode,
    error: str,
    source: Source | None,
    *,
    group: str,
) -> Outgoing:
    """The dead-letter copy of one record: raw headers and body kept, plus
    ``wk-reason``, ``wk-error`` (already sanitized), ``wk-src`` (design §8)
    and ``wk-group`` (``group``, whose dead letter it is: design §6).

    :param source: the ``wk-src`` to write; None keeps the record's own (a
        retry work record, whose ``wk-src`` is where it comes from: its
        bytes are kept rather than decoded and encoded again).
    """
    headers = dict(record.headers)
    headers.pop(H_MARKER, None)
    headers[H_GROUP] = group.encode()
    headers[H_REASON] = reason.value.encode()
    headers[H_ERROR] = error.encode()
    if source is not None:
        headers[H_SRC] = encode_source(source)
    return headers, record.body


def main_source(record: Record, topic: str, partition: int, ident: str) -> Source:
    """The ``wk-src`` of a main-topic record."""
    return Source(topic, partition, (record.offset,), (ident,))


def retry_source(record: Record) -> Source | None:
    """The ``wk-src`` a retry record carries, or None when it is missing or broken."""
    raw = record.headers.get(H_SRC)
    return None if raw is None else checked_source(bytes(raw))


def _offsets() -> array[int]:
    return array("q")


@dataclass(slots=True)
class KeyState:
    """One quarantined key (design §6): offsets, counters and times, never a record body.

    :param offsets: the retry-topic offsets of its pending work records, in
        increasing order; the records themselves (headers, body) are read
        from the retry partition when an attempt runs (design §6: 40 000
        pending 1 KiB records cost 8 bytes each here, not their bodies).
    :param failures: failures in a row in the current cycle (the failure that
        quarantined it counts as 1; a give-up resets to 0).
    :param due: when the next attempt may run, on the clock's monotonic
        time (seconds): what the consumer waits for.
    :param due_wall: the same time as stored (seconds since the epoch): what
        ``wakuwaku status`` shows.
    :param first_failed_at: the cycle's first failure, stamped on records
        routed to the key while it is quarantined.
    :param max_main_offset: the highest main-topic offset in its pending work;
        a redelivered main record at or below it is already in the retry topic.
    :param checked_through: the highest pending offset an attempt of this
        process has decoded and passed through the inbox filter; offsets at or
        below it are not looked up in the inbox again (-1: none yet).
    :param skip: pending offsets at or below ``checked_through`` that an
        attempt must not run: dead-lettered as unusable, or already in the
        handler's inbox (usually empty).
    :param due_from: the retry offset of the record that set :attr:`due`
        (an operator's ``retry-now`` applies only to a due time set before
        it was asked).
    """

    offsets: array[int] = field(default_factory=_offsets)
    failures: int = 1
    due: float = 0.0
    due_wall: float = 0.0
    first_failed_at: float = 0.0
    max_main_offset: int = -1
    checked_through: int = -1
    skip: set[int] = field(default_factory=set)
    due_from: int = -1


class RetryState:
    """Pending retry work of one retry partition, rebuilt by :meth:`apply` (design §6).

    :param delay: ``delay(failures) -> seconds`` (the config's schedule),
        used only for records written without a stored due time.
    :param clock: the clock whose monotonic time due times are kept on.
    :param group: the consumer group whose state this is: a record whose
        ``wk-group`` names another group is not its work (design §6: a topic
        two groups were configured with by accident never mixes their
        work); it is counted in :attr:`foreign` and skipped. None: every
        record is this group's.
    """

    def __init__(
        self,
        delay: Callable[[int], float],
        clock: Clock = SYSTEM_CLOCK,
        *,
        group: str | None = None,
    ) -> None:
        self._delay = delay
        self._clock = clock
        self._group = None if group is None else group.encode()
        # Records of other groups skipped (their wk-group is not ours).
        self.foreign = 0
        # (wall, monotonic) for the record being applied (see apply).
        self._at = (0.0, 0.0)
        self.keys: dict[str, KeyState] = {}
        self.pending_count = 0
        self.end_offset = 0
        # Per key, the highest main offset its work records stand for. Kept
        # after the key's quarantine ends, until the main offset is stored
        # past it (forget_routed): a crash before that commit redelivers main
        # records whose retry work already ran, which must not run again.
        self.routed: dict[str, int] = {}
        # Retry records whose own headers could not be read: (offset, key,
        # what is wrong). They never stop the state from being rebuilt
        # (a worker that raised on them crash-looped).
        self.broken: list[tuple[int, str, str]] = []
        # Message ids dead-lettered past the group's stored dead-letter offset,
        # read at a restart on a log that stores call by call: a give-up whose
        # dead letters were written but whose resolved marker was not (a crash
        # between the two calls) must not dead-letter them again. Small: one
        # store's worth of dead letters.
        self.dead_lettered: set[str] = set()
        # Keys an operator paused: their attempts wait (design §14).
        self.held: set[str] = set()

    def quarantined(self, key: str) -> bool:
        return key in self.keys

    def due_keys(self, now: float) -> list[str]:
        """Keys whose next attempt is due at ``now`` (the clock's monotonic
        time, seconds), earliest first."""
        held = self.held
        due = [
            (state.due, key)
            for key, state in self.keys.items()
            if state.due <= now and key not in held
        ]
        return [key for _, key in sorted(due)]

    def next_due(self) -> float | None:
        """When the earliest attempt is due (monotonic seconds), or None
        without quarantined keys (paused keys do not count)."""
        if self.held:
            return min((s.due for k, s in self.keys.items() if k not in self.held), default=None)
        return min((s.due for s in self.keys.values()), default=None)

    def next_due_wall(self) -> float | None:
        """The earliest stored due time (seconds since the epoch), as
        ``wakuwaku status`` shows it, or None without quarantined keys."""
        return min((s.due_wall for s in self.keys.values()), default=None)

    def low_watermark(self) -> int:
        """The retry partition's committed offset: its lowest pending offset (design §6)."""
        lows = [s.offsets[0] for s in self.keys.values() if s.offsets]
        return min(lows) if lows else self.end_offset

    def apply(self, record: Record, at: tuple[float, float] | None = None) -> None:
        """Fold one retry-topic record (work or marker) into the state.

        :param at: (wall, monotonic) time (seconds), read together when the
            record's times were taken; a stored due time ``D`` becomes the
            monotonic deadline ``monotonic + (D - wall)``. Default: the
            clock now (a restart, reading records written earlier: a due time
            already past is due at once).
        """
        self._at = (self._clock.now(), self._clock.monotonic()) if at is None else at
        self.end_offset = max(self.end_offset, record.offset + 1)
        owner = record.headers.get(H_GROUP)
        if owner is not None and self._group is not None and bytes(owner) != self._group:
            self.foreign += 1
            return
        unreadable = header_text(record.headers, H_UNREADABLE)
        if unreadable is not None:
            self.broken.append((record.offset, "", f"the log could not read it: {unreadable}"))
            return
        key = key_or_none(record.headers)
        if key is None:
            self.broken.append((record.offset, "", "no usable wk-key"))
            return
        marker = record.headers.get(H_MARKER)
        if marker is None:
            self._add_work(key, record)
        elif marker == MARKER_RESOLVED:
            self._resolve(key, record)
        elif marker == MARKER_ATTEMPT_FAILED:
            state = self.keys.get(key)
            if state is not None:
                failures = _int(record.headers.get(H_FAILURES))
                due = _seconds(record.headers.get(H_DUE))
                failed = _seconds(record.headers.get(H_AT))
                if failures is None or failures < 0 or (due is None and failed is None):
                    self._broken(
                        record,
                        key,
                        "attempt-failed marker without a usable wk-failures, wk-due-at or wk-at",
                    )
                    return
                state.failures = failures
                self._set_due(
                    state,
                    due if due is not None else (failed or 0.0) + self._delay(failures),
                    record.offset,
                )
        else:
            self._broken(record, key, f"unknown marker {bytes(marker)[:40]!r}")

    def apply_written(
        self, key: str, offset: int, headers: dict[str, bytes], top: int, at: tuple[float, float]
    ) -> None:
        """Fold in a work record this process just wrote at ``offset``, for
        ``key``, standing for main offsets up to ``top``: the same state as
        :meth:`apply` of that record (a restart reads it that way), without
        parsing again what the writer knows. The first record of a key goes
        through :meth:`apply` (its stored times set the schedule)."""
        state = self.keys.get(key)
        if state is None:
            self.apply(Record(offset, headers, b""), at)
            return
        if offset >= self.end_offset:
            self.end_offset = offset + 1
        state.offsets.append(offset)
        self.pending_count += 1
        if top > state.max_main_offset:
            state.max_main_offset = top
        if top > self.routed.get(key, -1):
            self.routed[key] = top

    def apply_all(self, records: Iterable[Record]) -> None:
        """:meth:`apply` each record in order.

        A restart folds in every pending record, and nearly all of them are
        more work for a key already quarantined: that case is recognised
        here with a few header lookups and folded in inline (the same state
        as :meth:`apply` and :meth:`_append_work`, which handle every other
        record): a restart with a million pending records spent half its
        time here, much of it in calls per record (the key is decoded with
        ``str(raw, ...)``, one call where ``bytes(raw).decode(...)`` made two)."""
        keys = self.keys
        group = self._group
        routed = self.routed
        for record in records:
            headers = record.headers
            raw = headers.get(H_KEY)
            if (
                raw is None
                or H_MARKER in headers
                or H_UNREADABLE in headers
                or (group is not None and headers.get(H_GROUP, group) != group)
            ):
                self.apply(record)
                continue
            key = str(raw, "utf-8", "replace")
            state = keys.get(key)
            if state is None:
                self.apply(record)
                continue
            offset = record.offset
            if offset >= self.end_offset:
                self.end_offset = offset + 1
            state.offsets.append(offset)
            self.pending_count += 1
            src = headers.get(H_SRC)
            if src is None:
                continue
            try:  # source_top(src), without a call per record
                top = max(decode_checked_source(src).offsets)
            except Exception:  # noqa: BLE001 - a header may hold anything
                continue
            if top > state.max_main_offset:
                state.max_main_offset = top
            if top > routed.get(key, -1):
                routed[key] = top

    def _add_work(self, key: str, record: Record) -> None:
        state = self.keys.get(key)
        if state is None:
            raw = record.headers.get(H_FAILED_AT)
            failed_at = _seconds(raw)
            if failed_at is None:
                if raw is not None:  # its attempt dead-letters it as malformed_header
                    self._broken(record, key, "work record with a broken wk-failed-at")
                    failed_at = self._at[0]
                else:
                    failed_at = record.timestamp
            due = _seconds(record.headers.get(H_DUE))
            # Held by an operator's pause, not failed: no failure counted yet.
            failures = 0 if record.headers.get(H_HELD) == b"1" else 1
            state = KeyState(failures=failures, first_failed_at=failed_at)
            self._set_due(
                state, due if due is not None else failed_at + self._delay(1), record.offset
            )
            self.keys[key] = state
        self._append_work(key, state, record)

    def _append_work(self, key: str, state: KeyState, record: Record) -> None:
        """One more pending work record of quarantined ``key``."""
        state.offsets.append(record.offset)
        self.pending_count += 1
        raw = record.headers.get(H_SRC)
        top = None if raw is None else source_top(raw)
        if top is not None:
            if top > state.max_main_offset:
                state.max_main_offset = top
            if top > self.routed.get(key, -1):
                self.routed[key] = top

    def add_written(self, key: str, state: KeyState, offsets: list[int], top: int) -> None:
        """:meth:`apply_written` of work records of ``key``, already
        quarantined (its state is ``state``), that this process just wrote
        at ``offsets`` (increasing), standing together for main offsets up
        to ``top``: a routed run costs one call, not one per record."""
        last = offsets[-1]
        if last >= self.end_offset:
            self.end_offset = last + 1
        state.offsets.extend(offsets)
        self.pending_count += len(offsets)
        if top > state.max_main_offset:
            state.max_main_offset = top
        if top > self.routed.get(key, -1):
            self.routed[key] = top

    def _broken(self, record: Record, key: str, what: str) -> None:
        self.broken.append((record.offset, key, what))

    def forget_routed(self, position: int) -> None:
        """Forget routed main offsets below ``position``, the main partition's
        stored offset: those records are never delivered again."""
        if self.routed:
            self.routed = {k: top for k, top in self.routed.items() if top >= position}

    def _resolve(self, key: str, record: Record) -> None:
        state = self.keys.get(key)
        if state is None:
            return
        through = _int(record.headers.get(H_THROUGH))
        if through is None:
            self._broken(record, key, "resolved marker without a usable wk-through")
            return
        offsets = state.offsets
        done = bisect_right(offsets, through)
        if done:
            del offsets[:done]
            self.pending_count -= done
            if state.skip:
                state.skip = {o for o in state.skip if o > through}
        if not offsets:
            del self.keys[key]
        elif record.headers.get(H_RESET) == b"1":
            state.failures = 0
            at = _seconds(record.headers.get(H_AT))
            self._set_due(state, at if at is not None else self._at[0], record.offset)

    def _set_due(self, state: KeyState, wall: float, offset: int) -> None:
        """Store a due time read from the record at ``offset``: as stored, and
        as a monotonic deadline."""
        state.due_from = offset
        state.due_wall = wall
        # To the microsecond: a wall time of today is a float with ~0.2 us
        # of noise, which must not turn a due time of 6.0 into 6.00000001.
        state.due = round(self._at[1] + (wall - self._at[0]), 6)


class Written(msgspec.Struct, frozen=True, gc=False):
    """A retry work record this process wrote: what decoding it would find.

    A struct the garbage collector does not track (it holds no cycle): the
    records a failing key routes are kept across attempt rounds
    (:class:`WrittenCache`), and kept as tracked tuples they were promoted
    to the oldest generation by the thousand, making its full collections
    (about 10 ms each) come twice a drain of the failing-key benchmark.

    :param record: the record as the retry partition holds it (offset,
        headers, body).
    :param key: / :param event_type: / :param origin: / :param props: its
        key, type, origin (``wk-src``) and props.
    :param failed_at: its stored ``wk-failed-at`` (seconds).
    """

    record: Record
    key: str
    event_type: EventType[Any]
    origin: Source
    props: dict[str, str]
    failed_at: float


#: Bytes counted per kept record besides its body and header values.
_WRITTEN_OVERHEAD = 640

WRITTEN_HORIZON = 60.0
"""A written work record is kept (:class:`WrittenCache`) while its key's
next attempt is due within this many seconds: the default schedule (2 to
16 s) is inside it, an hour's delay is not."""


class WrittenCache:
    """Retry work records written by this process, kept for an attempt that
    comes soon, so that it need not read and check them again, within a
    fixed bound (design §6).

    Only an optimisation: a record not found here is read from the retry
    partition (the truth); a record found here is what the partition holds at
    its offset (a retry partition is append-only, and its offsets are
    written under the partition's lease). Bodies are decoded again for each
    attempt, as when read, so an event a handler changed is never seen again.

    :param max_records: / :param max_bytes: the bound; past it the oldest
        records are dropped first (bytes: bodies, header values and a fixed
        overhead per record).
    """

    __slots__ = ("_entries", "bytes", "max_bytes", "max_records")

    def __init__(self, max_records: int = 10_000, max_bytes: int = 8 << 20) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.bytes = 0
        # Insertion order is age; an OrderedDict drops its oldest entry in
        # O(1), where a dict's next(iter()) scans the slots its earlier pops
        # left empty (5.5 us a record kept past the bound against 0.23).
        self._entries: OrderedDict[int, tuple[Written, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, written: Written, size: int) -> None:
        """Keep ``written`` (dropping the oldest records past the bound).

        :param size: its body and header values in bytes.
        """
        self.put_many([written], [size])

    def put_many(self, kept: list[Written], sizes: list[int]) -> None:
        """Keep each of ``kept`` in order, with its size in ``sizes`` (body
        and header values, bytes), dropping the oldest records past the
        bound after each: a routed run in one call."""
        entries = self._entries
        max_records, max_bytes = self.max_records, self.max_bytes
        for written, size in zip(kept, sizes, strict=True):
            offset = written.record.offset
            if offset in entries:
                self.bytes -= entries.pop(offset)[1]
            size += _WRITTEN_OVERHEAD
            entries[offset] = (written, size)
            self.bytes += size
            while len(entries) > max_records or self.bytes > max_bytes:
                self.bytes -= entries.popitem(last=False)[1][1]

    def get(self, offset: int) -> Written | None:
        found = self._entries.get(offset)
        return None if found is None else found[0]

    def get_many(self, offsets: Iterable[int]) -> list[Written | None]:
        """:meth:`get` of each of ``offsets``, in order (an attempt looks up
        all of a key's pending records)."""
        get = self._entries.get
        return [None if (found := get(offset)) is None else found[0] for offset in offsets]

    def drop(self, offsets: Iterable[int]) -> None:
        """Forget the records at ``offsets`` (resolved, given up, or not due soon)."""
        entries = self._entries
        if not entries:
            return
        for offset in offsets:
            found = entries.pop(offset, None)
            if found is not None:
                self.bytes -= found[1]

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


def _seconds(raw: bytes | None) -> float | None:
    """Seconds from a stored ms header, or None when it is absent or broken."""
    return None if raw is None else parse_ms(bytes(raw))


def _int(raw: bytes | None) -> int | None:
    """A stored integer header, or None when it is absent or not a plain integer."""
    if raw is None:
        return None
    text = bytes(raw)
    if not 0 < len(text) <= 19 or not text.isdigit():
        return None
    return int(text)


class LogCall(Protocol):
    """How a loader makes its log calls: ``await call(operation, thunk)``."""

    async def __call__(self, operation: str, call: Callable[[], Awaitable[R]], /) -> R: ...


async def _direct(operation: str, call: Callable[[], Awaitable[R]], /) -> R:
    return await call()


async def load_retry_state(
    log: Log,
    group: str,
    retry_topic: str,
    partition: int,
    state: RetryState,
    *,
    call: LogCall = _direct,
) -> tuple[int | None, int]:
    """Rebuild ``state`` from one retry partition: the one loader of retry state.

    Reads ``retry_topic``/``partition`` from ``group``'s committed offset (the
    partition's start offset when the group never committed there) to its
    end and applies every record (:meth:`RetryState.apply`), exactly as a
    restarting consumer does (design §6). The partition worker and ``wakuwaku
    status`` both load through it, so they never disagree about a record.

    A record whose own headers cannot be read (no usable ``wk-key``, a broken
    ``wk-failed-at``, a marker with broken numbers) never stops the load:
    it lands in :attr:`RetryState.broken` for the caller to report. A work
    record with a usable key is kept pending even when its ``wk-failed-at``
    is broken: its attempt dead-letters it as ``malformed_header``.

    :param call: runs each log call (the partition worker retries them with
        its gate closed; default: call once).
    :returns: the group's committed offset in the partition (None when it
        never committed there), and the offset the load started from.
    :raises: what the log (or ``call``) raises.
    """
    committed = await call(
        "load retry offset", lambda: log.committed(group, retry_topic, partition)
    )
    start = committed
    if start is None:
        starts = await call("start offsets", lambda: log.start_offsets(retry_topic))
        start = starts.get(partition, 0)
    state.end_offset = offset = start
    while page := await call(
        "read retry topic", partial(log.read, retry_topic, partition, offset, READ_PAGE)
    ):
        state.apply_all(page)
        offset = page[-1].offset + 1
    return committed, start
