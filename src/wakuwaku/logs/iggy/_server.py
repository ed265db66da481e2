"""What every part of the Iggy log shares: its connection, its calls, the stream and its topics.

Owns the log's own client (made by the first call, made again after a call
found the server gone: :meth:`Server.call`), the connections of group
members (:meth:`Server.connect`, their calls bounded the same way), how
every connection logs in (a user and password, or a personal access token)
and whether it speaks TLS (:class:`TLS`), the
bound on every call (``timeout`` seconds) and the reading of the client's
errors, once (:class:`~wakuwaku.LogUnavailableError` for a server that is not
answering now, :class:`~wakuwaku.LogError` for a refusal). Also the Iggy
stream the log's topics live in (created on first use), the topics of that
stream (created, listed, deleted, described: partition counts, kept in a
cache, and end offsets), and Iggy's identifiers: a name takes at most 255
bytes (:func:`check_name`, :func:`check_group`) and is sent in binary
requests as :func:`ident` writes it.

May call: apache-iggy's client, :mod:`wakuwaku._clock`, the contract's
checks (:mod:`.._base`). Called by every other module of the Iggy log;
calls none of them.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from apache_iggy import AutoLogin, IggyClient, TcpConfig, TcpReconnectionConfig

from ..._clock import BLOCKING_CALLS
from ..._errors import ConfigError, LogError, LogUnavailableError, UnknownTopicError
from .._base import TopicInfo, check_topic_name

__all__ = (
    "CONNECT_BOUNDS",
    "MAX_NAME",
    "TLS",
    "Server",
    "check_group",
    "check_name",
    "end_of",
    "ident",
)

_T = TypeVar("_T")

MAX_NAME = 255
"""Bytes of UTF-8 in an Iggy name: a stream, topic, consumer or group."""

CONNECT_BOUNDS = 3.0
"""A connection may take this many ``timeout`` bounds: it is a TCP connect, a
TLS handshake and a login, and the server checks each login's password with
Argon2 (about 20 ms of its CPU here, one login after another: 10 logins at
once took 150 ms on a loaded 2-core machine). A burst of connections (a
test run opening hundreds beside CPU burners, or every consumer reconnecting
after a server restart) queued logins past the 5 s call bound, where no
single call came close."""

IDLE_CHECK = 0.25
"""Seconds a connection may be idle before a write on it is preceded by a
read that finds out whether it still works (:meth:`Server.call`). A server
restarted within this time of the connection's last answer is not caught
and the write raises :class:`LogUnavailableError`; a kill and start of the
server took 0.5 to 0.7 s here, to its first login."""

_UNAVAILABLE = (
    "disconnected",
    "not connected",
    "connection",
    "timed out",
    "timeout",
    "cannot connect",
    "broken pipe",
    "reset by peer",
    "empty response",
    "refused",
    "unavailable",
    "not primary",
    "i/o",
    "io error",
)
"""Words of the client's errors that mean the server is not answering now."""


def ident(value: str | int) -> bytes:
    """An Iggy identifier on the wire: kind, length, value."""
    if isinstance(value, int):
        return bytes((1, 4)) + struct.pack("<I", value)
    raw = value.encode("utf-8")
    return bytes((2, len(raw))) + raw


def check_name(topic: str) -> None:
    """:raises ConfigError: for a topic name the contract or Iggy (255 bytes) refuses."""
    check_topic_name(topic)
    if len(topic.encode("utf-8")) > MAX_NAME:
        raise ConfigError(f"invalid Iggy topic name {topic!r}: at most 255 bytes of UTF-8")


def check_group(group: str) -> None:
    """:raises ConfigError: for a group name over Iggy's 255 bytes."""
    if len(group.encode("utf-8")) > MAX_NAME:
        raise ConfigError(f"an Iggy consumer or group name takes at most 255 bytes: {group!r}")


def end_of(info: Any) -> int:
    """A partition's end offset, from its description (``get_topic``)."""
    # current_offset is the last record's offset (0 on an empty partition).
    if int(info.messages_count) == 0 and int(info.current_offset) == 0:
        return 0
    return int(info.current_offset) + 1


