"""Operator controls: ``wakuwaku.admin.pause``/``resume``/``pauses``,
``retry_key_now``/``give_up_key`` on every log, and ``wakuwaku pause``,
``resume``, ``pauses``, ``key retry-now`` and ``key give-up`` on a SQLite
file (``status`` shows the pauses: test_status.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import wakuwaku as wk
from wakuwaku._control import Action, Pause
from wakuwaku._records import H_SRC, Source, build_headers, encode_source
from wakuwaku.admin import (
    KeyNotQuarantinedError,
    give_up_key,
    pause,
    pauses,
    read_commands,
    resume,
    retry_key_now,
)
from wakuwaku.cli import ExitCode, main
from wakuwaku.engine import retry_topic_name
from wakuwaku.engine._retry import resolved_marker, work_common
from wakuwaku.logs import Log
from wakuwaku.logs.sqlite import SQLiteLog
from wakuwaku.testing import FakeClock

from ..log_kit import ENGINES, fresh_log
from .ops_kit import GROUP, STUCK, T0, TOPIC, Order, quarantine

RETRY = retry_topic_name(TOPIC, GROUP)


@pytest.fixture(params=ENGINES)
async def log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Log]:
    async with fresh_log(request.param, tmp_path) as created:
        yield created


def scopes(found: list[Pause]) -> list[tuple[str, int | None, str | None]]:
    return [(p.topic, p.partition, p.key) for p in found]


# ------------------------------------------------------------- library, every log


async def test_pauses_fold_in_order_and_a_topic_resume_ends_them_all(log: Log) -> None:
    await log.create_topic(TOPIC, 3)
    await log.create_topic("payments", 1)
    clock = FakeClock(T0)
    k = log.partition_for("sku-1", 3)

    await pause(log, GROUP, TOPIC, by="ana", reason="bad deploy", clock=clock)
    await pause(log, GROUP, TOPIC, partition=2, by="ana", clock=clock)
    written = await pause(log, GROUP, TOPIC, key="sku-1", by="bo", reason="poison", clock=clock)
    await pause(log, GROUP, "payments", clock=clock)
    assert (written.action, written.partition, written.key) == (Action.PAUSE, k, "sku-1")
    found = await pauses(log, GROUP)
    assert scopes(found) == [
        (TOPIC, None, None),
        (TOPIC, 2, None),
        (TOPIC, k, "sku-1"),
        ("payments", None, None),
    ]
    assert [(p.by, p.reason, p.at) for p in found[:3]] == [
        ("ana", "bad deploy", T0),
        ("ana", "", T0),
        ("bo", "poison", T0),
    ]
    assert await pauses(log, "other-group") == []

    # A key's or a partition's resume ends that pause only.
    await resume(log, GROUP, TOPIC, key="sku-1")
    await resume(log, GROUP, TOPIC, partition=2)
    assert scopes(await pauses(log, GROUP)) == [(TOPIC, None, None), ("payments", None, None)]

    # A topic's resume ends every pause of the topic, and no other topic's.
    await pause(log, GROUP, TOPIC, partition=1)
    await pause(log, GROUP, TOPIC, key="sku-1")
    await resume(log, GROUP, TOPIC)
    assert scopes(await pauses(log, GROUP)) == [("payments", None, None)]

    # Resuming what is not paused is written, and changes nothing.
    before = len(await read_commands(log, GROUP))
    await resume(log, GROUP, TOPIC, partition=0)
    commands = await read_commands(log, GROUP)
    assert len(commands) == before + 1 and commands[-1].problem is None
    assert scopes(await pauses(log, GROUP)) == [("payments", None, None)]


async def test_a_bad_scope_is_refused_and_writes_nothing(log: Log) -> None:
    await log.create_topic(TOPIC, 2)
    with pytest.raises(wk.UnknownTopicError, match="'nope' does not exist"):
        await pause(log, GROUP, "nope")
    with pytest.raises(wk.UnknownPartitionError, match="partition 2 does not exist"):
        await pause(log, GROUP, TOPIC, partition=2)
    with pytest.raises(wk.UnknownPartitionError, match="partition -1 does not exist"):
        await resume(log, GROUP, TOPIC, partition=-1)
    with pytest.raises(wk.ConfigError, match="a partition or a key, not both"):
        await pause(log, GROUP, TOPIC, partition=0, key="k")
    with pytest.raises(wk.ConfigError, match="non-empty"):
        await pause(log, GROUP, TOPIC, key="")
    with pytest.raises(wk.ConfigError, match="is the retry topic of group 'billing'"):
        await pause(log, GROUP, RETRY)
    with pytest.raises(wk.ConfigError, match="invalid consumer group name"):
        await pause(log, "no such group!", TOPIC)
    with pytest.raises(wk.ConfigError, match="the reason is 501 characters long; at most 500"):
        await pause(log, GROUP, TOPIC, reason="r" * 501)
    with pytest.raises(wk.ConfigError, match="the by is 501 characters"):
        await resume(log, GROUP, TOPIC, by="b" * 501)
    assert await read_commands(log, GROUP) == []


async def write_work(log: Log, key: str, offset: int) -> int:
    """A retry work record of ``key`` as the consumer writes one when a
    handler raises Retryable (the main record's headers, then the common
    ones, then its ``wk-src``); returns its offset."""
    partition = log.partition_for(key, 2)
    headers = {
        **build_headers(wk.event_type(Order), key),
        **work_common(T0, "Retryable: row locked", T0 + 10.0, group=GROUP),
        H_SRC: encode_source(Source(TOPIC, partition, (offset,), (f"id-{offset}",))),
    }
    body = f'{{"key": "{key}", "n": {offset}}}'.encode()
    [written] = await log.append(RETRY, partition, [(headers, body)])
    return written


async def test_a_key_command_needs_the_key_quarantined_and_is_bounded_by_its_retry_end(
    log: Log,
) -> None:
    await log.create_topic(TOPIC, 2)
    # No retry topic yet: nothing is quarantined.
    with pytest.raises(KeyNotQuarantinedError) as caught:
        await retry_key_now(log, GROUP, TOPIC, STUCK)
    assert caught.value.key == STUCK and caught.value.partition == log.partition_for(STUCK, 2)
    assert "is not quarantined in consumer group 'billing'" in str(caught.value)

    await log.create_topic(RETRY, 2, derived_from=TOPIC)
    await write_work(log, STUCK, 0)
    await write_work(log, STUCK, 1)
    # Another key, quarantined and then resolved (its work is done).
    done = await write_work(log, "done", 2)
    resolved = resolved_marker("done", done, T0 + 10.0, group=GROUP)
    await log.append(RETRY, log.partition_for("done", 2), [resolved])
    for key in ("done", "never-failed"):
        for act in (retry_key_now, give_up_key):
            with pytest.raises(KeyNotQuarantinedError):
                await act(log, GROUP, TOPIC, key)
    assert await read_commands(log, GROUP) == []

    p = log.partition_for(STUCK, 2)
    clock = FakeClock(T0)
    now = await retry_key_now(log, GROUP, TOPIC, STUCK, by="ana", clock=clock)
    end = (await log.end_offsets(RETRY))[p]
    assert (now.action, now.partition, now.key, now.through, now.by) == (
        Action.RETRY_NOW,
        p,
        STUCK,
        end,
        "ana",
    )
    later = await write_work(log, STUCK, 3)  # routed behind: past the first command
    gone = await give_up_key(log, GROUP, TOPIC, STUCK, by="bo", reason="bad data", clock=clock)
    assert gone.action is Action.GIVE_UP and gone.through == (await log.end_offsets(RETRY))[p]
    assert gone.through is not None and now.through is not None
    assert now.through <= later < gone.through
    assert [r.command for r in await read_commands(log, GROUP)] == [now, gone]
    assert await pauses(log, GROUP) == [], "one-shot commands are no pauses"


# ----------------------------------------------------- a real consumer, memory


async def test_a_key_the_consumer_quarantined_can_be_retried_now() -> None:
    log = wk.MemoryLog()
    await quarantine(log)
    command = await retry_key_now(log, GROUP, TOPIC, STUCK)
    p = wk.partition_for(STUCK, 2)
    assert command.through == (await log.end_offsets(RETRY))[p]
    assert command.by == wk.admin.operator_name()
    with pytest.raises(KeyNotQuarantinedError):
        await give_up_key(log, GROUP, TOPIC, "k1")


# ---------------------------------------------------------------- SQLite file


async def test_pauses_survive_reopening_the_log(tmp_path: Path) -> None:
    path = tmp_path / "wk.db"
    async with SQLiteLog(path) as log:
        await log.create_topic(TOPIC, 2)
        await pause(log, GROUP, TOPIC, partition=1, reason="disk full", clock=FakeClock(T0))
        before = await pauses(log, GROUP)
    async with SQLiteLog(path) as log:
        assert await pauses(log, GROUP) == before
        assert scopes(before) == [(TOPIC, 1, None)] and before[0].reason == "disk full"


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite file with ``orders`` (2 partitions) and ``payments``, no consumer."""

    async def build() -> None:
        async with SQLiteLog(tmp_path / "wk.db") as log:
            await log.create_topic(TOPIC, 2)
            await log.create_topic("payments", 1)

    asyncio.run(build())
    return f"sqlite:///{tmp_path / 'wk.db'}"


