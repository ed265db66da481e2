"""Purging a group's dead letters: what ``wakuwaku dlq purge`` runs (design §8).

A log is append-only. None of wakuwaku's logs can delete a record from the
middle of a partition, and the ones that delete at all delete a prefix:
records below every group's committed offset (``Log.apply_retention``), or
whole segments by age or size (Kafka's ``retention.ms``, Iggy's expiry).
The contract has no call that deletes the records below an offset of one
topic, and purging only the prefix would leave every matching dead letter
after the first one that does not match.

So a purge is recorded, the way replays are: one record per purged dead
letter in the group's ledger topic (``wk-replayed.<group>.<topic>``, or
``<dead-letter topic>.replayed`` for a configured one; the same partition
number as the dead letter's, header ``wk-marker: purged``). Every reader of
dead letters leaves a purged one out: ``dlq list`` (unless
``--include-purged``), ``dlq replay`` (also with ``--all``) and the counts of
``status``, which counts purged dead letters apart. The same rule holds on
every log. The records themselves stay in the dead-letter topic until the
log's own retention removes them or the topic is deleted (``wakuwaku topic
delete``): purge is not erasure, and data that must be gone from storage
needs the topic deleted.

May call: the log, the engine's public names, :mod:`.dead_letters` (the
ledger and the dead-letter reader).
"""

from __future__ import annotations

from collections import Counter
from contextlib import aclosing
from dataclasses import dataclass, field

from .._errors import ConfigError, PartitionCountMismatch
from .._records import (
    H_DLQ_OFFSET,
    H_KEY,
    H_MARKER,
    H_REASON,
    H_VERSION,
    WIRE_VERSION,
    ReasonCode,
)
from ..logs import Log, OutgoingRecord
from .dead_letters import (
    MARKER_PURGED,
    MISSING_REASON,
    DeadLetter,
    _check_reason,
    _dead_letter_pages,
    _Ledger,
    _partitions_or_none,
    _read_ledger,
    resolve_group_topics,
)

__all__ = ("PurgeReport", "purge_dead_letters", "purged_offsets")


@dataclass
class PurgeReport:
    """What :func:`purge_dead_letters` did (or, with ``dry_run``, would do).

    :param topic: the (qualified) main topic.
    :param dead_letter_topic: the group's dead-letter topic.
    :param dry_run: true when nothing was written.
    :param purged: the matching dead letters purged now (or to be), in
        dead-letter partition then offset order.
    :param already_purged: matching dead letters an earlier purge purged.
    """

    topic: str
    dead_letter_topic: str
    dry_run: bool
    purged: list[DeadLetter] = field(default_factory=list)
    already_purged: int = 0

    @property
    def by_reason(self) -> dict[str, int]:
        """How many were purged per ``wk-reason`` (``<missing>`` for none)."""
        counts = Counter(x.reason or MISSING_REASON for x in self.purged)
        return dict(sorted(counts.items()))


def _check_selection(reason: str | None, replayed: bool, everything: bool) -> None:
    if everything and (reason is not None or replayed):
        raise ConfigError("purge everything, or select by reason and/or replayed: not both")
    if not everything and reason is None and not replayed:
        raise ConfigError(
            "say which dead letters to purge: the replayed ones, those of one reason, or everything"
        )


def _selected(letter: DeadLetter, ledger: _Ledger, reason: str | None, replayed: bool) -> bool:
    if reason is not None and letter.reason != reason:
        return False
    return not replayed or ledger.was_replayed(letter.partition, letter.offset)


def _purge_record(letter: DeadLetter) -> OutgoingRecord:
    headers = {
        H_VERSION: WIRE_VERSION,
        H_MARKER: MARKER_PURGED,
        H_KEY: (letter.key or "").encode(),
        H_DLQ_OFFSET: str(letter.offset).encode(),
    }
    if letter.reason is not None:
        headers[H_REASON] = letter.reason.encode()
    return headers, b""


