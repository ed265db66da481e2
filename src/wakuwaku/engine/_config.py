"""Consumer configuration: delivery modes, the retry schedule, classification (design §5-7).

All durations are float seconds.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import random
import re
import reprlib
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from numbers import Real
from types import MappingProxyType
from typing import Any

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError, ErrorClass
from .._records import MAX_GROUP_LENGTH, valid_group_name
from .._topics import (
    CONTROL_PREFIX,
    DEAD_LETTER_PREFIX,
    REPLAY_LEDGER_PREFIX,
    RETRY_PREFIX,
    TOPIC_NAMES,
    split_derived_topic,
)
from ..logs import MAX_READ_RECORDS

logger = logging.getLogger("wakuwaku.consumer")

DEFAULT_RETRY_DELAYS: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0)
"""The default schedule: a Retryable key gets four attempts (design §6)."""

MAX_RETRY_DELAY = 30 * 24 * 3600.0
"""The longest accepted retry delay: 30 days (seconds). A due time must stay
a printable date: with ``retry_delays=[1e12]`` the due time would fall in
the year 33715, which ``wakuwaku status`` cannot print."""


class DeliveryMode(enum.Enum):
    """When the consumer stores a batch's offset (design §5.9, §7)."""

    NO_EVENT_LOSE = "no_event_lose"
    """Store the offset after the batch completed: at-least-once; a crash
    re-delivers what came after the last stored offset (default)."""

    NO_DOUBLE_CONSUME = "no_double_consume"
    """Store the offset before the batch is processed: at-most-once; a crash
    loses the batch in flight but never handles an event twice."""


def default_error_class(exc: BaseException) -> ErrorClass:
    """Classify an exception that is not a ``HandleError``: always Unrecoverable (design §5.8).

    The consumer logs that it classified the exception this way. Ready-made
    classifiers for database drivers are in :mod:`wakuwaku.engine.classifiers`.
    """
    return ErrorClass.UNRECOVERABLE


RESERVED_PREFIXES = (RETRY_PREFIX, DEAD_LETTER_PREFIX, REPLAY_LEDGER_PREFIX, CONTROL_PREFIX)
"""The prefixes of derived names: a configured name may not start with one."""

TOPIC_NAMES_TOPIC = TOPIC_NAMES
"""The topic (``[ns.]wk-topic-names``, one partition) where consumers note the
retry and dead-letter topics they were configured with, so that ``wakuwaku
status``, ``dlq``, ``topic`` and the dashboard find them (see
:mod:`wakuwaku.engine._registry`). Not a main topic."""

REPLAY_LEDGER_SUFFIX = ".replayed"
"""A configured dead-letter topic ``D`` has the replay ledger ``D.replayed``."""

MAX_TOPIC_NAME = 200
"""The longest topic name the engine makes or accepts (the log contract's bound)."""

_PORTABLE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def check_group_name(group: str) -> None:
    """Refuse a consumer group name that cannot be part of a topic name.

    A group names its own retry and dead-letter topics (design §6), so it takes
    the characters every engine allows in a topic name (Kafka's, the
    narrowest), without ``.``, which separates the group from the topic.

    :raises ConfigError: for a name that is empty, longer than 100
        characters, or has a character outside ``A-Z a-z 0-9 _ -``.
    """
    if not valid_group_name(group):
        raise ConfigError(
            f"invalid consumer group name {group!r}: use 1 to {MAX_GROUP_LENGTH} characters "
            "of A-Z, a-z, 0-9, '_' and '-' (it is part of the group's retry and "
            "dead-letter topic names)"
        )


