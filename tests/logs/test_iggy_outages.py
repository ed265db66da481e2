"""The Iggy log's connection across a server restart, a refused login and a
mistyped stream, as a producer, an admin tool or the CLI meets them.

The restart runs on a private server (``IggyServer``: own ports and data);
the rest on the shared one, with a wrong password or a stream nobody made.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

import pytest
from apache_iggy import IggyClient

from wakuwaku import LogError, LogUnavailableError, UnknownTopicError
from wakuwaku.logs.iggy import IggyLog, _server
from wakuwaku.logs.iggy._server import IDLE_CHECK, Server

from ..conftest import IGGY_URL
from ..faults.servers import IggyServer
from ..iggy_support import IGGY_ADDRESS, iggy_log

pytestmark = pytest.mark.iggy


async def _restart_while_idle(server: IggyServer) -> IggyLog:
    """A log with a topic ``orders`` holding one record, whose connection was
    idle while ``server`` was killed and started again."""
    log = _idle_log(server)
    await log.create_topic("orders", 1)
    assert await log.append("orders", 0, [({"wk-key": b"k"}, b"a")]) == [0]
    await log.commit("g", "orders", 0, 1)
    await asyncio.to_thread(server.kill)
    await asyncio.to_thread(server.start)
    await _until_it_takes_logins(server)
    return log


async def _topic_names(log: IggyLog) -> object:
    return [t.name for t in await log.list_topics()]


async def _records(log: IggyLog) -> object:
    return [(r.offset, r.body) for r in await log.read("orders", 0, 0)]


async def _committed(log: IggyLog) -> object:
    return await log.committed("g", "orders", 0)


_ASKS: dict[str, tuple[Callable[[IggyLog], Awaitable[object]], object]] = {
    "list topics": (_topic_names, ["orders"]),
    "read": (_records, [(0, b"a")]),
    "committed": (_committed, 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("ask", list(_ASKS))
async def test_an_idle_log_answers_its_first_read_after_a_server_restart(
    iggy_server: IggyServer, ask: str
) -> None:
    """An idle connection a restart left broken failed the next call
    ("Disconnected") however long the server had been back: a status, a
    listing or a dead-letter replay stopped on it. A call that changes
    nothing is sent again on a new connection."""
    log = await _restart_while_idle(iggy_server)
    try:
        call, expected = _ASKS[ask]
        assert await call(log) == expected
    finally:
        await log.close()


@pytest.mark.slow
async def test_an_idle_log_stores_its_first_append_after_a_server_restart(
    iggy_server: IggyServer,
) -> None:
    """The first append after a restart met the broken idle connection and
    raised: a write cannot be sent again (it may have been stored). A
    connection idle for ``IDLE_CHECK`` is now checked with a read before
    the write (a restart faster than that is not caught: see IDLE_CHECK)."""
    log = await _restart_while_idle(iggy_server)
    try:
        # The restart took longer than IDLE_CHECK here; make sure of it.
        idle = time.monotonic() - log._server._answered_at
        await asyncio.sleep(max(0.0, IDLE_CHECK - idle) + 0.01)
        assert await log.append("orders", 0, [({"wk-key": b"k"}, b"b")]) == [1]
    finally:
        await log.close()


def _idle_log(server: IggyServer, timeout: float = 5.0) -> IggyLog:
    return IggyLog(
        f"127.0.0.1:{server.port}", username="iggy", password="iggy", stream="idle", timeout=timeout
    )


async def _until_it_takes_logins(server: IggyServer) -> None:
    """Wait until a new connection logs in (a server listens before it does)."""
    deadline = time.monotonic() + 60.0
    while True:
        probe = _idle_log(server)
        try:
            await probe.list_topics()
            return
        except LogUnavailableError:
            assert time.monotonic() < deadline, "the restarted server never took a login"
            await asyncio.sleep(0.1)
        finally:
            await probe.close()


async def test_reads_never_create_the_stream_they_name() -> None:
    """A read-only command with a mistyped ``?stream=`` left an empty stream
    of that name on the server; now the topic is unknown and nothing is made."""
    stream = f"wknone{uuid.uuid4().hex[:8]}"
    log = iggy_log(stream)
    try:
        assert await log.list_topics() == []
        with pytest.raises(UnknownTopicError):
            await log.describe_topic("orders")
        with pytest.raises(UnknownTopicError):
            await log.end_offsets("orders")
        assert await log.committed("g", "orders", 0) is None
    finally:
        await log.close()
    client = IggyClient.from_connection_string(IGGY_URL)
    await client.connect()
    assert await client.get_stream(stream) is None
    del client
    await asyncio.sleep(0.1)  # the dropped client's runtime ends (see IggyLog.close)


@pytest.mark.slow
def test_the_cli_exits_with_its_status_when_the_login_is_refused() -> None:
    """A client whose connect failed was not waited for at close, and its
    runtime aborted the exiting process (SIGABRT, status 134) in 3 of 12
    runs; the CLI's status for an unavailable log is 3."""
    url = f"iggy://iggy:wrong@{IGGY_ADDRESS}"
    codes = [
        subprocess.run(
            [sys.executable, "-m", "wakuwaku", "topic", "list", "--log", url],
            capture_output=True,
            timeout=60,
            check=False,
        ).returncode
        for _ in range(10)
    ]
    assert codes == [3] * 10