@pytest.fixture
def quarantined(tmp_path: Path) -> str:
    """A SQLite file where a consumer quarantined ``STUCK`` and stopped."""

    async def build() -> None:
        async with SQLiteLog(tmp_path / "q.db") as log:
            await quarantine(log)

    asyncio.run(build())
    return f"sqlite:///{tmp_path / 'q.db'}"


def commands_in(url: str) -> int:
    async def count() -> int:
        async with SQLiteLog(url.removeprefix("sqlite:///")) as log:
            return len(await read_commands(log, GROUP))

    return asyncio.run(count())


def test_cli_pause_pauses_and_resume(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    on = ["-g", GROUP, "--topic", TOPIC, "--log", url]
    k = wk.partition_for("sku-1", 2)
    assert main(["pause", *on, "--key", "sku-1", "--reason", "poison", "--by", "ana"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == (
        f"wrote: pause key 'sku-1' of orders (partition {k}) for group 'billing' "
        "(by ana, reason: poison)"
    )
    assert "within one poll interval" in out and "until `wakuwaku resume`" in out
    # No consumer of the group ever started here: a mistyped group?
    assert "no consumer of group 'billing' has started on topic 'orders' yet" in err

    assert main(["pause", *on, "--partition", "0"]) == ExitCode.OK
    assert main(["pause", "-g", GROUP, "--topic", "payments", "--log", url]) == ExitCode.OK
    capsys.readouterr()
    assert main(["pauses", "-g", GROUP, "--log", url]) == ExitCode.OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "group 'billing': 3 pauses in force"
    assert lines[1].startswith(f"  key 'sku-1' of orders (partition {k})  by ana  since 20")
    assert lines[1].endswith("Z  reason: poison")
    assert lines[2].startswith("  partition 0 of orders  by ")
    assert lines[2].endswith("  reason: -")
    assert lines[3].startswith("  topic payments  by ")

    assert main(["pauses", "-g", GROUP, "--json", "--log", url]) == ExitCode.OK
    data = json.loads(capsys.readouterr().out)
    assert data["control_topic"] == "wk-control.billing" and data["group"] == GROUP
    assert [(p["topic"], p["partition"], p["key"]) for p in data["pauses"]] == [
        (TOPIC, k, "sku-1"),
        (TOPIC, 0, None),
        ("payments", None, None),
    ]
    assert data["pauses"][0]["by"] == "ana" and isinstance(data["pauses"][0]["at"], float)

    # A partition's resume ends that one; the key's pause is still in force.
    assert main(["resume", *on, "--partition", "0"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "it ends 1 pause" in out and "  partition 0 of orders  by " in out
    assert f"still in force on orders:\n  key 'sku-1' of orders (partition {k})" in out
    # Again: nothing is paused there any more.
    assert main(["resume", *on, "--partition", "0"]) == ExitCode.OK
    assert "nothing was paused there: the command changes nothing" in capsys.readouterr().out
    # The topic's resume ends the key's pause too, not the other topic's.
    assert main(["resume", *on]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "it ends 1 pause" in out and "key 'sku-1'" in out and "still in force" not in out
    assert main(["pauses", "-g", GROUP, "--log", url]) == ExitCode.OK
    assert capsys.readouterr().out.splitlines()[1:] == [
        next(line for line in lines if "payments" in line)
    ]
    assert main(["resume", "-g", GROUP, "--topic", "payments", "--log", url]) == 0
    capsys.readouterr()
    assert main(["pauses", "-g", GROUP, "--log", url]) == ExitCode.OK
    assert capsys.readouterr().out == "group 'billing': nothing paused\n"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["pause", "--topic", "nope"], ExitCode.ERROR, "topic 'nope' does not exist"),
        (
            ["pause", "--topic", TOPIC, "--partition", "2"],
            ExitCode.ERROR,
            "topic 'orders' has 2 partitions; partition 2 does not exist",
        ),
        (
            ["resume", "--topic", TOPIC, "--partition", "-1"],
            ExitCode.ERROR,
            "partition -1 does not exist",
        ),
        (
            ["pause", "--topic", TOPIC, "--partition", "0", "--key", "k"],
            ExitCode.USAGE,
            "give --partition or --key, not both",
        ),
        (
            ["resume", "--topic", TOPIC, "--partition", "0", "--key", "k"],
            ExitCode.USAGE,
            "give --partition or --key, not both",
        ),
        (["pause", "--topic", TOPIC, "--key", ""], ExitCode.USAGE, "the key is empty"),
        (
            ["pause", "--topic", TOPIC, "--reason", "r" * 501],
            ExitCode.ERROR,
            "the reason is 501 characters long; at most 500 are kept (nothing written)",
        ),
        (["key", "retry-now", "--topic", TOPIC, "--key", ""], ExitCode.USAGE, "key is empty"),
        (["key", "give-up", "--topic", "nope", "--key", "k"], ExitCode.ERROR, "'nope' does not"),
        (
            ["pause", "--topic", RETRY],
            ExitCode.ERROR,
            "'wk-retry.billing.orders' is the retry topic of group 'billing'",
        ),
        (
            ["key", "give-up", "--topic", TOPIC, "--key", STUCK],
            ExitCode.ERROR,
            "is not quarantined in consumer group 'billing'",
        ),
    ],
)
def test_cli_bad_input_is_named_and_nothing_is_written(
    url: str, args: list[str], code: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*args, "-g", GROUP, "--log", url]) == code
    out, err = capsys.readouterr()
    assert message in err and out == "", err
    assert commands_in(url) == 0


def test_cli_key_commands_on_a_quarantined_key(
    quarantined: str, capsys: pytest.CaptureFixture[str]
) -> None:
    on = ["-g", GROUP, "--topic", TOPIC, "--log", quarantined]
    p = wk.partition_for(STUCK, 2)
    assert main(["key", "retry-now", *on, "--key", STUCK, "--by", "ana"]) == ExitCode.OK
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"wrote: retry-now key 'stuck' of orders (partition {p}) for group 'billing' (by ana)"
    )
    # Two records failed, a third was routed behind them: retry offsets 0-2.
    assert out[1].startswith(
        f"the consumer owning partition {p} applies it within one poll interval (when none "
        "runs, the next one to start does), to the key's work pending when asked (below "
        "offset 3 of its retry partition)"
    )
    assert out[1].endswith("its next attempt runs at once")

    args = ["key", "give-up", *on, "--key", STUCK, "--by", "bo", "--reason", "bad data"]
    assert main(args) == ExitCode.OK
    given = capsys.readouterr().out
    assert "wrote: give-up key 'stuck' of orders" in given and "(by bo, reason: bad data)" in given
    assert "with reason given_up_by_operator" in given

    # A key the group never quarantined: named, nothing written.
    assert main(["key", "retry-now", *on, "--key", "k1"]) == ExitCode.ERROR
    printed, err = capsys.readouterr()
    assert printed == ""
    assert err == (
        f"error: key 'k1' of topic 'orders' (partition {wk.partition_for('k1', 2)}) is not "
        "quarantined in consumer group 'billing': it has no pending retry work; nothing "
        "written (`wakuwaku status orders --group billing` lists the quarantined keys)\n"
    )

    async def read() -> list[tuple[Action, str | None, int | None, str]]:
        async with SQLiteLog(quarantined.removeprefix("sqlite:///")) as log:
            found = await read_commands(log, GROUP)
            return [
                (r.command.action, r.command.key, r.command.through, r.command.by)
                for r in found
                if r.command is not None
            ]

    assert asyncio.run(read()) == [
        (Action.RETRY_NOW, STUCK, 3, "ana"),
        (Action.GIVE_UP, STUCK, 3, "bo"),
    ]
