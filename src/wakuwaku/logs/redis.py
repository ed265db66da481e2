"""The Redis Streams log: topics on a Redis server, shared by processes and machines.

Layout (``docs/logs.md``, "The Redis log"), under a key prefix (``wk`` by
default) so that several logs share one Redis database:

- ``<prefix>:topics``: a hash, topic name -> partition count (stored once);
- per (topic, partition), keys that start with the Redis Cluster hash tag
  ``{<prefix>:<len(S)>:<S>:<partition>}`` of its slot topic ``S`` (the topic,
  or for a group's retry and dead-letter topics their main topic), then
  ``<len(topic)>:<topic>`` (the lengths make the mapping from names to keys
  one-to-one whatever the topic holds):
  ``:s`` the stream, ``:meta`` (``next``, ``start`` offsets), ``:off``
  (group -> committed offset), ``:lease`` (group -> generation, expiry,
  member), ``:tok:<token>`` (idempotency tokens of appends, 5 minutes).

A record at offset ``n`` is the stream entry ``0-<n+1>`` (dense offsets,
assigned by the append script; ``0-0`` is not a valid id) with the fields
``t`` (append time, the server's clock), ``b`` (body) and one ``:<name>``
field per header, so any bytes round-trip. An entry the log cannot read
back is returned marked ``wk-unreadable`` (docs/logs.md), never raised.
Writes run as Lua scripts beside this module (``redis_write.lua``,
``redis_lease.lua``, ``redis_retain.lua``): the fencing check and the write
are one script.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import msgspec

from .._clock import BLOCKING_CALLS
from .._errors import (
    ConfigError,
    FencedError,
    LogError,
    LogUnavailableError,
    PartitionCountMismatch,
    UnknownTopicError,
)
from .._records import Record, unreadable_record
from .._sanitize import redact_url
from .._topics import split_derived_topic
from ._base import (
    BatchWrite,
    Lease,
    Log,
    OutgoingRecord,
    TopicInfo,
    check_commit,
    check_partition,
    check_read,
    check_record,
    check_token,
    check_topic_name,
)
from ._url import LOG_URL_OPTIONS, check_timeout, log_url, option_timeout, parse_log_url

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError("the Redis log needs redis-py: pip install 'wakuwaku[redis]'") from exc

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

__all__ = ("PASSWORD_ENV", "RedisLog")

PASSWORD_ENV = "WAKUWAKU_REDIS_PASSWORD"
"""The environment variable the password comes from when the URL has none."""

_POLL_INTERVAL = 0.02
_TOKEN_TTL_MS = 300_000
_ATTEMPTS = 2  # a call whose connection broke is sent once more on a new one
_UNAVAILABLE = ("LOADING", "BUSY", "READONLY", "MASTERDOWN", "OOM", "TRYAGAIN", "CLUSTERDOWN")


def _script(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text("utf-8")


class RedisLog(Log):
    """A :class:`~wakuwaku.logs.Log` on Redis Streams (``redis://host:port/db``; design §1, §15).

    :param url: ``redis://[user[:password]@]host[:port][/db][?prefix=wk&timeout=5]``
        or ``rediss://`` (TLS). Without a password in the URL, the one in
        the environment variable ``WAKUWAKU_REDIS_PASSWORD`` is used. The
        password is never shown: :attr:`url`, ``repr`` and error messages
        leave it out (another process opening :attr:`url` reads it from the
        environment variable).
    :param prefix: the key prefix (overrides the URL's ``prefix``); logs
        with different prefixes on one database never see each other.
    :param timeout: the bound of every network call: connecting, and each
        command's reply (seconds; overrides the URL's ``timeout``, default 5).

    One connection pool per instance. Every operation raises
    :class:`~wakuwaku.LogUnavailableError` when Redis cannot be reached,
    does not answer within ``timeout``, or is loading, read-only or out of
    memory; a call whose connection broke is sent once more on a new
    connection first (appends carry an idempotency token, so that second
    send never stores a record twice). After :meth:`close`, operations
    raise :class:`~wakuwaku.LogError`.

    :raises ConfigError: for a URL that is not ``redis://``/``rediss://``,
        an unknown URL option, a bad db number, port or timeout, or an empty
        or ``{``/``}``-holding prefix.
    """

    atomic_store = True
    """Appends, offsets and fence checks of :meth:`store` run in one script.

    A script is atomic on one Redis node. On Redis Cluster a store whose
    keys are in several hash slots (a batch writing to the retry and
    dead-letter topics) is refused by the server with ``CROSSSLOT``: the
    Redis log supports a single node (with replicas), not a cluster."""

    def __init__(
        self, url: str, *, prefix: str | None = None, timeout: float | None = None
    ) -> None:
        options = _parse_url(url)
        if prefix is not None:
            options["prefix"] = prefix
        if timeout is not None:
            options["timeout"] = check_timeout(timeout)
        self.prefix: str = options["prefix"]
        if not self.prefix or "{" in self.prefix or "}" in self.prefix:
            raise ConfigError(
                f"a Redis log key prefix must be non-empty, without '{{' or "
                f"'}}', got {self.prefix!r}"
            )
        self.timeout: float = options["timeout"]
        scheme, host, port, db = options["scheme"], options["host"], options["port"], options["db"]
        shown = f"[{host}]" if ":" in host else host
        self.url = log_url(
            scheme,
            f"{shown}:{port}/{db}",
            [("prefix", self.prefix, "wk"), ("timeout", float(self.timeout), 5.0)],
        )
        self._where = f"Redis log {scheme}://{shown}:{port}/{db} (prefix {self.prefix!r})"
        password = options["password"] or os.environ.get(PASSWORD_ENV) or None
        self._redis = aioredis.Redis(
            host=host,
            port=port,
            db=db,
            username=options["username"],
            password=password,
            ssl=scheme == "rediss",
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
        )
        # XRANGE replies stay the server's flat lists: :func:`_records` reads
        # them directly instead of redis-py building a dict per entry first.
        self._redis.set_response_callback("XRANGE", _raw_reply)
        self._write: AsyncScript = self._redis.register_script(_script("redis_write.lua"))
        self._lease: AsyncScript = self._redis.register_script(_script("redis_lease.lua"))
        self._retain: AsyncScript = self._redis.register_script(_script("redis_retain.lua"))
        self._topics: dict[str, int] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisLog({self.url!r})"

    # -- plumbing ---------------------------------------------------------

    def _tag(self, topic: str, partition: int) -> str:
        """The keys of one (topic, partition): a Redis Cluster hash tag of its
        *slot topic* and partition, then the topic itself.

        A group's retry, dead-letter and replay-ledger topics have the slot
        of their main topic (:func:`slot_topic`), so the scripts that write
        them under the main partition's lease touch one slot only (a Redis
        Cluster refuses a script over keys of several slots); the topic's own
        length and name after the tag keep the mapping from names to keys
        one-to-one.
        """
        slot = slot_topic(topic)
        return f"{{{self.prefix}:{len(slot)}:{slot}:{partition}}}{len(topic)}:{topic}"

    @contextlib.asynccontextmanager
    async def _calls(self, what: str) -> AsyncIterator[None]:
        """Translate redis-py's errors of one operation into the log's."""
        if self._closed:
            raise LogError(f"the {self._where} is closed")
        try:
            with BLOCKING_CALLS.track():  # a fake clock waits for real I/O to finish
                yield
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
            raise LogUnavailableError(
                f"{self._where} is unavailable ({what}): {type(exc).__name__}: {exc}"
            ) from exc
        except redis_errors.ResponseError as exc:
            text = str(exc)
            if text.startswith(_UNAVAILABLE):
                raise LogUnavailableError(f"{self._where} is unavailable ({what}): {text}") from exc
            raise LogError(f"{self._where} failed ({what}): {text}") from exc
        except redis_errors.RedisError as exc:
            raise LogError(f"{self._where} failed ({what}): {type(exc).__name__}: {exc}") from exc

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args)`` once more on a new connection when the first one broke."""
        async with self._calls(what):
            for attempt in range(_ATTEMPTS):
                try:
                    return await fn(*args, **kwargs)
                except (redis_errors.ConnectionError, OSError):
                    if attempt + 1 == _ATTEMPTS:
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _partitions(self, topic: str) -> int:
        found = self._topics.get(topic)
        if found is None:
            raw = await self._call(
                "describe topic", self._redis.hget, f"{self.prefix}:topics", topic
            )
            if raw is None:
                raise UnknownTopicError(topic)
            found = self._topics[topic] = int(raw)
        return found

    async def _partition(self, topic: str, partition: int) -> None:
        check_partition(topic, partition, await self._partitions(topic))

    def _gone(self, topic: str) -> UnknownTopicError:
        self._topics.pop(topic, None)
        return UnknownTopicError(topic)

    # -- topics -----------------------------------------------------------

    async def create_topic(
        self, topic: str, partitions: int, *, derived_from: str | None = None
    ) -> TopicInfo:
        """Create ``topic``; see :meth:`Log.create_topic`.

        The partitions' keys are made first and the topic is entered in
        ``<prefix>:topics`` last, so no process sees a topic without its
        partitions; two processes creating one topic at once agree (the
        second gets the first one's count, or :class:`PartitionCountMismatch`).
        """
        check_topic_name(topic)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"topic {topic!r}: partition count must be >= 1, got {partitions!r}")
        topics = f"{self.prefix}:topics"
        existing = await self._call("create topic", self._redis.hget, topics, topic)
        if existing is None:
            async with self._calls("create topic"):
                pipe = self._redis.pipeline(transaction=False)
                for p in range(partitions):
                    meta = f"{self._tag(topic, p)}:meta"
                    pipe.hsetnx(meta, "next", 0)
                    pipe.hsetnx(meta, "start", 0)
                await pipe.execute()
                await self._redis.hsetnx(topics, topic, partitions)
            existing = await self._call("create topic", self._redis.hget, topics, topic)
        count = int(existing or 0)
        if count != partitions:
            raise PartitionCountMismatch(topic, count, partitions)
        self._topics[topic] = count
        return TopicInfo(topic, count)

    async def describe_topic(self, topic: str) -> TopicInfo:
        self._topics.pop(topic, None)  # read it from Redis: another process may have deleted it
        return TopicInfo(topic, await self._partitions(topic))

    async def list_topics(self) -> list[TopicInfo]:
        found = await self._call("list topics", self._redis.hgetall, f"{self.prefix}:topics")
        return [
            TopicInfo(name, int(count))
            for name, count in sorted((n.decode(), c) for n, c in found.items())
        ]

    async def delete_topic(self, topic: str) -> bool:
        """Delete ``topic``: its records, offsets and leases; see :meth:`Log.delete_topic`.

        The topic leaves ``<prefix>:topics`` first, so other processes'
        writes to it fail with :class:`~wakuwaku.UnknownTopicError` while its
        keys go.
        """
        topics = f"{self.prefix}:topics"
        raw = await self._call("delete topic", self._redis.hget, topics, topic)
        self._topics.pop(topic, None)
        if raw is None:
            return False
        async with self._calls("delete topic"):
            await self._redis.hdel(topics, topic)
            for p in range(int(raw)):
                tag = self._tag(topic, p)
                await self._redis.delete(f"{tag}:s", f"{tag}:meta", f"{tag}:off", f"{tag}:lease")
        return True

    # -- append and read --------------------------------------------------

    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[OutgoingRecord],
        *,
        fence: Lease | None = None,
        token: str | None = None,
    ) -> list[int]:
        """Append ``records`` in one script; see :meth:`Log.append`.

        The script stores all the records or none. Its idempotency token
        (``<partition>:tok:<token>``, 5 minutes) is ``token`` when given:
        an append sent again with it, after a lost reply, returns the first
        one's offsets and writes nothing; without one, a fresh token covers
        the log's own resend on a new connection.

        :raises ConfigError: as :func:`~wakuwaku.logs._base.check_record`, or
            for a bad token.
        """
        check_token(token)
        (assigned,) = await self._store(
            BatchWrite("", appends=[(topic, partition, records)]), fence, token
        )
        return assigned

    async def store(self, write: BatchWrite, *, fence: Lease | None = None) -> list[list[int]]:
        """Write all of ``write`` in one script, or nothing; see :meth:`Log.store`.

        A store with appends carries an idempotency token: when its reply is
        lost and it is sent again, the second run returns the first run's
        offsets and writes nothing (for 5 minutes).
        """
        return await self._store(write, fence, None)

    async def _store(
        self, write: BatchWrite, fence: Lease | None, token: str | None
    ) -> list[list[int]]:
        encoded = [
            (topic, partition, [_encode(headers, body) for headers, body in records])
            for topic, partition, records in write.appends
        ]
        commits = [
            (topic, partition, check_commit(write.group, topic, partition, offset))
            for topic, partition, offset in write.commits
        ]
        for topic, partition, _ in encoded:
            await self._partition(topic, partition)
        for topic, partition, _ in commits:
            await self._partition(topic, partition)
        fences = [fence] if fence is not None else []
        return await self._run_write(write.group, encoded, commits, fences, token)

    async def _run_write(
        self,
        group: str,
        appends: list[tuple[str, int, list[list[bytes]]]],
        commits: list[tuple[str, int, int]],
        fences: list[Lease],
        token: str | None = None,
    ) -> list[list[int]]:
        keys = [f"{self._tag(f.topic, f.partition)}:lease" for f in fences]
        args: list[bytes | str | int] = [len(fences)]
        for f in fences:
            args += [f.group, str(f.generation)]
        if not any(records for _, _, records in appends):
            token = ""
        elif token is None:
            token = uuid.uuid4().hex
        anchor = appends[0] if appends else commits[0] if commits else None
        if anchor is None and not fences:
            return []
        anchor_key = self._tag(anchor[0], anchor[1]) if anchor else keys[0]
        keys.append(f"{anchor_key}:tok:{token}")
        args += [token, _TOKEN_TTL_MS, group, len(appends), len(commits)]
        for topic, partition, records in appends:
            tag = self._tag(topic, partition)
            keys += [f"{tag}:meta", f"{tag}:s"]
            args.append(len(records))
            for fields in records:
                args += fields
        for topic, partition, offset in commits:
            tag = self._tag(topic, partition)
            keys += [f"{tag}:meta", f"{tag}:off"]
            args.append(str(offset))
        try:
            written = await self._call("write", self._write, keys, args)
        except LogError as exc:
            raise self._refusal(exc, appends, commits, fences) from exc.__cause__
        # (first offset, record count) per append: a token's first run may
        # have written another number of records than this call holds.
        firsts, counts = written[0::2], written[1::2]
        for (topic, partition, records), count in zip(appends, counts, strict=True):
            if int(count) != len(records):
                raise ConfigError(
                    f"append token {token!r} on {topic}/{partition} was used for an append "
                    f"of {int(count)} records, now {len(records)}: a token names one append"
                )
        return [
            list(range(int(first), int(first) + len(records)))
            for first, (_, _, records) in zip(firsts, appends, strict=True)
        ]

    def _refusal(
        self,
        exc: LogError,
        appends: list[tuple[str, int, list[list[bytes]]]],
        commits: list[tuple[str, int, int]],
        fences: list[Lease],
    ) -> LogError:
        """The error a script's ``WKFENCED``/``WKGONE`` reply stands for."""
        text = str(exc.__cause__) if exc.__cause__ is not None else ""
        code, _, index = text.partition(" ")
        if code == "WKFENCED":
            f = fences[int(index) - 1]
            return FencedError(f.group, f.topic, f.partition, f.generation)
        if code == "WKGONE":
            targets = [(t, p) for t, p, _ in appends] + [(t, p) for t, p, _ in commits]
            return self._gone(targets[int(index) - 1][0])
        return exc

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        wait: float = 0.0,
    ) -> list[Record]:
        """Read records with offsets ``>= offset``; see :meth:`Log.read`.

        One ``XRANGE`` per try; while nothing is there and ``wait`` (seconds)
        has not run out, the stream is read again every 20 ms, so a read
        holds no connection while it waits. A read cancelled while its
        command is in flight closes that connection (redis-py drops a
        connection on cancellation), so no reply is left on a pooled one.
        """
        offset, max_records, wait = check_read(topic, partition, offset, max_records, wait)
        await self._partition(topic, partition)
        tag = self._tag(topic, partition)
        start = f"0-{max(0, offset) + 1}"
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            entries = await self._call(
                "read", self._redis.xrange, f"{tag}:s", start, "+", max_records
            )
            if entries:
                return _records(entries)
            if not await self._call("read", self._redis.exists, f"{tag}:meta"):
                raise self._gone(topic)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            await asyncio.sleep(min(_POLL_INTERVAL, remaining))

    async def end_offsets(self, topic: str) -> dict[int, int]:
        return await self._bounds(topic, "next")

    async def start_offsets(self, topic: str) -> dict[int, int]:
        return await self._bounds(topic, "start")

    async def _bounds(self, topic: str, field: str) -> dict[int, int]:
        partitions = await self._partitions(topic)
        async with self._calls("offsets"):
            pipe = self._redis.pipeline(transaction=False)
            for p in range(partitions):
                pipe.hget(f"{self._tag(topic, p)}:meta", field)
            values = await pipe.execute()
        if any(value is None for value in values):
            raise self._gone(topic)
        return {p: int(value) for p, value in enumerate(values)}

    # -- offsets and leases -----------------------------------------------

    async def commit(
        self,
        group: str,
        topic: str,
        partition: int,
        offset: int,
        *,
        fence: Lease | None = None,
    ) -> None:
        """Store the group's offset, fenced in the same script; see :meth:`Log.commit`."""
        offset = check_commit(group, topic, partition, offset)
        await self._partition(topic, partition)
        fences = [fence] if fence is not None else []
        await self._run_write(group, [], [(topic, partition, offset)], fences)

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        raw = await self._call(
            "committed", self._redis.hget, f"{self._tag(topic, partition)}:off", group
        )
        return None if raw is None else int(raw)

    async def group_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """See :meth:`Log.group_offsets <wakuwaku.logs.Log.group_offsets>`."""
        partitions = await self._partitions(topic)
        found: dict[str, dict[int, int]] = {}
        async with self._calls("group offsets"):
            for p in range(partitions):
                offsets = await self._redis.hgetall(f"{self._tag(topic, p)}:off")
                for group, offset in offsets.items():
                    name = group.decode() if isinstance(group, bytes) else group
                    found.setdefault(name, {})[p] = int(offset)
        return dict(sorted(found.items()))

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        """Delete ``group``'s offsets and leases; see :meth:`Log.delete_group`."""
        topics = [topic] if topic is not None else [t.name for t in await self.list_topics()]
        removed = 0
        for name in topics:
            partitions = await self._partitions(name)
            async with self._calls("delete group"):
                pipe = self._redis.pipeline(transaction=False)
                for p in range(partitions):
                    tag = self._tag(name, p)
                    pipe.hdel(f"{tag}:off", group)
                    pipe.hdel(f"{tag}:lease", group)
                results = await pipe.execute()
            removed += sum(results[0::2])
        return removed

    async def acquire_partition(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        """Take or renew a lease in one script; see :meth:`Log.acquire_partition`.

        Expiry is judged by the Redis server's clock, which every member shares.

        :raises ConfigError: for an empty ``member`` or a ``ttl`` not above 0.
        """
        if not member:
            raise ConfigError("a lease needs a non-empty member name")
        if ttl <= 0:
            raise ConfigError(f"a lease ttl must be > 0 seconds, got {ttl!r}")
        key = f"{self._tag(topic, partition)}:lease"
        reply = await self._call(
            "acquire lease",
            self._lease,
            [key],
            ["acquire", group, member, max(1, round(ttl * 1000))],
        )
        if not reply:
            return None
        generation, expires_ms = (int(value) for value in reply)
        return Lease(group, topic, partition, member, generation, expires_ms / 1000)

    async def partition_owners(self, group: str, topic: str) -> dict[int, Lease]:
        """See :meth:`Log.partition_owners <wakuwaku.logs.Log.partition_owners>`."""
        partitions = await self._partitions(topic)
        found: dict[int, Lease] = {}
        async with self._calls("partition owners"):
            for p in range(partitions):
                held = await self._redis.hget(f"{self._tag(topic, p)}:lease", group)
                if held is None:
                    continue
                text = held.decode() if isinstance(held, bytes) else str(held)
                generation, expires_ms, member = text.split(":", 2)
                if member:
                    found[p] = Lease(
                        group, topic, p, member, int(generation), int(expires_ms) / 1000
                    )
        return found

    async def release_partition(self, lease: Lease) -> None:
        key = f"{self._tag(lease.topic, lease.partition)}:lease"
        await self._call(
            "release lease", self._lease, [key], ["release", lease.group, str(lease.generation)]
        )

    # -- retention and shutdown -------------------------------------------

    async def apply_retention(self, topic: str) -> int:
        """Trim each partition's stream below every group's committed offset.

        A partition on which no group ever committed keeps everything; the
        start offset never passes the end offset.

        :returns: how many records were deleted.
        :raises UnknownTopicError: when the topic does not exist.
        """
        partitions = await self._partitions(topic)
        removed = 0
        for p in range(partitions):
            tag = self._tag(topic, p)
            removed += int(
                await self._call(
                    "retention", self._retain, [f"{tag}:meta", f"{tag}:off", f"{tag}:s"], []
                )
            )
        return removed

    async def close(self) -> None:
        """Close the connection pool; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        await self._redis.aclose()


def _encode(headers: Mapping[str, bytes], body: bytes) -> list[bytes]:
    """``[P, body, :name, value, ...]`` of one record (the write script's layout)."""
    checked = check_record(headers, body)
    fields: list[bytes] = [b"%d" % len(checked), bytes(body)]
    for name, value in checked.items():
        fields += [b":" + name.encode("utf-8", "surrogatepass"), bytes(value)]
    return fields


def _raw_reply(response: Any, **options: Any) -> Any:
    return response


def _records(entries: list[list[Any]]) -> list[Record]:
    """Records of raw ``XRANGE`` entries ``[id, [t, ts, b, body, :name, value, ...]]``.

    Records of one page whose header fields are equal share one headers dict
    (as the SQLite log does): fewer objects to build, and the engine's
    planner, which memoizes per headers dict, checks each distinct one once.
    Records and their headers are read-only. An entry the write script did
    not write (no ``b`` or ``t`` field, a header name that is not UTF-8, a
    ``t`` that is no number) becomes an unreadable record (:func:`_unreadable`),
    never an error that would fail every read of the partition.
    """
    out: list[Record] = []
    append = out.append
    shared: dict[tuple[bytes, ...], dict[str, bytes]] = {}
    get = shared.get
    for ident, fields in entries:
        offset = int(ident[2:]) - 1
        try:
            if fields[0] != b"t" or fields[2] != b"b":  # not the write script's order
                append(_record(offset, fields))
                continue
            extra = tuple(fields[4:])
            headers = get(extra)
            if headers is None:
                headers = {
                    extra[i][1:].decode("utf-8", "surrogatepass"): extra[i + 1]
                    for i in range(0, len(extra), 2)
                    if extra[i][:1] == b":"
                }
                shared[extra] = headers
            append(Record(offset, headers, fields[3], float(fields[1])))
        except (IndexError, KeyError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            append(_unreadable(offset, fields, exc))
    return out


def _record(offset: int, fields: list[bytes]) -> Record:
    """One record of an entry whose fields are in any order.

    :raises KeyError: without a ``b`` or ``t`` field; :raises ValueError: for
        a header name that is not UTF-8 or a ``t`` that is no number.
    """
    pairs = dict(zip(fields[0::2], fields[1::2], strict=True))
    headers = {
        name[1:].decode("utf-8", "surrogatepass"): value
        for name, value in pairs.items()
        if name[:1] == b":"
    }
    return Record(offset, headers, pairs[b"b"], float(pairs[b"t"]))


_encode_fields = msgspec.msgpack.Encoder().encode


def _unreadable(offset: int, fields: list[bytes], exc: Exception) -> Record:
    """The record of an entry :func:`_records` cannot read, kept whole
    (design §8): its ``b`` field as the body (all its fields, msgpack-encoded
    as a flat list of byte strings, when it has none), every other field but
    ``t`` in ``wk-raw-headers`` (the same encoding), and ``wk-unreadable``."""
    if isinstance(exc, KeyError):
        field = bytes(exc.args[0]).decode("ascii", "replace") if exc.args else "?"
        what = f"the stream entry has no {field!r} field"
    elif isinstance(exc, UnicodeDecodeError):
        what = "a header field name of the stream entry is not UTF-8"
    elif isinstance(exc, IndexError) or len(fields) % 2:
        what = "the stream entry's fields are not name and value pairs"
    else:
        what = "the stream entry's 't' field is not a time"
    names, values = fields[0::2], fields[1::2]
    body: bytes | None = None
    stamp = 0.0
    raw: list[bytes] = []
    for name, value in zip(names, values, strict=False):
        if name == b"b" and body is None:
            body = bytes(value)
        elif name == b"t":
            with contextlib.suppress(ValueError):
                stamp = float(value)
        else:
            raw += [bytes(name), bytes(value)]
    if body is None:
        body = _encode_fields([bytes(f) for f in fields])
    return unreadable_record(
        offset, f"Redis log: {what}", body, _encode_fields(raw) if raw else None, stamp
    )


def _parse_url(url: str) -> dict[str, Any]:
    """The parts of a ``redis://`` URL.

    :raises ConfigError: as :class:`RedisLog` says.
    """
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port or 6379
    except ValueError as exc:
        raise ConfigError(f"bad Redis log URL {shown!r}: {exc}") from None
    if parts.scheme.lower() not in ("redis", "rediss") or not parts.hostname:
        raise ConfigError(
            f"bad Redis log URL {shown!r}: use redis://host:port/db (or rediss:// for TLS)"
        )
    path = parts.path.strip("/") or "0"
    if not path.isdigit():
        raise ConfigError(f"bad Redis log URL {shown!r}: the path is the db number, got {path!r}")
    parsed = parse_log_url(url, {name: LOG_URL_OPTIONS[name] for name in ("redis", "rediss")})
    options: dict[str, Any] = {
        "prefix": parsed.options.get("prefix", "wk"),
        "timeout": option_timeout(parsed, "timeout", 5.0),
    }
    options.update(
        scheme=parts.scheme.lower(),
        host=parts.hostname,
        port=port,
        db=int(path),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )
    return options


def slot_topic(topic: str) -> str:
    """The topic whose Redis Cluster slot ``topic`` shares: for a group's
    retry, dead-letter or replay-ledger topic (``[ns.]wk-retry.<group>.<main>``)
    its main topic (``[ns.]<main>``), found again until it is no derived name
    itself (so every topic of one family maps to the same slot); any other
    topic is its own."""
    while (split := split_derived_topic(topic)) is not None:
        topic = split[0] + split[3]
    return topic