class _FakeConnection:
    """A connection of :func:`_fake_server`: answers ``get_stream`` (the idle
    check) until it is ``broken``."""

    def __init__(self, checks: list[object], broken: bool) -> None:
        self.broken = broken
        self._checks = checks

    async def get_stream(self, name: str) -> object:
        self._checks.append(self)
        if self.broken:
            raise RuntimeError("Disconnected")
        return name


def _fake_server(
    monkeypatch: pytest.MonkeyPatch, checks: list[object] | None = None
) -> tuple[Server, list[_FakeConnection]]:
    """A Server whose connections are :class:`_FakeConnection` (no server),
    and the list of connections it made; idle checks are listed in ``checks``.
    Connections are made broken once ``server.down`` is set (the fake's own)."""
    server = Server("127.0.0.1:1", "u", "p", "s", timeout=0.05, url="iggy://test")
    made: list[_FakeConnection] = []

    async def connect() -> _FakeConnection:
        down = getattr(server, "down", False)
        made.append(_FakeConnection([] if checks is None else checks, down))
        return made[-1]

    monkeypatch.setattr(server, "connect", connect)
    return server, made


async def test_only_a_call_that_changes_nothing_is_sent_again_and_only_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ask`` sends again once, on a new connection, when a connection that
    answered before is found broken; never after a timeout (the bound would
    double), never when the connection was new, and ``call`` (a write) never."""
    server, made = _fake_server(monkeypatch)
    sent: list[object] = []

    async def answer(client: object) -> str:
        sent.append(client)
        return "ok"

    async def broken(client: object) -> str:
        sent.append(client)
        raise RuntimeError("Disconnected")

    async def silent(client: object) -> str:
        sent.append(client)
        await asyncio.sleep(1.0)
        return "late"

    async def timed_out(client: object) -> str:
        sent.append(client)
        raise RuntimeError("the request timed out")

    async def refused(client: object) -> str:
        raise ValueError("no such thing")

    async def broken_then_answer(client: object) -> str:
        return await (answer if sent else broken)(client)

    # A connection that was never answered on: no second try.
    with pytest.raises(LogUnavailableError, match="Disconnected"):
        await server.ask("read", broken)
    assert len(sent) == 1
    # One that answered before, then broke: asked again on a new one.
    sent.clear()
    assert await server.call("read", answer) == "ok"
    sent.clear()
    assert await server.ask("read", broken_then_answer) == "ok"
    assert len(sent) == 2 and sent[0] is not sent[1] and sent[1] is made[-1]
    # Broken on the second connection too: raised after two tries.
    sent.clear()
    with pytest.raises(LogUnavailableError, match="Disconnected"):
        await server.ask("read", broken)
    assert len(sent) == 2
    # A timeout is not sent again, ours or the client's own.
    assert await server.call("read", answer) == "ok"
    sent.clear()
    with pytest.raises(LogUnavailableError, match="no answer within"):
        await server.ask("read", silent)
    assert len(sent) == 1
    assert await server.call("read", answer) == "ok"
    sent.clear()
    with pytest.raises(LogUnavailableError, match="timed out"):
        await server.ask("read", timed_out)
    assert len(sent) == 1
    # A connection whose only answer was a refusal did answer.
    server._client = None
    with pytest.raises(LogError, match="no such thing"):
        await server.call("read", refused)
    sent.clear()
    assert await server.ask("read", broken_then_answer) == "ok"
    assert len(sent) == 2
    # A write that met a broken connection is not sent again.
    assert await server.call("read", answer) == "ok"
    sent.clear()
    with pytest.raises(LogUnavailableError, match="Disconnected"):
        await server.call("append", broken)
    assert len(sent) == 1


async def test_a_write_on_an_idle_connection_checks_it_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write after ``IDLE_CHECK`` seconds of quiet first asks for the
    stream, which replaces a connection a restart broke, so the write is
    sent once, on a working connection; a connection in use is not checked."""
    checks: list[object] = []
    server, made = _fake_server(monkeypatch, checks)
    writes: list[object] = []

    async def write(client: object) -> str:
        writes.append(client)
        return "stored"

    assert await server.call("append", write) == "stored"  # a new connection: no check
    assert await server.call("append", write) == "stored"  # just answered: no check
    assert checks == [] and writes == [made[0], made[0]]
    # Idle past the bound, and broken meanwhile.
    made[0].broken = True
    server._answered_at -= IDLE_CHECK + 1.0
    writes.clear()
    assert await server.call("append", write) == "stored"
    assert checks == [made[0], made[1]]
    assert writes == [made[1]]
    # Idle again, still working: checked, then written on the same connection.
    checks.clear()
    writes.clear()
    server._answered_at -= IDLE_CHECK + 1.0
    assert await server.call("append", write) == "stored"
    assert checks == [made[1]] and writes == [made[1]]
    # Idle, and the server gone: the check raises and nothing is written.
    checks.clear()
    writes.clear()
    for connection in made:
        connection.broken = True
    server.down = True  # type: ignore[attr-defined]
    server._answered_at -= IDLE_CHECK + 1.0
    made_before = len(made)
    with pytest.raises(LogUnavailableError, match="Disconnected"):
        await server.call("append", write)
    assert writes == [] and len(checks) == 2 and len(made) == made_before + 1


