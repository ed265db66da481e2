"""The Iggy log's group members: who owns which partition, as the server assigns it.

Owns this instance's members (:class:`Member`, one per group and member
name) and their memberships of Iggy consumer groups: a member joins the
Iggy consumer group ``<group>`` of each topic it reads, over a connection
of its own (Iggy's group members are sessions), creating the group when
missing; it asks the server for its assignment (the binary command
``SyncConsumerGroup``, code 606, which apache-iggy 0.9.0 does not wrap) every
:data:`_SYNC_EVERY` seconds and before each fenced write but a commit of
its own partition past offset 0, which the server fences itself
(:meth:`Groups.fence_owner`), and gives each partition it is assigned a
lease generation of this process. Each change wakes whoever waits in
:meth:`Groups.changed`. A member's connection that fails is dropped with
its memberships (a new session is no member of anything): the engine sees
its partitions gone and acquires them again, joining anew. The dropped
session stays in its groups until the server sees its connection close
(:class:`Dropped`): :meth:`Groups.owners` names its partitions after the
member until then, not after another process's member.

Each member's task also runs the ghost checks of its groups (:mod:`._ghosts`:
members a crashed server kept, whose partitions nobody consumes); when they
deleted a group and made it again, this instance's members of it sync at
once, find they are no members any more, and join again.

Also the answers about a group that need no member of it: who owns each
partition, from the server (:meth:`Groups.owners`), and the deletion of an
Iggy consumer group (:meth:`Groups.drop_group`).

May call: :mod:`._server` (the log's connection, connections of its own,
the bound on calls, identifiers), :mod:`._ghosts`. Called by the log (:mod:`._log`) and by
the stored offsets (:mod:`._offsets`), which send a member's group offset
on its connection (:meth:`Member.call`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from apache_iggy import IggyClient

from ..._clock import BLOCKING_CALLS
from ..._errors import FencedError, LogError, LogUnavailableError
from .._base import Lease
from ._ghosts import Ghosts
from ._server import Server, ident

__all__ = ("Dropped", "Groups", "Joined", "Member")

logger = logging.getLogger("wakuwaku.logs.iggy")

_T = TypeVar("_T")

_SYNC_EVERY = 0.5  # seconds between a member's assignment syncs
_OWNERS_TRIES = 3  # server reads of a group's members while this instance's members move
_SYNC_GROUP = 606  # the server's binary command: a member's assignment in one group
_GET_ME = 20  # the server's binary command: this connection's client (its id first)
_generations = itertools.count(1)


@dataclass
class Joined:
    """One Iggy consumer-group membership of a member (one topic)."""

    partitions: dict[int, int] = field(default_factory=dict)  # partition -> lease generation
    server_generation: int = -1


@dataclass
class Dropped:
    """The session of a member's connection that was dropped while it was in
    groups: it stays in them, with its partitions, until the server sees its
    connection close (a call still running on it keeps it open)."""

    group: str
    member: str
    topics: set[str]  # the topics whose Iggy group it may still be in


class Member:
    """One group member: a connection of its own (Iggy's group members are
    sessions), the topics whose Iggy consumer group it joined, and a task
    that asks the server for its assignment every :data:`_SYNC_EVERY` seconds."""

    def __init__(
        self, server: Server, group: str, member: str, dropped: dict[int, Dropped]
    ) -> None:
        self.group = group
        self.member = member
        self.client: IggyClient | None = None
        self.topics: dict[str, Joined] = {}
        self.held: set[tuple[str, int]] = set()
        self.joining = asyncio.Lock()
        self.changed = asyncio.Event()  # replaced at each change: waiters keep theirs
        self.task: asyncio.Task[None] | None = None
        self.session: int | None = None  # the server's client id of the connection
        self._dropped = dropped  # Groups.dropped
        self._server = server

    def bump(self) -> None:
        """Wake whoever waits for a change of this member's assignment."""
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    async def call(self, what: str, call: Callable[[IggyClient], Awaitable[_T]]) -> _T:
        """``call`` on the member's own connection. A connection that fails is
        dropped with its memberships (a new session is no member of anything):
        the engine sees its partitions gone and acquires them again, joining anew.
        """
        if self.client is None:
            client = await self._server.connect()
            self.session = await self._session_of(client)
            self.client = client
        client = self.client
        try:
            return await self._server.bounded(what, lambda: call(client))
        except LogUnavailableError:
            if self.client is client:
                self.client = None
                if self.topics:
                    if self.session is not None:
                        self._dropped[self.session] = Dropped(
                            self.group, self.member, set(self.topics)
                        )
                    self.topics.clear()
                    self.held.clear()
                    self.bump()
            raise

    async def _session_of(self, client: IggyClient) -> int | None:
        """The server's client id of ``client``'s connection (``GetMe``), None
        when it cannot be read (its session is then not followed once dropped)."""
        try:
            answer = await self._server.bounded(
                "who am I", lambda: client.send_binary_request(_GET_ME, b"")
            )
        except LogUnavailableError:
            raise
        except LogError as exc:
            logger.debug("Iggy group %s: cannot read the member's session: %s", self.group, exc)
            return None
        return struct.unpack_from("<I", answer)[0] if len(answer) >= 4 else None


