"""Moving a consumer group's committed offsets on a topic: ``wakuwaku group reset-offsets``.

What Kafka's ``kafka-consumer-groups --reset-offsets`` does, on every log:
:func:`reset_offsets` stores, per partition, the offset the group reads next
(:meth:`Log.commit <wakuwaku.logs.Log.commit>`, without a fence: the tool
owns no partition), after :func:`plan_offset_reset` worked out where each
partition goes. The target is one of

- :attr:`ResetPosition.EARLIEST`: the partition's start offset (every stored
  record is read again);
- :attr:`ResetPosition.LATEST`: its end offset (every stored record is skipped);
- an ``int`` offset, the same on every partition reset;
- an aware :class:`datetime.datetime`: per partition, the first record stored
  at or after that time, found by a binary search over the offsets with
  :meth:`Log.read <wakuwaku.logs.Log.read>` and the records' timestamps
  (:func:`offset_at_time`).

A target outside ``[start offset, end offset]`` is clamped to it, and the
plan says so. Nothing is stored while members of the group run on the
topic (:func:`running_members`): a running member keeps its position in
memory and commits over the reset. What "running" means depends on the
log: a lease not yet expired (memory, SQLite, Redis, NATS), or a member the
group coordinator lists (Kafka, Iggy).

May call: the log, the engine's public names, :mod:`.dead_letters` (naming
the main topic when a group's retry or dead-letter topic is given). Also
home of :func:`committed_groups` (the groups that committed on a topic).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import operator
import time
from dataclasses import dataclass
from typing import Any

from .._errors import (
    ConfigError,
    GroupRunningError,
    LogError,
    UnknownGroupError,
    UnknownPartitionError,
)
from .._records import Record
from ..engine import AssignmentLog
from ..logs import Log, Page
from .dead_letters import _partitions_or_none, resolve_group_topics

__all__ = (
    "OffsetResetPlan",
    "PartitionReset",
    "ResetPosition",
    "ResetTarget",
    "RunningMember",
    "apply_offset_reset",
    "committed_groups",
    "offset_at_time",
    "plan_offset_reset",
    "reset_offsets",
    "running_members",
)


class ResetPosition(enum.StrEnum):
    """A named place in every partition to reset a group's offsets to."""

    EARLIEST = "earliest"
    """The partition's start offset (the lowest one retention kept): every
    stored record is read again."""
    LATEST = "latest"
    """The partition's end offset (the next one to be given): every record
    stored now is skipped; records appended later are read."""


ResetTarget = ResetPosition | int | datetime.datetime
"""Where :func:`reset_offsets` moves a group: a :class:`ResetPosition`, an
offset (an int ``>= 0``) or a time (an aware :class:`datetime.datetime`)."""


@dataclass(frozen=True, slots=True)
class PartitionReset:
    """One partition of an offset reset: where the group is and where it goes.

    :param partition: the partition.
    :param committed: the group's committed offset before the reset (the next
        offset it reads), None when it never committed on the partition (a
        consumer then starts at the start offset).
    :param offset: the offset the reset stores.
    :param start_offset: / :param end_offset: the partition's bounds when the
        plan was made.
    :param note: why ``offset`` is not exactly what was asked (clamped to the
        bounds, no record at or after the time); empty otherwise.
    """

    partition: int
    committed: int | None
    offset: int
    start_offset: int
    end_offset: int
    note: str = ""

    @property
    def position(self) -> int:
        """Where a consumer of the group would read next without the reset: the
        committed offset, or the start offset when there is none or it is below
        the start (retention deleted what the group had not read)."""
        if self.committed is None:
            return self.start_offset
        return max(self.committed, self.start_offset)

    @property
    def change(self) -> int:
        """Records the reset skips (positive) or has read again (negative):
        ``offset - position``. On a log whose offsets have gaps (NATS, Kafka's
        transaction markers) it counts offsets, an upper bound of the records."""
        return self.offset - self.position

    @property
    def moves(self) -> bool:
        """True when the reset stores something here (the committed offset changes)."""
        return self.committed != self.offset


