"""An in-memory log, for tests and for users' unit tests.

Nothing is persisted; several event loops or threads of one process may use
one instance (a lock guards every change). Offsets are dense from 0.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

from .._errors import ConfigError, FencedError, PartitionCountMismatch, UnknownTopicError
from .._records import Record
from ._base import (
    AppendTokens,
    BatchWrite,
    Lease,
    Log,
    OutgoingRecord,
    TopicInfo,
    check_commit,
    check_partition,
    check_read,
    check_record,
    check_token,
    check_topic_name,
)

_WAIT_STEP = 0.005


class MemoryLog(Log):
    """A :class:`~wakuwaku.logs.Log` kept in this process's memory."""

    url = "memory://"
    atomic_store = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens = AppendTokens()
        self._topics: dict[str, list[list[Record]]] = {}
        self._start: dict[tuple[str, int], int] = {}
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._leases: dict[tuple[str, str, int], Lease] = {}

    def _partitions(self, topic: str) -> list[list[Record]]:
        try:
            return self._topics[topic]
        except KeyError:
            raise UnknownTopicError(topic) from None

    async def create_topic(
        self, topic: str, partitions: int, *, derived_from: str | None = None
    ) -> TopicInfo:
        check_topic_name(topic)
        if not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"topic {topic!r}: partition count must be >= 1, got {partitions!r}")
        with self._lock:
            existing = self._topics.get(topic)
            if existing is not None:
                if len(existing) != partitions:
                    raise PartitionCountMismatch(topic, len(existing), partitions)
            else:
                self._topics[topic] = [[] for _ in range(partitions)]
        return TopicInfo(topic, partitions)

    async def describe_topic(self, topic: str) -> TopicInfo:
        with self._lock:
            return TopicInfo(topic, len(self._partitions(topic)))

    async def list_topics(self) -> list[TopicInfo]:
        with self._lock:
            return [TopicInfo(name, len(parts)) for name, parts in sorted(self._topics.items())]

    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[OutgoingRecord],
        *,
        fence: Lease | None = None,
        token: str | None = None,
    ) -> list[int]:
        """Append under one lock hold; see :meth:`Log.append` (``token``: remembered here)."""
        check_token(token)
        checked = [(check_record(headers, body), bytes(body)) for headers, body in records]
        with self._lock:
            self._check_fence(fence)
            done = self._tokens.get(topic, partition, token, len(checked))
            if done is not None:
                return done
            offsets = self._append(topic, partition, checked, time.time())
            self._tokens.put(topic, partition, token, offsets)
            return offsets

    def _append(
        self, topic: str, partition: int, checked: list[tuple[dict[str, bytes], bytes]], now: float
    ) -> list[int]:
        parts = self._partitions(topic)
        check_partition(topic, partition, len(parts))
        log = parts[partition]
        first = self._start.get((topic, partition), 0) + len(log)
        offsets = list(range(first, first + len(checked)))
        log.extend(
            Record(offset, {name: bytes(value) for name, value in headers.items()}, body, now)
            for offset, (headers, body) in zip(offsets, checked, strict=True)
        )
        return offsets

    def _check_fence(self, fence: Lease | None) -> None:
        """:raises FencedError: when ``fence`` is not its partition's current lease."""
        if fence is None:
            return
        current = self._leases.get((fence.group, fence.topic, fence.partition))
        if current is None or current.generation != fence.generation:
            raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)

    async def store(self, write: BatchWrite, *, fence: Lease | None = None) -> list[list[int]]:
        """Write all of ``write`` or nothing, under one lock hold; see :meth:`Log.store`."""
        appends = [
            (
                topic,
                partition,
                [(check_record(headers, body), bytes(body)) for headers, body in records],
            )
            for topic, partition, records in write.appends
        ]
        commits = [
            (topic, partition, check_commit(write.group, topic, partition, offset))
            for topic, partition, offset in write.commits
        ]
        now = time.time()
        with self._lock:
            self._check_fence(fence)
            for topic, partition, _ in appends:
                check_partition(topic, partition, len(self._partitions(topic)))
            for topic, partition, _ in commits:
                check_partition(topic, partition, len(self._partitions(topic)))
            assigned = [
                self._append(topic, partition, checked, now)
                for topic, partition, checked in appends
            ]
            for topic, partition, offset in commits:
                self._offsets[(write.group, topic, partition)] = offset
            return assigned

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        wait: float = 0.0,
    ) -> list[Record]:
        offset, max_records, wait = check_read(topic, partition, offset, max_records, wait)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            with self._lock:
                parts = self._partitions(topic)
                check_partition(topic, partition, len(parts))
                start = self._start.get((topic, partition), 0)
                index = max(0, offset - start)
                found = parts[partition][index : index + max(0, max_records)]
            if found or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(_WAIT_STEP)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        with self._lock:
            parts = self._partitions(topic)
            return {p: self._start.get((topic, p), 0) + len(log) for p, log in enumerate(parts)}

    async def start_offsets(self, topic: str) -> dict[int, int]:
        with self._lock:
            parts = self._partitions(topic)
            return {p: self._start.get((topic, p), 0) for p in range(len(parts))}

    async def commit(
        self,
        group: str,
        topic: str,
        partition: int,
        offset: int,
        *,
        fence: Lease | None = None,
    ) -> None:
        offset = check_commit(group, topic, partition, offset)
        with self._lock:
            parts = self._partitions(topic)
            check_partition(topic, partition, len(parts))
            self._check_fence(fence)
            self._offsets[(group, topic, partition)] = offset

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        with self._lock:
            return self._offsets.get((group, topic, partition))

    async def acquire_partition(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        now = time.time()
        with self._lock:
            current = self._leases.get((group, topic, partition))
            if current is not None and current.member != member and current.expires_at > now:
                return None
            if current is not None and current.member == member:
                generation = current.generation
            else:
                generation = (current.generation if current is not None else 0) + 1
            lease = Lease(group, topic, partition, member, generation, now + ttl)
            self._leases[(group, topic, partition)] = lease
            return lease

    async def partition_owners(self, group: str, topic: str) -> dict[int, Lease]:
        """See :meth:`Log.partition_owners <wakuwaku.logs.Log.partition_owners>`."""
        partitions = await self.describe_topic(topic)
        found: dict[int, Lease] = {}
        for p in range(partitions.partitions):
            lease = self._leases.get((group, topic, p))
            if lease is not None and lease.member:
                found[p] = lease
        return found

    async def release_partition(self, lease: Lease) -> None:
        with self._lock:
            key = (lease.group, lease.topic, lease.partition)
            current = self._leases.get(key)
            if current is not None and current.generation == lease.generation:
                self._leases[key] = Lease(
                    lease.group, lease.topic, lease.partition, "", lease.generation, 0.0
                )

    async def delete_topic(self, topic: str) -> bool:
        with self._lock:
            if self._topics.pop(topic, None) is None:
                return False
            for table in (self._offsets, self._leases):
                for key in [key for key in table if key[1] == topic]:
                    del table[key]
            for start in [start for start in self._start if start[0] == topic]:
                del self._start[start]
            return True

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        with self._lock:
            if topic is not None:
                self._partitions(topic)
            doomed = [
                key
                for key in self._offsets
                if key[0] == group and (topic is None or key[1] == topic)
            ]
            for key in doomed:
                del self._offsets[key]
            for key in [
                key
                for key in self._leases
                if key[0] == group and (topic is None or key[1] == topic)
            ]:
                del self._leases[key]
            return len(doomed)

    async def apply_retention(self, topic: str) -> int:
        with self._lock:
            parts = self._partitions(topic)
            removed = 0
            for p, log in enumerate(parts):
                marks = [o for (g, t, q), o in self._offsets.items() if t == topic and q == p]
                if not marks:
                    continue
                start = self._start.get((topic, p), 0)
                drop = max(0, min(min(marks) - start, len(log)))
                del log[:drop]
                self._start[(topic, p)] = start + drop
                removed += drop
            return removed
