"""The NATS log's JetStream client: one connection, and each JetStream API call written once.

Owns the nats-py connection to the servers (made by the first call, bounded;
its losses counted in :attr:`JetStream.connection`), the bound on every
exchange with the server (``timeout`` seconds; a call waiting when the
connection drops fails at once), and the JetStream API requests the log
makes, each written once here: stream info, create, update, delete and
purge; consumer create and delete; pull batches; direct gets; publishes.
Also the names valid in JetStream (:func:`escape`) and the one parser of
where a delivered message stands in its stream (:func:`delivery`).

Errors, one place: an API answer holding an error raises
:class:`JetStreamError` (its subclasses :class:`StreamNotFound` and
:class:`WrongLastSequence` for the two refusals the log acts on), with the
server's ``code``, ``err_code`` and ``description``; a request nothing
answers raises :class:`NoResponders`; no answer within ``timeout`` or a lost
connection raises :class:`~wakuwaku.LogUnavailableError`.

May call: nats-py, :mod:`wakuwaku._clock` and :mod:`wakuwaku._errors`. It
knows no topics, records, offsets or leases: the log
(:mod:`wakuwaku.logs.nats`) and its parts (:mod:`._nats_bucket`,
:mod:`._nats_fences`, :mod:`._nats_streams`) call it, never the reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

try:
    import nats.errors
    from nats.aio.client import Client
    from nats.aio.msg import Msg
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the NATS log needs nats-py: pip install 'wakuwaku[nats]'") from exc

from .._clock import BLOCKING_CALLS
from .._errors import LogError, LogUnavailableError

__all__ = (
    "CAS_ATTEMPTS",
    "DUPLICATE_WINDOW_NS",
    "TOKEN_ENV",
    "Delivery",
    "JetStream",
    "JetStreamError",
    "NoResponders",
    "Publish",
    "PublishAll",
    "Stored",
    "StreamNotFound",
    "WrongLastSequence",
    "delivery",
    "escape",
)

logger = logging.getLogger("wakuwaku.logs.nats")  # the adapter's one logger

_T = TypeVar("_T")

TOKEN_ENV = "WAKUWAKU_NATS_TOKEN"
"""Environment variable with the token used when the URL names none."""

CAS_ATTEMPTS = 64
"""How often a compare-and-set write is tried before the call gives up."""

DUPLICATE_WINDOW_NS = 120_000_000_000
"""How long a stream remembers a ``Nats-Msg-Id`` to drop a duplicate (ns: the API's unit)."""

Publish = Callable[[str, bytes, Mapping[str, str] | None], Awaitable[int]]
"""Publishes one message (subject, data, headers) as :meth:`JetStream.publish` does."""

PublishAll = Callable[
    [str, Sequence[tuple[bytes, Mapping[str, str]]]], Awaitable[list[int | LogError]]
]
"""Publishes messages (data, headers) to one subject as :meth:`JetStream.publish_all` does."""

_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
_MAX_ESCAPED = 160  # longer escaped names are hashed (stream names become directory names)
_STREAM_NOT_FOUND = 10059  # JetStream err_code: "stream not found"
_WRONG_LAST_SEQUENCE = 10071  # JetStream err_code: "wrong last sequence: <n>"
_END_OF_BATCH = frozenset({"404", "408"})  # no messages (now) / the pull's wait ran out
_HEARTBEAT = "100"  # idle heartbeat or flow control: not an answer to a pull


def escape(name: str) -> str:
    """``name`` as a token valid in stream names, subjects and KV keys, unambiguously.

    ``[A-Za-z0-9-]`` stay as they are; every other character becomes ``_``
    followed by the lowercase hex of each of its UTF-8 bytes (``.`` ->
    ``_2e``, ``_`` -> ``_5f``), so two names never share an escape. Names
    whose escape is longer than 160 characters become ``H`` + 48 hex digits
    of their SHA-256 (stream names are directory names on the server); the
    plain form starts with ``T``.
    """
    out = "".join(c if c in _PLAIN else "".join(f"_{b:02x}" for b in c.encode()) for c in name)
    if len(out) > _MAX_ESCAPED:
        return "H" + hashlib.sha256(name.encode()).hexdigest()[:48]
    return "T" + out


class NoResponders(LogUnavailableError):
    """Nothing answered a request: for a stream's subject, the stream is not there."""


class JetStreamError(LogError):
    """The JetStream API refused a request; the text names what was asked.

    :param code: the answer's status code (400, 404, 503, ...).
    :param err_code: JetStream's own error code (10059: stream not found).
    :param description: the server's description of the refusal.
    """

    def __init__(self, message: str, *, code: int, err_code: int, description: str) -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code
        self.description = description


class StreamNotFound(JetStreamError):
    """The stream a request names is not there."""


class WrongLastSequence(JetStreamError):
    """A publish expecting a last sequence (of the stream or of a subject) found another."""

    @property
    def last(self) -> int | None:
        """The last sequence the server has, when its description says it."""
        found = re.search(r"(\d+)\s*$", self.description)
        return int(found.group(1)) if found else None


def _refusal(answer: Any, message: str) -> JetStreamError | None:
    """The error an API answer holds, typed, or None; ``message`` begins its text."""
    err = answer.get("error") if isinstance(answer, dict) else None
    if not err:
        return None
    err_code = int(err.get("err_code", 0))
    description = str(err.get("description", ""))
    kind = JetStreamError
    if err_code == _STREAM_NOT_FOUND:
        kind = StreamNotFound
    elif err_code == _WRONG_LAST_SEQUENCE or description.startswith("wrong last sequence"):
        kind = WrongLastSequence
    return kind(
        f"{message}: {description}",
        code=int(err.get("code", 0)),
        err_code=err_code,
        description=description,
    )


class Delivery(NamedTuple):
    """Where a message a pull consumer delivered stands."""

    stream_seq: int
    """Its sequence in the stream."""
    consumer_seq: int
    """The consumer's count of its deliveries (1, 2, 3, ...): a gap is a lost delivery."""
    timestamp: float
    """When the stream stored it (seconds since the epoch)."""


def delivery(msg: Msg) -> Delivery:
    """Where ``msg``, delivered by a pull consumer, stands: read from its reply subject.

    The reply (acknowledgement) subject is
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>``;
    it is read from the end, so names before it may hold more tokens.
    """
    _, stream_seq, consumer_seq, nanos, _ = msg.reply.rsplit(".", 4)
    return Delivery(int(stream_seq), int(consumer_seq), int(nanos) / 1e9)


class Stored(NamedTuple):
    """A message a direct get read from a stream."""

    seq: int
    """Its sequence in the stream (a key's revision, in a bucket)."""
    data: bytes
    headers: Mapping[str, str]
    """Its NATS headers, the server's ``Nats-*`` ones included."""


class _Batch:
    """What one pull request brought: messages, and why it ended."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.out: list[Msg] = []
        self.refused = ""  # why the consumer cannot deliver (a status, a lost connection)
        self.arrived = asyncio.Event()  # a message or a status came
        self.done = asyncio.Event()  # ``count`` messages, or what ends the batch

    async def collect(self, msg: Msg) -> None:
        if self.done.is_set():
            return
        status = msg.headers.get("Status") if msg.headers else None
        if status == _HEARTBEAT:
            return
        self.arrived.set()
        if status:
            if status not in _END_OF_BATCH:
                description = (msg.headers or {}).get("Description", "")
                self.refused = f"{status} {description}".rstrip()
            self.done.set()
            return
        self.out.append(msg)
        if len(self.out) >= self.count:
            self.done.set()

    def lost(self, _: object) -> None:
        """The connection is lost: no more messages come, stop waiting."""
        if not self.done.is_set():
            self.refused = "the connection was lost"
        self.arrived.set()
        self.done.set()


class JetStream:
    """A connection to NATS servers and the JetStream API requests the NATS log makes.

    :param servers: server URLs (``nats://host:port``), tried in turn.
    :param url: the log's URL without credentials: every error names it.
    :param token: / :param user: / :param password: credentials; without
        any, the token comes from ``WAKUWAKU_NATS_TOKEN`` when connecting.
    :param timeout: bound on every exchange with the server (seconds).

    The connection is made by the first call. While it is lost, every call
    raises :class:`~wakuwaku.LogUnavailableError` and nats-py reconnects in
    the background; :attr:`connection` counts the losses and reconnections.
    """

    def __init__(
        self,
        servers: Sequence[str],
        *,
        url: str,
        token: str | None,
        user: str | None,
        password: str | None,
        timeout: float,
    ) -> None:
        self.servers = list(servers)
        self.url = url
        self.timeout = timeout
        self._token = token
        self._user = user
        self._password = password
        self._nc: Client | None = None
        self._connecting = asyncio.Lock()
        self.closed = False
        self.max_payload = 0
        """The server's largest message (bytes), read at connection; 0 before it."""
        # Counts connections lost and made again: a pull consumer lives in the
        # server's memory, so one made before a reconnection may be gone (a
        # restarted server lost it) and is never used after it.
        self.connection = 0
        # Resolved when the connection is lost: a request in flight then is
        # never answered (the server that restarted has forgotten it), so it
        # fails at once instead of waiting out its timeout.
        self._lost: asyncio.Future[None] | None = None
        self._acks = _Acks()

    # -- the connection -----------------------------------------------------

    async def client(self) -> Client:
        """The connected nats-py client; the first call connects.

        :raises LogError: when the log is closed.
        :raises LogUnavailableError: while the connection is lost
            (reconnecting), or when connecting fails within ``timeout``.
        """
        if self.closed:
            raise LogError(f"the NATS log {self.url} is closed")
        nc = self._nc
        if nc is not None and not nc.is_closed:
            if not nc.is_connected:
                raise LogUnavailableError(
                    f"NATS log {self.url}: the connection is lost (reconnecting)"
                )
            return nc
        async with self._connecting:
            if self._nc is None or self._nc.is_closed:
                self._nc = await self._connect()
                self.max_payload = int(self._nc.max_payload)
            return self._nc

    async def _connect(self) -> Client:
        token = self._token if self._token is not None else os.environ.get(TOKEN_ENV) or None

        refused: list[Exception] = []  # what the server said to a first connection it refused

        async def on_error(exc: Exception) -> None:
            logger.debug("NATS client error on %s: %s", self.url, exc)
            if not connected:
                refused[:] = [exc]

        connected = False

        async def on_disconnect() -> None:
            self.connection += 1
            lost = self._lost
            if lost is not None and not lost.done():
                lost.set_result(None)
            if self.closed or not connected:
                return  # a first connection that failed is reported by the raise below
            logger.warning("NATS log %s: connection lost, reconnecting", self.url)

        async def on_reconnect() -> None:
            self.connection += 1
            logger.warning("NATS log %s: reconnected", self.url)

        nc = Client()
        # nats-py annotates these seconds as int; it passes them to asyncio as floats.
        seconds: dict[str, Any] = {"connect_timeout": self.timeout, "reconnect_time_wait": 0.25}
        try:
            with BLOCKING_CALLS.track():
                # nats-py retries a refused first connection forever: bound it.
                await asyncio.wait_for(
                    nc.connect(
                        servers=self.servers,
                        token=token,
                        user=self._user,
                        password=self._password,
                        allow_reconnect=True,
                        max_reconnect_attempts=-1,
                        pending_size=0,  # no buffering while disconnected: fail fast instead
                        error_cb=on_error,
                        disconnected_cb=on_disconnect,
                        reconnected_cb=on_reconnect,
                        **seconds,
                    ),
                    self.timeout,
                )
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
                await asyncio.wait_for(nc.close(), self.timeout)
            # nats-py retries a refused login until the bound above: the
            # server's reason ("Authorization Violation") reached only the
            # error callback, and the caller saw a bare TimeoutError.
            cause = refused[-1] if refused else exc
            reason = f"{type(cause).__name__}: {cause}" if refused else type(exc).__name__
            raise LogUnavailableError(
                f"cannot connect to the NATS log {self.url}: {reason}"
            ) from cause
        connected = True
        return nc

    def _lost_signal(self) -> asyncio.Future[None]:
        """A future resolved when the current connection is lost."""
        lost = self._lost
        if lost is None or lost.done():
            lost = self._lost = asyncio.get_running_loop().create_future()
        return lost

    async def call(self, op: Callable[[], Awaitable[_T]]) -> _T:
        """Run one bounded exchange with the server, translating lost connections.

        :raises NoResponders: when nothing answered the request.
        :raises LogUnavailableError: when no answer comes within ``timeout``,
            or at once when the connection is lost while waiting for it.
        """
        lost = self._lost_signal()
        try:
            with BLOCKING_CALLS.track():  # a fake clock waits for the network
                task = asyncio.ensure_future(op())
                try:
                    await asyncio.wait(
                        (task, lost), timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    if not task.done():
                        task.cancel()
                if not task.done() or task.cancelled():
                    why = "the connection was lost" if lost.done() else "no answer in time"
                    raise LogUnavailableError(f"NATS log {self.url} did not answer: {why}")
                return task.result()
        except nats.errors.NoRespondersError as exc:
            raise NoResponders(
                f"NATS log {self.url}: nothing answered (no stream or JetStream not ready)"
            ) from exc
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise LogUnavailableError(
                f"NATS log {self.url} did not answer: {type(exc).__name__} {exc}".rstrip()
            ) from exc

    async def close(self) -> None:
        """Close the connection; calling it again does nothing."""
        if self.closed:
            return
        self.closed = True
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(nats.errors.Error, OSError, asyncio.TimeoutError):
                await asyncio.wait_for(nc.close(), self.timeout)

    # -- API requests -------------------------------------------------------

    async def request(self, subject: str, request: Mapping[str, Any] | None = None) -> Any:
        """The decoded answer to one JetStream API request, any error left in it.

        :raises NoResponders: / :raises LogUnavailableError: as :meth:`call`.
        """
        nc = await self.client()
        data = b"" if request is None else json.dumps(request).encode()
        msg = await self.call(lambda: nc.request(subject, data, timeout=self.timeout))
        return json.loads(msg.data)

    async def api(
        self, subject: str, request: Mapping[str, Any] | None = None, *, what: str | None = None
    ) -> dict[str, Any]:
        """The answer to one JetStream API request, checked.

        :param what: what the request does, for the error's text
            (``NATS log <url>: <what>: <description>``); the subject by default.
        :raises JetStreamError: (or a subclass) when the answer holds an error.
        :raises NoResponders: / :raises LogUnavailableError: as :meth:`call`.
        """
        answer = await self.request(subject, request)
        refused = _refusal(answer, f"NATS log {self.url}: {what or subject}")
        if refused is not None:
            raise refused
        return dict(answer)

    async def stream_info(
        self, stream: str, *, subjects_filter: str | None = None, what: str | None = None
    ) -> dict[str, Any] | None:
        """``stream``'s ``config`` and ``state``; None when there is no such stream.

        :param subjects_filter: the subjects whose message counts
            ``state["subjects"]`` lists (``{subject: messages}``).
        :raises JetStreamError: for any other refusal (``what``, default
            ``stream <name>``, names it).
        """
        request = None if subjects_filter is None else {"subjects_filter": subjects_filter}
        try:
            return await self.api(
                f"$JS.API.STREAM.INFO.{stream}", request, what=what or f"stream {stream}"
            )
        except StreamNotFound:
            return None

    async def last_sequence(self, stream: str) -> int:
        """``stream``'s last sequence (0 for a stream never written to).

        :raises NoResponders: when the stream is not there.
        """
        info = await self.stream_info(stream)
        if info is None:
            raise NoResponders(f"NATS log {self.url}: stream {stream} is not there")
        return int(info["state"]["last_seq"])

    async def create_stream(self, config: Mapping[str, Any], *, what: str | None = None) -> None:
        """Create the stream ``config["name"]``; one that is there already is left as it is.

        A create that races another of the same stream may be refused with
        "subjects overlap with an existing stream" (the other one's, just
        made; 13 of 200 pairs on the 2.9 server, none seen on a current one):
        the stream is then looked up, and found it counts as made.

        :raises JetStreamError: when the server refuses for another reason
            (subjects that another stream takes, one of another name).
        """
        name = config["name"]
        try:
            await self.api(
                f"$JS.API.STREAM.CREATE.{name}", config, what=what or f"cannot create stream {name}"
            )
        except JetStreamError as exc:
            if "already in use" in exc.description:
                return
            if "subjects overlap" in exc.description and await self.stream_info(name) is not None:
                return
            raise

    async def update_stream(self, config: Mapping[str, Any], *, what: str | None = None) -> None:
        """Give the stream ``config["name"]`` this configuration.

        :raises JetStreamError: when the server refuses.
        """
        name = config["name"]
        await self.api(
            f"$JS.API.STREAM.UPDATE.{name}", config, what=what or f"cannot update stream {name}"
        )

    async def delete_stream(self, stream: str) -> bool:
        """Delete ``stream``; False when there was none.

        :raises JetStreamError: when the server refuses.
        """
        try:
            await self.api(f"$JS.API.STREAM.DELETE.{stream}", what=f"cannot delete stream {stream}")
        except StreamNotFound:
            return False
        return True

    async def purge(
        self, stream: str, request: Mapping[str, Any], *, what: str | None = None
    ) -> int:
        """Purge messages of ``stream`` as ``request`` says; returns how many went.

        :param request: ``filter`` (a subject), ``seq`` (purge below it),
            ``keep`` (the newest to keep); empty purges everything.
        :raises StreamNotFound: when the stream is not there.
        :raises JetStreamError: when the server refuses for another reason.
        """
        answer = await self.api(
            f"$JS.API.STREAM.PURGE.{stream}", request, what=what or f"purging {stream} failed"
        )
        return int(answer.get("purged", 0))

    async def create_consumer(
        self, stream: str, config: Mapping[str, Any], *, what: str | None = None
    ) -> dict[str, Any]:
        """Create an ephemeral consumer of ``stream``; the answer (``name``, ``num_pending``).

        :raises StreamNotFound: when the stream is not there.
        :raises JetStreamError: when the server refuses for another reason
            (``what``, default ``cannot read <stream>``, names it).
        """
        return await self.api(
            f"$JS.API.CONSUMER.CREATE.{stream}",
            {"stream_name": stream, "config": config},
            what=what or f"cannot read {stream}",
        )

    async def delete_consumer(self, stream: str, consumer: str) -> None:
        """Ask the server to delete a consumer, unanswered and best effort.

        A consumer that stays (the connection is lost) is removed by the
        server once idle (its ``inactive_threshold``).
        """
        with contextlib.suppress(LogUnavailableError):
            nc = await self.client()
            await self.call(lambda: nc.publish(f"$JS.API.CONSUMER.DELETE.{stream}.{consumer}"))

    async def fetch(self, stream: str, consumer: str, count: int, wait: float) -> list[Msg]:
        """One pull request for up to ``count`` messages of ``consumer``.

        The messages are collected by a subscription callback, and the
        caller waits once for the whole batch (not one timed wait per
        message). Bounded as one call per message was: with ``wait``
        (seconds), the first message may take ``wait + timeout``; after it,
        every ``timeout`` that passes without a message raises
        :class:`~wakuwaku.LogUnavailableError`.

        Only the statuses "no messages" (404) and "request timeout" (408)
        end a batch as the end of what is there. Any other status (409
        "consumer deleted", 503 "no responders", ...) says the consumer
        cannot deliver: it raises :class:`~wakuwaku.LogUnavailableError`
        (the caller makes a new consumer), never passes for an empty page,
        which a consumer would take for "caught up" and never read again.
        """
        nc = await self.client()
        lost = self._lost_signal()
        batch = _Batch(count)
        sub = await self.call(lambda: nc.subscribe(nc.new_inbox(), cb=batch.collect))
        request: dict[str, Any] = {"batch": count}
        if wait > 0:
            request["expires"] = int(wait * 1e9)
        else:
            request["no_wait"] = True
        lost.add_done_callback(batch.lost)
        try:
            await self.call(
                lambda: nc.publish(
                    f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
                    json.dumps(request).encode(),
                    reply=sub.subject,
                )
            )
            if wait > 0:
                await self._wait_first(batch.arrived, wait + self.timeout)
            while not batch.done.is_set():
                before = len(batch.out)
                try:
                    with BLOCKING_CALLS.track():  # a fake clock waits for the network
                        await asyncio.wait_for(batch.done.wait(), self.timeout)
                except TimeoutError:
                    if len(batch.out) == before:
                        raise LogUnavailableError(
                            f"NATS log {self.url} did not answer a read"
                        ) from None
        finally:
            lost.remove_done_callback(batch.lost)
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        if batch.refused:
            raise LogUnavailableError(
                f"NATS log {self.url}: a read of {stream} was refused: {batch.refused}"
            )
        return batch.out

    async def _wait_first(self, arrived: asyncio.Event, limit: float) -> None:
        """The first message of a waiting pull: real waiting, not a blocking call."""
        try:
            await asyncio.wait_for(arrived.wait(), limit)
        except TimeoutError as exc:
            raise LogUnavailableError(f"NATS log {self.url} did not answer a read") from exc

    async def direct_get(self, stream: str, request: Mapping[str, Any]) -> Stored | None:
        """One direct get from ``stream``; None when no message matches.

        :param request: ``seq``, ``last_by_subj`` or ``next_by_subj`` (with ``seq``).
        :raises JetStreamError: when the server answers another status.
        """
        nc = await self.client()
        data = json.dumps(request).encode()
        msg = await self.call(
            lambda: nc.request(f"$JS.API.DIRECT.GET.{stream}", data, timeout=self.timeout)
        )
        headers = msg.headers or {}
        status = headers.get("Status")
        if status == "404":
            return None
        if status:
            description = headers.get("Description", "")
            raise JetStreamError(
                f"NATS log {self.url}: reading {stream} ({request}) failed: {status} {description}",
                code=int(status) if status.isdigit() else 0,
                err_code=0,
                description=description,
            )
        return Stored(int(headers["Nats-Sequence"]), msg.data, headers)

    async def publish(
        self,
        subject: str,
        payload: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        what: str | None = None,
    ) -> int:
        """Publish one message and wait for the stream's acknowledgement; its sequence.

        :param headers: the server's controls: ``Nats-Msg-Id`` (a duplicate
            within the stream's window is not stored again: its sequence is
            the first one's), ``Nats-Expected-Last-Sequence``,
            ``Nats-Expected-Last-Subject-Sequence``.
        :raises WrongLastSequence: when an expected last sequence does not hold.
        :raises JetStreamError: for another refusal (``what``, default
            ``publish to <subject> refused``, names it).
        :raises NoResponders: when no stream takes ``subject``.
        :raises LogUnavailableError: as :meth:`call`.
        """
        nc = await self.client()
        sent = None if headers is None else dict(headers)
        msg = await self.call(
            lambda: nc.request(subject, payload, timeout=self.timeout, headers=sent)
        )
        answer = json.loads(msg.data)
        refused = _refusal(
            answer, f"NATS log {self.url}: {what or f'publish to {subject} refused'}"
        )
        if refused is not None:
            raise refused
        return int(answer["seq"])

    async def publish_all(
        self, subject: str, messages: Sequence[tuple[bytes, Mapping[str, str]]]
    ) -> list[int | LogError]:
        """Publish ``messages`` (data, headers) to ``subject`` in order, then wait for
        all the stream's acknowledgements together.

        The messages leave one after another on the one connection without
        waiting for answers (the server takes them in that order); the wait
        ends when every one is answered, when the connection is lost, or
        when no answer has come for ``timeout`` seconds.

        :returns: per message its sequence (as :meth:`publish`), or the error
            it met: :class:`JetStreamError` for a refusal, :class:`NoResponders`,
            or :class:`~wakuwaku.LogUnavailableError` for no answer (the
            message may be stored) or for a message not sent (the connection
            was lost first).
        """
        nc = await self.client()
        lost = self._lost_signal()
        batch = await self._acks.start(nc, len(messages), self.url, subject)
        try:
            with BLOCKING_CALLS.track():  # a fake clock waits for the network
                for index, (data, headers) in enumerate(messages):
                    try:
                        await nc.publish(
                            subject, data, reply=batch.reply(index), headers=dict(headers)
                        )
                    except (nats.errors.Error, OSError) as exc:
                        batch.fail_unsent(index, f"NATS log {self.url}: not sent: {exc!r}")
                        break
                while not batch.done.done():
                    before = batch.remaining
                    await asyncio.wait(
                        (batch.done, lost),
                        timeout=self.timeout,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    if lost.done() or batch.remaining == before:
                        break
        finally:
            self._acks.finish(batch)
        return batch.results


class _PublishBatch:
    """The acknowledgements one :meth:`JetStream.publish_all` waits for."""

    __slots__ = ("done", "prefix", "remaining", "results", "what")

    def __init__(self, prefix: str, count: int, url: str, subject: str) -> None:
        self.prefix = prefix
        self.what = f"NATS log {url}: publish to {subject} refused"
        self.remaining = count
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        unanswered = LogUnavailableError(f"NATS log {url} did not answer a publish to {subject}")
        self.results: list[int | LogError] = [unanswered] * count
        if count == 0:
            self.done.set_result(None)

    def reply(self, index: int) -> str:
        return f"{self.prefix}{index}"

    def answer(self, index: int, result: int | LogError) -> None:
        if not 0 <= index < len(self.results) or self.done.done():
            return
        self.results[index] = result
        self.remaining -= 1
        if self.remaining == 0:
            self.done.set_result(None)

    def fail_unsent(self, index: int, why: str) -> None:
        """Messages from ``index`` on were not sent: they stay failed, and nothing is awaited."""
        error = LogUnavailableError(why)
        for i in range(index, len(self.results)):
            self.results[i] = error
        if not self.done.done():
            self.done.set_result(None)


class _Acks:
    """One reply subscription per connection (``<inbox>.<batch>.<index>``) that hands
    the stream's acknowledgements to the batches waiting for them."""

    def __init__(self) -> None:
        self._nc: Client | None = None
        self._inbox = ""
        self._batches: dict[str, _PublishBatch] = {}
        self._next = 0

    async def start(self, nc: Client, count: int, url: str, subject: str) -> _PublishBatch:
        if self._nc is not nc:  # noted first: a concurrent batch does not subscribe again
            self._nc, self._inbox = nc, nc.new_inbox()
            # nats-py queues this SUB before any later PUB: no answer comes first.
            await nc.subscribe(f"{self._inbox}.*.*", cb=self._on_answer)
        self._next += 1
        name = str(self._next)
        batch = _PublishBatch(f"{self._inbox}.{name}.", count, url, subject)
        self._batches[name] = batch
        return batch

    def finish(self, batch: _PublishBatch) -> None:
        self._batches.pop(batch.prefix.rsplit(".", 2)[-2], None)

    async def _on_answer(self, msg: Msg) -> None:
        _, name, index = msg.subject.rsplit(".", 2)
        batch = self._batches.get(name)
        if batch is None or not index.isdigit():
            return  # a late answer to a batch that stopped waiting
        status = (msg.headers or {}).get("Status")
        result: int | LogError
        if status == "503":
            result = NoResponders(
                f"{batch.what}: nothing answered (no stream or JetStream not ready)"
            )
        else:
            try:
                answer = json.loads(msg.data)
                refused = _refusal(answer, batch.what)
                result = refused if refused is not None else int(answer["seq"])
            except (ValueError, KeyError, TypeError) as exc:
                result = LogError(f"{batch.what}: an answer that is no acknowledgement: {exc}")
        batch.answer(int(index), result)
