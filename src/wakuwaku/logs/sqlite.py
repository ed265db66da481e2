"""The embedded SQLite log: one file, WAL mode, safe for several processes.

The default log of wakuwaku (design §1): no server, durable, one file. Several
processes on one machine may append, read, commit and hold leases on one
file at the same time:

- every write runs in ``BEGIN IMMEDIATE``, so writers queue on SQLite's
  write lock (up to ``busy_timeout`` seconds) instead of failing half-way;
- an append reads and bumps the partition's ``next_offset`` inside its
  transaction, so offsets are dense from 0 per partition in every process;
- readers never block writers (WAL) and see whole appends only.

Blocking sqlite3 calls run on one worker thread per instance, which owns
the instance's connection; the event loop never waits on the disk. The
schema is ``sqlite_schema.sql`` beside this module; docs/logs.md describes
the file layout and the decisions taken where the spec is silent.

:class:`SQLiteLog` implements the :class:`~wakuwaku.logs.Log` contract on
four private parts, each owning its state; each calls only the parts
listed below it:

- :mod:`._sqlite_groups`: committed offsets, leases and fencing, retention;
- :mod:`._sqlite_reads`: the read path, its records read ahead and its poll
  loop;
- :mod:`._sqlite_records`: the record rows: encoding, the insert, decoding;
- :mod:`._sqlite_file`: the worker thread, the connection (opening and
  checking the file, errors, rollback) and the topic id cache.

The log itself keeps the argument checks, the topics (create, describe,
list, delete, start and end offsets), the append tokens, and the writes
that span parts in one transaction (append, store).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from .._errors import ConfigError, PartitionCountMismatch
from .._records import Record
from ._base import (
    AppendTokens,
    BatchWrite,
    Lease,
    Log,
    OutgoingRecord,
    TopicInfo,
    check_commit,
    check_read,
    check_token,
    check_topic_name,
)
from ._sqlite_file import APPLICATION_ID as APPLICATION_ID
from ._sqlite_file import SCHEMA_VERSION as SCHEMA_VERSION
from ._sqlite_file import SQLiteFile
from ._sqlite_groups import Groups, check_fence, upsert_commit
from ._sqlite_reads import Reads
from ._sqlite_records import Row, encode_record, insert
from ._url import log_url

__all__ = ("APPLICATION_ID", "SCHEMA_VERSION", "SQLiteLog")


class SQLiteLog(Log):
    """A :class:`~wakuwaku.logs.Log` in one SQLite file (URL ``sqlite:///path``; design §1, §15).

    :param path: the database file; missing parent directories are created.
        The file is opened (and created, when it does not exist) by the first
        operation, on the instance's worker thread.
    :param retention: when true, :meth:`apply_retention` runs for a topic
        after a commit on it, at most once every 5 seconds per topic.
    :param busy_timeout: how long a write waits for another process's write
        lock before :class:`~wakuwaku.LogUnavailableError` (seconds).
    :param fsync: when true (default), each append and commit is on disk
        before it returns (``PRAGMA synchronous=FULL``); when false
        (``NORMAL``), a process crash loses nothing but a power loss may
        lose the last transactions.

    Every operation may raise :class:`~wakuwaku.CorruptLogError` when the
    file is not a wakuwaku log (random bytes, another application's
    database, a newer schema), :class:`~wakuwaku.LogUnavailableError` when
    the file stays locked longer than ``busy_timeout`` or the disk fails,
    and :class:`~wakuwaku.LogError` after :meth:`close`.

    :raises ConfigError: for an empty path, ``:memory:`` or a negative
        ``busy_timeout``.
    """

    atomic_store = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        retention: bool = False,
        busy_timeout: float = 30.0,
        fsync: bool = True,
    ) -> None:
        if busy_timeout < 0:
            raise ConfigError(f"busy_timeout must be >= 0 seconds, got {busy_timeout!r}")
        self.path = os.fspath(path)
        if not self.path or self.path == ":memory:":
            raise ConfigError(f"SQLiteLog needs a file path, got {self.path!r}")
        self.url = log_url(
            "sqlite",
            f"/{self.path}",
            [("fsync", bool(fsync), True), ("busy_timeout", float(busy_timeout), 30.0)],
        )
        self.retention = retention
        self.busy_timeout = float(busy_timeout)
        self.fsync = fsync
        self._tokens = AppendTokens()
        self._file = SQLiteFile(self.path, busy_timeout=self.busy_timeout, fsync=fsync)
        self._groups = Groups(self._file, retention=retention)
        self._reads = Reads(self._file)

    def __repr__(self) -> str:
        return f"SQLiteLog({self.path!r})"

    # -- topics -----------------------------------------------------------

    async def create_topic(
        self, topic: str, partitions: int, *, derived_from: str | None = None
    ) -> TopicInfo:
        check_topic_name(topic)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"topic {topic!r}: partition count must be >= 1, got {partitions!r}")
        return await self._file.run(self._create_topic, topic, partitions)

    def _create_topic(self, topic: str, partitions: int) -> TopicInfo:
        db = self._file.db()
        db.execute("BEGIN IMMEDIATE")
        row = db.execute("SELECT partitions FROM wk_topics WHERE name = ?", (topic,)).fetchone()
        if row is not None:
            db.execute("COMMIT")
            if row[0] != partitions:
                raise PartitionCountMismatch(topic, int(row[0]), partitions)
            return TopicInfo(topic, partitions)
        cur = db.execute(
            "INSERT INTO wk_topics (name, partitions, created_at) VALUES (?, ?, ?)",
            (topic, partitions, time.time()),
        )
        topic_id = cur.lastrowid
        db.executemany(
            "INSERT INTO wk_partitions (topic_id, part) VALUES (?, ?)",
            [(topic_id, p) for p in range(partitions)],
        )
        db.execute("COMMIT")
        return TopicInfo(topic, partitions)

    async def describe_topic(self, topic: str) -> TopicInfo:
        return await self._file.run(self._describe_topic, topic)

    def _describe_topic(self, topic: str) -> TopicInfo:
        return TopicInfo(topic, self._file.topic(self._file.db(), topic)[1])

    async def list_topics(self) -> list[TopicInfo]:
        return await self._file.run(self._list_topics)

    def _list_topics(self) -> list[TopicInfo]:
        rows = self._file.db().execute(
            "SELECT name, partitions FROM wk_topics WHERE name NOT LIKE char(0) || '%'"
            " ORDER BY name"
        )
        return [TopicInfo(name, partitions) for name, partitions in rows]

    async def delete_topic(self, topic: str) -> bool:
        """Delete ``topic`` in one transaction; see :meth:`Log.delete_topic`.

        Its ``wk_topics`` row stays as a tombstone (renamed to a name no
        topic can have), so its id is never given to another topic: a
        process that still has the old id cached gets
        :class:`~wakuwaku.UnknownTopicError` instead of writing into a new
        topic of the same name.
        """
        self._reads.forget(topic)
        return await self._file.run(self._delete_topic, topic)

    def _delete_topic(self, topic: str) -> bool:
        db = self._file.db()
        self._file.evict(topic)
        db.execute("BEGIN IMMEDIATE")
        row = db.execute("SELECT id FROM wk_topics WHERE name = ?", (topic,)).fetchone()
        if row is None:
            db.execute("COMMIT")
            return False
        topic_id = int(row[0])
        db.execute("DELETE FROM wk_records WHERE topic_id = ?", (topic_id,))
        db.execute("DELETE FROM wk_partitions WHERE topic_id = ?", (topic_id,))
        db.execute("DELETE FROM wk_commits WHERE topic = ?", (topic,))
        db.execute("DELETE FROM wk_leases WHERE topic = ?", (topic,))
        db.execute(
            "UPDATE wk_topics SET name = char(0) || 'deleted ' || id WHERE id = ?", (topic_id,)
        )
        db.execute("COMMIT")
        return True

    async def end_offsets(self, topic: str) -> dict[int, int]:
        return await self._file.run(self._bounds, topic, "next_offset")

    async def start_offsets(self, topic: str) -> dict[int, int]:
        return await self._file.run(self._bounds, topic, "start_offset")

    def _bounds(self, topic: str, column: str) -> dict[int, int]:
        db = self._file.db()
        topic_id, _ = self._file.topic(db, topic)
        rows = db.execute(
            f"SELECT part, {column} FROM wk_partitions WHERE topic_id = ? ORDER BY part",
            (topic_id,),
        )
        bounds = {int(part): int(value) for part, value in rows}
        if not bounds:
            self._file.check_alive(db, topic_id)
        return bounds

    # -- records ----------------------------------------------------------

    async def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[OutgoingRecord],
        *,
        fence: Lease | None = None,
        token: str | None = None,
    ) -> list[int]:
        """Append ``records`` to one partition in one transaction; see :meth:`Log.append`.

        The fence is checked inside the write transaction. A ``token`` is
        remembered by this instance once the transaction committed (one
        that failed stored nothing), so an append sent again with it
        returns the first one's offsets and writes nothing. Both happen on
        the log's one worker thread, in order with the writes: an append
        whose caller stopped waiting (cancelled, timed out) still commits
        there and is remembered, and an append sent again after it finds
        its token (it was stored twice when the token was remembered only
        on the caller's side).

        :raises ConfigError: when a header name is not a str or a header value
            or body is not bytes-like, or for a bad token; nothing is written then.
        """
        check_token(token)
        encoded = [encode_record(headers, body) for headers, body in records]
        return await self._file.run(self._append, topic, partition, encoded, fence, token)

    def _append(
        self,
        topic: str,
        partition: int,
        encoded: list[Row],
        fence: Lease | None,
        token: str | None = None,
    ) -> list[int]:
        """The append itself, on the worker thread (see :meth:`append`)."""
        done = self._tokens.get(topic, partition, token, len(encoded))
        if done is not None:
            # sent again: only check that the fence still holds
            self._write(topic, partition, [], fence)
            return done
        offsets = self._write(topic, partition, encoded, fence)
        self._tokens.put(topic, partition, token, offsets)
        return offsets

    def _write(
        self, topic: str, partition: int, encoded: list[Row], fence: Lease | None
    ) -> list[int]:
        db = self._file.db()
        topic_id = self._file.partition(db, topic, partition)
        if not encoded and fence is None:
            return []
        db.execute("BEGIN IMMEDIATE")
        check_fence(db, fence)
        offsets = insert(db, topic_id, partition, encoded, time.time())
        db.execute("COMMIT")
        return offsets

    async def store(self, write: BatchWrite, *, fence: Lease | None = None) -> list[list[int]]:
        """Write all of ``write`` in one transaction, or nothing; see :meth:`Log.store`."""
        appends = [
            (topic, partition, [encode_record(h, b) for h, b in records])
            for topic, partition, records in write.appends
        ]
        commits = [
            (topic, partition, check_commit(write.group, topic, partition, offset))
            for topic, partition, offset in write.commits
        ]
        assigned = await self._file.run(self._store, write.group, appends, commits, fence)
        if self.retention and commits:
            for topic in {topic for topic, _, _ in commits}:
                self._reads.forget(topic)
        return assigned

    def _store(
        self,
        group: str,
        appends: list[tuple[str, int, list[Row]]],
        commits: list[tuple[str, int, int]],
        fence: Lease | None,
    ) -> list[list[int]]:
        db = self._file.db()
        topic_ids = [self._file.partition(db, topic, partition) for topic, partition, _ in appends]
        for topic, partition, _ in commits:
            self._file.partition(db, topic, partition)
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        check_fence(db, fence)
        assigned = [
            insert(db, topic_id, partition, encoded, now)
            for topic_id, (_, partition, encoded) in zip(topic_ids, appends, strict=True)
        ]
        for topic, partition, offset in commits:
            upsert_commit(db, group, topic, partition, offset, now)
        db.execute("COMMIT")
        return assigned

    async def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        wait: float = 0.0,
    ) -> list[Record]:
        """Read records with offsets ``>= offset``; see :meth:`Log.read`.

        A reader that reads on where its last read of the partition ended
        (a poll loop), or reads it for the first time, gets a full page of
        fewer than 2 500 records fetched with the records behind it (2 500
        in all, at most 1 MiB), which are kept for its next read: it pays
        the worker-thread hop once every few pages; a page the kept records
        only begin is completed from the file, so no record is read from
        the file twice. A read elsewhere (one that skips or goes back, as a
        retry round reading its keys' pending records does) fetches only
        its page: records read ahead there would be decoded and dropped
        (a flights demo run decoded 2 million retry records that way for
        77 000 it used). Records never change once written, so what is kept
        is what the file held; records another process's retention has
        deleted since may still be returned from it.

        While nothing is there and ``wait`` (seconds) has not run out, the
        file is polled every 25 ms, so appends of other processes are seen.
        """
        offset, max_records, wait = check_read(topic, partition, offset, max_records, wait)
        return await self._reads.read(self._read, topic, partition, offset, max_records, wait)

    def _read(
        self, topic: str, partition: int, offset: int, max_records: int, read_ahead: bool
    ) -> tuple[list[Record], list[Record]]:
        """On the worker thread: a page and the records read ahead of it
        (:meth:`Reads.fetch_page <._sqlite_reads.Reads.fetch_page>`); each
        read looks it up on the log, so a test can watch what the file gives."""
        return self._reads.fetch_page(topic, partition, offset, max_records, read_ahead)

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
        """Store the group's offset; see :meth:`Log.commit`.

        The fencing check and the write are one transaction, so a member that
        lost its lease in another process cannot slip a commit in between.

        :raises UnknownTopicError: / :raises UnknownPartitionError: for a
            topic or partition that does not exist.
        :raises FencedError: when ``fence`` is not the current lease.
        """
        offset = check_commit(group, topic, partition, offset)
        await self._file.run(self._groups.commit, group, topic, partition, offset, fence)
        if self.retention:
            self._reads.forget(topic)

    async def committed(self, group: str, topic: str, partition: int) -> int | None:
        return await self._file.run(self._groups.committed, group, topic, partition)

    async def group_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """See :meth:`Log.group_offsets <wakuwaku.logs.Log.group_offsets>`."""
        return await self._file.run(self._groups.group_offsets, topic)

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        """Delete ``group``'s offsets and leases in one transaction (:meth:`Log.delete_group`)."""
        return await self._file.run(self._groups.delete, group, topic)

    async def partition_owners(self, group: str, topic: str) -> dict[int, Lease]:
        """See :meth:`Log.partition_owners <wakuwaku.logs.Log.partition_owners>`."""
        return await self._file.run(self._groups.owners, group, topic)

    async def acquire_partition(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        """Take or renew a lease; see :meth:`Log.acquire_partition`.

        Expiry is judged by the wall clock (``time.time()``), the one clock
        all processes on the machine share.

        :raises ConfigError: for an empty ``member`` or a ``ttl`` not above 0.
        """
        if not member:
            raise ConfigError("a lease needs a non-empty member name")
        if ttl <= 0:
            raise ConfigError(f"a lease ttl must be > 0 seconds, got {ttl!r}")
        return await self._file.run(
            self._groups.acquire, group, topic, partition, member, float(ttl)
        )

    async def release_partition(self, lease: Lease) -> None:
        """Give up ``lease`` when it is still the current one; see :meth:`Log.release_partition`."""
        await self._file.run(self._groups.release, lease)

    # -- retention and shutdown -------------------------------------------

    async def apply_retention(self, topic: str) -> int:
        """Delete records below the lowest committed offset of every group (per partition).

        A partition on which no group ever committed keeps everything; the
        start offset never passes the end offset.

        :returns: how many records were deleted.
        :raises UnknownTopicError: when the topic does not exist.
        """
        removed = await self._file.run(self._groups.apply_retention, topic)
        self._reads.forget(topic)
        return removed

    async def close(self) -> None:
        """Close the connection and stop the worker thread; calling it again does nothing."""
        if self._file.closed:
            return
        self._reads.clear()
        await self._file.close()
