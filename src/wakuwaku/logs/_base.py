"""The log contract: what every adapter (memory, SQLite, Redis, NATS, Kafka, Iggy) provides.

A *log* holds topics; a topic has a fixed number of partitions; a partition
is an ordered sequence of records with int offsets that grow monotonically
(dense from 0 on the memory and SQLite logs). Consumer groups store their
*committed offset* per partition: the offset of the next record to read
(Kafka's convention), so ``end_offset - committed`` is the lag.

Partition ownership (design §15): :meth:`Log.acquire_partition` grants a lease
with a *generation* number. Every write the engine makes for a partition it
owns carries that lease as a *fence*: :meth:`Log.append`, :meth:`Log.commit`
and :meth:`Log.store` with ``fence=lease`` are refused with
:class:`~wakuwaku.FencedError`, writing nothing, once another member took
the lease over. On SQLite, memory and Redis the check and the write are one
transaction, one lock hold or one server-side script, never a read followed
by a write. The logs of the servers that have no such step say what is left:
NATS writes under a fence record it checks first, Kafka fences with its
transactions (with ``transactions=0``, a check of the member's assignment
followed by the write), and Iggy has neither transactions nor a conditional
append (``docs/logs.md`` gives each log's window). The fence names the *main*
partition's lease; the write may go to another topic (the group's retry and
dead-letter topics).

:meth:`Log.store` writes what one batch stores (retry work, dead letters,
offsets) together: atomically where the log can (:attr:`Log.atomic_store`),
otherwise appends first, offsets last, each fenced.

The contract suite in ``tests/logs/contract.py`` is written once and run
against every adapter.
"""

from __future__ import annotations

import abc
import operator
import re
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from numbers import Real
from types import TracebackType

from .._errors import ConfigError, UnknownPartitionError
from .._partitioner import partition_for as kafka_partition_for
from .._records import Record

OutgoingRecord = tuple[Mapping[str, bytes], bytes]
"""What :meth:`Log.append` takes per record: ``(headers, body)``."""


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic's name and partition count."""

    name: str
    partitions: int


@dataclass(frozen=True, slots=True)
class Lease:
    """Ownership of one partition for one group member (design §15).

    :param generation: the fencing token; grows each time ownership moves.
    :param expires_at: when the lease lapses unless renewed (seconds since the epoch).
    """

    group: str
    topic: str
    partition: int
    member: str
    generation: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class BatchWrite:
    """What one batch or retry attempt round stores, for :meth:`Log.store`.

    :param group: the consumer group whose offsets ``commits`` are.
    :param appends: ``(topic, partition, records)`` in the order they are
        written (the engine writes dead letters before retry records).
    :param commits: ``(topic, partition, offset)``: offsets stored after the
        appends (the next offset to read, as :meth:`Log.commit`).
    """

    group: str
    appends: Sequence[tuple[str, int, Sequence[OutgoingRecord]]] = ()
    commits: Sequence[tuple[str, int, int]] = ()


class Page(list[Record]):
    """What :meth:`Log.read` may return instead of a plain list: the records,
    and where the read stopped in the partition.

    :ivar next_offset: the offset the next read starts at: past the last
        record, and past the offsets after it that the log holds but never
        delivers (Kafka's transaction markers and aborted records). An empty
        page whose ``next_offset`` is past the offset read tells the reader
        those offsets are done; without it a partition that ends with a
        transaction marker would never reach its end offset.
    """

    __slots__ = ("next_offset",)

    def __init__(self, records: Sequence[Record] = (), next_offset: int = 0) -> None:
        super().__init__(records)
        self.next_offset = next_offset


def check_topic_name(topic: str) -> None:
    """Refuse topic names that no adapter can store.

    :raises ConfigError: for an empty name, or one with whitespace, ``/`` or
        control characters, or longer than 200 characters.
    """
    if not isinstance(topic, str) or not topic:
        raise ConfigError(f"a topic name must be a non-empty string, got {topic!r}")
    if len(topic) > 200 or any(c.isspace() or c == "/" or ord(c) < 32 for c in topic):
        raise ConfigError(
            f"invalid topic name {topic!r}: no whitespace, '/' or control characters, "
            "at most 200 characters"
        )


_STR = frozenset({str})
_BYTES = frozenset({bytes})
_DICT = frozenset({dict})
_TUPLE = frozenset({tuple})
_values = operator.methodcaller("values")


