"""The :class:`KafkaLog`: the log contract on Apache Kafka (see the package's docstring).

confluent-kafka (librdkafka) is imported here only (extra ``kafka``); its
blocking calls run in threads, each bounded by the log's ``timeout``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote

try:
    import confluent_kafka.admin as _admin_module
    from confluent_kafka import (
        Consumer,
        ConsumerGroupTopicPartitions,
        IsolationLevel,
        KafkaError,
        KafkaException,
        Producer,
        TopicPartition,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Kafka log needs confluent-kafka: pip install 'wakuwaku[kafka]'") from exc

from ..._clock import BLOCKING_CALLS
from ..._errors import (
    ConfigError,
    FencedError,
    LogError,
    LogUnavailableError,
    PartitionCountMismatch,
    UnknownTopicError,
)
from ..._records import H_KEY, Record
from ..._topics import split_derived_topic
from .._base import (
    AppendTokens,
    BatchWrite,
    Lease,
    Log,
    OutgoingRecord,
    Page,
    TopicInfo,
    check_commit,
    check_partition,
    check_record,
    check_token,
    check_topic_name,
)
from .._url import check_servers, check_timeout, option_bool, option_timeout, parse_log_url
from ._member import Member
from ._ownership import OwnershipState

_kadmin: Any = _admin_module  # its stubs are partial: used untyped
AdminClient = _kadmin.AdminClient
ConfigResource = _kadmin.ConfigResource
NewTopic = _kadmin.NewTopic
OffsetSpec = _kadmin.OffsetSpec
ResourceType = _kadmin.ResourceType

__all__ = (
    "DEFAULT_MAX_MESSAGE_BYTES",
    "HEADER_ROOM",
    "PASSWORD_ENV",
    "USERNAME_ENV",
    "KafkaLog",
    "derived_main_topic",
)

logger = logging.getLogger("wakuwaku.logs.kafka")

_T = TypeVar("_T")

USERNAME_ENV = "WAKUWAKU_KAFKA_USERNAME"
"""The SASL user name used when the URL names none."""
PASSWORD_ENV = "WAKUWAKU_KAFKA_PASSWORD"
"""The SASL password used when the URL names none (never printed)."""

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""``max.message.bytes`` of the topics this log creates (Kafka's own default is 1 MiB)."""
HEADER_ROOM = 65_536
"""Extra ``max.message.bytes`` of the engine's retry and dead-letter topics:
room for the headers the engine adds, so a record at its main topic's limit
can still be retried and dead-lettered."""
_BATCH_OVERHEAD = 512  # record batch and record framing, counted against the limit
_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_NO_OFFSET = -1001
_MARKER_WAIT = 0.5
_ADMIN_RENEW = 2.0
_FENCED_CODES = frozenset(
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
_UNKNOWN_TOPIC_CODES = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)


def derived_main_topic(topic: str) -> str | None:
    """The main topic of an engine-made topic (``[ns.]wk-retry.<group>.<main>``,
    ``wk-dlq.``, ``wk-replayed.``), or None for any other topic."""
    split = split_derived_topic(topic)
    return None if split is None else split[0] + split[3]


@dataclass(frozen=True)
class _Unsettled:
    """A transactional store whose commit got no answer (see ``KafkaLog._settle``).

    ``wedged`` is set when the commit call itself has not returned (its
    thread is still inside librdkafka): its outcome is known once it does.
    """

    batches: list[tuple[str, int, Sequence[OutgoingRecord]]]
    commits: list[tuple[str, int, int]]
    results: list[list[int]]  # filled in by delivery reports, -1 until delivered
    wedged: concurrent.futures.Future[list[list[int]]] | None = None


@dataclass
class _Progress:
    """How far one transaction got (written by its thread, read by the store
    that gave up waiting for it)."""

    producer: Any = None
    committing: bool = False
    results: list[list[int]] = field(default_factory=list)


_TXN_CALLS = 4
"""Blocking calls in one transactional store, each bounded by the log's
timeout (``init_transactions``, the settling ``commit_transaction``,
``send_offsets_to_transaction``, ``commit_transaction``): a store that has
not returned after that many timeouts (plus a second) is wedged."""


