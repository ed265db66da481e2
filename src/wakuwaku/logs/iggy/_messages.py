"""The Iggy log's records as Iggy messages: how one is written, sent, polled and read back.

Owns the record format on Iggy: headers are Iggy user headers (string
keys, raw byte values); what Iggy cannot carry as a header (an empty value,
a name or value over 255 bytes, headers past its 100 000 bytes) and an
empty body travel in the payload, ``msgpack([headers, body])``, under the
reserved header :data:`ENVELOPE`. Also the size limit of each topic
(:data:`MAX_PAYLOAD`, less :data:`HEADER_ROOM` on every topic but the
engine's derived ones, which this part is told of), the sends of one batch
and the offsets they got, and the log's polls: by offset as a plain
consumer that stores nothing (:data:`_READER`), for reads and for the first
offset of each partition.

May call: :mod:`._server` (the log's connection, the topic cache),
:mod:`._unanswered` (which it hands its poll and the end offsets).
Called by the log (:mod:`._log`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import msgspec
from apache_iggy import Consumer, PollingStrategy, ReceiveMessage, SendMessage

from ..._errors import ConfigError, LogError, LogUnavailableError
from ..._records import H_KEY, Record, unreadable_record
from ._server import Server, end_of
from ._unanswered import Unanswered

__all__ = ("ENVELOPE", "HEADER_ROOM", "MAX_PAYLOAD", "Messages", "to_record")

logger = logging.getLogger("wakuwaku.logs.iggy")

MAX_PAYLOAD = 64_000_000
"""Iggy's largest message payload (bytes): ``MAX_PAYLOAD_SIZE`` of its server."""
HEADER_ROOM = 1_000_000
"""Bytes kept free below :data:`MAX_PAYLOAD` on every topic but the engine's
retry, dead-letter and replay topics, so a record at its main topic's limit
can still be retried and dead-lettered with the headers the engine adds."""
ENVELOPE = "wk-iggy-envelope"
"""Reserved header: the payload is ``msgpack([headers, body])`` (headers Iggy
cannot carry, an empty body)."""
_MAX_HEADER = 255  # bytes of one Iggy header name or value
_MAX_HEADERS = 90_000  # of Iggy's 100 000 bytes of user headers, less framing
_HEADER_FRAMING = 16  # per header: kinds and lengths, counted generously
_READ_PAUSE = 0.02  # seconds between polls of a waiting read
_SAY_AGAIN = 60.0  # seconds between warnings about one partition's foreign records
_READER = "wakuwaku-reader"


