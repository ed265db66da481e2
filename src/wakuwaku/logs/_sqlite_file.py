"""The SQLite log's file: its worker thread, its connection and the topics' ids.

Owns, for one :class:`~wakuwaku.logs.sqlite.SQLiteLog`:

- the **worker thread** that runs every blocking sqlite3 call, so the event
  loop never waits on the disk (:meth:`SQLiteFile.run`), and whether the
  log is closed;
- the **connection**, which only that thread uses: opened by the first
  call, which identifies the file before it changes anything in it, makes
  an empty file a log (``sqlite_schema.sql`` beside this module,
  :data:`APPLICATION_ID`, :data:`SCHEMA_VERSION`, WAL mode) and sets
  ``PRAGMA synchronous``;
- **failures**: a transaction an exception left open is rolled back, and a
  ``sqlite3.Error`` becomes the error the contract names
  (:class:`~wakuwaku.LogUnavailableError` for a lock held past
  ``busy_timeout`` or a disk failure, :class:`~wakuwaku.CorruptLogError`
  for a damaged or foreign file);
- the **topic ids**: ``(id, partitions)`` per topic name, cached (a topic
  never changes once created) and evicted when a call finds its topic gone
  (:class:`TopicGone`, raised as :class:`~wakuwaku.UnknownTopicError`).

It opens no transaction of its own but the one that makes a file a log, and
knows no records, offsets or leases. May call: sqlite3,
:mod:`wakuwaku._clock`, :mod:`wakuwaku._errors` and :mod:`._base` (the
partition check). The log (:mod:`wakuwaku.logs.sqlite`) and its other parts
(:mod:`._sqlite_records`, :mod:`._sqlite_reads`, :mod:`._sqlite_groups`)
call it, never the reverse.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from importlib import resources
from typing import ParamSpec, TypeVar

from .._clock import BLOCKING_CALLS
from .._errors import CorruptLogError, LogError, LogUnavailableError, UnknownTopicError
from ._base import check_partition

__all__ = ("APPLICATION_ID", "SCHEMA_VERSION", "SQLiteFile", "TopicGone", "schema_statements")

APPLICATION_ID = 0x776B776B
"""``PRAGMA application_id`` of a wakuwaku log file (``"wkwk"``)."""

SCHEMA_VERSION = 1
"""``PRAGMA user_version`` this code writes and reads."""

logger = logging.getLogger("wakuwaku.logs.sqlite")  # the adapter's one logger

_P = ParamSpec("_P")
_R = TypeVar("_R")


class TopicGone(Exception):
    """A cached topic id whose partitions are gone (the topic was deleted)."""


class SQLiteFile:
    """The file of one SQLite log, and the one thread that works on it.

    :param path: the database file (the log checked it); missing parent
        directories are created when it is opened.
    :param busy_timeout: how long a write waits for another connection's
        write lock (seconds).
    :param fsync: ``PRAGMA synchronous=FULL`` when true, ``NORMAL`` when false.
    """

    def __init__(self, path: str, *, busy_timeout: float, fsync: bool) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.fsync = fsync
        self.closed = False
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="wakuwaku-sqlite"
        )
        # Owned by the worker thread only: no lock needed.
        self._conn: sqlite3.Connection | None = None
        self._topics: dict[str, tuple[int, int]] = {}

    # -- the worker thread ------------------------------------------------

    def check_open(self) -> None:
        """:raises LogError: after :meth:`close`."""
        if self.closed:
            raise LogError(f"the SQLite log {self.path!r} is closed")

    async def run(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """``fn(*args, **kwargs)`` run on the worker thread; see :meth:`_guarded` for failures.

        :raises LogError: after :meth:`close`.
        """
        self.check_open()
        loop = asyncio.get_running_loop()
        call = functools.partial(self._guarded, fn, *args, **kwargs)
        with BLOCKING_CALLS.track():  # a fake clock waits for real I/O to finish
            return await loop.run_in_executor(self._executor, call)

    def _guarded(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """Call ``fn``; on any failure roll back what it left open, and raise a
        ``sqlite3.Error`` as the contract's error and :class:`TopicGone` as
        :class:`~wakuwaku.UnknownTopicError` (evicting the topic's id)."""
        try:
            return fn(*args, **kwargs)
        except sqlite3.Error as exc:
            self.rollback()
            raise self._translate(exc) from exc
        except TopicGone as gone:
            self.rollback()
            names = [name for name, (tid, _) in self._topics.items() if tid == gone.args[0]]
            for name in names:
                self._topics.pop(name, None)
            raise UnknownTopicError(names[0] if names else f"#{gone.args[0]}") from None
        except BaseException:
            self.rollback()
            raise

    def rollback(self) -> None:
        """End a transaction an exception left open, so the next call starts clean."""
        if self._conn is not None and self._conn.in_transaction:
            try:
                self._conn.rollback()
            except sqlite3.Error as exc:  # the original error is the one to report
                logger.debug("rollback after a failure failed too: %s", exc)

    def _translate(self, exc: sqlite3.Error) -> LogError:
        text = str(exc)
        lowered = text.lower()
        if "locked" in lowered or "busy" in lowered:
            return LogUnavailableError(
                f"SQLite log {self.path!r} stayed locked by another connection for more "
                f"than busy_timeout={self.busy_timeout:g} s: {text}"
            )
        if any(sign in lowered for sign in ("not a database", "malformed", "no such")):
            return CorruptLogError(f"SQLite log {self.path!r} is damaged: {text}")
        if isinstance(exc, sqlite3.OperationalError):
            return LogUnavailableError(f"SQLite log {self.path!r} is unavailable: {text}")
        return LogError(f"SQLite log {self.path!r} failed: {text}")

    async def close(self) -> None:
        """Close the connection and stop the worker thread; calling it again does nothing."""
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        self.closed = True
        await loop.run_in_executor(self._executor, self._close_conn)
        self._executor.shutdown(wait=False)

    def _close_conn(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    # -- the connection (worker thread) -----------------------------------

    def db(self) -> sqlite3.Connection:
        """The connection, opened by the first call."""
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        parent = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise LogUnavailableError(
                f"cannot create the directory of SQLite log {self.path!r}: {exc}"
            ) from exc
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        try:
            self._check_and_init(conn)
            conn.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_and_init(self, conn: sqlite3.Connection) -> None:
        # Identify the file before changing anything in it (WAL mode included),
        # so a foreign database is left exactly as it was.
        # Any schema object (table, index, view, trigger) means the file is not empty.
        app_id, objects = self._identity(conn)
        if app_id == 0 and objects == 0:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")
            app_id, objects = self._identity(conn)  # another process may have won
            if app_id == 0 and objects == 0:
                for statement in schema_statements():
                    conn.execute(statement)
                conn.execute("INSERT INTO wk_meta VALUES ('created_at', ?)", (repr(time.time()),))
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                app_id = APPLICATION_ID
            conn.execute("COMMIT")
        if app_id != APPLICATION_ID:
            # Tables only: sqlite_master also lists indexes, views and triggers.
            tables = int(
                conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[
                    0
                ]
            )
            raise CorruptLogError(
                f"{self.path!r} is not a wakuwaku log: it is a SQLite database of another "
                f"application (application_id={app_id}, {tables} "
                f"table{'s' * (tables != 1)}); use another file for the log"
            )
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise CorruptLogError(
                f"{self.path!r} has wakuwaku log schema version {version}; this wakuwaku "
                f"reads version {SCHEMA_VERSION}"
            )
        conn.execute("PRAGMA journal_mode=WAL")

    @staticmethod
    def _identity(conn: sqlite3.Connection) -> tuple[int, int]:
        app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
        objects = int(conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0])
        return app_id, objects

    # -- topic ids (worker thread) ----------------------------------------

    def topic(self, db: sqlite3.Connection, topic: str) -> tuple[int, int]:
        """``(id, partitions)`` of ``topic``, cached: a topic never changes
        once created, and one deleted by another process is found by
        :meth:`check_alive` (an empty read) or by a write's own check.

        :raises UnknownTopicError: when there is no such topic.
        """
        found = self._topics.get(topic)
        if found is None:
            row = db.execute(
                "SELECT id, partitions FROM wk_topics WHERE name = ?", (topic,)
            ).fetchone()
            if row is None:
                raise UnknownTopicError(topic)
            found = self._topics[topic] = (int(row[0]), int(row[1]))
        return found

    def partition(self, db: sqlite3.Connection, topic: str, partition: int) -> int:
        """The id of ``topic``, once ``partition`` is checked to be one of its partitions."""
        topic_id, partitions = self.topic(db, topic)
        check_partition(topic, partition, partitions)
        return topic_id

    def evict(self, topic: str) -> None:
        """Forget ``topic``'s cached id, so the next :meth:`topic` looks it up."""
        self._topics.pop(topic, None)

    @staticmethod
    def check_alive(db: sqlite3.Connection, topic_id: int) -> None:
        """Raise :class:`TopicGone` when the topic of a cached id was deleted
        since it was cached (by another process: a deletion here evicts it).

        Asked when a read finds nothing or a topic shows no partitions: a
        consumer whose topic another process deleted read empty pages
        forever, idle in silence, instead of :class:`~wakuwaku.UnknownTopicError`.
        """
        row = db.execute(
            "SELECT 1 FROM wk_topics WHERE id = ? AND name NOT LIKE char(0) || '%'", (topic_id,)
        ).fetchone()
        if row is None:
            raise TopicGone(topic_id)


@functools.cache
def schema_statements() -> tuple[str, ...]:
    """The statements of ``sqlite_schema.sql``, one string each, comments left out."""
    script = resources.files(__package__).joinpath("sqlite_schema.sql").read_text("utf-8")
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        if not buffer and (not line.strip() or line.lstrip().startswith("--")):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    return tuple(statements)
