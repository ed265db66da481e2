"""Iggy test kit: a log on a fresh stream of the shared server, deleted afterwards.

The shared server on 127.0.0.1:8090 serves other runs at the same time, so
every test works in its own stream (``wkt`` + 12 hex digits) and deletes it
(topics, records, consumer groups and offsets go with it).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from urllib.parse import urlsplit

from apache_iggy import IggyClient

from wakuwaku.logs.iggy import PASSWORD_ENV, USERNAME_ENV, IggyLog

from .conftest import IGGY_URL

_parts = urlsplit(IGGY_URL)
IGGY_ADDRESS = f"{_parts.hostname}:{_parts.port}"
# Other processes a test starts open ``log.url``, which carries no credentials.
os.environ.setdefault(USERNAME_ENV, _parts.username or "iggy")
os.environ.setdefault(PASSWORD_ENV, _parts.password or "iggy")


def fresh_stream() -> str:
    """A stream name no other test uses (the server is shared)."""
    return f"wkt{uuid.uuid4().hex[:12]}"


def iggy_log(stream: str, address: str = IGGY_ADDRESS, **options: object) -> IggyLog:
    return IggyLog(address, stream=stream, **options)  # type: ignore[arg-type]


async def drop_stream(stream: str, url: str = IGGY_URL) -> None:
    """Delete ``stream`` with everything in it; a stream that is not there is fine."""
    client = IggyClient.from_connection_string(url)
    await client.connect()
    if await client.get_stream(stream) is not None:
        with contextlib.suppress(RuntimeError):
            await client.delete_stream(stream)
