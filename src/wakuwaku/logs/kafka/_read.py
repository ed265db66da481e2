"""The Kafka log's read path: one assign-only ``read_committed`` consumer per partition.

Owns the log's readers (:class:`Reader`: a consumer that never joins a
group, and where it stands), a page read from one of them
(:meth:`Readers.read`: seek, fetch, the partition's last stable offset
where only a transaction marker is left, records with their Kafka key as
``wk-key``), and the partitions' start and end offsets (``ListOffsets``,
``read_committed``).

Kafka offsets are not dense: transaction markers, aborted records and
compaction leave gaps, and a page's ``next_offset`` is the reader's
position past them.

May call: :mod:`._cluster` (settings, names, calls in threads, the admin
client, the topic cache). Called by the log (:mod:`._log`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition

from ..._errors import LogError, LogUnavailableError, UnknownTopicError
from ..._records import H_KEY, Record
from .._base import Page, check_partition
from ._cluster import UNKNOWN_TOPIC_CODES, Cluster, OffsetSpec, code

__all__ = ("Reader", "Readers")

_MARKER_WAIT = 0.5
"""Seconds a read spends finding out that only a transaction marker lies
below the high watermark."""


@dataclass
class Reader:
    """One partition's consumer and the offset its next fetch starts at (-1: seek first)."""

    consumer: Any
    next_offset: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Readers:
    """The log's readers, one per (topic, partition), made at the first read.

    :param cluster: the log's shared settings and calls.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._readers: dict[tuple[str, int], Reader] = {}

    def _new_consumer(self, topic: str, partition: int, offset: int) -> Any:
        consumer = Consumer(
            {
                **self.cluster.common,
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
        consumer.assign([TopicPartition(self.cluster.name(topic), partition, offset)])
        return consumer

    async def _reader(self, topic: str, partition: int, offset: int) -> Reader:
        reader = self._readers.get((topic, partition))
        if reader is None:
            created = Reader(
                await self.cluster.run(
                    "read", lambda: self._new_consumer(topic, partition, offset)
                ),
                offset,
            )
            # Two first reads at once: one reader is kept, the other closed.
            reader = self._readers.setdefault((topic, partition), created)
            if reader is not created:
                await self.cluster.run("close reader", created.consumer.close)
        return reader

    async def read(
        self, topic: str, partition: int, offset: int, max_records: int, wait: float
    ) -> Page:
        """Read up to ``max_records`` committed records from ``offset`` on; see
        :meth:`KafkaLog.read <wakuwaku.logs.kafka.KafkaLog.read>`.

        :raises UnknownTopicError: when the topic does not exist (or was
            deleted under a cached reader).
        :raises LogError: / :raises LogUnavailableError: as
            :meth:`Cluster.run <._cluster.Cluster.run>`.
        """
        check_partition(topic, partition, await self.cluster.partitions(topic))
        reader = await self._reader(topic, partition, offset)
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

            running = asyncio.ensure_future(self.cluster.run("read", fetch))
            try:
                messages, position = await asyncio.shield(running)
            except LogError as exc:
                if exc.__cause__ is not None and code(exc.__cause__) in UNKNOWN_TOPIC_CODES:
                    # Deleted under a reader that had it cached: say so, as
                    # the contract asks, instead of failing each poll alike.
                    self.cluster.forget(topic)
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
            # A fetch from past the end is reset to the earliest offset
            # (``auto.offset.reset``, there for offsets retention removed):
            # what it brought lies below ``offset``, which this read must not
            # return, and the reader stands where it was not asked to.
            reset = bool(messages) and messages[0].error() is None and messages[0].offset() < offset
            if reset:
                messages = [m for m in messages if m.error() is not None or m.offset() >= offset]
                position = offset
            records = self._records(topic, partition, messages)
            following = records[-1].offset + 1 if records else offset
            reader.next_offset = -1 if reset else following  # -1: seek at the next read
            page = Page(records, max(following, position))
            if not records and page.next_offset > offset:
                reader.next_offset = page.next_offset  # the next read starts there
            return page

    def _seek(self, reader: Reader, topic: str, partition: int, offset: int) -> None:
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
        tp = TopicPartition(self.cluster.name(topic), partition, offset)
        try:
            reader.consumer.seek(tp)
        except KafkaException:
            old, reader.consumer = reader.consumer, self._new_consumer(topic, partition, offset)
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
        deadline, bound = now + max(wait, 0.0), now + self.cluster.timeout
        tp = TopicPartition(self.cluster.name(topic), partition)
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
            high = self._settled(
                lambda: consumer.get_watermark_offsets(
                    tp, timeout=self.cluster.timeout, cached=False
                )[1],
                bound,
                cancelled,
            )
            if at >= high or now >= bound:
                return out, at
            if fetched and now >= deadline + _MARKER_WAIT:
                # Still below the high watermark: aborted records being skipped
                # (more comes), or the last stable offset (a transaction still
                # open: nothing more now). Ask the broker which.
                if out or at >= self._settled(lambda: self._stable_offset(tp), bound, cancelled):
                    return out, at
                deadline = now
            out.extend(consumer.consume(count - len(out), 0.01))
        if out:
            at = max(at, out[-1].offset() + 1)
        return out, at

    def _settled(self, ask: Callable[[], int], bound: float, cancelled: threading.Event) -> int:
        """``ask()`` (in the fetch thread), asked again every 50 ms while the
        broker answers with a condition that passes (a partition just created
        whose leader is not known yet, a leader moving), until ``bound`` on
        the monotonic clock or ``cancelled``; then its error is raised. Only
        questions go through here: nothing of the reader's position moves,
        so asking again skips no record."""
        while True:
            try:
                return ask()
            except KafkaException as exc:
                unavailable = isinstance(self.cluster.error("read", exc), LogUnavailableError)
                if not unavailable or time.monotonic() >= bound or cancelled.wait(0.05):
                    raise

    def _stable_offset(self, tp: Any) -> int:
        """The partition's last stable offset (in a thread): where ``read_committed`` ends."""
        request = {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest()}
        futures = self.cluster.admin().list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED
        )
        offset: int = next(iter(futures.values())).result(timeout=self.cluster.timeout).offset
        return offset

    def _records(self, topic: str, partition: int, messages: list[Any]) -> list[Record]:
        out: list[Record] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() in UNKNOWN_TOPIC_CODES:
                    self.cluster.forget(topic)
                    self._readers.pop((topic, partition), None)
                    raise UnknownTopicError(topic)
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise self.cluster.error(f"read {topic}/{partition}", KafkaException(err))
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
        count = await self.cluster.partitions(topic)
        name = self.cluster.name(topic)
        request = {TopicPartition(name, p): spec for p in range(count)}

        def ask() -> dict[int, int]:
            futures = self.cluster.admin().list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED
            )
            return {
                tp.partition: self.cluster.future("list offsets", f).offset
                for tp, f in futures.items()
            }

        return dict(sorted((await self.cluster.idempotent("list offsets", ask)).items()))

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the last stable offset (``read_committed``).

        :raises UnknownTopicError: when the topic does not exist.
        """
        return await self._list_offsets(topic, OffsetSpec.latest())

    async def start_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the first offset still stored.

        :raises UnknownTopicError: when the topic does not exist.
        """
        return await self._list_offsets(topic, OffsetSpec.earliest())

    # -- the readers' lifetime -------------------------------------------------------

    def rewind(self, topic: str) -> None:
        """The topic's start moved (records deleted): its readers seek again at their next read."""
        for (t, _), reader in self._readers.items():
            if t == topic:
                reader.next_offset = -1

    async def close_topic(self, topic: str) -> None:
        """Close the topic's readers (it is being deleted)."""
        for key in [k for k in self._readers if k[0] == topic]:
            reader = self._readers.pop(key)
            await self.cluster.run("close reader", reader.consumer.close)

    def detach(self) -> list[Any]:
        """Forget every reader (the log is closing). :returns: their consumers, to close."""
        readers, self._readers = list(self._readers.values()), {}
        return [reader.consumer for reader in readers]