@dataclass(frozen=True, slots=True)
class RunningMember:
    """A member of a group running on a topic, as the log tells it.

    :param member: its name (``ConsumerConfig.member_id``; on Kafka and Iggy
        the name the coordinator knows when it is not this process's member).
    :param partitions: the partitions it owns, sorted.
    :param expires_at: when its newest lease lapses unless renewed (seconds
        since the epoch) on a log of leases; None where the group
        coordinator assigns partitions (Kafka, Iggy) and the member counts
        until its session ends.
    """

    member: str
    partitions: tuple[int, ...]
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class OffsetResetPlan:
    """What :func:`reset_offsets` stores (or stored).

    :param group: the consumer group.
    :param topic: the (qualified) topic.
    :param target: what was asked, in words (``earliest``, ``offset 42``, a time).
    :param partitions: one entry per partition reset, in order.
    :param running: the members running on the topic when the plan was
        made; :func:`reset_offsets` stores nothing while there are any.
    :param applied: True once the offsets were stored.
    :param running_after: members found running right after the offsets
        were stored: they started in the meantime and may have read the old
        offsets (stop them and reset again).
    """

    group: str
    topic: str
    target: str
    partitions: tuple[PartitionReset, ...]
    running: tuple[RunningMember, ...] = ()
    applied: bool = False
    running_after: tuple[RunningMember, ...] = ()

    @property
    def skipped(self) -> int:
        """Records skipped over every partition (the positive changes)."""
        return sum(p.change for p in self.partitions if p.change > 0)

    @property
    def replayed(self) -> int:
        """Records to be read again over every partition (the negative changes, as a count)."""
        return -sum(p.change for p in self.partitions if p.change < 0)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "group": self.group,
            "topic": self.topic,
            "target": self.target,
            "applied": self.applied,
            "skipped": self.skipped,
            "replayed": self.replayed,
            "partitions": [
                {
                    "partition": p.partition,
                    "committed": p.committed,
                    "offset": p.offset,
                    "start_offset": p.start_offset,
                    "end_offset": p.end_offset,
                    "change": p.change,
                    "note": p.note,
                }
                for p in self.partitions
            ],
            "running": [_member_dict(m) for m in self.running],
            "running_after": [_member_dict(m) for m in self.running_after],
        }


def _member_dict(member: RunningMember) -> dict[str, Any]:
    return {
        "member": member.member,
        "partitions": list(member.partitions),
        "expires_at": member.expires_at,
    }


def _check_target(to: object) -> ResetTarget:
    """:raises ConfigError: for a negative or non-int offset, a time without a zone."""
    if isinstance(to, ResetPosition):
        return to
    if isinstance(to, datetime.datetime):
        if to.tzinfo is None or to.utcoffset() is None:
            raise ConfigError(
                f"reset time {to.isoformat()} has no zone: give one (Z, +02:00), "
                "so that it means the same moment on every machine"
            )
        return to
    try:
        offset = operator.index(to)  # type: ignore[arg-type]
    except TypeError:
        offset = -1
    if isinstance(to, bool) or offset < 0:
        raise ConfigError(
            f"reset target must be 'earliest', 'latest', an offset >= 0 or an aware "
            f"datetime, got {to!r}"
        )
    return int(offset)


def _describe_target(to: ResetTarget) -> str:
    if isinstance(to, ResetPosition):
        return to.value
    if isinstance(to, datetime.datetime):
        return to.isoformat()
    return f"offset {to}"


async def committed_groups(log: Log, topic: str) -> tuple[str, ...] | None:
    """The groups with a committed offset on ``topic``, sorted; None when the
    log cannot list them (listing is not part of the :class:`Log` contract)."""
    offsets = await log.group_offsets(topic)
    return None if offsets is None else tuple(sorted(offsets))


async def running_members(log: Log, group: str, topic: str) -> tuple[RunningMember, ...] | None:
    """The members of ``group`` running on ``topic`` now, sorted by name.

    Read from :meth:`Log.partition_owners <wakuwaku.logs.Log.partition_owners>`.
    On a log of leases (memory, SQLite, Redis, NATS) a member runs while its
    lease has not expired: a member that stopped released its leases and is
    not listed; one that was killed is listed until its lease lapses
    (``ConsumerConfig.lease_ttl``, 15 s by default; the expiry was set by
    the log's clock, Redis's server clock on Redis, and is compared with
    this machine's). On a log whose group coordinator assigns partitions
    (Kafka, Iggy) every member the coordinator assigns a partition of the
    topic runs: a killed member counts until its session ends (Kafka:
    ``session_timeout``; Iggy: its connection).

    :returns: the running members; None when the log cannot tell.
    :raises UnknownTopicError: when the topic does not exist.
    """
    owners = await log.partition_owners(group, topic)
    if owners is None:
        return None
    assigned = isinstance(log, AssignmentLog)
    now = time.time()
    found: dict[str, list[int]] = {}
    expiry: dict[str, float] = {}
    for partition, lease in sorted(owners.items()):
        if assigned or lease.expires_at > now:
            found.setdefault(lease.member, []).append(partition)
            expiry[lease.member] = max(expiry.get(lease.member, 0.0), lease.expires_at)
    return tuple(
        RunningMember(member, tuple(parts), None if assigned else expiry[member])
        for member, parts in sorted(found.items())
    )


