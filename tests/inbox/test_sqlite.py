"""The inbox contract on SQLite, plus what only the SQLite backend has."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import pytest

from wakuwaku import ConfigError
from wakuwaku.inbox import Claim, InboxKey, SQLiteInbox
from wakuwaku.testing import FakeClock

from .contract import GROUP, MAX_ATTEMPTS, Boom, Harness, InboxContract, effects_sql_counter

EFFECT = effects_sql_counter().format(fx="fx", p="?")


class SQLiteHarness(Harness):
    """The projection database is one SQLite file holding the effects and the inbox."""

    inbox: SQLiteInbox

    def __init__(self, path: Path, inbox_cls: type[SQLiteInbox] = SQLiteInbox) -> None:
        self.path = path
        self.clock = FakeClock()
        self.inbox = inbox_cls(path, GROUP, max_attempts=MAX_ATTEMPTS, clock=self.clock)
        with closing(self.connect()) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS fx (message_key TEXT PRIMARY KEY, n INTEGER NOT NULL)"
            )

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30.0, isolation_level=None)

    def apply_sync(
        self,
        keys: Sequence[str | InboxKey],
        fail: bool = False,
        barrier: threading.Barrier | None = None,
    ) -> Claim:
        conn = self.connect()
        try:
            if barrier is not None:
                barrier.wait()
            conn.execute("BEGIN IMMEDIATE")
            try:
                claim = self.inbox.claim(conn, keys)
                for key in claim.new:
                    conn.execute(EFFECT, (key,))
                if fail:
                    raise Boom("handler failed after its effects")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return claim
        finally:
            conn.close()

    async def apply(self, keys: Sequence[str | InboxKey], *, fail: bool = False) -> Claim:
        return self.apply_sync(keys, fail)

    async def applied(self, key: str) -> int:
        with closing(self.connect()) as conn:
            row = conn.execute("SELECT n FROM fx WHERE message_key = ?", (key,)).fetchone()
        return 0 if row is None else int(row[0])

    async def apply_concurrently(self, key_sets: Sequence[Sequence[str]]) -> list[Claim]:
        barrier = threading.Barrier(len(key_sets))
        return list(
            await asyncio.gather(
                *(asyncio.to_thread(self.apply_sync, keys, False, barrier) for keys in key_sets)
            )
        )


async def make_harness(path: Path, inbox_cls: type[SQLiteInbox] = SQLiteInbox) -> SQLiteHarness:
    harness = SQLiteHarness(path, inbox_cls)
    await harness.inbox.ensure_schema()
    return harness


class TestSQLiteInbox(InboxContract):
    @pytest.fixture
    async def harness(self, tmp_path: Path) -> Harness:
        return await make_harness(tmp_path / "projection.db")


def test_primary_key_is_exactly_group_and_message_key(tmp_path: Path) -> None:
    """The unique index is on (consumer_group, message_key), both NOT NULL (seed 004)."""
    inbox = SQLiteInbox(tmp_path / "p.db", GROUP)
    asyncio.run(inbox.ensure_schema())
    conn = sqlite3.connect(tmp_path / "p.db")
    for table in (inbox.table, inbox.dead_table):
        info = conn.execute(f"PRAGMA table_info({table})").fetchall()
        key_columns = sorted((row[5], row[1], row[3]) for row in info if row[5] > 0)
        assert key_columns == [(1, "consumer_group", 1), (2, "message_key", 1)]
        unique = [row for row in conn.execute(f"PRAGMA index_list({table})") if row[2]]
        assert len(unique) == 1, "exactly one unique index: the primary key"
    conn.close()


def test_claim_outside_a_transaction_is_refused(tmp_path: Path) -> None:
    inbox = SQLiteInbox(tmp_path / "p.db", GROUP)
    asyncio.run(inbox.ensure_schema())
    conn = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    with pytest.raises(ConfigError, match="transaction"):
        inbox.claim(conn, ["t/0/1"])
    conn.execute("BEGIN")
    assert inbox.claim(conn, ["t/0/1"]).new == ["t/0/1"]
    conn.execute("ROLLBACK")
    # Python's default mode: the INSERT opens the transaction the caller commits.
    legacy = sqlite3.connect(tmp_path / "p.db")
    assert inbox.claim(legacy, ["t/0/1"]).new == ["t/0/1"]
    assert legacy.in_transaction
    legacy.rollback()
    assert asyncio.run(inbox.claimed(["t/0/1"])) == set()
    conn.close()
    legacy.close()


def test_connection_factory_and_bad_names(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    inbox = SQLiteInbox(lambda: sqlite3.connect(path), GROUP, table="my_inbox")
    asyncio.run(inbox.ensure_schema())
    conn = sqlite3.connect(path)
    assert inbox.claim(conn, ["k"]).new == ["k"]
    conn.commit()
    assert asyncio.run(inbox.claimed(["k", "j"])) == {"k"}
    assert asyncio.run(inbox.record_failure("j", "x")).attempts == 1
    for bad in ("", "wk inbox", "x;drop", "a.b", "1abc"):
        with pytest.raises(ConfigError):
            SQLiteInbox(path, GROUP, table=bad)
    with pytest.raises(ConfigError):
        SQLiteInbox(path, "")
    with pytest.raises(ConfigError):
        SQLiteInbox(path, GROUP, max_attempts=0)
    conn.close()


def test_claim_statement_errors_propagate(tmp_path: Path) -> None:
    """A failing claim statement raises; it is never read as new or as duplicate."""
    inbox = SQLiteInbox(tmp_path / "p.db", GROUP)  # no ensure_schema: no table
    conn = sqlite3.connect(tmp_path / "p.db")
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        inbox.claim(conn, ["t/0/1"])
    conn.close()


def test_groups_are_independent(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    billing = SQLiteInbox(path, "billing")
    mailer = SQLiteInbox(path, "mailer")
    asyncio.run(billing.ensure_schema())
    conn = sqlite3.connect(path)
    assert billing.claim(conn, ["t/0/1"]).new == ["t/0/1"]
    assert mailer.claim(conn, ["t/0/1"]).new == ["t/0/1"]
    assert billing.claim(conn, ["t/0/1"]).duplicate == ["t/0/1"]
    conn.commit()
    conn.close()
