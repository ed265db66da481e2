"""Configured retry and dead-letter topic names (design §6) from the command line:
``run`` consumes with them, ``status``, ``dlq`` and ``topic`` find them where the
consumer noted them."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from wakuwaku.cli import ExitCode, main
from wakuwaku.engine import TOPIC_NAMES_TOPIC

from ..engine.consumers import recorder
from .ops_kit import GROUP, TOPIC, Recorder, make_consumer

RETRY = "orders-retry"
DLQ = "orders-dlt"


class CLI:
    """Runs ``wakuwaku`` in this process against one SQLite file."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main([*args, "--log", self.url])
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> CLI:
    """A log where a consumer with configured names dead-lettered orders 3 and 8
    (unrecoverable) and gave up key ``stuck`` (two records)."""
    from wakuwaku import Producer
    from wakuwaku.logs.sqlite import SQLiteLog

    from .ops_kit import STUCK, Order

    path = tmp_path / "wk.db"

    async def build() -> None:
        async with SQLiteLog(path) as log:
            await log.create_topic(TOPIC, 2)
            orders = [Order(f"k{n % 3}", n) for n in range(10)]
            await Producer(log, TOPIC).publish_many([*orders, Order(STUCK, 100), Order(STUCK, 101)])
            await make_consumer(
                log,
                Recorder(),
                retry_topics={TOPIC: RETRY},
                dead_letter_topics={TOPIC: DLQ},
            ).drain()

    asyncio.run(build())
    return CLI(f"sqlite:///{path}", capsys)


def test_status_reads_the_configured_topics(cli: CLI) -> None:
    code, out, _ = cli("status", TOPIC, "-g", GROUP)
    assert code == ExitCode.OK
    lines = out.splitlines()
    assert lines[1] == f"retry topic {RETRY!r}, dead-letter topic {DLQ!r}"
    assert "dead letters not replayed: 4 (gave_up_retry 2, unrecoverable 2)" in lines
    code, out, _ = cli("status", TOPIC, "-g", GROUP, "--json")
    shown = json.loads(out)
    assert (shown["retry_topic"], shown["dead_letter_topic"]) == (RETRY, DLQ)


def test_dlq_list_and_replay_use_the_configured_dead_letter_topic(cli: CLI) -> None:
    code, out, _ = cli("dlq", "list", TOPIC, "-g", GROUP)
    assert code == ExitCode.OK
    assert out.splitlines()[-1] == f"4 dead letters in {DLQ!r}"
    code, out, _ = cli("dlq", "replay", TOPIC, "-g", GROUP, "--reason", "unrecoverable")
    assert code == ExitCode.OK and out.startswith("replayed 2 dead letters into 'orders'")
    code, out, _ = cli("topic", "list")
    assert f"{DLQ}.replayed\t2" in out.splitlines()
    code, out, _ = cli("status", TOPIC, "-g", GROUP)
    assert "dead letters replayed: 2 (unrecoverable 2)" in out.splitlines()


@pytest.mark.parametrize(
    ("command", "name", "word"),
    [
        ("status", RETRY, "retry"),
        ("status", f"{DLQ}.replayed", "replay ledger"),
        ("dlq list", DLQ, "dead-letter"),
        ("dlq replay", DLQ, "dead-letter"),
    ],
)
def test_a_configured_topic_given_as_the_main_topic_is_named(
    cli: CLI, command: str, name: str, word: str
) -> None:
    code, _, err = cli(*command.split(), name, "-g", GROUP)
    assert code == ExitCode.ERROR
    assert (
        f"{name!r} is the {word} topic of group {GROUP!r} for topic {TOPIC!r} (configured): "
        f"give the main topic {TOPIC!r} with --group {GROUP}"
    ) in err


@pytest.mark.parametrize("name", [RETRY, DLQ, TOPIC_NAMES_TOPIC, f"ns.{TOPIC_NAMES_TOPIC}"])
def test_topic_create_refuses_the_engines_topics(cli: CLI, name: str) -> None:
    code, _, err = cli("topic", "create", name)
    assert code == ExitCode.ERROR
    assert "create the main topic instead" in err or "the consumer creates it" in err


@pytest.mark.parametrize(
    "name", [RETRY, DLQ, TOPIC_NAMES_TOPIC, f"wk-retry.{GROUP}.{TOPIC}", f"wk-dlq.{GROUP}.{TOPIC}"]
)
def test_produce_refuses_the_engines_topics(
    cli: CLI, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a new user: one line produced into a configured retry topic
    # quarantined a key for the whole retry delay, and one into the
    # topic-names topic made every command warn about a broken record.
    line = '{"type": "t", "key": "a", "body": {}}\n'
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(line))
    code, _, err = cli("produce", name)
    assert code == ExitCode.ERROR
    assert "only the consumer writes it" in err or "configured topic names" in err
    assert "produced" not in err


def test_topic_delete_takes_a_configured_dead_letter_topics_ledger_and_names_kept_topics(
    cli: CLI,
) -> None:
    assert cli("dlq", "replay", TOPIC, "-g", GROUP)[0] == ExitCode.OK
    code, out, _ = cli("topic", "delete", DLQ, "--yes")
    assert (code, out) == (0, f"topic {DLQ} deleted, with its replay ledger {DLQ}.replayed\n")
    code, out, _ = cli("topic", "delete", RETRY, "--yes")
    assert (code, out) == (0, f"topic {RETRY} deleted\n")
    code, out, _ = cli("topic", "delete", TOPIC, "--yes")
    assert (code, out) == (
        0,
        f"topic {TOPIC} deleted (its groups' wk-retry.*, wk-dlq.* and wk-replayed.* "
        f"topics and configured {DLQ}, {RETRY} are kept: delete them by name when they "
        "are no longer needed)\n",
    )
    code, out, _ = cli("topic", "list")
    # What is left is the engine's own: the topic names, the group's control topic.
    assert out == f"wk-control.{GROUP}\t1\n{TOPIC_NAMES_TOPIC}\t1\n"


def test_run_consumes_with_the_names_its_consumer_configures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "log.db"
    asyncio.run(recorder.seed(str(db), 6))
    monkeypatch.setenv("WK_TEST_OUT", str(tmp_path / "handled.txt"))
    monkeypatch.setenv("WK_TEST_FAIL", "2")
    monkeypatch.setenv("WK_TEST_DEAD_LETTER_TOPIC", "ticks-dlt")
    monkeypatch.setattr(sys, "path", list(sys.path))
    cli = CLI(f"sqlite:///{db}", capsys)
    code, _, err = cli("run", "tests.engine.consumers.recorder:build", "--drain")
    assert code == ExitCode.OK
    assert "dead_letter_topics=['ticks-dlt']" in err
    assert "retry_topics=['wk-retry.recorder.ticks']" in err
    code, out, _ = cli("dlq", "list", "ticks", "-g", "recorder")
    assert code == ExitCode.OK and out.splitlines()[-1] == "1 dead letter in 'ticks-dlt'"