def _headers_of(
    message: ReceiveMessage, shared: dict[Any, dict[str, bytes]] | None = None
) -> dict[str, bytes]:
    """A message's Iggy user headers as ``str -> bytes``.

    The usual case (text names, raw values, as this log writes them) is the
    client's own conversion and two joins that raise ``TypeError`` unless
    every name is text and every value bytes: this runs once per record
    read, and was the consumer's largest cost on Iggy. Headers equal to
    ones of ``shared`` (see :func:`to_record`) are that dict, checked
    already: equal values are of equal kinds. Other kinds (a name in bytes,
    a value Iggy typed as text or a number, two typed names the client's
    conversion cannot tell apart) are turned into the same shape; a name
    that is not UTF-8 keeps its bytes as ``\ufffd``.
    """
    found = message.user_headers()
    if not found:
        return {}
    try:
        plain = found.to_scalar_dict()
        if shared is not None:
            seen = shared.get(plain.get(H_KEY))
            if seen is not None and seen == plain:
                return seen
        "".join(plain)  # type: ignore[arg-type]
        b"".join(plain.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        pass
    else:
        return plain  # type: ignore[return-value]
    out: dict[str, bytes] = {}
    for key, value in found.items():
        name = key.value
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        raw = value.value
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        elif not isinstance(raw, bytes):
            raw = str(raw).encode("utf-8")
        out[str(name)] = raw
    return out


def to_record(message: ReceiveMessage, shared: dict[Any, dict[str, bytes]] | None = None) -> Record:
    """The record an Iggy message holds (an unreadable record for a bad envelope or headers).

    :param shared: the headers of earlier records of the same read, by their
        ``wk-key``: a record whose headers equal the ones kept for its key
        gets that same dict (records are read-only, and SQLiteLog shares
        equal headers too), so its headers are neither checked here nor by
        the consumer's planner again: once per read instead of once per
        record. Iggy hands out a new header map for every message.
    """
    offset = message.offset()
    stamp = message.timestamp() / 1_000_000
    body = message.payload()
    try:
        headers = _headers_of(message, shared)
    except (ValueError, UnicodeError) as exc:
        return unreadable_record(offset, f"Iggy user headers not decodable: {exc}", body)
    if ENVELOPE not in headers:
        # A dict of shared is never an envelope's: those are changed below.
        if shared is not None and (key := headers.get(H_KEY)) is not None:
            shared.setdefault(key, headers)
        return Record(offset, headers, body, stamp)
    headers.pop(ENVELOPE)
    try:
        extra, inner = msgspec.msgpack.decode(body, type=tuple[dict[str, bytes], bytes])
    except msgspec.DecodeError:
        return unreadable_record(
            offset, f"a record marked {ENVELOPE} whose payload is not one", body
        )
    headers.update(extra)
    return Record(offset, headers, inner, stamp)


def _split_headers(headers: Mapping[str, bytes]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The headers Iggy can carry, in order while they fit, and the rest
    (:data:`ENVELOPE`: the payload carries them)."""
    plain: dict[str, bytes] = {}
    extra: dict[str, bytes] = {}
    room = _MAX_HEADERS
    for name, value in headers.items():
        width = len(name) if name.isascii() else len(name.encode("utf-8"))
        length = len(value)
        cost = width + length + _HEADER_FRAMING
        if 0 < length <= _MAX_HEADER and 0 < width <= _MAX_HEADER and cost <= room:
            plain[name] = value
            room -= cost
        else:
            extra[name] = value
    return plain, extra


class Messages:
    """The records of the log's partitions, written and read as Iggy messages."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._derived: set[str] = set()
        self._reader = Consumer.Single(_READER)
        self._foreign_said: dict[tuple[str, int], float] = {}
        self.unanswered = Unanswered(self._poll_from, server.end_offsets)

    def mark_derived(self, topic: str) -> None:
        """``topic`` is an engine-made one: it takes :data:`HEADER_ROOM` more bytes per record."""
        self._derived.add(topic)

    def forget(self, topic: str) -> None:
        """``topic`` was deleted."""
        self._derived.discard(topic)
        self.unanswered.forget(topic)

    def _limit(self, topic: str) -> int:
        return MAX_PAYLOAD if topic in self._derived else MAX_PAYLOAD - HEADER_ROOM

    def message(
        self,
        topic: str,
        partition: int,
        headers: Mapping[str, bytes],
        body: bytes,
        ident: int | None = None,
    ) -> Any:
        """The Iggy message of one record (:data:`ENVELOPE` for what headers cannot carry).

        :param ident: its Iggy message id (:func:`batch_ids`); None lets the
            server choose one.

        :raises ConfigError: for a record over the topic's limit, naming it,
            or one with a header named :data:`ENVELOPE` (this log's own
            mark: a reader would take the record's body for an envelope).
        """
        if ENVELOPE in headers:
            raise ConfigError(
                f"a record for {topic}/{partition} has a header named {ENVELOPE!r}, which "
                "the Iggy log keeps for its own use"
            )
        # One pass: the record's size, and whether Iggy can carry every
        # header (the usual case: the headers go as they are). This runs
        # once per record sent.
        size = len(body)
        room = _MAX_HEADERS
        fits = True
        for name, value in headers.items():
            width = len(name) if name.isascii() else len(name.encode("utf-8"))
            length = len(value)
            size += width + length
            room -= width + length + _HEADER_FRAMING
            if not 0 < length <= _MAX_HEADER or not 0 < width <= _MAX_HEADER:
                fits = False
        fits = fits and room >= 0
        limit = self._limit(topic)
        if size > limit:
            key = headers.get(H_KEY, b"")
            raise ConfigError(
                f"a record of key {bytes(key)[:80]!r} for {topic}/{partition} is {size} bytes "
                f"(body and headers); Iggy topic {topic!r} takes at most {limit} (Iggy's "
                f"message limit is {MAX_PAYLOAD} bytes"
                + ("" if topic in self._derived else f", less {HEADER_ROOM} for retry headers")
                + ")"
            )
        if fits and body:
            carried = headers if isinstance(headers, dict) else dict(headers)
            return SendMessage(body, carried or None, ident)
        plain, extra = _split_headers(headers)
        payload = msgspec.msgpack.encode([extra, body])
        if len(payload) > MAX_PAYLOAD:
            raise ConfigError(
                f"a record for {topic}/{partition} does not fit Iggy's message limit of "
                f"{MAX_PAYLOAD} bytes once its long headers are moved into the payload"
            )
        plain[ENVELOPE] = b"1"
        return SendMessage(payload, plain, ident)

    async def send(
        self,
        topic: str,
        partition: int,
        messages: list[Any],
        token: str | None = None,
        first_id: int | None = None,
    ) -> list[int]:
        """Send ``messages`` (made by :meth:`message`) to one partition as one Iggy batch.

        A send of an append named by ``token`` (its messages carry
        :func:`batch_ids` of it, the first being ``first_id``) that raises
        :class:`LogUnavailableError` or is cancelled is remembered as
        unanswered (:mod:`._unanswered`): it may still be stored, and the
        caller looks for it (:meth:`Unanswered.find`) before it sends the
        append again.

        :returns: their offsets.
        :raises UnknownTopicError: when the send was refused and the topic is gone.
        """
        since = None
        if token is not None and first_id is not None:
            since = await self.unanswered.since(topic, partition, token)
        stream = self._server.stream
        try:
            answer = await self._server.call(
                f"append to {topic}/{partition}",
                lambda c: c.send_messages(stream, topic, partition, messages),
            )
        except (LogUnavailableError, asyncio.CancelledError):
            if token is not None and first_id is not None and since is not None:
                self.unanswered.failed(topic, partition, token, since, len(messages), first_id)
            raise
        except LogError:
            await self._server.unknown_topic(topic)
            raise
        if not answer.confirmations:
            raise LogError(
                f"Iggy log {self._server.url}: append to {topic}/{partition} got no offset"
            )
        base = int(answer.confirmations[0].base_offset)
        self.unanswered.stored(topic, partition, token, base + len(messages))
        return list(range(base, base + len(messages)))

    async def _poll_from(
        self, topic: str, partition: int, offset: int, count: int
    ) -> list[ReceiveMessage]:
        """Iggy messages of ``partition`` from ``offset`` on (the partition's own only)."""
        return await self._own_poll(topic, partition, PollingStrategy.Offset(offset), count)

    async def read(
        self, topic: str, partition: int, offset: int, max_records: int, wait: float
    ) -> list[Record]:
        """Poll up to ``max_records`` records from ``offset`` on, again every 20 ms
        until a record is there or ``wait`` seconds have passed."""
        deadline = time.monotonic() + max(wait, 0.0)
        strategy = PollingStrategy.Offset(max(offset, 0))
        while True:
            found = await self._own_poll(topic, partition, strategy, max(1, max_records))
            if found and found[0].offset() < offset:  # in offset order: the rest are later
                found = [m for m in found if m.offset() >= offset]
            shared: dict[Any, dict[str, bytes]] = {}
            records = [to_record(m, shared) for m in found]
            if records or time.monotonic() >= deadline:
                return records[:max_records]
            await asyncio.sleep(min(_READ_PAUSE, max(0.0, deadline - time.monotonic())))

    async def _own_poll(
        self, topic: str, partition: int, strategy: PollingStrategy, count: int
    ) -> list[ReceiveMessage]:
        """One poll of ``partition``, less what is not the partition's own.

        The server reuses the numeric ids of a deleted stream or topic, and
        for a few milliseconds after a topic is made a poll of it may be
        answered from the deleted partition of the same ids: its records, at
        offsets the new partition may not have reached, would be read as the
        new topic's (and their offsets committed past the new records: a
        loss). Seen on Iggy 0.9.0-edge.5: 35 of 240 topics made while other
        streams were deleted served old records, for up to 50 ms, and once
        in a full test run after the topic had already served nothing. A
        record stored before its partition was made cannot be the
        partition's own (both times are the server's clock, and a restart
        keeps the partition's): such an answer is taken as no record yet,
        after asking the partition's time again, and a warning says so.

        :raises UnknownTopicError: when a refused poll's topic is gone.
        """
        try:
            found = await self._poll(topic, partition, strategy, count)
        except LogUnavailableError:
            raise
        except LogError:
            await self._server.unknown_topic(topic)
            raise
        if not found:
            return found
        stamp = found[0].timestamp()
        if stamp >= await self._server.created_at(topic, partition):
            return found
        made = await self._server.created_at(topic, partition, fresh=True)
        if stamp >= made:
            return found
        now = time.monotonic()
        if now - self._foreign_said.get((topic, partition), -_SAY_AGAIN) >= _SAY_AGAIN:
            self._foreign_said[(topic, partition)] = now
            logger.warning(
                "Iggy log %s: %s/%d answered %d records stored before the partition was made "
                "(a deleted topic's, whose ids the server reused; or the server's clock went "
                "back): not read",
                self._server.url,
                topic,
                partition,
                len(found),
                extra={"topic": topic, "partition": partition, "records": len(found)},
            )
        return []

    async def _poll(
        self, topic: str, partition: int, strategy: PollingStrategy, count: int
    ) -> list[ReceiveMessage]:
        """One poll of ``partition`` as the log's reader (it stores no offset)."""
        return await self._server.ask(
            f"read {topic}/{partition}",
            lambda c: c.poll_messages(
                self._server.stream,
                topic,
                consumer=self._reader,
                polling_strategy=strategy,
                count=count,
                auto_commit=False,
                partition_id=partition,
            ),
        )

    async def start_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset of the first stored record (the end when none)."""
        out: dict[int, int] = {}
        for info in await self._server.partition_info(topic):
            partition = int(info.id)
            if int(info.messages_count) == 0:
                out[partition] = end_of(info)
                continue
            first = await self._own_poll(topic, partition, PollingStrategy.First(), 1)
            out[partition] = int(first[0].offset()) if first else end_of(info)
        return out
