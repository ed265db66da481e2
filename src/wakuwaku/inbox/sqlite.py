"""The SQLite inbox: claims in the caller's ``sqlite3`` transaction (design §9).

The claims table must live in the same database file as the handler's
effects, so that one transaction holds both::

    inbox = SQLiteInbox("projection.db", group="billing")
    await inbox.ensure_schema()

    conn = sqlite3.connect("projection.db", isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    claim = inbox.claim(conn, [InboxKey.for_message(topic, partition, offset)])
    for key in claim.new:
        conn.execute("UPDATE totals SET amount = amount + ?", (amount,))
    conn.execute("COMMIT")

Everything other than :meth:`SQLiteInbox.claim` (lookups, the failure path,
housekeeping) opens its own short-lived connection in a worker thread, so the
async methods never block the event loop. Using WAL journal mode on the file
lets those reads run beside a writer.

``INSERT ... RETURNING`` needs SQLite 3.35 or later (Python's bundled
library is checked when an inbox is built).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from .._clock import BLOCKING_CALLS, SYSTEM_CLOCK, Clock
from .._errors import ConfigError
from ._base import (
    DEFAULT_ERROR_LIMIT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_TABLE,
    Claim,
    DeadMessage,
    EntryStatus,
    FailureOutcome,
    Inbox,
    InboxEntry,
    InboxKey,
    InboxStats,
    chunks,
    load_queries,
    normalize_keys,
    plain_keys,
    split_claim,
)

T = TypeVar("T")

MIN_SQLITE = (3, 35, 0)
"""The first SQLite release with ``RETURNING``."""

_CLAIM_CHUNK = 500  # 6 parameters a row: 3 000 per statement, far below SQLite's 32 766
_LOOKUP_CHUNK = 900  # keys per IN (...) list

ConnectionFactory = Callable[[], sqlite3.Connection]
"""Returns a new connection to the inbox's database each call; the inbox closes it."""


