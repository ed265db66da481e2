"""The NATS log's partition streams: how records are stored in them and read back.

Owns what lies in a partition's stream and how it gets there and back:

- the **record format**: one message per record, a msgpack envelope
  ``[headers, body]`` in its data (NATS headers carry only the server's
  ``Nats-*`` controls); a message another publisher wrote (a header of its
  own, or data that is no envelope) is read as a plain record;
- **publishing once**: a message is sent under its ``Nats-Msg-Id`` and sent
  again while its answer is lost, the server dropping the duplicate;
- the **chunk streams** ``<partition stream>_B`` that hold records too large
  for one message (the record's message names its chunks), and their
  retention;
- the **readers**: one pull consumer kept per partition, made again for
  another offset, after a gap in its deliveries or after a reconnection.

It knows no partition counts, offsets of groups or leases: the log
(:mod:`wakuwaku.logs.nats`) maps topics to streams, and turns a stream that
is not there (:class:`~._jetstream.StreamNotFound`,
:class:`~._jetstream.NoResponders`) into the error to raise.

May call: :mod:`._jetstream`, :mod:`wakuwaku._records`, and the record
publish the log hands it (``NatsLog._publish``), which it looks up at each
call.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from .._errors import LogError, LogUnavailableError
from .._records import Record, unreadable_record
from ._jetstream import (
    DUPLICATE_WINDOW_NS,
    Delivery,
    JetStream,
    JetStreamError,
    NoResponders,
    Publish,
    PublishAll,
    delivery,
)

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = ("PartitionStreams", "encode_record")

_CHUNK_MARGIN = 4096  # room for the chunk message's own framing and NATS headers
_BLOB_SUFFIX = "_B"


class _MissingChunk(LogError):
    """A chunk a large record's message names is not in the chunk stream."""


class _Envelope(msgspec.Struct, array_like=True, gc=False):
    """A record as one message body: headers, body, or the chunks holding both."""

    headers: dict[str, bytes]
    body: bytes
    chunks: list[int] | None = None


_encode = msgspec.msgpack.Encoder().encode
_decode_envelope = msgspec.msgpack.Decoder(_Envelope).decode


def encode_record(headers: dict[str, bytes], body: bytes) -> bytes:
    """The message data that holds one record (headers checked by the caller)."""
    return _encode(_Envelope(headers, body))


def _envelope(msg: Msg) -> _Envelope | None:
    """The envelope a message of this log holds, or None for a message another
    publisher wrote: one with a header of its own (not ``Nats-*``), or whose
    data is not an envelope."""
    headers = msg.headers
    if (
        headers
        and (len(headers) != 1 or "Nats-Msg-Id" not in headers)  # the log's own: at once
        and any(not name.startswith("Nats-") for name in headers)
    ):
        return None
    try:
        return _decode_envelope(msg.data)
    except msgspec.DecodeError:
        return None


def _foreign_record(msg: Msg, at: Delivery) -> Record:
    """A message another publisher wrote to a partition's stream, read as a plain
    record (docs/logs.md): its data is the body, its NATS headers the headers
    (UTF-8 values; a header given several values keeps the last)."""
    headers = {
        name: value.encode("utf-8", "surrogateescape")
        for name, value in (msg.headers or {}).items()
    }
    return Record(at.stream_seq - 1, headers, bytes(msg.data), at.timestamp)


@dataclass
class _Reader:
    """A pull consumer that delivers one partition from ``next_seq`` on."""

    stream: str
    consumer: str
    next_seq: int
    connection: int  # the connection it was made on (see JetStream.connection)
    next_delivery: int = 1  # the consumer sequence of the next delivery


