"""Read-only views of a consumer's partitions and quarantined keys (design §6, §14).

What :meth:`Consumer.partitions <wakuwaku.engine.Consumer.partitions>` and
``wakuwaku status`` (:func:`wakuwaku.admin.consumer_status`) return: frozen
snapshots, safe to keep and to read from another thread (the metrics
server's), never the live state.

May call: :mod:`._retry` (the one retry-state loader) and the log (reads
only). Called by the consumer and by ``wakuwaku.admin``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..logs import Log
from ._retry import RetryState, load_retry_state


@dataclass(frozen=True, slots=True)
class QuarantinedKey:
    """A key waiting in the retry topic (design §6).

    :param partition: its partition.
    :param key: the key.
    :param pending: its pending work records.
    :param failures: failures in a row of the current cycle; the next
        attempt runs with ``ChunkContext.attempt`` equal to it, and the key
        gives up when that attempt fails and ``failures`` equals the number
        of retry delays. 0 after a give-up: its other records are due at once.
    :param next_attempt_at: when the next attempt may run (seconds since the
        epoch, on the consumer's clock).
    :param first_failed_at: the cycle's first failure (seconds since the epoch).
    :param retry_offset: the offset of its first pending work record in the
        retry partition (its ``wk-error`` holds the failure's sanitized
        text: ``wakuwaku dashboard`` shows it); None without a pending record.
    """

    partition: int
    key: str
    pending: int
    failures: int
    next_attempt_at: float
    first_failed_at: float
    retry_offset: int | None = None


def quarantined_keys(state: RetryState, partition: int) -> list[QuarantinedKey]:
    """The quarantined keys of one retry partition's state, in the state's order."""
    return [
        QuarantinedKey(
            partition,
            key,
            len(s.offsets),
            s.failures,
            s.due_wall,
            s.first_failed_at,
            s.offsets[0] if s.offsets else None,
        )
        for key, s in list(state.keys.items())
    ]


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition a running consumer owns, as its partition worker sees it now.

    Like a Kafka consumer's ``assignment()`` and ``position()``: what this
    process holds, not what the log stores (``wakuwaku status`` reads that).

    :param topic: the (qualified) main topic.
    :param partition: the partition.
    :param started: the worker has restored its retry state and position
        (the other fields are empty until then).
    :param position: the offset of the next record to consume (its batch
        is stored when done).
    :param caught_up: the last poll found nothing new.
    :param retry_pending: work records pending in the retry partition.
    :param quarantined: the partition's quarantined keys, earliest next
        attempt first (a paused key's held work included).
    :param paused_by: the operator's pause that stops the partition (its
        scope in words: ``topic shop``, ``partition 3 of shop``), None
        while it runs.
    :param paused_keys: how many of its keys an operator paused.
    """

    topic: str
    partition: int
    started: bool
    position: int
    caught_up: bool
    retry_pending: int
    quarantined: tuple[QuarantinedKey, ...]
    paused_by: str | None = None
    paused_keys: int = 0

    @property
    def next_attempt_at(self) -> float | None:
        """The earliest next attempt (seconds since the epoch), None without
        quarantined keys."""
        return min((q.next_attempt_at for q in self.quarantined), default=None)

    def lag(self, end_offset: int) -> int:
        """Records after :attr:`position` given the partition's ``end_offset``."""
        return max(0, end_offset - self.position)


@dataclass(frozen=True, slots=True)
class RetryPartitionState:
    """One retry partition read back by :func:`read_retry_partition`.

    :param committed: the group's committed offset in it (its lowest pending
        record), None when the group never committed there.
    :param pending: pending work records.
    :param quarantined: the quarantined keys, in the order their first
        records were written.
    :param broken: records whose own headers cannot be read, each as
        (retry offset, key or ``""``, what is wrong); the consumer logs them
        and goes on (a broken work record is dead-lettered by its attempt).
    :param foreign: records of other consumer groups (``wk-group``) skipped:
        two groups were configured with one retry topic (design §6).
    """

    committed: int | None
    pending: int
    quarantined: tuple[QuarantinedKey, ...]
    broken: tuple[tuple[int, str, str], ...]
    foreign: int = 0


async def read_retry_partition(
    log: Log,
    group: str,
    retry_topic: str,
    partition: int,
    delay: Callable[[int], float],
) -> RetryPartitionState:
    """Read one retry partition as a restarting consumer does (design §6).

    :param retry_topic: the retry topic (:meth:`ConsumerConfig.retry_topic`).
    :param delay: ``delay(failures) -> seconds`` (:meth:`ConsumerConfig.delay`),
        used only for records written without a stored due time.
    :raises LogError: what the log raises.
    """
    state = RetryState(delay, group=group)
    committed, _ = await load_retry_state(log, group, retry_topic, partition, state)
    return RetryPartitionState(
        committed,
        state.pending_count,
        tuple(quarantined_keys(state, partition)),
        tuple(state.broken),
        state.foreign,
    )
