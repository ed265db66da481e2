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

import pytest
from apache_iggy import IggyClient

from wakuwaku import LogUnavailableError, UnknownTopicError
from wakuwaku.logs.iggy import IggyLog

from ..conftest import IGGY_URL
from ..faults.servers import IggyServer
from ..iggy_support import IGGY_ADDRESS, iggy_log

pytestmark = pytest.mark.iggy


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="known fault, fix withdrawn: pinging an idle connection before a call fixed it, "
    "but 2 of 5 full runs beside CPU burners with that ping crashed pytest workers in Iggy "
    "tests (3 crashes; suspected: a ping cancelled by its bound inside the Iggy client)",
)
async def test_an_idle_log_answers_its_first_call_after_a_server_restart(
    iggy_server: IggyServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle connection a restart left broken failed the next call
    ("Disconnected") however long the server had been back: the flights
    demo's producer and its dead-letter listing stopped on it. A connection
    idle for a while should be replaced first."""
    log = _idle_log(iggy_server)
    try:
        await log.create_topic("orders", 1)
        assert await log.append("orders", 0, [({"wk-key": b"k"}, b"a")]) == [0]
        await asyncio.to_thread(iggy_server.kill)
        await asyncio.to_thread(iggy_server.start)
        await _until_it_takes_logins(iggy_server)
        assert [t.name for t in await log.list_topics()] == ["orders"]
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
