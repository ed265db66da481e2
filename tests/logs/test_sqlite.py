"""The log contract on :class:`wakuwaku.logs.sqlite.SQLiteLog`, and what only SQLite has."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from wakuwaku import (
    ConfigError,
    CorruptLogError,
    LogError,
    LogUnavailableError,
    UnknownTopicError,
    open_log,
)
from wakuwaku.logs import BatchWrite, Log, TopicInfo
from wakuwaku.logs.sqlite import APPLICATION_ID, SCHEMA_VERSION, SQLiteLog

from .contract import LogContract


class TestSQLiteLog(LogContract):
    multiprocess = True

    @pytest.fixture
    async def log(self, tmp_path: Path) -> AsyncIterator[Log]:
        log = SQLiteLog(tmp_path / "log.db")
        yield log
        await log.close()


HEADERS = {"wk-v": b"1", "wk-type": b"t", "wk-key": b"k", "wk-alg": b"plain"}


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[SQLiteLog]:
    log = SQLiteLog(tmp_path / "log.db")
    yield log
    await log.close()


async def test_random_bytes_file_is_a_corrupt_log(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    garbage = random.Random(0).randbytes(16_384)
    path.write_bytes(garbage)
    log = SQLiteLog(path)
    with pytest.raises(CorruptLogError, match=re.escape(str(path))):
        await log.list_topics()
    await log.close()
    assert path.read_bytes() == garbage


async def test_foreign_sqlite_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO users VALUES (1, 'ann')")
        db.commit()
    before = path.read_bytes()
    log = SQLiteLog(path)
    with pytest.raises(CorruptLogError, match="not a wakuwaku log") as caught:
        await log.create_topic("orders", 1)
    assert str(path) in str(caught.value)
    await log.close()
    assert path.read_bytes() == before  # not even switched to WAL
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT name FROM users").fetchall() == [("ann",)]


async def test_a_foreign_database_counts_its_tables_not_its_indexes(tmp_path: Path) -> None:
    # Indexes are not tables: 1 table and 2 indexes were reported as "3 tables".
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, mail TEXT)")
        db.execute("CREATE INDEX users_name ON users (name)")
        db.execute("CREATE INDEX users_mail ON users (mail)")
        db.commit()
    log = SQLiteLog(path)
    with pytest.raises(CorruptLogError, match=r"application_id=0, 1 table\)") as caught:
        await log.list_topics()
    assert "3 table" not in str(caught.value)
    await log.close()
    index_only = tmp_path / "index_only.db"  # nothing but an object: still not empty
    with closing(sqlite3.connect(index_only)) as db:
        db.execute("CREATE VIEW v AS SELECT 1")
        db.commit()
    async with SQLiteLog(index_only) as other:
        with pytest.raises(CorruptLogError, match=r"0 tables"):
            await other.list_topics()


async def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SQLiteLog(path) as log:
        await log.create_topic("orders", 1)
    with closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    log = SQLiteLog(path)
    with pytest.raises(CorruptLogError, match="schema version 2"):
        await log.list_topics()
    await log.close()


async def test_file_is_created_in_a_fresh_directory_with_wal(tmp_path: Path) -> None:
    path = tmp_path / "new" / "nested" / "log.db"
    async with SQLiteLog(path) as log:
        assert log.url == f"sqlite:///{path}"
        await log.create_topic("orders", 2)
    assert path.is_file()
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


async def test_an_empty_file_becomes_a_log(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    async with SQLiteLog(path) as log:
        await log.create_topic("orders", 1)
        assert await log.list_topics() == [TopicInfo("orders", 1)]


async def test_everything_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SQLiteLog(path) as log:
        await log.create_topic("orders", 2)
        await log.append("orders", 1, [(HEADERS, b"kept")])
        await log.commit("g", "orders", 1, 1)
        lease = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
    async with SQLiteLog(path) as log:
        assert await log.list_topics() == [TopicInfo("orders", 2)]
        (record,) = await log.read("orders", 1, 0)
        assert (record.headers, record.body) == (HEADERS, b"kept")
        assert await log.committed("g", "orders", 1) == 1
        assert await log.acquire_partition("g", "orders", 0, "b", ttl=60.0) is None
        again = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        assert again is not None and lease is not None
        assert again.generation == lease.generation


async def test_two_instances_on_one_file_share_everything(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SQLiteLog(path) as one, SQLiteLog(path) as two:
        await one.create_topic("orders", 1)
        assert await two.describe_topic("orders") == TopicInfo("orders", 1)
        reader = asyncio.create_task(two.read("orders", 0, 0, wait=30.0))
        await asyncio.sleep(0.1)
        assert not reader.done()
        assert await one.append("orders", 0, [(HEADERS, b"a")]) == [0]
        assert [r.body for r in await asyncio.wait_for(reader, 10.0)] == [b"a"]
        assert await two.append("orders", 0, [(HEADERS, b"b")]) == [1]
        assert await one.append("orders", 0, [(HEADERS, b"c")]) == [2]
        assert [r.body for r in await one.read("orders", 0, 0)] == [b"a", b"b", b"c"]
        assert [r.body for r in await two.read("orders", 0, 2)] == [b"c"]
        lease = await one.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        assert lease is not None
        assert await two.acquire_partition("g", "orders", 0, "b", ttl=60.0) is None
        await two.commit("g", "orders", 0, 3, fence=lease)
        assert await one.committed("g", "orders", 0) == 3


@contextlib.asynccontextmanager
async def _write_locked(path: Path) -> AsyncIterator[sqlite3.Connection]:
    """A log file with topic ``orders`` (1 partition) whose write lock another
    connection holds until it rolls back (the connection yielded)."""
    async with SQLiteLog(path) as log:
        await log.create_topic("orders", 1)
    with closing(sqlite3.connect(path, isolation_level=None)) as blocker:
        blocker.execute("BEGIN IMMEDIATE")
        yield blocker


async def test_a_write_lock_held_too_long_is_log_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with _write_locked(path) as blocker, SQLiteLog(path, busy_timeout=0.05) as log:
        with pytest.raises(LogUnavailableError, match="locked"):
            await log.append("orders", 0, [(HEADERS, b"x")])
        # Reads go on while another connection writes (WAL).
        assert await log.read("orders", 0, 0) == []
        blocker.execute("ROLLBACK")
        assert await log.append("orders", 0, [(HEADERS, b"x")]) == [0]


async def test_an_append_its_caller_stopped_waiting_for_is_stored_once_when_sent_again(
    tmp_path: Path,
) -> None:
    # The worker thread commits an append whose caller timed out; its token
    # was remembered on the caller's side only, so the same append sent
    # again was stored a second time.
    path = tmp_path / "log.db"
    async with _write_locked(path) as blocker, SQLiteLog(path) as log:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):  # the write waits for the lock
                await log.append("orders", 0, [(HEADERS, b"x")], token="t1")
        blocker.execute("ROLLBACK")
        assert await log.append("orders", 0, [(HEADERS, b"x")], token="t1") == [0]
        assert await log.end_offsets("orders") == {0: 1}
        with pytest.raises(ConfigError, match="records"):
            await log.append("orders", 0, [(HEADERS, b"x")] * 2, token="t1")
        assert await log.end_offsets("orders") == {0: 1}


async def test_close_is_idempotent_and_final(log: SQLiteLog) -> None:
    await log.create_topic("orders", 1)
    await log.close()
    await log.close()
    with pytest.raises(LogError, match="closed"):
        await log.list_topics()
    with pytest.raises(LogError, match="closed"):
        await log.read("orders", 0, 0)


async def test_close_without_use_opens_nothing(tmp_path: Path) -> None:
    path = tmp_path / "never.db"
    await SQLiteLog(path).close()
    assert not path.exists()


async def test_records_with_equal_headers_share_one_dict_within_a_read(log: SQLiteLog) -> None:
    await log.create_topic("orders", 1)
    other = {**HEADERS, "wk-key": b"k2"}
    await log.append("orders", 0, [(HEADERS, b"1"), (other, b"2"), (dict(HEADERS), b"3")])
    first, second, third = await log.read("orders", 0, 0)
    assert first.headers is third.headers
    assert first.headers == HEADERS and second.headers == other
    assert second.headers is not first.headers


async def test_headers_with_a_source_are_not_shared_and_the_rest_still_are(
    log: SQLiteLog,
) -> None:
    """Retry records (``wk-src``) are never equal, so they are not kept for
    sharing; a record after one is decoded before it is looked up, and still
    shares the dict of equal headers read before."""
    await log.create_topic("orders", 1)
    work = {**HEADERS, "wk-src": b'["t",0,[1],["t/0/1"]]'}
    await log.append(
        "orders",
        0,
        [(HEADERS, b"1"), (work, b"2"), (HEADERS, b"3"), (work, b"4"), (work, b"5")],
    )
    plain, first, again, second, third = await log.read("orders", 0, 0)
    assert again.headers is plain.headers and plain.headers == HEADERS
    assert first.headers == second.headers == third.headers == work
    assert first.headers is not second.headers and second.headers is not third.headers


async def test_bytes_like_values_are_stored_as_bytes(log: SQLiteLog) -> None:
    await log.create_topic("orders", 1)
    headers: dict[str, object] = {"a": bytearray(b"x"), "b": memoryview(b"y")}
    await log.append("orders", 0, [(headers, bytearray(b"body"))])  # type: ignore[list-item]
    (record,) = await log.read("orders", 0, 0)
    assert record.headers == {"a": b"x", "b": b"y"}
    assert type(record.headers["a"]) is bytes and type(record.body) is bytes


@pytest.mark.parametrize("count", [1, 2, 63, 64, 65, 127, 128, 129, 300])
async def test_appends_of_any_size_get_dense_offsets_and_read_back_as_written(
    log: SQLiteLog, count: int
) -> None:
    """Rows go in by INSERT statements of up to 64 rows (powers of two for
    the rest), blobs bound as bytearrays: every size around those steps
    keeps offsets dense and reads back exactly, as ``bytes``."""
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"first")])
    records = [({**HEADERS, "n": str(n).encode()}, b"body %d" % n) for n in range(count)]
    assert await log.append("orders", 0, records) == list(range(1, count + 1))
    assert await log.store(BatchWrite("g", [("orders", 0, records)])) == [
        list(range(count + 1, 2 * count + 1))
    ]
    read = (await log.read("orders", 0, 1, 1000))[:count]
    assert [(r.offset, r.headers, r.body) for r in read] == [
        (n + 1, headers, body) for n, (headers, body) in enumerate(records)
    ]
    assert all(type(r.body) is bytes for r in read)
    assert all(type(v) is bytes for r in read for v in r.headers.values())
    assert await log.end_offsets("orders") == {0: 2 * count + 1}


async def test_bytes_subclasses_and_other_mappings_are_still_accepted(log: SQLiteLog) -> None:
    """Only the exact dict-of-bytes case skips the per-header check; what
    the check allowed before (a body of a bytes subclass, any Mapping of
    bytes-like values) is still stored."""

    class Raw(bytes):
        pass

    await log.create_topic("orders", 1)
    headers: Any = MappingProxyType({"a": bytearray(b"x"), "b": b"y"})
    await log.append("orders", 0, [(headers, Raw(b"body"))])
    (record,) = await log.read("orders", 0, 0)
    assert record.headers == {"a": b"x", "b": b"y"} and record.body == b"body"


async def test_reads_after_retention_do_not_serve_deleted_records(log: SQLiteLog) -> None:
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"%d" % i) for i in range(10)])
    assert [r.offset for r in await log.read("orders", 0, 0, max_records=2)] == [0, 1]
    await log.commit("g", "orders", 0, 6)
    assert await log.apply_retention("orders") == 6
    assert [r.offset for r in await log.read("orders", 0, 2, max_records=2)] == [6, 7]


async def test_automatic_retention_after_commits(tmp_path: Path) -> None:
    async with SQLiteLog(tmp_path / "log.db", retention=True) as log:
        await log.create_topic("orders", 2)
        await log.append("orders", 0, [(HEADERS, b"x")] * 10)
        await log.commit("g", "orders", 0, 4)
        assert await log.start_offsets("orders") == {0: 4, 1: 0}
        assert [r.offset for r in await log.read("orders", 0, 0, max_records=1)] == [4]


async def test_without_retention_commits_delete_nothing(log: SQLiteLog) -> None:
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"x")] * 10)
    await log.commit("g", "orders", 0, 4)
    assert await log.start_offsets("orders") == {0: 0}


async def test_group_offsets_lists_every_group(log: SQLiteLog) -> None:
    await log.create_topic("orders", 2)
    await log.create_topic("other", 1)
    await log.commit("b", "orders", 1, 7)
    await log.commit("a", "orders", 0, 3)
    await log.commit("a", "other", 0, 9)
    assert await log.group_offsets("orders") == {"a": {0: 3}, "b": {1: 7}}
    with pytest.raises(UnknownTopicError):
        await log.group_offsets("missing")


async def test_many_pages_read_in_order_through_read_ahead(log: SQLiteLog) -> None:
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"%d" % i) for i in range(6000)])
    bodies: list[bytes] = []
    offset = 0
    while page := await log.read("orders", 0, offset, max_records=7):
        bodies.extend(r.body for r in page)
        offset = page[-1].offset + 1
    assert bodies == [b"%d" % i for i in range(6000)]
    # Going back re-reads what is there.
    assert [r.offset for r in await log.read("orders", 0, 3, max_records=2)] == [3, 4]


async def test_a_page_the_read_ahead_only_begins_is_completed_from_the_file(
    log: SQLiteLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"%d" % i) for i in range(6000)])
    fetched: list[tuple[int, int]] = []
    real = log._read

    def spy(topic: str, partition: int, offset: int, max_records: int, ahead: bool) -> Any:
        fetched.append((offset, max_records))
        return real(topic, partition, offset, max_records, ahead)

    monkeypatch.setattr(log, "_read", spy)
    first = await log.read("orders", 0, 0, max_records=2000)  # 2 500 fetched, 500 kept
    second = await log.read("orders", 0, 2000, max_records=2000)
    assert [r.body for r in first + second] == [b"%d" % i for i in range(4000)]
    # The second page starts with the 500 kept records; only the rest is read.
    assert fetched == [(0, 2000), (2500, 1500)]
    third = await log.read("orders", 0, 4000, max_records=2000)
    assert [r.offset for r in third] == list(range(4000, 6000))


async def test_a_read_that_skips_records_reads_no_records_ahead(
    log: SQLiteLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retry round reads its keys' pending records here and there: records
    # read ahead of such a read were decoded and dropped.
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"%d" % i) for i in range(6000)])
    returned: list[int] = []
    real = log._read

    def spy(topic: str, partition: int, offset: int, max_records: int, ahead: bool) -> Any:
        found, kept = real(topic, partition, offset, max_records, ahead)
        returned.append(len(found) + len(kept))
        return found, kept

    monkeypatch.setattr(log, "_read", spy)
    assert [r.offset for r in await log.read("orders", 0, 10, max_records=2)] == [10, 11]
    assert returned == [2500]  # a partition's first read reads ahead
    for start in (3000, 4000, 3500):  # forward and back, never where the last read ended
        page = await log.read("orders", 0, start, max_records=3)
        assert [r.offset for r in page] == [start, start + 1, start + 2]
    assert returned == [2500, 3, 3, 3]
    # Reading on from there reads ahead again, and is served from what it kept.
    for start in (3503, 3506):
        page = await log.read("orders", 0, start, max_records=3)
        assert [r.offset for r in page] == [start, start + 1, start + 2]
    assert returned == [2500, 3, 3, 3, 6000 - 3503]  # all that follows, to the end


@pytest.mark.parametrize(
    ("url", "path"),
    [("sqlite:///relative/log.db", "relative/log.db"), ("sqlite:////abs/log.db", "/abs/log.db")],
)
async def test_open_log_builds_sqlite_logs(url: str, path: str) -> None:
    log = open_log(url)
    assert isinstance(log, SQLiteLog)
    assert (log.path, log.url) == (path, url)
    await log.close()


@pytest.mark.parametrize(
    ("url", "fsync", "busy_timeout"),
    [
        ("sqlite:///log.db?fsync=0", False, 30.0),
        ("sqlite:///log.db?fsync=true", True, 30.0),
        ("sqlite:///log.db?busy_timeout=2.5&fsync=off", False, 2.5),
    ],
)
async def test_url_options_of_the_sqlite_log(url: str, fsync: bool, busy_timeout: float) -> None:
    log = open_log(url)
    assert isinstance(log, SQLiteLog)
    assert (log.path, log.fsync, log.busy_timeout) == ("log.db", fsync, busy_timeout)
    # Another process opening log.url gets the same options.
    again = open_log(log.url)
    assert isinstance(again, SQLiteLog)
    assert (again.path, again.fsync, again.busy_timeout) == ("log.db", fsync, busy_timeout)
    await log.close()
    await again.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "sqlite:///log.db?fsycn=0",
            "unknown option 'fsycn' for sqlite:// (it takes: fsync, busy_timeout)",
        ),
        ("sqlite:///log.db?fsync=maybe", "fsync must be 1/0"),
        ("sqlite:///log.db?busy_timeout=-1", "busy_timeout must be seconds >= 0"),
        ("sqlite:///log.db?fsync=0&fsync=1", "option 'fsync' is given twice"),
        ("sqlite:///log.db?fsync", "options must be name=value"),
        ("sqlite:////tmp/log.db#x", "fragment"),
        ("memory://?x=1", "unknown option 'x' for memory:// (it takes: none)"),
    ],
)
def test_bad_url_options_are_refused_by_name(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        open_log(url)


@pytest.mark.parametrize("path", ["", ":memory:"])
def test_a_file_path_is_required(path: str) -> None:
    with pytest.raises(ConfigError, match="file path"):
        SQLiteLog(path)


def test_a_negative_busy_timeout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="busy_timeout"):
        SQLiteLog(tmp_path / "x.db", busy_timeout=-1.0)


async def test_bad_lease_arguments_are_refused(log: SQLiteLog) -> None:
    with pytest.raises(ConfigError):
        await log.acquire_partition("g", "orders", 0, "", ttl=1.0)
    with pytest.raises(ConfigError):
        await log.acquire_partition("g", "orders", 0, "a", ttl=0.0)


async def test_a_wakuwaku_file_missing_its_tables_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with SQLiteLog(path) as log:
        await log.create_topic("orders", 1)
    with closing(sqlite3.connect(path)) as db:
        db.execute("DROP TABLE wk_records")
    async with SQLiteLog(path) as log:
        with pytest.raises(CorruptLogError, match="no such table"):
            await log.read("orders", 0, 0)
