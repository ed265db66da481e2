"""The Kafka log's plain appends: one idempotent producer and its delivery reports.

Owns the log's idempotent producer (``enable.idempotence``, ``acks=all``),
the thread that polls it (delivery reports are served there), and the
mapping of a record to a Kafka message (:func:`to_message`: ``wk-key`` is
the message key, every other header a Kafka header), which the
transactional producer (:mod:`._transactions`) uses too. A producer is
dropped after a topic is deleted: librdkafka keeps a deleted topic's
metadata for minutes.

May call: :mod:`._cluster` (settings, names, errors, the topic cache).
Called by the log (:mod:`._log`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from ..._clock import BLOCKING_CALLS
from ..._errors import LogUnavailableError, UnknownTopicError
from ..._records import H_KEY
from .._base import OutgoingRecord
from ._cluster import UNKNOWN_TOPIC_CODES, Cluster, code

__all__ = ("Appender", "to_message")


def to_message(headers: Mapping[str, bytes]) -> tuple[bytes | None, dict[str, bytes]]:
    """A checked record's Kafka message key (its ``wk-key``, or None) and Kafka
    headers (the others, in order; values are ``bytes``, as
    :func:`~wakuwaku.logs._base.check_record` leaves them)."""
    rest = dict(headers)
    key = rest.pop(H_KEY, None)
    return key, rest


class Appender:
    """Produces records to one partition at a time and waits for their offsets.

    :param cluster: the log's shared settings and calls.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._producer: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def _client(self) -> Any:
        if self._producer is None:
            self._producer = Producer(
                {
                    **self.cluster.common,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 1,
                    "message.max.bytes": 64 * 1024 * 1024,
                    "message.timeout.ms": int(self.cluster.timeout * 1000),
                    "partitioner": "murmur2_random",
                }
            )
            self._thread = threading.Thread(
                target=self._serve, name="wakuwaku-kafka-producer", daemon=True
            )
            self._thread.start()
        return self._producer

    def _serve(self) -> None:
        producer = self._producer
        while not self._stop.is_set() and producer is self._producer:
            producer.poll(0.05)

    async def drop(self) -> None:
        """Start a new idempotent producer at the next append (after a topic was
        deleted: librdkafka keeps the old topic's metadata for minutes)."""
        producer, self._producer = self._producer, None
        thread, self._thread = self._thread, None
        if producer is not None:
            with BLOCKING_CALLS.track():
                await asyncio.to_thread(producer.flush, 1.0)
        if thread is not None:
            await asyncio.to_thread(thread.join, 1.0)

    async def append(
        self, topic: str, partition: int, outgoing: Sequence[OutgoingRecord]
    ) -> list[int]:
        """Produce ``outgoing`` (checked records) in order and wait for their offsets.

        :raises UnknownTopicError: when the topic is gone.
        :raises LogUnavailableError: when the brokers do not acknowledge
            within ``timeout`` seconds (plus five).
        :raises LogError: for another refusal.
        """
        delivered = await self._produce_all(topic, partition, outgoing)
        try:
            with BLOCKING_CALLS.track():
                offsets = await asyncio.wait_for(delivered.done, self.cluster.timeout + 5.0)
        except TimeoutError as exc:
            raise LogUnavailableError(
                f"Kafka log {self.cluster.url} is unavailable (append to {topic}/{partition}): "
                f"not acknowledged within {self.cluster.timeout} s"
            ) from exc
        except KafkaException as exc:
            if code(exc) in UNKNOWN_TOPIC_CODES or (
                code(exc) == KafkaError._MSG_TIMED_OUT
                and await self.cluster.partitions_or_none(topic, fresh=True) is None
            ):
                self.cluster.forget(topic)
                await self.drop()  # its metadata knows a topic that is gone
                raise UnknownTopicError(topic) from exc
            raise self.cluster.error(f"append to {topic}/{partition}", exc) from exc
        return offsets

    async def _produce_all(
        self, topic: str, partition: int, outgoing: Sequence[OutgoingRecord]
    ) -> _Delivered:
        """Hand ``outgoing`` to the idempotent producer; what collects their offsets."""
        producer = self._client()
        delivered = _Delivered(len(outgoing))
        report = delivered.report  # one callback for every record of the append
        produce = producer.produce
        name = self.cluster.name(topic)
        for headers, body in outgoing:
            rest = dict(headers)  # to_message, inline: this loop is the append's cost
            key = rest.pop(H_KEY, None)
            if type(body) is not bytes:
                body = bytes(body)
            while True:
                try:
                    produce(name, body, key, partition, on_delivery=report, headers=rest)
                    break
                except BufferError:
                    await BLOCKING_CALLS.pause(0.01)
        return delivered

    def close(self) -> None:
        """Deliver what is buffered (bounded by ``timeout``) and stop the poll thread
        (blocking: in a thread)."""
        if self._producer is not None:
            self._producer.flush(self.cluster.timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)


class _Delivered:
    """The offsets of one append's records, filled by their delivery reports (in
    the thread that polls the producer) and handed to the event loop once: when
    the last one is in, or at the first error (one wake-up per append, not per
    record).

    Every record of the append shares one callback, :meth:`report`, so the
    offsets come in the order the reports are served. They are handed over
    sorted: the idempotent producer writes one partition's records in the
    order they were produced, so the ``i``-th smallest offset is the ``i``-th
    record's, whatever order the reports came in.

    :param count: how many records the append produces.
    """

    def __init__(self, count: int) -> None:
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[list[int]] = self._loop.create_future()
        self._offsets: list[int] = []
        self._count = count
        self._failed = False
        if count == 0:
            self.done.set_result([])

    def report(self, err: Any, msg: Any) -> None:
        """The delivery report callback of every record of the append.

        Reports may be served by two threads at once (the poll thread and a
        ``flush()`` in another): no lock is needed, as ``list.append`` is
        atomic and :meth:`_finish` acts once (two threads that both see the
        last offset in schedule it twice).
        """
        if self._failed:
            return  # finished already (an earlier error)
        if err is not None:
            self._failed = True
            self._loop.call_soon_threadsafe(self._finish, KafkaException(err))
            return
        offsets = self._offsets
        offsets.append(msg.offset())
        if len(offsets) == self._count:
            self._loop.call_soon_threadsafe(self._finish, None)

    def _finish(self, error: KafkaException | None) -> None:
        if self.done.done():
            return
        if error is not None:
            self.done.set_exception(error)
        else:
            self._offsets.sort()
            self.done.set_result(self._offsets)