def check_configured_topic_name(name: object, what: str) -> str:
    """Refuse a configured retry or dead-letter topic name that is not valid on every engine.

    The rule is the one derived names follow: the characters every engine
    allows in a topic name (Kafka's ``A-Z a-z 0-9 . _ -``, the narrowest),
    not ``.`` or ``..``, and not a derived name's prefix (``wk-retry.``,
    ``wk-dlq.``, ``wk-replayed.``) or the topic-names topic, which belong to
    the engine. The length is checked with the namespace applied
    (:meth:`ConsumerConfig.group_topics`).

    :param what: how the error names the setting (``retry_topics['orders']``).
    :returns: ``name``.
    :raises ConfigError: for a name that is not a str or breaks a rule above.
    """
    if not isinstance(name, str) or not _PORTABLE_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(
            f"ConsumerConfig.{what} = {name!r}: a topic name of A-Z, a-z, 0-9, '.', '_' "
            "and '-' (valid on every engine), not '.' or '..'"
        )
    if name.startswith(RESERVED_PREFIXES) or name == TOPIC_NAMES_TOPIC:
        raise ConfigError(
            f"ConsumerConfig.{what} = {name!r}: names starting with "
            f"{', '.join(repr(p) for p in RESERVED_PREFIXES)} and {TOPIC_NAMES_TOPIC!r} "
            "belong to the engine (leave the topic out of the setting to get its "
            "derived name)"
        )
    return name


def check_retry_delays(value: Any, name: str = "retry_delays") -> tuple[float, ...]:
    """``value`` as a retry schedule: a non-empty sequence (a list, a tuple,
    a range: the order is the schedule's) of finite seconds ``>= 0`` given
    as numbers (``int``, ``float``, ``Fraction``, ``Decimal``, numpy's),
    each at most :data:`MAX_RETRY_DELAY` (design §6).

    The one check of every schedule: ``ConsumerConfig`` and the CLI's
    ``--retry-delays`` options (which parse their text first). A string
    (``"1"``), a boolean, a set or a generator is refused, not converted:
    ``["5"]`` read from an environment variable without parsing, ``[True]``,
    and a set (whose order is not the order written) were taken before as
    5 s, 1 s and some order.

    :param name: the schedule's name in the error (``retry_delays`` or
        ``log_retry_delays``).
    :raises ConfigError: naming the schedule, the value (shortened) and the
        rule it breaks.
    """
    delays: tuple[float, ...] = ()
    if (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes | bytearray)
        and all(isinstance(d, Real | Decimal) and not isinstance(d, bool) for d in value)
    ):
        try:
            delays = tuple(float(d) + 0.0 for d in value)  # + 0.0: -0.0 is 0.0
        except OverflowError:  # an int too large for a float
            delays = (MAX_RETRY_DELAY + 1.0,)
    if not delays or any(not math.isfinite(d) or d < 0 for d in delays):
        raise ConfigError(
            f"{name} must be a non-empty sequence of finite seconds >= 0, given as "
            f"numbers (not text or booleans), got {reprlib.repr(value)}"
        )
    if max(delays) > MAX_RETRY_DELAY:
        raise ConfigError(
            f"{name} must each be at most {MAX_RETRY_DELAY:.0f} seconds (30 days), "
            f"got {reprlib.repr(max(value))}"
        )
    return delays


def retry_topic_name(topic: str, group: str) -> str:
    """``wk-retry.<group>.<topic>``: where one group's Retryable work of a topic
    waits, unless configured otherwise (design §6).

    The retry topic belongs to one consumer group: two groups reading one
    topic never see each other's retry work. The name is unambiguous because
    a group name has no ``.`` (:func:`check_group_name`) and main topics may
    not start with ``wk-retry.`` or ``wk-dlq.`` (:func:`split_internal_topic`).
    """
    return f"{RETRY_PREFIX}{group}.{topic}"


def dead_letter_topic_name(topic: str, group: str) -> str:
    """``wk-dlq.<group>.<topic>``: where one group's records of a topic that
    cannot be handled go, unless configured otherwise (design §6, §8)."""
    return f"{DEAD_LETTER_PREFIX}{group}.{topic}"