async def _running(log: Log, group: str, topic: str) -> tuple[RunningMember, ...]:
    """:func:`running_members`, refusing a log that cannot tell (ConfigError)."""
    running = await running_members(log, group, topic)
    if running is None:
        raise ConfigError(
            f"this log ({type(log).__name__}) cannot tell whether members of group "
            f"{group!r} run on {topic!r} (Log.partition_owners), so offsets are not reset"
        )
    return running


async def _first_record(
    log: Log, topic: str, partition: int, offset: int, end: int
) -> Record | None:
    """The first record at ``offset`` or after, below ``end``; None when there is none.

    Follows a :class:`~wakuwaku.logs.Page`'s ``next_offset`` over offsets that
    hold no record (Kafka's transaction markers)."""
    while offset < end:
        page = await log.read(topic, partition, offset, 1)
        if page:
            record = page[0]
            return record if record.offset < end else None
        following = page.next_offset if isinstance(page, Page) else offset
        if following <= offset:
            return None
        offset = following
    return None


async def offset_at_time(log: Log, topic: str, partition: int, at: float) -> int:
    """The offset of the first record of ``topic``/``partition`` stored at or
    after ``at`` (seconds since the epoch); the end offset when there is none.

    A binary search over ``[start offset, end offset]`` that reads one record
    per step (about log2 of the partition's records), comparing
    :attr:`Record.timestamp <wakuwaku.Record.timestamp>`: the time the log
    stored the record (SQLite and memory: the appending process's clock;
    Redis, NATS, Iggy: the server's; Kafka: the producer's create time
    unless the topic says ``LogAppendTime``). Timestamps are taken to grow
    with the offsets. Where they do not (a clock stepped back, Kafka
    producers with skewed clocks) the answer is a record at or after ``at``
    whose predecessor is before it, not necessarily the first such.

    :raises UnknownTopicError: when the topic does not exist.
    :raises UnknownPartitionError: when ``partition`` is not one of its partitions.
    :raises ConfigError: when ``at`` is not a finite number.
    """
    if not math.isfinite(at):
        raise ConfigError(f"a time to reset to must be finite seconds, got {at!r}")
    ends = await log.end_offsets(topic)
    if partition not in ends:
        raise UnknownPartitionError(topic, partition, len(ends))
    low = (await log.start_offsets(topic)).get(partition, 0)
    end = high = ends[partition]
    # Invariant: every offset below ``low`` holds records before ``at`` (or
    # none); the first record at or after ``high`` is at or after ``at`` (or
    # there is none).
    found: Record | None = None  # the first record at or after ``high``
    while low < high:
        middle = (low + high) // 2
        record = await _first_record(log, topic, partition, middle, end)
        if record is None or record.timestamp >= at:
            high, found = middle, record
        else:  # every offset up to this record's starts before ``at``
            low = record.offset + 1
    return found.offset if found is not None else end


async def _target_offset(
    log: Log, topic: str, partition: int, to: ResetTarget, start: int, end: int
) -> tuple[int, str]:
    """The offset ``to`` names on one partition, clamped to ``[start, end]``, and a note."""
    if to is ResetPosition.EARLIEST:
        return start, ""
    if to is ResetPosition.LATEST:
        return end, ""
    if isinstance(to, datetime.datetime):
        offset = await offset_at_time(log, topic, partition, to.timestamp())
        note = "no record at or after that time: the end offset" if offset == end else ""
        return offset, note
    assert isinstance(to, int)
    if to < start:
        return start, f"offset {to} is below the start offset {start}: clamped to {start}"
    if to > end:
        return end, f"offset {to} is past the end offset {end}: clamped to {end}"
    return to, ""


