"""The NATS log's state bucket: topics, committed offsets and leases, one key each.

Owns the key-value bucket ``<prefix>_state`` (the stream ``KV_<prefix>_state``,
made by the first call that needs it) and its keys, every name in them
escaped (:func:`~._jetstream.escape`):

- ``t.<topic>``: the topic's name and partition count;
- ``o.<group>.<topic>.<n>``: a group's committed offset;
- ``l.<group>.<topic>.<n>``: a partition's lease (member, generation, expiry);
- ``f.<group>.<topic>.<n>``: the streams a lease wrote to, which a new
  holder of the lease fences (see ``NatsLog.append``).

It reads a key's latest value with its revision, writes one with
compare-and-set (on the key's revision, or on the bucket's last sequence so
that any other write in between makes it lose), lists and purges keys by
subject, and encodes each kind of value. It decides nothing: its callers
run the compare-and-set loops (commits, leases, a lease's list of streams).

May call: :mod:`._jetstream` only (its values are its own structs and the
contract's :class:`~wakuwaku.logs.TopicInfo`).
"""

from __future__ import annotations

import msgspec

from ._base import TopicInfo
from ._jetstream import DUPLICATE_WINDOW_NS, JetStream, WrongLastSequence, escape

__all__ = ("LeaseEntry", "StateBucket", "encode")

encode = msgspec.msgpack.Encoder().encode
"""msgpack, as every value of the bucket and every record envelope is written."""


class LeaseEntry(msgspec.Struct, gc=False):
    """A lease as its key holds it (an empty member: released)."""

    member: str
    generation: int
    expires_at: float


class _Offset(msgspec.Struct, array_like=True, gc=False):
    group: str
    offset: int


class _Topic(msgspec.Struct, gc=False):
    name: str
    partitions: int