def check_record(headers: Mapping[str, bytes], body: bytes) -> dict[str, bytes]:
    """Check one outgoing record at run time (callers may be untyped).

    :returns: the headers as a dict of plain ``str`` names and ``bytes``
        values (``headers`` itself when it already is one; otherwise a copy:
        a subclass of bytes or str, a bytearray or a memoryview becomes the
        plain type, which every log's encoder takes).
    :raises ConfigError: when the body is not bytes-like, or a header name is
        not a str that UTF-8 can encode (a lone surrogate cannot) or a header
        value not bytes-like; nothing is written then.
    """
    # The common case, checked in C: a bytes body and a dict of ASCII str
    # names and bytes values (exact types). Anything else, subclasses
    # included, is checked one by one below.
    if (
        type(body) is bytes
        and type(headers) is dict
        and _STR.issuperset(map(type, headers))
        and _BYTES.issuperset(map(type, headers.values()))
        and all(map(str.isascii, headers))
    ):
        return headers
    if not isinstance(body, bytes | bytearray | memoryview):
        raise ConfigError(f"a record body must be bytes, got {type(body).__name__}")
    if not isinstance(headers, Mapping):
        raise ConfigError(f"record headers must be a mapping, got {type(headers).__name__}")
    plain: dict[str, bytes] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, bytes | bytearray | memoryview):
            raise ConfigError(
                f"record headers must map str to bytes; got {name!r}: {type(value).__name__}"
            )
        _check_name(name)
        plain[str(name)] = bytes(value)
    return plain


def _check_name(name: str) -> None:
    """:raises ConfigError: for a header name UTF-8 cannot encode (every log
    but the memory one stores names as UTF-8; a lone surrogate failed there
    with a bare ``UnicodeEncodeError``)."""
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"a record header name must be text UTF-8 can encode, got {name!r}: {exc.reason}"
            ) from None


def check_records(records: Sequence[OutgoingRecord]) -> list[OutgoingRecord]:
    """:func:`check_record` for every record of an append.

    :returns: ``(headers, body)`` per record, the headers as
        :func:`check_record` returns them (a dict of ``str`` to ``bytes``).
    :raises ConfigError: for the first record :func:`check_record` refuses;
        nothing is written then.
    """
    records = list(records)  # iterated more than once below
    heads = [headers for headers, _ in records]
    bodies = [body for _, body in records]
    # The common case, one pass in C over the whole append (exact types, as
    # check_record's own fast path): bytes bodies, dicts of str -> bytes.
    if (
        _BYTES.issuperset(map(type, bodies))
        and _DICT.issuperset(map(type, heads))
        and _STR.issuperset(map(type, chain.from_iterable(heads)))
        and _BYTES.issuperset(map(type, chain.from_iterable(map(_values, heads))))
        and all(map(str.isascii, chain.from_iterable(heads)))
    ):
        if _TUPLE.issuperset(map(type, records)):
            return records  # no new tuples: fewer objects for the collector
        return list(zip(heads, bodies, strict=True))
    return [(check_record(h, b), b) for h, b in zip(heads, bodies, strict=True)]


_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_token(token: str | None) -> None:
    """Check an append's idempotency token (see :meth:`Log.append`).

    :raises ConfigError: for a token that is not 1-64 of ``[A-Za-z0-9_-]``.
    """
    if token is not None and (not isinstance(token, str) or not _TOKEN_RE.fullmatch(token)):
        raise ConfigError(
            f"an append token must be 1-64 characters of [A-Za-z0-9_-], got {token!r}"
        )


class AppendTokens:
    """The offsets of token-carrying appends, remembered in this process.

    For logs whose append either stores everything and answers, or stores
    nothing (a local transaction, a lock hold): a lost answer cannot leave
    records behind there, so the appends this process saw succeed are all
    a retry can repeat. Keeps the newest ``limit`` tokens for ``ttl`` seconds.
    """

    def __init__(self, limit: int = 10_000, ttl: float = 300.0) -> None:
        self.limit = limit
        self.ttl = ttl
        self._seen: OrderedDict[tuple[str, int, str], tuple[float, list[int]]] = OrderedDict()

    def get(self, topic: str, partition: int, token: str | None, count: int) -> list[int] | None:
        """The offsets an earlier append with ``token`` got, or None.

        :raises ConfigError: when that append had another number of records
            (a token names one append: it is never reused for others).
        """
        if token is None:
            return None
        found = self._seen.get((topic, partition, token))
        if found is None or found[0] < time.monotonic():
            return None
        if len(found[1]) != count:
            raise ConfigError(
                f"append token {token!r} on {topic}/{partition} was used for an append "
                f"of {len(found[1])} records, now {count}: a token names one append"
            )
        return list(found[1])

    def put(self, topic: str, partition: int, token: str | None, offsets: list[int]) -> None:
        if token is None:
            return
        key = (topic, partition, token)
        self._seen[key] = (time.monotonic() + self.ttl, list(offsets))
        self._seen.move_to_end(key)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)