async def plan_offset_reset(
    log: Log,
    group: str,
    topic: str,
    to: ResetTarget,
    *,
    partition: int | None = None,
    namespace: str = "",
) -> OffsetResetPlan:
    """Where a reset of ``group`` on ``topic`` to ``to`` moves each partition; stores nothing.

    :param log: the log.
    :param group: the consumer group.
    :param topic: the main topic (without the namespace).
    :param to: a :class:`ResetPosition`, an offset (int ``>= 0``; clamped to
        each partition's ``[start offset, end offset]``, with a note) or an
        aware :class:`datetime.datetime` (per partition, the first record
        stored at or after it: :func:`offset_at_time`).
    :param partition: only this partition; None: every partition.
    :param namespace: the consumer's namespace prefix, if it had one.
    :returns: the plan, with the members running on the topic (``running``).
    :raises UnknownTopicError: when the topic does not exist.
    :raises UnknownPartitionError: when ``partition`` is not one of the topic's.
    :raises UnknownGroupError: when the group never committed on any
        partition of the topic, no member of it runs there and it has no
        retry or dead-letter topic for it (a mistyped group: the groups that
        did commit are named). On Iggy an offset of 0 is stored as none, so
        a group reset to offset 0 everywhere is known by those topics only.
    :raises ConfigError: for a bad group name, a negative offset, a time
        without a zone, when ``topic`` is a group's retry, dead-letter or
        replay-ledger topic (the message names the main topic), or when the
        log cannot tell whether members run (its
        :meth:`~wakuwaku.logs.Log.partition_owners` answers None; every log
        of wakuwaku can tell).
    """
    target = _check_target(to)
    names = await resolve_group_topics(log, topic, group, namespace)
    main = names.topic
    count = (await log.describe_topic(main)).partitions
    if partition is not None and (
        isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < count
    ):
        raise UnknownPartitionError(main, partition, count)
    running = await _running(log, group, main)
    committed = {p: await log.committed(group, main, p) for p in range(count)}
    if not running and all(c is None for c in committed.values()):
        # A consumer creates its group's retry and dead-letter topics when it
        # starts: a group without offsets but with them is known (one that
        # never committed yet; on Iggy, one whose offsets are all 0).
        made = [await _partitions_or_none(log, t) for t in (names.retry, names.dead_letter)]
        if all(m is None for m in made):
            raise UnknownGroupError(group, main, await committed_groups(log, main))
    starts = await log.start_offsets(main)
    ends = await log.end_offsets(main)
    entries = []
    for p in range(count) if partition is None else (partition,):
        start, end = starts.get(p, 0), ends.get(p, 0)
        offset, note = await _target_offset(log, main, p, target, start, end)
        entries.append(PartitionReset(p, committed[p], offset, start, end, note))
    return OffsetResetPlan(group, main, _describe_target(target), tuple(entries), running)


async def apply_offset_reset(log: Log, plan: OffsetResetPlan) -> OffsetResetPlan:
    """Store the offsets of ``plan`` (made by :func:`plan_offset_reset`), as planned.

    The running members are asked again first: nothing is stored while any
    run on the topic. Each partition whose committed offset differs gets the
    plan's offset, with :meth:`Log.commit <wakuwaku.logs.Log.commit>` and no
    fence. A member that starts between that check and the writes may have
    read the old offsets; the members running once the offsets are stored
    are in :attr:`OffsetResetPlan.running_after`.

    :returns: the plan, ``applied``.
    :raises GroupRunningError: when members of the group run on the topic
        (naming them and their partitions); nothing was stored.
    :raises ConfigError: when the log cannot tell whether members run.
    :raises LogError: when the log refuses a commit (Kafka refuses one while
        the group has any member, also one that runs on another topic); the
        message names the partitions stored before it.
    """
    running = await _running(log, plan.group, plan.topic)
    if running:
        raise GroupRunningError(
            plan.group, plan.topic, {p: m.member for m in running for p in m.partitions}
        )
    stored: list[int] = []
    for entry in plan.partitions:
        if not entry.moves:
            continue
        try:
            await log.commit(plan.group, plan.topic, entry.partition, entry.offset)
        except LogError as exc:
            done = ", ".join(map(str, stored)) or "none"
            raise LogError(
                f"storing offset {entry.offset} of group {plan.group!r} on "
                f"{plan.topic}/{entry.partition} failed (partitions stored before it: {done}): "
                f"{exc} (Kafka refuses the offsets of a group that has members, also "
                "members that run on other topics)"
            ) from exc
        stored.append(entry.partition)
    after = await running_members(log, plan.group, plan.topic) or ()
    return dataclasses.replace(plan, running=(), applied=True, running_after=after)


async def reset_offsets(
    log: Log,
    group: str,
    topic: str,
    to: ResetTarget,
    *,
    partition: int | None = None,
    dry_run: bool = False,
    namespace: str = "",
) -> OffsetResetPlan:
    """Move ``group``'s committed offsets on ``topic`` to ``to`` (Kafka's
    ``--reset-offsets``), refusing while members of the group run there.

    :func:`plan_offset_reset`, then :func:`apply_offset_reset`. The group's
    retry topic is not touched: its quarantined keys are retried as before.
    Iggy stores "the last record consumed": an offset of 0 is stored as no
    offset at all, which a consumer also reads from the start.

    :param dry_run: store nothing; the plan (with ``running``) is returned
        even when members run.
    :returns: the plan, ``applied`` unless ``dry_run``.
    :raises GroupRunningError: as :func:`apply_offset_reset`.
    :raises UnknownTopicError: / :raises UnknownPartitionError: /
        :raises UnknownGroupError: / :raises ConfigError: as :func:`plan_offset_reset`.
    :raises LogError: as :func:`apply_offset_reset`.
    """
    plan = await plan_offset_reset(log, group, topic, to, partition=partition, namespace=namespace)
    return plan if dry_run else await apply_offset_reset(log, plan)