class Groups:
    """This instance's group members and what the server says of their groups."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.members: dict[tuple[str, str], Member] = {}
        """This instance's members, by (group, member name)."""
        self.ghosts = Ghosts(server)
        self.dropped: dict[int, Dropped] = {}
        """Sessions of this instance's members that may still be in groups, by
        the server's client id (see :class:`Dropped`)."""

    async def _member(self, group: str, member: str) -> Member:
        key = (group, member)
        found = self.members.get(key)
        if found is None:
            found = self.members.setdefault(key, Member(self._server, group, member, self.dropped))
        if found.task is None or found.task.done():
            found.task = asyncio.create_task(
                self._keep_synced(found), name=f"wakuwaku-iggy-member-{member}"
            )
        return found

    async def _sync(self, member: Member, topic: str) -> Joined | None:
        """Ask the server for ``member``'s partitions of ``topic`` (its Iggy group).

        :returns: the membership, or None when the server no longer counts
            the member in (it left, its session ended, the group is gone).
        """
        joined = member.topics.get(topic)
        if joined is None:
            return None
        request = ident(self._server.stream) + ident(topic) + ident(member.group)
        answer = await member.call(
            f"sync group {member.group!r} on {topic}",
            lambda c: c.send_binary_request(_SYNC_GROUP, request),
        )
        now: dict[int, int] = {}
        if len(answer) >= 12:
            server_generation, count = struct.unpack_from("<QI", answer, 0)
            ids = struct.unpack_from(f"<{count}I", answer, 12)
            now = {p: joined.partitions.get(p) or next(_generations) for p in ids}
            joined.server_generation = server_generation
        if now != joined.partitions:
            joined.partitions = now
            member.held &= {(topic, p) for p in now} | {h for h in member.held if h[0] != topic}
            member.bump()
        if len(answer) < 12:
            member.topics.pop(topic, None)
            member.bump()
            return None
        return joined

    async def _keep_synced(self, member: Member) -> None:
        """The member's assignment, asked every :data:`_SYNC_EVERY` seconds, and
        its groups' ghost checks when due."""
        while not self._server.closed:
            for topic in list(member.topics):
                try:
                    await self._sync(member, topic)
                except LogError as exc:
                    logger.debug("Iggy group %s: sync failed: %s", member.group, exc)
            for topic in list(member.topics):
                if await self.ghosts.check(member.group, topic, self._ours(member.group, topic)):
                    await self._sync_all(member.group, topic)
            # Not a blocking call: a fake clock may move meanwhile (each
            # sync's request is one, through Server.bounded).
            await asyncio.sleep(_SYNC_EVERY)

    async def _synced_views(self, group: str, topic: str) -> list[frozenset[int]]:
        """Sync this instance's members of ``group`` on ``topic`` now; their partitions.

        A member joining is waited for: the server counts it in (with its
        partitions) before the join's answer makes it one of ours here.
        """
        for member in [m for m in self.members.values() if m.group == group]:
            async with member.joining:
                try:
                    await self._sync(member, topic)
                except LogError as exc:
                    logger.debug("Iggy group %s: sync failed: %s", group, exc)
        return self._ours(group, topic)

    def _ours(self, group: str, topic: str) -> list[frozenset[int]]:
        """The partitions of each member of this instance in ``group`` on ``topic``."""
        return [
            frozenset(joined.partitions)
            for m in self.members.values()
            if m.group == group and (joined := m.topics.get(topic)) is not None
        ]

    async def _sync_all(self, group: str, topic: str) -> None:
        """Sync every member of this instance in ``group`` on ``topic`` now."""
        for member in [m for m in self.members.values() if m.group == group]:
            try:
                await self._sync(member, topic)
            except LogError as exc:
                logger.debug("Iggy group %s: sync failed: %s", group, exc)

    async def _join(self, member: Member, topic: str) -> None:
        """Join the topic's Iggy group, creating it when missing; once more when
        it went between the two (another process deleted it: :mod:`._ghosts`)."""
        group, stream = member.group, self._server.stream
        for attempt in (1, 2):
            found = await self._server.ask(
                "describe group", lambda c: c.get_consumer_group(stream, topic, group)
            )
            if found is None:
                try:
                    await self._server.call(
                        "create group", lambda c: c.create_consumer_group(stream, topic, group)
                    )
                except LogUnavailableError:
                    raise
                except LogError:
                    pass  # made by another member meanwhile; the join says if not
            try:
                await member.call(
                    f"join group {group!r} on {topic}",
                    lambda c: c.join_consumer_group(stream, topic, group),
                )
            except LogUnavailableError:
                raise
            except LogError:
                if attempt == 2:
                    raise
                continue
            break
        member.topics[topic] = Joined()
        self.ghosts.joined(group, topic)

    async def _leave(self, member: Member, topic: str) -> None:
        """``member`` leaves ``topic``'s Iggy group; it is forgotten here once the
        server has the leave.

        Under the member's ``joining`` lock, which :meth:`owners` waits for:
        until the server has the leave, it lists the member with its
        partitions, and a member forgotten here before was named another
        process's (a drain took a partition nobody reads for one consumed
        elsewhere).
        """
        async with member.joining:
            if topic not in member.topics:
                return
            with contextlib.suppress(LogError):  # gone already: the group or the topic
                if member.client is not None:
                    await member.call(
                        f"leave group {member.group!r} on {topic}",
                        lambda c: c.leave_consumer_group(self._server.stream, topic, member.group),
                    )
            member.topics.pop(topic, None)
            member.held = {h for h in member.held if h[0] != topic}
            member.bump()
            if not self._ours(member.group, topic):
                self.ghosts.forget(member.group, topic)

    async def acquire(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        """A lease while the server assigns ``partition`` to ``member`` in the Iggy
        consumer group ``group`` of ``topic``; the member's first call for a
        topic creates the Iggy group when missing and joins it."""
        owner = await self._member(group, member)
        async with owner.joining:
            if topic not in owner.topics:
                await self._join(owner, topic)
            joined = await self._sync(owner, topic)
        if joined is None:
            return None
        generation = joined.partitions.get(partition)
        if generation is None:
            return None
        owner.held.add((topic, partition))
        return Lease(group, topic, partition, member, generation, time.time() + ttl)

    async def fence_owner(self, fence: Lease, *, ask: bool = True) -> Member:
        """The member holding ``fence`` now, asked of the server (one round
        trip); with ``ask=False``, as last seen (by the periodic sync or an
        earlier fenced write), for a write the server fences itself.

        :raises FencedError: when the server no longer assigns the fence's
            partition to it (or another assignment replaced that one).
        """
        member = self.members.get((fence.group, fence.member))
        joined = None
        if member is not None and ask:
            joined = await self._sync(member, fence.topic)
        elif member is not None:
            joined = member.topics.get(fence.topic)
        if (
            member is None
            or joined is None
            or joined.partitions.get(fence.partition) != fence.generation
        ):
            raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
        return member

    async def refused(self, fence: Lease) -> None:
        """The server refused a write of ``fence``'s member: take in its
        assignment now, so its ownership state says so before the next sync."""
        member = self.members.get((fence.group, fence.member))
        if member is not None:
            with contextlib.suppress(LogError):
                await self._sync(member, fence.topic)

    async def owners(self, group: str, topic: str) -> dict[int, Lease]:
        """Who owns each partition of ``topic`` in ``group`` now, from the server
        (members of every process; see ``IggyLog.partition_owners``).

        The server lists members by a number of its own, so this instance's
        members are known by their partitions: they are synced before and
        after the server's list is read, again (at most :data:`_OWNERS_TRIES`
        times) while a sync changed something meanwhile. A member known by
        an older sync than a move was listed as another process's member,
        and a drain took its own partition for one consumed elsewhere. So
        were a member whose leave the server had not yet answered (a leave
        holds the member's ``joining`` lock, which the syncs wait for) and
        the session of a member's dropped connection still in the group
        (:class:`Dropped`: its partitions are named after the member, asked
        of the server with ``GetClient`` while it may still be there).
        """
        stream = self._server.stream
        for _ in range(_OWNERS_TRIES):
            before = await self._synced_views(group, topic)
            found = await self._server.ask(
                "describe group", lambda c: c.get_consumer_group(stream, topic, group)
            )
            if found is None or await self._synced_views(group, topic) == before:
                break
        if found is None:
            return {}
        # A member's dropped session still in the group holds partitions no
        # member of this instance knows of: they are that member's.
        dropped = await self._dropped_in(group, topic, int(found.id))
        local = [
            (m.member, j)
            for m in self.members.values()
            if m.group == group and (j := m.topics.get(topic)) is not None
        ]
        now = time.time()
        out: dict[int, Lease] = {}
        for member in found.members:
            partitions = {int(p) for p in member.partitions}
            name, mine = dropped or f"iggy-member-{member.id}", None
            for local_name, joined in local:
                if partitions and set(joined.partitions) == partitions:
                    name, mine = local_name, joined
            for partition in sorted(partitions):
                generation = mine.partitions[partition] if mine is not None else 0
                out[partition] = Lease(group, topic, partition, name, generation, now)
        return dict(sorted(out.items()))

    async def _dropped_in(self, group: str, topic: str, group_id: int) -> str | None:
        """The name of a member of this instance whose dropped session is still in
        ``group`` on ``topic`` (the Iggy group ``group_id``), else None.

        A session gone from the group (its connection closed) is forgotten
        for the topic; so is one the server will not describe (listing
        clients needs Iggy's ``read_servers`` permission): it cannot be told
        then, as before sessions were followed.
        """
        found = None
        for session, dropped in list(self.dropped.items()):
            if dropped.group != group or topic not in dropped.topics:
                continue
            try:
                still = await self.ghosts.in_group(session, group_id)
            except LogUnavailableError:
                raise
            except LogError as exc:
                logger.debug("Iggy group %s: cannot describe a session: %s", group, exc)
                still = False
            if still:
                found = found or dropped.member
                continue
            dropped.topics.discard(topic)
            if not dropped.topics:
                del self.dropped[session]
        return found

    async def changed(self, group: str, member: str, within: float) -> None:
        """Return when ``member``'s assignment changed, or after ``within`` seconds."""
        found = self.members.get((group, member))
        if found is None:
            # Joining: the server's answer is real I/O, so a fake clock must
            # not run ahead meanwhile.
            with BLOCKING_CALLS.track():
                await asyncio.sleep(min(within, 0.1))
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(found.changed.wait(), within)

    def state(self, lease: Lease) -> str:
        """``owned`` while the last answer of the server assigns the lease's partition
        to its member in its generation, else ``gone``."""
        member = self.members.get((lease.group, lease.member))
        joined = member.topics.get(lease.topic) if member is not None else None
        if joined is None or joined.partitions.get(lease.partition) != lease.generation:
            return "gone"
        return "owned"

    async def release(self, lease: Lease) -> None:
        """Let a partition go; the member leaves the topic's Iggy group once it
        holds none of its partitions, and is dropped once it holds nothing."""
        member = self.members.get((lease.group, lease.member))
        if member is None:
            return
        joined = member.topics.get(lease.topic)
        if joined is None or joined.partitions.get(lease.partition) != lease.generation:
            return
        member.held.discard((lease.topic, lease.partition))
        if any(t == lease.topic for t, _ in member.held):
            return
        await self._leave(member, lease.topic)
        if not member.topics:
            await self._drop_member(member)

    async def _drop_member(self, member: Member) -> None:
        self.members.pop((member.group, member.member), None)
        if member.task is not None:
            member.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await member.task
        for topic in list(member.topics):
            await self._leave(member, topic)

    async def leave(self, group: str, topics: list[str]) -> None:
        """This instance's members of ``group`` leave its Iggy groups on ``topics``."""
        for key in [k for k in self.members if k[0] == group]:
            member = self.members[key]
            for name in [t for t in topics if t in member.topics]:
                await self._leave(member, name)

    async def drop_group(self, group: str, topic: str) -> None:
        """Delete the Iggy consumer group ``group`` of ``topic`` when there is one."""
        stream = self._server.stream
        found = await self._server.ask(
            "describe group", lambda c: c.get_consumer_group(stream, topic, group)
        )
        if found is not None:
            await self._server.call(
                "delete group", lambda c: c.delete_consumer_group(stream, topic, group)
            )

    def forget_topic(self, topic: str) -> None:
        """``topic`` was deleted: every membership of its groups went with it."""
        for member in self.members.values():
            if member.topics.pop(topic, None) is not None:
                member.held = {h for h in member.held if h[0] != topic}
                member.bump()

    async def close(self) -> None:
        """Every member leaves its groups and is dropped."""
        for member in list(self.members.values()):
            try:
                await self._drop_member(member)
            except LogError as exc:  # the server is away: its session ends with the socket
                logger.debug("Iggy group %s: leaving failed: %s", member.group, exc)
