"""A consumer group's state on a topic, read from the log: ``wakuwaku status`` (design §6, §14).

:func:`consumer_status` reports a group's lag per partition, its quarantined
keys with their next attempt time, the retry backlog and the dead letters
per reason, and the operators' pauses in force on the topic. The retry state
is read with the consumer's own loader
(:func:`wakuwaku.engine.read_retry_partition`), so status and a restarting
consumer never disagree about a retry record; the pauses are folded from
the group's control topic as its consumers fold them (:mod:`.control`).

May call: the log, the engine's public names, :mod:`.dead_letters` (the
dead-letter counts), :mod:`.control` (the pauses), :mod:`.offsets` (the
groups that committed, the members running each partition).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .._control import Pause
from .._errors import LogError, LogUnavailableError
from .._text import counted, shown_key
from ..engine import (
    DEFAULT_RETRY_DELAYS,
    ConsumerConfig,
    QuarantinedKey,
    read_retry_partition,
)
from ..logs import Log
from .control import pauses as read_pauses
from .dead_letters import _dead_letter_counts, _partitions_or_none, resolve_group_topics
from .offsets import committed_groups, running_members

logger = logging.getLogger("wakuwaku.admin")

__all__ = (
    "PartitionStatus",
    "QuarantinedKey",
    "Status",
    "consumer_status",
)


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One partition of the main topic, seen from one group.

    :param partition: the partition.
    :param start_offset: its lowest stored offset.
    :param end_offset: the offset the next record will get.
    :param committed: the group's committed offset (next to read), None
        when the group never committed on it.
    :param lag: records not yet consumed: ``end - committed`` (``end - start``
        without a commit).
    :param retry_pending: work records pending in ``wk-retry.<group>.<topic>`` partition.
    :param quarantined: quarantined keys of the partition.
    :param retry_committed: the group's committed offset in the retry
        partition (its lowest pending record), None when never committed.
    :param owner: the member of the group running the partition now
        (:func:`~wakuwaku.admin.running_members`); None when none is, or the
        log cannot tell.
    """

    partition: int
    start_offset: int
    end_offset: int
    committed: int | None
    lag: int
    retry_pending: int = 0
    quarantined: int = 0
    retry_committed: int | None = None
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """A group's position on a topic: lag, retry state and dead letters (design §14).

    :param topic: the (qualified) main topic.
    :param group: the consumer group.
    :param partitions: per partition, in order.
    :param quarantined: quarantined keys, earliest next attempt first.
    :param dead_letters: dead letters per ``wk-reason`` (``"<missing>"`` for
        records without one), purged ones left out.
    :param problems: broken records met in the retry topic, each naming
        topic, partition and offset (the consumer would stop on them too).
    :param replayed: of :attr:`dead_letters`, those per reason that the
        replay ledger says were replayed already.
    :param groups: the groups with a committed offset on the topic, when the
        log can list them (None otherwise).
    :param retry_topic: / :param dead_letter_topic: the group's retry and
        dead-letter topics that were read (derived or configured, design §6).
    :param purged: dead letters per reason that ``dlq purge`` purged (not
        in :attr:`dead_letters`).
    :param pauses: the pauses in force for the group on this topic (the
        topic's, its partitions' and its keys'), oldest command first.
    """

    topic: str
    group: str
    partitions: tuple[PartitionStatus, ...]
    quarantined: tuple[QuarantinedKey, ...]
    dead_letters: Mapping[str, int]
    problems: tuple[str, ...] = ()
    replayed: Mapping[str, int] = field(default_factory=dict)
    groups: tuple[str, ...] | None = None
    retry_topic: str = ""
    dead_letter_topic: str = ""
    purged: Mapping[str, int] = field(default_factory=dict)
    pauses: tuple[Pause, ...] = ()

    @property
    def never_committed(self) -> bool:
        """The group has no committed offset on any partition of the topic: a
        mistyped group, or a consumer that never got as far as a commit."""
        return all(p.committed is None for p in self.partitions)

    @property
    def not_replayed(self) -> dict[str, int]:
        """Dead letters per reason that ``dlq replay`` has not replayed yet."""
        left = {
            reason: count - self.replayed.get(reason, 0)
            for reason, count in self.dead_letters.items()
        }
        return {reason: count for reason, count in left.items() if count}

    @property
    def lag(self) -> int:
        """Total lag over all partitions (records)."""
        return sum(p.lag for p in self.partitions)

    @property
    def backlog(self) -> int:
        """Pending work records in the retry topic, all partitions."""
        return sum(p.retry_pending for p in self.partitions)

    @property
    def dead_lettered(self) -> int:
        """All dead letters."""
        return sum(self.dead_letters.values())

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "topic": self.topic,
            "group": self.group,
            "retry_topic": self.retry_topic,
            "dead_letter_topic": self.dead_letter_topic,
            "lag": self.lag,
            "backlog": self.backlog,
            "partitions": [
                {
                    "partition": p.partition,
                    "start_offset": p.start_offset,
                    "end_offset": p.end_offset,
                    "committed": p.committed,
                    "lag": p.lag,
                    "retry_pending": p.retry_pending,
                    "quarantined": p.quarantined,
                    "retry_committed": p.retry_committed,
                    "owner": p.owner,
                }
                for p in self.partitions
            ],
            "quarantined": [
                {
                    "partition": q.partition,
                    "key": q.key,
                    "pending": q.pending,
                    "failures": q.failures,
                    "next_attempt_at": q.next_attempt_at,
                    "first_failed_at": q.first_failed_at,
                    "retry_offset": q.retry_offset,
                }
                for q in self.quarantined
            ],
            "dead_letters": dict(self.dead_letters),
            "dead_letters_replayed": dict(self.replayed),
            "dead_letters_not_replayed": self.not_replayed,
            "dead_letters_purged": dict(self.purged),
            "never_committed": self.never_committed,
            "groups": None if self.groups is None else list(self.groups),
            "problems": list(self.problems),
            "pauses": [asdict(pause) for pause in self.pauses],
        }


