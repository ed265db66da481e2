"""The PostgreSQL inbox: claims in the caller's psycopg 3 transaction (design §9).

Needs the ``postgres`` extra (``pip install 'wakuwaku[postgres]'``)::

    inbox = PostgresInbox("postgresql://app@db/billing", group="billing")
    await inbox.ensure_schema()

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            claim = await inbox.claim(conn, keys)
            for key in claim.new:
                await conn.execute("UPDATE totals SET amount = amount + %s", (amount,))

Everything other than :meth:`PostgresInbox.claim` (lookups, the failure
path, housekeeping) runs on the inbox's own connections: a new connection
per call when the inbox was given a DSN, or one borrowed from a pool (any
object with psycopg_pool's ``connection()`` async context manager, which
commits on a clean exit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

try:
    import psycopg
    from psycopg import pq
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "wakuwaku.inbox.postgres needs psycopg 3: pip install 'wakuwaku[postgres]'"
    ) from exc

from .._clock import SYSTEM_CLOCK, Clock
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

_CLAIM_CHUNK = 1000  # keys per statement (they travel as four arrays)
_LOOKUP_CHUNK = 5000
_SCHEMA_LOCK = "wakuwaku.inbox.schema"

AsyncConn = psycopg.AsyncConnection[Any]


class ConnectionPool(Protocol):
    """What the inbox needs of a pool: psycopg_pool's ``AsyncConnectionPool`` fits."""

    def connection(self) -> AbstractAsyncContextManager[AsyncConn]:
        """Lend a connection; commit on a clean exit, roll back on an exception."""
        ...


