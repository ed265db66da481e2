"""``consumer_status`` and ``wakuwaku status``: lag, quarantined keys, backlog, dead
letters (design §6, §14). The retry state is the one a restarting consumer rebuilds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku._records import H_AT, H_DUE, H_MARKER
from wakuwaku.admin import Status, consumer_status, pause
from wakuwaku.cli import ExitCode, main
from wakuwaku.cli._status import render_status, when
from wakuwaku.engine._retry import MARKER_ATTEMPT_FAILED
from wakuwaku.logs import Lease
from wakuwaku.logs.sqlite import SQLiteLog
from wakuwaku.testing import FakeClock

from .ops_kit import (
    DELAYS,
    GROUP,
    STUCK,
    T0,
    TOPIC,
    Order,
    build_dead_log,
    quarantine,
)


async def test_status_reports_the_quarantined_key_exactly_as_the_consumer_holds_it() -> None:
    log = wk.MemoryLog()
    consumer = await quarantine(log)
    status = await consumer_status(log, TOPIC, GROUP, retry_delays=DELAYS)
    p = wk.partition_for(STUCK, 2)
    [key] = status.quarantined
    assert (key.partition, key.key, key.pending, key.failures) == (p, STUCK, 3, 1)
    assert key.first_failed_at == T0
    assert key.next_attempt_at == T0 + DELAYS[0]
    live = consumer.partition(TOPIC, p)
    assert live is not None and live.quarantined == (key,)
    assert live.retry_pending == 3
    assert status.backlog == 3
    assert status.partitions[p].retry_pending == 3 and status.partitions[p].quarantined == 1
    assert status.lag == 0
    assert status.dead_letters == {}


async def test_status_names_the_member_running_each_partition() -> None:
    """An operator asked which member runs a partition: ``status`` has an
    owner column (a member whose lease lapsed runs nothing)."""
    log = wk.MemoryLog()
    await quarantine(log)
    await log.acquire_partition(GROUP, TOPIC, 0, "worker-7", ttl=60.0)
    await log.acquire_partition(GROUP, TOPIC, 1, "lapsed", ttl=0.001)
    await asyncio.sleep(0.01)
    status = await consumer_status(log, TOPIC, GROUP, retry_delays=DELAYS)
    assert [p.owner for p in status.partitions] == ["worker-7", None]
    lines = render_status(status, T0)
    assert lines[2].endswith("  owner")
    assert lines[3].endswith("  worker-7") and lines[4].endswith("  -")
    assert status.as_dict()["partitions"][0]["owner"] == "worker-7"


async def test_status_without_the_right_to_list_members_shows_no_owner() -> None:
    """A log that refuses to say who runs the partitions (a user without the
    right to describe the group) still gives the rest of the status."""

    class Refusing(wk.MemoryLog):
        async def partition_owners(self, group: str, topic: str) -> dict[int, Lease]:
            raise wk.LogError("not authorized to describe group")

    log = Refusing()
    await quarantine(log)
    status = await consumer_status(log, TOPIC, GROUP, retry_delays=DELAYS)
    assert [p.owner for p in status.partitions] == [None, None]
    assert status.backlog == 3


async def test_status_follows_failed_attempts_and_lag() -> None:
    log = wk.MemoryLog()
    await quarantine(log, attempts=2)
    stuck = wk.Producer(log, TOPIC)
    await stuck.publish_many([Order("k1", 6), Order("k2", 7)])
    status = await consumer_status(log, TOPIC, GROUP, retry_delays=DELAYS)
    [key] = status.quarantined
    assert key.failures == 3
    # The second attempt failed at T0 + 10 + 20; the third delay follows it.
    assert key.next_attempt_at == T0 + DELAYS[0] + DELAYS[1] + DELAYS[2]
    assert status.lag == 2
    assert [p.lag for p in status.partitions] == [
        sum(wk.partition_for(k, 2) == p for k in ("k1", "k2")) for p in range(2)
    ]
    # The times are the ones the consumer stored, whatever
    # schedule the status is told (it used to derive them from that).
    for delays in ((1.0,), (2.0, 4.0, 8.0, 16.0)):
        other = await consumer_status(log, TOPIC, GROUP, retry_delays=delays)
        assert other.quarantined[0].next_attempt_at == key.next_attempt_at
    assert (await consumer_status(log, TOPIC, GROUP)).quarantined == status.quarantined


async def test_a_retry_record_without_a_stored_due_time_is_read_with_the_schedule() -> None:
    # Records written before wk-due-at was stored keep their old reading.
    log = wk.MemoryLog()
    await quarantine(log)
    p = wk.partition_for(STUCK, 2)
    marker = {
        "wk-v": b"1",
        H_MARKER: MARKER_ATTEMPT_FAILED,
        "wk-key": STUCK.encode(),
        "wk-failures": b"2",
        H_AT: str(int((T0 + 100) * 1000)).encode(),
    }
    await log.append(f"wk-retry.{GROUP}.{TOPIC}", p, [(marker, b"")])
    status = await consumer_status(log, TOPIC, GROUP, retry_delays=(1.0, 7.0))
    assert status.quarantined[0].next_attempt_at == T0 + 100 + 7.0


async def test_status_of_a_group_that_never_ran_and_of_an_unknown_topic() -> None:
    log = wk.MemoryLog()
    await log.create_topic(TOPIC, 2)
    await wk.Producer(log, TOPIC).publish_many([Order("k1", 1), Order("k2", 2)])
    status = await consumer_status(log, TOPIC, "nobody")
    assert [p.committed for p in status.partitions] == [None, None]
    assert status.never_committed and status.groups is None  # MemoryLog cannot list them
    assert status.lag == 2 and status.quarantined == () and status.backlog == 0
    with pytest.raises(wk.UnknownTopicError):
        await consumer_status(log, "nope", GROUP)
    with pytest.raises(wk.ConfigError):
        await consumer_status(log, TOPIC, "")


async def test_status_names_a_broken_retry_record_and_goes_on() -> None:
    log = wk.MemoryLog()
    await quarantine(log)
    p = wk.partition_for(STUCK, 2)
    broken = {
        "wk-v": b"1",
        H_MARKER: MARKER_ATTEMPT_FAILED,
        "wk-key": STUCK.encode(),
        H_AT: b"0",
    }  # no wk-failures
    [offset] = await log.append(f"wk-retry.{GROUP}.{TOPIC}", p, [(broken, b"")])
    status = await consumer_status(log, TOPIC, GROUP, retry_delays=DELAYS)
    [problem] = status.problems
    assert f"wk-retry.{GROUP}.{TOPIC} partition {p} offset {offset}" in problem
    assert "'stuck'" in problem
    assert status.quarantined[0].key == STUCK


def test_status_counts_dead_letters_per_reason(tmp_path: Path) -> None:
    dead = asyncio.run(build_dead_log(tmp_path / "wk.db"))

    async def work() -> Status:
        log = SQLiteLog(dead.path)
        try:
            return await consumer_status(log, TOPIC, GROUP)
        finally:
            await log.close()

    status = asyncio.run(work())
    assert status.dead_letters == {
        "<missing>": 1,
        "gave_up_retry": 2,
        "malformed_header": 1,
        "unknown_type": 1,
        "unrecoverable": 2,
    }
    assert status.dead_lettered == 7
    assert status.lag == 0 and status.quarantined == ()


@pytest.fixture
def quarantined_log(tmp_path: Path) -> str:
    path = tmp_path / "wk.db"

    async def build() -> None:
        log = SQLiteLog(path)
        try:
            await quarantine(log)
        finally:
            await log.close()

    asyncio.run(build())
    return f"sqlite:///{path}"


def test_cli_status_prints_lag_quarantined_keys_backlog_and_dead_letters(
    quarantined_log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No --retry-delays: the consumer (schedule 10, 20, 40) stored its due time.
    code = main(["status", TOPIC, "--group", GROUP, "--log", quarantined_log])
    out = capsys.readouterr().out
    assert code == ExitCode.OK
    p = wk.partition_for(STUCK, 2)
    # T0 + 10 s = 2023-11-14T22:13:30Z
    assert (
        f"  partition {p}  key 'stuck'  pending 3  failures 1  "
        "next attempt (stored) 2023-11-14T22:13:30Z (due now)"
    ) in out.splitlines()
    assert "retry backlog: 3 records pending" in out
    assert "lag: 0 records" in out
    assert "dead letters: none" in out
    code = main(["status", TOPIC, "-g", GROUP, "--json", "--log", quarantined_log])
    data = json.loads(capsys.readouterr().out)
    assert data["quarantined"][0]["next_attempt_at"] == T0 + DELAYS[0]  # not the default 2 s
    assert data["backlog"] == 3 and data["lag"] == 0
    # Paused, the key's attempts wait for a resume: never shown as due.
    assert (
        main(["pause", "--topic", TOPIC, "--key", STUCK, "-g", GROUP, "--log", quarantined_log])
        == 0
    )
    capsys.readouterr()
    main(["status", TOPIC, "--group", GROUP, "--log", quarantined_log])
    assert (
        f"  partition {p}  key 'stuck'  pending 3  failures 1  "
        "next attempt: paused by an operator (after resume)"
    ) in capsys.readouterr().out.splitlines()


def test_cli_status_prints_a_stored_time_beyond_year_9999(
    quarantined_log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A due time of year 33715 killed `wakuwaku status`. The
    # consumer now refuses such delays, but a stored header may hold any
    # time up to 2**53 ms (an older consumer, another writer).
    async def write() -> None:
        log = SQLiteLog(quarantined_log.removeprefix("sqlite:///"))
        try:
            marker = {
                "wk-v": b"1",
                H_MARKER: MARKER_ATTEMPT_FAILED,
                "wk-key": STUCK.encode(),
                "wk-failures": b"2",
                H_AT: str(int(T0 * 1000)).encode(),
                H_DUE: str(10**15).encode(),
            }
            await log.append(
                f"wk-retry.{GROUP}.{TOPIC}", wk.partition_for(STUCK, 2), [(marker, b"")]
            )
        finally:
            await log.close()

    asyncio.run(write())
    assert main(["status", TOPIC, "-g", GROUP, "--log", quarantined_log]) == ExitCode.OK
    assert "next attempt (stored) 1000000000000 s since the epoch" in capsys.readouterr().out


def test_when_prints_any_time() -> None:
    assert when(T0) == "2023-11-14T22:13:20Z"
    assert when(None) == "-"
    assert when(1e12) == "1000000000000 s since the epoch"
    assert when(-1e12) == "-1000000000000 s since the epoch"
    assert when(2.0**53 / 1000) == "9007199254741 s since the epoch"


def test_cli_status_errors(
    quarantined_log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "nope", "-g", GROUP, "--log", quarantined_log]) == ExitCode.ERROR
    assert "topic 'nope' does not exist" in capsys.readouterr().err
    assert main(["status", TOPIC, "--log", quarantined_log]) == ExitCode.USAGE
    assert "--group" in capsys.readouterr().err
    assert (
        main(["status", TOPIC, "-g", GROUP, "--retry-delays", "2,x", "--log", quarantined_log])
        == ExitCode.USAGE
    )
    assert "--retry-delays" in capsys.readouterr().err
    missing = tmp_path / "nothing.db"
    assert main(["status", TOPIC, "-g", GROUP, "--log", f"sqlite:///{missing}"]) == ExitCode.ERROR
    assert not missing.exists()


def test_the_fixture_routed_the_new_record_behind_the_pending_ones(quarantined_log: str) -> None:
    """The record routed during quarantine waits in the retry topic as it was produced."""

    async def work() -> list[int]:
        log = SQLiteLog(quarantined_log.removeprefix("sqlite:///"))
        try:
            p = wk.partition_for(STUCK, 2)
            records = await log.read(f"wk-retry.{GROUP}.{TOPIC}", p, 0, 100)
            return [
                msgspec.json.decode(r.body, type=Order).n
                for r in records
                if H_MARKER not in r.headers
            ]
        finally:
            await log.close()

    assert asyncio.run(work()) == [2, 3, 5]


def test_cli_status_of_a_group_that_never_committed_says_so(
    quarantined_log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A typo in the group name showed the whole topic as lag, exit 0.
    code = main(["status", TOPIC, "-g", GROUP + "-typo", "--log", quarantined_log])
    out, err = capsys.readouterr()
    assert code == ExitCode.FAILURE and out == ""
    assert f"group '{GROUP}-typo' has never committed on topic '{TOPIC}'" in err
    assert f"groups that did: '{GROUP}'" in err
    code = main(["status", TOPIC, "-g", "typo", "--json", "--log", quarantined_log])
    data = json.loads(capsys.readouterr().out)
    assert code == ExitCode.FAILURE
    assert data["never_committed"] is True and data["groups"] == [GROUP]


def test_status_shows_replayed_and_not_replayed_dead_letters_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Replayed dead letters were counted as if still waiting.
    dead = asyncio.run(build_dead_log(tmp_path / "wk.db"))
    url = f"sqlite:///{dead.path}"
    assert (
        main(["dlq", "replay", TOPIC, "-g", GROUP, "--reason", "unrecoverable", "--log", url])
        == ExitCode.OK
    )
    capsys.readouterr()

    async def work() -> Status:
        async with SQLiteLog(dead.path) as log:
            return await consumer_status(log, TOPIC, GROUP)

    status = asyncio.run(work())
    assert status.replayed == {"unrecoverable": 2}
    assert status.not_replayed == {
        "<missing>": 1,
        "gave_up_retry": 2,
        "malformed_header": 1,
        "unknown_type": 1,
    }
    assert main(["status", TOPIC, "-g", GROUP, "--log", url]) == ExitCode.OK
    out = capsys.readouterr().out.splitlines()
    assert (
        "dead letters not replayed: 5 (<missing> 1, gave_up_retry 2, malformed_header 1, "
        "unknown_type 1)"
    ) in out
    assert "dead letters replayed: 2 (unrecoverable 2)" in out


@pytest.mark.parametrize(
    "given",
    [f"wk-dlq.{GROUP}.{TOPIC}", f"wk-retry.{GROUP}.{TOPIC}", f"wk-replayed.{GROUP}.{TOPIC}"],
)
def test_status_given_a_derived_topic_names_the_main_topic(
    quarantined_log: str, capsys: pytest.CaptureFixture[str], given: str
) -> None:
    assert main(["status", given, "-g", GROUP, "--log", quarantined_log]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert f"{given!r} is the" in err and f"give the main topic {TOPIC!r}" in err


@pytest.mark.parametrize(
    ("command", "value", "problem"),
    [
        (["demo", "flights", "--limit", "10"], "nan", "finite seconds"),
        (["demo", "flights", "--limit", "10"], "inf", "finite seconds"),
        (["demo", "flights", "--limit", "10"], "99999999", "at most 2592000 seconds"),
        (["demo", "flights", "--limit", "10"], "-1", "finite seconds >= 0"),
        (["status", TOPIC, "-g", GROUP], "nan", "finite seconds"),
        (["status", TOPIC, "-g", GROUP], "1e12", "at most 2592000 seconds"),
    ],
)
def test_every_retry_delays_option_is_checked_as_the_consumer_checks_it(
    command: list[str],
    value: str,
    problem: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The demo accepted nan, inf and 99999999, and its consumer then failed
    # after the producers had run (found by a new user).
    args = [*command, "--retry-delays", value]
    if command[0] == "demo":
        args += ["--workdir", str(tmp_path)]
    else:
        args += ["--log", f"sqlite:///{tmp_path / 'log.db'}"]
    assert main(args) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--retry-delays" in err and problem in err
    assert not (tmp_path / "log.db").exists()


def test_status_shows_the_pauses_of_its_topic(
    quarantined_log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", TOPIC, "-g", GROUP, "--log", quarantined_log]) == ExitCode.OK
    assert "paused: nothing" in capsys.readouterr().out.splitlines()

    # A pause of another topic of the group is not this topic's.
    async def write() -> None:
        async with SQLiteLog(quarantined_log.removeprefix("sqlite:///")) as log:
            clock = FakeClock(T0)
            await log.create_topic("payments", 1)
            await pause(log, GROUP, "payments", clock=clock)
            await pause(log, GROUP, TOPIC, key="k2", by="ana", reason="poison", clock=clock)
            await pause(log, GROUP, TOPIC, partition=0, by="bo", clock=clock)
            status = await consumer_status(log, TOPIC, GROUP)
            assert [(p.topic, p.partition, p.key) for p in status.pauses] == [
                (TOPIC, wk.partition_for("k2", 2), "k2"),
                (TOPIC, 0, None),
            ]

    asyncio.run(write())
    assert main(["status", TOPIC, "-g", GROUP, "--log", quarantined_log]) == ExitCode.OK
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("paused: 2 pauses in force")
    assert lines[at + 1 : at + 3] == [
        f"  key 'k2' of orders (partition {wk.partition_for('k2', 2)})  by ana  "
        "since 2023-11-14T22:13:20Z  reason: poison",
        "  partition 0 of orders  by bo  since 2023-11-14T22:13:20Z  reason: -",
    ]
    assert main(["status", TOPIC, "-g", GROUP, "--json", "--log", quarantined_log]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pauses"][1] == {
        "topic": TOPIC,
        "partition": 0,
        "key": None,
        "by": "bo",
        "at": T0,
        "reason": "",
        "offset": 2,
    }


async def test_status_never_shows_a_committed_offset_above_the_end() -> None:
    """A consumer that appends and commits while ``status`` reads: the end
    offsets are read after the committed ones, so the end is never below."""

    class Busy(wk.MemoryLog):
        async def committed(self, group: str, topic: str, partition: int) -> int | None:
            if topic == TOPIC:  # a producer and its consumer went on meanwhile
                [offset] = await self.append(TOPIC, partition, [({}, b"x")])
                await super().commit(group, TOPIC, partition, offset + 1)
            return await super().committed(group, topic, partition)

    log = Busy()
    await log.create_topic(TOPIC, 2)
    status = await consumer_status(log, TOPIC, GROUP)
    for row in status.partitions:
        assert row.committed is not None and row.committed <= row.end_offset, row