async def purge_dead_letters(
    log: Log,
    topic: str,
    *,
    group: str,
    reason: ReasonCode | str | None = None,
    replayed: bool = False,
    everything: bool = False,
    dry_run: bool = False,
    namespace: str = "",
) -> PurgeReport:
    """Purge ``group``'s dead letters of ``topic``: they no longer show in
    :func:`~wakuwaku.admin.list_dead_letters`, are never replayed and are
    counted apart by :func:`~wakuwaku.admin.consumer_status`.

    Each purged dead letter gets a record in the group's ledger topic
    (created on first use with the dead-letter topic's partition count);
    the dead-letter records themselves stay in the log (see the module: no
    log deletes a record from the middle of a partition). Purging is
    idempotent: a dead letter purged before is counted in
    :attr:`PurgeReport.already_purged`, not recorded again. Two purges or
    a purge and a replay of one topic at the same moment are not
    coordinated: run one at a time.

    :param log: the log.
    :param topic: the main topic.
    :param group: the consumer group whose dead letters are purged.
    :param reason: only dead letters with this reason code.
    :param replayed: only dead letters that ``dlq replay`` replayed (its
        ledger says so); with ``reason``, those of that reason.
    :param everything: every dead letter of the group, those with broken
        headers included.
    :param dry_run: write nothing; the report says what would be purged.
    :param namespace: the consumer's namespace prefix, if it had one.
    :returns: a :class:`PurgeReport`; an empty one when the consumer never
        created its dead-letter topic.
    :raises UnknownTopicError: when the main topic does not exist.
    :raises PartitionCountMismatch: when the ledger topic exists with another
        partition count than the dead-letter topic.
    :raises ConfigError: for an unknown reason code, for no selection (none
        of ``reason``, ``replayed``, ``everything``) or ``everything`` with
        another one, or when ``topic`` is a dead-letter, retry or ledger
        topic (the message names its main topic).
    """
    wanted = _check_reason(reason)
    _check_selection(wanted, replayed, everything)
    names = await resolve_group_topics(log, topic, group, namespace)
    await log.describe_topic(names.topic)
    report = PurgeReport(names.topic, names.dead_letter, dry_run)
    partitions = await _partitions_or_none(log, names.dead_letter)
    if partitions is None:
        return report
    ledger = await _read_ledger(log, names.replay_ledger)
    async with aclosing(_dead_letter_pages(log, names, partitions)) as pages:
        async for p, page in pages:
            chosen = []
            for letter in page:
                if not _selected(letter, ledger, wanted, replayed):
                    continue
                if ledger.was_purged(p, letter.offset):
                    report.already_purged += 1
                else:
                    chosen.append(letter)
            if chosen and not dry_run:
                if not report.purged:  # the first purge record: the ledger may not exist
                    await _create_ledger(log, names.replay_ledger, partitions, names.topic)
                await log.append(names.replay_ledger, p, [_purge_record(x) for x in chosen])
            report.purged.extend(chosen)
    return report


async def purged_offsets(
    log: Log, topic: str, *, group: str, namespace: str = ""
) -> dict[int, frozenset[int]]:
    """Where ``group``'s purged dead letters of ``topic`` are: per
    dead-letter partition, their offsets, as the ledger records them.

    For a reader that keeps its own index of the dead-letter topic (the
    dashboard) and must leave purged dead letters out as
    :func:`~wakuwaku.admin.list_dead_letters` does.

    :returns: an empty mapping when nothing was ever purged.
    :raises ConfigError: when ``topic`` is a dead-letter, retry or ledger topic.
    :raises LogError: what the log raises.
    """
    names = await resolve_group_topics(log, topic, group, namespace)
    ledger = await _read_ledger(log, names.replay_ledger)
    return {p: frozenset(offsets) for p, offsets in ledger.purged.items() if offsets}


async def _create_ledger(log: Log, ledger: str, partitions: int, main: str) -> None:
    try:
        await log.create_topic(ledger, partitions, derived_from=main)
    except PartitionCountMismatch as exc:
        raise PartitionCountMismatch(ledger, exc.existing, partitions) from None
