"""Resetting a group's offsets: ``wakuwaku.admin.reset_offsets`` and
``wakuwaku group reset-offsets``, on every log."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku.admin import (
    ResetPosition,
    offset_at_time,
    plan_offset_reset,
    reset_offsets,
    running_members,
)
from wakuwaku.cli import ExitCode, main
from wakuwaku.engine import Consumer, ConsumerConfig, Handler, dead_letter_topic_name
from wakuwaku.logs import Log

from ..log_kit import ENGINES, fresh_log

TOPIC = "orders"
GROUP = "billing"


@wk.event("tests.cli.reset-order", key="sku")
class Order(msgspec.Struct, frozen=True):
    sku: str
    n: int


@pytest.fixture(params=[e for e in ENGINES if e != "memory"])
async def log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Log]:
    """A fresh log of each engine a CLI command can open (memory lives in one process)."""
    async with fresh_log(request.param, tmp_path) as created:
        yield created


async def fill(log: Log, counts: Sequence[int]) -> None:
    """``orders`` with ``counts[p]`` records in partition p, appended one at a
    time (so that their timestamps tell them apart where the clock allows)."""
    await log.create_topic(TOPIC, len(counts))
    for p, count in enumerate(counts):
        for n in range(count):
            await log.append(TOPIC, p, [({}, f"{p}:{n}".encode())])


async def timestamps(log: Log, partition: int) -> list[float]:
    found: list[float] = []
    offset = 0
    while page := await log.read(TOPIC, partition, offset, 100):
        found.extend(r.timestamp for r in page)
        offset = page[-1].offset + 1
    return found


def committed_reads(log: Log, offset: int) -> set[int | None]:
    """What ``committed`` may read back after a commit of ``offset`` (Iggy:
    0 is stored as no offset)."""
    return {offset} if log.commits_zero or offset else {0, None}


async def test_reset_moves_the_offsets_to_each_target(log: Log) -> None:
    await fill(log, [10, 4])
    # As the group's consumer did when it started: on Iggy, once every offset
    # is 0 (stored as none), this topic is what tells the group is known.
    await log.create_topic(dead_letter_topic_name(TOPIC, GROUP), 2, derived_from=TOPIC)
    await log.commit(GROUP, TOPIC, 0, 6)
    await log.commit(GROUP, TOPIC, 1, 2)

    plan = await reset_offsets(log, GROUP, TOPIC, ResetPosition.EARLIEST, dry_run=True)
    assert not plan.applied and plan.running == ()
    assert [(p.partition, p.committed, p.offset, p.change) for p in plan.partitions] == [
        (0, 6, 0, -6),
        (1, 2, 0, -2),
    ]
    assert (plan.skipped, plan.replayed) == (0, 8)
    assert await log.committed(GROUP, TOPIC, 0) == 6, "a dry run stores nothing"

    plan = await reset_offsets(log, GROUP, TOPIC, 3, partition=0)
    assert plan.applied and [p.partition for p in plan.partitions] == [0]
    assert (plan.skipped, plan.replayed) == (0, 3)
    assert await log.committed(GROUP, TOPIC, 0) == 3
    assert await log.committed(GROUP, TOPIC, 1) == 2, "--partition leaves the others alone"

    plan = await reset_offsets(log, GROUP, TOPIC, 99)
    assert [(p.offset, p.note) for p in plan.partitions] == [
        (10, "offset 99 is past the end offset 10: clamped to 10"),
        (4, "offset 99 is past the end offset 4: clamped to 4"),
    ]
    assert (plan.skipped, plan.replayed) == (7 + 2, 0)
    assert [await log.committed(GROUP, TOPIC, p) for p in (0, 1)] == [10, 4]

    await reset_offsets(log, GROUP, TOPIC, 0)
    assert await log.committed(GROUP, TOPIC, 0) in committed_reads(log, 0)
    await reset_offsets(log, GROUP, TOPIC, ResetPosition.LATEST)
    assert [await log.committed(GROUP, TOPIC, p) for p in (0, 1)] == [10, 4]
    await reset_offsets(log, GROUP, TOPIC, ResetPosition.EARLIEST)
    assert [await log.committed(GROUP, TOPIC, p) for p in (0, 1)] in (
        [0, 0],
        [None, None],  # Iggy stores an offset of 0 as none
    )


async def test_reset_to_a_time_finds_the_first_record_at_or_after_it(log: Log) -> None:
    await fill(log, [9, 3])
    await log.commit(GROUP, TOPIC, 0, 9)
    stamps = {p: await timestamps(log, p) for p in (0, 1)}

    def first_at(partition: int, at: float) -> int:
        found = [i for i, ts in enumerate(stamps[partition]) if ts >= at]
        return found[0] if found else len(stamps[partition])

    for at in (stamps[0][4], stamps[0][4] + 1e-6, stamps[0][0], stamps[0][-1]):
        moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
        plan = await plan_offset_reset(log, GROUP, TOPIC, moment)
        # The moment given keeps microseconds: compare with what it says.
        seconds = moment.timestamp()
        assert [p.offset for p in plan.partitions] == [first_at(0, seconds), first_at(1, seconds)]

    later = datetime.datetime.fromtimestamp(max(stamps[0][-1], stamps[1][-1]) + 60, datetime.UTC)
    plan = await plan_offset_reset(log, GROUP, TOPIC, later)
    assert [(p.offset, p.note) for p in plan.partitions] == [
        (9, "no record at or after that time: the end offset"),
        (3, "no record at or after that time: the end offset"),
    ]
    earlier = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
    plan = await reset_offsets(log, GROUP, TOPIC, earlier)
    assert [p.offset for p in plan.partitions] == [0, 0] and plan.replayed == 9
    with pytest.raises(wk.ConfigError, match="has no zone"):
        await plan_offset_reset(log, GROUP, TOPIC, datetime.datetime(2026, 1, 1))


async def _wait_for(what: str, check: Callable[[], Awaitable[bool]], within: float = 60.0) -> None:
    """Until ``await check()`` is true (what the test waits on), or fail naming
    ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def cli(*args: str) -> int:
    return main(["group", "reset-offsets", *args])