class PartitionStreams:
    """The partition streams of one NATS log: records in, records out.

    :param js: the log's JetStream client.
    :param stream_name: the stream of a topic's partition.
    :param publish: publishes one record message (the log's ``_publish``).
    :param publish_all: publishes several to one stream, answers awaited
        together (the log's ``_publish_all``).
    """

    def __init__(
        self,
        js: JetStream,
        stream_name: Callable[[str, int], str],
        publish: Publish,
        publish_all: PublishAll,
    ) -> None:
        self._js = js
        self._stream_name = stream_name
        self._publish = publish
        self._publish_all = publish_all
        self._readers: dict[tuple[str, int], _Reader] = {}
        # Chunk streams seen to exist (a direct get on a missing one gets no answer).
        self._chunk_streams: set[str] = set()

    async def create(self, name: str, subjects: Sequence[str]) -> None:
        """Create the stream ``name`` taking ``subjects`` (one there already stays).

        :raises LogError: when the server refuses.
        """
        config = {
            "name": name,
            "subjects": list(subjects),
            "storage": "file",
            "retention": "limits",
            "discard": "old",
            "num_replicas": 1,
            "allow_direct": True,
            "duplicate_window": DUPLICATE_WINDOW_NS,  # Nats-Msg-Id deduplication
        }
        await self._js.create_stream(config)

    # -- writing ------------------------------------------------------------

    async def publish_once(self, subject: str, payload: bytes, msg_id: str) -> int:
        """Publish with the message id ``msg_id``, resending on a lost answer.

        :returns: the message's sequence: where it is stored now, or, for a
            duplicate of one stored earlier (same id, within the window),
            where that one is.
        :raises NoResponders: when no stream takes ``subject``.
        :raises LogUnavailableError: when no answer comes within the log's timeout.
        :raises LogError: when the server refuses the publish.
        """
        headers = {"Nats-Msg-Id": msg_id}
        deadline = time.monotonic() + self._js.timeout
        while True:
            try:
                return await self._publish(subject, payload, headers)
            except NoResponders:
                raise  # nothing stored it: the caller finds out why
            except LogUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.05)

    async def publish_in_order(
        self, subject: str, payloads: Sequence[bytes], base: str
    ) -> list[int]:
        """Publish ``payloads`` with the message ids ``<base>:<i>``, pipelined; their sequences.

        All are sent, then all answers awaited together (one connection: the
        server stores them in the order sent). From the first one that got
        no answer on, they are sent again one at a time with their ids, as
        :meth:`publish_once` does: the server drops those it had stored as
        duplicates, answering their sequences, so each is stored once.

        :raises NoResponders: / :raises LogUnavailableError: / :raises LogError:
            as :meth:`publish_once`, for the first message that met it.
        :raises LogError: when the sequences are not in the order of the
            payloads (a message lost by the server while a later one was stored).
        """
        ids = [f"{base}:{index}" for index in range(len(payloads))]
        results = await self._publish_all(
            subject,
            [(data, {"Nats-Msg-Id": msg_id}) for data, msg_id in zip(payloads, ids, strict=True)],
        )
        seqs: list[int] = []
        for index, result in enumerate(results):
            if isinstance(result, int):
                seqs.append(result)
            elif isinstance(result, LogUnavailableError) and not isinstance(result, NoResponders):
                seqs += [
                    await self.publish_once(subject, data, msg_id)
                    for data, msg_id in zip(payloads[index:], ids[index:], strict=True)
                ]
                break
            else:
                raise result
        if any(a >= b for a, b in itertools.pairwise(seqs)):
            raise LogError(
                f"NATS log {self._js.url}: the records of one append to {subject} were stored "
                f"out of order (sequences {seqs}): the server lost one and stored a later one"
            )
        return seqs

    async def fit(self, stream: str, payload: bytes, msg_id: str) -> bytes:
        """The message that stores ``payload`` in ``stream``: itself when it fits one
        message, else an envelope naming the chunks it is stored in (``<stream>_B``).

        Chunk ``j`` has the message id ``<msg_id>:<j>``, so the chunks of a
        record sent again are the ones stored the first time.
        """
        size = self._js.max_payload - _CHUNK_MARGIN
        if len(payload) <= size:
            return payload
        chunks = stream + _BLOB_SUFFIX
        await self.create(chunks, [chunks])
        seqs = [
            await self.publish_once(chunks, payload[i : i + size], f"{msg_id}:{j}")
            for j, i in enumerate(range(0, len(payload), size))
        ]
        return _encode(_Envelope({}, b"", seqs))

    # -- reading ------------------------------------------------------------

    async def read(
        self,
        topic: str,
        partition: int,
        seq: int,
        count: int,
        wait: float,
        *,
        confirm_empty: bool = True,
    ) -> list[Record]:
        """Up to ``count`` records of the partition from sequence ``seq`` on.

        An empty answer means no record was stored from ``seq`` on when it
        was given. A pull consumer alone does not promise that: the server
        stores a message, acknowledges the publish, and tells the stream's
        consumers of it a moment later, and a pull that does not wait,
        arriving in between, is answered "no messages" (seen under load,
        about 1 read in 150 right after an append, on nats-server 2.15;
        not seen on 2.9 in the same test). Callers that read until an empty page (listings, the
        engine's control and registry topics) would stop short. So an empty
        answer is checked against the stream itself (one direct get of the
        next record from ``seq``), and when one is stored the consumer is
        asked again, waiting for it.

        :param wait: how long the server may wait for the first record (seconds).
        :param confirm_empty: False skips that check, for a caller that
            waits for records next anyway.
        :raises StreamNotFound: when the partition's stream is not there.
        :raises LogUnavailableError: when the server does not answer in time,
            deliveries keep getting lost, or the consumer keeps answering
            nothing while the stream holds records for it.
        """
        for _ in range(3):
            reader = await self._reader(topic, partition, seq)
            self._readers.pop((topic, partition), None)  # back only when all went well
            msgs = await self._js.fetch(reader.stream, reader.consumer, count, wait)
            if not msgs and confirm_empty and await self._stored_from(reader.stream, seq):
                msgs = await self._js.fetch(reader.stream, reader.consumer, 1, self._js.timeout)
                if not msgs:  # told of it for a whole timeout, still silent: a new one
                    reader.next_seq = -1
                    self._readers[(topic, partition)] = reader
                    continue
                if count > 1:
                    msgs += await self._js.fetch(reader.stream, reader.consumer, count - 1, 0.0)
            records: list[Record] = []
            expected = reader.next_delivery
            for msg in msgs:
                at = delivery(msg)
                if at.consumer_seq != expected:
                    break  # a delivery was lost: read again from the gap
                records.append(
                    self._plain_record(msg, at) or await self._record(reader.stream, msg, at)
                )
                expected += 1
            else:
                reader.next_delivery = expected
                if records:
                    reader.next_seq = records[-1].offset + 2
                self._readers[(topic, partition)] = reader
                return records
            reader.next_seq = -1  # made again at the next read
            self._readers[(topic, partition)] = reader
            if records:
                return records
        raise LogUnavailableError(
            f"NATS log {self._js.url}: {reader.stream} keeps losing deliveries "
            f"(or answering none of the records it holds from sequence {seq})"
        )

    async def _stored_from(self, stream: str, seq: int) -> bool:
        """Whether ``stream`` holds a record (not a fence record) from ``seq`` on.

        :raises LogUnavailableError: when the server does not answer.
        :raises JetStreamError: when it refuses the direct get.
        """
        return await self._js.direct_get(stream, {"seq": seq, "next_by_subj": stream}) is not None

    def forget(self, topic: str, partition: int | None = None) -> None:
        """Stop using the readers of ``topic`` (of one partition, when given)."""
        for key in [k for k in self._readers if k[0] == topic and partition in (None, k[1])]:
            del self._readers[key]

    async def _reader(self, topic: str, partition: int, seq: int) -> _Reader:
        """The pull consumer that delivers ``topic``/``partition`` from ``seq``.

        The kept one when it continues there and was made on the current
        connection; otherwise a new one (the old one is deleted, best effort).
        A consumer made before the connection was lost is never used again:
        it lives in the server's memory, and a server that restarted has
        none of it, so a pull sent to it would never be answered.
        """
        key = (topic, partition)
        reader = self._readers.get(key)
        if (
            reader is not None
            and reader.next_seq == seq
            and reader.connection == self._js.connection
        ):
            return reader
        self._readers.pop(key, None)
        stream = self._stream_name(topic, partition)
        if reader is not None:
            await self._js.delete_consumer(stream, reader.consumer)
        config = {
            "ack_policy": "none",
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": seq,
            "filter_subject": stream,  # records only, never fence records
            "inactive_threshold": 300_000_000_000,
            "mem_storage": True,
            "num_replicas": 1,
            "max_waiting": 8,
        }
        connection = self._js.connection  # taken before the request: a reconnection shows
        answer = await self._js.create_consumer(stream, config)
        reader = self._readers[key] = _Reader(stream, answer["name"], seq, connection)
        return reader

    @staticmethod
    def _plain_record(msg: Msg, at: Delivery) -> Record | None:
        """The record of a message that holds it whole; None when it names chunks."""
        found = _envelope(msg)
        if found is None:
            return _foreign_record(msg, at)
        if found.chunks is not None:
            return None
        return Record(at.stream_seq - 1, found.headers, found.body, at.timestamp)

    async def _record(self, stream: str, msg: Msg, at: Delivery) -> Record:
        """The record of any message, a large record's chunks joined (or it is unreadable)."""
        found = _envelope(msg)
        if found is None:
            return _foreign_record(msg, at)
        if found.chunks is not None:
            try:
                whole = await self._load_chunks(stream + _BLOB_SUFFIX, found.chunks)
                found = _decode_envelope(whole)
            except (_MissingChunk, msgspec.DecodeError) as exc:
                what = (
                    str(exc)
                    if isinstance(exc, _MissingChunk)
                    else f"its chunks do not hold a record ({exc})"
                )
                return unreadable_record(
                    at.stream_seq - 1,
                    f"NATS log: a large record: {what}",
                    msg.data,
                    None,
                    at.timestamp,
                )
        return Record(at.stream_seq - 1, found.headers, found.body, at.timestamp)

    async def _load_chunks(self, stream: str, seqs: list[int]) -> bytes:
        """The chunks ``seqs`` of ``stream``, joined.

        :raises _MissingChunk: when one of them, or the stream, is not there.
        :raises LogUnavailableError: when the server does not answer.
        """
        if stream not in self._chunk_streams:
            if await self._js.stream_info(stream, what=f"cannot read {stream}") is None:
                raise _MissingChunk(f"the chunk stream {stream} is missing")
            self._chunk_streams.add(stream)
        parts: list[bytes] = []
        for seq in seqs:
            try:
                found = await self._js.direct_get(stream, {"seq": seq})
            except JetStreamError:
                found = None  # any status but "found": the chunk is not there to read
            if found is None:
                raise _MissingChunk(f"chunk {seq} of {stream} is missing")
            parts.append(found.data)
        return b"".join(parts)

    # -- retention and deletion ---------------------------------------------

    async def purge_chunks(self, stream: str, keep: int) -> None:
        """Purge ``stream``'s chunk stream below the lowest chunk a record from
        sequence ``keep`` on names; all of it when none does. Best effort: a
        refusal leaves chunks behind, which only cost space."""
        blob = stream + _BLOB_SUFFIX
        try:
            info = await self._js.stream_info(blob)
        except JetStreamError:
            return
        if info is None or int(info["state"]["messages"]) == 0:
            return
        try:
            low = await self._lowest_chunk(stream, keep)
        except JetStreamError:
            return  # not known which chunks records still name: keep them all
        with contextlib.suppress(JetStreamError):
            await self._js.purge(blob, {"seq": low} if low else {})

    async def _lowest_chunk(self, stream: str, keep: int) -> int | None:
        """The lowest chunk a record of ``stream`` from sequence ``keep`` on names;
        None when none does.

        :raises JetStreamError: when the server refuses the scan (then which
            chunks are still named is unknown: a refusal read as "none"
            purged every chunk, the bodies of large records retention keeps).
        """
        config = {
            "ack_policy": "none",
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": keep,
            "filter_subject": stream,
            "inactive_threshold": 60_000_000_000,
            "mem_storage": True,
            "num_replicas": 1,
        }
        answer = await self._js.create_consumer(stream, config)
        low: int | None = None
        try:
            while msgs := await self._js.fetch(stream, answer["name"], 1000, 0.0):
                for msg in msgs:
                    found = _envelope(msg)
                    chunks = None if found is None else found.chunks
                    if chunks:
                        low = min(chunks) if low is None else min(low, *chunks)
        finally:
            await self._js.delete_consumer(stream, answer["name"])
        return low

    async def delete_chunks(self, stream: str) -> None:
        """Delete ``stream``'s chunk stream, if there is one.

        :raises LogError: when the server refuses.
        """
        await self._js.delete_stream(stream + _BLOB_SUFFIX)
        self._chunk_streams.discard(stream + _BLOB_SUFFIX)