@dataclass(frozen=True)
class TLS:
    """TLS on every connection of an Iggy log; the server's certificate is always validated.

    :param ca_file: a PEM file of the certificate authorities to trust (the
        system's roots when None); a server with a self-signed certificate
        needs the CA that signed it here.
    :param domain: the name the server's certificate must carry (the host
        of the log's address when None).
    :raises ConfigError: for a ``ca_file`` that is not a file or an empty
        ``domain``, named by its URL option (``tls_ca_file``, ``tls_domain``).
    """

    ca_file: str | None = None
    domain: str | None = None

    def __post_init__(self) -> None:
        if self.ca_file is not None and not os.path.isfile(self.ca_file):
            raise ConfigError(f"Iggy tls_ca_file {self.ca_file!r} is not a file")
        if self.domain is not None and not self.domain:
            raise ConfigError(
                "Iggy tls_domain is empty: name the certificate's host, or leave it out"
            )


class Server:
    """The Iggy server as the log's parts reach it.

    :param address: the server's TCP ``host:port``.
    :param username: / :param password: the Iggy user (never printed).
    :param stream: the Iggy stream holding the log's topics.
    :param timeout: the bound of every call (seconds).
    :param url: the log's URL, in every message.
    :param token: a personal access token, which logs in instead of the
        user and password (never printed).
    :param tls: TLS on every connection (plain TCP when None).
    :param login_hint: said after the server's answer when it refuses the
        login (where the missing credentials would come from).
    """

    def __init__(
        self,
        address: str,
        username: str,
        password: str,
        stream: str,
        timeout: float,
        url: str,
        *,
        token: str | None = None,
        tls: TLS | None = None,
        login_hint: str | None = None,
    ) -> None:
        self.address = address
        self.login_hint = login_hint
        self.username = username
        self.password = password
        self.token = token
        self.tls = tls
        self.stream = stream
        self.timeout = timeout
        self.url = url
        self.closed = False
        self._client: IggyClient | None = None
        self._answered: IggyClient | None = None  # the last client a call was answered on
        self._answered_at = 0.0  # time.monotonic() of that answer
        self._made_clients = False  # a client was made: its runtime ends it at close
        self._connecting = asyncio.Lock()
        self._stream_ready = False
        self._topics: dict[str, int] = {}
        # Per topic, when the server made each partition (microseconds).
        self._created: dict[str, dict[int, int]] = {}

    # -- connections ----------------------------------------------------------

    def _config(self) -> TcpConfig:
        if self.token is not None:
            login = AutoLogin.personal_access_token(self.token)
        else:
            login = AutoLogin.username_password(self.username, self.password)
        tls = self.tls
        return TcpConfig(
            server_address=self.address,
            auto_login=login,
            # The log reconnects by itself, with a new client (call): the
            # SDK's own loop, once a call waiting in it was cancelled by the
            # timeout, answered "Disconnected" forever after a server restart.
            reconnection=TcpReconnectionConfig(enabled=False),
            nodelay=True,
            tls_enabled=tls is not None,
            tls_ca_file=tls.ca_file if tls is not None else None,
            tls_domain=tls.domain if tls is not None else None,
            # Said, not left to the SDK's default: no URL option turns it off.
            tls_validate_certificate=True,
        )

    async def connect(self) -> IggyClient:
        """A new connection, logged in (the log's own, or a group member's)."""
        client = IggyClient(self._config())
        self._made_clients = True
        try:
            await self.bounded("connect", client.connect, bounds=CONNECT_BOUNDS)
        except LogUnavailableError:
            raise
        except LogError as exc:
            if self.login_hint is None or not any(
                word in str(exc).lower() for word in ("password", "credentials", "unauthenticated")
            ):
                raise
            raise LogError(f"{exc}; {self.login_hint}") from exc
        return client

    async def _admin(self) -> IggyClient:
        if self.closed:
            raise LogError(f"the Iggy log {self.url} is closed")
        if self._client is None:
            async with self._connecting:
                if self._client is None:
                    self._client = await self.connect()
        return self._client

    async def bounded(
        self, what: str, call: Callable[[], Awaitable[_T]], *, bounds: float = 1.0
    ) -> _T:
        """Await ``call()`` within ``bounds`` x ``timeout``, translating the client's errors."""
        limit = self.timeout * bounds
        try:
            with BLOCKING_CALLS.track():
                return await asyncio.wait_for(_awaited(call()), limit)
        except TimeoutError as exc:
            raise LogUnavailableError(
                f"Iggy log {self.url} is unavailable ({what}): no answer within {limit:g} s"
            ) from exc
        except (RuntimeError, ValueError, OSError) as exc:
            raise self._error(what, exc) from exc

    async def call(self, what: str, call: Callable[[IggyClient], Awaitable[_T]]) -> _T:
        """``call`` (a write) on the log's own connection, bounded; a connection
        that fails is dropped, and the next call connects again.

        A connection that has been idle for :data:`IDLE_CHECK` seconds is
        first asked for the log's stream (:meth:`ask`, which replaces a
        broken connection and asks again): a server restart leaves an idle
        connection broken, nothing tells the client until it sends, and a
        write that meets it cannot be sent again (it may have been carried
        out), so the first append of a producer that paused across a restart
        failed. The check costs one round trip per write after a pause (and
        a new connection and the check again when it finds one broken); a
        connection that answered within :data:`IDLE_CHECK` is not checked.

        :raises LogUnavailableError: when the server does not answer within
            ``timeout`` or the connection breaks (the call may have been
            carried out: see :meth:`ask` for calls that change nothing).
        :raises LogError: when the server refuses it.
        """
        if self._client is not None and time.monotonic() - self._answered_at > IDLE_CHECK:
            try:
                await self.ask("check the connection", lambda c: c.get_stream(self.stream))
            except LogUnavailableError:
                raise
            except LogError:
                pass  # refused, so answered: the connection works; the write says the rest
        return await self._send(what, call)

    async def _send(self, what: str, call: Callable[[IggyClient], Awaitable[_T]]) -> _T:
        client = await self._admin()
        try:
            answer = await self.bounded(what, lambda: call(client))
        except LogUnavailableError:
            if self._client is client:
                self._client = None
            raise
        except LogError:
            self._answered = client  # a refusal is an answer too
            self._answered_at = time.monotonic()
            raise
        self._answered = client
        self._answered_at = time.monotonic()
        return answer

    async def ask(self, what: str, call: Callable[[IggyClient], Awaitable[_T]]) -> _T:
        """As :meth:`call`, for a call that changes nothing on the server (a
        read, a description): when it finds a connection that answered before
        broken, it is sent once more on a new connection.

        A server restart leaves the log's idle connection broken (its process
        is gone; nothing closes the client's end), and the first call on it
        failed ("Disconnected") however long the server had been back: a
        status, a listing or a replay of dead letters stopped on it. Asking
        again is safe only for what changes nothing: a write that met a
        broken connection may have been carried out by a server that died
        before answering, so :meth:`call` raises for it (and checks an idle
        connection first). A call that timed
        out (ours or the client's own) is not sent again (that would double
        the bound), nor one whose connection was new (the server is not
        answering now). So a read takes at most its own bound, a new
        connection's (:data:`CONNECT_BOUNDS`) and its bound again.

        :raises LogUnavailableError: / :raises LogError: as :meth:`call`.
        """
        client = self._client
        try:
            return await self._send(what, call)
        except LogUnavailableError as exc:
            if (
                client is None
                or client is not self._answered
                or isinstance(exc.__cause__, TimeoutError)
                or any(w in str(exc.__cause__).lower() for w in ("timed out", "timeout"))
            ):
                raise
        return await self._send(what, call)

    def _error(self, what: str, exc: BaseException) -> LogError:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, OSError) or any(w in text.lower() for w in _UNAVAILABLE):
            return LogUnavailableError(f"Iggy log {self.url} is unavailable ({what}): {text}")
        return LogError(f"Iggy log {self.url} failed ({what}): {text}")

    def close(self) -> bool:
        """Refuse every later call and drop the log's connection.

        :returns: whether a client was ever made (its runtime ends it in the
            background).
        """
        self.closed = True
        self._client = None
        self._answered = None
        # Also a client whose connect failed: its runtime ends in the
        # background all the same (the CLI, on a wrong password or no
        # server, aborted in 6 to 7 of 20 runs without the settle).
        return self._made_clients

    # -- the stream and its topics -------------------------------------------

    async def _ensure_stream(self) -> None:
        if self._stream_ready:
            return
        found = await self.ask("get stream", lambda c: c.get_stream(self.stream))
        if found is None:
            try:
                await self.call("create stream", lambda c: c.create_stream(self.stream))
            except LogUnavailableError:
                raise
            except LogError:
                # Made by another process meanwhile: there now, or a real refusal.
                if await self.ask("get stream", lambda c: c.get_stream(self.stream)) is None:
                    raise
        self._stream_ready = True

    async def _stream_exists(self) -> bool:
        """Whether the log's stream is on the server (asked until it is): a
        read never creates it, so a mistyped ``?stream=`` leaves nothing
        behind."""
        if not self._stream_ready:
            found = await self.ask("get stream", lambda c: c.get_stream(self.stream))
            self._stream_ready = found is not None
        return self._stream_ready

    async def partitions_or_none(self, topic: str, *, fresh: bool = False) -> int | None:
        """The topic's partition count (asked of the server when ``fresh`` or not
        known yet), None when there is no such topic (nor its stream)."""
        if not fresh and topic in self._topics:
            return self._topics[topic]
        check_name(topic)
        if not await self._stream_exists():
            self._forget(topic)
            return None
        found = await self.ask("describe topic", lambda c: c.get_topic(self.stream, topic))
        if found is None:
            self._forget(topic)
            return None
        self._described(topic, found)
        return self._topics[topic]

    def _described(self, topic: str, found: Any) -> None:
        """Keep what the server said of ``topic`` (its ``get_topic`` answer)."""
        self._topics[topic] = int(found.partitions_count)
        self._created[topic] = {int(p.id): int(p.created_at) for p in found.partitions}

    def _forget(self, topic: str) -> None:
        self._topics.pop(topic, None)
        self._created.pop(topic, None)

    async def created_at(self, topic: str, partition: int, *, fresh: bool = False) -> int:
        """When the server made ``partition`` of ``topic``: microseconds since the
        epoch, on the server's clock (asked when ``fresh`` or not known yet).

        :raises UnknownTopicError: when the topic does not exist.
        """
        known = self._created.get(topic)
        if fresh or known is None or partition not in known:
            await self.partition_info(topic)
            known = self._created.get(topic, {})
        return known.get(partition, 0)

    async def partitions(self, topic: str, *, fresh: bool = False) -> int:
        """As :meth:`partitions_or_none`; :raises UnknownTopicError: for no such topic."""
        count = await self.partitions_or_none(topic, fresh=fresh)
        if count is None:
            raise UnknownTopicError(topic)
        return count

    async def unknown_topic(self, topic: str) -> None:
        """After a refused call: :class:`UnknownTopicError` when the topic is gone."""
        count = await self.partitions_or_none(topic, fresh=True)
        if count is None:
            raise UnknownTopicError(topic)

    async def partition_info(self, topic: str) -> list[Any]:
        """The topic's partitions as the server describes them, by id.

        :raises UnknownTopicError: when the topic does not exist.
        """
        found = None
        if await self._stream_exists():
            found = await self.ask("describe topic", lambda c: c.get_topic(self.stream, topic))
        if found is None:
            self._forget(topic)
            raise UnknownTopicError(topic)
        self._described(topic, found)
        return sorted(found.partitions, key=lambda p: p.id)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset one past its last record."""
        return {int(p.id): end_of(p) for p in await self.partition_info(topic)}

    async def create_topic(self, topic: str, partitions: int) -> int:
        """Create the Iggy topic unless it exists.

        :returns: its partition count (``partitions`` when this call made it).
        """
        existing = await self.partitions_or_none(topic, fresh=True)
        if existing is None:
            await self._ensure_stream()
            try:
                # Each record is written out as it comes (not after 1 024 of
                # them, the server's default): a server killed with SIGKILL
                # kept nothing it had acknowledged on a default topic, records
                # nor stored offsets.
                await self.call(
                    "create topic",
                    lambda c: c.create_topic(
                        self.stream, topic, partitions, messages_required_to_save=1
                    ),
                )
            except LogUnavailableError:
                raise
            except LogError:
                existing = await self.partitions_or_none(topic, fresh=True)
                if existing is None:
                    raise
            else:
                self._forget(topic)  # made now: its partitions' times are new
                self._topics[topic] = partitions
                return partitions
        return existing

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic of the stream, by name (none while the stream does not exist)."""
        found = await self.ask("get stream", lambda c: c.get_stream(self.stream))
        if found is None:
            return []
        topics = await self.ask("list topics", lambda c: c.get_topics(self.stream))
        return sorted(
            (TopicInfo(t.name, int(t.partitions_count)) for t in topics), key=lambda t: t.name
        )

    async def delete_topic(self, topic: str) -> bool:
        """Delete the Iggy topic. :returns: False when there was no such topic."""
        if await self.partitions_or_none(topic, fresh=True) is None:
            return False
        try:
            await self.call("delete topic", lambda c: c.delete_topic(self.stream, topic))
        except LogUnavailableError:
            raise
        except LogError:
            if await self.partitions_or_none(topic, fresh=True) is None:
                return False
            raise
        self._forget(topic)
        return True


async def _awaited(awaitable: Awaitable[_T]) -> _T:
    return await awaitable
