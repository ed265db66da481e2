"""The Apache Iggy log: topics are Iggy topics of one stream (URL ``iggy://user:password@host:port``).

Mapping (``docs/logs.md``, "The Apache Iggy log"):

- one Iggy stream (default ``wakuwaku``, created on first use) holds the
  log's topics; a topic is an Iggy topic with the same partition count,
  partitions numbered from 0;
- headers are Iggy user headers (string keys, raw byte values); what Iggy
  cannot carry as a header (an empty value, a name or value over 255 bytes)
  and an empty body travel in the payload, under the reserved header
  ``wk-iggy-envelope``;
- a key's partition is Iggy's own message-key partitioning (xxHash32 of the
  key bytes, seed 0, modulo the partition count), so a record any Iggy
  producer sends by message key lands where ours does;
- offsets are Iggy offsets (dense from 0);
- ownership is Iggy's consumer groups: a member joins the Iggy consumer
  group ``<group>`` of each topic it reads, over a connection of its own, and
  owns the partitions the server assigns it (see :class:`IggyLog`);
- a group's committed offsets are stored on the server as the offsets of
  the Iggy consumer named ``<group>``; a member's commit of a partition it
  owns also passes the server's consumer-group offset fence first.

Iggy has no transactions and no conditional append: what a member that lost
a partition can still write is said in :class:`IggyLog` and the docs.

apache-iggy (the Rust SDK behind an asyncio API) is imported here only
(extra ``iggy``); every call is bounded by the log's ``timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import unquote

try:
    import xxhash
    from apache_iggy import IggyClient
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Iggy log needs apache-iggy: pip install 'wakuwaku[iggy]'") from exc

from ..._clock import BLOCKING_CALLS
from ..._errors import (
    ConfigError,
    FencedError,
    LogError,
    LogUnavailableError,
    PartitionCountMismatch,
)
from ..._records import Record
from ..._topics import split_derived_topic
from .._base import (
    AppendTokens,
    Lease,
    Log,
    OutgoingRecord,
    TopicInfo,
    check_commit,
    check_partition,
    check_record,
    check_token,
)
from .._url import check_servers, check_timeout, log_url, option_timeout, parse_log_url
from ._messages import HEADER_ROOM, MAX_PAYLOAD, Messages
from ._server import MAX_NAME, Server, check_group, check_name, ident

__all__ = (
    "HEADER_ROOM",
    "MAX_PAYLOAD",
    "PASSWORD_ENV",
    "USERNAME_ENV",
    "IggyLog",
    "iggy_partition",
)

logger = logging.getLogger("wakuwaku.logs.iggy")

_T = TypeVar("_T")

USERNAME_ENV = "WAKUWAKU_IGGY_USERNAME"
"""The user name used when the URL names none."""
PASSWORD_ENV = "WAKUWAKU_IGGY_PASSWORD"
"""The password used when the URL names none (never printed)."""

_MAX_PARTITIONS = 1000
_SYNC_EVERY = 0.5  # seconds between a member's assignment syncs
_DROP_SETTLE = 0.1  # seconds close() gives a dropped client's runtime to end

# Binary commands apache-iggy 0.9.0 does not wrap (codes of the server's protocol).
_GET_OFFSET = 120
_STORE_OFFSET = 121
_DELETE_OFFSET = 122
_SYNC_GROUP = 606
_KIND_CONSUMER = 1
_KIND_GROUP = 2
_ACK_QUORUM = 1

_generations = itertools.count(1)


def iggy_partition(key: str | bytes, partitions: int) -> int:
    """Iggy's message-key partitioning: xxHash32 of the key bytes (seed 0) mod ``partitions``.

    The server's ``Partitioning::messages_key`` (``core/common/src/utils/hash.rs``);
    a str key is UTF-8 encoded.
    """
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return int(xxhash.xxh32_intdigest(raw, seed=0)) % partitions


def _derived(topic: str) -> bool:
    """True for an engine-made topic name (the one rule, :mod:`wakuwaku._topics`)."""
    return split_derived_topic(topic) is not None


@dataclass
class _Joined:
    """One Iggy consumer-group membership of a member (one topic)."""

    partitions: dict[int, int] = field(default_factory=dict)  # partition -> lease generation
    server_generation: int = -1


class _Member:
    """One group member: a connection of its own (Iggy's group members are
    sessions), the topics whose Iggy consumer group it joined, and a task
    that asks the server for its assignment every :data:`_SYNC_EVERY` seconds."""

    def __init__(self, group: str, member: str, client: IggyClient | None) -> None:
        self.group = group
        self.member = member
        self.client = client
        self.topics: dict[str, _Joined] = {}
        self.held: set[tuple[str, int]] = set()
        self.joining = asyncio.Lock()
        self.changed = asyncio.Event()  # replaced at each change: waiters keep theirs
        self.task: asyncio.Task[None] | None = None

    def bump(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()


class IggyLog(Log):
    """A :class:`~wakuwaku.logs.Log` on Apache Iggy (``iggy://user:password@host:port``).

    :param address: the server's TCP ``host:port``.
    :param username: / :param password: the Iggy user (never printed).
    :param stream: the Iggy stream holding the log's topics (created on first use).
    :param timeout: the bound of every call to the server (seconds, finite,
        > 0); past it the call raises :class:`~wakuwaku.LogUnavailableError`.

    Ownership: :meth:`acquire_partition` joins the Iggy consumer group
    ``<group>`` of the topic as ``member`` (one connection per member) and
    answers from the assignment the server gives it; ``ttl`` decides
    nothing. The server moves a partition at once when a member joins or
    leaves, and when a member's connection closes (a member that stops
    answering pings loses its partitions after the server's heartbeat
    window, 36 s by default). Each member asks for its assignment every
    0.5 s and before each fenced write.

    What a member that lost a partition can still write (Iggy has no
    transactions and no conditional append): an append or commit that began
    its ownership check before the server moved the partition (one round
    trip and the write itself); its commits of the partition it owned are
    refused by the server (the consumer-group offset fence), its appends
    to retry and dead-letter topics are not.

    :raises ConfigError: for a bad address, stream name or timeout.
    """

    commits_zero = False
    """Iggy stores the last record consumed: a committed 0 reads back as None."""
    max_record_size = MAX_PAYLOAD - HEADER_ROOM
    """The largest record (body and headers, bytes) on a main topic."""

    def __init__(
        self,
        address: str = "127.0.0.1:8090",
        *,
        username: str | None = None,
        password: str | None = None,
        stream: str = "wakuwaku",
        timeout: float = 5.0,
    ) -> None:
        check_servers("Iggy", address, "iggy://user:password@host:port")
        if "," in address:
            raise ConfigError("an Iggy log names one server: iggy://user:password@host:port")
        if not isinstance(stream, str) or not stream or len(stream.encode()) > MAX_NAME:
            raise ConfigError(f"an Iggy stream name takes 1-255 bytes, got {stream!r}")
        timeout = float(check_timeout(timeout))
        self.address = address
        self.stream = stream
        self.url = log_url(
            "iggy", address, [("stream", stream, "wakuwaku"), ("timeout", timeout, 5.0)]
        )
        self._server = Server(
            address,
            username or os.environ.get(USERNAME_ENV) or "iggy",
            password if password is not None else os.environ.get(PASSWORD_ENV, ""),
            stream,
            timeout,
            self.url,
        )
        self._messages = Messages(self._server)
        self._members: dict[tuple[str, str], _Member] = {}
        self._tokens = AppendTokens()

    def __repr__(self) -> str:
        return f"IggyLog({self.url!r})"

    @property
    def timeout(self) -> float:
        """The bound of every call to the server (seconds); set, it bounds the calls made after."""
        return self._server.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._server.timeout = value

    @property
    def _password(self) -> str:
        """The Iggy user's password (never printed)."""
        return self._server.password

    def partition_for(self, key: str | bytes, partitions: int) -> int:
        """Iggy's message-key partitioning (:func:`iggy_partition`)."""
        return iggy_partition(key, partitions)

    # -- members' connections ---------------------------------------------

    async def _on_member(
        self, member: _Member, what: str, call: Callable[[IggyClient], Awaitable[_T]]
    ) -> _T:
        """``call`` on the member's own connection. A connection that fails is
        dropped with its memberships (a new session is no member of anything):
        the engine sees its partitions gone and acquires them again, joining anew.
        """
        if member.client is None:
            member.client = await self._server.connect()
        client = member.client
        try:
            return await self._server.bounded(what, lambda: call(client))
        except LogUnavailableError:
            if member.client is client:
                member.client = None
                if member.topics:
                    member.topics.clear()
                    member.held.clear()
                    member.bump()
            raise

    # -- topics ---------------------------------------------------------------

    async def create_topic(
        self, topic: str, partitions: int, *, derived_from: str | None = None
    ) -> TopicInfo:
        """Create the Iggy topic ``topic`` in the log's stream; see :meth:`Log.create_topic`.

        ``derived_from`` (or a derived name, ``wk-retry.`` / ``wk-dlq.`` /
        ``wk-replayed.``) gives the topic :data:`HEADER_ROOM` more bytes per
        record in this instance.

        :raises ConfigError: for a bad name (over 255 bytes of UTF-8 too) or
            a count outside 1..1000 (Iggy's limit).
        :raises PartitionCountMismatch: when the topic exists with another count.
        """
        check_name(topic)
        if (
            isinstance(partitions, bool)
            or not isinstance(partitions, int)
            or not 1 <= partitions <= _MAX_PARTITIONS
        ):
            raise ConfigError(
                f"topic {topic!r}: partition count must be >= 1 (at most 1000 on Iggy), "
                f"got {partitions!r}"
            )
        if derived_from is not None or _derived(topic):
            self._messages.mark_derived(topic)
        existing = await self._server.create_topic(topic, partitions)
        if existing != partitions:
            raise PartitionCountMismatch(topic, existing, partitions)
        return TopicInfo(topic, partitions)

    async def describe_topic(self, topic: str) -> TopicInfo:
        return TopicInfo(topic, await self._server.partitions(topic, fresh=True))

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic of the log's stream, by name (none while the stream does not exist)."""
        return await self._server.list_topics()

    async def delete_topic(self, topic: str) -> bool:
        """Delete the Iggy topic with its records, consumer groups and stored offsets.

        This instance's members leave nothing behind: their memberships of
        the topic's consumer groups go with it.

        :returns: False when there was no such topic.
        """
        if not await self._server.delete_topic(topic):
            return False
        self._messages.forget(topic)
        for member in self._members.values():
            if member.topics.pop(topic, None) is not None:
                member.held = {h for h in member.held if h[0] != topic}
                member.bump()
        return True

    # -- records --------------------------------------------------------------

    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[OutgoingRecord],
        *,
        fence: Lease | None = None,
        token: str | None = None,
    ) -> list[int]:
        """Send ``records`` to one partition as one Iggy batch; returns their offsets.

        With ``fence``, the member must own the fence's partition now (asked
        of the server right before the send). A ``token`` is remembered by
        this instance once the server confirmed the batch; Iggy keeps no
        token: a send whose answer was lost may have been stored, and
        sending it again may store it twice.

        :raises ConfigError: for a record over the topic's limit (naming it);
            nothing is written.
        :raises FencedError: when the fence's partition is no longer this
            member's; nothing is written.
        """
        check_token(token)
        checked = [(check_record(h, b), b) for h, b in records]
        check_partition(topic, partition, await self._server.partitions(topic))
        if not checked:
            return []
        done = self._tokens.get(topic, partition, token, len(checked))
        if done is not None:
            if fence is not None:
                await self._fence_owner(fence)
            return done
        messages = [self._messages.message(topic, partition, h, bytes(b)) for h, b in checked]
        if fence is not None:
            await self._fence_owner(fence)
        offsets = await self._messages.send(topic, partition, messages)
        self._tokens.put(topic, partition, token, offsets)
        return offsets

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        wait: float = 0.0,
    ) -> list[Record]:
        """Poll up to ``max_records`` records from ``offset`` on (by offset, storing nothing).

        With ``wait``, polls again every 20 ms until a record is there or
        ``wait`` seconds have passed.
        """
        check_partition(topic, partition, await self._server.partitions(topic))
        return await self._messages.read(topic, partition, offset, max_records, wait)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        return await self._server.end_offsets(topic)

    async def start_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset of the first stored record (the end when none)."""
        return await self._messages.start_offsets(topic)

    # -- offsets ----------------------------------------------------------------

    def _offset_request(
        self, kind: int, consumer: str, topic: str, partition: int, tail: bytes = b""
    ) -> bytes:
        return (
            bytes((kind,))
            + ident(consumer)
            + ident(self.stream)
            + ident(topic)
            + b"\x01"
            + struct.pack("<I", partition)
            + tail
        )

    async def _stored(self, kind: int, group: str, topic: str, p: int) -> int:
        """The stored offset (Iggy's: the last consumed record), -1 when none."""
        request = self._offset_request(kind, group, topic, p)
        answer = await self._server.call(
            f"committed offset {topic}/{p}",
            lambda c: c.send_binary_request(_GET_OFFSET, request),
        )
        if len(answer) < 20:
            return -1
        return int(struct.unpack_from("<Q", answer, 12)[0])

    async def group_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """Committed offsets on ``topic`` of every group that has an Iggy consumer
        group on it: group -> partition -> next offset to read.

        Iggy lists consumer groups per topic, not the consumers that stored
        offsets: a group that only ever committed without joining (a tool's
        ``commit``, a consumer without ownership), and a group's offsets on
        its retry topic (whose partitions belong to the main topic's members,
        outside any Iggy group), are not listed. A group with nothing stored
        is left out.

        :raises UnknownTopicError: when the topic does not exist.
        :raises LogUnavailableError: when the server does not answer.
        """
        count = await self._server.partitions(topic)
        groups = await self._server.call(
            f"list groups of {topic}", lambda c: c.get_consumer_groups(self.stream, topic)
        )
        out: dict[str, dict[int, int]] = {}
        for name in sorted({g.name for g in groups}):
            stored = {p: await self._stored(_KIND_CONSUMER, name, topic, p) for p in range(count)}
            offsets = {p: o + 1 for p, o in stored.items() if o >= 0}
            if offsets:
                out[name] = offsets
        return out

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset: the next offset to read (Iggy stores the
        last record consumed; this is one past it). None when none was stored,
        the topic is gone, or the group committed 0 (Iggy cannot store "before
        the first record")."""
        check_group(group)
        count = await self._server.partitions_or_none(topic)
        if count is None:
            return None
        check_partition(topic, partition, count)
        try:
            stored = await self._stored(_KIND_CONSUMER, group, topic, partition)
        except LogUnavailableError:
            raise
        except LogError:
            if await self._server.partitions_or_none(topic, fresh=True) is None:
                return None
            raise
        return None if stored < 0 else stored + 1

    async def commit(
        self,
        group: str,
        topic: str,
        partition: int,
        offset: int,
        *,
        fence: Lease | None = None,
    ) -> None:
        """Store the group's position (the next offset to read) on the server.

        Iggy stores the last record consumed, so ``offset`` N is stored as
        N - 1, as the offset of the Iggy consumer ``<group>``; 0 deletes it.
        With ``fence``, the member must own the partition
        now (asked of the server); when the partition is the member's own
        (not a retry partition of it), the offset also passes the server's
        consumer-group offset fence, which refuses a member that no longer
        owns it.

        :raises ConfigError: as :meth:`Log.commit`, and for an offset past the
            partition's end offset (Iggy stores offsets of records only).
        :raises FencedError: as :meth:`Log.commit`.
        """
        offset = check_commit(group, topic, partition, offset)
        check_group(group)
        check_partition(topic, partition, await self._server.partitions(topic))
        owner: _Member | None = None
        if fence is not None:
            if fence.group != group:
                raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
            owner = await self._fence_owner(fence)
            if (fence.topic, fence.partition) != (topic, partition):
                owner = None  # a retry partition: not in the member's Iggy group
        if offset == 0:
            await self._delete_offset(_KIND_CONSUMER, group, topic, partition)
            return
        if owner is not None:
            await self._store(owner, _KIND_GROUP, group, topic, partition, offset - 1)
        await self._store(None, _KIND_CONSUMER, group, topic, partition, offset - 1)

    async def _store(
        self, owner: _Member | None, kind: int, group: str, topic: str, partition: int, stored: int
    ) -> None:
        """Store ``stored`` as Iggy's offset: the group's (``_KIND_GROUP``, on
        ``owner``'s connection, fenced by the server) or the consumer's named
        ``group`` (``_KIND_CONSUMER``, on the log's connection)."""
        request = self._offset_request(
            kind, group, topic, partition, struct.pack("<Q", stored) + bytes((_ACK_QUORUM,))
        )

        def send(client: IggyClient) -> Awaitable[bytes]:
            return client.send_binary_request(_STORE_OFFSET, request)

        what = f"commit {topic}/{partition}"
        try:
            if owner is not None:
                await self._on_member(owner, what, send)
            else:
                await self._server.call(what, send)
        except LogUnavailableError:
            raise
        except LogError as exc:
            await self._server.unknown_topic(topic)
            if kind == _KIND_GROUP:
                raise FencedError(group, topic, partition, -1) from exc
            ends = await self.end_offsets(topic)
            if stored + 1 > ends.get(partition, 0):
                raise ConfigError(
                    f"commit of group {group!r} on {topic}/{partition}: offset {stored + 1} is "
                    f"past the end offset {ends.get(partition, 0)} (Iggy stores offsets of "
                    "stored records only)"
                ) from exc
            raise

    async def _delete_offset(self, kind: int, group: str, topic: str, partition: int) -> bool:
        if await self._stored(kind, group, topic, partition) < 0:
            return False
        request = self._offset_request(kind, group, topic, partition, bytes((_ACK_QUORUM,)))
        await self._server.call(
            f"delete offset {topic}/{partition}",
            lambda c: c.send_binary_request(_DELETE_OFFSET, request),
        )
        return True

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        """Delete the group's stored offsets and its Iggy consumer groups (on
        ``topic``, or on every topic of the stream); this instance's members
        of it leave first.

        :returns: how many stored offsets were deleted.
        :raises UnknownTopicError: when ``topic`` does not exist.
        """
        check_group(group)
        if topic is not None:
            topics = [TopicInfo(topic, await self._server.partitions(topic, fresh=True))]
        else:
            topics = await self.list_topics()
        for key in [k for k in self._members if k[0] == group]:
            member = self._members[key]
            for name in [t.name for t in topics if t.name in member.topics]:
                await self._leave(member, name)
        deleted = 0
        for info in topics:
            for partition in range(info.partitions):
                if await self._delete_offset(_KIND_CONSUMER, group, info.name, partition):
                    deleted += 1
            await self._drop_group(group, info.name)
        return deleted

    async def _drop_group(self, group: str, topic: str) -> None:
        """Delete the Iggy consumer group ``group`` of ``topic`` when there is one."""
        found = await self._server.call(
            "describe group", lambda c: c.get_consumer_group(self.stream, topic, group)
        )
        if found is not None:
            await self._server.call(
                "delete group", lambda c: c.delete_consumer_group(self.stream, topic, group)
            )

    # -- ownership ------------------------------------------------------------------

    async def _member(self, group: str, member: str) -> _Member:
        key = (group, member)
        found = self._members.get(key)
        if found is None:
            found = self._members.setdefault(key, _Member(group, member, None))
        if found.task is None or found.task.done():
            found.task = asyncio.create_task(
                self._keep_synced(found), name=f"wakuwaku-iggy-member-{member}"
            )
        return found

    async def _sync(self, member: _Member, topic: str) -> _Joined | None:
        """Ask the server for ``member``'s partitions of ``topic`` (its Iggy group).

        :returns: the membership, or None when the server no longer counts
            the member in (it left, its session ended, the group is gone).
        """
        joined = member.topics.get(topic)
        if joined is None:
            return None
        request = ident(self.stream) + ident(topic) + ident(member.group)
        answer = await self._on_member(
            member,
            f"sync group {member.group!r} on {topic}",
            lambda c: c.send_binary_request(_SYNC_GROUP, request),
        )
        now: dict[int, int] = {}
        if len(answer) >= 12:
            server_generation, count = struct.unpack_from("<QI", answer, 0)
            ids = struct.unpack_from(f"<{count}I", answer, 12)
            now = {p: joined.partitions.get(p) or next(_generations) for p in ids}
            joined.server_generation = server_generation
        if now != joined.partitions:
            joined.partitions = now
            member.held &= {(topic, p) for p in now} | {h for h in member.held if h[0] != topic}
            member.bump()
        if len(answer) < 12:
            member.topics.pop(topic, None)
            member.bump()
            return None
        return joined

    async def _keep_synced(self, member: _Member) -> None:
        """The member's assignment, asked every :data:`_SYNC_EVERY` seconds."""
        while not self._server.closed:
            for topic in list(member.topics):
                try:
                    await self._sync(member, topic)
                except LogError as exc:
                    logger.debug("Iggy group %s: sync failed: %s", member.group, exc)
            # Not a blocking call: a fake clock may move meanwhile (each
            # sync's request is one, through Server.bounded).
            await asyncio.sleep(_SYNC_EVERY)

    async def _join(self, member: _Member, topic: str) -> None:
        group = member.group
        found = await self._server.call(
            "describe group", lambda c: c.get_consumer_group(self.stream, topic, group)
        )
        if found is None:
            try:
                await self._server.call(
                    "create group", lambda c: c.create_consumer_group(self.stream, topic, group)
                )
            except LogUnavailableError:
                raise
            except LogError:
                pass  # made by another member meanwhile; the join says if not
        await self._on_member(
            member,
            f"join group {group!r} on {topic}",
            lambda c: c.join_consumer_group(self.stream, topic, group),
        )
        member.topics[topic] = _Joined()

    async def _leave(self, member: _Member, topic: str) -> None:
        if member.topics.pop(topic, None) is None:
            return
        member.held = {h for h in member.held if h[0] != topic}
        member.bump()
        with contextlib.suppress(LogError):  # gone already: the group or the topic
            if member.client is not None:
                await self._on_member(
                    member,
                    f"leave group {member.group!r} on {topic}",
                    lambda c: c.leave_consumer_group(self.stream, topic, member.group),
                )

    async def acquire_partition(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        """A lease while the server assigns ``partition`` to ``member`` in the Iggy
        consumer group ``group`` of ``topic``.

        The member's first call for a topic creates the Iggy group when
        missing and joins it (the server rebalances at once). ``ttl`` only
        sets ``expires_at``.
        """
        check_group(group)
        check_partition(topic, partition, await self._server.partitions(topic))
        owner = await self._member(group, member)
        async with owner.joining:
            if topic not in owner.topics:
                await self._join(owner, topic)
            joined = await self._sync(owner, topic)
        if joined is None:
            return None
        generation = joined.partitions.get(partition)
        if generation is None:
            return None
        owner.held.add((topic, partition))
        return Lease(group, topic, partition, member, generation, time.time() + ttl)

    async def _fence_owner(self, fence: Lease) -> _Member:
        """The member holding ``fence`` now, asked of the server.

        :raises FencedError: when the server no longer assigns the fence's
            partition to it (or another assignment replaced that one).
        """
        member = self._members.get((fence.group, fence.member))
        joined = await self._sync(member, fence.topic) if member is not None else None
        if (
            member is None
            or joined is None
            or joined.partitions.get(fence.partition) != fence.generation
        ):
            raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
        return member

    async def partition_owners(self, group: str, topic: str) -> dict[int, Lease]:
        """Who owns each partition of ``topic`` in ``group`` now, from the server
        (members of every process).

        A member of this instance is named and has its lease generation; a
        member the server lists that this instance does not know is named
        ``iggy-member-<id>`` (Iggy's member id) with generation 0.
        ``expires_at`` is now: Iggy keeps an assignment while the member's
        session lives, with no expiry to show.

        :raises UnknownTopicError: when the topic does not exist.
        """
        check_group(group)
        await self._server.partitions(topic, fresh=True)
        found = await self._server.call(
            "describe group", lambda c: c.get_consumer_group(self.stream, topic, group)
        )
        if found is None:
            return {}
        local = [
            (m.member, j)
            for m in self._members.values()
            if m.group == group and (j := m.topics.get(topic)) is not None
        ]
        now = time.time()
        out: dict[int, Lease] = {}
        for member in found.members:
            partitions = {int(p) for p in member.partitions}
            name, mine = f"iggy-member-{member.id}", None
            for local_name, joined in local:
                if partitions and set(joined.partitions) == partitions:
                    name, mine = local_name, joined
            for partition in sorted(partitions):
                generation = mine.partitions[partition] if mine is not None else 0
                out[partition] = Lease(group, topic, partition, name, generation, now)
        return dict(sorted(out.items()))

    async def ownership_changed(self, group: str, member: str, within: float) -> None:
        """Return when ``member``'s assignment changed, or after ``within`` seconds
        (:class:`~wakuwaku.engine._ownership.AssignmentLog`)."""
        found = self._members.get((group, member))
        if found is None:
            # Joining: the server's answer is real I/O, so a fake clock must
            # not run ahead meanwhile.
            with BLOCKING_CALLS.track():
                await asyncio.sleep(min(within, 0.1))
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(found.changed.wait(), within)

    def ownership_state(self, lease: Lease) -> str:
        """``owned`` while the last answer of the server assigns the lease's partition
        to its member in its generation, else ``gone`` (Iggy moves a partition at
        once: there is no revoking state)."""
        member = self._members.get((lease.group, lease.member))
        joined = member.topics.get(lease.topic) if member is not None else None
        if joined is None or joined.partitions.get(lease.partition) != lease.generation:
            return "gone"
        return "owned"

    async def release_partition(self, lease: Lease) -> None:
        """Let a partition go; the member leaves the topic's Iggy group once it
        holds none of its partitions, and closes its connection once it holds
        nothing."""
        member = self._members.get((lease.group, lease.member))
        if member is None:
            return
        joined = member.topics.get(lease.topic)
        if joined is None or joined.partitions.get(lease.partition) != lease.generation:
            return
        member.held.discard((lease.topic, lease.partition))
        if any(t == lease.topic for t, _ in member.held):
            return
        await self._leave(member, lease.topic)
        if not member.topics:
            await self._drop_member(member)

    async def _drop_member(self, member: _Member) -> None:
        self._members.pop((member.group, member.member), None)
        if member.task is not None:
            member.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await member.task
        for topic in list(member.topics):
            await self._leave(member, topic)

    # -- close ---------------------------------------------------------------------

    async def close(self) -> None:
        """Leave every group and drop the connections; calling it again does nothing."""
        if self._server.closed:
            return
        for member in list(self._members.values()):
            try:
                await self._drop_member(member)
            except LogError as exc:  # the server is away: its session ends with the socket
                logger.debug("Iggy group %s: leaving failed: %s", member.group, exc)
        if self._server.close():
            # Dropping the client lets its Rust runtime end the connection
            # in the background, which calls back into Python. A process
            # that exited at once aborted (SIGABRT, exit 134) about 1 run in
            # 10, its tokio thread taking the GIL during interpreter
            # shutdown; 0.1 s for that to end made it 0 of 200.
            await asyncio.sleep(_DROP_SETTLE)

    # -- URLs ----------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str) -> IggyLog:
        """``iggy://[user[:password]@]host:port[?stream=NAME&timeout=SECONDS]``.

        Without credentials in the URL, ``WAKUWAKU_IGGY_USERNAME`` (default
        ``iggy``) and ``WAKUWAKU_IGGY_PASSWORD`` give them; neither is part
        of :attr:`url` or any message. TLS and personal access tokens are not
        supported yet.

        :raises ConfigError: for a URL without ``host:port`` or a bad option.
        """
        parsed = parse_log_url(url)
        credentials, at, address = parsed.rest.rstrip("/").rpartition("@")
        user = password = None
        if at:
            name, colon, secret = credentials.partition(":")
            user = unquote(name) or None
            password = unquote(secret) if colon else None
        timeout = option_timeout(parsed, "timeout", 5.0)
        return cls(
            address,
            username=user,
            password=password,
            stream=parsed.options.get("stream", "wakuwaku"),
            timeout=timeout,
        )
