"""The NATS JetStream log: partitions as JetStream streams (URL ``nats://host:port``).

Layout (docs/logs.md, "The NATS JetStream log"):

- **a stream per partition**, named ``<prefix>_T<topic>_P<n>`` with the
  topic escaped (:func:`escape`), whose records' subject is the stream
  name; a record's offset is its stream sequence minus one, so a read from
  an offset is a consumer started at ``offset + 1`` (no scan, no index) and
  retention is a purge below a sequence;
- **fence records** on ``<stream>.fence.<group>.<topic>.<n>`` in the streams
  written under a lease (retry and dead-letter partitions): a new lease
  holder writes one before it reads, and fenced appends expect the
  stream's last sequence, so the server refuses a stale holder's publish
  (:meth:`NatsLog.append`); offsets there skip the fence records' sequences;
- **one message per record**: a msgpack envelope ``[headers, body]`` in the
  message body, so any header name and bytes value round-trips (NATS
  headers are only used for the server's own ``Nats-*`` controls); a message
  another publisher wrote (a header of its own, or data that is no
  envelope) is read as a plain record: its data and its NATS headers;
- records too large for one message are split into chunks kept in a side
  stream ``<partition stream>_B``; the record's message names the chunks;
- **one key-value bucket** ``<prefix>_state`` holds topics (``t.<topic>``),
  committed offsets (``o.<group>.<topic>.<n>``), leases
  (``l.<group>.<topic>.<n>``) and the streams each lease wrote to
  (``f.<group>.<topic>.<n>``), written with compare-and-set on the revision.

:class:`NatsLog` implements the :class:`~wakuwaku.logs.Log` contract on four
private parts, each owning its state; each calls only the parts listed
below it, and the log's record publish and lease check, which the log hands
to the two upper ones (:meth:`NatsLog._publish`, :meth:`NatsLog._check_fence`):

- :mod:`._nats_streams`: the record format, publishing once, chunks, readers;
- :mod:`._nats_fences`: fence records, the fenced publish and their caches;
- :mod:`._nats_bucket`: the state bucket's keys and values;
- :mod:`._jetstream`: the connection and every JetStream API call, with
  typed errors.

The log itself keeps the topic cache, the compare-and-set loops of commits
and leases, and the mapping of a stream that is not there to the error the
contract names. nats-py is imported by these modules only; the root package
never imports it.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from .._errors import (
    ConfigError,
    FencedError,
    LogError,
    LogUnavailableError,
    PartitionCountMismatch,
    UnknownPartitionError,
    UnknownTopicError,
)
from .._records import Record
from ._base import (
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
from ._jetstream import (
    CAS_ATTEMPTS,
    JetStream,
    NoResponders,
    StreamNotFound,
    escape,
)
from ._jetstream import TOKEN_ENV as TOKEN_ENV  # the environment variable for the token
from ._nats_bucket import LeaseEntry, StateBucket
from ._nats_fences import Fences, fence_subjects
from ._nats_streams import PartitionStreams, encode_record
from ._url import (
    LOG_URL_OPTIONS,
    check_servers,
    check_timeout,
    log_url,
    option_timeout,
    parse_log_url,
)

__all__ = ("NatsLog", "escape")

_PREFIX_RE = re.compile(r"[A-Za-z0-9-]{1,32}")


class NatsLog(Log):
    """A :class:`~wakuwaku.logs.Log` on NATS JetStream (URL ``nats://host:port``; design §1, §15).

    :param servers: server URLs (``nats://host:port``), tried in turn.
    :param prefix: begins every stream and bucket name, so several logs share
        one server (``[A-Za-z0-9-]``, at most 32 characters).
    :param token: / :param user: / :param password: credentials; never
        printed (:attr:`url` leaves them out).
    :param timeout: bound on every request to the server (seconds); a
        request that gets no answer in time raises
        :class:`~wakuwaku.LogUnavailableError`.

    The connection is made by the first operation. While it is lost, every
    call raises :class:`~wakuwaku.LogUnavailableError` (the consumer treats
    it as Transient; a call waiting for an answer when the connection drops
    raises at once, not after ``timeout``) and the client reconnects in the
    background. Pull consumers made for reads before a reconnection are not
    used after it (a restarted server has lost them).

    :raises ConfigError: for a bad prefix or a timeout not above 0.
    """

    atomic_store = False

    def __init__(
        self,
        servers: Sequence[str] | str = "nats://127.0.0.1:4222",
        *,
        prefix: str = "wk",
        token: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        if not _PREFIX_RE.fullmatch(prefix):
            raise ConfigError(f"NATS log prefix must be 1-32 of [A-Za-z0-9-], got {prefix!r}")
        timeout = check_timeout(timeout)
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        if not self.servers:
            raise ConfigError("a NATS log needs at least one server URL")
        self.prefix = prefix
        self.timeout = float(timeout)
        self._token = token
        self._user = user
        self._password = password
        hosts = ",".join(s.split("://", 1)[-1].rsplit("@", 1)[-1] for s in self.servers)
        self.url = log_url(
            "nats", hosts, [("prefix", prefix, "wk"), ("timeout", self.timeout, 5.0)]
        )
        self._js = JetStream(
            self.servers,
            url=self.url,
            token=token,
            user=user,
            password=password,
            timeout=self.timeout,
        )
        self._state = StateBucket(self._js, prefix)
        self.bucket = self._state.name
        # Records go through self._publish and leases are checked by
        # self._check_fence, looked up at each call (tests replace them to
        # stage a takeover between two steps).
        self._streams = PartitionStreams(
            self._js,
            self.stream_name,
            lambda *message: self._publish(*message),
            lambda subject, messages: self._publish_all(subject, messages),
        )
        self._fences = Fences(
            self._js,
            self._state,
            publish=lambda *message: self._publish(*message),
            check_lease=lambda fence: self._check_fence(fence),
        )
        self._topics: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"NatsLog({self.url!r})"

    # -- names --------------------------------------------------------------

    def stream_name(self, topic: str, partition: int) -> str:
        """The JetStream stream (and subject) of one partition."""
        return f"{self.prefix}_{escape(topic)}_P{partition}"

    def _topic_key(self, topic: str) -> str:
        return self._state.topic_key(topic)

    @property
    def max_payload(self) -> int:
        """The server's largest message (bytes), read at connection; 0 before it."""
        return self._js.max_payload

    @property
    def max_record_size(self) -> int:
        """The largest record (body plus encoded headers, bytes) a producer should send.

        The server's max payload less 64 KiB, kept for the headers the engine
        adds to a retry or dead-letter copy (``wk-error``, ``wk-src``, ...),
        so a record at the limit can still be retried and dead-lettered. The
        log itself stores larger records in chunks. 0 before the connection.
        """
        return max(0, self._js.max_payload - 65_536)

    # -- the calls its parts make through the log -----------------------------

    async def _api(self, subject: str, payload: Mapping[str, Any] | None = None) -> Any:
        """A JetStream API request; returns the decoded answer (errors left in it)."""
        return await self._js.request(subject, payload)

    async def _publish(
        self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None
    ) -> int:
        """Publish one record message (or chunk); its sequence. See :meth:`JetStream.publish`."""
        return await self._js.publish(subject, payload, headers)

    async def _publish_all(
        self, subject: str, messages: Sequence[tuple[bytes, Mapping[str, str]]]
    ) -> list[int | LogError]:
        """Publish record messages to one stream, answers awaited together; see
        :meth:`JetStream.publish_all`."""
        return await self._js.publish_all(subject, messages)

    async def _check_fence(self, fence: Lease | None) -> None:
        """:raises FencedError: when ``fence`` is not its partition's current lease."""
        if fence is None:
            return
        current = await self._state.lease(fence.group, fence.topic, fence.partition)
        if current is None or current[0].generation != fence.generation:
            raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)

    async def _purge_keys(self, subject: str) -> int:
        """Purge the bucket's keys matching ``subject`` (no markers); returns how many."""
        return await self._state.purge(subject)

    # -- topics -------------------------------------------------------------

    async def create_topic(
        self, topic: str, partitions: int, *, derived_from: str | None = None
    ) -> TopicInfo:
        """Create the topic's streams, then its entry; see :meth:`Log.create_topic`.

        The entry is written last with compare-and-set, so two creators agree
        on one partition count; a loser with a larger count leaves its extra
        (empty) streams behind.
        """
        check_topic_name(topic)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"topic {topic!r}: partition count must be >= 1, got {partitions!r}")
        existing = await self._partitions_or_none(topic)
        if existing is None:
            for partition in range(partitions):
                name = self.stream_name(topic, partition)
                await self._streams.create(name, [name, fence_subjects(name)])
            if not await self._state.put_topic(topic, partitions):
                existing = await self._partitions_or_none(topic)
        if existing is not None and existing != partitions:
            raise PartitionCountMismatch(topic, existing, partitions)
        self._topics[topic] = partitions
        return TopicInfo(topic, partitions)

    async def _partitions_or_none(self, topic: str) -> int | None:
        known = self._topics.get(topic)
        if known is not None:
            return known
        count = await self._state.topic(topic)
        if count is not None:
            self._topics[topic] = count
        return count

    async def _partitions(self, topic: str) -> int:
        count = await self._partitions_or_none(topic)
        if count is None:
            raise UnknownTopicError(topic)
        return count

    async def describe_topic(self, topic: str) -> TopicInfo:
        return TopicInfo(topic, await self._partitions(topic))

    async def list_topics(self) -> list[TopicInfo]:
        return await self._state.topics()

    async def delete_topic(self, topic: str) -> bool:
        """Delete the topic's streams, offsets, leases and entry; see :meth:`Log.delete_topic`.

        The topic's entry is read from the server, not from this instance's
        cache, and removed *last*: a deletion cut short (lost connection,
        crash) leaves the topic listed, and calling this again finishes it,
        so a topic created again under the name never finds the old
        records. Leases go too, so the new topic's generations start at 1.
        Another instance that still has the topic cached gets
        :class:`~wakuwaku.UnknownTopicError` from its next append, read or
        offset query (a read through a pull consumer it kept may first
        raise :class:`~wakuwaku.LogUnavailableError` once, after
        ``timeout``); if the topic was created again in the meantime, its
        appends go to the new topic.

        :returns: True when the topic existed, False when there was nothing
            to delete.
        :raises LogUnavailableError: when the server does not answer in time;
            what was deleted stays deleted, the topic stays listed.
        :raises LogError: when the server refuses to delete a stream or key.
        """
        self._topics.pop(topic, None)  # another instance may have deleted or re-made it
        partitions = await self._partitions_or_none(topic)
        if partitions is None:
            return False
        self._streams.forget(topic)
        for partition in range(partitions):
            await self._js.delete_stream(self.stream_name(topic, partition))
            await self._streams.delete_chunks(self.stream_name(topic, partition))
        # Extra (empty) streams a losing concurrent create_topic left past the count.
        partition = partitions
        while await self._js.delete_stream(self.stream_name(topic, partition)):
            partition += 1
        await self._fences.drop(topic=topic)
        for kind in ("o", "l"):
            await self._purge_keys(self._state.keys(kind, topic=topic))
        # Purged without a marker, so the name can be created again from scratch.
        await self._purge_keys(self._topic_key(topic))
        self._topics.pop(topic, None)
        return True

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        """Purge ``group``'s offset and lease keys from the bucket; see :meth:`Log.delete_group`.

        One purge per kind of key (offsets, then leases) with a subject
        filter; the count is the server's count of purged offset keys (one
        message per key), so it is exact even while others write.

        :returns: how many committed offsets were deleted.
        :raises UnknownTopicError: when ``topic`` is given and does not exist
            (looked up on the server, not in this instance's cache).
        :raises LogUnavailableError: when the server does not answer in time.
        :raises LogError: when the server refuses the purge.
        """
        if topic is not None:
            self._topics.pop(topic, None)
            await self._partitions(topic)
        else:
            await self._state.ensure()
        await self._fences.drop(group=group, topic=topic)
        removed = await self._purge_keys(self._state.keys("o", group=group, topic=topic))
        await self._purge_keys(self._state.keys("l", group=group, topic=topic))
        return removed

    async def _missing(self, topic: str, partition: int) -> LogError:
        """Why a partition's stream is not there: the error to raise.

        The topic is looked up again on the server: gone (another instance
        deleted it) gives :class:`~wakuwaku.UnknownTopicError`, made again
        with fewer partitions :class:`~wakuwaku.UnknownPartitionError`,
        otherwise (a deletion under way, JetStream restarting)
        :class:`~wakuwaku.LogUnavailableError`.
        """
        self._topics.pop(topic, None)
        self._streams.forget(topic)
        count = await self._partitions_or_none(topic)
        if count is None:
            return UnknownTopicError(topic)
        if not 0 <= partition < count:
            return UnknownPartitionError(topic, partition, count)
        return LogUnavailableError(
            f"NATS log {self.url}: the stream of {topic}/{partition} "
            f"({self.stream_name(topic, partition)}) is not there"
        )

    async def _forget_if_deleted(self, topic: str) -> None:
        """After a failed call on ``topic``: raise UnknownTopicError when the
        topic was deleted meanwhile (by another process, whose deletion this
        instance's cache did not see), so a reader is told instead of
        retrying a pull on a stream that is gone, forever.

        :raises UnknownTopicError: when the topic no longer exists.
        """
        self._topics.pop(topic, None)
        with contextlib.suppress(LogUnavailableError):
            if await self._partitions_or_none(topic) is None:
                raise UnknownTopicError(topic) from None

    # -- records ------------------------------------------------------------

    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[OutgoingRecord],
        *,
        fence: Lease | None = None,
        token: str | None = None,
    ) -> list[int]:
        """Publish ``records`` to the partition's stream, in order; see :meth:`Log.append`.

        Each record is one message whose ``Nats-Msg-Id`` is ``<token>:<i>``
        (its index in the append; a chunk of a large record
        ``<token>:<i>:<j>``), ``token`` being the caller's or a fresh uuid4.
        A publish whose answer is lost is sent again with the same id
        within ``timeout``, and the server's deduplication (the streams'
        2-minute window) stores it once. An unfenced append sends all its
        records on the one connection, in order, then awaits their
        acknowledgements together (the server stores them in the order
        sent; from the first record whose answer is lost on they are sent
        again one by one); a fenced one publishes them one after another,
        each chained to the last sequence. Either way they are not one
        transaction (NATS 2.9 has no atomic batch): an
        append that raises :class:`~wakuwaku.LogUnavailableError` part way
        may have stored a prefix of its records, which readers see. Sent
        again with the same ``token`` within 2 minutes, it completes: the
        server drops the records already stored as duplicates (answering
        their sequences) and stores the rest, so each record is stored
        exactly once and the offsets returned are where they are.

        A fenced append is refused by the server itself once another member
        holds the lease (docs/logs.md, "Offsets, leases and fencing"): each
        publish carries ``Nats-Expected-Last-Sequence``, the stream's last
        sequence as this lease's writer knows it, and a new owner writes a
        fence record (its generation, on the subject
        ``<stream>.fence.<group>.<topic>.<n>``) into every stream the lease
        ever wrote to before it starts, so the stale writer's next publish
        finds the stream moved; it then reads the lease's last fence record:
        a higher generation raises :class:`~wakuwaku.FencedError`, its own
        (someone else wrote) sends again after the new last sequence. A
        stream is registered under the lease (a fenced write to the state
        bucket) the first time the lease writes to it. When the refusal
        comes midway through several records, the records before it are
        stored, all of them before the new owner's fence record.

        :raises ConfigError: when a record is not str -> bytes headers and a
            bytes body, or for a bad token; nothing is written then.
        :raises FencedError: when ``fence`` is no longer the current lease.
        :raises UnknownTopicError: also when this instance had the topic
            cached and another one deleted it (its stream is gone).
        :raises LogUnavailableError: when the server does not answer in time.
        """
        check_token(token)
        encoded = [encode_record(check_record(h, b), bytes(b)) for h, b in records]
        check_partition(topic, partition, await self._partitions(topic))
        stream = self.stream_name(topic, partition)
        base = token or uuid.uuid4().hex
        offsets: list[int] = []
        try:
            last = None if fence is None else await self._fences.last(fence, stream)
            if fence is None or last is None:
                payloads = [
                    await self._streams.fit(stream, data, f"{base}:{index}")
                    for index, data in enumerate(encoded)
                ]
                seqs = await self._streams.publish_in_order(stream, payloads, base)
                return [seq - 1 for seq in seqs]
            for index, data in enumerate(encoded):
                msg_id = f"{base}:{index}"
                payload = await self._streams.fit(stream, data, msg_id)
                last = await self._fences.publish(stream, payload, fence, last, msg_id)
                offsets.append(last - 1)
        except NoResponders as exc:  # the stream is gone: deleted by another instance?
            raise await self._missing(topic, partition) from exc
        return offsets

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        wait: float = 0.0,
    ) -> list[Record]:
        """Read records with offsets ``>= offset``; see :meth:`Log.read`.

        A pull consumer per partition (no acknowledgements) delivers from
        sequence ``offset + 1``; it is kept for the next read that continues
        where this one ended, and made again for any other offset or after
        a gap in the sequences it delivered (a lost delivery is read again,
        never skipped). With ``wait`` (seconds), one pull waits on the server
        for the first record. An empty answer is checked against the stream:
        a consumer may answer none for a moment after an append.
        """
        offset, max_records, wait = check_read(topic, partition, offset, max_records, wait)
        check_partition(topic, partition, await self._partitions(topic))
        pull = self._streams.read
        try:
            # An empty no-wait pull is checked against the stream unless a
            # waiting pull follows (PartitionStreams.read says why).
            found = await pull(
                topic, partition, offset + 1, max_records, 0.0, confirm_empty=wait <= 0
            )
            if not found and wait > 0:
                found = await pull(topic, partition, offset + 1, 1, wait)
                if found and max_records > 1:
                    found += await pull(
                        topic,
                        partition,
                        found[-1].offset + 2,
                        max_records - 1,
                        0.0,
                        confirm_empty=False,
                    )
        except StreamNotFound as exc:
            raise await self._missing(topic, partition) from exc
        except LogUnavailableError:
            await self._forget_if_deleted(topic)
            raise
        return found

    async def _stream_state(self, topic: str, partition: int) -> tuple[int, int, dict[str, int]]:
        """A partition stream's ``(first_seq, last_seq, {fence subject: messages})``."""
        stream = self.stream_name(topic, partition)
        info = await self._js.stream_info(
            stream, subjects_filter=fence_subjects(stream), what=f"{topic}/{partition}"
        )
        if info is None:
            raise await self._missing(topic, partition)
        state = info["state"]
        fences = {str(k): int(v) for k, v in (state.get("subjects") or {}).items()}
        return int(state["first_seq"]), int(state["last_seq"]), fences

    async def _bounds(self, topic: str) -> dict[int, tuple[int, int]]:
        """Per partition ``(start_offset, end_offset)``, fence records left out.

        Without fence records: ``first_seq - 1`` and ``last_seq`` (an empty
        stream reports ``first_seq = last_seq + 1``: the start equals the
        end). With them, the end is the last record's sequence and the start
        its first record's sequence minus one (two direct gets); a stream
        holding only fence records has both at ``last_seq``.
        """
        out: dict[int, tuple[int, int]] = {}
        for partition in range(await self._partitions(topic)):
            first, last, fences = await self._stream_state(topic, partition)
            if not fences:
                out[partition] = (max(first, 1) - 1, last)
                continue
            stream = self.stream_name(topic, partition)
            final = await self._js.direct_get(stream, {"last_by_subj": stream})
            if final is None:
                out[partition] = (last, last)
                continue
            begin = await self._js.direct_get(stream, {"seq": first, "next_by_subj": stream})
            out[partition] = (final.seq if begin is None else begin.seq - 1, final.seq)
        return out

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, one past the last record's offset; see :meth:`Log.end_offsets`.

        Fence records (written at lease takeovers, see :meth:`append`) are
        not records: a partition whose stream ends with one reports the
        offset after its last record, so the lag of a group that read
        everything is 0. The next record appended may get a higher offset.
        """
        return {p: end for p, (_, end) in (await self._bounds(topic)).items()}

    async def start_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the lowest record offset still stored (fence records left out)."""
        return {p: start for p, (start, _) in (await self._bounds(topic)).items()}

    # -- offsets and leases -------------------------------------------------

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

        A fenced commit (``fence``) is atomic with its
        check: the bucket's last sequence is read, then the leases, and the
        offset is written with ``Nats-Expected-Last-Sequence``, so any write
        to the bucket in between (a lease taken over included) makes the
        server refuse it; the check then runs again (up to 64 times).

        :raises FencedError: when the lease generation is not current.
        :raises LogUnavailableError: when the bucket stays too busy.
        """
        offset = check_commit(group, topic, partition, offset)
        check_partition(topic, partition, await self._partitions(topic))
        if fence is None:
            await self._state.put_offset(group, topic, partition, offset, stream_last=None)
            return
        await self._state.ensure()
        for _ in range(CAS_ATTEMPTS):
            last = await self._state.last_sequence()
            await self._check_fence(fence)
            if await self._state.put_offset(group, topic, partition, offset, stream_last=last):
                return
        raise LogUnavailableError(
            f"NATS log {self.url}: the bucket {self.bucket} stayed too "
            f"busy to commit {group}/{topic}/{partition}"
        )

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        return await self._state.offset(group, topic, partition)

    async def group_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """See :meth:`Log.group_offsets <wakuwaku.logs.Log.group_offsets>`."""
        await self._partitions(topic)
        return await self._state.offsets(topic)

    async def acquire_partition(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        """Take or renew a lease with compare-and-set; see :meth:`Log.acquire_partition`.

        Expiry is judged by this machine's wall clock (``time.time()``):
        members on several machines need clocks in step to well under ``ttl``.
        A lease new to this instance first writes its fence record into every
        stream registered under it (see :meth:`append`); None when a newer
        generation is already there.

        :raises ConfigError: for an empty ``member`` or a ``ttl`` not above 0.
        """
        if not member:
            raise ConfigError("a lease needs a non-empty member name")
        if ttl <= 0:
            raise ConfigError(f"a lease ttl must be > 0 seconds, got {ttl!r}")
        for _ in range(CAS_ATTEMPTS):
            current = await self._state.lease(group, topic, partition)
            now = time.time()
            revision = 0
            generation = 1
            if current is not None:
                held, revision = current
                if held.member != member and held.expires_at > now:
                    return None
                generation = held.generation + (held.member != member)
            lease = Lease(group, topic, partition, member, generation, now + float(ttl))
            entry = LeaseEntry(member, generation, lease.expires_at)
            if await self._state.put_lease(group, topic, partition, entry, revision):
                # Before anything is read under it, the lease fences the streams
                # its earlier holders wrote to (see append).
                return lease if await self._fences.fence_targets(lease) else None
        raise LogUnavailableError(
            f"NATS log {self.url}: the lease on {group}/{topic}/{partition} kept changing"
        )

    async def partition_owners(self, group: str, topic: str) -> dict[int, Lease]:
        """See :meth:`Log.partition_owners <wakuwaku.logs.Log.partition_owners>`."""
        found: dict[int, Lease] = {}
        for p in range(await self._partitions(topic)):
            held = await self._state.lease(group, topic, p)
            if held is not None and held[0].member:
                lease = held[0]
                found[p] = Lease(group, topic, p, lease.member, lease.generation, lease.expires_at)
        return found

    async def release_partition(self, lease: Lease) -> None:
        """Give up ``lease`` when it is still the current one; see :meth:`Log.release_partition`."""
        for _ in range(CAS_ATTEMPTS):
            current = await self._state.lease(lease.group, lease.topic, lease.partition)
            if current is None or current[0].generation != lease.generation:
                return
            entry = LeaseEntry("", lease.generation, 0.0)
            if await self._state.put_lease(
                lease.group, lease.topic, lease.partition, entry, current[1]
            ):
                return

    # -- retention and shutdown ---------------------------------------------

    async def apply_retention(self, topic: str) -> int:
        """Purge records below the lowest committed offset of every group (per partition).

        A partition on which no group ever committed keeps everything.
        Chunks of purged large records are purged too. Fence records are
        not purged with the records: each lease keeps its newest one (a
        lease's fence must outlive the records below it, see :meth:`append`).

        :returns: how many records were purged.
        :raises UnknownTopicError: when the topic does not exist.
        """
        offsets = await self.group_offsets(topic)
        bounds = await self._bounds(topic)
        removed = 0
        for partition, (start, end) in bounds.items():
            marks = [parts[partition] for parts in offsets.values() if partition in parts]
            if not marks:
                continue
            keep = min(min(marks), end) + 1  # the first sequence kept
            if keep <= start + 1:
                continue
            stream = self.stream_name(topic, partition)
            await self._streams.purge_chunks(stream, keep)
            removed += await self._js.purge(stream, {"filter": stream, "seq": keep})
            self._streams.forget(topic, partition)
            _, _, fences = await self._stream_state(topic, partition)
            for subject, count in fences.items():
                if count > 1:
                    await self._js.purge(stream, {"filter": subject, "keep": 1})
        return removed

    async def close(self) -> None:
        """Close the connection; calling it again does nothing."""
        await self._js.close()

    # -- URLs ---------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str) -> NatsLog:
        """Build a log from ``nats://[token@|user:password@]host:port[,host:port...][?options]``.

        Options: ``prefix`` (see the constructor), ``timeout`` (seconds). A
        URL without credentials takes a token from ``WAKUWAKU_NATS_TOKEN``.

        :raises ConfigError: for a URL without a host, with an unknown
            option, or with a ``timeout`` that is not seconds above 0 (NaN
            and infinity included).
        """
        parsed = parse_log_url(url, {"nats": LOG_URL_OPTIONS["nats"]})
        credentials, at, hosts = parsed.rest.rstrip("/").rpartition("@")
        check_servers("NATS", hosts, "nats://host:port[,host:port]")
        token = user = password = None
        if at:
            name, colon, secret = credentials.partition(":")
            if colon:
                user, password = unquote(name), unquote(secret)
            else:
                token = unquote(name)
        servers = [f"nats://{host}" for host in hosts.split(",")]
        return cls(
            servers,
            prefix=parsed.options.get("prefix", "wk"),
            token=token,
            user=user,
            password=password,
            timeout=option_timeout(parsed, "timeout", 5.0),
        )