def _in_daemon_thread(name: str, fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
    """Run ``fn`` on a new daemon thread; its outcome lands in the future.

    For a client call that may outlive its own timeout: a wedged call on the
    event loop's default executor kept the executor's shutdown, and so the
    process's exit, waiting for ever; a daemon thread is left behind instead.
    """
    future: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter, whatever it is
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _unanswered(err: object) -> bool:
    """True for a transactional call's error that leaves its outcome open: a
    retriable one (a timeout, a broker gone) that neither is fatal nor asks
    for an abort; librdkafka resumes the call when it is made again."""
    return (
        isinstance(err, KafkaError)
        and err.retriable()
        and not err.fatal()
        and not err.txn_requires_abort()
    )


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return int(exc.args[0].code())
    return None


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


def _check_partitions(answer: Any) -> Any:
    """Raise the first per-partition error of a group call's answer (in a
    thread); a commit or an offset fetch carries one error per partition
    besides its own, and an answer with one is not what was asked."""
    for tp in getattr(answer, "topic_partitions", answer) or ():
        if tp.error is not None:
            raise KafkaException(tp.error)
    return answer


@dataclass
class _Reader:
    consumer: Any
    next_offset: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class KafkaLog(Log):
    """A :class:`~wakuwaku.logs.Log` on Apache Kafka (URL ``kafka://host:port``; design §1, §15).

    :param bootstrap: ``host:port`` pairs, comma-separated or as a list.
    :param prefix: begins every topic and group name (default none), so
        several logs share one cluster; ``[A-Za-z0-9._-]``.
    :param timeout: the bound of every call to the cluster (seconds,
        default 10); past it the call raises
        :class:`~wakuwaku.LogUnavailableError`.
    :param transactions: write a batch's retry and dead-letter records and
        its offsets in one Kafka transaction fenced by the group generation
        (KIP-447; default True). False: appends then commits, each fenced
        by the member's ownership and generation, not atomic.
    :param security: librdkafka settings for the connection
        (``security.protocol``, ``sasl.mechanism``, ``sasl.username``,
        ``sasl.password``, ``ssl.ca.location``); never printed.
    :param session_timeout: the group session timeout (seconds, >= 6: the
        broker's ``group.min.session.timeout.ms``): how long a silent member
        keeps its partitions.
    :param revoke_timeout: how long a revoked partition waits for its
        worker to finish running chunks and store them (seconds).
    :param max_message_bytes: ``max.message.bytes`` of the topics this log
        creates (the engine's retry and dead-letter topics get
        :data:`HEADER_ROOM` more).

    Ownership is the consumer group's (cooperative-sticky assignment):
    :meth:`acquire_partition` joins the group as ``member`` (once per
    member, subscribing to the topic) and returns a lease while the
    coordinator assigns that partition to it; the ``ttl`` is not used (a
    member keeps its partitions while it heartbeats, ``session_timeout``).
    Every fenced write checks that the member still owns the partition in
    the generation of the lease, and its commits go through the member, so
    the broker refuses them after the group moved on.

    :raises ConfigError: for a bad prefix, timeout or host list.
    """

    atomic_store = True
    """With ``transactions`` (the default) :meth:`store` is one Kafka transaction."""

    def __init__(
        self,
        bootstrap: Sequence[str] | str = "127.0.0.1:9092",
        *,
        prefix: str = "",
        timeout: float = 10.0,
        transactions: bool = True,
        security: Mapping[str, str] | None = None,
        session_timeout: float = 10.0,
        revoke_timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        hosts = [bootstrap] if isinstance(bootstrap, str) else list(bootstrap)
        hosts = [h.strip() for part in hosts for h in part.split(",") if h.strip()]
        if not hosts:
            raise ConfigError("a Kafka log needs at least one host:port")
        if prefix and not _LEGAL_TOPIC.fullmatch(prefix):
            raise ConfigError(f"a Kafka log prefix takes [A-Za-z0-9._-] only, got {prefix!r}")
        timeout = check_timeout(timeout)
        if session_timeout < 6:
            raise ConfigError(f"session_timeout must be >= 6 seconds, got {session_timeout!r}")
        self.hosts = hosts
        self.prefix = prefix
        self.timeout = float(timeout)
        self.transactions = transactions
        self.atomic_store = transactions
        self.session_timeout = float(session_timeout)
        self.revoke_timeout = float(revoke_timeout)
        self.max_message_bytes = int(max_message_bytes)
        query = [f"prefix={prefix}"] if prefix else []
        if not transactions:
            query.append("transactions=0")
        self.url = f"kafka://{','.join(hosts)}" + ("?" + "&".join(query) if query else "")
        ms = int(self.timeout * 1000)
        self._common: dict[str, Any] = {
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
        self._admin: Any = None
        self._admin_born = self._admin_answered = 0.0
        self._producer: Any = None
        self._producer_thread: threading.Thread | None = None
        self._members: dict[tuple[str, str], Member] = {}
        self._readers: dict[tuple[str, int], _Reader] = {}
        self._offsets: dict[str, Any] = {}  # group -> its offsets consumer
        self._offsets_born: dict[str, float] = {}
        self._offsets_answered_at: dict[str, float] = {}
        self._retired: list[Any] = []  # offsets consumers replaced, closed at close()
        self._topics: dict[str, int] = {}
        self._tokens = AppendTokens()
        self._limits: dict[str, int] = {}
        self._closed = False
        self._stop = threading.Event()

    def __repr__(self) -> str:
        return f"KafkaLog({self.url!r})"

    # -- names -------------------------------------------------------------

    def _name(self, name: str) -> str:
        return self.prefix + name

    def _plain(self, name: str) -> str:
        return name[len(self.prefix) :] if self.prefix and name.startswith(self.prefix) else name

    # -- plumbing -----------------------------------------------------------

    async def _run(self, what: str, fn: Callable[[], _T]) -> _T:
        """Run a blocking client call in a thread, translating its errors."""
        if self._closed:
            raise LogError(f"the Kafka log {self.url} is closed")
        try:
            with BLOCKING_CALLS.track():
                return await asyncio.to_thread(fn)
        except KafkaException as exc:
            raise self._error(what, exc) from exc
        except TimeoutError as exc:
            raise LogUnavailableError(
                f"Kafka log {self.url} is unavailable ({what}): no answer within {self.timeout} s"
            ) from exc

    async def _idempotent(
        self, what: str, fn: Callable[[], _T], deadline: float | None = None
    ) -> _T:
        """:meth:`_run` for a call that only reads or sets a value: a
        transient error (a leader or coordinator moving or not there yet, a
        partition just created) is asked again until ``timeout`` has passed
        (or ``deadline``, on the monotonic clock), then raised as
        :class:`LogUnavailableError`."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        while True:
            try:
                answer = await self._run(what, fn)
            except LogUnavailableError:
                self._admin_unavailable()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
            else:
                self._admin_answered = time.monotonic()
                return answer

    def _admin_unavailable(self) -> None:
        """An admin call found the cluster unavailable. After
        :data:`_ADMIN_RENEW` seconds without an answer, the next call gets a
        new admin client: after a broker froze or restarted, librdkafka's
        handle kept its stale leader epochs (``FENCED_LEADER_EPOCH``, "No
        leaders found") and its coordinator for a minute and more, while a
        new one is answered at once."""
        now = time.monotonic()
        if now - max(self._admin_answered, self._admin_born) > _ADMIN_RENEW:
            self._admin, self._admin_born = None, now

    def _error(self, what: str, exc: BaseException) -> LogError:
        """:class:`LogUnavailableError` for a condition that passes (see
        :func:`_unavailable`), :class:`LogError` for any other."""
        err = exc.args[0] if exc.args else exc
        text = err.str() if isinstance(err, KafkaError) else str(err)
        if _unavailable(exc):
            return LogUnavailableError(f"Kafka log {self.url} is unavailable ({what}): {text}")
        return LogError(f"Kafka log {self.url} failed ({what}): {text}")

    def _admin_client(self) -> Any:
        if self._admin is None:
            self._admin = AdminClient(dict(self._common))
            self._admin_born = time.monotonic()
        return self._admin

    def _future(self, what: str, future: Any) -> Any:
        """Wait for an admin future within the timeout (in a thread)."""
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

    def _producer_client(self) -> Any:
        if self._producer is None:
            self._producer = Producer(
                {
                    **self._common,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 1,
                    "message.max.bytes": 64 * 1024 * 1024,
                    "message.timeout.ms": int(self.timeout * 1000),
                    "partitioner": "murmur2_random",
                }
            )
            self._producer_thread = threading.Thread(
                target=self._serve_producer, name="wakuwaku-kafka-producer", daemon=True
            )
            self._producer_thread.start()
        return self._producer

    def _serve_producer(self) -> None:
        producer = self._producer
        while not self._stop.is_set() and producer is self._producer:
            producer.poll(0.05)

    async def _drop_producer(self) -> None:
        """Start a new idempotent producer at the next append (after a topic was
        deleted: librdkafka keeps the old topic's metadata for minutes)."""
        producer, self._producer = self._producer, None
        thread, self._producer_thread = self._producer_thread, None
        if producer is not None:
            with BLOCKING_CALLS.track():
                await asyncio.to_thread(producer.flush, 1.0)
        if thread is not None:
            await asyncio.to_thread(thread.join, 1.0)

    # -- topics -------------------------------------------------------------

    def _check_name(self, topic: str) -> None:
        check_topic_name(topic)
        full = self._name(topic)
        if not _LEGAL_TOPIC.fullmatch(full) or len(full) > 249 or full in (".", ".."):
            raise ConfigError(
                f"invalid Kafka topic name {full!r}: [A-Za-z0-9._-] only, at most 249 characters"
            )

    async def create_topic(
        self, topic: str, partitions: int, *, derived_from: str | None = None
    ) -> TopicInfo:
        """Create ``topic`` through the admin API; see :meth:`Log.create_topic`.

        Replication factor: the broker's ``default.replication.factor``.
        ``max.message.bytes``: the log's ``max_message_bytes``, plus
        :data:`HEADER_ROOM` for the engine's retry, dead-letter and replay
        topics: those created with ``derived_from`` (configured names
        included) and those with a derived name (``wk-retry.``, ``wk-dlq.``,
        ``wk-replayed.``: a replay ledger made by ``wakuwaku dlq replay``). A
        topic deleted just before is waited for (bounded) while the broker
        finishes the deletion; it is never taken for an existing topic.

        :raises PartitionCountMismatch: when the topic exists with another count.
        :raises LogUnavailableError: when a topic of that name is still being
            deleted after ``timeout`` seconds, or the cluster does not answer.
        """
        self._check_name(topic)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"topic {topic!r}: partition count must be >= 1, got {partitions!r}")
        derived = derived_from is not None or derived_main_topic(topic) is not None
        limit = self.max_message_bytes + (HEADER_ROOM if derived else 0)
        new = NewTopic(
            self._name(topic),
            num_partitions=partitions,
            replication_factor=-1,
            config={"max.message.bytes": str(limit)},
        )
        deadline = time.monotonic() + self.timeout

        def create() -> None:
            admin = self._admin_client()
            self._future("create topic", admin.create_topics([new])[self._name(topic)])

        while True:
            try:
                await self._run("create topic", create)
                break
            except LogError as exc:
                cause = exc.__cause__
                code = _code(cause) if cause is not None else None
                if code == KafkaError.TOPIC_ALREADY_EXISTS:
                    existing = await self._partitions_or_none(topic, fresh=True)
                    if existing is None:  # being deleted: wait for it to go
                        if time.monotonic() > deadline:
                            raise LogUnavailableError(
                                f"Kafka log {self.url}: topic {topic!r} cannot be created: "
                                f"the broker is still deleting a topic of that name after "
                                f"{self.timeout} s"
                            ) from exc
                        await asyncio.sleep(0.1)
                        continue
                    if existing != partitions:
                        raise PartitionCountMismatch(topic, existing, partitions) from None
                    break
                raise
        await self._wait_for_leaders(topic)
        self._topics[topic] = partitions
        return TopicInfo(topic, partitions)

    async def _wait_for_leaders(self, topic: str) -> None:
        """Wait (bounded) until every partition of a new topic has a leader."""
        name = self._name(topic)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            meta = await self._run(
                "describe topic",
                lambda: self._admin_client().list_topics(topic=name, timeout=self.timeout),
            )
            found = meta.topics.get(name)
            if (
                found is not None
                and found.error is None
                and found.partitions
                and all(p.leader >= 0 and p.error is None for p in found.partitions.values())
            ):
                return
            await asyncio.sleep(0.05)

    async def _partitions_or_none(self, topic: str, *, fresh: bool = False) -> int | None:
        if not fresh and topic in self._topics:
            return self._topics[topic]
        name = self._name(topic)

        def describe() -> Any:
            meta = self._admin_client().list_topics(topic=name, timeout=self.timeout)
            found = meta.topics.get(name)
            error = found.error if found is not None else None
            # A topic without a leader yet (created just now, or a broker back
            # from a freeze or a restart) is there: asked again.
            if (
                error is not None
                and error.code() not in _UNKNOWN_TOPIC_CODES
                and _unavailable(KafkaException(error))
            ):
                raise KafkaException(error)
            return found

        found = await self._idempotent("describe topic", describe)
        if found is None or found.error is not None or not found.partitions:
            self._topics.pop(topic, None)
            return None
        self._topics[topic] = len(found.partitions)
        return len(found.partitions)

    async def _partitions(self, topic: str, *, fresh: bool = False) -> int:
        count = await self._partitions_or_none(topic, fresh=fresh)
        if count is None:
            raise UnknownTopicError(topic)
        return count

    async def describe_topic(self, topic: str) -> TopicInfo:
        return TopicInfo(topic, await self._partitions(topic, fresh=True))

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic under the prefix (Kafka's internal ``__*`` topics left out), by name."""
        meta = await self._run(
            "list topics", lambda: self._admin_client().list_topics(timeout=self.timeout)
        )
        out = [
            TopicInfo(self._plain(name), len(t.partitions))
            for name, t in meta.topics.items()
            if name.startswith(self.prefix) and not name.startswith("__") and t.error is None
        ]
        return sorted(out, key=lambda t: t.name)

    async def delete_topic(self, topic: str) -> bool:
        """Delete the Kafka topic (its committed offsets go with it, broker-side).

        Stop its consumers first: this log's own readers of it are closed and
        its members subscribed to it leave their groups. Deletion is
        asynchronous on the broker: this returns once the broker no longer
        lists the topic, so a :meth:`create_topic` right after (``wakuwaku
        topics delete``, the demo's ``--reset``) makes a new, empty topic read
        from offset 0 (KRaft gives it a new topic id; no record of the old
        one is read).

        :returns: False when there was no such topic.
        :raises LogUnavailableError: when the broker still lists the topic
            after ``timeout`` seconds, or does not answer.
        """
        self._check_name(topic)
        if await self._partitions_or_none(topic, fresh=True) is None:
            return False
        for key in [k for k in self._readers if k[0] == topic]:
            reader = self._readers.pop(key)
            await self._run("close reader", reader.consumer.close)
        # Its consumers must be stopped already: members subscribed to it leave
        # their groups, so the topic's assignments go with it.
        for owner in [k for k, m in self._members.items() if topic in m.topics]:
            member = self._members.pop(owner)
            await self._run("leave group", member.close)
        name = self._name(topic)
        try:
            await self._run(
                "delete topic",
                lambda: self._future(
                    "delete topic", self._admin_client().delete_topics([name])[name]
                ),
            )
        except LogError as exc:
            if exc.__cause__ is not None and _code(exc.__cause__) in _UNKNOWN_TOPIC_CODES:
                return False
            raise
        self._topics.pop(topic, None)
        self._limits.pop(topic, None)
        await self._drop_producer()
        # Deletion is asynchronous on the broker: wait (bounded) until it is gone,
        # so that a create right after makes a new topic, not finds the old one.
        deadline = time.monotonic() + self.timeout
        while await self._partitions_or_none(topic, fresh=True) is not None:
            if time.monotonic() > deadline:
                raise LogUnavailableError(
                    f"Kafka log {self.url}: topic {topic!r} was deleted but the broker still "
                    f"lists it after {self.timeout} s"
                )
            await asyncio.sleep(0.05)
        return True

    async def max_message_bytes_of(self, topic: str) -> int:
        """The topic's ``max.message.bytes`` (read once, then cached)."""
        found = self._limits.get(topic)
        if found is not None:
            return found
        resource = ConfigResource(ResourceType.TOPIC, self._name(topic))

        def describe() -> Any:
            return self._future(
                "describe topic config",
                self._admin_client().describe_configs([resource])[resource],
            )

        configs = await self._run("describe topic config", describe)
        entry = configs.get("max.message.bytes")
        limit = int(entry.value) if entry is not None else 1_048_588
        self._limits[topic] = limit
        return limit

    # -- append ---------------------------------------------------------------

    async def _check_size(
        self, topic: str, partition: int, records: Sequence[OutgoingRecord]
    ) -> None:
        limit = await self.max_message_bytes_of(topic)
        for headers, body in records:
            bad = next((k for k in headers if "\x00" in k), None)
            if bad is not None:
                raise ConfigError(
                    f"a record for {topic}/{partition} has the header name {bad!r}: Kafka "
                    "header names (librdkafka's C strings) cannot hold NUL"
                )
            size = len(body) + sum(len(k) + len(v) for k, v in headers.items())
            if size + _BATCH_OVERHEAD > limit:
                key = headers.get(H_KEY, b"")
                raise ConfigError(
                    f"a record of key {bytes(key)!r} for {topic}/{partition} is {size} bytes "
                    f"(body and headers); topic {topic!r} takes at most {limit - _BATCH_OVERHEAD} "
                    f"(its max.message.bytes is {limit})"
                )

    def _fence_owner(self, fence: Lease) -> Member:
        """The member that holds ``fence`` now. :raises FencedError: otherwise."""
        member = self._members.get((fence.group, fence.member))
        held = (
            member.assignment.generation(fence.topic, fence.partition)
            if member is not None
            else None
        )
        if member is None or held != fence.generation:
            raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
        return member

    @staticmethod
    def _message(headers: Mapping[str, bytes]) -> tuple[bytes | None, list[tuple[str, bytes]]]:
        key = headers.get(H_KEY)
        rest = [(k, bytes(v)) for k, v in headers.items() if k != H_KEY]
        return (bytes(key) if key is not None else None), rest

    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[OutgoingRecord],
        *,
        fence: Lease | None = None,
        token: str | None = None,
    ) -> list[int]:
        """Produce ``records`` to one partition with the idempotent producer.

        Records are in order; they are not atomic as a group (a failure
        part way leaves the first ones; the engine's fenced batches go
        through :meth:`store`). With ``fence``, the member must own the
        fence's partition in its generation. A ``token`` is remembered by
        this instance once every record is acknowledged: an append sent
        again with it returns those offsets and produces nothing. Kafka
        keeps no token: an append that raised may have stored records, and
        sending it again may store them twice.

        :raises ConfigError: for a record over the topic's
            ``max.message.bytes`` (less framing), naming the limit; nothing
            is written.
        :raises LogUnavailableError: when the brokers do not acknowledge
            within ``timeout``.
        """
        check_token(token)
        checked = [check_record(h, b) for h, b in records]
        count = await self._partitions(topic)
        check_partition(topic, partition, count)
        outgoing = [(h, b) for h, (_, b) in zip(checked, records, strict=True)]
        if not outgoing:
            return []
        done = self._tokens.get(topic, partition, token, len(outgoing))
        if done is not None:
            if fence is not None:
                self._fence_owner(fence)
            return done
        await self._check_size(topic, partition, outgoing)
        if fence is not None:
            self._fence_owner(fence)
        futures = await self._produce_all(topic, partition, outgoing)
        try:
            with BLOCKING_CALLS.track():
                offsets = await asyncio.wait_for(asyncio.gather(*futures), self.timeout + 5.0)
        except TimeoutError as exc:
            raise LogUnavailableError(
                f"Kafka log {self.url} is unavailable (append to {topic}/{partition}): "
                f"not acknowledged within {self.timeout} s"
            ) from exc
        except KafkaException as exc:
            if _code(exc) in _UNKNOWN_TOPIC_CODES or (
                _code(exc) == KafkaError._MSG_TIMED_OUT
                and await self._partitions_or_none(topic, fresh=True) is None
            ):
                self._topics.pop(topic, None)
                await self._drop_producer()  # its metadata knows a topic that is gone
                raise UnknownTopicError(topic) from exc
            raise self._error(f"append to {topic}/{partition}", exc) from exc
        self._tokens.put(topic, partition, token, list(offsets))
        return list(offsets)

    async def _produce_all(
        self, topic: str, partition: int, outgoing: Sequence[OutgoingRecord]
    ) -> list[asyncio.Future[int]]:
        """Hand ``outgoing`` to the idempotent producer; one future per record's offset."""
        producer = self._producer_client()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[int]] = []
        name = self._name(topic)

        def done(fut: asyncio.Future[int], err: Any, msg: Any) -> None:
            if fut.done():
                return
            if err is not None:
                fut.set_exception(KafkaException(err))
            else:
                fut.set_result(msg.offset())

        for headers, body in outgoing:
            key, rest = self._message(headers)
            fut: asyncio.Future[int] = loop.create_future()
            futures.append(fut)

            def callback(err: Any, msg: Any, fut: asyncio.Future[int] = fut) -> None:
                loop.call_soon_threadsafe(done, fut, err, msg)

            while True:
                try:
                    producer.produce(
                        name, bytes(body), key, partition, on_delivery=callback, headers=rest
                    )
                    break
                except BufferError:
                    await asyncio.sleep(0.01)
        return futures

    # -- read -------------------------------------------------------------------

    def _new_reader(self, topic: str, partition: int, offset: int) -> Any:
        consumer = Consumer(
            {
                **self._common,
                "group.id": f"wakuwaku-reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
                "queued.max.messages.kbytes": 16384,
                "enable.partition.eof": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.assign([TopicPartition(self._name(topic), partition, offset)])
        return consumer

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        wait: float = 0.0,
    ) -> Page:
        """Read up to ``max_records`` committed records from ``offset`` on.

        Offsets are Kafka's: a page may skip offsets (transaction markers,
        aborted records, compaction). Without ``wait``, a read where the
        partition has nothing at or past ``offset`` returns at once; one
        where records exist waits (bounded by ``timeout``) for them to be
        fetched. A record without a ``wk-key`` header gets its Kafka key
        as ``wk-key``.

        :returns: a :class:`~wakuwaku.logs.Page` whose ``next_offset`` is
            the reader's position: past the markers and aborted records that
            follow the last record (or ``offset``), so a partition that ends
            with a transaction marker is read to its end offset.

        A cancelled read stops its fetch within one fetch slice (50 ms) and
        returns the reader to a known position before the cancellation goes
        on: the next read neither waits for it nor shares the consumer.
        """
        check_partition(topic, partition, await self._partitions(topic))
        reader = self._readers.get((topic, partition))
        if reader is None:
            created = _Reader(
                await self._run("read", lambda: self._new_reader(topic, partition, offset)), offset
            )
            # Two first reads at once: one reader is kept, the other closed.
            reader = self._readers.setdefault((topic, partition), created)
            if reader is not created:
                await self._run("close reader", created.consumer.close)
        async with reader.lock:
            moved = reader.next_offset != offset
            cancelled = threading.Event()

            def fetch() -> tuple[list[Any], int]:
                if moved:
                    self._seek(reader, topic, partition, offset)
                    reader.next_offset = offset
                return self._fetch(
                    reader.consumer, topic, partition, offset, max_records, wait, cancelled
                )

            running = asyncio.ensure_future(self._run("read", fetch))
            try:
                messages, position = await asyncio.shield(running)
            except LogError as exc:
                if exc.__cause__ is not None and _code(exc.__cause__) in _UNKNOWN_TOPIC_CODES:
                    # Deleted under a reader that had it cached: say so, as
                    # the contract asks, instead of failing each poll alike.
                    self._topics.pop(topic, None)
                    raise UnknownTopicError(topic) from exc
                raise
            except asyncio.CancelledError:
                # Stop the fetch thread and wait for it: otherwise it goes on
                # consuming for up to ``wait`` seconds, holding a worker of the
                # default executor and the reader's consumer (the next read ran
                # beside it and seeked under it: about 1.4 s per cancelled read).
                cancelled.set()
                reader.next_offset = -1  # what it consumed is dropped: seek again
                await asyncio.wait([running])
                if not running.cancelled():
                    running.exception()  # retrieved: the read was cancelled anyway
                raise
            records = self._records(topic, partition, messages)
            following = records[-1].offset + 1 if records else offset
            reader.next_offset = following
            page = Page(records, max(following, position))
            if not records and page.next_offset > offset:
                reader.next_offset = page.next_offset  # the next read starts there
            return page

    def _seek(self, reader: _Reader, topic: str, partition: int, offset: int) -> None:
        """Move ``reader`` to ``offset`` (in a thread, right before its fetch).

        With ``seek``, not a new ``assign``: librdkafka purges what was
        fetched for the old position, while after a re-``assign`` the first
        ``consume`` could still apply it, and ``position`` then reported the
        old position (past the end) with nothing read from the new one:
        :meth:`_fetch` took that for the end of the partition and returned
        nothing (a replay skipped a whole dead-letter partition). A
        reader that cannot seek (librdkafka refuses a partition not fetched
        yet) is replaced by a new one at ``offset``.
        """
        tp = TopicPartition(self._name(topic), partition, offset)
        try:
            reader.consumer.seek(tp)
        except KafkaException:
            old, reader.consumer = reader.consumer, self._new_reader(topic, partition, offset)
            with contextlib.suppress(KafkaException, RuntimeError):
                old.close()

    def _fetch(
        self,
        consumer: Any,
        topic: str,
        partition: int,
        start: int,
        count: int,
        wait: float,
        cancelled: threading.Event,
    ) -> tuple[list[Any], int]:
        """Consume up to ``count`` messages from ``start`` (in a thread).

        What is buffered comes at once; while the partition's high watermark
        (asked of the broker) is past the last message, more is fetched,
        bounded by ``timeout``. An empty partition waits ``wait`` seconds
        for a first record. Where only a transaction marker lies below the
        high watermark, at most :data:`_MARKER_WAIT` seconds are spent
        finding that out (Kafka does not tell the two apart). Stops early,
        within a fetch slice, once ``cancelled`` is set.

        :returns: the messages and the consumer's position after them (past
            the markers and aborted records it skipped; ``start`` while
            nothing was fetched).
        """
        out = list(consumer.consume(count, 0))
        now = time.monotonic()
        deadline, bound = now + max(wait, 0.0), now + self.timeout
        tp = TopicPartition(self._name(topic), partition)
        at = out[-1].offset() + 1 if out else start
        while len(out) < count and not cancelled.is_set():
            now = time.monotonic()
            if not out and wait > 0 and now < deadline:
                out.extend(consumer.consume(count, min(0.05, deadline - now)))
                continue
            at = out[-1].offset() + 1 if out else start
            # The fetch position moves past transaction markers (and aborted
            # records) without delivering anything: the position, once the
            # first fetch answered, says where the records end.
            (position,) = consumer.position([tp])
            fetched = position.offset >= 0  # unknown until the first fetch answered
            at = max(at, position.offset)
            _, high = consumer.get_watermark_offsets(tp, timeout=self.timeout, cached=False)
            if at >= high or now >= bound:
                return out, at
            if fetched and now >= deadline + _MARKER_WAIT:
                # Still below the high watermark: aborted records being skipped
                # (more comes), or the last stable offset (a transaction still
                # open: nothing more now). Ask the broker which.
                if out or at >= self._stable_offset(tp):
                    return out, at
                deadline = now
            out.extend(consumer.consume(count - len(out), 0.01))
        if out:
            at = max(at, out[-1].offset() + 1)
        return out, at

    def _stable_offset(self, tp: Any) -> int:
        """The partition's last stable offset (in a thread): where ``read_committed`` ends."""
        request = {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest()}
        futures = self._admin_client().list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED
        )
        offset: int = next(iter(futures.values())).result(timeout=self.timeout).offset
        return offset

    def _records(self, topic: str, partition: int, messages: list[Any]) -> list[Record]:
        out: list[Record] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() in _UNKNOWN_TOPIC_CODES:
                    self._topics.pop(topic, None)
                    self._readers.pop((topic, partition), None)
                    raise UnknownTopicError(topic)
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise self._error(f"read {topic}/{partition}", KafkaException(err))
            headers = {k: (v if v is not None else b"") for k, v in (msg.headers() or ())}
            key = msg.key()
            if key is not None and H_KEY not in headers:
                headers[H_KEY] = key
            value = msg.value()
            out.append(
                Record(
                    msg.offset(),
                    headers,
                    value if value is not None else b"",
                    msg.timestamp()[1] / 1000,
                )
            )
        return out

    # -- offsets -----------------------------------------------------------------

    async def _list_offsets(self, topic: str, spec: Any) -> dict[int, int]:
        count = await self._partitions(topic)
        name = self._name(topic)
        request = {TopicPartition(name, p): spec for p in range(count)}

        def ask() -> dict[int, int]:
            futures = self._admin_client().list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED
            )
            return {
                tp.partition: self._future("list offsets", f).offset for tp, f in futures.items()
            }

        return dict(sorted((await self._idempotent("list offsets", ask)).items()))

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the last stable offset (``read_committed``): past the
        last committed record and any transaction marker after it."""
        return await self._list_offsets(topic, OffsetSpec.latest())

    async def start_offsets(self, topic: str) -> dict[int, int]:
        return await self._list_offsets(topic, OffsetSpec.earliest())

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset (None when none, or the topic is gone).

        Read with ``require_stable``: an offset of a transaction in flight
        (or just committed, its markers not written yet) is waited for,
        never read half-done nor as "no offset".

        None only when the group coordinator answered for the partition
        without an error: a coordinator not there yet or moving is asked
        again (through the group's offsets consumer, see
        :meth:`_group_offsets`).

        :raises LogUnavailableError: when it stays in an open transaction, or
            the coordinator gives no answer, for ``timeout`` seconds.
        """
        count = await self._partitions_or_none(topic)
        if count is None:
            return None
        check_partition(topic, partition, count)
        found = await self._group_offsets(group, [(topic, partition)])
        return found.get((topic, partition))

    async def _group_offsets(
        self,
        group: str,
        partitions: list[tuple[str, int]] | None,
        deadline: float | None = None,
    ) -> dict[tuple[str, int], int]:
        """The group's committed offsets (of ``partitions``, or all), stable ones only.

        Asked with ``require_stable``: an offset sent in a transaction that
        has not ended yet (or whose commit markers are not written yet, just
        after ``commit_transaction``) comes back as ``UNSTABLE_OFFSET_COMMIT``,
        which is not "no offset": it is asked again until it is stable. So is
        a coordinator that is not there yet or moving (``NOT_COORDINATOR``,
        ``COORDINATOR_NOT_AVAILABLE``, ``COORDINATOR_LOAD_IN_PROGRESS``, for
        the group or for one partition: a fresh broker, one back from a
        freeze or a restart): an offset is absent only when the coordinator
        answered for it without an error.

        :raises LogUnavailableError: when an offset stays unstable, or the
            coordinator does not answer, for ``timeout`` seconds (or until
            ``deadline``); an unstable one is a transaction left open by a
            member that died in it, until ``transaction.timeout.ms`` aborts it.
        :raises LogError: for a partition the coordinator refuses.
        """
        tps = (
            None
            if partitions is None
            else [TopicPartition(self._name(t), p) for t, p in partitions]
        )
        request = [ConsumerGroupTopicPartitions(self._name(group), tps)]

        def ask() -> Any:
            if tps is not None:
                # Named partitions: through the group's offsets consumer (its
                # OffsetFetch asks for stable offsets, read_committed), not the
                # admin API: librdkafka's admin calls to a group coordinator
                # abort the process when the connection drops under them
                # ("rd_kafka_enq_once_del_source_return: Assertion
                # `eonce->refcnt > 0' failed", seen here on a broker SIGKILL),
                # and committed() is what a consumer asks while it waits out
                # an outage.
                consumer = self._offsets_client(group)
                return _check_partitions(consumer.committed(tps, timeout=self.timeout))
            futures = self._admin_client().list_consumer_group_offsets(request, require_stable=True)
            return self._future("committed offsets", futures[self._name(group)])

        if deadline is None:
            deadline = time.monotonic() + self.timeout
        pause = 0.001
        while True:
            waiting: list[str] = []
            last: LogError | None = None
            try:
                answer = await self._run("committed offsets", ask)
            except LogUnavailableError as exc:
                cause = exc.__cause__
                waiting.append(f"the group: {cause if cause is not None else 'no answer'}")
                last = exc
                if tps is None:
                    self._admin_unavailable()
                else:
                    self._offsets_unavailable(group)
            else:
                if tps is None:
                    self._admin_answered = time.monotonic()
                else:
                    self._offsets_answered_at[group] = time.monotonic()
                out = self._offsets_answered(answer, waiting)
                if not waiting:
                    return out
            if time.monotonic() > deadline:
                raise LogUnavailableError(
                    f"Kafka log {self.url} is unavailable (committed offsets): group {group!r} "
                    f"has no stable answer after {self.timeout} s ({'; '.join(waiting)}; an "
                    f"UNSTABLE_OFFSET_COMMIT is a transaction that has not ended)"
                ) from last
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _offsets_client(self, group: str) -> Any:
        """The consumer that reads ``group``'s committed offsets (in a thread):
        it never subscribes, so it never joins the group."""
        found = self._offsets.get(group)
        if found is None:
            found = Consumer(
                {
                    **self._common,
                    "group.id": self._name(group),
                    "client.id": f"wakuwaku-offsets-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                }
            )
            self._offsets[group] = found
            self._offsets_born[group] = time.monotonic()
        return found

    def _offsets_unavailable(self, group: str) -> None:
        """As :meth:`_admin_unavailable`, for ``group``'s offsets consumer:
        after :data:`_ADMIN_RENEW` seconds without an answer the next call
        gets a new one (its coordinator looked up again)."""
        now = time.monotonic()
        answered = max(
            self._offsets_answered_at.get(group, 0.0), self._offsets_born.get(group, 0.0)
        )
        if group in self._offsets and now - answered > _ADMIN_RENEW:
            old = self._offsets.pop(group)
            self._retired.append(old)  # closed with the log: a call may still use it

    def _offsets_answered(self, answer: Any, waiting: list[str]) -> dict[tuple[str, int], int]:
        """The offsets of an offset fetch's answer; the partitions answered
        with a condition that passes go to ``waiting``.

        :raises LogError: for a partition the coordinator refuses.
        """
        out: dict[tuple[str, int], int] = {}
        for tp in getattr(answer, "topic_partitions", answer) or ():
            where = f"{self._plain(tp.topic)}/{tp.partition}"
            if tp.error is not None:
                if tp.error.code() in _UNKNOWN_TOPIC_CODES:
                    continue  # a topic deleted: no offset on it
                error = self._error(f"committed offset of {where}", KafkaException(tp.error))
                if not isinstance(error, LogUnavailableError):
                    raise error
                waiting.append(f"{where}: {tp.error.name()}")
            elif tp.offset >= 0:
                out[(self._plain(tp.topic), tp.partition)] = tp.offset
        return out

    async def group_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """Every group's committed offsets on ``topic`` (for ``wakuwaku status``)."""
        await self._partitions(topic)

        def groups() -> Any:
            return self._future("list groups", self._admin_client().list_consumer_groups())

        listing = await self._run("list groups", groups)
        out: dict[str, dict[int, int]] = {}
        for g in listing.valid:
            gid = g.group_id
            if not gid.startswith(self.prefix) or gid.startswith("wakuwaku-reader-"):
                continue
            found = await self._group_offsets(self._plain(gid), None)
            mine = {p: o for (t, p), o in found.items() if t == topic}
            if mine:
                out[self._plain(gid)] = mine
        return out

    async def commit(
        self,
        group: str,
        topic: str,
        partition: int,
        offset: int,
        *,
        fence: Lease | None = None,
    ) -> None:
        """Store the group's offset; see :meth:`Log.commit`.

        With ``fence``: only the member owning the partition in that
        generation commits, through its own consumer, so
        the broker refuses the commit once the group's generation moved on
        (``FencedError``). Without: through the admin API, which Kafka allows
        only while the group has no active member, and read back.

        It returns once the broker answered that the offset is stored (per
        partition: a coordinator still loading, on a fresh broker, answers
        the request but not the partition); such an answer is asked again.

        :raises LogUnavailableError: when the offset is not stored after
            ``timeout`` seconds, or the cluster does not answer.
        :raises FencedError: as :meth:`Log.commit`.
        """
        offset = check_commit(group, topic, partition, offset)
        check_partition(topic, partition, await self._partitions(topic))
        member: Member | None
        if fence is not None:
            if fence.group != group:
                raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
            member = self._fence_owner(fence)
        else:
            member = next((m for m in self._members.values() if m.group == group), None)
        tp = TopicPartition(self._name(topic), partition, offset)
        if member is not None:
            await self._member_commit(member, [tp], fence)
            return
        request = [ConsumerGroupTopicPartitions(self._name(group), [tp])]

        def alter() -> None:
            futures = self._admin_client().alter_consumer_group_offsets(request)
            _check_partitions(self._future("commit", futures[self._name(group)]))

        # The answer's per-partition error is the broker saying the offset is
        # not stored (a coordinator still loading on a fresh broker): asked
        # again, and what is stored is read back before the commit returns.
        deadline = time.monotonic() + self.timeout
        while True:
            await self._idempotent(f"commit {topic}/{partition}", alter, deadline)
            found = await self._group_offsets(group, [(topic, partition)], deadline)
            if found.get((topic, partition)) == offset:
                return
            if time.monotonic() > deadline:
                raise LogUnavailableError(
                    f"Kafka log {self.url} is unavailable (commit {topic}/{partition}): "
                    f"group {group!r} reads {found.get((topic, partition))} back, not the "
                    f"{offset} committed, after {self.timeout} s"
                )
            await asyncio.sleep(0.05)

    async def _member_commit(self, member: Member, tps: list[Any], fence: Lease | None) -> None:
        """Commit through the member's consumer; the broker's answer, partition
        by partition, says the offsets are stored.

        A coordinator not there yet or moving (a fresh broker, one back from
        a freeze or a restart) is asked again until ``timeout``; a commit
        refused by generation raises :class:`FencedError` at once.

        :raises LogUnavailableError: when the offsets are still not stored
            after ``timeout`` seconds.
        """

        def commit() -> None:
            _check_partitions(
                member.call(lambda: member.consumer.commit(offsets=tps, asynchronous=False)).result(
                    self.timeout
                )
            )

        deadline = time.monotonic() + self.timeout
        while True:
            try:
                await self._run("commit", commit)
                return
            except LogError as exc:
                if _code(exc.__cause__ or exc) in _FENCED_CODES:
                    if fence is not None:
                        raise FencedError(
                            fence.group, fence.topic, fence.partition, fence.generation
                        ) from exc
                    raise
                if not isinstance(exc, LogUnavailableError) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)

    # -- ownership ----------------------------------------------------------------

    async def acquire_partition(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        """A lease while the group coordinator assigns ``partition`` to ``member``.

        The first call for a (group, member) joins the group; the first for
        a topic subscribes the member to it and waits (bounded by
        ``timeout``) for the rebalance. ``ttl`` only sets ``expires_at``: the
        group, not a timer, decides ownership. A partition being revoked
        answers None (the engine stops its worker, stores what is done and
        releases it; the revoke waits for that up to ``revoke_timeout``).

        :raises LogUnavailableError: when the group gives the member no
            assignment within ``timeout`` seconds.
        """
        check_partition(topic, partition, await self._partitions(topic))
        key = (group, member)
        found = self._members.get(key)
        owner = found if found is not None else Member(self, group, member)
        self._members[key] = owner
        joined = await owner.join(topic)
        if joined and self.transactions and owner.txn is None and owner.init_task is None:
            # Soon, not at the first retry write: init_transactions aborts
            # the open transaction a killed predecessor with this member
            # id left, which otherwise holds read_committed readers back.
            owner.init_task = asyncio.ensure_future(self._init_transactions(owner))
        generation = owner.assignment.acquire(topic, partition)
        if generation is None:
            return None
        return Lease(group, topic, partition, member, generation, time.time() + ttl)

    async def _init_transactions(self, member: Member) -> None:
        async with member.txn_lock:
            if member.txn is None and not member.closing:
                with contextlib.suppress(LogError):  # the first store tries again
                    await self._run("init transactions", lambda: self._transactional(member))

    async def partition_owners(self, group: str, topic: str) -> dict[int, Lease]:
        """Who owns each partition of ``topic`` in ``group`` now, from the group
        coordinator (members of every process: ``DescribeGroups``).

        A member of this process has its lease generation; another process's
        has generation 0 (its numbers are its own). ``expires_at`` is now
        plus the session timeout.

        :raises UnknownTopicError: when the topic does not exist.
        """
        await self._partitions(topic, fresh=True)
        name, full = self._name(group), self._name(topic)

        def describe() -> Any:
            futures = self._admin_client().describe_consumer_groups([name])
            return self._future("describe group", futures[name])

        found = await self._run("describe group", describe)
        until = time.time() + self.session_timeout
        local = {(m.group, m.member): m for m in self._members.values() if m.group == group}
        out: dict[int, Lease] = {}
        for member in found.members or ():
            assigned = member.assignment.topic_partitions if member.assignment else []
            client = member.client_id or ""
            who = client.removeprefix("wakuwaku-") or member.member_id
            mine = local.get((group, who))
            for tp in assigned:
                if tp.topic != full:
                    continue
                owned = (
                    mine.assignment.generation(topic, tp.partition) if mine is not None else None
                )
                generation = owned if owned is not None else 0
                out[tp.partition] = Lease(group, topic, tp.partition, who, generation, until)
        return dict(sorted(out.items()))

    async def ownership_changed(self, group: str, member: str, within: float) -> None:
        """Return when ``member``'s assignment changes, or after ``within`` seconds
        (:class:`~wakuwaku.engine._ownership.AssignmentLog`)."""
        found = self._members.get((group, member))
        if found is None or not found.assigned_once.is_set():
            # Joining: the group's answer is real I/O, so a fake clock must
            # not run ahead meanwhile (it did, by a second and more, while a
            # test's own wait loop spun on it).
            with BLOCKING_CALLS.track():
                if found is None:
                    await asyncio.sleep(min(within, 0.1))
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(found.changed.wait(), min(within, 0.1))
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(found.changed.wait(), within)

    def ownership_state(self, lease: Lease) -> OwnershipState:
        """``owned``, ``revoking`` (being revoked: stop, store, release) or ``gone``
        (:class:`~._ownership.OwnershipState`, a ``str``)."""
        member = self._members.get((lease.group, lease.member))
        if member is None:
            return OwnershipState.GONE
        return member.assignment.state(lease.topic, lease.partition, lease.generation)

    async def release_partition(self, lease: Lease) -> None:
        """Let a revoked partition go now; at shutdown, leave the group once the
        member holds nothing."""
        member = self._members.get((lease.group, lease.member))
        if member is None:
            return
        if member.assignment.release(lease.topic, lease.partition, lease.generation):
            self._members.pop((lease.group, lease.member), None)
            await self._run("leave group", member.close)

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        """Delete the group's committed offsets (all, or on ``topic``); its local
        members leave the group first.

        Kafka deletes a group only while it has no member: one that just left
        may still be listed for a moment (``NON_EMPTY_GROUP``), so the delete
        is asked again until ``timeout``. Offsets sent in a transaction that
        has not ended are waited for like :meth:`committed` does.

        :returns: how many committed offsets were deleted.
        :raises UnknownTopicError: when ``topic`` does not exist.
        :raises LogError: when the group still has members after ``timeout``
            seconds (consumers of another process still running: stop them
            first).
        """
        if topic is not None:
            await self._partitions(topic)
        for key in [k for k in self._members if k[0] == group]:
            member = self._members.pop(key)
            await self._run("leave group", member.close)
        everything = found = await self._group_offsets(group, None)
        if topic is not None:
            found = {k: v for k, v in found.items() if k[0] == topic}
        if not found:
            if topic is None:  # offsets on deleted topics may linger in the group
                await self._while_not_empty(group, lambda: self._drop_group(group))
            return 0
        name = self._name(group)

        kept = {k: v for k, v in everything.items() if k not in found}

        def delete() -> None:
            # confluent-kafka has no OffsetDelete call: the group goes, and the
            # offsets on other topics are stored again (its members are stopped).
            admin = self._admin_client()
            self._future("delete group", admin.delete_consumer_groups([name])[name])
            if kept:
                tps = [TopicPartition(self._name(t), p, o) for (t, p), o in kept.items()]
                request = [ConsumerGroupTopicPartitions(name, tps)]
                _check_partitions(
                    self._future("commit", admin.alter_consumer_group_offsets(request)[name])
                )

        await self._while_not_empty(group, delete)
        return len(found)

    async def _while_not_empty(self, group: str, delete: Callable[[], None]) -> None:
        """Run ``delete`` (a group deletion, in a thread), again while the
        coordinator still lists members (``NON_EMPTY_GROUP``), up to ``timeout``."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                await self._run("delete group", delete)
                return
            except LogError as exc:
                cause = exc.__cause__
                if cause is None or _code(cause) != KafkaError.NON_EMPTY_GROUP:
                    raise
                if time.monotonic() > deadline:
                    raise LogError(
                        f"Kafka log {self.url}: group {group!r} still has members after "
                        f"{self.timeout} s: stop its consumers first"
                    ) from exc
                await asyncio.sleep(0.1)

    def _drop_group(self, group: str) -> None:
        """Delete the Kafka consumer group itself; a group that is not there is fine."""
        name = self._name(group)
        try:
            self._future("delete group", self._admin_client().delete_consumer_groups([name])[name])
        except KafkaException as exc:
            if "does not exist" not in str(exc).lower():  # GROUP_ID_NOT_FOUND
                raise

    async def apply_retention(self, topic: str) -> int:
        """Delete records below every group's committed offset (``DeleteRecords``).

        The broker's own retention (``retention.ms``, ``retention.bytes``)
        runs besides; this only moves each partition's start up to the
        slowest group's offset, never past the end.

        :returns: how many offsets the start moved over (records, markers).
        """
        groups = await self.group_offsets(topic)
        starts = await self.start_offsets(topic)
        ends = await self.end_offsets(topic)
        floors: dict[int, int] = {}
        for offsets in groups.values():
            for partition, offset in offsets.items():
                floors[partition] = min(floors.get(partition, offset), offset)
        targets = {
            p: min(floor, ends.get(p, 0)) for p, floor in floors.items() if floor > starts.get(p, 0)
        }
        targets = {p: o for p, o in targets.items() if o > starts.get(p, 0)}
        if not targets:
            return 0
        tps = [TopicPartition(self._name(topic), p, o) for p, o in targets.items()]

        def delete() -> None:
            for fut in self._admin_client().delete_records(tps).values():
                self._future("delete records", fut)

        await self._run("apply retention", delete)
        self._readers_at_floor(topic)
        return sum(o - starts.get(p, 0) for p, o in targets.items())

    def _readers_at_floor(self, topic: str) -> None:
        for (t, _), reader in self._readers.items():
            if t == topic:
                reader.next_offset = -1  # the next read seeks again

    # -- store -----------------------------------------------------------------------

    async def store(self, write: BatchWrite, *, fence: Lease | None = None) -> list[list[int]]:
        """Write a batch's appends and offsets: one Kafka transaction (KIP-447).

        With ``fence`` and ``transactions`` on, and records to append, the
        appends and the offsets go in one transaction of the fence owner's
        transactional producer, the offsets through
        ``send_offsets_to_transaction`` with the member's group metadata:
        the broker aborts it when the member's generation is stale
        (``FencedError``, nothing visible). Offsets alone are committed
        through the member (fenced the same way). Otherwise: appends then
        commits, call by call.
        """
        if fence is None or not self.transactions or not write.appends:
            if fence is not None and not write.appends and write.commits:
                if fence.group != write.group:
                    raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
                member = self._fence_owner(fence)
                tps = []
                for topic, partition, offset in write.commits:
                    offset = check_commit(write.group, topic, partition, offset)
                    check_partition(topic, partition, await self._partitions(topic))
                    tps.append(TopicPartition(self._name(topic), partition, offset))
                await self._member_commit(member, tps, fence)
                return []
            return await super().store(write, fence=fence)
        if fence.group != write.group:
            raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
        member = self._fence_owner(fence)
        batches: list[tuple[str, int, Sequence[OutgoingRecord]]] = []
        for topic, partition, records in write.appends:
            check_partition(topic, partition, await self._partitions(topic))
            checked = [(check_record(h, b), b) for h, b in records]
            await self._check_size(topic, partition, checked)
            batches.append((topic, partition, checked))
        offsets = []
        for topic, partition, offset in write.commits:
            offset = check_commit(write.group, topic, partition, offset)
            check_partition(topic, partition, await self._partitions(topic))
            offsets.append(TopicPartition(self._name(topic), partition, offset))
        async with member.txn_lock:
            self._fence_owner(fence)
            try:
                results = await self._transact(member, batches, offsets, list(write.commits))
            except LogError as exc:
                code = _code(exc.__cause__) if exc.__cause__ is not None else None
                if code in _FENCED_CODES:
                    raise FencedError(
                        fence.group, fence.topic, fence.partition, fence.generation
                    ) from exc
                raise
        ends: dict[tuple[str, int], int] = {}
        for (topic, partition, _), written in zip(batches, results, strict=True):
            if written:
                key = (topic, partition)
                ends[key] = max(ends.get(key, 0), max(written) + 1)
        await self._wait_visible(ends)
        return results

    async def _wait_visible(self, ends: Mapping[tuple[str, int], int]) -> None:
        """Return once ``read_committed`` readers see every record below ``ends``
        (per topic and partition: the offset after the last record written).

        Kafka's ``commit_transaction`` returns once the transaction coordinator
        has logged the commit, *before* the commit markers reach the data
        partitions; until they do, the partitions' last stable offset stays
        below the transaction's records, and a ``read_committed`` read (or
        :meth:`end_offsets`) does not see them. A store that returned then let
        the engine read its pending retry records back right after it, find
        nothing, and resolve the keys: their events were lost. So :meth:`store` returns
        only after the last stable offset (``ListOffsets``, ``read_committed``)
        has passed what it wrote: one more round trip per transactional store,
        usually answered at once.

        :raises LogUnavailableError: when the records stay invisible for
            ``timeout`` seconds (the transaction committed: a caller that
            stores again writes its records twice, never loses them).
        """
        if not ends:
            return
        request = {TopicPartition(self._name(t), p): OffsetSpec.latest() for t, p in ends}

        def ask() -> dict[tuple[str, int], int]:
            futures = self._admin_client().list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED
            )
            return {
                (self._plain(tp.topic), tp.partition): self._future("list offsets", f).offset
                for tp, f in futures.items()
            }

        deadline = time.monotonic() + self.timeout
        pause = 0.001
        while True:
            try:
                stable = await self._run("wait for the commit markers", ask)
                behind = {k: v for k, v in ends.items() if stable.get(k, -1) < v}
            except LogUnavailableError:
                behind = dict(ends)
            if not behind:
                return
            if time.monotonic() > deadline:
                where = ", ".join(
                    f"{t}/{p} (through offset {o - 1})" for (t, p), o in behind.items()
                )
                raise LogUnavailableError(
                    f"Kafka log {self.url} is unavailable (store): the transaction committed but "
                    f"its records in {where} are not visible to read_committed readers after "
                    f"{self.timeout} s (the commit markers are not written)"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _transactional(self, member: Member) -> Any:
        if member.txn is None:
            producer = Producer(
                {
                    **self._common,
                    # One id per (group, member): a restarted member with the same
                    # member id aborts its dead predecessor's open transaction at
                    # init_transactions instead of every read_committed reader of
                    # its partitions waiting for transaction.timeout.ms.
                    "transactional.id": f"{self._name(member.group)}-{member.member}",
                    "transaction.timeout.ms": max(20_000, int(self.timeout * 2000)),
                    "message.max.bytes": 64 * 1024 * 1024,
                    "linger.ms": 0,
                }
            )
            producer.init_transactions(self.timeout)
            member.txn = producer
        return member.txn

    async def _transact(
        self,
        member: Member,
        batches: list[tuple[str, int, Sequence[OutgoingRecord]]],
        offsets: list[Any],
        commits: list[tuple[str, int, int]],
    ) -> list[list[int]]:
        """:meth:`_transaction` on a thread of its own, waited for at most
        :data:`_TXN_CALLS` timeouts (plus a second).

        librdkafka's ``send_offsets_to_transaction`` can block past its
        timeout while the group coordinator is down (librdkafka issue 5456,
        open in 2.14): a store waited for ever, and with it the consumer's
        stop and the process's exit (the fault suite hung that way in CI).
        A wedged transaction that had not started its commit is abandoned:
        the member's next store makes a new producer with the same
        ``transactional.id``, which fences the wedged one and aborts its
        transaction. One wedged in its commit leaves the store *unsettled*:
        every later store fails until that call has returned and its outcome
        is known (see :meth:`_settle`).

        :raises LogUnavailableError: when the transaction has not returned
            in time; what :meth:`_run` raises for its errors otherwise.
        """
        if self._closed:
            raise LogError(f"the Kafka log {self.url} is closed")
        progress = _Progress()
        future = _in_daemon_thread(
            f"wakuwaku-kafka-txn-{member.member}",
            lambda: self._transaction(member, batches, offsets, commits, progress),
        )
        bound = _TXN_CALLS * self.timeout + 1.0
        waiter = asyncio.wrap_future(future)
        try:
            with BLOCKING_CALLS.track():
                await asyncio.wait({waiter}, timeout=bound)
        finally:
            if not waiter.done():  # its outcome, when it comes, is read by _settle or no one
                waiter.add_done_callback(lambda w: w.cancelled() or w.exception())
        if not waiter.done():
            if progress.committing:
                member.unsettled = _Unsettled(batches, commits, progress.results, future)
            elif progress.producer is not None and member.txn is progress.producer:
                member.txn = None
            logger.warning(
                "Kafka log %s: a transaction of group %s has not returned after %.1f s "
                "(librdkafka did not keep its timeout); %s",
                self.url,
                member.group,
                bound,
                "its commit's outcome is awaited before the next store"
                if progress.committing
                else "its producer is replaced",
            )
            raise LogUnavailableError(
                f"Kafka log {self.url} is unavailable (store): the transaction did not "
                f"answer within {bound:.1f} s"
            )
        try:
            return waiter.result()
        except KafkaException as exc:
            raise self._error("store", exc) from exc

    def _transaction(
        self,
        member: Member,
        batches: list[tuple[str, int, Sequence[OutgoingRecord]]],
        offsets: list[Any],
        commits: list[tuple[str, int, int]],
        progress: _Progress | None = None,
    ) -> list[list[int]]:
        """One transaction (in a thread): produce, send offsets, commit; abort on failure.

        A commit that gets no answer (the broker went away under it) may
        still have gone through: its store is *unsettled*. The producer is
        kept and the next store first settles it (:meth:`_settle`); when
        that next store is the same write sent again (the engine retries a
        failed store as it was), and the earlier commit went through, its
        offsets are returned and nothing is written twice. Without this, a
        dead letter whose commit answered late was stored again by the
        retry: a record with two dead letters.
        """
        progress = _Progress() if progress is None else progress
        producer = progress.producer = self._transactional(member)
        settled = self._settle(member, producer, batches, commits)
        if settled is not None:
            return settled
        results: list[list[int]] = [[-1] * len(records) for _, _, records in batches]
        progress.results = results
        errors: list[Any] = []
        committing = False
        try:
            producer.begin_transaction()
            for n, (topic, partition, records) in enumerate(batches):
                for i, (headers, body) in enumerate(records):
                    key, rest = self._message(headers)

                    def report(err: Any, msg: Any, n: int = n, i: int = i) -> None:
                        if err is not None:
                            errors.append(err)
                        else:
                            results[n][i] = msg.offset()

                    producer.produce(
                        self._name(topic),
                        bytes(body),
                        key,
                        partition,
                        on_delivery=report,
                        headers=rest,
                    )
            if offsets:
                producer.send_offsets_to_transaction(offsets, member.metadata, self.timeout)
            committing = progress.committing = True
            producer.commit_transaction(self.timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if member.txn is not producer:
                pass  # wedged and replaced meanwhile: the new producer fenced this one
            elif committing and _unanswered(err):
                member.unsettled = _Unsettled(batches, commits, results)
            else:
                self._abandon(member, producer, err)
            raise
        if errors:
            raise KafkaException(errors[0])
        return results

    def _settle(
        self,
        member: Member,
        producer: Any,
        batches: list[tuple[str, int, Sequence[OutgoingRecord]]],
        commits: list[tuple[str, int, int]],
    ) -> list[list[int]] | None:
        """Learn how the member's unsettled store ended, before a new one.

        ``commit_transaction`` is asked again: librdkafka resumes the commit
        in flight and answers once its outcome is known. Committed: when
        ``batches`` and ``commits`` are that store's own (sent again), its
        offsets are returned and the caller writes nothing; otherwise None,
        and the caller's transaction goes ahead. Not committed (the broker
        wants it aborted): it is aborted, and None. Still no answer: raised,
        so the caller fails the same way and tries again later.
        """
        pending = member.unsettled
        if pending is None:
            return None
        if pending.wedged is not None:
            if not pending.wedged.done():
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT,
                        "the previous store's commit_transaction has not returned",
                        retriable=True,
                    )
                )
            if member.unsettled is not pending:  # its thread settled it meanwhile
                return self._settle(member, producer, batches, commits)
            member.unsettled = None
            if pending.wedged.exception() is not None:
                # It failed: its thread aborted it, or dropped the producer
                # (then this store fails once and the next makes a new one).
                if member.txn is not producer:
                    raise KafkaException(
                        KafkaError(
                            KafkaError._TIMED_OUT, "the producer was replaced", retriable=True
                        )
                    )
                return None
            if pending.batches == batches and pending.commits == commits:
                return pending.wedged.result()
            return None
        try:
            producer.commit_transaction(self.timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if _unanswered(err):
                raise
            member.unsettled = None
            self._abandon(member, producer, err)
            return None
        member.unsettled = None
        done = all(offset >= 0 for offsets in pending.results for offset in offsets)
        if done and pending.batches == batches and pending.commits == commits:
            return pending.results
        return None

    @staticmethod
    def _abandon(member: Member, producer: Any, err: object) -> None:
        """End a transaction that did not commit: abort it, or drop the producer.

        After a fatal error the producer is unusable. An abort that did not
        finish (the broker went away under it) stays in progress inside
        librdkafka, and every later call of that producer failed with
        "Conflicting abort_transaction API call is already in progress": the
        member never stored again. In both cases a new producer with the same
        ``transactional.id`` takes over at the next store; its
        ``init_transactions`` fences this one and aborts the open transaction.
        """
        if isinstance(err, KafkaError) and err.fatal():
            if member.txn is producer:
                member.txn = None
            return
        try:
            producer.abort_transaction(member.log.timeout)
        except KafkaException:
            if member.txn is producer:
                member.txn = None

    # -- close -------------------------------------------------------------------------

    async def close(self) -> None:
        """Leave every group, close readers and producers; calling it again does nothing."""
        if self._closed:
            return
        members, self._members = list(self._members.values()), {}
        readers, self._readers = list(self._readers.values()), {}
        for member in members:
            # A store in flight finishes its transaction first: an open one
            # would hold every read_committed reader of its partitions back
            # (the last stable offset) until transaction.timeout.ms.
            async with member.txn_lock:
                member.closing = True

        offsets, self._offsets = [*self._offsets.values(), *self._retired], {}
        self._retired = []

        def shut() -> None:
            for member in members:
                member.close()
            for consumer in offsets:
                with contextlib.suppress(KafkaException, RuntimeError):
                    consumer.close()
            for reader in readers:
                with contextlib.suppress(KafkaException, RuntimeError):
                    reader.consumer.close()
            if self._producer is not None:
                self._producer.flush(self.timeout)
            self._stop.set()
            if self._producer_thread is not None:
                self._producer_thread.join(1.0)

        with BLOCKING_CALLS.track():
            await asyncio.to_thread(shut)
        self._closed = True

    # -- URLs ----------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str) -> KafkaLog:
        """``kafka://[user:password@]host:port[,host:port...][?options]``.

        Options: ``prefix``, ``timeout`` (seconds), ``transactions`` (1/0),
        ``security_protocol`` (``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``,
        ``SASL_SSL``), ``sasl_mechanism`` (``PLAIN``, ``SCRAM-SHA-256``,
        ``SCRAM-SHA-512``), ``ssl_ca_location`` (a CA file). Without
        ``user:password@`` the SASL credentials come from
        ``WAKUWAKU_KAFKA_USERNAME`` / ``WAKUWAKU_KAFKA_PASSWORD`` when set.
        The credentials are never part of :attr:`url` or any message.

        :raises ConfigError: for a URL without hosts or with a bad option.
        """
        parsed = parse_log_url(url)
        credentials, at, hosts = parsed.rest.rstrip("/").rpartition("@")
        check_servers("Kafka", hosts, "kafka://host:port[,host:port]")
        security: dict[str, str] = {}
        user = password = None
        if at:
            name, _, secret = credentials.partition(":")
            user, password = unquote(name), unquote(secret)
        user = user or os.environ.get(USERNAME_ENV) or None
        password = password or os.environ.get(PASSWORD_ENV) or None
        protocol = parsed.options.get("security_protocol")
        if protocol:
            if protocol.upper() not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
                raise ConfigError(f"bad Kafka log URL: unknown security_protocol {protocol!r}")
            security["security.protocol"] = protocol.upper()
        elif user:
            security["security.protocol"] = "SASL_PLAINTEXT"
        if parsed.options.get("sasl_mechanism"):
            security["sasl.mechanism"] = parsed.options["sasl_mechanism"]
        if parsed.options.get("ssl_ca_location"):
            security["ssl.ca.location"] = parsed.options["ssl_ca_location"]
        if user:
            security["sasl.username"] = user
            security["sasl.password"] = password or ""
            security.setdefault("sasl.mechanism", "PLAIN")
        return cls(
            hosts,
            prefix=parsed.options.get("prefix", ""),
            timeout=option_timeout(parsed, "timeout", 10.0),
            transactions=option_bool(parsed, "transactions", True),
            security=security,
        )
