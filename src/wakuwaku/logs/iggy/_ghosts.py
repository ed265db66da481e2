"""Group members the Iggy server keeps after it crashed (ghosts): found and cleared.

An Iggy consumer-group member is a client session. The server removes it
only by a replicated logout, which it writes when the member's connection
closes or when its heartbeat check evicts a connected member that stopped
pinging (Iggy 0.9.0-edge.5: ``core/metadata/src/stm/consumer_group.rs``,
``core/server/src/dispatch.rs``). A server killed with SIGKILL (or whose
machine lost power) wrote none: started again, it replays the joins and
keeps every member of before, sessions with no connection, with their
partitions. Nothing on the server removes them, and no client command
removes one member: only the session itself can log out, apache-iggy
refuses session commands in ``send_binary_request``, and each client has a
random session id of its own. The members that join again get only the
rest, and the ghosts' partitions are never consumed.

Owns the watch of each Iggy consumer group this instance has a member in
(one per group and topic). A check asks the server for the group's members
and for its connected clients (``GetClients``, code 22, then ``GetClient``,
code 21, of each client that is in a group: which groups it is a member
of; apache-iggy 0.9.0 wraps neither), and reads the group again after the
clients: only when both reads agree does it count. The group's members less
the connected clients that are members of it are its ghosts (the server
numbers members and clients apart, so which member is a ghost cannot be
read; the members of this instance are known by their partitions).

Ghosts seen in checks at least :data:`_CONFIRM` seconds apart, in the same
Iggy group (its numeric id, which the server never reuses on a topic), are
cleared: the group is deleted by that id, so a group another process already
made again is never deleted, and made again, empty. Every live member of
every process finds at its next assignment sync that it is no member any
more and joins again (:mod:`._groups`), so the partitions are spread over
the live members. The group's committed offsets are the offsets of the Iggy
consumer ``<group>``, which deleting an Iggy consumer group keeps; the
consumer-group offsets (the server's fence, :mod:`._offsets`) go with the
old group. What the live members had in flight is delivered again from the
committed offsets (at least once). Each clearance is logged as an error,
and so is a ghost that cannot be cleared (with what to do), again every
:data:`_SAY_AGAIN` seconds while it stays.

Checks run every :data:`_CHECK_EVERY` seconds, and every :data:`_CHECK_SOON`
seconds for :data:`_SOON_FOR` seconds after a member of this instance
joined: ghosts come with a server restart, and every live member joins
again after one.

May call: :mod:`._server` (the log's connection, identifiers). Called by
:mod:`._groups`.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TypeVar

from apache_iggy import ConsumerGroupDetails

from ..._errors import LogError, LogUnavailableError
from ._server import Server

__all__ = ("Ghosts", "Sighting")

logger = logging.getLogger("wakuwaku.logs.iggy")

_T = TypeVar("_T")

_GET_CLIENT = 21  # the server's binary command: one client and its groups
_GET_CLIENTS = 22  # the server's binary command: every connected client
_CHECK_EVERY = 30.0  # seconds between a group's checks
_CHECK_SOON = 1.0  # seconds between checks for _SOON_FOR seconds after a join
_SOON_FOR = 30.0
_CONFIRM = 1.0  # seconds ghosts must stay before they are cleared
_SAY_AGAIN = 30.0  # seconds between errors about ghosts that stay


@dataclass(frozen=True)
class Sighting:
    """What one check of a group found.

    :param group_id: the Iggy consumer group's numeric id.
    :param members: its members (the server's member ids) and their partitions.
    :param ghosts: how many of them no connected client is.
    """

    group_id: int
    members: dict[int, tuple[int, ...]]
    ghosts: int


@dataclass
class _Watch:
    """The checks of one group on one topic."""

    due: float = 0.0  # time.monotonic() of the next check
    soon_until: float = 0.0
    first_seen: float | None = None  # the first check of the ghosts seen now
    group_id: int = -1
    said: float = -math.inf  # when an error about them was last logged
    refused: bool = False  # the server refused a check: said once


def _clients(raw: bytes) -> list[tuple[int, int]]:
    """``GetClients``' answer: (client id, how many groups it is in) per client."""
    out: list[tuple[int, int]] = []
    pos = 0
    while pos + 17 <= len(raw):
        client_id, _user, _transport, length = struct.unpack_from("<IIBI", raw, pos)
        (groups,) = struct.unpack_from("<I", raw, pos + 13 + length)
        out.append((client_id, groups))
        pos += 17 + length
    return out


def _memberships(raw: bytes) -> set[tuple[int, int, int]]:
    """``GetClient``'s answer: the (stream id, topic id, group id) of each group
    the client is in; none for a client gone meanwhile (an empty answer)."""
    if len(raw) < 17:
        return set()
    (length,) = struct.unpack_from("<I", raw, 9)
    (count,) = struct.unpack_from("<I", raw, 13 + length)
    start = 17 + length
    return {struct.unpack_from("<III", raw, start + 12 * i) for i in range(count)}


def _shape(found: ConsumerGroupDetails) -> dict[int, tuple[int, ...]]:
    """A group's members (``get_consumer_group``): member id -> its partitions."""
    return {int(m.id): tuple(sorted(int(p) for p in m.partitions)) for m in found.members}


def _not_ours(
    sighting: Sighting, ours: Collection[frozenset[int]]
) -> tuple[dict[int, list[int]], str]:
    """The members of a sighting that are not this instance's, and what to say of them.

    Members are told apart by their partitions only: one holding what a
    member of this instance holds is that member. Members holding no
    partition cannot be told apart, so as many of them as this instance has
    such members are counted as its own, without naming which.

    :returns: the members not of this instance that can be named (member id
        -> partitions; members holding no partition are left out when some
        of them are this instance's), and the words naming the ghosts.
    """
    idle = [m for m, p in sighting.members.items() if not p]
    named = {m: list(p) for m, p in sighting.members.items() if p and frozenset(p) not in ours}
    unnamed = max(0, len(idle) - sum(1 for p in ours if not p))
    parts = [f"member #{m} holding partitions {p}" for m, p in named.items()]
    if unnamed == len(idle):
        named.update({m: [] for m in idle})
        parts += [f"member #{m} holding no partition" for m in idle]
    elif unnamed:
        ids = ", ".join(f"#{m}" for m in idle)
        parts.append(
            f"{unnamed} of the members holding no partition ({ids}; the others are this process's)"
        )
    if not parts:
        return named, (
            "which ones cannot be told: every member listed holds what a member of this "
            "process holds"
        )
    text = ", ".join(parts)
    if len(named) + (unnamed if unnamed < len(idle) else 0) == sighting.ghosts:
        return named, f"they are {text}"
    return named, f"they are among its members not of this process: {text}"


class Ghosts:
    """The ghost checks of this instance's Iggy consumer groups (see the module)."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._watches: dict[tuple[str, str], _Watch] = {}

    def joined(self, group: str, topic: str) -> None:
        """A member of this instance joined ``group`` on ``topic``: check it soon and
        every :data:`_CHECK_SOON` seconds for :data:`_SOON_FOR` seconds."""
        watch = self._watches.setdefault((group, topic), _Watch())
        now = time.monotonic()
        watch.soon_until = now + _SOON_FOR
        watch.due = min(watch.due, now + _CHECK_SOON)

    def forget(self, group: str, topic: str) -> None:
        """No member of this instance is in ``group`` on ``topic`` any more."""
        self._watches.pop((group, topic), None)

    async def check(self, group: str, topic: str, ours: Collection[frozenset[int]]) -> bool:
        """Check ``group`` on ``topic`` for ghosts when a check is due; clear them
        once confirmed.

        :param ours: the partitions of each member of this instance in the group
            (to tell its members from the others in what is logged).
        :returns: True when the group was deleted and made again (this
            instance's members should sync now). Errors are logged, not raised.
        """
        watch = self._watches.setdefault((group, topic), _Watch())
        now = time.monotonic()
        if now < watch.due:
            return False
        watch.due = now + (_CHECK_SOON if now < watch.soon_until else _CHECK_EVERY)
        try:
            sighting = await self.look(group, topic)
        except LogUnavailableError as exc:
            logger.debug("Iggy group %s on %s: ghost check failed: %s", group, topic, exc)
            return False
        except LogError as exc:
            if not watch.refused:
                watch.refused = True
                logger.warning(
                    "cannot check the Iggy consumer group %r on topic %r for members a "
                    "server crash left behind (%s); listing the server's clients needs "
                    "Iggy's read_servers permission. Unchecked, the partitions such a "
                    "member holds after a crash stay unconsumed",
                    group,
                    topic,
                    exc,
                    extra={"group": group, "topic": topic, "error": str(exc)},
                )
            return False
        if sighting is None or sighting.ghosts <= 0:
            watch.first_seen = None
            return False
        if watch.first_seen is None or watch.group_id != sighting.group_id:
            watch.first_seen, watch.group_id = now, sighting.group_id
            watch.due = min(watch.due, now + _CONFIRM)
            return False
        if now - watch.first_seen < _CONFIRM:
            return False
        return await self._clear(group, topic, sighting, ours, watch)

    async def look(self, group: str, topic: str) -> Sighting | None:
        """The group's members and how many of them no connected client is; None
        when there is no such group, or it changed while it was checked.

        :raises LogError: when the server refuses (listing clients needs the
            ``read_servers`` permission), or answers what this log cannot read.
        :raises LogUnavailableError: when it does not answer.
        """
        server, stream = self._server, self._server.stream
        before = await server.ask(
            "describe group", lambda c: c.get_consumer_group(stream, topic, group)
        )
        if before is None or not before.members:
            return None
        found_stream = await server.ask("get stream", lambda c: c.get_stream(stream))
        found_topic = await server.ask("describe topic", lambda c: c.get_topic(stream, topic))
        if found_stream is None or found_topic is None:
            return None
        key = (int(found_stream.id), int(found_topic.id), int(before.id))
        raw = await server.ask("list clients", lambda c: c.send_binary_request(_GET_CLIENTS, b""))
        live = 0
        for client_id, groups in self._read("list clients", _clients, raw):
            if groups == 0:
                continue
            live += key in await self._groups_of(client_id)
        after = await server.ask(
            "describe group", lambda c: c.get_consumer_group(stream, topic, group)
        )
        members = _shape(before)
        if after is None or int(after.id) != key[2] or _shape(after) != members:
            return None
        return Sighting(key[2], members, len(members) - live)

    async def in_group(self, client_id: int, group_id: int) -> bool:
        """Whether client ``client_id`` (a session) is connected and a member of
        the Iggy consumer group with id ``group_id`` (of any topic: group ids
        are numbered per topic, so another topic's group may answer yes).

        :raises LogError: as :meth:`look` does.
        """
        return any(key[2] == group_id for key in await self._groups_of(client_id))

    async def _groups_of(self, client_id: int) -> set[tuple[int, int, int]]:
        """The (stream id, topic id, group id) of each group client ``client_id`` is in."""
        request = struct.pack("<I", client_id)
        answer = await self._server.ask(
            "describe client", lambda c: c.send_binary_request(_GET_CLIENT, request)
        )
        return self._read("describe client", _memberships, answer)

    def _read(self, what: str, parse: Callable[[bytes], _T], raw: bytes) -> _T:
        """``parse(raw)``; :raises LogError: for an answer it cannot read (a
        server whose protocol differs)."""
        try:
            return parse(raw)
        except struct.error as exc:
            raise LogError(
                f"Iggy log {self._server.url} failed ({what}): an answer of "
                f"{len(raw)} bytes this log cannot read ({exc}): another server release?"
            ) from exc

    async def _clear(
        self,
        group: str,
        topic: str,
        sighting: Sighting,
        ours: Collection[frozenset[int]],
        watch: _Watch,
    ) -> bool:
        """Delete the group by its id and make it again; log what was done or why not."""
        server, stream = self._server, self._server.stream
        others, text = _not_ours(sighting, ours)
        seen = (
            f"Iggy consumer group {group!r} on topic {topic!r} (stream {stream!r}): "
            f"{sighting.ghosts} of its {len(sighting.members)} members are no connected "
            "client (members the server kept from before it was killed or lost power; "
            "nobody consumes their partitions); " + text
        )
        extra = {
            "group": group,
            "topic": topic,
            "ghosts": sighting.ghosts,
            "members": others,
            "iggy_group_id": sighting.group_id,
        }
        try:
            await server.call(
                "delete group",
                lambda c: c.delete_consumer_group(stream, topic, sighting.group_id),
            )
        except LogUnavailableError as exc:
            logger.debug("Iggy group %s on %s: clearing ghosts failed: %s", group, topic, exc)
            return False
        except LogError as exc:
            if await self._still(group, topic, sighting.group_id):
                self._say_stuck(seen, group, topic, exc, watch, extra)
                return False
            # Deleted by another process, which clears them and said so.
            logger.info("%s. Another process deleted that group meanwhile", seen, extra=extra)
            watch.first_seen = None
            return True
        try:
            await server.call(
                "create group", lambda c: c.create_consumer_group(stream, topic, group)
            )
        except LogError as exc:
            # Made by another process meanwhile, or not now: a member's join
            # makes it when missing.
            logger.debug("Iggy group %s on %s: re-creating it: %s", group, topic, exc)
        logger.error(
            "%s. Deleted that group and made it again: every member joins it again; the "
            "group's committed offsets are kept, what was in flight is delivered again",
            seen,
            extra=extra,
        )
        watch.first_seen = None
        watch.said = -math.inf
        return True

    async def _still(self, group: str, topic: str, group_id: int) -> bool:
        """Whether the group with id ``group_id`` is still there (a refused delete);
        False also when the server does not answer (checked again later)."""
        stream = self._server.stream
        try:
            found = await self._server.ask(
                "describe group", lambda c: c.get_consumer_group(stream, topic, group)
            )
        except LogError:
            return False
        return found is not None and int(found.id) == group_id

    def _say_stuck(
        self,
        seen: str,
        group: str,
        topic: str,
        exc: LogError,
        watch: _Watch,
        extra: dict[str, object],
    ) -> None:
        now = time.monotonic()
        if now - watch.said < _SAY_AGAIN:
            return
        watch.said = now
        stream = self._server.stream
        logger.error(
            "%s. Could not delete that group (%s): delete it yourself, e.g. `iggy "
            "consumer-group delete %s %s %s` (the log's user needs the permission to "
            "delete consumer groups); every member then joins it again and the group's "
            "committed offsets are kept",
            seen,
            exc,
            stream,
            topic,
            group,
            extra={**extra, "error": str(exc)},
        )