def replay_ledger_topic_name(topic: str, group: str) -> str:
    """``wk-replayed.<group>.<topic>``: which of one group's dead letters of
    ``topic`` were replayed already (``wakuwaku dlq replay``), for the derived
    dead-letter topic (a configured one ``D`` has the ledger ``D.replayed``)."""
    return f"{REPLAY_LEDGER_PREFIX}{group}.{topic}"


def split_internal_topic(name: str) -> tuple[str, str, str] | None:
    """``("retry" | "dlq" | "replayed", group, topic)`` for a derived retry,
    dead-letter or replay-ledger topic name (namespace removed first), None
    for any other name (configured names are found in the topic-names topic:
    :func:`wakuwaku.engine.registered_topics`)."""
    split = split_derived_topic(name)
    if split is None or split[0]:
        return None
    return split[1], split[2], split[3]


@dataclass(frozen=True, slots=True)
class GroupTopics:
    """The topics one consumer group uses for one main topic (design §6), all qualified.

    :param topic: the main topic.
    :param group: the consumer group.
    :param retry: its retry topic (derived or configured).
    :param dead_letter: its dead-letter topic (derived or configured).
    :param replay_ledger: the ledger of ``wakuwaku dlq replay``: follows the
        dead-letter topic, ``[ns.]wk-replayed.<group>.<topic>`` for the derived
        one, ``<dead-letter topic>.replayed`` for a configured one.
    :param configured: true when the retry or the dead-letter topic is configured.
    """

    topic: str
    group: str
    retry: str
    dead_letter: str
    replay_ledger: str
    configured: bool = False

    def roles(self) -> tuple[tuple[str, str], ...]:
        """``(name, role)`` of each topic, the main topic first; a role reads
        ``retry topic of group 'g' for 'orders'``."""
        of = f"of group {self.group!r} for {self.topic!r}"
        return (
            (self.topic, f"main topic {self.topic!r}"),
            (self.retry, f"retry topic {of}"),
            (self.dead_letter, f"dead-letter topic {of}"),
            (self.replay_ledger, f"replay ledger {of}"),
        )