async def consumer_status(
    log: Log,
    topic: str,
    group: str,
    *,
    retry_delays: Sequence[float] = DEFAULT_RETRY_DELAYS,
    namespace: str = "",
) -> Status:
    """Lag, quarantined keys, retry backlog, dead letters and pauses of ``group`` on ``topic``.

    The retry state is rebuilt by reading the group's retry topic
    (``wk-retry.<group>.<topic>``, or the configured name its consumer noted:
    :func:`wakuwaku.engine.group_topics`) from the group's
    committed retry offset with the consumer's own loader
    (:func:`~wakuwaku.engine.read_retry_partition`),
    exactly as a restarting consumer does (design §6); the next attempt times
    are the ones the consumer stored with each failure (``wk-due-at``), so
    they do not depend on ``retry_delays``, which only serves records
    written before the due time was stored. The pauses are those of the
    group's control topic (:func:`wakuwaku.admin.pauses`) on this topic.

    :param log: the log.
    :param topic: the main topic.
    :param group: the consumer group.
    :param retry_delays: the consumer's ``retry_delays`` (seconds), used only
        for retry records that carry no ``wk-due-at``.
    :param namespace: the consumer's namespace prefix, if it had one.
    :raises UnknownTopicError: when the main topic does not exist.
    :raises ConfigError: for an empty group or a bad retry schedule, or
        when ``topic`` is a dead-letter, retry or ledger topic.
    """
    names = await resolve_group_topics(log, topic, group, namespace)
    config = ConsumerConfig(
        topic=topic, group=group, namespace=namespace, retry_delays=retry_delays
    )
    main = names.topic
    partitions = (await log.describe_topic(main)).partitions
    starts = await log.start_offsets(main)
    # The committed offsets first, the end offsets after them: a consumer
    # running meanwhile moves both, and a committed offset read after the end
    # could stand above it (end 642, committed 643).
    commits = {p: await log.committed(group, main, p) for p in range(partitions)}
    ends = await log.end_offsets(main)
    retry = names.retry
    has_retry = await _partitions_or_none(log, retry) is not None
    owners = await _owners(log, group, main)
    problems: list[str] = []
    rows: list[PartitionStatus] = []
    quarantined: list[QuarantinedKey] = []
    for p in range(partitions):
        committed = commits[p]
        start, end = starts.get(p, 0), ends.get(p, 0)
        lag = max(0, end - (committed if committed is not None else start))
        pending = keys = 0
        retry_committed: int | None = None
        if has_retry:
            state = await read_retry_partition(log, group, retry, p, config.delay)
            retry_committed = state.committed
            pending, keys = state.pending, len(state.quarantined)
            quarantined.extend(state.quarantined)
            problems.extend(
                f"{retry} partition {p} offset {offset} (key {shown_key(key, 200)}): "
                f"broken retry record: {what}"
                for offset, key, what in state.broken
            )
            if state.foreign:
                problems.append(
                    f"{retry} partition {p}: {counted(state.foreign, 'record')} of other consumer "
                    "groups, skipped (two groups were configured with one retry topic)"
                )
        rows.append(
            PartitionStatus(
                p, start, end, committed, lag, pending, keys, retry_committed, owners.get(p)
            )
        )
    quarantined.sort(key=lambda q: (q.next_attempt_at, q.partition, q.key))
    dead, replayed, purged = await _dead_letter_counts(log, names)
    paused = [p for p in await read_pauses(log, group, namespace) if p.topic == main]
    return Status(
        main,
        group,
        tuple(rows),
        tuple(quarantined),
        dead,
        tuple(problems),
        replayed,
        await committed_groups(log, main),
        retry,
        names.dead_letter,
        purged,
        tuple(paused),
    )


async def _owners(log: Log, group: str, topic: str) -> dict[int, str]:
    """Partition -> the member running it now; empty when the log cannot tell
    or refuses to say (a user without the right to describe the group: the
    rest of the status does not need it, and an owner then shows ``-``)."""
    try:
        running = await running_members(log, group, topic)
    except LogUnavailableError:
        raise
    except LogError as exc:
        logger.debug("status of %r on %r: members not read: %s", group, topic, exc)
        return {}
    return {p: member.member for member in running or () for p in member.partitions}
