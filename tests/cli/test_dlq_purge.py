"""Purging dead letters (``wakuwaku.admin.purge_dead_letters``, ``wakuwaku dlq
purge``) and how ``dlq list`` shows them (newest first, error text)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku._records import H_ERROR, H_GROUP, H_KEY, H_REASON
from wakuwaku.admin import (
    DeadLetter,
    DeadLetterOrder,
    consumer_status,
    list_dead_letters,
    purge_dead_letters,
    replay_dead_letters,
    replay_ledger_topic_name,
)
from wakuwaku.cli import ExitCode, main
from wakuwaku.engine import Consumer, ConsumerConfig, Handler, dead_letter_topic_name
from wakuwaku.logs import Log
from wakuwaku.logs.sqlite import SQLiteLog

from ..log_kit import ENGINES, fresh_log
from .ops_kit import GROUP, TOPIC, DeadLog, build_dead_log

DLQ = dead_letter_topic_name(TOPIC, GROUP)
LEDGER = replay_ledger_topic_name(TOPIC, GROUP)


@pytest.fixture
async def dead(tmp_path: Path) -> AsyncIterator[tuple[DeadLog, Log]]:
    """The ops kit's log (7 dead letters of every kind, 2 of them broken), open."""
    built = await build_dead_log(tmp_path / "wk.db")
    log = SQLiteLog(built.path)
    try:
        yield built, log
    finally:
        await log.close()


def where(letters: Sequence[DeadLetter]) -> set[tuple[int, int]]:
    return {(x.partition, x.offset) for x in letters}


def purge_cli(*args: str) -> int:
    return main(["dlq", "purge", *args])


# ---------------------------------------------------------------------- library


async def test_purging_the_replayed_ones_hides_them_everywhere(
    dead: tuple[DeadLog, Log],
) -> None:
    _, log = dead
    everything = await list_dead_letters(log, TOPIC, group=GROUP)
    replayed = await replay_dead_letters(log, TOPIC, group=GROUP, reason="unrecoverable")
    done = {(r.dlq_partition, r.dlq_offset) for r in replayed.replayed}
    assert len(done) == 2

    report = await purge_dead_letters(log, TOPIC, group=GROUP, replayed=True)
    assert where(report.purged) == done and not report.dry_run
    assert report.by_reason == {"unrecoverable": 2}

    left = await list_dead_letters(log, TOPIC, group=GROUP)
    assert where(left) == where(everything) - done
    shown = await list_dead_letters(log, TOPIC, group=GROUP, include_purged=True)
    assert {(x.partition, x.offset) for x in shown if x.purged} == done
    assert len(shown) == len(everything)

    again = await replay_dead_letters(log, TOPIC, group=GROUP, everything=True, dry_run=True)
    assert again.purged == 2, "a purged dead letter is never replayed, even with --all"
    assert done.isdisjoint({(r.dlq_partition, r.dlq_offset) for r in again.replayed})

    status = await consumer_status(log, TOPIC, GROUP)
    assert status.purged == {"unrecoverable": 2}
    assert "unrecoverable" not in status.dead_letters
    assert status.as_dict()["dead_letters_purged"] == {"unrecoverable": 2}

    second = await purge_dead_letters(log, TOPIC, group=GROUP, replayed=True)
    assert second.purged == [] and second.already_purged == 2
    # The dead-letter records themselves are all still there: purge only hides.
    assert sum((await log.end_offsets(DLQ)).values()) == len(everything)


async def test_purge_by_reason_everything_and_dry_run(dead: tuple[DeadLog, Log]) -> None:
    built, log = dead
    dry = await purge_dead_letters(log, TOPIC, group=GROUP, reason="gave_up_retry", dry_run=True)
    assert dry.dry_run and [x.reason for x in dry.purged] == ["gave_up_retry", "gave_up_retry"]
    assert LEDGER not in {t.name for t in await log.list_topics()}, "a dry run writes nothing"

    by_reason = await purge_dead_letters(log, TOPIC, group=GROUP, reason="gave_up_retry")
    assert where(by_reason.purged) == where(dry.purged)
    assert sorted(str(x.reason) for x in await list_dead_letters(log, TOPIC, group=GROUP)) == [
        "None",
        "malformed_header",
        "unknown_type",
        "unrecoverable",
        "unrecoverable",
    ]
    rest = await purge_dead_letters(log, TOPIC, group=GROUP, everything=True)
    assert len(rest.purged) == 5 and rest.already_purged == 2
    assert (0, built.corrupt_offset) in where(rest.purged), "broken dead letters go with --all"
    assert rest.by_reason["<missing>"] == 1
    assert await list_dead_letters(log, TOPIC, group=GROUP) == []


