"""The consumer groups' stored offsets on Iggy: read, store, delete.

Owns the offsets the Iggy log stores on the server and the binary
commands that carry them (get, store and delete offset, which
apache-iggy 0.9.0 does not wrap). A group's committed offsets are the
offsets of the Iggy consumer named ``<group>`` (:data:`KIND_CONSUMER`, on
the log's connection); a member's commit of a partition it owns first
stores the same offset as its Iggy consumer group's (:data:`KIND_GROUP`,
on the member's own connection), which the server refuses once it moved
the partition: its consumer-group offset fence.

Iggy stores "the last record consumed": a committed offset N is stored as
N - 1, 0 as no offset at all, and an offset past the partition's last
record is refused.

May call: :mod:`._server` (the log's connection, the topic cache, end
offsets, identifiers), a :class:`~._groups.Member`'s connection through
:meth:`~._groups.Member.call`. Called by the log (:mod:`._log`).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable

from apache_iggy import IggyClient

from ..._errors import ConfigError, FencedError, LogError, LogUnavailableError
from .._base import TopicInfo, check_partition
from ._groups import Member
from ._server import Server, ident

__all__ = ("KIND_CONSUMER", "KIND_GROUP", "Offsets")

KIND_CONSUMER = 1
"""The offset of a plain Iggy consumer (a group's committed offset)."""
KIND_GROUP = 2
"""The offset of an Iggy consumer group (fenced by the server's assignment)."""

# Binary commands apache-iggy 0.9.0 does not wrap (codes of the server's protocol).
_GET_OFFSET = 120
_STORE_OFFSET = 121
_DELETE_OFFSET = 122
_ACK_QUORUM = 1


class Offsets:
    """The groups' offsets stored on the Iggy server."""

    def __init__(self, server: Server) -> None:
        self._server = server

    def _request(
        self, kind: int, consumer: str, topic: str, partition: int, tail: bytes = b""
    ) -> bytes:
        return (
            bytes((kind,))
            + ident(consumer)
            + ident(self._server.stream)
            + ident(topic)
            + b"\x01"
            + struct.pack("<I", partition)
            + tail
        )

    async def _stored(self, kind: int, group: str, topic: str, p: int) -> int:
        """The stored offset (Iggy's: the last consumed record), -1 when none."""
        request = self._request(kind, group, topic, p)
        answer = await self._server.ask(
            f"committed offset {topic}/{p}",
            lambda c: c.send_binary_request(_GET_OFFSET, request),
        )
        if len(answer) < 20:
            return -1
        return int(struct.unpack_from("<Q", answer, 12)[0])

    async def group_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """Committed offsets on ``topic`` of every group that has an Iggy consumer
        group on it (see ``IggyLog.group_offsets``)."""
        count = await self._server.partitions(topic)
        groups = await self._server.ask(
            f"list groups of {topic}",
            lambda c: c.get_consumer_groups(self._server.stream, topic),
        )
        out: dict[str, dict[int, int]] = {}
        for name in sorted({g.name for g in groups}):
            stored = {p: await self._stored(KIND_CONSUMER, name, topic, p) for p in range(count)}
            offsets = {p: o + 1 for p, o in stored.items() if o >= 0}
            if offsets:
                out[name] = offsets
        return out

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset: one past the stored one; None when none
        was stored or the topic is gone."""
        count = await self._server.partitions_or_none(topic)
        if count is None:
            return None
        check_partition(topic, partition, count)
        try:
            stored = await self._stored(KIND_CONSUMER, group, topic, partition)
        except LogUnavailableError:
            raise
        except LogError:
            if await self._server.partitions_or_none(topic, fresh=True) is None:
                return None
            raise
        return None if stored < 0 else stored + 1

    async def commit(
        self, group: str, topic: str, partition: int, offset: int, owner: Member | None
    ) -> None:
        """Store ``offset`` (the next to read) as the group's; first as ``owner``'s
        Iggy consumer group's when given (the server's fence), 0 deletes it."""
        if offset == 0:
            await self._delete_offset(KIND_CONSUMER, group, topic, partition)
            return
        if owner is not None:
            await self.store(owner, KIND_GROUP, group, topic, partition, offset - 1)
        await self.store(None, KIND_CONSUMER, group, topic, partition, offset - 1)

    async def store(
        self, owner: Member | None, kind: int, group: str, topic: str, partition: int, stored: int
    ) -> None:
        """Store ``stored`` as Iggy's offset: the group's (:data:`KIND_GROUP`, on
        ``owner``'s connection, fenced by the server) or the consumer's named
        ``group`` (:data:`KIND_CONSUMER`, on the log's connection).

        :raises FencedError: when the server refuses a group's offset.
        :raises ConfigError: for an offset past the partition's end offset.
        """
        request = self._request(
            kind, group, topic, partition, struct.pack("<Q", stored) + bytes((_ACK_QUORUM,))
        )

        def send(client: IggyClient) -> Awaitable[bytes]:
            return client.send_binary_request(_STORE_OFFSET, request)

        what = f"commit {topic}/{partition}"
        try:
            if owner is not None:
                await owner.call(what, send)
            else:
                await self._server.call(what, send)
        except LogUnavailableError:
            raise
        except LogError as exc:
            await self._server.unknown_topic(topic)
            if kind == KIND_GROUP:
                raise FencedError(group, topic, partition, -1) from exc
            ends = await self._server.end_offsets(topic)
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
        request = self._request(kind, group, topic, partition, bytes((_ACK_QUORUM,)))
        await self._server.call(
            f"delete offset {topic}/{partition}",
            lambda c: c.send_binary_request(_DELETE_OFFSET, request),
        )
        return True

    async def delete(self, group: str, topic: TopicInfo) -> int:
        """Delete the group's stored offsets on every partition of ``topic``.

        :returns: how many there were.
        """
        deleted = 0
        for partition in range(topic.partitions):
            if await self._delete_offset(KIND_CONSUMER, group, topic.name, partition):
                deleted += 1
        return deleted