def _default_member() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class ConsumerConfig:
    """Everything a :class:`~wakuwaku.Consumer` needs besides handlers and a log.

    :param topic: the main topic, or several (each (topic, partition) gets its
        own task; ordering domains are per (topic, key), design §2).
    :param group: the consumer group; committed offsets, leases, the retry
        topic and the dead-letter topic are per group. 1 to 100 characters of
        ``A-Z a-z 0-9 _ -`` (:func:`check_group_name`).
    :param namespace: an optional prefix for every topic name (``ns.topic``,
        ``ns.retry_topic``...), so several applications can share one log.
        It applies to configured names too.
    :param retry_topics: the retry topic of a main topic, by main topic as
        given in ``topic`` (``{"orders": "orders-retry-billing"}``); a main
        topic left out gets the derived ``wk-retry.<group>.<topic>``. A
        configured name is the user's promise that the topic belongs to
        this group and this main topic (design §6; checked at start against
        the names other consumers noted, see :meth:`group_topics`).
    :param dead_letter_topics: the same for dead-letter topics (derived:
        ``wk-dlq.<group>.<topic>``); the replay ledger follows the
        dead-letter topic's name (``<name>.replayed``).
    :param partitions: the partitions to consume, or None for all of them.
        None: on a lease log the group's members balance the topic's
        partitions between them (each takes its share, gives back what it
        holds beyond it). Given: this member takes exactly those partitions,
        first come, first served, and takes no part in the balance (as
        Kafka's ``assign()`` beside ``subscribe()``).
    :param retry_delays: the schedule (seconds) of both the in-place Transient
        retries (last delay repeating forever) and the Retryable attempts
        (one attempt per delay, then give up). Default 2, 4, 8, 16. Each
        delay is at most :data:`MAX_RETRY_DELAY` (30 days). Waits run on the
        clock's monotonic time; only due times are stored, as wall time
        rounded up to the millisecond (design §6).
    :param retry_jitter: opt-in jitter, a fraction of each delay in
        ``[0, 1]`` (default 0: none). A wait of ``d`` becomes ``d * (1 +
        retry_jitter * u)`` with ``u`` in ``[0, 1)`` from ``jitter_source``:
        jitter only adds delay, never schedules earlier (design §6), and spreads
        keys that failed together, which would otherwise retry in lockstep. It
        applies to every wait on the schedule (Retryable attempts, Transient
        retries in place, retried log calls); the stored due time includes it,
        so a restart keeps it.
    :param log_retry_delays: the schedule (seconds) of the consumer's own
        log and inbox calls after a failure (poll, offset store, retry and
        dead-letter writes, lease calls), the last delay repeating forever;
        None (default) uses ``retry_delays``, as design §5.6 says. Set it
        when the handlers' schedule is long (minutes or hours between
        Retryable attempts) and a broker outage should not keep a
        partition waiting that long once the broker is back: a failed poll
        then waits this schedule's delay, not the handlers'. Checked like
        ``retry_delays``; ``retry_jitter`` applies to it too.
    :param jitter_source: returns ``u`` in ``[0, 1)`` (default
        :func:`random.random`); pass ``random.Random(seed).random`` for a
        reproducible schedule. A value outside ``[0, 1]`` is clamped.
    :param max_pending_retry: bound on pending work records per retry
        partition; a newly failing key beyond it is dead-lettered with
        ``retry_backlog_full`` (design §6).
    :param delivery_mode: :class:`DeliveryMode` (default ``NO_EVENT_LOSE``).
    :param max_poll_records: the most records one poll of a partition
        returns (default 2 000). A batch is one poll: a larger one costs the
        engine less per record (its per-key and per-batch work is shared by
        more records), and a crash delivers again at most two batches per
        partition (with ``NO_EVENT_LOSE`` the next batch may start while the
        last keys of one finish: two in flight at most). At most 1 000 000
        (:data:`~wakuwaku.logs.MAX_READ_RECORDS`, the most one read of a log
        takes).
    :param max_poll_bytes: a poll asks for fewer records when the
        partition's records are large: as many as fit this many bytes
        (default 1 MiB, Kafka's ``max.partition.fetch.bytes``) at the mean
        size of the previous poll's records, at least one. A partition's
        first poll asks for 100 records, and each poll for at most twice
        what the one before returned (from 100), so the polls grow to
        ``max_poll_records`` while a backlog lasts. A batch holds at most
        this many bytes (at least one record): what a poll brought past it
        is read again by the next poll. So the batches in flight (at most
        two), the records a crash delivers again, hold at most twice this;
        the next batch, read ahead, is in memory too. Bodies are counted
        exactly; headers by those of the poll's first and last record (per
        record, sizing them would cost about a tenth of what the engine
        spends on a record), so a page whose middle records carry much
        larger headers than its ends can go past it.
    :param max_concurrency: how many keys of one partition run at once
        (across its batches in flight).
        Sync handlers run on the consumer's own thread pool of
        ``max_concurrency`` threads per partition it is assigned, so this
        bound, not asyncio's default pool nor another partition's calls,
        limits them; threads start only when used.
    :param classify: maps an exception that is not a ``HandleError`` to an
        :class:`ErrorClass` (design §5.8); default :func:`default_error_class`.
    :param clock: where time comes from (a :class:`~wakuwaku.testing.FakeClock` in tests).
    :param poll_interval: how long an idle partition waits before polling again.
    :param shutdown_timeout: how long running chunks may take to finish after
        a stop was requested, before they are cancelled.
    :param lease_ttl: how long a partition lease lasts without renewal (design §15).
    :param stall_timeout: how long (seconds) a partition with records to read
        may make no progress (no log call answered, no chunk started, no
        deliberate wait) while its log answers before its worker is logged
        at error as stalled and restarted (design §7; default 300, like
        Kafka's ``max.poll.interval.ms``). A handler call that runs longer
        than this counts as a stall. Measured on the process's monotonic
        time, never on ``clock`` (a fake clock's jumps are no stall).
    :param member_id: this process's name in the group (default host-pid-random).
        Unique among the group's running members: a lease log cannot tell
        two processes of one name apart, so both would consume the
        partitions that name holds. Give a restarting process a stable one
        to take its own leases back at once.
    :param error_text_limit: the longest sanitized error text stored in headers.
    :raises ConfigError: for an empty topic, a retry or dead-letter topic
        given as a main topic, a group name outside :func:`check_group_name`,
        a configured retry or dead-letter name that is not valid on every
        engine (:func:`check_configured_topic_name`), names a topic the
        consumer does not read, or equals any other topic of the consumer
        (a main topic, another retry, dead-letter or replay-ledger topic),
        a topic name longer than 200 characters once derived or qualified,
        an empty or negative retry schedule (``retry_delays`` or
        ``log_retry_delays``; each a list or tuple of numbers), a delay above
        :data:`MAX_RETRY_DELAY`, a ``retry_jitter`` outside ``[0, 1]``, a
        ``jitter_source`` that is not callable, or a non-positive bound.
    """

    topic: str | Sequence[str]
    group: str
    namespace: str = ""
    retry_topics: Mapping[str, str] = field(default_factory=dict)
    dead_letter_topics: Mapping[str, str] = field(default_factory=dict)
    partitions: Sequence[int] | None = None
    retry_delays: Sequence[float] = DEFAULT_RETRY_DELAYS
    retry_jitter: float = 0.0
    log_retry_delays: Sequence[float] | None = None
    jitter_source: Callable[[], float] = random.random
    max_pending_retry: int = 100_000
    delivery_mode: DeliveryMode = DeliveryMode.NO_EVENT_LOSE
    max_poll_records: int = 2000
    max_poll_bytes: int = 1 << 20
    max_concurrency: int = 16
    classify: Callable[[BaseException], ErrorClass] = default_error_class
    clock: Clock = field(default=SYSTEM_CLOCK)
    poll_interval: float = 0.05
    shutdown_timeout: float = 30.0
    lease_ttl: float = 15.0
    stall_timeout: float = 300.0
    member_id: str = field(default_factory=_default_member)
    error_text_limit: int = 1024

    def __post_init__(self) -> None:
        self._check_topics()
        self._check_schedule()
        self._check_bounds()
        self._check_policies()

    def _check_topics(self) -> None:
        if not isinstance(self.topic, str) and not isinstance(self.topic, Sequence):
            raise ConfigError(
                f"ConsumerConfig.topic must be a topic name or a sequence of "
                f"them, got {self.topic!r}"
            )
        topics = self.topics
        if not topics or any(not isinstance(t, str) or not t for t in topics):
            raise ConfigError(
                f"ConsumerConfig.topic must name at least one topic, got {self.topic!r}"
            )
        if len(set(topics)) != len(topics):
            raise ConfigError(f"ConsumerConfig.topic names a topic twice: {list(topics)!r}")
        check_group_name(self.group)
        for topic in topics:
            internal = split_internal_topic(self._unqualified(topic))
            if internal is not None:
                kind, group, main = internal
                word = {"retry": "retry", "dlq": "dead-letter"}.get(kind, "replay ledger")
                raise ConfigError(
                    f"topic {topic!r} is the {word} topic of group {group!r} for topic "
                    f"{main!r}: consume {main!r} instead (the consumer reads its own "
                    "retry topic)"
                )
            if self._unqualified(topic) == TOPIC_NAMES_TOPIC:
                raise ConfigError(
                    f"topic {topic!r} is where consumers note their configured topic "
                    "names, not a main topic"
                )
            if self._unqualified(topic).startswith(CONTROL_PREFIX):
                raise ConfigError(
                    f"topic {topic!r} is a consumer group's control topic (operator "
                    "commands), not a main topic"
                )
        self._check_configured_names()
        if self.partitions is not None:
            parts = tuple(self.partitions)
            if not parts or any(
                not isinstance(p, int) or isinstance(p, bool) or p < 0 for p in parts
            ):
                raise ConfigError(f"ConsumerConfig.partitions must be ints >= 0, got {parts!r}")
            object.__setattr__(self, "partitions", parts)

    def _check_configured_names(self) -> None:
        """Check ``retry_topics``/``dead_letter_topics`` and that every topic of
        the consumer has a name of its own, at most 200 characters long."""
        raw = (self.topic,) if isinstance(self.topic, str) else tuple(self.topic)
        for setting in ("retry_topics", "dead_letter_topics"):
            value = getattr(self, setting)
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"ConsumerConfig.{setting} must map main topics to topic names, got {value!r}"
                )
            for main, name in value.items():
                if main not in raw:
                    raise ConfigError(
                        f"ConsumerConfig.{setting} names topic {main!r}, which the "
                        f"consumer does not read (its topics: {list(raw)!r})"
                    )
                check_configured_topic_name(name, f"{setting}[{main!r}]")
            object.__setattr__(self, setting, MappingProxyType(dict(value)))
        # Main topics first, so a clash names the main topic before the other role.
        seen: dict[str, str] = {}
        roles = [self.group_topics(topic).roles() for topic in self.topics]
        for name, role in [r[0] for r in roles] + [x for r in roles for x in r[1:]]:
            if len(name) > MAX_TOPIC_NAME:
                raise ConfigError(
                    f"the {role} would be the {len(name)}-character topic name "
                    f"{name[:40]!r}...: topic names may have at most {MAX_TOPIC_NAME} "
                    "characters (a shorter group, topic or configured name)"
                )
            if name in seen:
                raise ConfigError(
                    f"topic {name!r} would be both the {seen[name]} and the {role}: "
                    "every main, retry, dead-letter and replay-ledger topic of a "
                    "consumer needs a name of its own (ConsumerConfig.retry_topics, "
                    "dead_letter_topics)"
                )
            seen[name] = role

    def _check_schedule(self) -> None:
        object.__setattr__(self, "retry_delays", check_retry_delays(self.retry_delays))
        if self.log_retry_delays is not None:
            object.__setattr__(
                self,
                "log_retry_delays",
                check_retry_delays(self.log_retry_delays, "log_retry_delays"),
            )
        jitter = self.retry_jitter
        if (
            not isinstance(jitter, int | float)
            or isinstance(jitter, bool)
            or not 0.0 <= jitter <= 1.0
        ):
            raise ConfigError(
                f"ConsumerConfig.retry_jitter must be a fraction in [0, 1], got {jitter!r}"
            )
        if not callable(self.jitter_source):
            raise ConfigError(
                f"ConsumerConfig.jitter_source must be callable, got {self.jitter_source!r}"
            )

    def _check_bounds(self) -> None:
        bounds = (
            "max_pending_retry",
            "max_poll_records",
            "max_poll_bytes",
            "max_concurrency",
            "error_text_limit",
        )
        for name in bounds:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ConsumerConfig.{name} must be an int >= 1, got {value!r}")
        if self.max_poll_records > MAX_READ_RECORDS:
            raise ConfigError(
                f"ConsumerConfig.max_poll_records must be at most {MAX_READ_RECORDS} "
                f"(the most one read of a log takes), got {self.max_poll_records!r}"
            )
        for name in ("poll_interval", "shutdown_timeout", "lease_ttl", "stall_timeout"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigError(
                    f"ConsumerConfig.{name} must be finite seconds > 0, got {value!r}"
                )

    def _check_policies(self) -> None:
        if not isinstance(self.delivery_mode, DeliveryMode):
            raise ConfigError(
                f"ConsumerConfig.delivery_mode must be a DeliveryMode, got {self.delivery_mode!r}"
            )
        if not callable(self.classify):
            raise ConfigError(f"ConsumerConfig.classify must be callable, got {self.classify!r}")
        if not isinstance(self.member_id, str) or not self.member_id:
            raise ConfigError("ConsumerConfig.member_id must be a non-empty string")

    @property
    def topics(self) -> tuple[str, ...]:
        """The main topics, with the namespace prefix applied."""
        raw = (self.topic,) if isinstance(self.topic, str) else tuple(self.topic)
        return tuple(self.qualify(t) for t in raw)

    def qualify(self, name: str) -> str:
        """``name`` with the namespace prefix (``ns.name``), or unchanged without one."""
        return f"{self.namespace}.{name}" if self.namespace else name

    def retry_topic(self, topic: str) -> str:
        """This group's retry topic of a (qualified) main topic: the configured
        one (``retry_topics``), else ``[ns.]wk-retry.<group>.<topic>``
        (:func:`retry_topic_name`)."""
        bare = self._unqualified(topic)
        configured = self.retry_topics.get(bare)
        return self.qualify(configured or retry_topic_name(bare, self.group))

    def dead_letter_topic(self, topic: str) -> str:
        """This group's dead-letter topic of a (qualified) main topic: the
        configured one (``dead_letter_topics``), else
        ``[ns.]wk-dlq.<group>.<topic>`` (:func:`dead_letter_topic_name`)."""
        bare = self._unqualified(topic)
        configured = self.dead_letter_topics.get(bare)
        return self.qualify(configured or dead_letter_topic_name(bare, self.group))

    def replay_ledger_topic(self, topic: str) -> str:
        """The replay ledger of this group's dead letters of a (qualified) main
        topic: ``<dead-letter topic>.replayed`` for a configured dead-letter
        topic, else ``[ns.]wk-replayed.<group>.<topic>``
        (:func:`replay_ledger_topic_name`)."""
        bare = self._unqualified(topic)
        configured = self.dead_letter_topics.get(bare)
        if configured:
            return self.qualify(configured + REPLAY_LEDGER_SUFFIX)
        return self.qualify(replay_ledger_topic_name(bare, self.group))

    def group_topics(self, topic: str) -> GroupTopics:
        """Every topic this group uses for a (qualified) main topic (design §6)."""
        bare = self._unqualified(topic)
        return GroupTopics(
            topic=self.qualify(bare),
            group=self.group,
            retry=self.retry_topic(topic),
            dead_letter=self.dead_letter_topic(topic),
            replay_ledger=self.replay_ledger_topic(topic),
            configured=bare in self.retry_topics or bare in self.dead_letter_topics,
        )

    def _unqualified(self, topic: str) -> str:
        prefix = f"{self.namespace}." if self.namespace else ""
        return topic[len(prefix) :] if prefix and topic.startswith(prefix) else topic

    def delay(self, failures: int) -> float:
        """The wait (seconds) after the ``failures``-th failure in a row (1-based);
        the last delay repeats (design §5.6, §6)."""
        delays = tuple(self.retry_delays)
        return delays[min(max(failures, 1), len(delays)) - 1]

    def retry_delay(self, failures: int) -> float:
        """The wait (seconds) to schedule after the ``failures``-th failure in a
        row: :meth:`delay` plus the jitter, ``delay * retry_jitter * u``, which
        only adds (design §6). Without jitter, :meth:`delay`."""
        return self._jittered(self.delay(failures))

    def log_retry_delay(self, failures: int) -> float:
        """The wait (seconds) before the consumer's own log or inbox call is
        tried again after its ``failures``-th failure in a row: the
        ``log_retry_delays`` schedule (``retry_delays`` when None), last
        delay repeating, plus the jitter."""
        delays = tuple(self.log_retry_delays or self.retry_delays)
        return self._jittered(delays[min(max(failures, 1), len(delays)) - 1])

    def _jittered(self, delay: float) -> float:
        if not self.retry_jitter or not delay:
            return delay
        u = min(max(float(self.jitter_source()), 0.0), 1.0)
        return delay * (1.0 + self.retry_jitter * u)