async def test_purge_needs_one_selection(dead: tuple[DeadLog, Log]) -> None:
    _, log = dead
    with pytest.raises(wk.ConfigError, match="say which dead letters to purge"):
        await purge_dead_letters(log, TOPIC, group=GROUP)
    with pytest.raises(wk.ConfigError, match="not both"):
        await purge_dead_letters(log, TOPIC, group=GROUP, everything=True, reason="unrecoverable")
    with pytest.raises(wk.ConfigError, match="unknown dead-letter reason 'bogus'"):
        await purge_dead_letters(log, TOPIC, group=GROUP, reason="bogus")
    with pytest.raises(wk.UnknownTopicError):
        await purge_dead_letters(log, "nope", group=GROUP, everything=True)
    with pytest.raises(wk.ConfigError, match="is the dead-letter topic of group"):
        await purge_dead_letters(log, DLQ, group=GROUP, everything=True)
    assert LEDGER not in {t.name for t in await log.list_topics()}


async def test_replayed_and_reason_together_purge_the_replayed_ones_of_that_reason(
    dead: tuple[DeadLog, Log],
) -> None:
    _, log = dead
    await replay_dead_letters(log, TOPIC, group=GROUP, key="stuck")  # gave_up_retry
    await replay_dead_letters(log, TOPIC, group=GROUP, reason="unrecoverable", limit=1)
    report = await purge_dead_letters(
        log, TOPIC, group=GROUP, replayed=True, reason="unrecoverable"
    )
    assert [x.reason for x in report.purged] == ["unrecoverable"]


# -------------------------------------------------------------------------- CLI


async def test_cli_purge_lists_a_dry_run_then_purges(
    dead: tuple[DeadLog, Log], capsys: pytest.CaptureFixture[str]
) -> None:
    built, _ = dead
    dry_run = ["--topic", TOPIC, "-g", GROUP, "--reason", "unrecoverable", "--dry-run"]
    code = await asyncio.to_thread(purge_cli, *dry_run, "--log", built.url)
    out = capsys.readouterr().out.splitlines()
    assert code == ExitCode.OK
    assert out[0] == "would purge 2 dead letters of 'wk-dlq.billing.orders' (unrecoverable 2)"
    assert len(out) == 3 and all("\treason=unrecoverable\t" in line for line in out[1:])
    assert "error=Unrecoverable: order" in out[1]

    code = await asyncio.to_thread(
        purge_cli, TOPIC, "-g", GROUP, "--reason", "unrecoverable", "--log", built.url
    )
    out = capsys.readouterr().out.splitlines()
    assert code == ExitCode.OK
    assert out == [
        "purged 2 dead letters of 'wk-dlq.billing.orders' (unrecoverable 2)",
        "they are hidden from dlq list, dlq replay and status; the records stay in the log "
        "until its retention or `topic delete` removes them",
    ]
    code = await asyncio.to_thread(
        purge_cli, TOPIC, "-g", GROUP, "--reason", "unrecoverable", "--log", built.url
    )
    assert capsys.readouterr().out.splitlines() == [
        "purged 0 dead letters of 'wk-dlq.billing.orders'",
        "2 matching dead letters were purged before",
    ]
    await asyncio.to_thread(main, ["dlq", "list", TOPIC, "-g", GROUP, "--log", built.url])
    listed = capsys.readouterr().out
    assert "reason=unrecoverable" not in listed
    assert listed.endswith("5 dead letters in 'wk-dlq.billing.orders' (2 with broken headers)\n")
    await asyncio.to_thread(
        main, ["dlq", "list", TOPIC, "-g", GROUP, "--include-purged", "--log", built.url]
    )
    purged = [x for x in capsys.readouterr().out.splitlines() if x.endswith("\tpurged")]
    assert len(purged) == 2 and all("reason=unrecoverable" in x for x in purged)
    await asyncio.to_thread(main, ["status", TOPIC, "-g", GROUP, "--log", built.url])
    assert "dead letters purged (hidden): 2 (unrecoverable 2)" in capsys.readouterr().out


async def test_cli_purge_names_what_is_wrong(
    dead: tuple[DeadLog, Log], capsys: pytest.CaptureFixture[str]
) -> None:
    built, _ = dead
    cases = [
        ([TOPIC], ExitCode.USAGE, "say which dead letters: --replayed, --reason R"),
        ([TOPIC, "--all", "--replayed"], ExitCode.USAGE, "--all purges every dead letter"),
        (["--all"], ExitCode.USAGE, "give the main topic: TOPIC or --topic TOPIC"),
        ([TOPIC, "--topic", "other", "--all"], ExitCode.USAGE, "two topics given"),
        ([TOPIC, "--reason", "bogus"], ExitCode.USAGE, "'bogus' is not one of"),
        (["nope", "--all"], ExitCode.ERROR, "topic 'nope' does not exist"),
        ([DLQ, "--all"], ExitCode.ERROR, "is the dead-letter topic of group 'billing'"),
    ]
    for args, expected, message in cases:
        code = await asyncio.to_thread(purge_cli, *args, "-g", GROUP, "--log", built.url)
        err = capsys.readouterr().err
        assert (code, message in err) == (expected, True), (args, err)
    code = await asyncio.to_thread(purge_cli, TOPIC, "-g", "biling", "--all", "--log", built.url)
    assert code == ExitCode.FAILURE
    assert "group 'biling' has no dead-letter topic for 'orders'" in capsys.readouterr().err


