"""What every part of the Kafka log shares: its settings, its calls to the cluster and their errors.

Owns the librdkafka settings every client of one log is made from, the
topic names under the log's prefix, the blocking client calls run in
threads (bounded by ``timeout``) with their errors read once
(:class:`~wakuwaku.LogUnavailableError` for a condition that passes,
:class:`~wakuwaku.LogError` for a refusal), the admin client (renewed when
it stops answering), and the topics: created, listed and deleted, and what
is known of them (partition counts, ``max.message.bytes``).

It also holds the librdkafka error codes the other modules classify by
(:data:`FENCED_CODES`, :data:`UNKNOWN_TOPIC_CODES`): every reading of a
``KafkaError`` lives here, so the modules cannot drift apart on what, say,
"fenced" means.

May call: confluent-kafka's admin client, the log contract's checks
(:mod:`.._base`). Called by every other module of the Kafka log; calls none
of them.
"""

from __future__ import annotations

import asyncio
import operator
import re
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any, TypeVar

import confluent_kafka.admin as _admin_module
from confluent_kafka import KafkaError, KafkaException

from ..._clock import BLOCKING_CALLS
from ..._errors import (
    ConfigError,
    LogError,
    LogUnavailableError,
    PartitionCountMismatch,
    UnknownTopicError,
)
from ..._records import H_KEY
from .._base import OutgoingRecord, check_topic_name

__all__ = (
    "ADMIN_RENEW",
    "FENCED_CODES",
    "LEGAL_TOPIC",
    "UNKNOWN_TOPIC_CODES",
    "Cluster",
    "OffsetSpec",
    "check_partitions",
    "code",
    "unanswered",
)

_T = TypeVar("_T")

_kadmin: Any = _admin_module  # its stubs are partial: used untyped
AdminClient = _kadmin.AdminClient
ConfigResource = _kadmin.ConfigResource
NewTopic = _kadmin.NewTopic
OffsetSpec = _kadmin.OffsetSpec
ResourceType = _kadmin.ResourceType

LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
"""The characters of a Kafka topic name (and so of a prefix)."""
ADMIN_RENEW = 2.0
"""Seconds without an answer after which a client that kept failing is made anew."""
_BATCH_OVERHEAD = 512  # record batch and record framing, counted against the limit
_values = operator.methodcaller("values")

FENCED_CODES = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError._STATE,
    }
)
"""Codes of a write refused because the group or the transaction coordinator moved on."""
UNKNOWN_TOPIC_CODES = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
"""Codes of a topic (or partition) that does not exist."""

_UNAVAILABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.NOT_CONTROLLER,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
    }
)
"""Codes of conditions that pass once the cluster has settled: no broker
reached, a coordinator or leader not there yet or moving (a fresh broker
creates ``__consumer_offsets`` at the first group call; a broker that was
frozen or restarted reloads it), an offset in a transaction not ended."""


def code(exc: BaseException) -> int | None:
    """The librdkafka error code ``exc`` carries, or None for another exception."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return int(exc.args[0].code())
    return None


def _unavailable(exc: BaseException) -> bool:
    """True when ``exc`` is a condition that passes (asked again, then
    :class:`LogUnavailableError`), not a refusal."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(err, KafkaError):
        return False
    if err.retriable() or err.code() in _UNAVAILABLE_CODES:
        return True
    # The admin ListOffsets call when no partition has a leader (a broker
    # back from a freeze or a restart, before its partitions are led again).
    return err.code() == KafkaError._NOENT and "no leader" in err.str().lower()


def unanswered(err: object) -> bool:
    """True for a transactional call's error that leaves its outcome open: a
    retriable one (a timeout, a broker gone) that neither is fatal nor asks
    for an abort; librdkafka resumes the call when it is made again."""
    return (
        isinstance(err, KafkaError)
        and err.retriable()
        and not err.fatal()
        and not err.txn_requires_abort()
    )


def check_partitions(answer: Any) -> Any:
    """Raise the first per-partition error of a group call's answer (in a
    thread); a commit or an offset fetch carries one error per partition
    besides its own, and an answer with one is not what was asked.

    :raises KafkaException: with that partition's error.
    """
    for tp in getattr(answer, "topic_partitions", answer) or ():
        if tp.error is not None:
            raise KafkaException(tp.error)
    return answer


