"""A consumer group's dead letters: list, replay, and the replay ledger (design §8).

What ``wakuwaku dlq list`` and ``wakuwaku dlq replay`` run. Every function is
async, takes an open :class:`~wakuwaku.logs.Log`, the *main* topic's name
(``orders``, not ``wk-dlq.billing.orders``) and the consumer group whose
dead-letter topic is meant; ``namespace`` is the
:attr:`ConsumerConfig.namespace <wakuwaku.engine.ConsumerConfig.namespace>`
of the consumer that wrote them.

- :func:`list_dead_letters` reads the group's dead-letter topic
  (``wk-dlq.<group>.<topic>``, or the name its consumer was configured with
  and noted in the topic-names topic: :func:`wakuwaku.engine.group_topics`),
  every partition, and parses each record into a :class:`DeadLetter`. A
  dead letter whose headers are broken is listed with its
  :attr:`DeadLetter.problems`, never left out. Dead letters another group
  wrote (``wk-group``) or of another main topic (``wk-src``), in a
  dead-letter topic shared on purpose or configured twice by accident, are
  not this group's and are left out (design §6).
- :func:`replay_dead_letters` writes dead letters back into the main topic,
  addressed to their group only (``wk-for-group``: other groups skip the
  copy). The copy keeps ``wk-src``, so the consumer handles it under the message
  identity of the record it was (design §9) and an inbox skips a replay of
  something that was applied after all. Replay remembers what it replayed
  in a ledger topic ``wk-replayed.<group>.<topic>`` (``<dead-letter
  topic>.replayed`` for a configured dead-letter topic; one ledger record
  per replayed dead letter), so a second run does not replay it again;
  ``everything=True`` (``--all``) ignores the ledger.
- The ledger also notes purges (marker ``purged``, written by
  :func:`wakuwaku.admin.purge.purge_dead_letters`): every reader here
  (:func:`list_dead_letters`, :func:`replay_dead_letters`, the counts of
  ``status``) leaves purged dead letters out.

May call: the log, the engine's public names (topic names, configuration).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections import Counter
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError, PartitionCountMismatch, UnknownTopicError
from .._records import (
    H_ALG,
    H_DLQ_OFFSET,
    H_ERROR,
    H_FOR_GROUP,
    H_GROUP,
    H_KEY,
    H_MARKER,
    H_PROPS,
    H_REASON,
    H_REPLAYED_TO,
    H_SRC,
    H_TYPE,
    H_UNREADABLE,
    H_VERSION,
    WIRE_VERSION,
    ReasonCode,
    Record,
    Source,
    header_text,
    read_source,
)
from .._sanitize import sanitize
from ..engine import (
    GroupTopics,
    group_topics,
    read_topic_names,
    replay_ledger_topic_name,
    split_internal_topic,
    topic_owner,
)
from ..logs import Log, OutgoingRecord

logger = logging.getLogger("wakuwaku.admin")

__all__ = (
    "MISSING_REASON",
    "DeadLetter",
    "DeadLetterOrder",
    "ReplayReport",
    "ReplayedDeadLetter",
    "SkippedDeadLetter",
    "dead_letter_groups",
    "derived_topic_owner",
    "list_dead_letters",
    "main_topic_problem",
    "parse_dead_letter",
    "replay_dead_letters",
    "replay_ledger_topic_name",
    "resolve_group_topics",
)

_PAGE = 500
MARKER_REPLAYED = b"replayed"
MARKER_PURGED = b"purged"
MISSING_REASON = "<missing>"
"""How :class:`Status` counts dead letters without a ``wk-reason`` header."""

# The wk-* headers a replayed copy keeps: the event's own (design §3) and its identity.
# Every other wk-* header describes the failure (wk-reason, wk-error, wk-failed-at)
# or the retry topic's bookkeeping (a dead letter of a retry record carries it).
_KEPT_ON_REPLAY = frozenset({H_VERSION, H_TYPE, H_KEY, H_PROPS, H_ALG, H_SRC})


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of ``wk-dlq.<group>.<topic>``, parsed (design §8).

    :param partition: its partition in ``wk-dlq.<group>.<topic>`` (the main record's partition).
    :param offset: its offset there.
    :param reason: ``wk-reason`` as written (a :class:`ReasonCode` value when
        well-formed), None when missing.
    :param error: ``wk-error``, the sanitized error text, None when missing.
    :param key: ``wk-key``, None when missing or not valid UTF-8.
    :param type_tag: ``wk-type``, None when missing.
    :param source: ``wk-src``: the main-topic partition, offsets and message
        ids (design §9) it stands for; None when missing or broken.
    :param headers: every header, raw.
    :param body: the body, raw.
    :param timestamp: when the log stored it (seconds since the epoch).
    :param problems: what is broken about its headers (empty for a
        well-formed dead letter); such a record is listed, never dropped.
    :param group: ``wk-group``, the consumer group that wrote it; None for
        a dead letter written before the engine stamped it.
    :param purged: True when the ledger says it was purged
        (:func:`~wakuwaku.admin.purge_dead_letters`); only listed with ``include_purged``.
    """

    partition: int
    offset: int
    reason: str | None
    error: str | None
    key: str | None
    type_tag: str | None
    source: Source | None
    headers: Mapping[str, bytes]
    body: bytes
    timestamp: float = 0.0
    problems: tuple[str, ...] = ()
    group: str | None = None
    purged: bool = False

    def belongs_to(self, topic: str, group: str) -> bool:
        """False when ``wk-group`` names another group or ``wk-src`` another
        main topic: a dead letter of someone else in a shared dead-letter topic
        (design §6). ``topic`` is the qualified main topic."""
        if self.group is not None and self.group != group:
            return False
        return self.source is None or self.source.topic == topic

    @property
    def reason_code(self) -> ReasonCode | None:
        """:attr:`reason` as a :class:`ReasonCode`, None when missing or unknown."""
        try:
            return ReasonCode(self.reason) if self.reason is not None else None
        except ValueError:
            return None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view: header values as text (invalid UTF-8 replaced);
        the body as ``body`` text when it is UTF-8, else as ``body_hex``."""
        out: dict[str, Any] = {
            "partition": self.partition,
            "offset": self.offset,
            "reason": self.reason,
            "error": self.error,
            "key": self.key,
            "type": self.type_tag,
            "source": None
            if self.source is None
            else {
                "topic": self.source.topic,
                "partition": self.source.partition,
                "offsets": list(self.source.offsets),
                "ids": list(self.source.ids),
            },
            "timestamp": self.timestamp,
            "headers": {
                name: bytes(value).decode("utf-8", "replace")
                for name, value in sorted(self.headers.items())
            },
            "problems": list(self.problems),
            "purged": self.purged,
        }
        try:
            out["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            out["body_hex"] = self.body.hex()
        return out


def parse_dead_letter(partition: int, record: Record) -> DeadLetter:
    """Parse one record of a dead-letter topic (``wk-dlq.<group>.<topic>``);
    broken headers become :attr:`DeadLetter.problems`."""
    headers = record.headers
    problems: list[str] = []
    unreadable = header_text(headers, H_UNREADABLE)
    if unreadable is not None and header_text(headers, H_REASON) is None:
        problems.append(f"the log could not read this record: {sanitize(unreadable, 200)}")
    reason = header_text(headers, H_REASON)
    if reason is None:
        problems.append("no wk-reason header")
    elif reason not in _REASONS:
        problems.append(f"unknown reason {sanitize(reason, 80)!r}")
    key: str | None = None
    raw_key = headers.get(H_KEY)
    if raw_key is None or raw_key == b"":
        problems.append("no wk-key header (or an empty one): it cannot be routed")
    else:
        try:
            key = bytes(raw_key).decode("utf-8")
        except UnicodeDecodeError:
            problems.append("wk-key is not valid UTF-8: it cannot be routed")
    source: Source | None = None
    raw_src = headers.get(H_SRC)
    if raw_src is None:
        problems.append("no wk-src header: the original message identity is unknown")
    else:
        try:
            source = read_source(bytes(raw_src))
        except ValueError as exc:
            problems.append(f"wk-src is broken: {sanitize(exc, 200)}")
    return DeadLetter(
        partition=partition,
        offset=record.offset,
        reason=reason,
        error=header_text(headers, H_ERROR),
        key=key,
        type_tag=header_text(headers, H_TYPE),
        source=source,
        headers=dict(headers),
        body=bytes(record.body),
        timestamp=record.timestamp,
        problems=tuple(problems),
        group=header_text(headers, H_GROUP),
    )


_REASONS = frozenset(r.value for r in ReasonCode)


def _check_reason(reason: ReasonCode | str | None) -> str | None:
    if reason is None:
        return None
    try:
        return ReasonCode(reason).value
    except ValueError:
        raise ConfigError(
            f"unknown dead-letter reason {reason!r}; use one of "
            + ", ".join(r.value for r in ReasonCode)
        ) from None


def _check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit must be an int >= 1 or None, got {limit!r}")


def derived_topic_owner(topic: str, namespace: str = "") -> tuple[str, str, str] | None:
    """``(kind, group, main topic)`` when ``topic`` has the shape of a group's
    derived dead-letter, retry or replay-ledger topic name; else None.

    Recognises a derived name given where a main topic is expected
    (``wakuwaku dlq list wk-dlq.billing.orders``): derived names are a
    function of (topic, group) (design §6), so the name alone tells.
    Configured names are recognised by :func:`main_topic_problem`, which
    reads the topic-names topic.

    :param namespace: the consumer's namespace prefix, if it had one.
    """
    prefix = f"{namespace}." if namespace else ""
    bare = topic[len(prefix) :] if prefix and topic.startswith(prefix) else topic
    split = split_internal_topic(bare)
    if split is None:
        return None
    kind, group, main = split
    words = {"retry": "retry", "dlq": "dead-letter", "replayed": "replay ledger"}
    return words[kind], group, main


async def dead_letter_groups(log: Log, topic: str, namespace: str = "") -> list[str]:
    """The consumer groups that have a dead-letter topic for main topic
    ``topic`` (every group that consumed it creates one at start: a derived
    name, or a configured one noted in the topic-names topic), sorted.

    For telling a mistyped ``--group`` apart from a group without dead letters.
    """
    prefix = f"{namespace}." if namespace else ""
    topics = {info.name for info in await log.list_topics()}
    found = set()
    for full in topics:
        name = full[len(prefix) :] if prefix and full.startswith(prefix) else full
        split = split_internal_topic(name)
        if split is not None and split[0] == "dlq" and split[2] == topic:
            found.add(split[1])
    main = f"{prefix}{topic}"
    for names in (await read_topic_names(log, namespace)).values():
        if names.topic == main and names.dead_letter in topics:
            found.add(names.group)
    return sorted(found)


async def main_topic_problem(log: Log, topic: str, namespace: str = "") -> str | None:
    """Why ``topic`` (without the namespace) is not a main topic: it is a
    group's retry, dead-letter or replay-ledger topic, by its derived name or
    as noted in the topic-names topic (the message names the main topic and
    group meant); None for a main topic."""
    owner = derived_topic_owner(topic, namespace)
    if owner is not None:
        kind, group, main = owner
        return (
            f"{topic!r} is the {kind} topic of group {group!r} for topic "
            f"{main!r}: give the main topic {main!r} with --group {group}"
        )
    qualified = f"{namespace}.{topic}" if namespace else topic
    noted = topic_owner(qualified, (await read_topic_names(log, namespace)).values())
    if noted is not None:
        word, names = noted
        prefix = f"{namespace}." if namespace else ""
        main = names.topic[len(prefix) :]
        return (
            f"{topic!r} is the {word} topic of group {names.group!r} for topic "
            f"{main!r} (configured): give the main topic {main!r} with --group {names.group}"
        )
    return None


async def resolve_group_topics(
    log: Log, topic: str, group: str, namespace: str = ""
) -> GroupTopics:
    """The topics ``group`` uses for main topic ``topic`` (derived, or configured
    and noted: :func:`wakuwaku.engine.group_topics`).

    :raises ConfigError: for a bad group name, or when ``topic`` is a retry,
        dead-letter or replay-ledger topic (:func:`main_topic_problem`).
    """
    problem = await main_topic_problem(log, topic, namespace)
    if problem is not None:
        raise ConfigError(problem)
    return await group_topics(log, topic, group, namespace=namespace)


async def _partitions_or_none(log: Log, topic: str) -> int | None:
    try:
        return (await log.describe_topic(topic)).partitions
    except UnknownTopicError:
        return None


async def _scan(
    log: Log,
    topic: str,
    partition: int,
    start: int,
    end: int,
) -> AsyncGenerator[list[Record], None]:
    """Pages of ``topic``/``partition`` from ``start`` up to (not including) ``end``."""
    offset = start
    while offset < end:
        page = await log.read(topic, partition, offset, min(_PAGE, end - offset))
        page = [r for r in page if r.offset < end]
        if not page:
            return
        yield page
        offset = page[-1].offset + 1


async def _dead_letter_pages(
    log: Log, names: GroupTopics, partitions: int
) -> AsyncGenerator[tuple[int, list[DeadLetter]], None]:
    """The group's dead letters of its main topic, page by page; another
    group's or another main topic's (:meth:`DeadLetter.belongs_to`) are left out."""
    dead_letter_topic = names.dead_letter
    starts = await log.start_offsets(dead_letter_topic)
    ends = await log.end_offsets(dead_letter_topic)
    for p in range(partitions):
        async for page in _scan(log, dead_letter_topic, p, starts.get(p, 0), ends.get(p, 0)):
            letters = (parse_dead_letter(p, r) for r in page)
            yield p, [x for x in letters if x.belongs_to(names.topic, names.group)]


def _matches(letter: DeadLetter, reason: str | None, key: str | None) -> bool:
    return (reason is None or letter.reason == reason) and (key is None or letter.key == key)


class DeadLetterOrder(enum.StrEnum):
    """The order :func:`list_dead_letters` returns dead letters in."""

    LOG = "log"
    """By dead-letter partition, then offset: the order they are stored in."""
    OLDEST_FIRST = "oldest"
    """By the time the log stored them, oldest first (then partition, offset)."""
    NEWEST_FIRST = "newest"
    """By the time the log stored them, newest first (then partition, offset,
    both descending): what an operator looking at a fresh failure wants first."""


def _in_order(letters: list[DeadLetter], order: DeadLetterOrder) -> list[DeadLetter]:
    if order is DeadLetterOrder.LOG:
        return letters
    return sorted(
        letters,
        key=lambda x: (x.timestamp, x.partition, x.offset),
        reverse=order is DeadLetterOrder.NEWEST_FIRST,
    )


async def list_dead_letters(
    log: Log,
    topic: str,
    *,
    group: str,
    reason: ReasonCode | str | None = None,
    key: str | None = None,
    limit: int | None = None,
    namespace: str = "",
    order: DeadLetterOrder | str = DeadLetterOrder.LOG,
    include_purged: bool = False,
) -> list[DeadLetter]:
    """The dead letters of ``topic`` (design §8), purged ones left out.

    :param log: the log.
    :param topic: the main topic.
    :param group: the consumer group whose dead letters are listed (its
        dead-letter topic is ``wk-dlq.<group>.<topic>``, or the configured
        name its consumer noted: :func:`wakuwaku.engine.group_topics`).
    :param reason: only dead letters with this reason code.
    :param key: only dead letters of this key.
    :param limit: at most this many (the first ones in ``order``).
    :param namespace: the consumer's namespace prefix, if it had one.
    :param order: a :class:`DeadLetterOrder` (or its value): by partition
        and offset (the default), or by the time the log stored them.
    :param include_purged: list purged dead letters too, with
        :attr:`DeadLetter.purged` set.
    :returns: the matching dead letters; an empty list when the consumer
        never created its dead-letter topic. Dead letters with broken headers are
        included, with :attr:`DeadLetter.problems` saying what is wrong.
    :raises UnknownTopicError: when the main topic does not exist.
    :raises ConfigError: for an unknown reason code or order or a limit below
        1, or when ``topic`` is a dead-letter, retry or ledger topic (the
        message names its main topic).
    """
    wanted = _check_reason(reason)
    _check_limit(limit)
    try:
        order = DeadLetterOrder(order)
    except ValueError:
        raise ConfigError(
            f"unknown dead-letter order {order!r}; use one of "
            + ", ".join(o.value for o in DeadLetterOrder)
        ) from None
    names = await resolve_group_topics(log, topic, group, namespace)
    await log.describe_topic(names.topic)
    partitions = await _partitions_or_none(log, names.dead_letter)
    if partitions is None:
        return []
    ledger = await _read_ledger(log, names.replay_ledger)
    found: list[DeadLetter] = []
    async with aclosing(_dead_letter_pages(log, names, partitions)) as pages:
        async for p, page in pages:
            for letter in page:
                if not _matches(letter, wanted, key):
                    continue
                if ledger.was_purged(p, letter.offset):
                    if not include_purged:
                        continue
                    letter = dataclasses.replace(letter, purged=True)
                found.append(letter)
                if order is DeadLetterOrder.LOG and limit is not None and len(found) >= limit:
                    return found
    return _in_order(found, order)[:limit]


# ------------------------------------------------------------------------ replay


@dataclass(frozen=True, slots=True)
class ReplayedDeadLetter:
    """One dead letter written (or, in a dry run, to be written) into the main topic.

    :param dlq_partition: / :param dlq_offset: where the dead letter is.
    :param key: its key.
    :param partition: the main-topic partition (murmur2 of the key).
    :param offset: the copy's offset in the main topic; None in a dry run.
    """

    dlq_partition: int
    dlq_offset: int
    key: str
    partition: int
    offset: int | None


@dataclass(frozen=True, slots=True)
class SkippedDeadLetter:
    """A matching dead letter that was not replayed, and why (never silently dropped)."""

    dlq_partition: int
    dlq_offset: int
    key: str | None
    reason: str


@dataclass
class ReplayReport:
    """What :func:`replay_dead_letters` did (or, with ``dry_run``, would do).

    :param topic: the main topic written to.
    :param dry_run: true when nothing was written.
    :param replayed: the dead letters replayed, in the order written.
    :param skipped: matching dead letters that cannot be replayed, with why.
    :param already_replayed: matching dead letters left alone because the
        ledger says an earlier run replayed them.
    :param purged: matching dead letters left alone because they were
        purged (:func:`~wakuwaku.admin.purge_dead_letters`; also with ``everything``).
    """

    topic: str
    dry_run: bool
    replayed: list[ReplayedDeadLetter] = field(default_factory=list)
    skipped: list[SkippedDeadLetter] = field(default_factory=list)
    already_replayed: int = 0
    purged: int = 0

    @property
    def matched(self) -> int:
        """Dead letters that matched the filters and were not replayed before."""
        return len(self.replayed) + len(self.skipped)

    @property
    def by_partition(self) -> dict[int, int]:
        """How many were replayed per main-topic partition."""
        counts = Counter(r.partition for r in self.replayed)
        return dict(sorted(counts.items()))


def _replay_copy(letter: DeadLetter, group: str) -> OutgoingRecord:
    headers = {
        name: bytes(value)
        for name, value in letter.headers.items()
        if name in _KEPT_ON_REPLAY or not name.startswith("wk-")
    }
    headers[H_FOR_GROUP] = group.encode()  # only the group whose dead letter it is
    return headers, letter.body


def _why_not_replayable(letter: DeadLetter) -> str | None:
    if letter.key is None:
        return next((p for p in letter.problems if "wk-key" in p), "no usable wk-key")
    if H_SRC in letter.headers and letter.source is None:
        return next((p for p in letter.problems if "wk-src" in p), "wk-src is broken")
    if letter.source is None:
        return "no wk-src header: the original message identity is unknown"
    return None


def _ledger_record(letter: DeadLetter, partition: int, offset: int) -> OutgoingRecord:
    return (
        {
            H_VERSION: WIRE_VERSION,
            H_MARKER: MARKER_REPLAYED,
            H_KEY: (letter.key or "").encode(),
            H_DLQ_OFFSET: str(letter.offset).encode(),
            H_REPLAYED_TO: f"{partition}@{offset}".encode(),
        },
        b"",
    )


@dataclass
class _Ledger:
    """What the ledger topic says about dead letters: per dead-letter partition,
    the offsets replayed and the offsets purged."""

    replayed: dict[int, set[int]] = field(default_factory=dict)
    purged: dict[int, set[int]] = field(default_factory=dict)

    def was_replayed(self, partition: int, offset: int) -> bool:
        return offset in self.replayed.get(partition, ())

    def was_purged(self, partition: int, offset: int) -> bool:
        return offset in self.purged.get(partition, ())


async def _read_ledger(log: Log, ledger: str) -> _Ledger:
    """The ledger topic read whole; a record with ``wk-marker: purged`` notes a
    purge, any other one a replay (ledgers written before purges existed)."""
    partitions = await _partitions_or_none(log, ledger)
    found = _Ledger()
    if partitions is None:
        return found
    starts = await log.start_offsets(ledger)
    ends = await log.end_offsets(ledger)
    for p in range(partitions):
        async for page in _scan(log, ledger, p, starts.get(p, 0), ends.get(p, 0)):
            for record in page:
                purge = record.headers.get(H_MARKER) == MARKER_PURGED
                noted = found.purged if purge else found.replayed
                raw = header_text(record.headers, H_DLQ_OFFSET)
                try:
                    noted.setdefault(p, set()).add(int(raw or ""))
                except ValueError:
                    _warn_ledger(ledger, p, record.offset, sanitize(raw or "<missing>", 40))
    return found


def _warn_ledger(ledger: str, partition: int, offset: int, raw: str) -> None:
    logger.warning(
        "broken replay ledger record ignored",
        extra={"topic": ledger, "partition": partition, "offset": offset, "value": raw},
    )


async def replay_dead_letters(
    log: Log,
    topic: str,
    *,
    group: str,
    reason: ReasonCode | str | None = None,
    key: str | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    everything: bool = False,
    namespace: str = "",
) -> ReplayReport:
    """Write matching dead letters of ``topic`` back into ``topic`` (design §8, §9).

    Each copy carries the dead letter's body and headers unchanged, except
    that of the ``wk-*`` headers only the event's own (``wk-v``, ``wk-type``,
    ``wk-key``, ``wk-props``, ``wk-alg``) and ``wk-src`` are kept: the
    failure's ``wk-reason``, ``wk-error``, ``wk-failed-at`` and the retry
    topic's bookkeeping headers are dropped. ``wk-src`` being kept, the
    consumer handles the copy under its original message identity and an
    inbox skips it when the original was applied after all. The copy goes to
    partition ``murmur2(key) mod N`` of the main topic, after everything
    already there: a replayed event is handled after the key's newer events.

    Purged dead letters (:func:`~wakuwaku.admin.purge_dead_letters`) are never replayed.
    Every replayed dead letter is noted in the ledger topic
    ``wk-replayed.<group>.<topic>`` (``<dead-letter topic>.replayed`` for a
    configured dead-letter topic; created on first use with the dead-letter
    topic's partition count), after its copy was written. A later run skips what the
    ledger holds, unless ``everything`` is true. A crash between the two
    writes replays that dead letter again on the next run, under the same
    identity (at-least-once, like the consumer).

    :param log: the log.
    :param topic: the main topic.
    :param group: the consumer group whose dead letters are replayed; only
        that group handles the copies (design §8).
    :param reason: / :param key: only dead letters with this reason / key.
    :param limit: replay at most this many (matched dead letters, in dead-letter
        partition then offset order; the ledger's are not counted).
    :param dry_run: write nothing (neither copies nor ledger); the report
        says what would be replayed.
    :param everything: ignore the ledger's replays and replay every match
        again (purged dead letters stay purged).
    :param namespace: the consumer's namespace prefix, if it had one.
    :returns: a :class:`ReplayReport`. Matching dead letters without a usable
        ``wk-key`` (they cannot be routed) or without a valid ``wk-src``
        (the identity would be lost) are in :attr:`ReplayReport.skipped`.
    :raises UnknownTopicError: when the main topic does not exist.
    :raises PartitionCountMismatch: when the ledger topic exists with another
        partition count than the dead-letter topic.
    :raises ConfigError: for an unknown reason code or a limit below 1, or
        when ``topic`` is a dead-letter, retry or ledger topic.
    """
    wanted = _check_reason(reason)
    _check_limit(limit)
    names = await resolve_group_topics(log, topic, group, namespace)
    main = names.topic
    main_partitions = (await log.describe_topic(main)).partitions
    dead_letter_topic, ledger = names.dead_letter, names.replay_ledger
    report = ReplayReport(main, dry_run)
    dead_letter_partitions = await _partitions_or_none(log, dead_letter_topic)
    if dead_letter_partitions is None:
        return report
    if not dry_run:
        try:
            await log.create_topic(ledger, dead_letter_partitions, derived_from=main)
        except PartitionCountMismatch as exc:
            raise PartitionCountMismatch(ledger, exc.existing, dead_letter_partitions) from None
    ledger_says = await _read_ledger(log, ledger)
    remaining = limit
    async with aclosing(_dead_letter_pages(log, names, dead_letter_partitions)) as pages:
        async for p, page in pages:
            batch: list[tuple[DeadLetter, str]] = []
            for letter in page:
                if remaining is not None and remaining <= 0:
                    break
                if not _matches(letter, wanted, key):
                    continue
                if _left_alone(report, ledger_says, p, letter.offset, everything):
                    continue
                if remaining is not None:
                    remaining -= 1
                why = _why_not_replayable(letter)
                if why is not None or letter.key is None:
                    why = why or "no usable wk-key"
                    report.skipped.append(SkippedDeadLetter(p, letter.offset, letter.key, why))
                    logger.warning(
                        "dead letter not replayed",
                        extra={
                            "topic": dead_letter_topic,
                            "partition": p,
                            "offset": letter.offset,
                            "key": letter.key,
                            "reason": why,
                        },
                    )
                    continue
                batch.append((letter, letter.key))
            await _replay_page(log, main, main_partitions, ledger, p, batch, report, group)
            if remaining is not None and remaining <= 0:
                break
    return report


def _left_alone(
    report: ReplayReport, ledger: _Ledger, partition: int, offset: int, everything: bool
) -> bool:
    """True (and counted in ``report``) for a dead letter a replay leaves alone:
    a purged one, or one replayed before unless ``everything``."""
    if ledger.was_purged(partition, offset):
        report.purged += 1
        return True
    if not everything and ledger.was_replayed(partition, offset):
        report.already_replayed += 1
        return True
    return False


async def _replay_page(
    log: Log,
    main: str,
    partitions: int,
    ledger: str,
    dlq_partition: int,
    letters: Sequence[tuple[DeadLetter, str]],
    report: ReplayReport,
    group: str,
) -> None:
    """Write one page's copies (one append per main partition, in dead-letter order), then
    their ledger records."""
    targets: dict[int, list[DeadLetter]] = {}
    for letter, key in letters:
        targets.setdefault(log.partition_for(key, partitions), []).append(letter)
    written: dict[int, tuple[int, int | None]] = {}
    for partition, copies in targets.items():
        if report.dry_run:
            offsets: Iterable[int | None] = [None] * len(copies)
        else:
            offsets = await log.append(main, partition, [_replay_copy(x, group) for x in copies])
        for letter, offset in zip(copies, offsets, strict=True):
            written[letter.offset] = (partition, offset)
    entries = [
        ReplayedDeadLetter(dlq_partition, letter.offset, key, *written[letter.offset])
        for letter, key in letters
    ]
    if not report.dry_run and entries:
        await log.append(
            ledger,
            dlq_partition,
            [
                _ledger_record(letter, entry.partition, entry.offset or 0)
                for (letter, _), entry in zip(letters, entries, strict=True)
            ],
        )
    report.replayed.extend(entries)


async def _dead_letter_counts(
    log: Log, names: GroupTopics
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Dead letters per reason, of those the ones the ledger says were replayed,
    and apart from both the purged ones (which the first two leave out)."""
    dead: Counter[str] = Counter()
    replayed: Counter[str] = Counter()
    purged: Counter[str] = Counter()
    dead_letter_partitions = await _partitions_or_none(log, names.dead_letter)
    if dead_letter_partitions is not None:
        ledger = await _read_ledger(log, names.replay_ledger)
        async for p, page in _dead_letter_pages(log, names, dead_letter_partitions):
            for letter in page:
                reason = letter.reason or MISSING_REASON
                if ledger.was_purged(p, letter.offset):
                    purged[reason] += 1
                    continue
                dead[reason] += 1
                if ledger.was_replayed(p, letter.offset):
                    replayed[reason] += 1
    return dict(sorted(dead.items())), dict(sorted(replayed.items())), dict(sorted(purged.items()))