class StateBucket:
    """The bucket ``<prefix>_state`` of one NATS log.

    :param js: the log's JetStream client.
    :param prefix: the log's prefix (the bucket is ``<prefix>_state``).
    """

    def __init__(self, js: JetStream, prefix: str) -> None:
        self._js = js
        self.name = f"{prefix}_state"
        self.stream = f"KV_{self.name}"
        self._ready = False

    # -- keys ---------------------------------------------------------------

    def key(self, kind: str, group: str, topic: str, partition: int) -> str:
        """The subject of the ``kind`` key (``o``, ``l``, ``f``) of one group's partition."""
        return f"$KV.{self.name}.{kind}.{escape(group)}.{escape(topic)}.{partition}"

    def topic_key(self, topic: str) -> str:
        """The subject of the topic's entry."""
        return f"$KV.{self.name}.t.{escape(topic)}"

    def keys(self, kind: str, *, group: str | None = None, topic: str | None = None) -> str:
        """The subject matching the ``kind`` keys of ``group`` on ``topic`` (None: any)."""
        who = "*" if group is None else escape(group)
        where = ">" if topic is None else f"{escape(topic)}.*"
        return f"$KV.{self.name}.{kind}.{who}.{where}"

    # -- reads and writes ---------------------------------------------------

    async def ensure(self) -> None:
        """Create the bucket's stream unless this instance saw it made.

        :raises LogError: when the server refuses to create it.
        """
        if self._ready:
            return
        config = {
            "name": self.stream,
            "subjects": [f"$KV.{self.name}.>"],
            "max_msgs_per_subject": 1,
            "discard": "new",
            "allow_rollup_hdrs": True,
            "deny_delete": True,
            "allow_direct": True,
            "storage": "file",
            "num_replicas": 1,
            "duplicate_window": DUPLICATE_WINDOW_NS,
        }
        await self._js.create_stream(config, what=f"cannot create bucket {self.name}")
        self._ready = True

    async def get(self, subject: str) -> tuple[bytes, int] | None:
        """The latest value of a key and its revision, or None."""
        await self.ensure()
        found = await self._js.direct_get(self.stream, {"last_by_subj": subject})
        return None if found is None else (found.data, found.seq)

    async def put(
        self,
        subject: str,
        value: bytes,
        *,
        revision: int | None = None,
        stream_last: int | None = None,
    ) -> bool:
        """Write a key; False when the compare-and-set lost.

        :param revision: the key's revision this write replaces (0: the key
            must not exist); None writes unconditionally.
        :param stream_last: the bucket's last sequence this write expects:
            any other write to the bucket since makes it lose.
        :raises LogError: when the server refuses the write for another reason.
        """
        headers: dict[str, str] = {}
        if revision is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(revision)
        if stream_last is not None:
            headers["Nats-Expected-Last-Sequence"] = str(stream_last)
        await self.ensure()
        try:
            await self._js.publish(
                subject, value, headers or None, what=f"writing {subject} failed"
            )
        except WrongLastSequence:
            return False
        return True

    async def last_sequence(self) -> int:
        """The bucket's last sequence: what a write with ``stream_last`` expects."""
        return await self._js.last_sequence(self.stream)

    async def purge(self, subject: str) -> int:
        """Purge the keys matching ``subject`` (no markers); returns how many.

        :raises LogError: when the server refuses the purge.
        """
        return await self._js.purge(
            self.stream, {"filter": subject}, what=f"cannot purge {subject}"
        )

    async def scan(self, subject: str) -> list[tuple[str, bytes]]:
        """The latest value of every key matching ``subject``: (subject, value)."""
        config = {
            "ack_policy": "none",
            "deliver_policy": "last_per_subject",
            "filter_subject": subject,
            "inactive_threshold": 60_000_000_000,
            "mem_storage": True,
            "num_replicas": 1,
        }
        answer = await self._js.create_consumer(self.stream, config, what=f"cannot list {subject}")
        consumer = answer["name"]
        pending = int(answer.get("num_pending", 0))
        out: list[tuple[str, bytes]] = []
        try:
            while len(out) < pending:
                msgs = await self._js.fetch(
                    self.stream, consumer, min(1000, pending - len(out)), 0.0
                )
                if not msgs:
                    break
                out.extend((m.subject, m.data) for m in msgs if m.data)
        finally:
            await self._js.delete_consumer(self.stream, consumer)
        return out

    # -- what the keys hold -------------------------------------------------

    async def topic(self, topic: str) -> int | None:
        """The topic's partition count, None when it has no entry."""
        found = await self.get(self.topic_key(topic))
        return None if found is None else msgspec.msgpack.decode(found[0], type=_Topic).partitions

    async def put_topic(self, topic: str, partitions: int) -> bool:
        """Write the topic's entry unless there is one; False when there is."""
        return await self.put(self.topic_key(topic), encode(_Topic(topic, partitions)), revision=0)

    async def topics(self) -> list[TopicInfo]:
        """Every topic's entry, by name."""
        await self.ensure()
        entries = await self.scan(f"$KV.{self.name}.t.>")
        topics = [msgspec.msgpack.decode(data, type=_Topic) for _, data in entries]
        return sorted((TopicInfo(t.name, t.partitions) for t in topics), key=lambda t: t.name)

    async def offset(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset of the partition, or None."""
        found = await self.get(self.key("o", group, topic, partition))
        return None if found is None else msgspec.msgpack.decode(found[0], type=_Offset).offset

    async def put_offset(
        self, group: str, topic: str, partition: int, offset: int, *, stream_last: int | None
    ) -> bool:
        """Write the group's offset (see :meth:`put` for ``stream_last``); False when it lost."""
        value = encode(_Offset(group, offset))
        return await self.put(
            self.key("o", group, topic, partition), value, stream_last=stream_last
        )

    async def offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """Every group's committed offsets on ``topic``: ``{group: {partition: offset}}``."""
        found: dict[str, dict[int, int]] = {}
        for subject, data in await self.scan(self.keys("o", topic=topic)):
            entry = msgspec.msgpack.decode(data, type=_Offset)
            found.setdefault(entry.group, {})[int(subject.rsplit(".", 1)[1])] = entry.offset
        return {g: dict(sorted(parts.items())) for g, parts in sorted(found.items())}

    async def lease(self, group: str, topic: str, partition: int) -> tuple[LeaseEntry, int] | None:
        """The partition's lease and its key's revision, or None when never taken."""
        found = await self.get(self.key("l", group, topic, partition))
        if found is None:
            return None
        return msgspec.msgpack.decode(found[0], type=LeaseEntry), found[1]

    async def put_lease(
        self, group: str, topic: str, partition: int, lease: LeaseEntry, revision: int
    ) -> bool:
        """Write the partition's lease over ``revision``; False when the key moved on."""
        subject = self.key("l", group, topic, partition)
        return await self.put(subject, encode(lease), revision=revision)
