"""Dead letters: ``wakuwaku.admin`` list/replay and ``wakuwaku dlq`` (design §8, §9)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku._records import H_ERROR, H_FAILED_AT, H_REASON, H_SRC, decode_source
from wakuwaku.admin import (
    DeadLetter,
    ReplayReport,
    list_dead_letters,
    replay_dead_letters,
    replay_ledger_topic_name,
)
from wakuwaku.cli import ExitCode, main
from wakuwaku.logs import Log
from wakuwaku.logs.sqlite import SQLiteLog

from .ops_kit import (
    GROUP,
    POISON,
    STUCK,
    TOPIC,
    DeadLog,
    Order,
    Recorder,
    build_dead_log,
    make_consumer,
)

T = TypeVar("T")
KEPT = {"wk-v", "wk-type", "wk-key", "wk-props", "wk-alg", "wk-src"}


@pytest.fixture
def dead_log(tmp_path: Path) -> DeadLog:
    return asyncio.run(build_dead_log(tmp_path / "wk.db"))


def on_log(dead: DeadLog, work: Callable[[Log], Awaitable[T]]) -> T:
    async def run() -> T:
        log = SQLiteLog(dead.path)
        try:
            return await work(log)
        finally:
            await log.close()

    return asyncio.run(run())


def reasons(letters: list[DeadLetter]) -> list[str | None]:
    return sorted((x.reason for x in letters), key=str)


# ----------------------------------------------------------------------- list


def test_list_returns_every_dead_letter_including_corrupt_ones(dead_log: DeadLog) -> None:
    letters = on_log(dead_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP))
    assert reasons(letters) == [
        None,
        "gave_up_retry",
        "gave_up_retry",
        "malformed_header",
        "unknown_type",
        "unrecoverable",
        "unrecoverable",
    ]
    corrupt = next(x for x in letters if x.reason is None)
    assert (corrupt.partition, corrupt.offset) == (0, dead_log.corrupt_offset)
    assert corrupt.key is None and corrupt.source is None and corrupt.body == b"\xff\x00"
    assert any("no wk-reason" in p for p in corrupt.problems)
    assert any("not valid UTF-8" in p for p in corrupt.problems)
    assert any("wk-src is broken" in p for p in corrupt.problems)
    poison = sorted(
        (x for x in letters if x.reason == "unrecoverable"),
        key=lambda x: x.source.offsets if x.source else (),
    )
    decoded = [msgspec.json.decode(x.body, type=Order).n for x in poison]
    assert sorted(decoded) == sorted(POISON)
    for letter in poison:
        assert letter.problems == ()
        assert letter.error is not None and "poison" in letter.error
        assert letter.type_tag == "tests.cli.order"
        assert letter.source is not None and letter.source.topic == TOPIC
        # A dead letter lives in the partition of the record it stands for.
        assert letter.source.partition == letter.partition
        assert letter.source.ids == (
            wk.message_id(TOPIC, letter.partition, letter.source.offsets[0]),
        )


def test_list_filters_by_reason_key_and_limit(dead_log: DeadLog) -> None:
    by_reason = on_log(
        dead_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP, reason="gave_up_retry")
    )
    assert [x.key for x in by_reason] == [STUCK, STUCK]
    by_key = on_log(dead_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP, key=STUCK))
    assert by_key == by_reason
    limited = on_log(dead_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP, limit=2))
    everything = on_log(dead_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP))
    assert limited == everything[:2]
    both = on_log(
        dead_log,
        lambda log: list_dead_letters(
            log, TOPIC, group=GROUP, reason=wk.ReasonCode.UNRECOVERABLE, key=STUCK
        ),
    )
    assert both == []


def test_list_refuses_an_unknown_topic_and_an_unknown_reason(dead_log: DeadLog) -> None:
    with pytest.raises(wk.UnknownTopicError) as caught:
        on_log(dead_log, lambda log: list_dead_letters(log, "nope", group=GROUP))
    assert caught.value.topic == "nope"
    with pytest.raises(wk.ConfigError, match="unknown dead-letter reason 'bogus'"):
        on_log(dead_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP, reason="bogus"))
    with pytest.raises(wk.ConfigError, match="limit"):
        on_log(dead_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP, limit=0))


async def test_list_is_empty_when_no_consumer_created_the_dead_letter_topic() -> None:
    log = wk.MemoryLog()
    await log.create_topic("fresh", 3)
    assert await list_dead_letters(log, "fresh", group=GROUP) == []
    report = await replay_dead_letters(log, "fresh", group=GROUP)
    assert report.matched == 0 and report.replayed == []


def test_cli_list_prints_one_line_per_dead_letter_and_names_broken_ones(
    dead_log: DeadLog, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["dlq", "list", TOPIC, "-g", GROUP, "--log", dead_log.url])
    out = capsys.readouterr().out
    assert code == ExitCode.OK
    lines = out.splitlines()
    assert len(lines) == 8
    assert lines[-1] == "7 dead letters in 'wk-dlq.billing.orders' (2 with broken headers)"
    corrupt = next(line for line in lines if line.startswith(f"0@{dead_log.corrupt_offset}\t"))
    assert "reason=-" in corrupt and "problems=no wk-reason header" in corrupt
    assert sum("reason=gave_up_retry\tkey='stuck'" in line for line in lines) == 2


def test_cli_list_json_and_filters(dead_log: DeadLog, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "dlq",
            "list",
            TOPIC,
            "-g",
            GROUP,
            "--reason",
            "unrecoverable",
            "--json",
            "--log",
            dead_log.url,
        ]
    )
    assert code == ExitCode.OK
    rows = json.loads(capsys.readouterr().out)
    assert sorted(json.loads(r["body"])["n"] for r in rows) == sorted(POISON)
    assert all(r["headers"]["wk-reason"] == "unrecoverable" for r in rows)
    main(["dlq", "list", TOPIC, "-g", GROUP, "--json", "--log", dead_log.url])
    rows = json.loads(capsys.readouterr().out)
    corrupt = next(r for r in rows if r["reason"] is None)
    assert corrupt["body_hex"] == "ff00" and "body" not in corrupt


def test_cli_errors_name_what_was_wrong(
    dead_log: DeadLog, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dlq", "list", "nope", "-g", GROUP, "--log", dead_log.url]) == ExitCode.ERROR
    assert "topic 'nope' does not exist" in capsys.readouterr().err
    assert (
        main(["dlq", "list", TOPIC, "-g", GROUP, "--reason", "bogus", "--log", dead_log.url])
        == ExitCode.USAGE
    )
    assert "bogus" in capsys.readouterr().err
    missing = tmp_path / "missing.db"
    assert (
        main(["dlq", "list", TOPIC, "-g", GROUP, "--log", f"sqlite:///{missing}"]) == ExitCode.ERROR
    )
    assert "no log at" in capsys.readouterr().err
    assert not missing.exists(), "an inspection must not create a log file"
    assert main(["dlq", "list", TOPIC, "-g", GROUP, "--log", "amqp://x"]) == ExitCode.ERROR
    assert "unsupported log URL" in capsys.readouterr().err


def test_cli_reads_the_log_url_from_the_environment(
    dead_log: DeadLog, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WAKUWAKU_LOG", dead_log.url)
    assert main(["dlq", "list", TOPIC, "-g", GROUP, "--key", STUCK]) == ExitCode.OK
    assert capsys.readouterr().out.count("key='stuck'") == 2


# --------------------------------------------------------------------- replay


async def main_topic(log: Log, partitions: int = 2) -> list[tuple[int, wk.Record]]:
    out: list[tuple[int, wk.Record]] = []
    for p in range(partitions):
        out.extend((p, r) for r in await log.read(TOPIC, p, 0, 10_000))
    return out


def test_dry_run_writes_nothing_and_reports_what_would_be_replayed(dead_log: DeadLog) -> None:
    async def work(log: Log) -> tuple[ReplayReport, dict[int, int], list[str]]:
        before = await log.end_offsets(TOPIC)
        report = await replay_dead_letters(
            log, TOPIC, group=GROUP, reason="unrecoverable", dry_run=True
        )
        assert await log.end_offsets(TOPIC) == before
        return report, before, [t.name for t in await log.list_topics()]

    report, _, topics = on_log(dead_log, work)
    assert report.dry_run and report.matched == 2 and report.skipped == []
    assert all(r.offset is None for r in report.replayed)
    assert {r.key for r in report.replayed} == {"k0", "k2"}
    for entry in report.replayed:
        assert entry.partition == wk.partition_for(entry.key, 2)
    assert replay_ledger_topic_name(TOPIC, GROUP) not in topics


def test_replay_writes_copies_keeping_identity_and_dropping_failure_headers(
    dead_log: DeadLog,
) -> None:
    async def work(log: Log) -> None:
        letters = {
            (x.partition, x.offset): x
            for x in await list_dead_letters(log, TOPIC, group=GROUP, key=STUCK)
        }
        before = await log.end_offsets(TOPIC)
        report = await replay_dead_letters(log, TOPIC, group=GROUP, key=STUCK)
        assert report.matched == 2 and not report.skipped
        assert report.by_partition == {wk.partition_for(STUCK, 2): 2}
        copies = [(p, r) for p, r in await main_topic(log) if r.offset >= before[p]]
        assert [(p, r.offset) for p, r in copies] == [
            (e.partition, e.offset) for e in report.replayed
        ]
        for (_, copy), entry in zip(copies, report.replayed, strict=True):
            letter = letters[(entry.dlq_partition, entry.dlq_offset)]
            assert H_FAILED_AT in letter.headers
            for dropped in (H_REASON, H_ERROR, H_FAILED_AT):
                assert dropped not in copy.headers
            assert copy.headers[H_SRC] == letter.headers[H_SRC]
            assert decode_source(copy.headers[H_SRC]).ids == letter.source.ids  # type: ignore[union-attr]
            assert copy.body == letter.body
            assert copy.headers == {
                **{k: v for k, v in letter.headers.items() if k in KEPT or not k.startswith("wk-")},
                "wk-for-group": GROUP.encode(),
            }

    on_log(dead_log, work)


def test_replay_remembers_what_it_replayed_and_all_starts_over(dead_log: DeadLog) -> None:
    async def work(log: Log) -> None:
        first = await replay_dead_letters(log, TOPIC, group=GROUP, reason="unrecoverable", limit=1)
        assert len(first.replayed) == 1 and first.already_replayed == 0
        second = await replay_dead_letters(log, TOPIC, group=GROUP, reason="unrecoverable")
        assert len(second.replayed) == 1 and second.already_replayed == 1
        assert second.replayed[0].dlq_offset != first.replayed[0].dlq_offset
        third = await replay_dead_letters(log, TOPIC, group=GROUP, reason="unrecoverable")
        assert third.replayed == [] and third.already_replayed == 2
        # The ledger is per dead letter: another filter is not affected by the first.
        other = await replay_dead_letters(
            log, TOPIC, group=GROUP, reason="gave_up_retry", dry_run=True
        )
        assert len(other.replayed) == 2
        again = await replay_dead_letters(
            log, TOPIC, group=GROUP, reason="unrecoverable", everything=True
        )
        assert len(again.replayed) == 2 and again.already_replayed == 0
        ledger = replay_ledger_topic_name(TOPIC, GROUP)
        assert (await log.describe_topic(ledger)).partitions == 2
        assert sum((await log.end_offsets(ledger)).values()) == 4

    on_log(dead_log, work)


def test_replay_skips_what_cannot_be_routed_and_says_why(dead_log: DeadLog) -> None:
    report = on_log(dead_log, lambda log: replay_dead_letters(log, TOPIC, group=GROUP))
    skipped = {(s.dlq_partition, s.dlq_offset): s.reason for s in report.skipped}
    assert len(skipped) == 2
    assert "not valid UTF-8" in skipped[(0, dead_log.corrupt_offset)]
    assert any("no wk-key" in why for why in skipped.values())
    assert report.matched == 7 and len(report.replayed) == 5
    # Skipped ones are not in the ledger: the next run reports them again.
    again = on_log(dead_log, lambda log: replay_dead_letters(log, TOPIC, group=GROUP))
    assert again.replayed == [] and len(again.skipped) == 2 and again.already_replayed == 5


def test_replayed_events_are_handled_under_their_original_message_ids(
    dead_log: DeadLog,
) -> None:
    async def work(log: Log) -> None:
        originals = {
            msgspec.json.decode(x.body, type=Order).n: x.source.ids  # type: ignore[union-attr]
            for x in await list_dead_letters(log, TOPIC, group=GROUP, reason="unrecoverable")
        }
        await replay_dead_letters(log, TOPIC, group=GROUP, reason="unrecoverable")
        fixed = Recorder(broken=False)
        await make_consumer(log, fixed).drain()
        assert sorted(o.n for o in fixed.handled) == sorted(POISON)
        seen = {o.n: ids for o, ids in zip(fixed.handled, fixed.ids, strict=True)}
        assert seen == originals

    on_log(dead_log, work)


def test_cli_replay_prints_counts_and_fails_on_skipped(
    dead_log: DeadLog, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "dlq",
            "replay",
            TOPIC,
            "-g",
            GROUP,
            "--reason",
            "unrecoverable",
            "--dry-run",
            "--log",
            dead_log.url,
        ]
    )
    out = capsys.readouterr().out
    assert code == ExitCode.OK
    assert out.splitlines()[0].startswith("would replay 2 dead letters into 'orders' (")
    code = main(
        ["dlq", "replay", TOPIC, "-g", GROUP, "--reason", "unrecoverable", "--log", dead_log.url]
    )
    assert code == ExitCode.OK
    assert capsys.readouterr().out.startswith("replayed 2 dead letters into 'orders' (")
    code = main(["dlq", "replay", TOPIC, "-g", GROUP, "--log", dead_log.url])
    captured = capsys.readouterr()
    assert code == ExitCode.FAILURE
    assert captured.out.startswith("replayed 3 dead letters")
    assert "2 matching dead letters were replayed before (use --all" in captured.out
    assert (
        f"skipped 'wk-dlq.billing.orders' partition 0 offset {dead_log.corrupt_offset} (key -)"
    ) in captured.err
    code = main(
        [
            "dlq",
            "replay",
            TOPIC,
            "-g",
            GROUP,
            "--reason",
            "unrecoverable",
            "--all",
            "--log",
            dead_log.url,
        ]
    )
    assert code == ExitCode.OK
    assert capsys.readouterr().out.startswith("replayed 2 dead letters")


def test_cli_replay_unknown_topic_exits_3(
    dead_log: DeadLog, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dlq", "replay", "nope", "-g", GROUP, "--log", dead_log.url]) == ExitCode.ERROR
    assert "'nope'" in capsys.readouterr().err


def test_admin_exports_are_complete() -> None:
    """Every public name defined in wakuwaku.admin's two modules is in their
    __all__ and importable from wakuwaku.admin (ruff RUF022 sorts it)."""
    import wakuwaku.admin as admin
    from wakuwaku.admin import dead_letters, offsets, purge, status

    for module in (dead_letters, offsets, purge, status):
        public = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        }
        assert set(module.__all__) >= public
        assert set(admin.__all__) >= set(module.__all__)
    assert all(hasattr(admin, name) for name in admin.__all__)


@pytest.mark.parametrize("command", ["list", "replay"])
def test_the_dead_letter_topic_given_as_the_topic_is_explained(
    dead_log: DeadLog, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # It said "no dead letters in 'dlq_dlq_orders'" while they existed.
    given = f"wk-dlq.{GROUP}.{TOPIC}"
    assert main(["dlq", command, given, "-g", GROUP, "--log", dead_log.url]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert f"{given!r} is the dead-letter topic of group {GROUP!r} for topic {TOPIC!r}" in err
    assert f"give the main topic {TOPIC!r} with --group {GROUP}" in err


def test_the_same_log_url_is_read_the_same_way_by_every_command(
    dead_log: DeadLog, capsys: pytest.CaptureFixture[str]
) -> None:
    # One command said "no log at 'x.db?fsync=0'", another "URL options are
    # not supported".
    url = dead_log.url + "?fsync=0&busy_timeout=2.5"
    assert main(["dlq", "list", TOPIC, "-g", GROUP, "--log", url]) == ExitCode.OK
    assert main(["status", TOPIC, "-g", "x", "--log", url]) == ExitCode.FAILURE
    assert main(["topic", "describe", TOPIC, "--log", url]) == ExitCode.OK
    capsys.readouterr()
    bad = dead_log.url + "?fsycn=0"
    for args in (
        ["dlq", "list", TOPIC, "-g", GROUP],
        ["status", TOPIC, "-g", "x"],
        ["topic", "list"],
        ["topic", "create", "new"],
        ["tail", TOPIC],
    ):
        assert main([*args, "--log", bad]) == ExitCode.ERROR, args
        err = capsys.readouterr().err
        assert "unknown option 'fsycn' for sqlite:// (it takes: fsync, busy_timeout)" in err


@pytest.mark.parametrize("command", ["list", "replay"])
def test_a_group_that_never_consumed_the_topic_is_said_so(
    dead_log: DeadLog, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # A new user's run: `dlq replay payments -g nosuchgroup` printed
    # "replayed 0 dead letters" and exited 0.
    assert (
        main(["dlq", command, TOPIC, "-g", "nosuchgroup", "--log", dead_log.url])
        == ExitCode.FAILURE
    )
    err = capsys.readouterr().err
    assert f"group 'nosuchgroup' has no dead-letter topic for {TOPIC!r}" in err
    assert f"groups that did: {GROUP!r}" in err


def test_a_huge_key_is_cut_in_text_lines_and_whole_in_json() -> None:
    from wakuwaku.cli._status import printable

    key = "k\n" + "x" * 10_000
    shown = printable(key, 200)
    assert shown.startswith("k\\u000ax") and shown.endswith("(9802 more characters)")
    assert len(shown) < 260
    assert printable(key) == "k\\u000a" + "x" * 10_000


def test_one_of_a_kind_is_singular_and_a_key_is_escaped_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``1 dead letters`` and ``key='a\\\\u0000b'`` (escaped by hand, then by repr)
    were printed; now ``1 dead letter`` and ``key='a\\x00b'``."""
    path = tmp_path / "wk.db"
    url = f"sqlite:///{path}"

    async def build() -> None:
        log = SQLiteLog(path)
        try:
            await log.create_topic(TOPIC, 1)
            await wk.Producer(log, TOPIC).publish(Order("a\x00b", min(POISON)))
            await make_consumer(log, Recorder()).drain()
            await wk.Producer(log, TOPIC).publish(Order("k", 1))  # lag 1
        finally:
            await log.close()

    asyncio.run(build())
    capsys.readouterr()

    def run(*args: str) -> str:
        main([*args, "--log", url])
        return capsys.readouterr().out

    listed = run("dlq", "list", TOPIC, "-g", GROUP)
    assert "\tkey='a\\x00b'\t" in listed
    assert listed.splitlines()[-1] == f"1 dead letter in 'wk-dlq.{GROUP}.{TOPIC}'"
    dry = run("dlq", "replay", TOPIC, "-g", GROUP, "--dry-run").splitlines()
    assert dry[0] == f"would replay 1 dead letter into {TOPIC!r} (partition 0: 1)"
    assert dry[1] == "  0@0\tkey='a\\x00b'\t-> partition 0"
    assert run("dlq", "replay", TOPIC, "-g", GROUP).startswith("replayed 1 dead letter into")
    again = run("dlq", "replay", TOPIC, "-g", GROUP)
    assert "1 matching dead letter was replayed before (use --all to replay it again)" in again
    status = run("status", TOPIC, "-g", GROUP).splitlines()
    assert "lag: 2 records" in status  # the new record and the replayed copy
    described = run("topic", "describe", TOPIC)
    assert described.startswith("topic orders: 1 partition\n")
    assert "group billing: lag 2 records;" in described


def test_shown_key_escapes_once_and_cuts_long_keys() -> None:
    from wakuwaku._text import counted, shown_key

    assert shown_key("a\x00b") == "'a\\x00b'"
    assert shown_key("it's") == '"it\'s"'
    assert shown_key("back\\slash") == "'back\\\\slash'"  # a backslash of the key, doubled
    long = shown_key("k\n" + "x" * 10_000, 200)
    assert long.startswith("'k\\nx") and long.endswith("'...(9802 more characters)")
    assert (counted(1, "key"), counted(0, "key"), counted(2, "entry", "entries")) == (
        "1 key",
        "0 keys",
        "2 entries",
    )
