"""The SQLite log's consumer group state: committed offsets, leases, fencing, retention.

Owns the two tables keyed by (group, topic, partition) and what follows
from them, each call on the worker thread:

- ``wk_commits``: a group's committed offsets (:meth:`Groups.commit`,
  :func:`upsert_commit` inside another write's transaction), read back
  per partition or per topic;
- ``wk_leases``: a partition's lease (member, generation, expiry), taken
  and renewed in one ``BEGIN IMMEDIATE`` transaction judged by the wall
  clock, released only by its current generation; :func:`check_fence`
  refuses a write under a stale lease inside the writer's transaction;
- deleting a group's rows, and **retention**: a partition's records below
  the lowest offset any group committed on it are deleted, on demand or
  after a commit (at most once every 5 seconds per topic).

It keeps no records read ahead: the log drops those of a topic after
retention (:meth:`wakuwaku.logs.sqlite.SQLiteLog.apply_retention`). May
call: :mod:`._sqlite_file` (the connection, the topic ids, the rollback of
a failed automatic retention), :mod:`._base` (:class:`~wakuwaku.logs.Lease`)
and :mod:`wakuwaku._errors`.
"""

from __future__ import annotations

import logging
import sqlite3
import time

from .._errors import FencedError
from ._base import Lease
from ._sqlite_file import SQLiteFile

__all__ = ("Groups", "check_fence", "upsert_commit")

_RETENTION_INTERVAL = 5.0

logger = logging.getLogger("wakuwaku.logs.sqlite")  # the adapter's one logger


def check_fence(db: sqlite3.Connection, fence: Lease | None) -> None:
    """Inside a write transaction: :raises FencedError: for a stale ``fence``."""
    if fence is None:
        return
    row = db.execute(
        "SELECT generation FROM wk_leases WHERE grp = ? AND topic = ? AND part = ?",
        (fence.group, fence.topic, fence.partition),
    ).fetchone()
    if row is None or row[0] != fence.generation:
        raise FencedError(fence.group, fence.topic, fence.partition, fence.generation)


def upsert_commit(
    db: sqlite3.Connection, group: str, topic: str, partition: int, offset: int, now: float
) -> None:
    """Inside a write transaction: store ``group``'s offset on one partition."""
    db.execute(
        "INSERT INTO wk_commits (grp, topic, part, off, committed_at) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (grp, topic, part) DO UPDATE SET off = excluded.off,"
        " committed_at = excluded.committed_at",
        (group, topic, partition, offset, now),
    )


