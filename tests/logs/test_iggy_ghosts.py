"""Group members an Iggy server keeps after it was killed (ghosts), on a private server.

A bare client joins a consumer group and holds every partition; the server
is SIGKILLed and started again on the same data. It still lists that
member, whose session has no connection any more, with its partitions
(the known fault of Iggy 0.9.0-edge.5, ``docs/logs.md``, "Outages"). The
log's member that joins again is given only the rest, until the log finds
the ghost and clears it (:mod:`wakuwaku.logs.iggy._ghosts`): then the
member holds every partition, the group's committed offsets are those of
before, and an error said what was found and done. A log whose user may not
list the server's clients cannot look, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from apache_iggy import GlobalPermissions, IggyClient, Permissions

from wakuwaku import LogUnavailableError
from wakuwaku.logs.iggy import IggyLog
from wakuwaku.logs.iggy._ghosts import Sighting, _not_ours

from ..faults.servers import IggyServer

PARTITIONS = 4
DEADLINE = 30.0  # seconds for each observed step


def open_log(server: IggyServer, user: str = "iggy", password: str = "iggy") -> IggyLog:
    return IggyLog(
        f"127.0.0.1:{server.port}",
        username=user,
        password=password,
        stream="ghosts",
        timeout=5.0,
    )


@pytest.fixture
async def bare(iggy_server: IggyServer) -> AsyncIterator[IggyClient]:
    """A client of the server's own, not through the log."""
    client = IggyClient.from_connection_string(iggy_server.url)
    await client.connect()
    yield client


async def until(
    what: str, done: Callable[[], Awaitable[bool]], deadline: float = DEADLINE
) -> float:
    """Wait until ``await done()`` is true; a call it makes that the server does
    not answer in time (a loaded machine, a server still starting) is a no.

    :returns: the seconds it took.
    """
    start = time.monotonic()
    while True:
        with contextlib.suppress(LogUnavailableError):
            if await done():
                return time.monotonic() - start
        assert time.monotonic() - start < deadline, f"no {what} within {deadline} s"
        await asyncio.sleep(0.05)


async def seen(log: IggyLog) -> Sighting:
    """What a ghost check of group ``g`` on ``orders`` finds, once the group
    stayed unchanged while it was checked."""
    found: list[Sighting] = []

    async def settled() -> bool:
        sighting = await log._groups.ghosts.look("g", "orders")
        found[:] = [sighting] if sighting is not None else []
        return bool(found)

    await until("settled group", settled)
    return found[0]


async def held(log: IggyLog, member: str) -> set[int]:
    """The partitions of ``orders`` the server assigns ``member`` of group ``g`` now."""
    leases = [await log.acquire_partition("g", "orders", p, member, 60.0) for p in range(4)]
    return {lease.partition for lease in leases if lease is not None}


async def leave_a_ghost(server: IggyServer) -> None:
    """Make ``orders`` (five records in each partition, group ``g``'s offset
    ``1 + p`` committed in partition ``p``), let a bare client join group ``g``
    and hold every partition, then SIGKILL the server and start it again."""
    log = open_log(server)
    try:
        await log.create_topic("orders", PARTITIONS)
        for p in range(PARTITIONS):
            await log.append("orders", p, [({}, f"r{i}".encode()) for i in range(5)])
            await log.commit("g", "orders", p, 1 + p)
        ghost = IggyClient.from_connection_string(server.url)
        await ghost.connect()
        await ghost.create_consumer_group("ghosts", "orders", "g")
        await ghost.join_consumer_group("ghosts", "orders", "g")
    finally:
        await log.close()
    await asyncio.to_thread(server.kill)
    await asyncio.to_thread(server.start)


