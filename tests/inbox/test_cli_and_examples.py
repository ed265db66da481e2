"""``wakuwaku inbox stats|dead``, the examples, and the docs snippets that come from them."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import POSTGRES_DSN
from wakuwaku.cli import ExitCode, main
from wakuwaku.inbox import InboxKey, SQLiteInbox

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "inbox"
DOC = ROOT / "docs" / "inbox.md"


def _populate_sqlite(path: Path) -> None:
    inbox = SQLiteInbox(path, "billing", max_attempts=2)
    asyncio.run(inbox.ensure_schema())
    conn = sqlite3.connect(path)
    inbox.claim(conn, [InboxKey.for_message("charges", 0, 1), "charges/0/2"])
    conn.commit()
    conn.close()
    asyncio.run(inbox.record_failure("charges/0/3", "flaky"))
    poison = InboxKey.for_message("charges", 1, 7)
    asyncio.run(inbox.record_failure(poison, "bad amount"))
    asyncio.run(inbox.record_failure(poison, "bad amount at https://secret@db.local/x\x1b[2J"))


def test_stats_and_dead_on_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "projection.db"
    _populate_sqlite(path)
    assert main(["inbox", "stats", "--db", str(path), "--group", "billing"]) == ExitCode.OK
    assert capsys.readouterr().out.split() == ["claims", "2", "failing", "1", "dead", "1"]
    assert main(["inbox", "dead", "--db", f"sqlite:///{path}", "-g", "billing"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert out.startswith("charges/1/7\tattempts=2\tdead_at=")
    assert "source=charges/1@7" in out
    assert "secret" not in out and "\x1b" not in out and "error=bad amount at <url>" in out
    # A group without any row printed zeros (or "no dead letters").
    for command in ("stats", "dead"):
        assert main(["inbox", command, "--db", str(path), "-g", "other"]) == ExitCode.FAILURE
        out, err = capsys.readouterr()
        assert out == ""
        assert (
            "group 'other' has no claims, failures or dead letters in 'wk_inbox'; "
            "groups with rows: 'billing'"
        ) in err


def test_inbox_dead_of_a_group_with_rows_but_no_dead_letters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "projection.db"
    inbox = SQLiteInbox(path, "quiet")
    asyncio.run(inbox.ensure_schema())
    asyncio.run(inbox.record_failure("k", "flaky"))
    assert main(["inbox", "dead", "--db", str(path), "-g", "quiet"]) == ExitCode.OK
    assert "no dead letters for group 'quiet'" in capsys.readouterr().out


@pytest.mark.parametrize("db", ["redis://127.0.0.1", "nats://x", "sqlite://x.db"])
def test_a_db_url_that_is_no_inbox_database_is_explained(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "no SQLite database at 'redis:/127.0.0.1'", the URL mangled.
    assert main(["inbox", "stats", "--db", db, "-g", "g"]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "redis:/127" not in err and f"--db {db!r}" in err


@pytest.mark.parametrize("args", [[], ["a", "b", "c"]])
def test_standalone_postgres_example_without_a_dsn_prints_its_usage(args: list[str]) -> None:
    # It died with a TypeError traceback.
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "standalone_postgres.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("usage: python ") and "POSTGRES_DSN [SUFFIX]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_never_creates_a_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.db"
    assert main(["inbox", "stats", "--db", str(missing), "-g", "g"]) == ExitCode.ERROR
    assert "no SQLite database" in capsys.readouterr().err
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    assert main(["inbox", "dead", "--db", str(empty), "-g", "g"]) == ExitCode.ERROR
    assert "no inbox table 'wk_inbox'" in capsys.readouterr().err
    assert main(["inbox", "stats", "--db", str(empty), "-g", "g", "--table", "x y"]) == 3
    assert main(["inbox", "stats", "--db", str(empty)]) == ExitCode.USAGE


@pytest.mark.postgres
def test_stats_and_dead_on_postgres(capsys: pytest.CaptureFixture[str]) -> None:
    psycopg: Any = pytest.importorskip("psycopg")
    from wakuwaku.inbox.postgres import PostgresInbox

    table = f"wk_cli_{uuid.uuid4().hex[:12]}"
    inbox = PostgresInbox(POSTGRES_DSN, "billing", table=table, max_attempts=1)

    async def populate() -> None:
        await inbox.ensure_schema()
        async with await psycopg.AsyncConnection.connect(POSTGRES_DSN) as conn:
            await inbox.claim(conn, ["charges/0/1"])
        await inbox.record_failure("charges/0/9", ValueError("no such account"))

    try:
        asyncio.run(populate())
        args = ["--db", POSTGRES_DSN, "--group", "billing", "--table", table]
        assert main(["inbox", "stats", *args]) == ExitCode.OK
        assert capsys.readouterr().out.split() == ["claims", "1", "failing", "0", "dead", "1"]
        assert main(["inbox", "dead", *args]) == ExitCode.OK
        assert "charges/0/9\tattempts=1" in capsys.readouterr().out
        assert main(["inbox", "stats", *args[:4], "--table", "wk_nope"]) == ExitCode.ERROR
        err = capsys.readouterr().err
        assert "no inbox table 'wk_nope'" in err and "postgresql://" not in err
    finally:
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_dead")


def test_standalone_sqlite_example(tmp_path: Path) -> None:
    database = tmp_path / "balances.db"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "standalone_sqlite.py"), str(database)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines.count("skipped duplicate payments/0/0") == 1
    assert sum(line.startswith("skipped duplicate") for line in lines) == 3
    assert "failed payments/1/1: attempt 3, dead-lettered=True" in lines
    assert lines[-3:] == ["balance alice = 750", "balance bob = 420", "claims=4 failing=0 dead=1"]
    conn = sqlite3.connect(database)
    assert conn.execute("SELECT sum(cents) FROM balance").fetchone() == (1170,)
    conn.close()


@pytest.mark.postgres
def test_standalone_postgres_example() -> None:
    psycopg: Any = pytest.importorskip("psycopg")
    suffix = f"_ex_{uuid.uuid4().hex[:12]}"
    try:
        proc = subprocess.run(
            [sys.executable, str(EXAMPLES / "standalone_postgres.py"), POSTGRES_DSN, suffix],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert proc.stdout.splitlines() == [
            "applied payments/0/0",
            "applied payments/0/1",
            "skipped duplicate payments/0/0",
            "balance alice = 500",
            "balance bob = 300",
        ]
    finally:
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            conn.execute(
                f"DROP TABLE IF EXISTS balance{suffix}, wk_inbox{suffix}, wk_inbox{suffix}_dead"
            )