async def _freeze_during(server: IggyServer, append: Awaitable[object]) -> None:
    """``append`` meets a frozen server; the server then goes on."""
    await asyncio.to_thread(server.freeze)
    try:
        with pytest.raises(LogUnavailableError, match="append to dead/0"):
            await append
    finally:
        await asyncio.to_thread(server.thaw)


async def _kill_during(server: IggyServer, append: Awaitable[object]) -> None:
    """``append`` meets a killed server, which is then started again."""
    await asyncio.to_thread(server.kill)
    with pytest.raises(LogUnavailableError, match="append to dead/0"):
        await append
    await asyncio.to_thread(server.start)
    await _until_it_takes_logins(server)


@pytest.mark.slow
@pytest.mark.parametrize("fault", [_freeze_during, _kill_during], ids=["freeze", "kill"])
async def test_an_append_whose_answer_was_lost_is_stored_once_when_sent_again(
    iggy_server: IggyServer,
    monkeypatch: pytest.MonkeyPatch,
    fault: Callable[[IggyServer, Awaitable[object]], Awaitable[None]],
) -> None:
    """freeze: a send that timed out on a frozen server was carried out once
    the server went on, and the append sent again with its token (as the
    consumer's outbox does for a dead letter) stored the records a second
    time: the token's promise (``Log.append``) did not hold on Iggy. kill:
    the look for the unanswered append finds nothing (the server never got
    it), and the append is sent and stored once. (No idle check here: the
    send itself must meet the fault.)"""
    monkeypatch.setattr(_server, "IDLE_CHECK", 3600.0)
    log = _idle_log(iggy_server, timeout=1.0)
    try:
        await log.create_topic("dead", 1)
        assert await log.append("dead", 0, [({"wk-key": b"k"}, b"before")]) == [0]
        records = [({"wk-key": b"k"}, b"a"), ({"wk-key": b"k"}, b"b")]
        await fault(iggy_server, log.append("dead", 0, records, token="letter-1"))
        offsets = await log.append("dead", 0, records, token="letter-1")
        stored = [(r.offset, r.body) for r in await log.read("dead", 0, 0)]
        assert stored == [(0, b"before"), (1, b"a"), (2, b"b")]
        assert offsets == [1, 2]
    finally:
        await log.close()