class Cluster:
    """The settings, calls and topic knowledge one :class:`KafkaLog` shares.

    :param hosts: ``host:port`` pairs (at least one).
    :param prefix: begins every topic and group name.
    :param timeout: the bound of every call to the cluster (seconds).
    :param security: librdkafka connection settings (never printed).
    :param url: the log's URL, without credentials, for messages.
    """

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        prefix: str,
        timeout: float,
        security: Mapping[str, str] | None,
        url: str,
    ) -> None:
        self.prefix = prefix
        self.timeout = timeout
        self.url = url
        self.closed = False
        ms = int(timeout * 1000)
        self.common: dict[str, Any] = {
            "bootstrap.servers": ",".join(hosts),
            # librdkafka takes 1 s at the least here; the call bound still holds.
            "socket.connection.setup.timeout.ms": max(ms, 1000),
            "socket.timeout.ms": max(ms, 10),
            "reconnect.backoff.max.ms": 1000,
            # librdkafka's own connection errors (level 3) are not printed: an
            # unreachable broker is one LogUnavailableError of ours, not a
            # hundred raw lines on stderr while the client retries.
            "log_level": 2,
            **dict(security or {}),
        }
        """The librdkafka settings every client of the log starts from."""
        self._admin: Any = None
        self._admin_born = self._admin_answered = 0.0
        self._topics: dict[str, int] = {}
        self._limits: dict[str, int] = {}

    # -- names -------------------------------------------------------------

    def name(self, name: str) -> str:
        """The Kafka name of a topic or group: ``name`` under the prefix."""
        return self.prefix + name

    def plain(self, name: str) -> str:
        """The log's name of a Kafka topic or group: the prefix taken off."""
        return name[len(self.prefix) :] if self.prefix and name.startswith(self.prefix) else name

    def check_name(self, topic: str) -> None:
        """:raises ConfigError: when ``topic`` (with the prefix) is no legal Kafka name."""
        check_topic_name(topic)
        full = self.name(topic)
        if not LEGAL_TOPIC.fullmatch(full) or len(full) > 249 or full in (".", ".."):
            raise ConfigError(
                f"invalid Kafka topic name {full!r}: [A-Za-z0-9._-] only, at most 249 characters"
            )

    # -- calls ---------------------------------------------------------------

    async def run(self, what: str, fn: Callable[[], _T]) -> _T:
        """Run a blocking client call in a thread, translating its errors.

        :raises LogError: when the log is closed, or for a refusal.
        :raises LogUnavailableError: for a condition that passes (no answer
            within ``timeout`` seconds included).
        """
        if self.closed:
            raise LogError(f"the Kafka log {self.url} is closed")
        try:
            with BLOCKING_CALLS.track():
                return await asyncio.to_thread(fn)
        except KafkaException as exc:
            raise self.error(what, exc) from exc
        except TimeoutError as exc:
            raise LogUnavailableError(
                f"Kafka log {self.url} is unavailable ({what}): no answer within {self.timeout} s"
            ) from exc

    async def idempotent(
        self, what: str, fn: Callable[[], _T], deadline: float | None = None
    ) -> _T:
        """:meth:`run` for a call that only reads or sets a value: a
        transient error (a leader or coordinator moving or not there yet, a
        partition just created) is asked again until ``timeout`` has passed
        (or ``deadline``, on the monotonic clock), then raised as
        :class:`LogUnavailableError`."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        while True:
            try:
                answer = await self.run(what, fn)
            except LogUnavailableError:
                self.admin_unavailable()
                if time.monotonic() > deadline:
                    raise
                await BLOCKING_CALLS.pause(0.1)
            else:
                self.admin_answered()
                return answer

    def error(self, what: str, exc: BaseException) -> LogError:
        """:class:`LogUnavailableError` for a condition that passes (see
        :func:`_unavailable`), :class:`LogError` for any other."""
        err = exc.args[0] if exc.args else exc
        text = err.str() if isinstance(err, KafkaError) else str(err)
        if _unavailable(exc):
            return LogUnavailableError(f"Kafka log {self.url} is unavailable ({what}): {text}")
        return LogError(f"Kafka log {self.url} failed ({what}): {text}")

    def future(self, what: str, future: Any) -> Any:
        """Wait for an admin future within the timeout (in a thread).

        :raises LogUnavailableError: when it has no answer in time.
        :raises KafkaException: for the cluster's refusal.
        """
        try:
            return future.result(timeout=self.timeout)
        except TimeoutError as exc:
            raise LogUnavailableError(
                f"Kafka log {self.url} is unavailable ({what}): no answer within {self.timeout} s"
            ) from exc
        except Exception as exc:
            if isinstance(exc, KafkaException):
                raise
            if "timed out" in str(exc).lower():
                raise LogUnavailableError(
                    f"Kafka log {self.url} is unavailable ({what}): {exc}"
                ) from exc
            raise

    # -- the admin client ------------------------------------------------------

    def admin(self) -> Any:
        """The admin client (made at its first use, in a thread)."""
        if self._admin is None:
            self._admin = AdminClient(dict(self.common))
            self._admin_born = time.monotonic()
        return self._admin

    def admin_unavailable(self) -> None:
        """An admin call found the cluster unavailable. After
        :data:`ADMIN_RENEW` seconds without an answer, the next call gets a
        new admin client: after a broker froze or restarted, librdkafka's
        handle kept its stale leader epochs (``FENCED_LEADER_EPOCH``, "No
        leaders found") and its coordinator for a minute and more, while a
        new one is answered at once."""
        now = time.monotonic()
        if now - max(self._admin_answered, self._admin_born) > ADMIN_RENEW:
            self._admin, self._admin_born = None, now

    def admin_answered(self) -> None:
        """An admin call was answered: the client is kept."""
        self._admin_answered = time.monotonic()

    # -- topics ------------------------------------------------------------------

    async def partitions_or_none(self, topic: str, *, fresh: bool = False) -> int | None:
        """The topic's partition count (cached unless ``fresh``), None when it does not exist."""
        if not fresh and topic in self._topics:
            return self._topics[topic]
        name = self.name(topic)

        def describe() -> Any:
            meta = self.admin().list_topics(topic=name, timeout=self.timeout)
            found = meta.topics.get(name)
            error = found.error if found is not None else None
            # A topic without a leader yet (created just now, or a broker back
            # from a freeze or a restart) is there: asked again.
            if (
                error is not None
                and error.code() not in UNKNOWN_TOPIC_CODES
                and _unavailable(KafkaException(error))
            ):
                raise KafkaException(error)
            return found

        found = await self.idempotent("describe topic", describe)
        if found is None or found.error is not None or not found.partitions:
            self._topics.pop(topic, None)
            return None
        self._topics[topic] = len(found.partitions)
        return len(found.partitions)

    async def partitions(self, topic: str, *, fresh: bool = False) -> int:
        """:meth:`partitions_or_none`. :raises UnknownTopicError: when it does not exist."""
        count = await self.partitions_or_none(topic, fresh=fresh)
        if count is None:
            raise UnknownTopicError(topic)
        return count

    def forget(self, topic: str, *, limit: bool = False) -> None:
        """The topic is gone (or may be): its count is asked again, with
        ``limit`` its ``max.message.bytes`` too."""
        self._topics.pop(topic, None)
        if limit:
            self._limits.pop(topic, None)

    async def topics(self) -> list[tuple[str, int]]:
        """Every topic under the prefix (Kafka's internal ``__*`` topics left
        out) and its partition count, by name."""
        meta = await self.run("list topics", lambda: self.admin().list_topics(timeout=self.timeout))
        out = [
            (self.plain(name), len(t.partitions))
            for name, t in meta.topics.items()
            if name.startswith(self.prefix) and not name.startswith("__") and t.error is None
        ]
        return sorted(out)

    async def create_topic(
        self, topic: str, partitions: int, max_message_bytes: int, *, forever: bool = False
    ) -> None:
        """Create ``topic`` (the broker's replication factor), or find it with
        that many partitions; return once every partition has a leader.
        ``forever``: no retention by time or size.

        A topic of that name still being deleted is waited for (bounded by
        ``timeout``) while the broker finishes the deletion; it is never taken
        for an existing topic.

        :raises PartitionCountMismatch: when the topic exists with another count.
        :raises LogUnavailableError: when a topic of that name is still being
            deleted after ``timeout`` seconds, or the cluster does not answer.
        """
        config = {"max.message.bytes": str(max_message_bytes)}
        if forever:  # no time or size retention by the broker
            config |= {"retention.ms": "-1", "retention.bytes": "-1"}
        new = NewTopic(
            self.name(topic), num_partitions=partitions, replication_factor=-1, config=config
        )
        deadline = time.monotonic() + self.timeout

        def create() -> None:
            admin = self.admin()
            self.future("create topic", admin.create_topics([new])[self.name(topic)])

        while True:
            try:
                await self.run("create topic", create)
                break
            except LogError as exc:
                cause = exc.__cause__
                found = code(cause) if cause is not None else None
                if found == KafkaError.TOPIC_ALREADY_EXISTS:
                    existing = await self.partitions_or_none(topic, fresh=True)
                    if existing is None:  # being deleted: wait for it to go
                        if time.monotonic() > deadline:
                            raise LogUnavailableError(
                                f"Kafka log {self.url}: topic {topic!r} cannot be created: "
                                f"the broker is still deleting a topic of that name after "
                                f"{self.timeout} s"
                            ) from exc
                        await BLOCKING_CALLS.pause(0.1)
                        continue
                    if existing != partitions:
                        raise PartitionCountMismatch(topic, existing, partitions) from None
                    break
                raise
        await self._wait_for_leaders(topic)
        self._topics[topic] = partitions

    async def _wait_for_leaders(self, topic: str) -> None:
        """Wait (bounded by ``timeout``) until every partition of a new topic has a leader."""
        name = self.name(topic)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            meta = await self.run(
                "describe topic",
                lambda: self.admin().list_topics(topic=name, timeout=self.timeout),
            )
            found = meta.topics.get(name)
            if (
                found is not None
                and found.error is None
                and found.partitions
                and all(p.leader >= 0 and p.error is None for p in found.partitions.values())
            ):
                return
            await BLOCKING_CALLS.pause(0.05)

    async def delete_topic(self, topic: str) -> bool:
        """Ask the broker to delete ``topic`` and forget what is known of it
        (the broker deletes it later: :meth:`wait_deleted`).

        :returns: False when the broker has no such topic.
        :raises LogError: / :raises LogUnavailableError: as :meth:`run`.
        """
        name = self.name(topic)
        try:
            await self.run(
                "delete topic",
                lambda: self.future("delete topic", self.admin().delete_topics([name])[name]),
            )
        except LogError as exc:
            if exc.__cause__ is not None and code(exc.__cause__) in UNKNOWN_TOPIC_CODES:
                return False
            raise
        self.forget(topic, limit=True)
        return True

    async def wait_deleted(self, topic: str) -> None:
        """Return once the broker no longer lists ``topic``: deletion is
        asynchronous on the broker, and a create right after must make a new
        topic, not find the old one.

        :raises LogUnavailableError: when it is still listed after ``timeout`` seconds.
        """
        deadline = time.monotonic() + self.timeout
        while await self.partitions_or_none(topic, fresh=True) is not None:
            if time.monotonic() > deadline:
                raise LogUnavailableError(
                    f"Kafka log {self.url}: topic {topic!r} was deleted but the broker still "
                    f"lists it after {self.timeout} s"
                )
            await BLOCKING_CALLS.pause(0.05)

    async def max_message_bytes(self, topic: str) -> int:
        """The topic's ``max.message.bytes`` (read once, then cached)."""
        found = self._limits.get(topic)
        if found is not None:
            return found
        resource = ConfigResource(ResourceType.TOPIC, self.name(topic))

        def describe() -> Any:
            return self.future(
                "describe topic config",
                self.admin().describe_configs([resource])[resource],
            )

        configs = await self.run("describe topic config", describe)
        entry = configs.get("max.message.bytes")
        limit = int(entry.value) if entry is not None else 1_048_588
        self._limits[topic] = limit
        return limit

    async def check_size(
        self, topic: str, partition: int, records: Sequence[OutgoingRecord]
    ) -> None:
        """:raises ConfigError: for a record over the topic's ``max.message.bytes``
        (less framing), or with a NUL in a header name."""
        limit = await self.max_message_bytes(topic)
        # The common case in one pass in C: no NUL in any name and the whole
        # append within the limit, so each of its records is. Otherwise the
        # records one by one, to name the first one refused.
        heads = [headers for headers, _ in records]
        bodies = [body for _, body in records]
        names = "".join(chain.from_iterable(heads))
        total = (
            len(names)
            + sum(map(len, bodies))
            + sum(map(len, chain.from_iterable(map(_values, heads))))
        )
        if "\x00" not in names and total + _BATCH_OVERHEAD <= limit:
            return
        for headers, body in records:
            names = "".join(headers)  # one pass in C: the names' NULs and length
            if "\x00" in names:
                bad = next(k for k in headers if "\x00" in k)
                raise ConfigError(
                    f"a record for {topic}/{partition} has the header name {bad!r}: Kafka "
                    "header names (librdkafka's C strings) cannot hold NUL"
                )
            size = len(body) + len(names) + sum(map(len, headers.values()))
            if size + _BATCH_OVERHEAD > limit:
                key = headers.get(H_KEY, b"")
                raise ConfigError(
                    f"a record of key {bytes(key)!r} for {topic}/{partition} is {size} bytes "
                    f"(body and headers); topic {topic!r} takes at most {limit - _BATCH_OVERHEAD} "
                    f"(its max.message.bytes is {limit})"
                )
