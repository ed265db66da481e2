"""The consumer groups' committed offsets on Kafka: read stable, commit, delete.

Owns the offsets consumers (one per group: it never subscribes, so it never
joins the group) that read a group's committed offsets with
``require_stable``, the commits of a group (through the fence owner's
consumer, refused by the broker once the generation moved on; through the
admin API while the group has no member), and the deletion of a group's
offsets. An offset sent in a transaction that has not ended, and a
coordinator not there yet or moving, is asked again, never read as "no
offset".

May call: :mod:`._cluster` (settings, names, calls in threads, the admin
client), a :class:`~._member.Member`'s consumer through
:meth:`~._member.Member.call`. Called by the log (:mod:`._log`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from ..._clock import BLOCKING_CALLS
from ..._errors import FencedError, LogError, LogUnavailableError
from .._base import Lease, check_commit, check_partition
from ._cluster import (
    ADMIN_RENEW,
    FENCED_CODES,
    UNKNOWN_TOPIC_CODES,
    Cluster,
    check_partitions,
    code,
)
from ._member import Member

__all__ = ("GroupOffsets",)


class GroupOffsets:
    """Every group's committed offsets, as one log reads and writes them.

    :param cluster: the log's shared settings and calls.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._consumers: dict[str, Any] = {}  # group -> its offsets consumer
        self._born: dict[str, float] = {}
        self._answered_at: dict[str, float] = {}
        self._retired: list[Any] = []  # offsets consumers replaced, closed at close()

    # -- read ----------------------------------------------------------------------

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset; see :meth:`KafkaLog.committed
        <wakuwaku.logs.kafka.KafkaLog.committed>`."""
        count = await self.cluster.partitions_or_none(topic)
        if count is None:
            return None
        check_partition(topic, partition, count)
        found = await self.fetch(group, [(topic, partition)])
        return found.get((topic, partition))

    async def fetch(
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
        cluster = self.cluster
        tps = (
            None
            if partitions is None
            else [TopicPartition(cluster.name(t), p) for t, p in partitions]
        )
        request = [ConsumerGroupTopicPartitions(cluster.name(group), tps)]

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
                consumer = self._consumer(group)
                return check_partitions(consumer.committed(tps, timeout=cluster.timeout))
            futures = cluster.admin().list_consumer_group_offsets(request, require_stable=True)
            return cluster.future("committed offsets", futures[cluster.name(group)])

        if deadline is None:
            deadline = time.monotonic() + cluster.timeout
        pause = 0.001
        while True:
            waiting: list[str] = []
            last: LogError | None = None
            try:
                answer = await cluster.run("committed offsets", ask)
            except LogUnavailableError as exc:
                cause = exc.__cause__
                waiting.append(f"the group: {cause if cause is not None else 'no answer'}")
                last = exc
                if tps is None:
                    cluster.admin_unavailable()
                else:
                    self._unavailable(group)
            else:
                if tps is None:
                    cluster.admin_answered()
                else:
                    self._answered_at[group] = time.monotonic()
                out = self._answered(answer, waiting)
                if not waiting:
                    return out
            if time.monotonic() > deadline:
                raise LogUnavailableError(
                    f"Kafka log {cluster.url} is unavailable (committed offsets): group {group!r} "
                    f"has no stable answer after {cluster.timeout} s ({'; '.join(waiting)}; an "
                    f"UNSTABLE_OFFSET_COMMIT is a transaction that has not ended)"
                ) from last
            await BLOCKING_CALLS.pause(pause)
            pause = min(pause * 2, 0.05)

    def _consumer(self, group: str) -> Any:
        """The consumer that reads ``group``'s committed offsets (in a thread):
        it never subscribes, so it never joins the group."""
        found = self._consumers.get(group)
        if found is None:
            found = Consumer(
                {
                    **self.cluster.common,
                    "group.id": self.cluster.name(group),
                    "client.id": f"wakuwaku-offsets-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                }
            )
            self._consumers[group] = found
            self._born[group] = time.monotonic()
        return found

    def _unavailable(self, group: str) -> None:
        """As :meth:`Cluster.admin_unavailable <._cluster.Cluster.admin_unavailable>`,
        for ``group``'s offsets consumer: after :data:`~._cluster.ADMIN_RENEW`
        seconds without an answer the next call gets a new one (its
        coordinator looked up again)."""
        now = time.monotonic()
        answered = max(self._answered_at.get(group, 0.0), self._born.get(group, 0.0))
        if group in self._consumers and now - answered > ADMIN_RENEW:
            old = self._consumers.pop(group)
            self._retired.append(old)  # closed with the log: a call may still use it

    def _answered(self, answer: Any, waiting: list[str]) -> dict[tuple[str, int], int]:
        """The offsets of an offset fetch's answer; the partitions answered
        with a condition that passes go to ``waiting``.

        :raises LogError: for a partition the coordinator refuses.
        """
        out: dict[tuple[str, int], int] = {}
        for tp in getattr(answer, "topic_partitions", answer) or ():
            where = f"{self.cluster.plain(tp.topic)}/{tp.partition}"
            if tp.error is not None:
                if tp.error.code() in UNKNOWN_TOPIC_CODES:
                    continue  # a topic deleted: no offset on it
                error = self.cluster.error(f"committed offset of {where}", KafkaException(tp.error))
                if not isinstance(error, LogUnavailableError):
                    raise error
                waiting.append(f"{where}: {tp.error.name()}")
            elif tp.offset >= 0:
                out[(self.cluster.plain(tp.topic), tp.partition)] = tp.offset
        return out

    async def of_topic(self, topic: str) -> dict[str, dict[int, int]]:
        """Every group's committed offsets on ``topic``; see :meth:`KafkaLog.group_offsets
        <wakuwaku.logs.kafka.KafkaLog.group_offsets>`."""
        cluster = self.cluster
        await cluster.partitions(topic)

        def groups() -> Any:
            return cluster.future("list groups", cluster.admin().list_consumer_groups())

        listing = await cluster.run("list groups", groups)
        out: dict[str, dict[int, int]] = {}
        for g in listing.valid:
            gid = g.group_id
            if not gid.startswith(cluster.prefix) or gid.startswith("wakuwaku-reader-"):
                continue
            found = await self.fetch(cluster.plain(gid), None)
            mine = {p: o for (t, p), o in found.items() if t == topic}
            if mine:
                out[cluster.plain(gid)] = mine
        return out

    # -- commit ----------------------------------------------------------------------

    async def commit(
        self,
        group: str,
        topic: str,
        partition: int,
        offset: int,
        member: Member | None,
        fence: Lease | None,
    ) -> None:
        """Store the group's offset through ``member`` (the fence owner, or
        any local member of the group), or through the admin API when there
        is none; see :meth:`KafkaLog.commit <wakuwaku.logs.kafka.KafkaLog.commit>`.

        :raises LogUnavailableError: when the offset is not stored after
            ``timeout`` seconds, or the cluster does not answer.
        :raises FencedError: when the broker refuses the member's commit.
        """
        cluster = self.cluster
        tp = TopicPartition(cluster.name(topic), partition, offset)
        if member is not None:
            await self.commit_through(member, [tp], fence)
            return
        request = [ConsumerGroupTopicPartitions(cluster.name(group), [tp])]

        def alter() -> None:
            futures = cluster.admin().alter_consumer_group_offsets(request)
            check_partitions(cluster.future("commit", futures[cluster.name(group)]))

        # The answer's per-partition error is the broker saying the offset is
        # not stored (a coordinator still loading on a fresh broker): asked
        # again, and what is stored is read back before the commit returns.
        deadline = time.monotonic() + cluster.timeout
        while True:
            await cluster.idempotent(f"commit {topic}/{partition}", alter, deadline)
            found = await self.fetch(group, [(topic, partition)], deadline)
            if found.get((topic, partition)) == offset:
                return
            if time.monotonic() > deadline:
                raise LogUnavailableError(
                    f"Kafka log {cluster.url} is unavailable (commit {topic}/{partition}): "
                    f"group {group!r} reads {found.get((topic, partition))} back, not the "
                    f"{offset} committed, after {cluster.timeout} s"
                )
            await BLOCKING_CALLS.pause(0.05)

    async def commit_all(
        self, member: Member, group: str, commits: Sequence[tuple[str, int, int]], fence: Lease
    ) -> None:
        """Commit a batch's offsets (no records) through the fence owner ``member``.

        :raises ConfigError: for an offset the contract refuses.
        :raises UnknownTopicError: / :raises PartitionCountMismatch: for a bad partition.
        :raises FencedError: / :raises LogUnavailableError: as :meth:`commit_through`.
        """
        tps = []
        for topic, partition, offset in commits:
            checked = check_commit(group, topic, partition, offset)
            check_partition(topic, partition, await self.cluster.partitions(topic))
            tps.append(TopicPartition(self.cluster.name(topic), partition, checked))
        await self.commit_through(member, tps, fence)

    async def commit_through(self, member: Member, tps: list[Any], fence: Lease | None) -> None:
        """Commit through the member's consumer; the broker's answer, partition
        by partition, says the offsets are stored.

        A coordinator not there yet or moving (a fresh broker, one back from
        a freeze or a restart) is asked again until ``timeout``; a commit
        refused by generation raises :class:`FencedError` at once.

        :raises LogUnavailableError: when the offsets are still not stored
            after ``timeout`` seconds.
        :raises FencedError: when the broker refuses them by generation (with ``fence``).
        """
        timeout = self.cluster.timeout

        def commit() -> None:
            check_partitions(
                member.call(lambda: member.consumer.commit(offsets=tps, asynchronous=False)).result(
                    timeout
                )
            )

        deadline = time.monotonic() + timeout
        while True:
            try:
                await self.cluster.run("commit", commit)
                return
            except LogError as exc:
                if code(exc.__cause__ or exc) in FENCED_CODES:
                    if fence is not None:
                        raise FencedError(
                            fence.group, fence.topic, fence.partition, fence.generation
                        ) from exc
                    raise
                if not isinstance(exc, LogUnavailableError) or time.monotonic() > deadline:
                    raise
            await BLOCKING_CALLS.pause(0.05)

    # -- delete ------------------------------------------------------------------------

    async def delete(self, group: str, topic: str | None) -> int:
        """Delete the group's committed offsets (all, or on ``topic``); its
        members must have left. See :meth:`KafkaLog.delete_group
        <wakuwaku.logs.kafka.KafkaLog.delete_group>`.

        :returns: how many committed offsets were deleted.
        :raises LogError: when the group still has members after ``timeout`` seconds.
        """
        cluster = self.cluster
        everything = found = await self.fetch(group, None)
        if topic is not None:
            found = {k: v for k, v in found.items() if k[0] == topic}
        if not found:
            if topic is None:  # offsets on deleted topics may linger in the group
                await self._while_not_empty(group, lambda: self._drop_group(group))
            return 0
        name = cluster.name(group)

        kept = {k: v for k, v in everything.items() if k not in found}

        def delete() -> None:
            # confluent-kafka has no OffsetDelete call: the group goes, and the
            # offsets on other topics are stored again (its members are stopped).
            admin = cluster.admin()
            cluster.future("delete group", admin.delete_consumer_groups([name])[name])
            if kept:
                tps = [TopicPartition(cluster.name(t), p, o) for (t, p), o in kept.items()]
                request = [ConsumerGroupTopicPartitions(name, tps)]
                check_partitions(
                    cluster.future("commit", admin.alter_consumer_group_offsets(request)[name])
                )

        await self._while_not_empty(group, delete)
        return len(found)

    async def _while_not_empty(self, group: str, delete: Callable[[], None]) -> None:
        """Run ``delete`` (a group deletion, in a thread), again while the
        coordinator still lists members (``NON_EMPTY_GROUP``), up to ``timeout``."""
        deadline = time.monotonic() + self.cluster.timeout
        while True:
            try:
                await self.cluster.run("delete group", delete)
                return
            except LogError as exc:
                cause = exc.__cause__
                if cause is None or code(cause) != KafkaError.NON_EMPTY_GROUP:
                    raise
                if time.monotonic() > deadline:
                    raise LogError(
                        f"Kafka log {self.cluster.url}: group {group!r} still has members after "
                        f"{self.cluster.timeout} s: stop its consumers first"
                    ) from exc
                await BLOCKING_CALLS.pause(0.1)

    def _drop_group(self, group: str) -> None:
        """Delete the Kafka consumer group itself; a group that is not there is fine."""
        name = self.cluster.name(group)
        try:
            self.cluster.future(
                "delete group", self.cluster.admin().delete_consumer_groups([name])[name]
            )
        except KafkaException as exc:
            if "does not exist" not in str(exc).lower():  # GROUP_ID_NOT_FOUND
                raise

    def detach(self) -> list[Any]:
        """Forget every offsets consumer (the log is closing). :returns: them, to close."""
        consumers = [*self._consumers.values(), *self._retired]
        self._consumers, self._retired = {}, []
        return consumers