class PostgresInbox(Inbox):
    """An inbox whose tables live in a PostgreSQL database.

    :param database: a ``postgresql://`` DSN (a new connection per call of the
        inbox's own methods) or a pool (see :class:`ConnectionPool`).
    :param group: the consumer group; first half of every key.
    :param max_attempts: failures allowed before a message is dead-lettered.
    :param table: the claims table (in the connection's ``search_path``); the
        dead-letter table is ``<table>_dead``.
    :param clock: where ``claimed_at``/``failed_at`` come from (seconds).
    :param error_limit: the longest stored error text, in characters.
    :raises ConfigError: as :class:`~wakuwaku.inbox.Inbox`.
    """

    def __init__(
        self,
        database: str | ConnectionPool,
        group: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        table: str = DEFAULT_TABLE,
        clock: Clock = SYSTEM_CLOCK,
        error_limit: int = DEFAULT_ERROR_LIMIT,
    ) -> None:
        super().__init__(
            group, max_attempts=max_attempts, table=table, clock=clock, error_limit=error_limit
        )
        self.database = database
        # The package's own .sql file with checked identifiers pasted in.
        self._q = load_queries("postgres.sql", self.table, self.dead_table)

    # -- the claim: on the caller's connection, in the caller's transaction -----------

    async def claim(self, conn: AsyncConn, keys: Sequence[str | InboxKey]) -> Claim:
        """Claim ``keys`` inside the caller's transaction on ``conn``.

        One ``INSERT ... ON CONFLICT (consumer_group, message_key) DO UPDATE
        ... WHERE status = 'failing' RETURNING message_key`` per chunk of 1000
        keys, in sorted key order (two claimers of overlapping keys lock them
        in the same order, so they cannot deadlock each other): a key is new
        exactly when the statement returns it. A concurrent transaction that
        claimed the same key makes this statement wait for its outcome: after
        its commit the key is a duplicate, after its rollback it is new here.
        No unique violation is ever caught and read as "already done"
        (seed 004); any error propagates and the caller's transaction should
        roll back.

        :param conn: the caller's connection: inside ``conn.transaction()``,
            or not in autocommit mode (then this statement opens the
            transaction the caller commits).
        :param keys: message keys (from :class:`InboxKey` or
            :func:`wakuwaku.message_id`); repeated keys are new at most once.
        :raises ConfigError: when ``conn`` is in autocommit mode outside a
            transaction (the claim would commit on its own), or a key is empty.
        :raises psycopg.Error: whatever the server says (a serialization
            failure under REPEATABLE READ, a lost connection...).
        """
        order, distinct = normalize_keys(keys)
        if not distinct:
            return Claim([], [])
        status = conn.info.transaction_status
        if conn.autocommit and status == pq.TransactionStatus.IDLE:
            raise ConfigError(
                "PostgresInbox.claim needs the caller's transaction: conn is in autocommit "
                "mode outside a transaction; use `async with conn.transaction():`"
            )
        now = self.clock.now()
        returned: set[str] = set()
        async with conn.cursor() as cur:
            for part in chunks(distinct, _CLAIM_CHUNK):
                await cur.execute(
                    self._q["claim"],
                    {
                        "grp": self.group,
                        "now": now,
                        "keys": [k.message_key for k in part],
                        "topics": [k.topic for k in part],
                        "parts": [k.partition for k in part],
                        "offs": [k.offset for k in part],
                    },
                )
                returned.update(row[0] for row in await cur.fetchall())
        return split_claim(order, returned)

    # -- the inbox's own connections ---------------------------------------------------

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[AsyncConn]:
        """A connection whose work is committed on a clean exit, rolled back otherwise."""
        if isinstance(self.database, str):
            async with await psycopg.AsyncConnection.connect(self.database) as conn:
                yield conn
        else:
            async with self.database.connection() as conn:
                yield conn

    async def ensure_schema(self) -> None:
        """Create the claims and dead-letter tables and their index; idempotent.

        Concurrent callers are serialized by a transaction-level advisory lock.

        :raises psycopg.Error: whatever the server says (no permission...).
        """
        async with self._connect() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_SCHEMA_LOCK,))
            for statement in self._q["schema"].split(";"):
                if statement.strip():
                    await conn.execute(statement)

    async def claimed(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` have a committed claim (see :meth:`Inbox.claimed`).

        :raises ConfigError: for an empty or non-string key.
        :raises psycopg.Error: whatever the server says (no table: run
            :meth:`ensure_schema`).
        """
        wanted = plain_keys(keys)
        if not wanted:
            return set()
        found: set[str] = set()
        async with self._connect() as conn, conn.cursor() as cur:
            for part in chunks(wanted, _LOOKUP_CHUNK):
                await cur.execute(self._q["claimed"], {"grp": self.group, "keys": list(part)})
                found.update(row[0] for row in await cur.fetchall())
        return found

    async def entries(self, keys: Sequence[str]) -> dict[str, InboxEntry]:
        """The rows of ``keys``, by key (see :meth:`Inbox.entries`).

        :raises ConfigError: for an empty or non-string key.
        :raises psycopg.Error: whatever the server says.
        """
        wanted = plain_keys(keys)
        if not wanted:
            return {}
        found: dict[str, InboxEntry] = {}
        async with self._connect() as conn, conn.cursor() as cur:
            for part in chunks(wanted, _LOOKUP_CHUNK):
                # Dead rows first, so a later claim or failure of the key wins.
                for name in ("dead_entries", "entries"):
                    await cur.execute(self._q[name], {"grp": self.group, "keys": list(part)})
                    for row in await cur.fetchall():
                        found[row[0]] = _entry(row)
        return found

    async def record_failure(
        self, key: str | InboxKey, error: BaseException | str | bytes
    ) -> FailureOutcome:
        """Record a failed attempt of ``key`` (see :meth:`Inbox.record_failure`).

        Runs in its own transaction on the inbox's own connection, never in
        the claim's (which has rolled back, and an aborted PostgreSQL
        transaction accepts no statement).

        :raises ConfigError: for an empty key.
        :raises psycopg.Error: whatever the server says; then nothing was
            recorded.
        """
        ikey = key if isinstance(key, InboxKey) else InboxKey(key)
        params: dict[str, Any] = {
            "grp": self.group,
            "key": ikey.message_key,
            "now": self.clock.now(),
            "error": self._failure_text(error),
            "topic": ikey.topic,
            "partition": ikey.partition,
            "offset": ikey.offset,
        }
        async with self._connect() as conn, conn.transaction(), conn.cursor() as cur:
            await cur.execute(self._q["fail"], params)
            row = await cur.fetchone()
            if row is None:
                # The row is 'done': a committed claim applied the key already.
                await cur.execute(self._q["attempts"], params)
                done = await cur.fetchone()
                attempts = int(done[0]) if done is not None else 0
                return FailureOutcome(ikey.message_key, attempts, False, already_claimed=True)
            attempts = int(row[0])
            if attempts < self.max_attempts:
                return FailureOutcome(ikey.message_key, attempts, False)
            await cur.execute(self._q["bury"], params)
            await cur.execute(self._q["unfail"], params)
            return FailureOutcome(ikey.message_key, attempts, True)

    async def purge(self, older_than: float, committed: Mapping[tuple[str, int], int]) -> int:
        """Delete old applied claims that cannot be delivered again (see :meth:`Inbox.purge`).

        :raises ConfigError: when ``older_than`` is negative.
        :raises psycopg.Error: whatever the server says.
        """
        cutoff = self._cutoff(older_than)
        async with self._connect() as conn, conn.transaction(), conn.cursor() as cur:
            await cur.execute(self._q["purge_unsourced"], {"grp": self.group, "cutoff": cutoff})
            deleted = max(cur.rowcount, 0)
            for (topic, partition), offset in sorted(committed.items()):
                await cur.execute(
                    self._q["purge_partition"],
                    {
                        "grp": self.group,
                        "cutoff": cutoff,
                        "topic": topic,
                        "partition": partition,
                        "offset": offset,
                    },
                )
                deleted += max(cur.rowcount, 0)
        return deleted

    async def stats(self) -> InboxStats:
        """Counts of the group's claims, failing keys and dead letters.

        :raises psycopg.Error: whatever the server says (no table...).
        """
        async with self._connect() as conn, conn.cursor() as cur:
            await cur.execute(self._q["stats"], {"grp": self.group})
            row = await cur.fetchone()
        assert row is not None  # an aggregate query always returns its row
        return InboxStats(int(row[0]), int(row[1]), int(row[2]))

    async def groups(self) -> list[str]:
        """Every group with a row in the tables, sorted.

        :raises psycopg.Error: whatever the server says (no table...).
        """
        async with self._connect() as conn, conn.cursor() as cur:
            await cur.execute(self._q["groups"])
            return [str(row[0]) for row in await cur.fetchall()]

    async def dead(self, limit: int = 100) -> list[DeadMessage]:
        """The group's dead letters, most recent first, at most ``limit``.

        :raises psycopg.Error: whatever the server says (no table...).
        """
        async with self._connect() as conn, conn.cursor() as cur:
            await cur.execute(self._q["dead"], {"grp": self.group, "limit": limit})
            rows = await cur.fetchall()
        return [DeadMessage(*row) for row in rows]


def _entry(row: Sequence[Any]) -> InboxEntry:
    return InboxEntry(
        row[0], EntryStatus(row[1]), int(row[2]), row[3], row[4], row[5], row[6], row[7], row[8]
    )
