"""The inbox contract on PostgreSQL, plus what only the PostgreSQL backend has.

Every test uses its own tables (a unique suffix) in the shared ``test``
database and drops them afterwards.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from tests.conftest import POSTGRES_DSN
from wakuwaku import ConfigError
from wakuwaku.inbox import Claim, InboxKey
from wakuwaku.testing import FakeClock

from .contract import GROUP, MAX_ATTEMPTS, Boom, Harness, InboxContract, effects_sql_counter

psycopg = pytest.importorskip("psycopg")
from wakuwaku.inbox.postgres import PostgresInbox  # noqa: E402

pytestmark = pytest.mark.postgres


class PostgresHarness(Harness):
    """The inbox tables and an effects table, uniquely named, in database ``test``."""

    inbox: PostgresInbox

    def __init__(self, conn: Any, suffix: str) -> None:
        self.conn = conn
        self.clock = FakeClock()
        self.fx = f"wk_fx_{suffix}"
        self.inbox = PostgresInbox(
            POSTGRES_DSN,
            GROUP,
            max_attempts=MAX_ATTEMPTS,
            table=f"wk_inbox_{suffix}",
            clock=self.clock,
        )
        self.effect = effects_sql_counter().format(fx=self.fx, p="%s")

    async def setup(self) -> None:
        await self.inbox.ensure_schema()
        await self.conn.execute(
            f"CREATE TABLE {self.fx} (message_key text PRIMARY KEY, n integer NOT NULL)"
        )

    async def drop(self) -> None:
        await self.conn.execute(
            f"DROP TABLE IF EXISTS {self.fx}, {self.inbox.table}, {self.inbox.dead_table}"
        )

    async def apply_on(self, conn: Any, keys: Sequence[str | InboxKey], fail: bool) -> Claim:
        async with conn.transaction():
            claim = await self.inbox.claim(conn, keys)
            for key in claim.new:
                await conn.execute(self.effect, (key,))
            if fail:
                raise Boom("handler failed after its effects")
        return claim

    async def apply(self, keys: Sequence[str | InboxKey], *, fail: bool = False) -> Claim:
        return await self.apply_on(self.conn, keys, fail)

    async def applied(self, key: str) -> int:
        cur = await self.conn.execute(f"SELECT n FROM {self.fx} WHERE message_key = %s", (key,))
        row = await cur.fetchone()
        return 0 if row is None else int(row[0])

    async def apply_concurrently(self, key_sets: Sequence[Sequence[str]]) -> list[Claim]:
        conns = [
            await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True) for _ in key_sets
        ]
        try:
            return list(
                await asyncio.gather(
                    *(
                        self.apply_on(c, keys, False)
                        for c, keys in zip(conns, key_sets, strict=True)
                    )
                )
            )
        finally:
            for c in conns:
                await c.close()


@pytest.fixture
async def pg_harness() -> AsyncIterator[PostgresHarness]:
    conn = await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True)
    harness = PostgresHarness(conn, uuid.uuid4().hex[:12])
    try:
        await harness.setup()
        yield harness
    finally:
        await harness.drop()
        await conn.close()


class TestPostgresInbox(InboxContract):
    @pytest.fixture
    async def harness(self, pg_harness: PostgresHarness) -> Harness:
        return pg_harness


async def test_primary_key_is_exactly_group_and_message_key(
    pg_harness: PostgresHarness,
) -> None:
    """The unique index is on (consumer_group, message_key), both NOT NULL (seed 004)."""
    for table in (pg_harness.inbox.table, pg_harness.inbox.dead_table):
        cur = await pg_harness.conn.execute(
            """
            SELECT i.indisprimary, a.attname, a.attnotnull
            FROM pg_index AS i
            JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
            JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
            WHERE i.indrelid = %s::regclass AND i.indisunique
            ORDER BY i.indexrelid, k.ord
            """,
            (table,),
        )
        rows = await cur.fetchall()
        assert rows == [(True, "consumer_group", True), (True, "message_key", True)]


async def _wait_until_blocked(conn: Any, pid: int) -> None:
    """Wait (on a condition, not a duration) until backend ``pid`` waits for a lock."""
    async with asyncio.timeout(10.0):
        while True:
            cur = await conn.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            row = await cur.fetchone()
            if row is not None and row[0] == "Lock":
                return
            await asyncio.sleep(0.005)


@pytest.mark.parametrize("first_commits", [True, False])
async def test_parallel_transactions_claim_each_key_once(
    pg_harness: PostgresHarness, first_commits: bool
) -> None:
    """Two connections claim the same keys at once; the second waits for the first.

    After the first commits, every key is a duplicate for the second; after it
    rolls back, every key is new for the second. Either way each key is
    applied exactly once.
    """
    keys = [f"par/0/{i}" for i in range(20)]
    first = await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True)
    second = await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True)
    try:
        async with first.transaction():
            claim1 = await pg_harness.inbox.claim(first, keys)
            assert claim1.new == keys
            for key in claim1.new:
                await first.execute(pg_harness.effect, (key,))
            contender = asyncio.create_task(
                pg_harness.apply_on(second, list(reversed(keys)), False)
            )
            await _wait_until_blocked(pg_harness.conn, second.info.backend_pid)
            assert not contender.done()
            if not first_commits:
                raise psycopg.Rollback()
        claim2 = await contender
    finally:
        await first.close()
        await second.close()
    if first_commits:
        assert claim2.new == [] and sorted(claim2.duplicate) == sorted(keys)
    else:
        assert sorted(claim2.new) == sorted(keys) and claim2.duplicate == []
    counts = [await pg_harness.applied(k) for k in keys]
    assert counts == [1] * len(keys)


async def test_claim_outside_a_transaction_is_refused(pg_harness: PostgresHarness) -> None:
    conn = await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True)
    try:
        with pytest.raises(ConfigError, match="transaction"):
            await pg_harness.inbox.claim(conn, ["t/0/1"])
        await conn.set_autocommit(False)
        # Not autocommit: the claim opens the transaction the caller commits or not.
        assert (await pg_harness.inbox.claim(conn, ["t/0/1"])).new == ["t/0/1"]
        await conn.rollback()
        assert await pg_harness.inbox.claimed(["t/0/1"]) == set()
    finally:
        await conn.close()


async def test_claim_in_an_aborted_transaction_raises(pg_harness: PostgresHarness) -> None:
    """An error inside the caller's transaction propagates; nothing reads it as a claim."""
    conn = await psycopg.AsyncConnection.connect(POSTGRES_DSN, autocommit=True)
    try:
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            async with conn.transaction():
                with pytest.raises(psycopg.errors.DivisionByZero):
                    await conn.execute("SELECT 1 / 0")
                await pg_harness.inbox.claim(conn, ["t/0/1"])
    finally:
        await conn.close()
    assert await pg_harness.inbox.claimed(["t/0/1"]) == set()


async def test_pool_like_source_is_used(pg_harness: PostgresHarness) -> None:
    """Anything with psycopg_pool's ``connection()`` context manager works as the source."""
    from contextlib import asynccontextmanager

    lent: list[int] = []

    class OnePool:
        @asynccontextmanager
        async def connection(self) -> AsyncIterator[Any]:
            async with await psycopg.AsyncConnection.connect(POSTGRES_DSN) as conn:
                lent.append(1)
                yield conn

    inbox = PostgresInbox(OnePool(), GROUP, table=pg_harness.inbox.table, max_attempts=MAX_ATTEMPTS)
    await pg_harness.apply(["pool/0/1"])
    assert await inbox.claimed(["pool/0/1"]) == {"pool/0/1"}
    assert (await inbox.record_failure("pool/0/2", "x")).attempts == 1
    assert (await inbox.stats()).failing == 1
    assert len(lent) == 3