MAX_READ_RECORDS = 1_000_000
"""The most records one read may ask for (confluent-kafka's ``consume``
takes no more); :class:`~wakuwaku.engine.ConsumerConfig` bounds
``max_poll_records`` by it too."""

MAX_READ_WAIT = 86_400.0
"""The longest a read may wait for a first record (seconds): NATS refuses a
pull request whose expiry does not fit its nanoseconds (1e10 s was
answered as an outage), so every log takes at most a day."""


def check_read(
    topic: str, partition: int, offset: int, max_records: int, wait: float
) -> tuple[int, int, float]:
    """Check a read's arguments, the same on every log, before its store is asked.

    :returns: ``(offset, max_records, wait)`` as an int, an int and a float
        (integer types such as numpy's are accepted for the two counts, as
        :func:`check_commit` accepts them for an offset; any real number
        for ``wait``).
    :raises ConfigError: for a partition that is not an int (a bool is
        refused), an offset that is not an integer in ``[0, 2**63)``, a
        ``max_records`` that is not an integer in ``[1,``
        :data:`MAX_READ_RECORDS` ``]``, or a ``wait`` that is not a number
        of seconds in ``[0,`` :data:`MAX_READ_WAIT` ``]`` (NaN and infinity
        are refused). A read of 0 records raised ``IndexError`` on one log
        and returned nothing on others, and values past what a store takes
        failed each log its own way (an overflow, a protocol error, an
        outage).
    """
    where = f"read of {topic}/{partition}"
    _check_partition_type("read", topic, partition)
    first = _integer(offset)
    if first is None or not 0 <= first < 2**63:
        raise ConfigError(f"{where}: the offset must be an int in [0, 2**63), got {offset!r}")
    count = _integer(max_records)
    if count is None or not 1 <= count <= MAX_READ_RECORDS:
        raise ConfigError(
            f"{where}: max_records must be an int from 1 to {MAX_READ_RECORDS}, got {max_records!r}"
        )
    seconds = None if isinstance(wait, bool) or not isinstance(wait, Real) else float(wait)
    if seconds is None or not 0 <= seconds <= MAX_READ_WAIT:
        raise ConfigError(
            f"{where}: wait must be a number of seconds from 0 to {MAX_READ_WAIT:g}, got {wait!r}"
        )
    return first, count, seconds


def _check_partition_type(call: str, topic: str, partition: object) -> None:
    """:raises ConfigError: for a partition that is not an int (a bool is refused)."""
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise ConfigError(
            f"{call} on topic {topic!r}: the partition must be an int, got {partition!r}"
        )


