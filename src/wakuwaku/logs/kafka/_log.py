"""The :class:`KafkaLog` facade: the log contract on Kafka, put together from its parts.

Owns the log's construction (settings, URL), the topics' creation and
deletion, the members of this process (one :class:`~._member.Member` per
group and member id) and the fence check every fenced write starts with,
and hands each contract call to the part that does it:

- :mod:`._cluster`: settings, names, calls in threads, errors, topic cache;
- :mod:`._append`: plain appends (the idempotent producer);
- :mod:`._read`: reads and start/end offsets;
- :mod:`._offsets`: committed offsets, commits, group deletion;
- :mod:`._ownership` (through each member): who owns which partition;
- :mod:`._transactions`: the transactional store.

May call: all of them. Called by :mod:`wakuwaku.logs` (``open_log``) and
users of ``wakuwaku.logs.kafka``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from confluent_kafka import KafkaException, TopicPartition

from ..._clock import BLOCKING_CALLS
from ..._errors import ConfigError, FencedError
from ..._topics import kept_forever, split_derived_topic
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
    check_read,
    check_records,
    check_token,
)
from .._url import (
    check_servers,
    check_timeout,
    log_url,
    option_bool,
    option_timeout,
    parse_log_url,
)
from ._append import Appender
from ._cluster import LEGAL_TOPIC, Cluster
from ._member import Member
from ._offsets import GroupOffsets
from ._ownership import OwnershipState
from ._read import Readers
from ._transactions import Transactions, transactional_producer

__all__ = (
    "DEFAULT_MAX_MESSAGE_BYTES",
    "HEADER_ROOM",
    "PASSWORD_ENV",
    "USERNAME_ENV",
    "KafkaLog",
    "derived_main_topic",
)

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


def derived_main_topic(topic: str) -> str | None:
    """The main topic of an engine-made topic (``[ns.]wk-retry.<group>.<main>``,
    ``wk-dlq.``, ``wk-replayed.``), or None for any other topic."""
    split = split_derived_topic(topic)
    return None if split is None else split[0] + split[3]


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
        if prefix and not LEGAL_TOPIC.fullmatch(prefix):
            raise ConfigError(f"a Kafka log prefix takes [A-Za-z0-9._-] only, got {prefix!r}")
        timeout = check_timeout(timeout)
        if session_timeout < 6:
            raise ConfigError(f"session_timeout must be >= 6 seconds, got {session_timeout!r}")
        self.hosts = hosts
        self.prefix = prefix
        self.transactions = transactions
        self.atomic_store = transactions
        self.session_timeout = float(session_timeout)
        self.revoke_timeout = float(revoke_timeout)
        self.max_message_bytes = int(max_message_bytes)
        # The security settings stay out of the url: with credentials they are
        # derived from them, and another process takes both from its own
        # URL or environment.
        self.url = log_url(
            "kafka",
            ",".join(hosts),
            [
                ("prefix", prefix, ""),
                ("timeout", float(timeout), 10.0),
                ("transactions", bool(transactions), True),
            ],
        )
        self._cluster = Cluster(
            hosts, prefix=prefix, timeout=float(timeout), security=security, url=self.url
        )
        self._common = self._cluster.common
        self._appender = Appender(self._cluster)
        self._readers = Readers(self._cluster)
        self._offsets = GroupOffsets(self._cluster)
        self._transactions = Transactions(self, self._cluster)
        self._members: dict[tuple[str, str], Member] = {}
        self._tokens = AppendTokens()

    def __repr__(self) -> str:
        return f"KafkaLog({self.url!r})"

    @property
    def timeout(self) -> float:
        """The bound of every call to the cluster (seconds); set, it bounds the calls made after."""
        return self._cluster.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._cluster.timeout = value

    def _name(self, name: str) -> str:
        """The Kafka name of a topic or group: ``name`` under the prefix."""
        return self._cluster.name(name)

    # -- topics -------------------------------------------------------------

    async def create_topic(
        self, topic: str, partitions: int, *, derived_from: str | None = None
    ) -> TopicInfo:
        """Create ``topic`` through the admin API; see :meth:`Log.create_topic`.

        Replication factor: the broker's ``default.replication.factor``.
        ``max.message.bytes``: the log's ``max_message_bytes``, plus
        :data:`HEADER_ROOM` for the engine's retry, dead-letter and replay
        topics: those created with ``derived_from`` (configured names
        included) and those with a derived name (``wk-retry.``, ``wk-dlq.``,
        ``wk-replayed.``: a replay ledger made by ``wakuwaku dlq replay``).
        ``retention.ms`` and ``retention.bytes`` -1 (kept forever) for the
        engine's state topics (a group's control topic, the topic-names
        topic): the broker's default of 7 days would forget a pause. A
        topic deleted just before is waited for (bounded) while the broker
        finishes the deletion; it is never taken for an existing topic.

        :raises PartitionCountMismatch: when the topic exists with another count.
        :raises LogUnavailableError: when a topic of that name is still being
            deleted after ``timeout`` seconds, or the cluster does not answer.
        """
        cluster = self._cluster
        cluster.check_name(topic)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"topic {topic!r}: partition count must be >= 1, got {partitions!r}")
        derived = derived_from is not None or derived_main_topic(topic) is not None
        limit = self.max_message_bytes + (HEADER_ROOM if derived else 0)
        await cluster.create_topic(topic, partitions, limit, forever=kept_forever(topic))
        return TopicInfo(topic, partitions)

    async def describe_topic(self, topic: str) -> TopicInfo:
        return TopicInfo(topic, await self._cluster.partitions(topic, fresh=True))

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic under the prefix (Kafka's internal ``__*`` topics left out), by name."""
        return [TopicInfo(name, count) for name, count in await self._cluster.topics()]

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
        cluster = self._cluster
        cluster.check_name(topic)
        if await cluster.partitions_or_none(topic, fresh=True) is None:
            return False
        await self._readers.close_topic(topic)
        # Its consumers must be stopped already: members subscribed to it leave
        # their groups, so the topic's assignments go with it.
        for owner in [k for k, m in self._members.items() if topic in m.topics]:
            member = self._members.pop(owner)
            await cluster.run("leave group", member.close)
        if not await cluster.delete_topic(topic):
            return False
        await self._appender.drop()
        await cluster.wait_deleted(topic)
        return True

    async def max_message_bytes_of(self, topic: str) -> int:
        """The topic's ``max.message.bytes`` (read once, then cached)."""
        return await self._cluster.max_message_bytes(topic)

    # -- append and read ---------------------------------------------------------

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
        outgoing = check_records(records)
        count = await self._cluster.partitions(topic)
        check_partition(topic, partition, count)
        if not outgoing:
            return []
        done = self._tokens.get(topic, partition, token, len(outgoing))
        if done is not None:
            if fence is not None:
                self._fence_owner(fence)
            return done
        await self._cluster.check_size(topic, partition, outgoing)
        if fence is not None:
            self._fence_owner(fence)
        offsets = await self._appender.append(topic, partition, outgoing)
        self._tokens.put(topic, partition, token, offsets)
        return offsets

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
        offset, max_records, wait = check_read(topic, partition, offset, max_records, wait)
        return await self._readers.read(topic, partition, offset, max_records, wait)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the last stable offset (``read_committed``): past the
        last committed record and any transaction marker after it."""
        return await self._readers.end_offsets(topic)

    async def start_offsets(self, topic: str) -> dict[int, int]:
        return await self._readers.start_offsets(topic)

    # -- offsets -----------------------------------------------------------------

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset (None when none, or the topic is gone).

        Read with ``require_stable``: an offset of a transaction in flight
        (or just committed, its markers not written yet) is waited for,
        never read half-done nor as "no offset".

        None only when the group coordinator answered for the partition
        without an error: a coordinator not there yet or moving is asked
        again (through the group's offsets consumer, see
        :meth:`GroupOffsets.fetch <._offsets.GroupOffsets.fetch>`).

        :raises LogUnavailableError: when it stays in an open transaction, or
            the coordinator gives no answer, for ``timeout`` seconds.
        """
        return await self._offsets.committed(group, topic, partition)

    async def group_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """Every group's committed offsets on ``topic`` (for ``wakuwaku status``)."""
        return await self._offsets.of_topic(topic)

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
        check_partition(topic, partition, await self._cluster.partitions(topic))
        member: Member | None
        if fence is not None:
            if fence.group != group:
                raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
            member = self._fence_owner(fence)
        else:
            member = next((m for m in self._members.values() if m.group == group), None)
        await self._offsets.commit(group, topic, partition, offset, member, fence)

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
            await self._cluster.partitions(topic)
        for key in [k for k in self._members if k[0] == group]:
            member = self._members.pop(key)
            await self._cluster.run("leave group", member.close)
        return await self._offsets.delete(group, topic)

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
        cluster = self._cluster
        tps = [TopicPartition(cluster.name(topic), p, o) for p, o in targets.items()]

        def delete() -> None:
            for fut in cluster.admin().delete_records(tps).values():
                cluster.future("delete records", fut)

        await cluster.run("apply retention", delete)
        self._readers.rewind(topic)
        return sum(o - starts.get(p, 0) for p, o in targets.items())

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
        check_partition(topic, partition, await self._cluster.partitions(topic))
        key = (group, member)
        found = self._members.get(key)
        owner = found if found is not None else self._new_member(group, member)
        self._members[key] = owner
        joined = await owner.join(topic)
        if joined and self.transactions and owner.txn is None and owner.init_task is None:
            # Soon, not at the first retry write: init_transactions aborts
            # the open transaction a killed predecessor with this member
            # id left, which otherwise holds read_committed readers back.
            owner.init_task = asyncio.ensure_future(self._transactions.start(owner))
        generation = owner.assignment.acquire(topic, partition)
        if generation is None:
            return None
        return Lease(group, topic, partition, member, generation, time.time() + ttl)

    def _new_member(self, group: str, member: str) -> Member:
        return Member(
            self._cluster,
            group,
            member,
            session_timeout=self.session_timeout,
            revoke_timeout=self.revoke_timeout,
        )

    async def partition_owners(self, group: str, topic: str) -> dict[int, Lease]:
        """Who owns each partition of ``topic`` in ``group`` now, from the group
        coordinator (members of every process: ``DescribeGroups``).

        A member of this process has its lease generation; another process's
        has generation 0 (its numbers are its own). ``expires_at`` is now
        plus the session timeout.

        :raises UnknownTopicError: when the topic does not exist.
        """
        cluster = self._cluster
        await cluster.partitions(topic, fresh=True)
        name, full = cluster.name(group), cluster.name(topic)

        def describe() -> Any:
            futures = cluster.admin().describe_consumer_groups([name])
            return cluster.future("describe group", futures[name])

        found = await cluster.run("describe group", describe)
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
            await self._cluster.run("leave group", member.close)

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
        if fence is not None and self.transactions and write.appends:
            return await self._transactions.store(write, fence)
        if fence is not None and not write.appends and write.commits:
            if fence.group != write.group:
                raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
            member = self._fence_owner(fence)
            await self._offsets.commit_all(member, write.group, write.commits, fence)
            return []
        return await super().store(write, fence=fence)

    def _transactional(self, member: Member) -> Any:
        """The member's transactional producer, made at its first transaction (in
        a thread). The transactions ask the log for it: the log makes its
        clients (and a test hands them a scripted producer here)."""
        return transactional_producer(self._cluster, member)

    async def _transact(
        self,
        member: Member,
        batches: list[tuple[str, int, Sequence[OutgoingRecord]]],
        offsets: list[Any],
        commits: list[tuple[str, int, int]],
    ) -> list[list[int]]:
        """One transaction on a thread of its own, bounded
        (:meth:`Transactions.transact <._transactions.Transactions.transact>`)."""
        return await self._transactions.transact(member, batches, offsets, commits)

    def _transaction(
        self,
        member: Member,
        batches: list[tuple[str, int, Sequence[OutgoingRecord]]],
        offsets: list[Any],
        commits: list[tuple[str, int, int]],
    ) -> list[list[int]]:
        """One transaction in the calling thread
        (:meth:`Transactions.transaction <._transactions.Transactions.transaction>`)."""
        return self._transactions.transaction(member, batches, offsets, commits)

    # -- close -------------------------------------------------------------------------

    async def close(self) -> None:
        """Leave every group, close readers and producers; calling it again does nothing."""
        if self._cluster.closed:
            return
        members, self._members = list(self._members.values()), {}
        readers = self._readers.detach()
        for member in members:
            # A store in flight finishes its transaction first: an open one
            # would hold every read_committed reader of its partitions back
            # (the last stable offset) until transaction.timeout.ms.
            async with member.txn_lock:
                member.closing = True
        offsets = self._offsets.detach()

        def shut() -> None:
            for member in members:
                member.close()
            for consumer in [*offsets, *readers]:
                with contextlib.suppress(KafkaException, RuntimeError):
                    consumer.close()
            self._appender.close()

        with BLOCKING_CALLS.track():
            await asyncio.to_thread(shut)
        self._cluster.closed = True

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