async def test_reset_is_refused_while_a_consumer_runs(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    await log.create_topic(TOPIC, 2)
    await wk.Producer(log, TOPIC).publish_many([Order(f"s{n}", n) for n in range(6)])
    handled: list[Order] = []

    async def handle(run: Sequence[Order]) -> None:
        handled.extend(run)

    config = ConsumerConfig(topic=TOPIC, group=GROUP, poll_interval=0.01, member_id="member-a")
    consumer = Consumer(config, [Handler(Order, handle)], log)
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    tool = wk.open_log(log.url)  # the tool's own connection, as another process has
    try:

        async def both_owned() -> bool:
            found = await running_members(tool, GROUP, TOPIC) or ()
            return sum(len(m.partitions) for m in found) == 2

        await _wait_for("the consumer to own both partitions", both_owned)

        async def all_handled() -> bool:
            return len(handled) == 6

        await _wait_for("the consumer to handle everything", all_handled)
        [member] = await running_members(tool, GROUP, TOPIC) or ()
        iggy = type(tool).__name__ == "IggyLog"
        if not iggy:  # Iggy names another instance's member by its server id
            assert member.member == "member-a"
        assert member.partitions == (0, 1)
        with pytest.raises(wk.GroupRunningError) as caught:
            await reset_offsets(tool, GROUP, TOPIC, ResetPosition.EARLIEST)
        assert caught.value.partitions == {0: member.member, 1: member.member}
        assert member.member in str(caught.value)

        capsys.readouterr()
        for dry in ((), ("--dry-run",)):
            code = await asyncio.to_thread(
                cli, "-g", GROUP, "--topic", TOPIC, "--to-earliest", *dry, "--log", log.url
            )
            out, err = capsys.readouterr()
            assert code == ExitCode.FAILURE
            assert out.startswith("reset group 'billing' on topic 'orders' to earliest\n")
            assert (
                f"has running members on topic 'orders': '{member.member}' (partitions 0, 1" in err
            )
            assert "nothing stored" in err
    finally:
        consumer.stop()
        await task
    try:

        async def nobody_runs() -> bool:
            return await running_members(tool, GROUP, TOPIC) == ()

        await _wait_for("the stopped consumer to leave", nobody_runs)
        code = await asyncio.to_thread(
            cli, "-g", GROUP, "--topic", TOPIC, "--to-earliest", "--log", log.url
        )
        out, err = capsys.readouterr()
        assert code == ExitCode.OK, err
        assert "stored the new offsets of" in out
        for p in (0, 1):
            assert await tool.committed(GROUP, TOPIC, p) in committed_reads(tool, 0)
    finally:
        await tool.close()


# --------------------------------------------------------------- SQLite only


@pytest.fixture
async def sqlite_log(tmp_path: Path) -> AsyncIterator[Log]:
    async with fresh_log("sqlite", tmp_path) as created:
        yield created


async def test_cli_prints_the_plan_and_a_dry_run_stores_nothing(
    sqlite_log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    await fill(sqlite_log, [10, 5, 3])
    await sqlite_log.commit(GROUP, TOPIC, 0, 7)
    await sqlite_log.commit(GROUP, TOPIC, 1, 1)
    url = sqlite_log.url

    code = await asyncio.to_thread(
        cli, "-g", GROUP, "--topic", TOPIC, "--to-offset", "4", "--dry-run", "--log", url
    )
    assert code == ExitCode.OK
    assert capsys.readouterr().out.splitlines() == [
        "reset group 'billing' on topic 'orders' to offset 4",
        "partition          from            to  records",
        "        0             7             4  -3 (replayed)",
        "        1             1             4  +3 (skipped)",
        "        2             -             3  +3 (skipped)",
        "records skipped: 6, read again (replayed): 3 (+N: skipped, -N: replayed)",
        "from '-': the group never committed there; it would read from the start",
        "note: partition 2: offset 4 is past the end offset 3: clamped to 3",
        "dry run: nothing stored",
    ]
    assert [await sqlite_log.committed(GROUP, TOPIC, p) for p in (0, 1, 2)] == [7, 1, None]

    code = await asyncio.to_thread(
        cli, "-g", GROUP, "--topic", TOPIC, "--partition", "1", "--to-latest", "--log", url
    )
    assert code == ExitCode.OK
    assert capsys.readouterr().out.splitlines()[2:] == [
        "        1             1             5  +4 (skipped)",
        "records skipped: 4, read again (replayed): 0 (+N: skipped, -N: replayed)",
        "stored the new offsets of 1 partition",
    ]
    assert [await sqlite_log.committed(GROUP, TOPIC, p) for p in (0, 1, 2)] == [7, 5, None]


async def test_a_reset_to_offset_0_says_when_the_log_stores_it_as_no_offset(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    # Seen on Iggy: after --to-earliest, `status` said the group had never
    # committed (Iggy stores "the last record consumed", so 0 is no offset).
    await fill(log, [3, 2])
    await log.create_topic(dead_letter_topic_name(TOPIC, GROUP), 2, derived_from=TOPIC)
    await log.commit(GROUP, TOPIC, 0, 3)
    await log.commit(GROUP, TOPIC, 1, 1)
    code = await asyncio.to_thread(
        cli, "-g", GROUP, "--topic", TOPIC, "--to-earliest", "--log", log.url
    )
    assert code == ExitCode.OK
    out = capsys.readouterr().out.splitlines()
    assert "stored the new offsets of 2 partitions" in out
    said = [line for line in out if line.startswith("note: this log stores offset 0")]
    if log.commits_zero:
        assert said == []
        assert [await log.committed(GROUP, TOPIC, p) for p in (0, 1)] == [0, 0]
    else:
        assert said == [
            "note: this log stores offset 0 as no offset: `status` shows the group as not "
            "committed on partitions 0, 1 until it commits again; it reads from the start"
        ]
        assert [await log.committed(GROUP, TOPIC, p) for p in (0, 1)] == [None, None]


async def test_offsets_below_the_start_are_clamped_to_it(
    sqlite_log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    await fill(sqlite_log, [8])
    await sqlite_log.commit(GROUP, TOPIC, 0, 5)
    assert await sqlite_log.apply_retention(TOPIC) == 5
    plan = await reset_offsets(sqlite_log, GROUP, TOPIC, 2)
    [entry] = plan.partitions
    assert (entry.offset, entry.note) == (5, "offset 2 is below the start offset 5: clamped to 5")
    earliest = await reset_offsets(sqlite_log, GROUP, TOPIC, ResetPosition.EARLIEST, dry_run=True)
    assert earliest.partitions[0].offset == 5


async def test_a_held_lease_refuses_and_a_released_or_expired_one_does_not(
    sqlite_log: Log,
) -> None:
    await fill(sqlite_log, [3, 3])
    await sqlite_log.commit(GROUP, TOPIC, 0, 1)
    held = await sqlite_log.acquire_partition(GROUP, TOPIC, 1, "pod-7", ttl=3600.0)
    assert held is not None
    with pytest.raises(wk.GroupRunningError, match=r"'pod-7' \(partition 1\)"):
        # A member on another partition refuses a reset of this one too: it
        # takes a free partition whenever it likes.
        await reset_offsets(sqlite_log, GROUP, TOPIC, 0, partition=0)
    plan = await reset_offsets(sqlite_log, GROUP, TOPIC, 0, dry_run=True)
    [member] = plan.running
    assert (member.member, member.partitions) == ("pod-7", (1,))
    assert member.expires_at == held.expires_at
    assert await sqlite_log.committed(GROUP, TOPIC, 0) == 1

    await sqlite_log.release_partition(held)
    assert (await reset_offsets(sqlite_log, GROUP, TOPIC, 0)).applied

    short = await sqlite_log.acquire_partition(GROUP, TOPIC, 0, "killed", ttl=0.05)
    assert short is not None
    assert await running_members(sqlite_log, GROUP, TOPIC) != ()

    async def lapsed() -> bool:
        return time.time() > short.expires_at

    await _wait_for("the lease to lapse", lapsed, within=10)
    assert await running_members(sqlite_log, GROUP, TOPIC) == ()
    assert (await reset_offsets(sqlite_log, GROUP, TOPIC, 2)).applied


async def test_cli_names_what_is_wrong(sqlite_log: Log, capsys: pytest.CaptureFixture[str]) -> None:
    await fill(sqlite_log, [3, 3])
    await sqlite_log.commit(GROUP, TOPIC, 0, 1)
    url = sqlite_log.url
    cases = [
        (["--topic", "nope", "--to-latest"], ExitCode.ERROR, "topic 'nope' does not exist"),
        (
            ["--topic", TOPIC, "--partition", "2", "--to-latest"],
            ExitCode.ERROR,
            "topic 'orders' has 2 partitions; partition 2 does not exist",
        ),
        (
            ["--topic", TOPIC, "--to-offset", "-1"],
            ExitCode.USAGE,
            "Invalid value for '--to-offset': -1 is not in the range x>=0",
        ),
        (
            ["--topic", TOPIC, "--to-datetime", "2026-05-01T10:15:00"],
            ExitCode.USAGE,
            "'2026-05-01T10:15:00' has no zone",
        ),
        (
            ["--topic", TOPIC, "--to-datetime", "yesterday"],
            ExitCode.USAGE,
            "'yesterday' is not an ISO 8601 time",
        ),
        (["--topic", TOPIC], ExitCode.USAGE, "give exactly one of --to-earliest"),
        (
            ["--topic", TOPIC, "--to-earliest", "--to-offset", "1"],
            ExitCode.USAGE,
            "give exactly one of",
        ),
        (
            ["--topic", "wk-dlq.billing.orders", "--to-latest"],
            ExitCode.ERROR,
            "'wk-dlq.billing.orders' is the dead-letter topic of group 'billing' for "
            "topic 'orders'",
        ),
    ]
    for args, expected, message in cases:
        code = await asyncio.to_thread(cli, "-g", GROUP, *args, "--log", url)
        err = capsys.readouterr().err
        assert (code, message in err) == (expected, True), (args, err)

    code = await asyncio.to_thread(
        cli, "-g", "biling", "--topic", TOPIC, "--to-latest", "--log", url
    )
    assert code == ExitCode.FAILURE
    assert capsys.readouterr().err == (
        "error: group 'biling' has never committed on topic 'orders' (a mistyped group, "
        "or a consumer that has not committed yet); groups that did: 'billing'\n"
    )
    assert await sqlite_log.committed("biling", TOPIC, 0) is None


async def test_library_refuses_bad_targets(sqlite_log: Log) -> None:
    await fill(sqlite_log, [1])
    await sqlite_log.commit(GROUP, TOPIC, 0, 1)
    for bad in (-1, True, 1.5, "latest"):  # a str is not a ResetPosition
        with pytest.raises(wk.ConfigError, match="reset target must be"):
            await plan_offset_reset(sqlite_log, GROUP, TOPIC, bad)  # type: ignore[arg-type]
    with pytest.raises(wk.UnknownPartitionError):
        await plan_offset_reset(sqlite_log, GROUP, TOPIC, 0, partition=-1)
    with pytest.raises(wk.UnknownGroupError) as caught:
        await plan_offset_reset(sqlite_log, "nobody", TOPIC, 0)
    assert caught.value.groups == (GROUP,)


async def test_a_group_without_offsets_is_known_by_its_dead_letter_topic(
    sqlite_log: Log,
) -> None:
    """A consumer creates its group's retry and dead-letter topics at start:
    a group with them but no offset yet (or, on Iggy, only offsets of 0) is
    not a typo."""
    await fill(sqlite_log, [4])
    with pytest.raises(wk.UnknownGroupError, match="no group has committed on it"):
        await plan_offset_reset(sqlite_log, GROUP, TOPIC, ResetPosition.LATEST)
    await sqlite_log.create_topic(dead_letter_topic_name(TOPIC, GROUP), 1, derived_from=TOPIC)
    plan = await reset_offsets(sqlite_log, GROUP, TOPIC, ResetPosition.LATEST)
    assert [(p.committed, p.offset, p.change) for p in plan.partitions] == [(None, 4, 4)]
    assert await sqlite_log.committed(GROUP, TOPIC, 0) == 4


@pytest.mark.kafka
async def test_kafka_refuses_while_the_group_runs_on_another_topic(tmp_path: Path) -> None:
    """Kafka's group is one per wakuwaku group: a member consuming another topic
    owns nothing of this one (``running`` is empty), but the broker refuses
    the offsets; the error says so and that nothing was stored."""
    async with fresh_log("kafka", tmp_path) as log:
        await fill(log, [3])
        await log.create_topic("other", 1)
        tool = wk.open_log(log.url)
        try:
            await tool.commit(GROUP, TOPIC, 0, 1)

            async def handle(run: Sequence[Order]) -> None:
                pass

            config = ConsumerConfig(topic="other", group=GROUP, poll_interval=0.01)
            consumer = Consumer(config, [Handler(Order, handle)], log)
            task = asyncio.create_task(consumer.run(install_signal_handlers=False))
            try:

                async def joined() -> bool:
                    return bool(consumer.assignment())

                await _wait_for("the consumer to join", joined)
                plan = await plan_offset_reset(tool, GROUP, TOPIC, 0)
                assert plan.running == ()
                with pytest.raises(wk.LogError) as caught:
                    await reset_offsets(tool, GROUP, TOPIC, 0)
                message = str(caught.value)
                assert "storing offset 0 of group 'billing' on orders/0 failed" in message
                assert "partitions stored before it: none" in message
                assert "also members that run on other topics" in message
            finally:
                consumer.stop()
                await task
            assert await tool.committed(GROUP, TOPIC, 0) == 1
        finally:
            await tool.close()


async def test_offset_at_time_checks_its_arguments(sqlite_log: Log) -> None:
    await fill(sqlite_log, [2])
    assert await offset_at_time(sqlite_log, TOPIC, 0, 0.0) == 0
    assert await offset_at_time(sqlite_log, TOPIC, 0, time.time() + 3600) == 2
    with pytest.raises(wk.UnknownPartitionError):
        await offset_at_time(sqlite_log, TOPIC, 1, 0.0)
    with pytest.raises(wk.ConfigError, match="finite"):
        await offset_at_time(sqlite_log, TOPIC, 0, float("nan"))


class _BlindLog(wk.MemoryLog):
    """A log that cannot tell who owns its partitions (the contract allows it)."""

    async def partition_owners(self, group: str, topic: str) -> None:  # type: ignore[override]
        return None


async def test_a_log_that_cannot_tell_who_runs_is_refused() -> None:
    log = _BlindLog()
    await fill(log, [2])
    await log.commit(GROUP, TOPIC, 0, 1)
    assert await running_members(log, GROUP, TOPIC) is None
    with pytest.raises(wk.ConfigError, match="cannot tell whether members of group 'billing'"):
        await reset_offsets(log, GROUP, TOPIC, 0)
    assert await log.committed(GROUP, TOPIC, 0) == 1
