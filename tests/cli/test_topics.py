"""``wakuwaku topic`` and ``tail`` on SQLite files in tmp_path (design §3, §14); the
helpers here serve ``test_produce.py`` too."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from wakuwaku import LogUnavailableError, UnknownTopicError, partition_for
from wakuwaku.cli import ExitCode, _topics, main
from wakuwaku.logs.sqlite import SQLiteLog


class CLI:
    """Runs ``wakuwaku`` in this process against one SQLite file."""

    def __init__(self, path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main([*args, "--log", self.url])
        out, err = self.capsys.readouterr()
        return code, out, err

    def records(self, topic: str, partition: int) -> list[Any]:
        async def read() -> list[Any]:
            async with SQLiteLog(self.path) as log:
                return await log.read(topic, partition, 0, max_records=10_000)

        return asyncio.run(read())

    def commit(self, group: str, topic: str, partition: int, offset: int) -> None:
        async def commit() -> None:
            async with SQLiteLog(self.path) as log:
                await log.commit(group, topic, partition, offset)

        asyncio.run(commit())


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> CLI:
    return CLI(tmp_path / "log.db", capsys)


def lines_file(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "input.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


# -- topic ------------------------------------------------------------------


def test_create_is_idempotent_and_refuses_another_count(cli: CLI) -> None:
    assert cli("topic", "create", "orders", "--partitions", "3") == (
        ExitCode.OK,
        "topic orders created with 3 partitions\n",
        "",
    )
    again = cli("topic", "create", "orders", "-p", "3")
    assert again == (ExitCode.OK, "topic orders exists with 3 partitions\n", "")
    code, out, err = cli("topic", "create", "orders", "-p", "5")
    assert code == ExitCode.ERROR and out == ""
    assert "exists with 3 partitions, but 5 were requested" in err


def test_create_refuses_bad_names_and_counts(cli: CLI) -> None:
    code, _, err = cli("topic", "create", "bad name", "-p", "1")
    assert code == ExitCode.ERROR and "invalid topic name" in err
    code, _, err = cli("topic", "create", "orders", "-p", "0")
    assert code == ExitCode.USAGE


def test_list_and_describe(cli: CLI) -> None:
    cli("topic", "create", "orders", "-p", "2")
    cli("topic", "create", "audit", "-p", "1")
    assert cli("topic", "list")[1] == "audit\t1\norders\t2\n"
    assert [json.loads(line) for line in cli("topic", "list", "--json")[1].splitlines()] == [
        {"topic": "audit", "partitions": 1},
        {"topic": "orders", "partitions": 2},
    ]
    file = lines_file(
        cli.path.parent, *(json.dumps({"type": "t", "key": "k", "body": i}) for i in range(4))
    )
    cli("produce", "orders", file, "--algebra", "plain")
    partition = partition_for("k", 2)
    cli.commit("billing", "orders", partition, 1)
    code, out, _ = cli("topic", "describe", "orders")
    assert code == ExitCode.OK
    assert out.splitlines()[0] == "topic orders: 2 partitions"
    rows = {int(line.split()[0]): line.split()[1:] for line in out.splitlines()[2:4]}
    assert rows[partition] == ["0", "4", "4"] and rows[1 - partition] == ["0", "0", "0"]
    # Not "lag 3 (p0=1)", which read as if 1 were a lag too.
    assert f"group billing: lag 3 records; committed offsets p{partition}=1" in out
    described = json.loads(cli("topic", "describe", "orders", "--json")[1])
    assert described["groups"] == {"billing": {str(partition): 1}}
    assert described["offsets"][partition] == {"partition": partition, "start": 0, "end": 4}


def test_commands_other_than_create_refuse_a_missing_file(cli: CLI) -> None:
    for args in (
        ("topic", "list"),
        ("topic", "describe", "x"),
        ("tail", "x"),
        ("produce", "x", lines_file(cli.path.parent, "{}")),
    ):
        code, _, err = cli(*args)
        assert code == ExitCode.ERROR
        assert "no log at" in err and str(cli.path) in err
    assert not cli.path.exists()


def test_unknown_topic_is_an_error(cli: CLI) -> None:
    cli("topic", "create", "orders")
    for args in (
        ("topic", "describe", "nope"),
        ("tail", "nope"),
        ("produce", "nope", lines_file(cli.path.parent, "{}")),
    ):
        code, _, err = cli(*args)
        assert code == ExitCode.ERROR and "topic 'nope' does not exist" in err


def test_unknown_log_scheme_names_the_supported_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topic", "list", "--log", "amqp://broker:5672"]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert "amqp://broker:5672" in err and "sqlite://" in err and "memory://" in err


def test_log_url_from_the_environment(
    cli: CLI, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WAKUWAKU_LOG", cli.url)
    assert main(["topic", "create", "from-env", "-p", "2"]) == ExitCode.OK
    assert main(["topic", "list"]) == ExitCode.OK
    assert capsys.readouterr().out.endswith("from-env\t2\n")


# -- tail ---------------------------------------------------------------------


def produce_numbers(cli: CLI, topic: str, count: int, key: str = "k") -> None:
    code, _, err = cli(
        "produce",
        topic,
        lines_file(
            cli.path.parent,
            *(json.dumps({"type": "t", "key": key, "body": i}) for i in range(count)),
        ),
        "--algebra",
        "plain",
    )
    assert code == ExitCode.OK, err


def tailed(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_tail_prints_the_last_ten_by_default(cli: CLI) -> None:
    cli("topic", "create", "orders")
    produce_numbers(cli, "orders", 25)
    code, out, _ = cli("tail", "orders")
    assert code == ExitCode.OK
    assert [r["body"] for r in tailed(out)] == list(range(15, 25))
    first = tailed(out)[0]
    assert (first["topic"], first["partition"], first["offset"]) == ("orders", 0, 15)
    assert first["headers"] == {"wk-v": "1", "wk-type": "t", "wk-key": "k", "wk-alg": "plain"}
    assert isinstance(first["timestamp"], float)


def test_tail_from_beginning_offset_partition_and_max(cli: CLI) -> None:
    cli("topic", "create", "orders", "-p", "2")
    produce_numbers(cli, "orders", 5, key="a")
    produce_numbers(cli, "orders", 3, key="d")
    pa, pb = partition_for("a", 2), partition_for("d", 2)
    assert pa != pb
    everything = tailed(cli("tail", "orders", "--from-beginning")[1])
    assert sorted((r["partition"], r["offset"]) for r in everything) == sorted(
        [(pa, o) for o in range(5)] + [(pb, o) for o in range(3)]
    )
    only_a = tailed(cli("tail", "orders", "--partition", str(pa), "--offset", "3")[1])
    assert [(r["partition"], r["body"]) for r in only_a] == [(pa, 3), (pa, 4)]
    capped = tailed(cli("tail", "orders", "--from-beginning", "--max", "6")[1])
    assert len(capped) == 6
    code, _, err = cli("tail", "orders", "--partition", "2")
    assert code == ExitCode.ERROR and "--partition 2 does not exist" in err
    code, _, _ = cli("tail", "orders", "--from-beginning", "--offset", "1")
    assert code == ExitCode.USAGE


def test_tail_shows_bodies_and_headers_that_are_not_json_or_utf8(cli: CLI) -> None:
    cli("topic", "create", "raw")

    async def append() -> None:
        async with SQLiteLog(cli.path) as log:
            await log.append(
                "raw",
                0,
                [
                    ({"bin": b"\xff\x00", "text": "é".encode()}, b"\xff\xfe\x00"),
                    ({}, "plain words, ü".encode()),
                    ({}, b""),
                    ({}, b'{"a": [1, null]}'),
                ],
            )

    asyncio.run(append())
    records = tailed(cli("tail", "raw", "--from-beginning")[1])
    assert records[0]["headers"] == {"bin": {"base64": "/wA="}, "text": "é"}
    assert records[0]["body_base64"] == "//4A" and "body" not in records[0]
    assert records[1]["body_text"] == "plain words, ü"
    assert records[2]["body_text"] == ""
    assert records[3]["body"] == {"a": [1, None]}


def test_tail_follow_prints_records_as_they_arrive(cli: CLI) -> None:
    cli("topic", "create", "orders")
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wakuwaku",
            "tail",
            "orders",
            "--follow",
            "--max",
            "3",
            "--log",
            cli.url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert follower.stdout is not None
        produce_numbers(cli, "orders", 1)
        first = json.loads(follower.stdout.readline())  # printed while it keeps following
        assert first["body"] == 0
        assert follower.poll() is None
        produce_numbers(cli, "orders", 2)
        rest, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
        follower.wait()
    assert follower.returncode == 0, err
    assert [json.loads(line)["body"] for line in rest.splitlines()] == [0, 1]


def test_topic_delete_and_group_delete_clean_up(cli: CLI) -> None:
    assert cli("topic", "create", "orders", "-p", "2")[0] == 0
    assert cli("topic", "create", "other")[0] == 0
    cli.commit("g", "orders", 0, 0)
    cli.commit("g", "orders", 1, 0)
    cli.commit("g", "other", 0, 0)
    code, out, _ = cli("group", "delete", "g", "--topic", "orders", "--yes")
    assert (code, out) == (
        0,
        "group g: 2 committed offsets deleted on topic orders (its "
        "wk-retry.g.* and wk-dlq.g.* topics, and configured ones, are kept)\n",
    )
    code, out, _ = cli("topic", "delete", "orders", "--yes")
    assert code == 0 and out.startswith("topic orders deleted (its groups' wk-retry.*")
    for args in (("--yes",), ()):  # refused before asking
        code, _, err = cli("topic", "delete", "orders", *args)
        # as every other unknown topic: not "no topic orders" with exit status 1
        assert (code, err) == (ExitCode.ERROR, f"error: {UnknownTopicError('orders')}\n")
    code, out, _ = cli("topic", "list", "--json")
    assert [json.loads(line)["topic"] for line in out.splitlines()] == ["other"]
    code, out, _ = cli("group", "delete", "g", "--yes")
    assert (code, out) == (
        0,
        "group g: 1 committed offset deleted (its wk-retry.g.* and wk-dlq.g.* topics, "
        "and configured ones, are kept)\n",
    )
    code, _, err = cli("group", "delete", "g", "--topic", "nope", "--yes")
    assert code == ExitCode.ERROR and "nope" in err


def test_topic_delete_asks_first(cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("topic", "create", "orders")[0] == 0
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("n\n"))
    code, _, err = cli("topic", "delete", "orders")
    assert code == ExitCode.FAILURE and "nothing deleted" in err  # "no" is no SIGINT
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(""))  # no answer at all
    code, _, err = cli("topic", "delete", "orders")
    assert code == ExitCode.FAILURE and "nothing deleted" in err
    code, out, _ = cli("topic", "list", "--json")
    assert [json.loads(line)["topic"] for line in out.splitlines()] == ["orders"]
    code, _, err = cli("topic", "create", "wk-dlq.g.orders")
    assert code == ExitCode.ERROR and "the consumer creates it" in err

    async def create_internal() -> None:
        async with SQLiteLog(cli.path) as log:
            await log.create_topic("wk-dlq.g.orders", 1)

    asyncio.run(create_internal())
    code, out, _ = cli("topic", "delete", "wk-dlq.g.orders", "--yes")
    assert (code, out) == (0, "topic wk-dlq.g.orders deleted\n")
    code, _, err = cli("group", "delete", "nosuchgroup", "--yes")
    assert code == ExitCode.FAILURE and "group nosuchgroup has no committed offset" in err
    code, _, err = cli("group", "delete", "bad.name", "--yes")
    assert code == ExitCode.ERROR and "invalid consumer group name 'bad.name'" in err


def test_deleting_a_dead_letter_topic_deletes_its_replay_ledger(cli: CLI) -> None:
    # Kept, the ledger would mark the next dead letters at the same offsets as
    # replayed already, and `dlq replay` would skip them.
    async def create() -> None:
        async with SQLiteLog(cli.path) as log:  # the engine's own topics: not by `topic create`
            for name in ("wk-dlq.g.orders", "wk-replayed.g.orders", "wk-replayed.h.orders"):
                await log.create_topic(name, 1)

    asyncio.run(create())
    code, out, _ = cli("topic", "delete", "wk-dlq.g.orders", "--yes")
    assert (code, out) == (
        0,
        "topic wk-dlq.g.orders deleted, with its replay ledger wk-replayed.g.orders\n",
    )
    code, out, _ = cli("topic", "list", "--json")
    assert [json.loads(line)["topic"] for line in out.splitlines()] == ["wk-replayed.h.orders"]


class _FlakyReads:
    """``inner``, except that the first ``failures`` reads of ``partitions``
    (all when None) raise LogUnavailableError."""

    def __init__(self, inner: Any, failures: int, partitions: set[int] | None = None) -> None:
        self.inner = inner
        self.failures = failures
        self.partitions = partitions

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read(self, topic: str, partition: int, *args: Any, **kwargs: Any) -> Any:
        if self.failures and (self.partitions is None or partition in self.partitions):
            self.failures -= 1
            raise LogUnavailableError("log down (scripted)")
        return await self.inner.read(topic, partition, *args, **kwargs)


async def test_tail_follow_rides_out_an_unreachable_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen: `tail -f` on an Iggy log ended with exit 3 when the server was
    # restarted, though it promises to print new records until Ctrl-C.
    monkeypatch.setattr(_topics, "_FOLLOW_RETRY", 0.01)
    async with SQLiteLog(tmp_path / "log.db") as log:
        await log.create_topic("orders", 3)
        for p in range(3):
            await log.append("orders", p, [({}, str(10 * p + n).encode()) for n in range(2)])
        flaky = _FlakyReads(log, failures=3)
        await asyncio.wait_for(
            _topics._tail(flaky, "orders", 0, "beginning", True, 2),  # type: ignore[arg-type]
            10,
        )
        out, err = capsys.readouterr()
        assert [r["body"] for r in tailed(out)] == [0, 1]
        assert err.count("log down (scripted); reading again every") == 1
        assert err.count("the log answers again after") == 1
        # One partition down: the others keep printing, and it is said once.
        flaky = _FlakyReads(log, failures=4, partitions={1})
        await asyncio.wait_for(
            _topics._tail(flaky, "orders", None, "beginning", True, 6),  # type: ignore[arg-type]
            10,
        )
        out, err = capsys.readouterr()
        assert sorted(r["body"] for r in tailed(out)) == [0, 1, 10, 11, 20, 21]
        assert err.count("log down (scripted); reading again every") == 1
        assert err.count("the log answers again after") == 1
        # Without --follow the same outage ends the command (exit 3, as before).
        with pytest.raises(LogUnavailableError):
            await _topics._tail(
                _FlakyReads(log, failures=1),  # type: ignore[arg-type]
                "orders",
                0,
                "beginning",
                False,
                None,
            )