async def test_cli_list_is_newest_first_and_shows_the_error_text(
    dead: tuple[DeadLog, Log], capsys: pytest.CaptureFixture[str]
) -> None:
    built, log = dead
    hostile = (
        "Unrecoverable: row\nlocked\tat https://user:pw@db.example/x  password=hunter2 " + "x" * 400
    )
    [offset] = await log.append(
        DLQ,
        1,
        [
            (
                {
                    H_REASON: b"unrecoverable",
                    H_KEY: b"late",
                    H_GROUP: GROUP.encode(),
                    H_ERROR: hostile.encode(),
                },
                b"{}",
            )
        ],
    )
    newest = await list_dead_letters(log, TOPIC, group=GROUP, order=DeadLetterOrder.NEWEST_FIRST)
    oldest = await list_dead_letters(log, TOPIC, group=GROUP, order="oldest")
    assert oldest == newest[::-1]
    assert [x.timestamp for x in oldest] == sorted(x.timestamp for x in oldest)
    assert (newest[0].partition, newest[0].offset) == (1, offset)
    with pytest.raises(wk.ConfigError, match="unknown dead-letter order 'sideways'"):
        await list_dead_letters(log, TOPIC, group=GROUP, order="sideways")

    def shown(*extra: str) -> list[str]:
        main(["dlq", "list", TOPIC, "-g", GROUP, *extra, "--log", built.url])
        return [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()[:-1]]

    default = await asyncio.to_thread(shown)
    assert default == [f"{x.partition}@{x.offset}" for x in newest]
    assert await asyncio.to_thread(shown, "--oldest-first") == default[::-1]
    assert await asyncio.to_thread(shown, "--limit", "2") == default[:2]

    await asyncio.to_thread(main, ["dlq", "list", TOPIC, "-g", GROUP, "--log", built.url])
    first = capsys.readouterr().out.splitlines()[0]
    error = next(field for field in first.split("\t") if field.startswith("error="))
    assert error.startswith("error=Unrecoverable: row locked at <url> password=<redacted> xxx")
    assert error.endswith("…[truncated]") and len(error) == len("error=") + 200
    assert "hunter2" not in first and "\n" not in first


# ---------------------------------------------------------------- every log


@wk.event("tests.cli.purge-order", key="sku")
class Order(msgspec.Struct, frozen=True):
    sku: str
    n: int


@pytest.fixture(params=[e for e in ENGINES if e != "memory"])
async def log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Log]:
    async with fresh_log(request.param, tmp_path) as created:
        yield created


async def test_purge_on_every_log(log: Log, capsys: pytest.CaptureFixture[str]) -> None:
    """A real consumer dead-letters two orders; a replay, a purge of the replayed
    one and a purge by reason leave ``dlq list`` empty, on each log."""
    await log.create_topic(TOPIC, 2)
    await wk.Producer(log, TOPIC).publish_many([Order("bad", 1), Order("worse", 2), Order("ok", 3)])

    async def handle(run: Sequence[Order]) -> None:
        if run[0].sku != "ok":
            raise wk.Unrecoverable(f"cannot take order {run[0].n}")

    config = ConsumerConfig(topic=TOPIC, group=GROUP, poll_interval=0.01)
    consumer = Consumer(config, [Handler(Order, handle)], log)
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while consumer.stats.dead_lettered() < 2:
            assert asyncio.get_running_loop().time() < deadline, "the consumer got stuck"
            await asyncio.sleep(0.02)
    finally:
        consumer.stop()
        await task

    letters = await list_dead_letters(log, TOPIC, group=GROUP)
    assert sorted(str(x.key) for x in letters) == ["bad", "worse"]
    await replay_dead_letters(log, TOPIC, group=GROUP, key="bad")
    code = await asyncio.to_thread(purge_cli, TOPIC, "-g", GROUP, "--replayed", "--log", log.url)
    assert code == ExitCode.OK
    assert capsys.readouterr().out.startswith(
        "purged 1 dead letter of 'wk-dlq.billing.orders' (unrecoverable 1)"
    )
    assert [x.key for x in await list_dead_letters(log, TOPIC, group=GROUP)] == ["worse"]
    code = await asyncio.to_thread(
        purge_cli, "--topic", TOPIC, "-g", GROUP, "--reason", "unrecoverable", "--log", log.url
    )
    assert code == ExitCode.OK
    assert capsys.readouterr().out.splitlines()[0] == (
        "purged 1 dead letter of 'wk-dlq.billing.orders' (unrecoverable 1)"
    )
    assert await list_dead_letters(log, TOPIC, group=GROUP) == []
    assert len(await list_dead_letters(log, TOPIC, group=GROUP, include_purged=True)) == 2
