"""The log contract suite, written once and run against every adapter.

Subclass :class:`LogContract` in ``tests/logs/test_<adapter>.py`` and give it
a ``log`` fixture that yields a fresh, empty log (and closes it). Set
``multiprocess = True`` when other processes can open the same log through
``log.url`` (SQLite; Redis and NATS later), which runs the concurrent
appenders test.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import time
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wakuwaku import (
    ConfigError,
    FencedError,
    PartitionCountMismatch,
    Record,
    UnknownPartitionError,
    UnknownTopicError,
    open_log,
    partition_for,
)
from wakuwaku.logs import BatchWrite, Lease, Log, TopicInfo

HEADERS = {"wk-v": b"1", "wk-type": b"t.created", "wk-key": b"k1", "wk-alg": b"plain"}

header_names = st.text(min_size=1, max_size=20)
header_maps = st.dictionaries(header_names, st.binary(max_size=64), max_size=8)


def rec(body: bytes = b"{}", **headers: bytes) -> tuple[dict[str, bytes], bytes]:
    return ({**HEADERS, **headers}, body)


async def read_all(log: Log, topic: str, partition: int) -> list[Record]:
    out: list[Record] = []
    offset = 0
    while page := await log.read(topic, partition, offset, 200):
        out.extend(page)
        offset = page[-1].offset + 1
    return out


async def read_from(
    log: Log, topic: str, partition: int, offset: int, max_records: int = 500
) -> list[Record]:
    """Records from ``offset`` on, up to ``max_records``, read page after page.

    ``Log.read`` answers *up to* ``max_records``: a log may answer fewer
    before the end (NATS does when a delivery was lost on the way), so a
    test that wants a known number of records reads until it has them or a
    read comes back empty. A read that answers more than asked is kept
    whole, for the assertion to see.
    """
    out: list[Record] = []
    while len(out) < max_records:
        page = await log.read(topic, partition, offset, max_records - len(out))
        if not page:
            break
        out.extend(page)
        offset = page[-1].offset + 1
    return out


class LogContract:
    """What every :class:`~wakuwaku.logs.Log` adapter must do (``logs/_base.py``)."""

    multiprocess: ClassVar[bool] = False
    #: NATS completes an append sent again with its token record by record
    #: (its server drops the duplicate ids): a token reused for more records
    #: stores the new ones instead of refusing (docs/logs.md, "Appends sent again").
    refuses_token_reuse: ClassVar[bool] = True
    nul_in_header_names: ClassVar[bool] = True
    """False for a log whose header names are C strings (Kafka through
    librdkafka): it refuses a header name holding NUL with ConfigError
    (test_kafka.py tests that), and the round-trip property leaves them out."""
    chosen_partitions: ClassVar[bool] = True
    """False where a coordinator, not the member, decides which partitions a
    member gets (Kafka's group assignor): asking for one does not take it."""
    lease_expiry: ClassVar[bool] = True
    """False for a log whose ownership is not a lease of ours (Kafka: the
    consumer group's coordinator assigns partitions and moves them when a
    member leaves or its session times out, at least 6 s, the broker's
    ``group.min.session.timeout.ms``), so no lease lapses after a ttl; the
    takeover with a higher generation is tested through release instead."""
    commits_past_the_end: ClassVar[bool] = True
    """False for a log that stores offsets of stored records only (Iggy: the
    server refuses an offset past a partition's last record, and stores "the
    last record consumed", so 0 reads back as None): the tests append records
    up to the offsets they commit (:meth:`room`)."""
    exact_retention: ClassVar[bool] = True
    """False for a log whose records go by the server's own retention only
    (Iggy deletes whole segments by a topic's expiry or size, never below an
    offset): ``apply_retention`` deletes nothing, which the tests check."""

    async def room(self, log: Log, topic: str, partition: int, upto: int) -> None:
        """Append records until ``topic``/``partition`` ends at ``upto`` or later,
        where the log cannot store an offset past its records (commits_past_the_end)."""
        if self.commits_past_the_end:
            return
        end = (await log.end_offsets(topic))[partition]
        if end < upto:
            await log.append(topic, partition, [rec(b"room") for _ in range(upto - end)])

    @pytest.fixture
    async def log(self) -> AsyncIterator[Log]:
        raise NotImplementedError("an adapter's test class provides the log fixture")
        yield  # pragma: no cover

    # -- topics -----------------------------------------------------------

    async def test_create_topic_is_idempotent(self, log: Log) -> None:
        assert await log.create_topic("orders", 3) == TopicInfo("orders", 3)
        assert await log.create_topic("orders", 3) == TopicInfo("orders", 3)
        assert await log.list_topics() == [TopicInfo("orders", 3)]

    async def test_an_engine_topic_of_any_name_is_created_with_derived_from(self, log: Log) -> None:
        """design §6: a retry topic's name can be configured; the engine says what
        the topic is by ``derived_from``, and it is a topic like any other."""
        await log.create_topic("orders", 2)
        info = await log.create_topic("orders-retry", 2, derived_from="orders")
        assert info == TopicInfo("orders-retry", 2)
        assert await log.append("orders-retry", 1, [({"wk-group": b"g"}, b"x")]) == [0]
        with pytest.raises(PartitionCountMismatch):
            await log.create_topic("orders-retry", 3, derived_from="orders")

    async def test_partition_count_mismatch_names_both_counts(self, log: Log) -> None:
        await log.create_topic("orders", 3)
        with pytest.raises(PartitionCountMismatch) as caught:
            await log.create_topic("orders", 5)
        assert (caught.value.topic, caught.value.existing, caught.value.requested) == (
            "orders",
            3,
            5,
        )
        assert "3" in str(caught.value) and "5" in str(caught.value)
        assert await log.describe_topic("orders") == TopicInfo("orders", 3)

    async def test_describe_and_list_sorted_by_name(self, log: Log) -> None:
        for name, count in (("zeta", 1), ("alpha", 4), ("mid.dle-name_2", 2)):
            await log.create_topic(name, count)
        assert await log.describe_topic("alpha") == TopicInfo("alpha", 4)
        assert await log.list_topics() == [
            TopicInfo("alpha", 4),
            TopicInfo("mid.dle-name_2", 2),
            TopicInfo("zeta", 1),
        ]

    async def test_empty_log_lists_no_topic(self, log: Log) -> None:
        assert await log.list_topics() == []

    async def test_unknown_topic_is_refused_everywhere(self, log: Log) -> None:
        calls = [
            log.describe_topic("nope"),
            log.append("nope", 0, [rec()]),
            log.read("nope", 0, 0),
            log.end_offsets("nope"),
            log.start_offsets("nope"),
            log.commit("g", "nope", 0, 1),
        ]
        for call in calls:
            with pytest.raises(UnknownTopicError) as caught:
                await call
            assert caught.value.topic == "nope"
            assert "'nope'" in str(caught.value)

    @pytest.mark.parametrize("partition", [-1, 2, 99])
    async def test_unknown_partition_is_refused(self, log: Log, partition: int) -> None:
        await log.create_topic("orders", 2)
        for call in (
            log.append("orders", partition, [rec()]),
            log.read("orders", partition, 0),
            log.commit("g", "orders", partition, 0),
        ):
            with pytest.raises(UnknownPartitionError) as caught:
                await call
            assert (caught.value.topic, caught.value.partition, caught.value.partitions) == (
                "orders",
                partition,
                2,
            )
        assert await log.end_offsets("orders") == {0: 0, 1: 0}

    @pytest.mark.parametrize("name", ["", "with space", "a/b", "tab\there", "nul\x00", "x" * 201])
    async def test_bad_topic_names_are_refused(self, log: Log, name: str) -> None:
        with pytest.raises(ConfigError, match="topic name"):
            await log.create_topic(name, 1)
        assert await log.list_topics() == []

    async def test_longest_allowed_topic_name(self, log: Log) -> None:
        name = "n" * 200
        await log.create_topic(name, 1)
        assert await log.describe_topic(name) == TopicInfo(name, 1)

    @pytest.mark.parametrize("count", [0, -1, 1.5, "3", None])
    async def test_bad_partition_counts_are_refused(self, log: Log, count: object) -> None:
        with pytest.raises(ConfigError, match="partition count"):
            await log.create_topic("orders", count)  # type: ignore[arg-type]
        assert await log.list_topics() == []

    # -- append and read --------------------------------------------------

    async def test_append_gives_dense_offsets_per_partition(self, log: Log) -> None:
        await log.create_topic("orders", 2)
        assert await log.append("orders", 0, [rec(b"a"), rec(b"b"), rec(b"c")]) == [0, 1, 2]
        assert await log.append("orders", 0, [rec(b"d"), rec(b"e")]) == [3, 4]
        assert await log.append("orders", 1, [rec(b"x")]) == [0]
        assert await log.append("orders", 0, []) == []
        assert await log.end_offsets("orders") == {0: 5, 1: 1}
        records = await read_all(log, "orders", 0)
        assert [(r.offset, r.body) for r in records] == [
            (0, b"a"),
            (1, b"b"),
            (2, b"c"),
            (3, b"d"),
            (4, b"e"),
        ]

    async def test_an_append_sent_again_with_its_token_stores_each_record_once(
        self, log: Log
    ) -> None:
        """An append whose reply was lost is sent again with the same token (here
        the first reply was not lost, the portable form): nothing is stored twice,
        and the offsets returned are the first ones. Other tokens, or none, store."""
        await log.create_topic("orders", 2)
        await log.append("orders", 0, [rec(b"before")])
        records = [rec(b"a"), rec(b"b"), rec(b"c")]
        first = await log.append("orders", 0, records, token="append-1")
        assert await log.append("orders", 0, records, token="append-1") == first
        await log.append("orders", 0, records, token="append-2")
        await log.append("orders", 0, [rec(b"d")])
        assert [r.body for r in await read_all(log, "orders", 0)] == [
            b"before",
            *(b"a", b"b", b"c"),
            *(b"a", b"b", b"c"),
            b"d",
        ]
        assert await log.end_offsets("orders") == {0: 8, 1: 0}
        # A token names an append to one partition: the other partition stores.
        assert await log.append("orders", 1, records, token="append-1") == [0, 1, 2]
        # Under a fence too (the engine's retry and dead-letter writes).
        lease = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        assert lease is not None
        await log.create_topic("retry_orders", 1)
        once = await log.append("retry_orders", 0, records, fence=lease, token="fenced-1")
        again = await log.append("retry_orders", 0, records, fence=lease, token="fenced-1")
        assert again == once
        assert [r.body for r in await read_all(log, "retry_orders", 0)] == [b"a", b"b", b"c"]

    async def test_a_token_used_again_for_more_records_never_reports_one_not_stored(
        self, log: Log
    ) -> None:
        """Redis answered ``[0, 1, 2]`` for a token first used for two records,
        though the third was never stored: an offset for a record not there."""
        await log.create_topic("orders", 1)
        assert await log.append("orders", 0, [rec(b"a"), rec(b"b")], token="t-1") == [0, 1]
        three = [rec(b"a"), rec(b"b"), rec(b"c")]
        if self.refuses_token_reuse:
            with pytest.raises(ConfigError):
                await log.append("orders", 0, three, token="t-1")
            assert await log.end_offsets("orders") == {0: 2}
        else:
            offsets = await log.append("orders", 0, three, token="t-1")
            stored = {r.offset: r.body for r in await read_all(log, "orders", 0)}
            assert [stored[o] for o in offsets] == [b"a", b"b", b"c"]

    @pytest.mark.parametrize("token", ["", "a b", "x" * 65, "naïve", "a.b"])
    async def test_a_bad_append_token_is_refused_and_nothing_written(
        self, log: Log, token: str
    ) -> None:
        await log.create_topic("orders", 1)
        with pytest.raises(ConfigError):
            await log.append("orders", 0, [rec()], token=token)
        assert await log.end_offsets("orders") == {0: 0}

    async def test_a_header_name_utf8_cannot_encode_is_refused_and_nothing_written(
        self, log: Log
    ) -> None:
        """A lone surrogate in a name failed with a bare ``UnicodeEncodeError``
        on every log but the memory one (which stored it)."""
        await log.create_topic("orders", 1)
        bad = ({"wk-key": b"k", "caf\udce9": b"1"}, b"x")
        with pytest.raises(ConfigError, match="UTF-8") as caught:
            await log.append("orders", 0, [rec(), bad])
        assert "caf\\udce9" in str(caught.value)
        assert await log.end_offsets("orders") == {0: 0}
        # A name UTF-8 can encode round-trips.
        await log.append("orders", 0, [({"café-ü": b"1"}, b"x")])
        [stored] = await read_all(log, "orders", 0)
        assert stored.headers == {"café-ü": b"1"}

    async def test_read_from_an_offset_bounded_and_past_the_end(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        await log.append("orders", 0, [rec(str(i).encode()) for i in range(10)])
        page = await read_from(log, "orders", 0, 3, max_records=4)
        assert [(r.offset, r.body) for r in page] == [(3, b"3"), (4, b"4"), (5, b"5"), (6, b"6")]
        assert [r.offset for r in await read_from(log, "orders", 0, 7, max_records=100)] == [
            7,
            8,
            9,
        ]
        assert await log.read("orders", 0, 10) == []
        assert await log.read("orders", 0, 1_000) == []
        # Pages in a row follow each other without gaps or repeats.
        seen: list[int] = []
        offset = 0
        while page := await log.read("orders", 0, offset, max_records=3):
            seen.extend(r.offset for r in page)
            offset = page[-1].offset + 1
        assert seen == list(range(10))

    async def test_read_sees_appends_after_an_earlier_read(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        await log.append("orders", 0, [rec(b"%d" % i) for i in range(3)])
        assert len(await log.read("orders", 0, 0, max_records=1)) == 1
        await log.append("orders", 0, [rec(b"late")])
        page = await read_from(log, "orders", 0, 1, max_records=10)
        assert [r.body for r in page] == [b"1", b"2", b"late"]

    async def test_read_waits_for_a_record_that_arrives(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        reader = asyncio.create_task(log.read("orders", 0, 0, wait=30.0))
        await asyncio.sleep(0.1)
        assert not reader.done(), "read returned before anything was appended"
        await log.append("orders", 0, [rec(b"arrived")])
        page = await asyncio.wait_for(reader, 10.0)
        assert [(r.offset, r.body) for r in page] == [(0, b"arrived")]

    async def test_read_wait_times_out_empty(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        started = time.monotonic()
        assert await log.read("orders", 0, 0, wait=0.2) == []
        assert time.monotonic() - started >= 0.19

    async def test_read_without_wait_returns_at_once_when_empty(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        assert await asyncio.wait_for(log.read("orders", 0, 0), 5.0) == []

    async def test_records_carry_the_append_time(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        before = time.time()
        await log.append("orders", 0, [rec()])
        after = time.time()
        (record,) = await log.read("orders", 0, 0)
        assert before - 0.01 <= record.timestamp <= after + 0.01

    @pytest.mark.parametrize(
        ("args", "problem"),
        [
            ((0, 0, 0, 0.0), "max_records must be an int from 1 to 1000000, got 0"),
            ((0, 0, -1, 0.0), "max_records must be an int from 1 to 1000000, got -1"),
            ((0, 0, 1.5, 0.0), "max_records must be an int from 1 to 1000000, got 1.5"),
            ((0, 0, True, 0.0), "max_records must be an int from 1 to 1000000, got True"),
            ((0, 0, 2**63, 0.0), "max_records must be an int from 1 to 1000000, got 9223"),
            ((0, -1, 10, 0.0), "the offset must be an int in [0, 2**63), got -1"),
            ((0, 2**63, 10, 0.0), "the offset must be an int in [0, 2**63), got 9223"),
            ((0, "0", 10, 0.0), "the offset must be an int in [0, 2**63), got '0'"),
            ((0, 0, 10, -1.0), "wait must be a number of seconds from 0 to 86400, got -1.0"),
            ((0, 0, 10, float("nan")), "wait must be a number of seconds from 0 to 86400, got nan"),
            ((0, 0, 10, float("inf")), "wait must be a number of seconds from 0 to 86400, got inf"),
            ((0, 0, 10, 1e10), "wait must be a number of seconds from 0 to 86400, got 1"),
            ((0, 0, 10, "1"), "wait must be a number of seconds from 0 to 86400, got '1'"),
            (("0", 0, 10, 0.0), "the partition must be an int, got '0'"),
        ],
    )
    async def test_a_read_with_bad_arguments_is_refused_on_every_log(
        self, log: Log, args: tuple[object, object, object, object], problem: str
    ) -> None:
        """A read of 0 records raised IndexError on one log and returned
        nothing on others: every log refuses bad arguments the same way,
        before asking its store, naming the topic and what was wrong."""
        await log.create_topic("orders", 1)
        await log.append("orders", 0, [rec(b"kept")])
        partition, offset, max_records, wait = args
        with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
            await log.read("orders", partition, offset, max_records, wait)  # type: ignore[arg-type]
        assert "orders" in str(caught.value)
        assert [r.body for r in await log.read("orders", 0, 0, 1)] == [b"kept"]

    async def test_a_read_takes_integer_types_and_real_numbers_as_commit_does(
        self, log: Log
    ) -> None:
        """An offset numpy gave (which ``commit`` takes) reads as the int it is."""
        numpy = pytest.importorskip("numpy")
        await log.create_topic("orders", 1)
        await log.append("orders", 0, [rec(b"a"), rec(b"b")])
        page = await log.read("orders", 0, numpy.int64(1), numpy.int32(5), numpy.float32(0))
        assert [(r.offset, r.body) for r in page] == [(1, b"b")]

    async def test_a_read_past_the_end_that_waits_returns_nothing(self, log: Log) -> None:
        """Offsets >= the one asked for, also past the end with a wait (Kafka's
        reader was reset to the earliest offset and returned offsets 0-2)."""
        await log.create_topic("orders", 1)
        await log.append("orders", 0, [rec(b"%d" % i) for i in range(3)])
        assert await log.read("orders", 0, 5, 5, 0.5) == []
        assert await log.read("orders", 0, 10**6, 5, 0.2) == []
        page = await read_from(log, "orders", 0, 1, max_records=5)
        assert [r.offset for r in page] == [1, 2]

    @pytest.mark.parametrize("partition", ["0", True, 1.0])
    async def test_a_commit_to_a_partition_that_is_not_an_int_is_refused(
        self, log: Log, partition: object
    ) -> None:
        await log.create_topic("orders", 2)
        with pytest.raises(ConfigError, match="partition must be an int"):
            await log.commit("g", "orders", partition, 3)  # type: ignore[arg-type]

    async def test_the_largest_offset_sqlite_can_store_is_accepted(self, log: Log) -> None:
        if not self.commits_past_the_end:
            pytest.skip(f"{type(log).__name__} stores offsets of stored records only")
        await log.create_topic("orders", 1)
        await log.commit("g", "orders", 0, 2**63 - 1)
        assert await log.committed("g", "orders", 0) == 2**63 - 1

    @pytest.mark.parametrize(
        ("headers", "body"),
        [
            pytest.param(HEADERS, b"", id="empty-body"),
            pytest.param({}, b"no headers", id="no-headers"),
            pytest.param(
                {"wk-key": "東京/ß/🎉".encode(), "wk-props": '{"t":"é"}'.encode()},
                "本文 ✓".encode(),
                id="non-ascii",
            ),
            pytest.param(
                {"bin": b"\x00\xff\x00", "empty": b""}, bytes(range(256)) * 4, id="binary-with-nul"
            ),
            pytest.param(HEADERS, b"\x00" + b"x" * (1 << 20) + b"\xff", id="1MiB-body"),
        ],
    )
    async def test_headers_and_body_round_trip_byte_for_byte(
        self, log: Log, headers: dict[str, bytes], body: bytes
    ) -> None:
        await log.create_topic("orders", 1)
        await log.append("orders", 0, [rec(b"before"), (headers, body), rec(b"after")])
        records = await read_from(log, "orders", 0, 0)
        assert [r.body for r in records] == [b"before", body, b"after"]
        assert records[1].headers == headers
        assert all(type(v) is bytes for v in records[1].headers.values())
        assert type(records[1].body) is bytes

    # One log serves every example (topic creation is idempotent), and each
    # adapter's subclass runs the same test: both are intended.
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(batch=st.lists(st.tuples(header_maps, st.binary(max_size=300)), min_size=1, max_size=5))
    async def test_any_headers_and_bodies_round_trip(
        self, log: Log, batch: list[tuple[dict[str, bytes], bytes]]
    ) -> None:
        if not self.nul_in_header_names:
            batch = [({k: v for k, v in h.items() if "\x00" not in k}, b) for h, b in batch]
        await log.create_topic("prop", 1)  # idempotent: the log lives across examples
        offsets = await log.append("prop", 0, batch)
        records = await read_from(log, "prop", 0, offsets[0], max_records=len(batch))
        assert [r.offset for r in records] == offsets
        assert [(r.headers, r.body) for r in records] == batch

    # -- offsets ------------------------------------------------------------

    async def test_commit_and_committed_per_group(self, log: Log) -> None:
        await log.create_topic("orders", 2)
        assert await log.committed("g1", "orders", 0) is None
        await self.room(log, "orders", 0, 7)
        await self.room(log, "orders", 1, 1)
        await log.commit("g1", "orders", 0, 3)
        await log.commit("g2", "orders", 0, 7)
        await log.commit("g1", "orders", 1, 1)
        assert await log.committed("g1", "orders", 0) == 3
        assert await log.committed("g2", "orders", 0) == 7
        assert await log.committed("g1", "orders", 1) == 1
        assert await log.committed("g2", "orders", 1) is None
        await log.commit("g1", "orders", 0, 2)  # going back is allowed (a reset)
        assert await log.committed("g1", "orders", 0) == 2

    @pytest.mark.parametrize(
        ("group", "offset", "problem"),
        [
            ("g", -1, "offset"),
            ("g", 1.5, "offset"),
            ("g", True, "offset"),
            ("g", "3", "offset"),
            ("g", 2**63, "offset"),
            ("", 3, "group"),
            (None, 3, "group"),
        ],
    )
    async def test_bad_commits_are_refused_naming_what_is_wrong(
        self, log: Log, group: object, offset: object, problem: str
    ) -> None:
        await log.create_topic("orders", 1)
        with pytest.raises(ConfigError, match=f"orders/0: the {problem}|the {problem} must"):
            await log.commit(group, "orders", 0, offset)  # type: ignore[arg-type]
        assert await log.committed("g", "orders", 0) is None

    @pytest.mark.parametrize(
        ("headers", "body"),
        [
            ({"wk-v": "1"}, b"{}"),
            ({1: b"x"}, b"{}"),
            # One bad entry among good ones (the common case is checked as a whole).
            ({"wk-v": b"1", "wk-key": b"k", "wk-type": "t"}, b"{}"),
            ({"wk-v": b"1", "wk-key": b"k", 3: b"t"}, b"{}"),
            ({"a": None}, b"{}"),
            ({}, "text"),
            (["wk-v"], b"{}"),
        ],
    )
    async def test_records_that_are_not_str_to_bytes_are_refused_and_nothing_written(
        self, log: Log, headers: object, body: object
    ) -> None:
        await log.create_topic("orders", 1)
        good = rec()
        with pytest.raises(ConfigError, match="record"):
            await log.append("orders", 0, [good, (headers, body)])  # type: ignore[list-item]
        assert await log.read("orders", 0, 0) == []

    async def test_bytes_like_header_values_and_bodies_are_stored_as_plain_bytes(
        self, log: Log
    ) -> None:
        # A bytes subclass passed the check, then failed the encoding with a
        # TypeError: every bytes-like value is stored.
        class Tagged(bytes):
            pass

        class Name(str):
            pass

        await log.create_topic("orders", 1)
        headers: dict[str, bytes] = {
            **dict(rec()[0]),
            Name("x-tag"): Tagged(b"tagged"),
            "x-array": bytearray(b"array"),  # type: ignore[dict-item]
            "x-view": memoryview(b"view"),  # type: ignore[dict-item]
        }
        await log.append("orders", 0, [(headers, Tagged(b"{}"))])
        [record] = await log.read("orders", 0, 0)
        assert record.body == b"{}"
        assert record.headers["x-tag"] == b"tagged"
        assert record.headers["x-array"] == b"array"
        assert record.headers["x-view"] == b"view"

    async def test_start_and_end_offsets(self, log: Log) -> None:
        await log.create_topic("orders", 3)
        assert await log.start_offsets("orders") == {0: 0, 1: 0, 2: 0}
        assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0}
        await log.append("orders", 2, [rec(), rec()])
        assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 2}
        assert await log.start_offsets("orders") == {0: 0, 1: 0, 2: 0}

    # -- retention ------------------------------------------------------------

    async def test_retention_keeps_everything_without_commits(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        await log.append("orders", 0, [rec() for _ in range(5)])
        assert await log.apply_retention("orders") == 0
        assert await log.start_offsets("orders") == {0: 0}
        assert len(await read_all(log, "orders", 0)) == 5

    async def test_retention_deletes_below_the_slowest_group(self, log: Log) -> None:
        await log.create_topic("orders", 2)
        if not self.exact_retention:
            await log.append("orders", 0, [rec() for _ in range(10)])
            await log.commit("g", "orders", 0, 8)
            assert await log.apply_retention("orders") == 0
            assert await log.start_offsets("orders") == {0: 0, 1: 0}
            return
        await log.append("orders", 0, [rec(b"%d" % i) for i in range(10)])
        await log.append("orders", 1, [rec() for _ in range(4)])
        await log.commit("fast", "orders", 0, 8)
        await log.commit("slow", "orders", 0, 3)
        assert await log.apply_retention("orders") == 3
        assert await log.start_offsets("orders") == {0: 3, 1: 0}
        assert await log.end_offsets("orders") == {0: 10, 1: 4}
        page = await read_from(log, "orders", 0, 0, max_records=2)
        assert [(r.offset, r.body) for r in page[:2]] == [(3, b"3"), (4, b"4")]
        assert len(await read_all(log, "orders", 1)) == 4
        assert await log.apply_retention("orders") == 0
        # New records keep counting from the end, not from the start.
        assert await log.append("orders", 0, [rec()]) == [10]

    async def test_retention_never_passes_the_end(self, log: Log) -> None:
        if not self.exact_retention:
            pytest.skip(f"{type(log).__name__} deletes records by the server's retention only")
        await log.create_topic("orders", 1)
        await log.append("orders", 0, [rec() for _ in range(5)])
        await log.commit("g", "orders", 0, 100)
        assert await log.apply_retention("orders") == 5
        assert await log.start_offsets("orders") == {0: 5}
        assert await log.end_offsets("orders") == {0: 5}
        assert await log.read("orders", 0, 0) == []
        assert await log.append("orders", 0, [rec(b"next")]) == [5]
        assert [r.body for r in await log.read("orders", 0, 0)] == [b"next"]

    # -- leases (design §15) -------------------------------------------------

    async def test_lease_refuses_a_second_member_while_it_lives(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        first = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        assert first is not None
        assert (first.member, first.partition) == ("a", 0)
        assert first.expires_at > time.time() + 50
        assert await log.acquire_partition("g", "orders", 0, "b", ttl=60.0) is None
        renewed = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        assert renewed is not None and renewed.generation == first.generation
        # Another group is another owner domain.
        assert await log.acquire_partition("other", "orders", 0, "b", ttl=60.0) is not None

    async def test_lease_moves_after_expiry_with_a_higher_generation(self, log: Log) -> None:
        if not self.lease_expiry:
            pytest.skip(
                f"{type(log).__name__}: ownership does not lapse after a ttl (lease_expiry)"
            )
        await log.create_topic("orders", 1)
        old = await log.acquire_partition("g", "orders", 0, "a", ttl=0.05)
        assert old is not None
        new = None
        deadline = time.monotonic() + 10.0
        while new is None and time.monotonic() < deadline:
            new = await log.acquire_partition("g", "orders", 0, "b", ttl=60.0)
            if new is None:
                await asyncio.sleep(0.01)
        assert new is not None and new.member == "b"
        assert new.generation > old.generation
        # The old owner is fenced: it can neither store offsets nor take the lease back.
        with pytest.raises(FencedError) as caught:
            await log.commit("g", "orders", 0, 5, fence=old)
        assert (
            caught.value.group,
            caught.value.topic,
            caught.value.partition,
            caught.value.generation,
        ) == ("g", "orders", 0, old.generation)
        assert await log.committed("g", "orders", 0) is None
        assert await log.acquire_partition("g", "orders", 0, "a", ttl=60.0) is None
        await log.commit("g", "orders", 0, 5, fence=new)
        assert await log.committed("g", "orders", 0) == 5

    async def test_commit_under_a_lease_never_taken_is_fenced(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        with pytest.raises(FencedError):
            await log.commit("g", "orders", 0, 1, fence=Lease("g", "orders", 0, "a", 1, 0.0))
        assert await log.committed("g", "orders", 0) is None

    async def test_release_lets_another_member_in_at_once(self, log: Log) -> None:
        await log.create_topic("orders", 1)
        lease = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        assert lease is not None
        await log.release_partition(lease)
        taken = await log.acquire_partition("g", "orders", 0, "b", ttl=60.0)
        assert taken is not None and taken.generation > lease.generation
        with pytest.raises(FencedError):
            await log.commit("g", "orders", 0, 1, fence=lease)
        # Releasing a lease that was taken over does not free the new owner's.
        await log.release_partition(lease)
        assert await log.acquire_partition("g", "orders", 0, "c", ttl=60.0) is None

    async def test_partition_owners_show_current_leases_of_one_group(self, log: Log) -> None:
        await log.create_topic("orders", 3)
        owners = log.partition_owners
        assert await owners("g", "orders") == {}, "every adapter of this project shows owners"
        if not self.chosen_partitions:
            pytest.skip(f"{type(log).__name__}: the group assignor picks partitions")
        a = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        b = await log.acquire_partition("g", "orders", 2, "b", ttl=60.0)
        other = await log.acquire_partition("other", "orders", 1, "c", ttl=60.0)
        assert a is not None and b is not None and other is not None
        found = await owners("g", "orders")
        assert found is not None and sorted(found) == [0, 2]
        assert (found[0].member, found[0].generation) == ("a", a.generation)
        assert (found[2].member, found[2].generation) == ("b", b.generation)
        assert abs(found[0].expires_at - a.expires_at) < 1.0
        await log.release_partition(a)
        assert sorted(await owners("g", "orders") or {}) == [2]
        with pytest.raises(UnknownTopicError):
            await owners("g", "nope")

    async def test_group_offsets_list_what_each_owning_group_committed(self, log: Log) -> None:
        await log.create_topic("orders", 2)
        assert await log.append("orders", 0, [rec(b"a"), rec(b"b"), rec(b"c")]) == [0, 1, 2]
        found = await log.group_offsets("orders")
        if found is None:
            assert type(log).__name__ == "MemoryLog", "only the memory log cannot list them"
            return
        assert found == {}
        lease = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        assert lease is not None
        await log.commit("g", "orders", 0, 3, fence=lease)
        assert await log.group_offsets("orders") == {"g": {0: 3}}
        with pytest.raises(UnknownTopicError):
            await log.group_offsets("nope")

    # -- fenced writes (design §15) ------------------------------------------

    async def _taken_over(self, log: Log) -> tuple[Lease, Lease]:
        """Member a's lease on orders/0, then member b's after a released it."""
        for topic in ("orders", "retry_orders", "dlq_orders"):
            await log.create_topic(topic, 2)
        old = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        assert old is not None
        await log.release_partition(old)
        new = await log.acquire_partition("g", "orders", 0, "b", ttl=60.0)
        assert new is not None and new.generation > old.generation
        return old, new

    async def test_a_stale_fence_refuses_appends_to_any_topic_and_writes_nothing(
        self, log: Log
    ) -> None:
        old, new = await self._taken_over(log)
        with pytest.raises(FencedError) as caught:
            await log.append("retry_orders", 0, [rec(b"late")], fence=old)
        assert (caught.value.topic, caught.value.partition, caught.value.generation) == (
            "orders",
            0,
            old.generation,
        )
        with pytest.raises(FencedError):
            await log.append("dlq_orders", 1, [rec(b"late")], fence=old)
        assert (await log.end_offsets("retry_orders"), await log.end_offsets("dlq_orders")) == (
            {0: 0, 1: 0},
            {0: 0, 1: 0},
        )
        assert await log.append("retry_orders", 0, [rec(b"owner")], fence=new) == [0]
        # A fence of another group, or of a partition nobody leased, is stale too.
        other = Lease("h", "orders", 0, "a", new.generation, new.expires_at)
        with pytest.raises(FencedError):
            await log.append("retry_orders", 0, [rec()], fence=other)

    async def test_a_taken_over_writer_is_refused_and_its_earlier_writes_are_read(
        self, log: Log
    ) -> None:
        """The old owner's retry work and dead letters written before the takeover
        are there for the new owner; after it, none of its appends lands.

        Offsets only grow: a log may leave gaps (the NATS log's fence records),
        so this test compares records read, never counts offsets."""
        for topic in ("orders", "retry_orders", "dlq_orders"):
            await log.create_topic(topic, 2)
        old = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
        assert old is not None
        retried = await log.append("retry_orders", 0, [rec(b"r1"), rec(b"r2")], fence=old)
        dead = await log.append("dlq_orders", 0, [rec(b"d1")], fence=old)
        await log.release_partition(old)
        new = await log.acquire_partition("g", "orders", 0, "b", ttl=60.0)
        assert new is not None and new.generation > old.generation
        for topic in ("retry_orders", "dlq_orders"):
            with pytest.raises(FencedError):
                await log.append(topic, 0, [rec(b"late")], fence=old)
        retry_read = await read_all(log, "retry_orders", 0)
        assert [(r.offset, r.body) for r in retry_read] == list(
            zip(retried, [b"r1", b"r2"], strict=True)
        )
        assert [(r.offset, r.body) for r in await read_all(log, "dlq_orders", 0)] == [
            (dead[0], b"d1")
        ]
        # Whatever a log keeps beside the records, the offsets tell only of records.
        assert await log.start_offsets("retry_orders") == {0: retried[0], 1: 0}
        assert await log.end_offsets("retry_orders") == {0: retried[-1] + 1, 1: 0}
        assert await log.end_offsets("dlq_orders") == {0: dead[-1] + 1, 1: 0}
        assert await log.read("retry_orders", 0, retried[-1] + 1) == []
        mine = await log.append("retry_orders", 0, [rec(b"r3"), rec(b"r4")], fence=new)
        assert retried[-1] < mine[0] < mine[1]
        assert [r.body for r in await read_from(log, "retry_orders", 0, retried[-1] + 1)] == [
            b"r3",
            b"r4",
        ]
        assert await log.end_offsets("retry_orders") == {0: mine[-1] + 1, 1: 0}
        # Retention below the new owner's records keeps exactly them.
        await log.commit("g", "retry_orders", 0, mine[0], fence=new)
        if not self.exact_retention:
            return
        await log.apply_retention("retry_orders")
        assert await log.start_offsets("retry_orders") == {0: mine[0], 1: 0}
        assert [r.body for r in await read_all(log, "retry_orders", 0)] == [b"r3", b"r4"]
        # The stale writer stays refused after retention too.
        with pytest.raises(FencedError):
            await log.append("retry_orders", 0, [rec(b"later")], fence=old)
        assert await log.end_offsets("retry_orders") == {0: mine[-1] + 1, 1: 0}

    async def test_a_stale_fence_refuses_commits_of_another_partition(self, log: Log) -> None:
        old, new = await self._taken_over(log)
        await self.room(log, "retry_orders", 0, 3)
        with pytest.raises(FencedError):
            await log.commit("g", "retry_orders", 0, 3, fence=old)
        assert await log.committed("g", "retry_orders", 0) is None
        await log.commit("g", "retry_orders", 0, 3, fence=new)
        assert await log.committed("g", "retry_orders", 0) == 3

    async def test_store_writes_appends_then_offsets(self, log: Log) -> None:
        _, lease = await self._taken_over(log)
        await self.room(log, "orders", 0, 7)
        write = BatchWrite(
            "g",
            appends=[
                ("dlq_orders", 0, [rec(b"d1")]),
                ("retry_orders", 0, [rec(b"r1"), rec(b"r2")]),
            ],
            commits=[("orders", 0, 7), ("retry_orders", 0, 1)],
        )
        assert await log.store(write, fence=lease) == [[0], [0, 1]]
        assert [r.body for r in await read_all(log, "retry_orders", 0)] == [b"r1", b"r2"]
        assert [r.body for r in await read_all(log, "dlq_orders", 0)] == [b"d1"]
        assert await log.committed("g", "orders", 0) == 7
        assert await log.committed("g", "retry_orders", 0) == 1

    async def test_what_a_store_wrote_is_read_and_committed_at_once(self, log: Log) -> None:
        """Read-your-writes: once ``store`` returns, a read at the offsets it
        gave returns those records and ``committed`` the offsets it stored,
        with no wait (the engine reads its pending retry records back right
        away). On Kafka, ``commit_transaction`` returns before the commit
        markers are written: a log that returned then left the records and
        offsets invisible to ``read_committed`` readers for a moment
        (a retry round that read nothing resolved its keys, losing them).
        Many stores, each checked at once, so a lag of a few milliseconds
        cannot slip through."""
        _, lease = await self._taken_over(log)
        await self.room(log, "orders", 0, 61)
        for n in range(60):
            write = BatchWrite(
                "g",
                appends=[
                    ("dlq_orders", 0, [rec(b"d%d" % n)]),
                    ("retry_orders", 0, [rec(b"r%d" % n), rec(b"s%d" % n)]),
                ],
                commits=[("orders", 0, n + 1), ("retry_orders", 0, n)],
            )
            dead, retry = await log.store(write, fence=lease)
            page = await read_from(log, "retry_orders", 0, retry[0], 10)
            assert [(r.offset, r.body) for r in page] == [
                (retry[0], b"r%d" % n),
                (retry[1], b"s%d" % n),
            ], f"store {n}"
            assert [r.body for r in await read_from(log, "dlq_orders", 0, dead[0], 10)] == [
                b"d%d" % n
            ]
            assert await log.committed("g", "orders", 0) == n + 1, f"store {n}"
            zero = n if n or self.commits_past_the_end else None  # 0 reads back as None
            assert await log.committed("g", "retry_orders", 0) == zero, f"store {n}"

    async def test_a_read_back_from_an_earlier_offset_after_the_end_returns_the_records(
        self, log: Log
    ) -> None:
        """Reading at the end, then again from the first record (a retry round
        reading its pending records back; a dead-letter listing followed by a
        replay) returns the records every time. On Kafka a reader that moved
        back by re-assigning its partition could report the old position
        (past the commit marker at the end) for a moment and read nothing
        (a replay skipped a whole dead-letter partition)."""
        _, lease = await self._taken_over(log)
        bodies = [b"r%d" % n for n in range(5)]
        write = BatchWrite("g", appends=[("retry_orders", 0, [rec(b) for b in bodies])])
        [offsets] = await log.store(write, fence=lease)
        for n in range(60):
            # Right after the last record: on Kafka the commit marker.
            assert await log.read("retry_orders", 0, offsets[-1] + 1, 1) == []
            page = await read_from(log, "retry_orders", 0, offsets[0], 10)
            assert [r.body for r in page] == bodies, f"read back {n}"

    async def test_store_under_a_stale_fence_writes_nothing(self, log: Log) -> None:
        old, _ = await self._taken_over(log)
        write = BatchWrite("g", appends=[("retry_orders", 0, [rec()])], commits=[("orders", 0, 7)])
        with pytest.raises(FencedError):
            await log.store(write, fence=old)
        assert await log.end_offsets("retry_orders") == {0: 0, 1: 0}
        assert await log.committed("g", "orders", 0) is None

    async def test_a_store_that_fails_midway_keeps_what_atomic_store_promises(
        self, log: Log
    ) -> None:
        _, lease = await self._taken_over(log)
        write = BatchWrite(
            "g",
            appends=[("retry_orders", 0, [rec()]), ("dlq_orders", 5, [rec()])],
            commits=[("orders", 0, 7)],
        )
        with pytest.raises(UnknownPartitionError):
            await log.store(write, fence=lease)
        # Atomic: nothing. Call by call: the appends before the failure, no offset.
        written = 0 if log.atomic_store else 1
        assert await log.end_offsets("retry_orders") == {0: written, 1: 0}
        assert await log.committed("g", "orders", 0) is None

    # -- cleaning up ------------------------------------------------------

    async def test_delete_topic_removes_records_offsets_and_leases(self, log: Log) -> None:
        await log.create_topic("orders", 2)
        await log.create_topic("other", 1)
        await log.append("orders", 0, [rec(b"gone")])
        await log.append("other", 0, [rec(b"kept")])
        await log.commit("g", "orders", 0, 1)
        await log.commit("g", "other", 0, 1)
        assert await log.acquire_partition("g", "orders", 1, "a", ttl=60.0) is not None
        assert await log.delete_topic("orders") is True
        assert await log.list_topics() == [TopicInfo("other", 1)]
        for call in (
            log.describe_topic("orders"),
            log.read("orders", 0, 0),
            log.append("orders", 0, [rec()]),
            log.end_offsets("orders"),
        ):
            with pytest.raises(UnknownTopicError):
                await call
        assert await log.committed("g", "orders", 0) is None
        assert await log.delete_topic("orders") is False
        # The name can be used again, with another count, from offset 0.
        assert await log.create_topic("orders", 3) == TopicInfo("orders", 3)
        assert await log.append("orders", 0, [rec(b"new")]) == [0]
        assert [r.body for r in await read_all(log, "orders", 0)] == [b"new"]
        assert await log.acquire_partition("g", "orders", 1, "b", ttl=60.0) is not None
        assert [r.body for r in await read_all(log, "other", 0)] == [b"kept"]
        assert await log.committed("g", "other", 0) == 1

    async def test_a_writer_that_cached_a_deleted_topic_is_refused(self, log: Log) -> None:
        if not self.multiprocess:
            pytest.skip(f"{type(log).__name__} has one instance per log")
        await log.create_topic("orders", 1)
        async with open_log(log.url) as other:
            assert await other.append("orders", 0, [rec(b"first")]) == [0]  # caches the topic
            assert await log.delete_topic("orders")
            with pytest.raises(UnknownTopicError):
                await other.append("orders", 0, [rec(b"late")])
            await log.create_topic("orders", 1)
            assert await other.append("orders", 0, [rec(b"again")]) == [0]
        assert [r.body for r in await read_all(log, "orders", 0)] == [b"again"]

    async def test_a_reader_that_cached_a_deleted_topic_is_told(self, log: Log) -> None:
        """A consumer whose topic another process deleted read empty pages
        forever (SQLite: a cached topic id), idle in silence, instead of
        being told the topic is gone."""
        if not self.multiprocess:
            pytest.skip(f"{type(log).__name__} has one instance per log")
        await log.create_topic("orders", 1)
        async with open_log(log.url) as other:
            assert await other.append("orders", 0, [rec(b"first")]) == [0]
            assert [r.body for r in await other.read("orders", 0, 0)] == [b"first"]
            assert await log.delete_topic("orders")
            with pytest.raises(UnknownTopicError):
                await other.read("orders", 0, 1)
            with pytest.raises(UnknownTopicError):
                await other.end_offsets("orders")

    async def test_delete_group_removes_its_offsets_and_leases_only(self, log: Log) -> None:
        await log.create_topic("orders", 2)
        await log.create_topic("other", 1)
        for topic, partition, upto in (("orders", 0, 3), ("orders", 1, 4), ("other", 0, 5)):
            await self.room(log, topic, partition, upto)
        for group in ("g1", "g2"):
            await log.commit(group, "orders", 0, 3)
            await log.commit(group, "orders", 1, 4)
            await log.commit(group, "other", 0, 5)
        assert await log.acquire_partition("g1", "orders", 0, "a", ttl=60.0) is not None
        assert await log.delete_group("g1", "orders") == 2
        assert [await log.committed("g1", "orders", p) for p in (0, 1)] == [None, None]
        assert await log.committed("g1", "other", 0) == 5
        assert await log.committed("g2", "orders", 1) == 4
        # The lease went with the group: another member takes the partition at once.
        assert await log.acquire_partition("g1", "orders", 0, "b", ttl=60.0) is not None
        assert await log.delete_group("g1") == 1
        assert await log.committed("g1", "other", 0) is None
        assert await log.delete_group("nobody") == 0
        with pytest.raises(UnknownTopicError):
            await log.delete_group("g2", "nope")
        assert await log.committed("g2", "other", 0) == 5

    # -- several processes ------------------------------------------------

    @pytest.mark.slow
    async def test_concurrent_appenders_in_several_processes(self, log: Log) -> None:
        if not self.multiprocess:
            pytest.skip(f"{type(log).__name__} lives in one process")
        producers, count, partitions = 4, 500, 3
        await log.create_topic("shared", partitions)
        context = multiprocessing.get_context("spawn")
        start = context.Event()
        workers = [
            context.Process(
                target=append_worker, args=(log.url, "shared", n, count, partitions, start)
            )
            for n in range(producers)
        ]
        for worker in workers:
            worker.start()
        start.set()
        loop = asyncio.get_running_loop()
        for worker in workers:
            await loop.run_in_executor(None, worker.join, 120)
            assert worker.exitcode == 0, f"appender process failed with {worker.exitcode}"
        seen: set[tuple[int, int]] = set()
        for partition in range(partitions):
            records = await read_all(log, "shared", partition)
            assert [r.offset for r in records] == list(range(len(records)))
            last: dict[int, int] = {}
            for record in records:
                producer, seq = map(int, record.body.split(b":"))
                assert (producer, seq) not in seen, f"{producer}:{seq} stored twice"
                seen.add((producer, seq))
                assert seq > last.get(producer, -1), "a producer's records are out of order"
                last[producer] = seq
                assert record.headers["wk-key"] == f"p{producer}-k{seq % 7}".encode()
        assert seen == {(p, s) for p in range(producers) for s in range(count)}


def append_worker(
    url: str, topic: str, producer: int, count: int, partitions: int, start: object
) -> None:
    """One appender process: ``count`` records, one append each, keys over all partitions."""
    start.wait(60)  # type: ignore[attr-defined]

    async def run() -> None:
        async with open_log(url) as log:
            for seq in range(count):
                key = f"p{producer}-k{seq % 7}"
                record = ({**HEADERS, "wk-key": key.encode()}, f"{producer}:{seq}".encode())
                await log.append(topic, partition_for(key, partitions), [record])

    asyncio.run(run())