class Groups:
    """The groups' offsets and leases in one SQLite log; every method runs on
    the worker thread (through :meth:`SQLiteFile.run <._sqlite_file.SQLiteFile.run>`).

    :param file: the log's file.
    :param retention: when true, :meth:`commit` applies retention to its
        topic, at most once every 5 seconds per topic.
    """

    def __init__(self, file: SQLiteFile, *, retention: bool) -> None:
        self._file = file
        self._retention = retention
        self._retained_at: dict[str, float] = {}

    # -- offsets ----------------------------------------------------------

    def commit(
        self,
        group: str,
        topic: str,
        partition: int,
        offset: int,
        fence: Lease | None,
    ) -> None:
        """Check ``fence`` and store the offset in one transaction, then apply
        retention when it is due (a failure there is logged, not raised)."""
        db = self._file.db()
        self._file.partition(db, topic, partition)
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        check_fence(db, fence)
        upsert_commit(db, group, topic, partition, offset, now)
        db.execute("COMMIT")
        if self._retention and now - self._retained_at.get(topic, 0.0) >= _RETENTION_INTERVAL:
            self._retained_at[topic] = now
            try:
                self.apply_retention(topic)
            except sqlite3.Error as exc:
                self._file.rollback()
                logger.warning("automatic retention of topic %r failed: %s", topic, exc)

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """``group``'s committed offset on one partition; None when it has none."""
        row = (
            self._file.db()
            .execute(
                "SELECT off FROM wk_commits WHERE grp = ? AND topic = ? AND part = ?",
                (group, topic, partition),
            )
            .fetchone()
        )
        return None if row is None else int(row[0])

    def group_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """Every group's committed offsets on ``topic``: group -> partition -> offset."""
        db = self._file.db()
        self._file.topic(db, topic)
        found: dict[str, dict[int, int]] = {}
        rows = db.execute(
            "SELECT grp, part, off FROM wk_commits WHERE topic = ? ORDER BY grp, part", (topic,)
        )
        for group, part, off in rows:
            found.setdefault(group, {})[int(part)] = int(off)
        return found

    def delete(self, group: str, topic: str | None) -> int:
        """Delete ``group``'s offsets and leases (on ``topic`` only, when given)
        in one transaction; returns how many offsets were deleted."""
        db = self._file.db()
        if topic is not None:
            self._file.evict(topic)
            self._file.topic(db, topic)
        where, args = (
            ("grp = ?", (group,)) if topic is None else ("grp = ? AND topic = ?", (group, topic))
        )
        db.execute("BEGIN IMMEDIATE")
        removed = db.execute(f"DELETE FROM wk_commits WHERE {where}", args).rowcount
        db.execute(f"DELETE FROM wk_leases WHERE {where}", args)
        db.execute("COMMIT")
        return int(removed)

    # -- leases -----------------------------------------------------------

    def owners(self, group: str, topic: str) -> dict[int, Lease]:
        """The leases held on ``topic``'s partitions for ``group`` (released ones left out)."""
        db = self._file.db()
        self._file.topic(db, topic)
        rows = db.execute(
            "SELECT part, member, generation, expires_at FROM wk_leases"
            " WHERE grp = ? AND topic = ? AND member != '' ORDER BY part",
            (group, topic),
        )
        return {
            int(part): Lease(group, topic, int(part), member, int(gen), float(exp))
            for part, member, gen, exp in rows
        }

    def acquire(
        self, group: str, topic: str, partition: int, member: str, ttl: float
    ) -> Lease | None:
        """Take a free or expired lease (the next generation) or renew
        ``member``'s own (the same one) for ``ttl`` seconds; None while
        another member holds it."""
        db = self._file.db()
        db.execute("BEGIN IMMEDIATE")
        now = time.time()
        row = db.execute(
            "SELECT member, generation, expires_at FROM wk_leases"
            " WHERE grp = ? AND topic = ? AND part = ?",
            (group, topic, partition),
        ).fetchone()
        if row is not None and row[0] != member and row[2] > now:
            db.execute("COMMIT")
            return None
        if row is not None and row[0] == member:
            generation = int(row[1])
        else:
            generation = (int(row[1]) if row is not None else 0) + 1
        lease = Lease(group, topic, partition, member, generation, now + ttl)
        db.execute(
            "INSERT INTO wk_leases (grp, topic, part, member, generation, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (grp, topic, part) DO UPDATE SET"
            " member = excluded.member, generation = excluded.generation,"
            " expires_at = excluded.expires_at",
            (group, topic, partition, member, generation, lease.expires_at),
        )
        db.execute("COMMIT")
        return lease

    def release(self, lease: Lease) -> None:
        """Free ``lease``'s partition when ``lease`` is still its current generation."""
        self._file.db().execute(
            "UPDATE wk_leases SET member = '', expires_at = 0"
            " WHERE grp = ? AND topic = ? AND part = ? AND generation = ?",
            (lease.group, lease.topic, lease.partition, lease.generation),
        )

    # -- retention --------------------------------------------------------

    def apply_retention(self, topic: str) -> int:
        """Delete each partition's records below the lowest offset a group
        committed on it, in one transaction; returns how many were deleted."""
        db = self._file.db()
        topic_id, _ = self._file.topic(db, topic)
        db.execute("BEGIN IMMEDIATE")
        marks = db.execute(
            "SELECT p.part, p.start_offset, min(p.next_offset, min(c.off))"
            " FROM wk_partitions p JOIN wk_commits c ON c.topic = ? AND c.part = p.part"
            " WHERE p.topic_id = ? GROUP BY p.part",
            (topic, topic_id),
        ).fetchall()
        removed = 0
        for part, start, low in marks:
            if low <= start:
                continue
            cur = db.execute(
                "DELETE FROM wk_records WHERE topic_id = ? AND part = ? AND off < ?",
                (topic_id, part, low),
            )
            removed += cur.rowcount
            db.execute(
                "UPDATE wk_partitions SET start_offset = ? WHERE topic_id = ? AND part = ?",
                (low, topic_id, part),
            )
        db.execute("COMMIT")
        return removed