def _integer(value: object) -> int | None:
    """``value`` as an int when it is an integer type other than bool, else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def check_commit(group: str, topic: str, partition: int, offset: int) -> int:
    """Check a commit's arguments (the next offset to read is never negative).

    :returns: the offset as an int (integer types such as numpy's are accepted).
    :raises ConfigError: for a partition that is not an int, an empty or
        non-str group, or an offset that is not an integer in [0, 2**63) (a
        bool or a float is refused; 2**63 is past what SQLite stores).
    """
    _check_partition_type("commit", topic, partition)
    if not isinstance(group, str) or not group:
        raise ConfigError(
            f"commit on {topic}/{partition}: the group must be a non-empty str, got {group!r}"
        )
    value = _integer(offset)
    if value is None or not 0 <= value < 2**63:
        raise ConfigError(
            f"commit of group {group!r} on {topic}/{partition}: the offset must "
            f"be an int in [0, 2**63), got {offset!r}"
        )
    return value


def check_partition(topic: str, partition: int, partitions: int) -> None:
    """:raises UnknownPartitionError: when ``partition`` is outside the topic."""
    if not 0 <= partition < partitions:
        raise UnknownPartitionError(topic, partition, partitions)


class Log(abc.ABC):
    """A partitioned log: one abstract base for every adapter.

    Every method may raise :class:`~wakuwaku.LogUnavailableError` when the
    backing store cannot be reached; the consumer treats that as Transient.
    """

    url: str = ""
    atomic_store: bool = False
    """True when :meth:`store` writes all or nothing (one transaction)."""

    @property
    def max_record_size(self) -> int:
        """The largest record (body and headers, bytes) an append takes, with
        room left for the headers the engine adds when it moves the record to
        a retry or dead-letter topic; 0 when the log has no limit of its own.
        :class:`~wakuwaku.Producer` refuses a larger record before writing."""
        return 0

    commits_zero: bool = True
    """False for a log that stores an offset only with a record below it
    (Iggy stores "the last record consumed"): a committed 0 reads back as
    None there, so a reader must take None as "from the start"."""

    def partition_for(self, key: str | bytes, partitions: int) -> int:
        """The partition a record of ``key`` goes to in a topic of ``partitions``.

        Kafka's default partitioner (murmur2, design §2) unless the engine
        has its own producers' rule (Iggy: xxHash32 of the key), so records
        of other producers of that engine land where ours do. A str key is
        UTF-8 encoded.
        """
        return kafka_partition_for(key, partitions)

    @abc.abstractmethod
    async def create_topic(
        self, topic: str, partitions: int, *, derived_from: str | None = None
    ) -> TopicInfo:
        """Create ``topic`` with ``partitions`` partitions; idempotent.

        :param derived_from: the main topic when ``topic`` is one of the
            engine's retry, dead-letter or replay-ledger topics of it, whatever
            its name (design §6: names can be configured). A log that bounds
            record sizes per topic (Kafka) gives such a topic room for the
            headers the engine adds; the others ignore it.

        :raises PartitionCountMismatch: when it exists with another count
            (naming both counts).
        :raises ConfigError: for a bad name or a count below 1.
        """

    @abc.abstractmethod
    async def describe_topic(self, topic: str) -> TopicInfo:
        """The topic's partition count.

        :raises UnknownTopicError: when the topic does not exist.
        """

    @abc.abstractmethod
    async def list_topics(self) -> list[TopicInfo]:
        """Every topic, sorted by name."""

    @abc.abstractmethod
    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[OutgoingRecord],
        *,
        fence: Lease | None = None,
        token: str | None = None,
    ) -> list[int]:
        """Append ``records`` to one partition, in order.

        All or nothing on the memory, SQLite and Redis logs (a lock hold, a
        transaction, a script). On NATS (2.9 has no atomic batch) and Kafka
        (outside :meth:`store`'s transaction) the records are written one
        after another: an append that fails part way (its
        :class:`~wakuwaku.LogUnavailableError` says so) may have stored a
        *prefix* of its records, which readers see. Sending it again with
        the same ``token`` completes it (see below).

        :param fence: the lease this write is made under (see the module
            docstring); None for a write that needs no ownership (producers).
        :param token: an idempotency token naming this append (1-64 of
            ``[A-Za-z0-9_-]``, unique per append: a uuid4 hex). An append
            whose answer was lost (it raised ``LogUnavailableError``), sent
            again with the same token, the same records and the same
            partition, stores each record exactly once: what the first try
            stored is not stored again, what it did not store is, and the
            offsets returned are those the records have. Kept for a window:
            NATS 2 minutes (the streams' duplicate window), Redis 5 minutes
            (a key beside the partition); memory, SQLite and Kafka remember
            the tokens of the appends that answered in this process, for 5
            minutes (their appends store all or nothing, or, on Kafka, the
            idempotent producer resends within the call); Iggy remembers
            them too, and looks for the records of an append that raised
            by message ids made from its token (this process only). A retry
            after the window may store the records again.
        :returns: the offsets given to the records, in order.
        :raises UnknownTopicError: when the topic does not exist.
        :raises UnknownPartitionError: when the partition does not exist.
        :raises FencedError: when ``fence`` is no longer the current lease of
            its partition; nothing is written.
        :raises ConfigError: for a bad token, or a token sent again with
            another number of records (memory, SQLite, Redis, Kafka, Iggy;
            not NATS). No log compares the records: a token sent again with
            as many other records returns the first append's offsets and
            stores nothing, so a token is never reused.
        """

    @abc.abstractmethod
    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        wait: float = 0.0,
    ) -> list[Record]:
        """Read up to ``max_records`` records with offsets ``>= offset``.

        :param wait: when nothing is there yet, wait up to this many seconds
            for a record to arrive (0: return at once).
        :returns: records in offset order; empty when none arrived in time.
            A log whose offsets hold more than records (Kafka) returns a
            :class:`Page` that says where the next read starts.
        :raises UnknownTopicError: / :raises UnknownPartitionError: as :meth:`append`.
        :raises ConfigError: for bad arguments (:func:`check_read`), on every log.
        """

    @abc.abstractmethod
    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset the next appended record will get."""

    @abc.abstractmethod
    async def start_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the lowest offset still stored (retention deletes below)."""

    @abc.abstractmethod
    async def commit(
        self,
        group: str,
        topic: str,
        partition: int,
        offset: int,
        *,
        fence: Lease | None = None,
    ) -> None:
        """Store ``offset`` (the next offset to read) as the group's position.

        :param fence: the lease this commit is made under: the partition's
            own, or its main partition's for a retry partition (which belongs
            to the main partition's owner). A commit under a lease that is no
            longer current is refused; without one the commit is not fenced
            (tools, tests, a consumer without ownership).
        :raises ConfigError: for an empty group or a negative offset
            (:func:`check_commit`).
        :raises FencedError: when ``fence`` is no longer the current lease
            generation; nothing is stored.
        """

    @abc.abstractmethod
    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset, or None when it never committed."""

    @abc.abstractmethod
    async def acquire_partition(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        """Take or renew the lease on a partition for ``member`` (design §15).

        :param ttl: how long the lease lasts without renewal (seconds).
        :returns: the lease when ``member`` owns the partition now, None when
            another live member does. Taking over an expired lease bumps the
            generation.
        """

    @abc.abstractmethod
    async def release_partition(self, lease: Lease) -> None:
        """Give up a lease (at shutdown) so another member can take it at once."""

    async def store(self, write: BatchWrite, *, fence: Lease | None = None) -> list[list[int]]:
        """Write a batch's appends, then its offsets, under ``fence``.

        Logs with :attr:`atomic_store` write all of it or nothing. This
        default makes one fenced call per append and per commit, in order: a
        crash between them leaves the appends without the offsets (the
        engine tolerates that: at-least-once, design §7).

        :returns: the offsets given to each append's records, per append.
        :raises FencedError: when ``fence`` is stale; with an atomic store
            nothing was written.
        :raises UnknownTopicError: / :raises UnknownPartitionError: as
            :meth:`append`; :raises ConfigError: as :meth:`commit`.
        """
        assigned = [
            await self.append(topic, partition, records, fence=fence)
            for topic, partition, records in write.appends
        ]
        for topic, partition, offset in write.commits:
            await self.commit(write.group, topic, partition, offset, fence=fence)
        return assigned

    async def delete_topic(self, topic: str) -> bool:
        """Delete ``topic`` with its records and every group's offsets and leases on it.

        For cleaning up (tests, a shared server, a topic made by mistake):
        consumers of the topic must be stopped first; their later calls on
        it raise :class:`~wakuwaku.UnknownTopicError`. A topic created again
        under the name starts empty, from offset 0.

        :returns: True when the topic existed, False when there was nothing
            to delete.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement delete_topic")

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        """Delete ``group``'s committed offsets and partition leases.

        For cleaning up a group that is gone: stop its members first. A
        member that still runs is not fenced by the generations deleted
        here (the next lease starts again from generation 1).

        :param topic: only on this topic; None: on every topic.
        :returns: how many committed offsets were deleted.
        :raises UnknownTopicError: when ``topic`` is given and does not exist.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement delete_group")

    async def group_offsets(self, topic: str) -> dict[str, dict[int, int]] | None:
        """Every group's committed offsets on ``topic``: group -> partition -> offset.

        Read-only, for the operations commands (``topic describe``,
        ``status``, the dashboard). Optional: None (the default) means this
        log cannot list them.

        :raises UnknownTopicError: when the topic does not exist.
        """
        return None

    async def partition_owners(self, group: str, topic: str) -> dict[int, Lease] | None:
        """The current owner of each partition of ``topic`` in ``group``:
        partition -> :class:`Lease` (a released lease is left out; an expired
        one is included, its ``expires_at`` in the past).

        Read-only, for showing owners (``wakuwaku dashboard``): it takes no
        lease. Optional: None (the default) means this log cannot tell.

        :raises UnknownTopicError: when the topic does not exist.
        """
        return None

    async def apply_retention(self, topic: str) -> int:
        """Delete records below every group's committed offset; returns how many.

        Adapters without retention keep everything and return 0.
        """
        return 0

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections and files."""

    async def __aenter__(self) -> Log:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
