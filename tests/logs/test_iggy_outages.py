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
from wakuwaku.logs.iggy import IggyLog
from wakuwaku.logs.iggy._server import Server

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
@pytest.mark.xfail(
    strict=True,
    raises=LogUnavailableError,
    reason="known fault, cause found, not fixed: the broken connection is found only by "
    "sending on it, and a write that met it cannot be told from one a server stored and "
    "died before answering, so it is not sent again; a ping before a call on an idle "
    "connection fixed it, but 2 of 5 full runs beside CPU burners with that ping crashed "
    "pytest workers in Iggy tests (cause not found), so it was withdrawn",
)
async def test_an_idle_log_stores_its_first_append_after_a_server_restart(
    iggy_server: IggyServer,
) -> None:
    log = await _restart_while_idle(iggy_server)
    try:
        assert await log.append("orders", 0, [({"wk-key": b"k"}, b"b")]) == [1]
    finally:
        await log.close()


def _idle_log(server: IggyServer) -> IggyLog:
    return IggyLog(
        f"127.0.0.1:{server.port}", username="iggy", password="iggy", stream="idle", timeout=5.0
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


def _fake_server(monkeypatch: pytest.MonkeyPatch) -> tuple[Server, list[object]]:
    """A Server whose connections are plain objects (no server), and the list
    of connections it made."""
    server = Server("127.0.0.1:1", "u", "p", "s", timeout=0.05, url="iggy://test")
    made: list[object] = []

    async def connect() -> object:
        made.append(object())
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