class SQLiteInbox(Inbox):
    """An inbox whose tables live in a SQLite database file.

    :param database: the database file (the same file as the handler's
        effects), or a function returning a *new* ``sqlite3.Connection`` to it
        on each call (the inbox closes it after use).
    :param group: the consumer group; first half of every key.
    :param max_attempts: failures allowed before a message is dead-lettered.
    :param table: the claims table; the dead-letter table is ``<table>_dead``.
    :param clock: where ``claimed_at``/``failed_at`` come from (seconds).
    :param error_limit: the longest stored error text, in characters.
    :param busy_timeout: how long the inbox's own connections wait for a
        lock held by another writer (seconds).
    :raises ConfigError: as :class:`~wakuwaku.inbox.Inbox`, and when this
        Python's SQLite is older than 3.35 (no ``RETURNING``).
    """

    def __init__(
        self,
        database: str | os.PathLike[str] | ConnectionFactory,
        group: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        table: str = DEFAULT_TABLE,
        clock: Clock = SYSTEM_CLOCK,
        error_limit: int = DEFAULT_ERROR_LIMIT,
        busy_timeout: float = 5.0,
    ) -> None:
        super().__init__(
            group, max_attempts=max_attempts, table=table, clock=clock, error_limit=error_limit
        )
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise ConfigError(
                f"the SQLite inbox needs SQLite >= 3.35 (INSERT ... RETURNING); this Python "
                f"has {sqlite3.sqlite_version}"
            )
        self.database = database
        self.busy_timeout = busy_timeout
        self._lookups = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="wakuwaku-inbox"
        )
        self._reader: sqlite3.Connection | None = None
        self._q = load_queries("sqlite.sql", self.table, self.dead_table)

    # -- the claim: on the caller's connection, in the caller's transaction -----------

    def claim(self, conn: sqlite3.Connection, keys: Sequence[str | InboxKey]) -> Claim:
        """Claim ``keys`` inside the caller's open transaction on ``conn``.

        One ``INSERT ... ON CONFLICT (consumer_group, message_key) DO UPDATE
        ... WHERE status = 'failing' RETURNING message_key`` per chunk of 500
        keys: a key is new exactly when the statement returns it (it was
        absent, or only failing); a key already claimed by a committed
        transaction is a duplicate. No integrity error is ever caught and read
        as "already done" (seed 004); any error propagates and the caller's
        transaction should roll back.

        Apply the effects of :attr:`Claim.new` only, on the same ``conn``,
        then commit: the claims commit or roll back with the effects.

        :param conn: the caller's connection, inside a transaction (or in
            Python's default mode, where this INSERT opens one).
        :param keys: message keys (from :class:`InboxKey` or
            :func:`wakuwaku.message_id`); repeated keys are new at most once.
        :raises ConfigError: when ``conn`` is in autocommit mode outside a
            transaction (the claim would commit on its own), or a key is empty.
        :raises sqlite3.Error: whatever SQLite raises (a lock timeout...).
        """
        order, distinct = normalize_keys(keys)
        if not distinct:
            return Claim([], [])
        if not _in_transaction(conn):
            raise ConfigError(
                "SQLiteInbox.claim needs the caller's transaction: conn is in autocommit "
                "mode outside a transaction; run BEGIN first"
            )
        now = self.clock.now()
        returned: set[str] = set()
        for part in chunks(distinct, _CLAIM_CHUNK):
            sql = self._q["claim"].replace(
                "{rows}", ", ".join(["(?, ?, ?, ?, ?, ?, 'done', 0)"] * len(part))
            )
            params: list[Any] = []
            for k in part:
                params += [self.group, k.message_key, now, k.topic, k.partition, k.offset]
            returned.update(row[0] for row in conn.execute(sql, params).fetchall())
        return split_claim(order, returned)

    # -- the inbox's own connections ---------------------------------------------------

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if callable(self.database):
            conn = self.database()
        else:
            conn = sqlite3.connect(self.database, timeout=self.busy_timeout, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A connection in a ``BEGIN IMMEDIATE`` transaction, committed on success."""
        with self._connect() as conn:
            began = not conn.in_transaction  # False only for a factory's PEP 249 mode
            if began:
                conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if began:
                    conn.execute("ROLLBACK")
                else:
                    conn.rollback()
                raise
            if began:
                conn.execute("COMMIT")
            else:
                conn.commit()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def ensure_schema(self) -> None:
        """Create the claims and dead-letter tables and their index; idempotent.

        :raises sqlite3.Error: when the database cannot be written.
        """
        await self._run(self._ensure_schema)

    def _ensure_schema(self) -> None:
        with self._write() as conn:
            for statement in self._q["schema"].split(";"):
                if statement.strip():
                    conn.execute(statement)

    async def claimed(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` have a committed claim (see :meth:`Inbox.claimed`).

        :raises ConfigError: for an empty or non-string key.
        :raises sqlite3.Error: whatever SQLite raises (no table: run
            :meth:`ensure_schema`).
        """
        wanted = plain_keys(keys)
        if not wanted:
            return set()
        loop = asyncio.get_running_loop()
        with BLOCKING_CALLS.track():
            return await loop.run_in_executor(self._lookups, self._claimed, wanted)

    def _claimed(self, keys: list[str]) -> set[str]:
        if callable(self.database):
            with self._connect() as conn:
                return self._lookup(conn, keys)
        # The consumer looks up every batch: keep one reader connection (on the
        # lookup thread) instead of opening the file each time.
        if self._reader is None:
            self._reader = sqlite3.connect(
                self.database, timeout=self.busy_timeout, isolation_level=None
            )
        return self._lookup(self._reader, keys)

    def _lookup(self, conn: sqlite3.Connection, keys: list[str]) -> set[str]:
        found: set[str] = set()
        for part in chunks(keys, _LOOKUP_CHUNK):
            sql = self._q["claimed"].replace("{marks}", ", ".join("?" * len(part)))
            found.update(row[0] for row in conn.execute(sql, [self.group, *part]))
        return found

    async def entries(self, keys: Sequence[str]) -> dict[str, InboxEntry]:
        """The rows of ``keys``, by key (see :meth:`Inbox.entries`).

        :raises ConfigError: for an empty or non-string key.
        :raises sqlite3.Error: whatever SQLite raises.
        """
        wanted = plain_keys(keys)
        if not wanted:
            return {}
        return await self._run(self._entries, wanted)

    def _entries(self, keys: list[str]) -> dict[str, InboxEntry]:
        found: dict[str, InboxEntry] = {}
        with self._connect() as conn:
            for part in chunks(keys, _LOOKUP_CHUNK):
                marks = ", ".join("?" * len(part))
                # Dead rows first, so a later claim or failure of the key wins.
                for name in ("dead_entries", "entries"):
                    sql = self._q[name].replace("{marks}", marks)
                    for row in conn.execute(sql, [self.group, *part]):
                        found[row[0]] = _entry(row)
        return found

    async def record_failure(
        self, key: str | InboxKey, error: BaseException | str | bytes
    ) -> FailureOutcome:
        """Record a failed attempt of ``key`` (see :meth:`Inbox.record_failure`).

        Runs in its own ``BEGIN IMMEDIATE`` transaction on the inbox's own
        connection, never in the claim's (which has rolled back).

        :raises ConfigError: for an empty key.
        :raises sqlite3.Error: whatever SQLite raises (no table, a lock
            timeout...); then nothing was recorded.
        """
        ikey = key if isinstance(key, InboxKey) else InboxKey(key)
        text = self._failure_text(error)
        return await self._run(self._record_failure, ikey, text)

    def _record_failure(self, key: InboxKey, text: str) -> FailureOutcome:
        now = self.clock.now()
        params: dict[str, Any] = {
            "grp": self.group,
            "key": key.message_key,
            "now": now,
            "error": text,
            "topic": key.topic,
            "partition": key.partition,
            "offset": key.offset,
        }
        with self._write() as conn:
            row = conn.execute(self._q["fail"], params).fetchone()
            if row is None:
                # The row is 'done': a committed claim applied the key already.
                done = conn.execute(self._q["attempts"], params).fetchone()
                attempts = int(done[0]) if done is not None else 0
                return FailureOutcome(key.message_key, attempts, False, already_claimed=True)
            attempts = int(row[0])
            if attempts < self.max_attempts:
                return FailureOutcome(key.message_key, attempts, False)
            conn.execute(self._q["bury"], params)
            conn.execute(self._q["unfail"], params)
            return FailureOutcome(key.message_key, attempts, True)

    async def purge(self, older_than: float, committed: Mapping[tuple[str, int], int]) -> int:
        """Delete old applied claims that cannot be delivered again (see :meth:`Inbox.purge`).

        :raises ConfigError: when ``older_than`` is negative.
        :raises sqlite3.Error: whatever SQLite raises.
        """
        cutoff = self._cutoff(older_than)
        return await self._run(self._purge, cutoff, dict(committed))

    def _purge(self, cutoff: float, committed: dict[tuple[str, int], int]) -> int:
        with self._write() as conn:
            deleted = conn.execute(self._q["purge_unsourced"], (self.group, cutoff)).rowcount
            for (topic, partition), offset in sorted(committed.items()):
                deleted += conn.execute(
                    self._q["purge_partition"],
                    (self.group, cutoff, topic, partition, offset),
                ).rowcount
        return deleted

    async def stats(self) -> InboxStats:
        """Counts of the group's claims, failing keys and dead letters.

        :raises sqlite3.Error: whatever SQLite raises (no table...).
        """
        return await self._run(self._stats)

    def _stats(self) -> InboxStats:
        with self._connect() as conn:
            claims, failing, dead = conn.execute(self._q["stats"], {"grp": self.group}).fetchone()
        return InboxStats(int(claims), int(failing), int(dead))

    async def dead(self, limit: int = 100) -> list[DeadMessage]:
        """The group's dead letters, most recent first, at most ``limit``.

        :raises sqlite3.Error: whatever SQLite raises (no table...).
        """
        return await self._run(self._dead, limit)

    def _dead(self, limit: int) -> list[DeadMessage]:
        with self._connect() as conn:
            rows = conn.execute(self._q["dead"], (self.group, limit)).fetchall()
        return [DeadMessage(*row) for row in rows]

    async def groups(self) -> list[str]:
        """Every group with a row in the tables, sorted.

        :raises sqlite3.Error: whatever SQLite raises (no table...).
        """
        return await self._run(self._groups)

    def _groups(self) -> list[str]:
        with self._connect() as conn:
            return [str(row[0]) for row in conn.execute(self._q["groups"]).fetchall()]


def _in_transaction(conn: sqlite3.Connection) -> bool:
    """Whether a write on ``conn`` now belongs to a transaction the caller commits."""
    if conn.in_transaction:
        return True
    autocommit = getattr(conn, "autocommit", None)  # Python 3.12+
    if autocommit is True:
        return False
    if autocommit is False:
        return True
    # Legacy mode: an INSERT opens a transaction unless isolation_level is None.
    return conn.isolation_level is not None


def _entry(row: Sequence[Any]) -> InboxEntry:
    return InboxEntry(
        row[0], EntryStatus(row[1]), int(row[2]), row[3], row[4], row[5], row[6], row[7], row[8]
    )
