"""The :class:`IggyLog` facade: the log contract on Apache Iggy, put together from its parts.

Owns the log's construction (address, credentials or a personal access
token, TLS, stream, timeout, URL),
the checks of every contract call's arguments, the topics' creation
(which topics take :data:`~._messages.HEADER_ROOM` more bytes) and
deletion, the append tokens of this instance, the fence check every fenced
write starts with (asked of the member's group, :mod:`._groups`), and
closing; it hands each contract call to the part that does it:

- :mod:`._server`: the connection, bounded calls and their errors, the
  stream, the topics and their cache, end offsets;
- :mod:`._messages`: records as Iggy messages, sends, reads, start offsets,
  and (:mod:`._unanswered`) the appends whose answer was lost;
- :mod:`._offsets`: the groups' stored offsets, commits, their deletion;
- :mod:`._groups`: the members, their Iggy consumer groups, who owns which
  partition.

May call: all of them. Called by :mod:`wakuwaku.logs` (``open_log``) and
users of ``wakuwaku.logs.iggy``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from urllib.parse import unquote

import xxhash

from ..._errors import ConfigError, FencedError, PartitionCountMismatch
from ..._records import Record
from ..._sanitize import redact_url
from ..._topics import split_derived_topic
from .._base import (
    AppendTokens,
    Lease,
    Log,
    OutgoingRecord,
    TopicInfo,
    check_commit,
    check_partition,
    check_read,
    check_records,
    check_token,
)
from .._url import (
    LogURL,
    check_servers,
    check_timeout,
    log_url,
    option_bool,
    option_timeout,
    parse_log_url,
)
from ._groups import Groups, Member
from ._messages import HEADER_ROOM, MAX_PAYLOAD, Messages
from ._offsets import Offsets
from ._server import MAX_NAME, TLS, Server, check_group, check_name
from ._unanswered import batch_ids

__all__ = (
    "PASSWORD_ENV",
    "TOKEN_ENV",
    "USERNAME_ENV",
    "IggyLog",
    "iggy_partition",
)

USERNAME_ENV = "WAKUWAKU_IGGY_USERNAME"
"""The user name used when the URL names none."""
PASSWORD_ENV = "WAKUWAKU_IGGY_PASSWORD"
"""The password used when the URL names none (never printed)."""
TOKEN_ENV = "WAKUWAKU_IGGY_TOKEN"
"""The personal access token used when the URL names no credentials (never printed)."""

_MAX_PARTITIONS = 1000
_DROP_SETTLE = 0.1  # seconds close() gives a dropped client's runtime to end


def iggy_partition(key: str | bytes, partitions: int) -> int:
    """Iggy's message-key partitioning: xxHash32 of the key bytes (seed 0) mod ``partitions``.

    The server's ``Partitioning::messages_key`` (``core/common/src/utils/hash.rs``);
    a str key is UTF-8 encoded.
    """
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return int(xxhash.xxh32_intdigest(raw, seed=0)) % partitions


def _login_token(username: str | None, password: str | None, token: str | None) -> str | None:
    """The personal access token the log logs in with; None: a user and password.

    Credentials given to the log beat the environment's. A token and a
    password from the same place are refused, not one of them picked: a log
    that logged in as someone else than meant would act with their rights.

    :raises ConfigError: for an empty token, a token given with a user name
        or password, or both :data:`TOKEN_ENV` and :data:`PASSWORD_ENV` set
        (named, never their values).
    """
    if token is not None:
        if not isinstance(token, str) or not token:
            raise ConfigError("an Iggy personal access token (token) is empty")
        if username is not None or password is not None:
            raise ConfigError(
                "an Iggy log logs in with a personal access token (token) or with a user "
                "name and password, not both: give one"
            )
        return token
    if username is not None or password is not None:
        return None
    from_env = os.environ.get(TOKEN_ENV) or None
    if from_env is not None and os.environ.get(PASSWORD_ENV):
        raise ConfigError(
            f"both {TOKEN_ENV} and {PASSWORD_ENV} are set: an Iggy log logs in with a "
            "personal access token or with a password, not both; unset one"
        )
    return from_env


def _tls(parsed: LogURL) -> TLS | None:
    """The URL's ``tls``, ``tls_ca_file`` and ``tls_domain`` options as :class:`TLS`.

    :raises ConfigError: for a bad ``tls`` value, a ``tls_ca_file`` that is
        not a file, an empty ``tls_domain``, or either of them without
        ``tls=1`` (a log that was meant to validate a certificate would
        otherwise speak plain TCP).
    """
    if not option_bool(parsed, "tls", False):
        for name in ("tls_ca_file", "tls_domain"):
            if name in parsed.options:
                raise ConfigError(
                    f"bad Iggy log URL {redact_url(parsed.url)!r}: {name} needs tls=1"
                )
        return None
    return TLS(parsed.options.get("tls_ca_file"), parsed.options.get("tls_domain"))


def _derived(topic: str) -> bool:
    """True for an engine-made topic name (the one rule, :mod:`wakuwaku._topics`)."""
    return split_derived_topic(topic) is not None


class IggyLog(Log):
    """A :class:`~wakuwaku.logs.Log` on Apache Iggy (``iggy://user:password@host:port``).

    :param address: the server's TCP ``host:port``.
    :param username: / :param password: the Iggy user (never printed).
    :param token: a personal access token of an Iggy user, which logs in
        instead of a user name and password (never printed).
    :param tls: TLS on every connection, the server's certificate validated
        (:class:`~wakuwaku.logs.iggy.TLS`); plain TCP when None.

    Without ``username``, ``password`` and ``token``, the environment gives
    them: :data:`TOKEN_ENV`, else :data:`USERNAME_ENV` (default ``iggy``)
    and :data:`PASSWORD_ENV`.
    :param stream: the Iggy stream holding the log's topics (created on first use).
    :param timeout: the bound of every call to the server (seconds, finite,
        > 0); past it the call raises :class:`~wakuwaku.LogUnavailableError`.

    Ownership: :meth:`acquire_partition` joins the Iggy consumer group
    ``<group>`` of the topic as ``member`` (one connection per member) and
    answers from the assignment the server gives it; ``ttl`` decides
    nothing. The server moves a partition at once when a member joins or
    leaves, and when a member's connection closes (a member that stops
    answering pings loses its partitions after the server's heartbeat
    window, 36 s by default). Each member asks for its assignment every
    0.5 s and before each fenced append and each fenced commit but one of
    its own partition's offset past 0, which the server fences itself.
    Members a killed server kept in a group (sessions with no connection,
    whose partitions nobody would consume) are found and cleared by
    deleting the group and creating it again, which keeps its committed
    offsets; every live member joins again (``docs/logs.md``, "Outages";
    finding them needs Iggy's ``read_servers`` permission).

    What a member that lost a partition can still write (Iggy has no
    transactions and no conditional append): an append, or a commit the
    server does not fence, that began its ownership check before the server
    moved the partition (one round trip and the write itself); its commits
    of the partition it owned (past 0) are refused by the server (the
    consumer-group offset fence), its appends to retry and dead-letter
    topics are not.

    :raises ConfigError: for a bad address, stream name or timeout, an empty
        token, a token given with a user name or password (or both set in
        the environment), naming them and never their values.
    """

    commits_zero = False
    """Iggy stores the last record consumed: a committed 0 reads back as None."""
    max_record_size = MAX_PAYLOAD - HEADER_ROOM
    """The largest record (body and headers, bytes) on a main topic."""

    def __init__(
        self,
        address: str = "127.0.0.1:8090",
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls: TLS | None = None,
        stream: str = "wakuwaku",
        timeout: float = 5.0,
    ) -> None:
        check_servers("Iggy", address, "iggy://user:password@host:port")
        if "," in address:
            raise ConfigError("an Iggy log names one server: iggy://user:password@host:port")
        if not isinstance(stream, str) or not stream or len(stream.encode()) > MAX_NAME:
            raise ConfigError(f"an Iggy stream name takes 1-255 bytes, got {stream!r}")
        timeout = float(check_timeout(timeout))
        if tls is not None and not isinstance(tls, TLS):
            raise ConfigError(f"an Iggy log's tls is a wakuwaku.logs.iggy.TLS, got {tls!r}")
        token = _login_token(username, password, token)
        self.address = address
        self.stream = stream
        self.tls = tls
        # The credentials stay out of the url: another process opening it
        # takes them from its own environment.
        self.url = log_url(
            "iggy",
            address,
            [
                ("stream", stream, "wakuwaku"),
                ("timeout", timeout, 5.0),
                ("tls", tls is not None, False),
                ("tls_ca_file", tls.ca_file if tls else None, None),
                ("tls_domain", tls.domain if tls else None, None),
            ],
        )
        if password is None:
            password = os.environ.get(PASSWORD_ENV)
        self._server = Server(
            address,
            username or os.environ.get(USERNAME_ENV) or "iggy",
            password or "",
            stream,
            timeout,
            self.url,
            token=token,
            tls=tls,
            login_hint=None
            if token is not None or password
            else (
                "no password was given: name it in the URL (iggy://user:password@host:port) "
                f"or in the environment's {PASSWORD_ENV}, or give a token"
            ),
        )
        self._messages = Messages(self._server)
        self._groups = Groups(self._server)
        self._offsets = Offsets(self._server)
        self._members = self._groups.members  # a test reaches a member through it
        self._tokens = AppendTokens()

    def __repr__(self) -> str:
        return f"IggyLog({self.url!r})"

    @property
    def timeout(self) -> float:
        """The bound of every call to the server (seconds); set, it bounds the calls made after."""
        return self._server.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._server.timeout = value

    @property
    def _password(self) -> str:
        """The Iggy user's password (never printed)."""
        return self._server.password

    def partition_for(self, key: str | bytes, partitions: int) -> int:
        """Iggy's message-key partitioning (:func:`iggy_partition`)."""
        return iggy_partition(key, partitions)

    # -- topics ---------------------------------------------------------------

    async def create_topic(
        self, topic: str, partitions: int, *, derived_from: str | None = None
    ) -> TopicInfo:
        """Create the Iggy topic ``topic`` in the log's stream; see :meth:`Log.create_topic`.

        ``derived_from`` (or a derived name, ``wk-retry.`` / ``wk-dlq.`` /
        ``wk-replayed.``) gives the topic :data:`HEADER_ROOM` more bytes per
        record in this instance.

        :raises ConfigError: for a bad name (over 255 bytes of UTF-8 too) or
            a count outside 1..1000 (Iggy's limit).
        :raises PartitionCountMismatch: when the topic exists with another count.
        :raises LogUnavailableError: when the server does not answer.
        """
        check_name(topic)
        if (
            isinstance(partitions, bool)
            or not isinstance(partitions, int)
            or not 1 <= partitions <= _MAX_PARTITIONS
        ):
            raise ConfigError(
                f"topic {topic!r}: partition count must be >= 1 (at most 1000 on Iggy), "
                f"got {partitions!r}"
            )
        if derived_from is not None or _derived(topic):
            self._messages.mark_derived(topic)
        existing = await self._server.create_topic(topic, partitions)
        if existing != partitions:
            raise PartitionCountMismatch(topic, existing, partitions)
        return TopicInfo(topic, partitions)

    async def describe_topic(self, topic: str) -> TopicInfo:
        return TopicInfo(topic, await self._server.partitions(topic, fresh=True))

    async def list_topics(self) -> list[TopicInfo]:
        """Every topic of the log's stream, by name (none while the stream does not exist)."""
        return await self._server.list_topics()

    async def delete_topic(self, topic: str) -> bool:
        """Delete the Iggy topic with its records, consumer groups and stored offsets.

        This instance's members leave nothing behind: their memberships of
        the topic's consumer groups go with it.

        :returns: False when there was no such topic.
        """
        if not await self._server.delete_topic(topic):
            return False
        self._messages.forget(topic)
        self._groups.forget_topic(topic)
        return True

    # -- records --------------------------------------------------------------

    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[OutgoingRecord],
        *,
        fence: Lease | None = None,
        token: str | None = None,
    ) -> list[int]:
        """Send ``records`` to one partition as one Iggy batch; returns their offsets.

        With ``fence``, the member must own the fence's partition now (asked
        of the server right before the send). A ``token`` is remembered by
        this instance once the server confirmed the batch, and names the
        records' Iggy message ids: an append whose send raised
        :class:`~wakuwaku.LogUnavailableError`, sent again with its token,
        is first looked for on the partition (Iggy keeps no token; see
        :meth:`~._messages.Messages.send`).

        :raises ConfigError: for a record over the topic's limit (naming it);
            nothing is written.
        :raises FencedError: when the fence's partition is no longer this
            member's; nothing is written.
        """
        check_token(token)
        checked = check_records(records)
        check_partition(topic, partition, await self._server.partitions(topic))
        if not checked:
            return []
        done = self._tokens.get(topic, partition, token, len(checked))
        if done is not None:
            if fence is not None:
                await self._groups.fence_owner(fence)
            return done
        ids: Sequence[int | None] = (
            [None] * len(checked) if token is None else batch_ids(token, len(checked))
        )
        messages = [
            self._messages.message(topic, partition, h, bytes(b), ident)
            for (h, b), ident in zip(checked, ids, strict=True)
        ]
        if token is not None:
            # Stored by a try whose answer was lost (under the fence then).
            found = await self._messages.unanswered.find(topic, partition, token, len(checked))
            if found is not None:
                self._tokens.put(topic, partition, token, found)
                return found
        if fence is not None:
            await self._groups.fence_owner(fence)
        offsets = await self._messages.send(topic, partition, messages, token, ids[0])
        self._tokens.put(topic, partition, token, offsets)
        return offsets

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        wait: float = 0.0,
    ) -> list[Record]:
        """Poll up to ``max_records`` records from ``offset`` on (by offset, storing nothing).

        With ``wait``, polls again every 20 ms until a record is there or
        ``wait`` seconds have passed.
        """
        offset, max_records, wait = check_read(topic, partition, offset, max_records, wait)
        check_partition(topic, partition, await self._server.partitions(topic))
        return await self._messages.read(topic, partition, offset, max_records, wait)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        return await self._server.end_offsets(topic)

    async def start_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset of the first stored record (the end when none)."""
        return await self._messages.start_offsets(topic)

    # -- offsets ----------------------------------------------------------------

    async def group_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """Committed offsets on ``topic`` of every group that has an Iggy consumer
        group on it: group -> partition -> next offset to read.

        Iggy lists consumer groups per topic, not the consumers that stored
        offsets: a group that only ever committed without joining (a tool's
        ``commit``, a consumer without ownership), and a group's offsets on
        its retry topic (whose partitions belong to the main topic's members,
        outside any Iggy group), are not listed. A group with nothing stored
        is left out.

        :raises UnknownTopicError: when the topic does not exist.
        :raises LogUnavailableError: when the server does not answer.
        """
        return await self._offsets.group_offsets(topic)

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset: the next offset to read (Iggy stores the
        last record consumed; this is one past it). None when none was stored,
        the topic is gone, or the group committed 0 (Iggy cannot store "before
        the first record")."""
        check_group(group)
        return await self._offsets.committed(group, topic, partition)

    async def commit(
        self,
        group: str,
        topic: str,
        partition: int,
        offset: int,
        *,
        fence: Lease | None = None,
    ) -> None:
        """Store the group's position (the next offset to read) on the server.

        Iggy stores the last record consumed, so ``offset`` N is stored as
        N - 1, as the offset of the Iggy consumer ``<group>``; 0 deletes it.
        With ``fence``, the member must own the partition now: for the
        member's own partition, the offset is stored first as its Iggy
        consumer group's, which the server refuses from a member that no
        longer owns it (the assignment as last seen is checked before, with
        no round trip); for a retry partition of it, and for offset 0 (a
        deletion, which has no group offset), the server is asked first.

        :raises ConfigError: as :meth:`Log.commit`, and for an offset past the
            partition's end offset (Iggy stores offsets of records only).
        :raises FencedError: as :meth:`Log.commit`.
        """
        offset = check_commit(group, topic, partition, offset)
        check_group(group)
        check_partition(topic, partition, await self._server.partitions(topic))
        owner: Member | None = None
        if fence is not None:
            if fence.group != group:
                raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)
            # The member's own partition: its group offset goes first and the
            # server refuses it from a member that lost the partition, so the
            # assignment as last seen is checked without asking (a round trip
            # per batch less). A retry partition is outside the member's Iggy
            # group: the server is asked.
            # Offset 0 deletes the stored offset, with no group offset the
            # server could refuse: asked too.
            own = (fence.topic, fence.partition) == (topic, partition)
            owner = await self._groups.fence_owner(fence, ask=not own or offset == 0)
            if not own:
                owner = None
        try:
            await self._offsets.commit(group, topic, partition, offset, owner)
        except FencedError:
            if fence is not None:
                await self._groups.refused(fence)
            raise

    async def _store(
        self, owner: Member | None, kind: int, group: str, topic: str, partition: int, stored: int
    ) -> None:
        """:meth:`Offsets.store <._offsets.Offsets.store>` (a test sends a stale
        member's group offset through it)."""
        await self._offsets.store(owner, kind, group, topic, partition, stored)

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        """Delete the group's stored offsets and its Iggy consumer groups (on
        ``topic``, or on every topic of the stream); this instance's members
        of it leave first.

        :returns: how many stored offsets were deleted.
        :raises UnknownTopicError: when ``topic`` does not exist.
        """
        check_group(group)
        if topic is not None:
            topics = [TopicInfo(topic, await self._server.partitions(topic, fresh=True))]
        else:
            topics = await self._server.list_topics()
        await self._groups.leave(group, [t.name for t in topics])
        deleted = 0
        for info in topics:
            deleted += await self._offsets.delete(group, info)
            await self._groups.drop_group(group, info.name)
        return deleted

    # -- ownership ------------------------------------------------------------------

    async def acquire_partition(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        """A lease while the server assigns ``partition`` to ``member`` in the Iggy
        consumer group ``group`` of ``topic``.

        The member's first call for a topic creates the Iggy group when
        missing and joins it (the server rebalances at once). ``ttl`` only
        sets ``expires_at``.
        """
        check_group(group)
        check_partition(topic, partition, await self._server.partitions(topic))
        return await self._groups.acquire(group, topic, partition, member, ttl)

    async def partition_owners(self, group: str, topic: str) -> dict[int, Lease]:
        """Who owns each partition of ``topic`` in ``group`` now, from the server
        (members of every process).

        A member of this instance is named and has its lease generation (it
        is known by its partitions, asked of the server before and after
        the group is read); a member the server lists that this instance
        does not know is named ``iggy-member-<id>`` (Iggy's member id) with
        generation 0.
        ``expires_at`` is now: Iggy keeps an assignment while the member's
        session lives, with no expiry to show.

        :raises UnknownTopicError: when the topic does not exist.
        """
        check_group(group)
        await self._server.partitions(topic, fresh=True)
        return await self._groups.owners(group, topic)

    async def ownership_changed(self, group: str, member: str, within: float) -> None:
        """Return when ``member``'s assignment changed, or after ``within`` seconds
        (:class:`~wakuwaku.engine._ownership.AssignmentLog`)."""
        await self._groups.changed(group, member, within)

    def ownership_state(self, lease: Lease) -> str:
        """``owned`` while the last answer of the server assigns the lease's partition
        to its member in its generation, else ``gone`` (Iggy moves a partition at
        once: there is no revoking state)."""
        return self._groups.state(lease)

    async def release_partition(self, lease: Lease) -> None:
        """Let a partition go; the member leaves the topic's Iggy group once it
        holds none of its partitions, and closes its connection once it holds
        nothing."""
        await self._groups.release(lease)

    # -- close ---------------------------------------------------------------------

    async def close(self) -> None:
        """Leave every group and drop the connections; calling it again does nothing."""
        if self._server.closed:
            return
        await self._groups.close()
        if self._server.close():
            # Dropping the client lets its Rust runtime end the connection
            # in the background, which calls back into Python. A process
            # that exited at once aborted (SIGABRT, exit 134) about 1 run in
            # 10, its tokio thread taking the GIL during interpreter
            # shutdown; 0.1 s for that to end made it 0 of 200.
            await asyncio.sleep(_DROP_SETTLE)

    # -- URLs ----------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str) -> IggyLog:
        """``iggy://[user[:password]@]host:port[?options]``.

        Options: ``stream`` (default ``wakuwaku``), ``timeout`` (seconds),
        ``tls=1`` (TLS, the server's certificate validated), ``tls_ca_file``
        (a PEM file of the CAs to trust; default the system's roots),
        ``tls_domain`` (the name the certificate must carry; default the
        host), ``token`` (a personal access token, instead of
        ``user:password@``).

        Without credentials in the URL, ``WAKUWAKU_IGGY_TOKEN`` gives a
        personal access token, else ``WAKUWAKU_IGGY_USERNAME`` (default
        ``iggy``) and ``WAKUWAKU_IGGY_PASSWORD`` a user. None of them is
        part of :attr:`url`, ``repr`` or any message; the TLS options are
        (another process opening :attr:`url` needs them).

        :raises ConfigError: for a URL without ``host:port``, a bad option,
            or credentials given twice (a token with ``user:password@``, or
            both variables set), named without their values.
        """
        parsed = parse_log_url(url)
        credentials, at, address = parsed.rest.rstrip("/").rpartition("@")
        user = password = None
        if at:
            name, colon, secret = credentials.partition(":")
            user = unquote(name) or None
            password = unquote(secret) if colon else None
        token = parsed.options.get("token")
        if token is not None and " " in token:
            # Iggy's tokens are base64: a '+' in a URL's query reads as a space.
            raise ConfigError(
                f"bad Iggy log URL {redact_url(url)!r}: option 'token' holds a space; a '+' "
                "in a URL must be written %2B (or give the token in WAKUWAKU_IGGY_TOKEN)"
            )
        if token is not None and at:
            raise ConfigError(
                f"bad Iggy log URL {redact_url(url)!r}: option 'token' logs in instead of "
                "user:password@; give one of them"
            )
        timeout = option_timeout(parsed, "timeout", 5.0)
        return cls(
            address,
            username=user,
            password=password,
            token=token,
            tls=_tls(parsed),
            stream=parsed.options.get("stream", "wakuwaku"),
            timeout=timeout,
        )