@pytest.mark.iggy
@pytest.mark.slow
async def test_a_member_the_server_kept_after_a_kill_is_cleared_and_offsets_are_kept(
    iggy_server: IggyServer, caplog: pytest.LogCaptureFixture
) -> None:
    await leave_a_ghost(iggy_server)
    caplog.set_level(logging.INFO, logger="wakuwaku")
    log = open_log(iggy_server)
    try:
        kept = await seen(log)
        assert kept.ghosts == 1, kept
        (ghost_id,) = kept.members
        assert kept.members[ghost_id] == (0, 1, 2, 3), "the ghost holds what it held"

        first: set[int] = set()

        async def joined() -> bool:
            first.update(await held(log, "m"))
            return bool(first)

        await until("member joining", joined)
        assert len(first) < PARTITIONS, f"the member joining again got {first}"

        async def everything() -> bool:
            return await held(log, "m") == set(range(PARTITIONS))

        await until("member holding every partition", everything)
        after = await seen(log)
        assert after.ghosts == 0 and len(after.members) == 1, after
        for p in range(PARTITIONS):
            assert await log.committed("g", "orders", p) == 1 + p, "a committed offset changed"
    finally:
        await log.close()

    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    said = errors[0]
    assert (said.group, said.topic, said.ghosts) == ("g", "orders", 1)  # type: ignore[attr-defined]
    left = sorted(set(range(PARTITIONS)) - first)
    assert said.members == {ghost_id: left}, "the ghost, with what it kept"  # type: ignore[attr-defined]
    text = said.getMessage()
    assert f"#{ghost_id} holding partitions" in text and "'g'" in text and "'orders'" in text


@pytest.mark.iggy
@pytest.mark.slow
async def test_two_processes_clear_a_ghost_once_and_share_the_partitions(
    iggy_server: IggyServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Two logs (two processes, as the server sees them: sessions of their own)
    find the same ghost: the group is deleted once, both join again."""
    await leave_a_ghost(iggy_server)
    caplog.set_level(logging.INFO, logger="wakuwaku")
    a, b = open_log(iggy_server), open_log(iggy_server)
    try:

        async def shared() -> bool:
            mine, theirs = await held(a, "a"), await held(b, "b")
            return (
                not mine & theirs
                and mine | theirs == set(range(PARTITIONS))
                and all(len(h) == PARTITIONS // 2 for h in (mine, theirs))
            )

        await until("the partitions shared by the two members", shared)
        after = await seen(a)
        assert after.ghosts == 0 and len(after.members) == 2, after
    finally:
        await a.close()
        await b.close()
    deleted = [r for r in caplog.records if "Deleted that group" in r.getMessage()]
    assert len(deleted) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.iggy
@pytest.mark.slow
async def test_a_user_who_may_not_list_clients_is_told_ghosts_go_unseen(
    iggy_server: IggyServer, bare: IggyClient, caplog: pytest.LogCaptureFixture
) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    await bare.create_user(
        user, "secret-pw", permissions=Permissions(GlobalPermissions(manage_streams=True))
    )
    caplog.set_level(logging.WARNING, logger="wakuwaku")
    log = open_log(iggy_server, user, "secret-pw")
    try:
        await log.create_topic("orders", PARTITIONS)
        assert await held(log, "m") == set(range(PARTITIONS))

        async def warned() -> bool:
            return any("read_servers" in r.getMessage() for r in caplog.records)

        await until("warning", warned)
    finally:
        await log.close()
    said = [r for r in caplog.records if "read_servers" in r.getMessage()]
    assert len(said) == 1, "said once per group and topic"
    assert (said[0].group, said[0].topic) == ("g", "orders")  # type: ignore[attr-defined]


def test_members_holding_no_partition_are_counted_as_ours_as_far_as_can_be_told() -> None:
    """Members are told apart by their partitions; one of this process holding
    none was named among the others (the count said "among its members not
    of this process" with this process's own member in it)."""
    mine_idle = [frozenset[int]()]
    named, text = _not_ours(Sighting(7, {1: (0, 1, 2, 3), 2: ()}, ghosts=1), mine_idle)
    assert named == {1: [0, 1, 2, 3]}
    assert text == "they are member #1 holding partitions [0, 1, 2, 3]"

    named, text = _not_ours(Sighting(7, {1: (), 2: ()}, ghosts=1), mine_idle)
    assert named == {}
    assert text == (
        "they are 1 of the members holding no partition (#1, #2; the others are this process's)"
    )

    named, text = _not_ours(Sighting(7, {1: (), 2: (0,), 3: (1,)}, ghosts=1), [frozenset({1})])
    assert named == {2: [0], 1: []}
    assert text == (
        "they are among its members not of this process: member #2 holding partitions [0], "
        "member #1 holding no partition"
    )

    named, text = _not_ours(Sighting(7, {1: (0,)}, ghosts=1), [frozenset({0})])
    assert named == {}
    assert text.startswith("which ones cannot be told")
