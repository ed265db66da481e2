"""``wakuwaku produce`` (design §3): the headers the Python producer writes, the
algebra taken from the application's types, all lines checked before any is
written, a dry run, and what an interrupted or failing write says."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from wakuwaku import LogUnavailableError, Producer, Registry, event, partition_for
from wakuwaku._records import ValidHeaders, validate_headers
from wakuwaku.cli import ExitCode
from wakuwaku.logs.sqlite import SQLiteLog

from .test_topics import CLI, cli, lines_file

__all__ = ("cli",)  # the fixture, used by name

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.cli.test_produce:registry"

registry = Registry()


@event("shop.order-placed", key="order", algebra="idempotent", registry=registry)
class Placed(msgspec.Struct):
    order: str
    total: int


@event("shop.order-noted", key="order", registry=registry)
class Noted(msgspec.Struct):
    order: str


def envelope(key: str = "o-17", **fields: Any) -> str:
    document = {"type": "shop.order-placed", "key": key, "body": {"order": key, "total": 5}}
    document.update(fields)
    return json.dumps(document)


def reported(err: str) -> dict[int, str]:
    """``line N...: why`` lines of stderr, by line number."""
    found = {}
    for text in err.splitlines():
        if text.startswith("line "):
            found[int(text.partition(": ")[0].split()[1])] = text
    return found


def ends(cli: CLI, topic: str, partitions: int) -> int:
    return sum(len(cli.records(topic, p)) for p in range(partitions))


# -- what is written ---------------------------------------------------------


def test_produce_envelopes_writes_what_the_python_producer_writes(cli: CLI) -> None:
    cli("topic", "create", "orders", "-p", "4")
    line = envelope(alg="idempotent", props={"tenant": "東京"})
    code, out, err = cli("produce", "orders", lines_file(cli.path.parent, line))
    assert (code, out) == (ExitCode.OK, "")
    assert "produced 1 record to orders" in err

    async def python_producer() -> Any:
        async with SQLiteLog(cli.path) as log:
            published = await Producer(log, "orders").publish(
                Placed("o-17", 5), properties={"tenant": "東京"}
            )
            return published, await log.read("orders", published.partition, 0)

    published, (from_cli, from_python) = asyncio.run(python_producer())
    assert published.partition == partition_for("o-17", 4)
    assert from_cli.headers == from_python.headers
    assert from_cli.body == from_python.body


def test_an_envelope_without_alg_takes_the_algebra_the_apps_type_declares(cli: CLI) -> None:
    """It was stamped ``wk-alg: plain`` whatever the type said: the consumer
    dead-lettered the record ``algebra_mismatch``, and a replay could not fix it."""
    cli("topic", "create", "orders", "-p", "2")
    code, _, err = cli("produce", "orders", lines_file(cli.path.parent, envelope()), "--app", APP)
    assert code == ExitCode.OK, err
    [record] = cli.records("orders", partition_for("o-17", 2))
    assert record.headers["wk-alg"] == b"idempotent"
    types = {t.tag: t for t in registry}
    assert isinstance(validate_headers(record.headers, types), ValidHeaders)


def test_without_an_algebra_a_line_is_refused_naming_its_type(cli: CLI) -> None:
    cli("topic", "create", "orders")
    code, _, err = cli("produce", "orders", lines_file(cli.path.parent, envelope()))
    assert code == ExitCode.FAILURE
    assert reported(err)[1] == (
        "line 1 (key 'o-17'): type 'shop.order-placed' has no algebra: the line has no "
        '"alg" and --algebra was not given; give one, or --app MODULE[:ATTR] whose event '
        "types declare it (a consumer dead-letters a record whose wk-alg is not its type's)"
    )
    assert cli.records("orders", 0) == []


@pytest.mark.parametrize(
    ("line", "args", "problem"),
    [
        (
            envelope(alg="plain"),
            (),
            "type 'shop.order-placed' is idempotent in --app tests.cli.test_produce:registry, "
            'but "alg" says plain',
        ),
        (envelope(), ("--algebra", "associative"), "but --algebra says associative"),
        (
            json.dumps({"type": "shop.nope", "key": "k", "body": {}}),
            (),
            "type 'shop.nope' is not one of --app tests.cli.test_produce:registry's types",
        ),
        (
            json.dumps({"type": "shop.order-placed", "key": "k", "body": {"order": "k"}}),
            (),
            "the body is not a 'shop.order-placed' as --app",
        ),
    ],
)
def test_a_line_the_apps_consumer_would_dead_letter_is_refused(
    cli: CLI, line: str, args: tuple[str, ...], problem: str
) -> None:
    cli("topic", "create", "orders")
    file = lines_file(cli.path.parent, line)
    code, _, err = cli("produce", "orders", file, "--app", APP, *args)
    assert code == ExitCode.FAILURE
    assert problem in reported(err)[1]
    assert cli.records("orders", 0) == []


def test_app_takes_a_module_or_what_run_takes(
    cli: CLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli("topic", "create", "ticks")
    monkeypatch.setattr(sys, "path", list(sys.path))  # --app puts the cwd first, as run does
    (tmp_path / "wk_produce_app.py").write_text(
        "import msgspec, wakuwaku\n"
        "@wakuwaku.event('tests.produce.counted', key='k', algebra='associative')\n"
        "class Counted(msgspec.Struct):\n"
        "    k: str\n"
        "    n: int\n"
        "    def combine(self, other): return Counted(self.k, self.n + other.n)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WK_TEST_OUT", str(tmp_path / "out.txt"))
    try:
        line = json.dumps({"type": "tests.produce.counted", "key": "a", "body": {"k": "a", "n": 1}})
        file = lines_file(tmp_path, line)
        assert cli("produce", "ticks", file, "--app", "wk_produce_app")[0] == ExitCode.OK
        assert cli.records("ticks", 0)[0].headers["wk-alg"] == b"associative"
        # run's MODULE:ATTR: a consumer factory (its handlers' types)
        monkeypatch.syspath_prepend(str(ROOT))
        tick = json.dumps(
            {"type": "tests.recorder.tick", "key": "a", "body": {"key": "a", "id": 1}}
        )
        app = "tests.engine.consumers.recorder:build"
        code, _, err = cli("produce", "ticks", lines_file(tmp_path, tick), "--app", app)
        assert code == ExitCode.OK, err
        code, _, err = cli("produce", "ticks", lines_file(tmp_path, line), "--app", app)
        assert code == ExitCode.FAILURE and "not one of --app" in err
        code, _, err = cli("produce", "ticks", file, "--app", "wk_no_such_module_xyz")
        assert code == ExitCode.USAGE and "--app" in err and "no module named" in err
    finally:
        sys.modules.pop("wk_produce_app", None)
    assert len(cli.records("ticks", 0)) == 2


def test_plain_bodies_with_type_and_key_field(cli: CLI) -> None:
    cli("topic", "create", "stock", "-p", "3")
    file = lines_file(cli.path.parent, '{"sku": "a-1", "n": 2}', '{"sku": 42, "n": 1}')
    args = ("--type", "stock.added", "--key-field", "sku", "--algebra", "associative")
    code, _, err = cli("produce", "stock", file, *args)
    assert code == ExitCode.OK and "produced 2 records" in err
    for key, body in (("a-1", {"sku": "a-1", "n": 2}), ("42", {"sku": 42, "n": 1})):
        records = cli.records("stock", partition_for(key, 3))
        match = [r for r in records if r.headers["wk-key"] == key.encode()]
        assert len(match) == 1
        assert match[0].headers == {
            "wk-v": b"1",
            "wk-type": b"stock.added",
            "wk-key": key.encode(),
            "wk-alg": b"associative",
        }
        assert msgspec.json.decode(match[0].body) == body


# -- all or nothing ------------------------------------------------------------


def test_one_bad_line_refuses_the_file_each_named_and_nothing_is_written(cli: CLI) -> None:
    """The good lines were written and the bad ones reported: running the fixed
    file again wrote the good ones twice."""
    cli("topic", "create", "orders", "-p", "1")
    good = json.dumps({"type": "t", "key": "k", "body": {"n": 1}, "alg": "plain"})
    lines = [
        good,  # 1
        "not json",  # 2
        json.dumps({"type": "t", "body": {}}),  # 3 no key
        json.dumps({"type": "t", "key": None, "body": {}}),  # 4
        json.dumps({"type": "t", "key": "", "body": {}}),  # 5
        json.dumps({"type": "t", "key": True, "body": {}}),  # 6
        json.dumps({"key": "k", "body": {}}),  # 7 no type
        json.dumps({"type": "t", "key": "k"}),  # 8 no body
        json.dumps({"type": "t", "key": "k", "body": 1, "alg": "x"}),  # 9
        json.dumps({"type": "t", "key": "k", "body": 1, "props": {"n": 1}}),  # 10
        "[1, 2]",  # 11
        "",  # 12 blank: skipped
        good,  # 13
        '{"type": "t", "key": "a", "key": "b", "body": 1}',  # 14 which key?
        json.dumps({"type": "t", "key": " \t", "body": 1}),  # 15 whitespace key
        json.dumps({"type": "t", "key": "a\x00b", "body": 1, "partition": 1}),  # 16
        json.dumps({"type": "t", "key": "k", "body": 1}),  # 17 no algebra
    ]
    code, out, err = cli("produce", "orders", lines_file(cli.path.parent, *lines))
    assert code == ExitCode.FAILURE and out == ""
    found = reported(err)
    assert sorted(found) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 15, 16, 17]
    assert found[2].startswith("line 2: not JSON")
    # A missing key is not a null one.
    assert found[3] == 'line 3: no usable key: "key" is missing'
    assert found[4] == 'line 4: no usable key: "key" is null'
    assert found[9] == "line 9 (key 'k'): unknown algebra \"alg\": 'x'"
    assert found[14] == "line 14: duplicate key 'key' in a JSON object"
    assert found[15] == 'line 15: no usable key: "key" is " \\t"'  # real data writes " " for none
    # an unknown field is an error, not ignored; the key is text, escaped once
    assert found[16].startswith(
        "line 16 (key 'a\\x00b'): unknown envelope field \"partition\" (the partition "
        "comes from the key): an envelope has type, key, body, props, alg"
    )
    assert found[17].startswith("line 17 (key 'k'): type 't' has no algebra")
    assert "refused 14 of 16 lines; nothing written (fix them and run again)" in err
    assert "produced" not in err
    assert cli.records("orders", 0) == []


def test_a_line_that_is_not_utf8_refuses_the_file(cli: CLI) -> None:
    cli("topic", "create", "orders")
    path = cli.path.parent / "input.jsonl"
    good = json.dumps({"type": "t", "key": "k", "body": 1}).encode()
    path.write_bytes(good + b'\n{"type": "t", "key": "\xff", "body": 1}\n' + good + b"\n")
    code, _, err = cli("produce", "orders", str(path), "--algebra", "plain")
    assert code == ExitCode.FAILURE
    assert reported(err) == {2: "line 2: not UTF-8"}
    assert cli.records("orders", 0) == []


def test_a_plain_body_without_the_key_field_refuses_the_file(cli: CLI) -> None:
    cli("topic", "create", "stock")
    file = lines_file(cli.path.parent, '{"n": 1}', '{"sku": "a"}', '{"sku": null}')
    args = ("--type", "s", "--key-field", "sku", "--algebra", "plain")
    code, _, err = cli("produce", "stock", file, *args)
    assert code == ExitCode.FAILURE
    assert reported(err) == {
        1: "line 1: no usable key: field 'sku' is missing",
        3: "line 3: no usable key: field 'sku' is null",
    }
    assert cli.records("stock", 0) == []


def test_a_record_over_the_logs_size_limit_is_named_like_any_bad_line(
    cli: CLI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It refused the whole file at the append, without its line number, and
    showed the key as b'...'."""
    cli("topic", "create", "orders", "-p", "2")
    monkeypatch.setattr(SQLiteLog, "max_record_size", property(lambda self: 200))
    small = json.dumps({"type": "t", "key": "k1", "body": 1, "alg": "plain"})
    big = json.dumps({"type": "t", "key": "k2\n", "body": "x" * 300, "alg": "plain"})
    code, _, err = cli("produce", "orders", lines_file(cli.path.parent, small, big, small))
    assert code == ExitCode.FAILURE
    assert reported(err) == {
        2: "line 2 (key 'k2\\n'): the record is 335 bytes (body and headers); the log "
        "takes records of at most 200 bytes (max_record_size)"
    }
    assert "b'" not in err
    assert ends(cli, "orders", 2) == 0


def test_dry_run_checks_prints_and_writes_nothing(cli: CLI) -> None:
    cli("topic", "create", "orders", "-p", "2")
    file = lines_file(cli.path.parent, envelope("o-1"), "", envelope("o-2\x00"))
    code, out, err = cli("produce", "orders", file, "--app", APP, "--dry-run")
    assert code == ExitCode.OK, err
    p1, p2 = partition_for("o-1", 2), partition_for("o-2\x00", 2)
    assert out.splitlines() == [
        f"line 1\tkey='o-1'\ttype=shop.order-placed\talg=idempotent\tpartition={p1}\tbytes=79",
        f"line 3\tkey='o-2\\x00'\ttype=shop.order-placed\talg=idempotent\tpartition={p2}\tbytes=86",
    ]
    assert "would produce 2 records to orders (" in err and "nothing written" in err
    bad = lines_file(cli.path.parent, envelope("o-1"), envelope("o-2", alg="plain"))
    code, out, err = cli("produce", "orders", bad, "--app", APP, "--dry-run")
    assert code == ExitCode.FAILURE and out == ""
    assert "line 2 (key 'o-2'): type 'shop.order-placed' is idempotent" in err
    assert ends(cli, "orders", 2) == 0


@pytest.mark.parametrize(
    "args",
    [
        ("--type", "t"),
        ("--key-field", "k"),
        ("--type", " ", "--key-field", "k"),
        ("--algebra", "nope"),
    ],
)
def test_produce_usage_errors(cli: CLI, args: tuple[str, ...]) -> None:
    cli("topic", "create", "orders")
    code, _, _ = cli("produce", "orders", lines_file(cli.path.parent, "{}"), *args)
    assert code == ExitCode.USAGE
    assert cli.records("orders", 0) == []


def test_produce_reads_stdin(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    wakuwaku = [sys.executable, "-m", "wakuwaku"]
    subprocess.run(
        [*wakuwaku, "topic", "create", "orders", "--log", url], check=True, capture_output=True
    )
    lines = "".join(json.dumps({"type": "t", "key": f"k{i}", "body": i}) + "\n" for i in range(3))
    done = subprocess.run(
        [*wakuwaku, "produce", "orders", "--algebra", "plain", "--log", url],
        input=lines,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "produced 3 records to orders" in done.stderr


# -- stopping while writing ----------------------------------------------------


def test_a_log_failing_while_writing_says_which_lines_were_written(
    cli: CLI, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli("topic", "create", "orders")
    append = SQLiteLog.append
    calls = 0

    async def failing(self: SQLiteLog, *args: Any, **kwargs: Any) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise LogUnavailableError("the disk went away")
        return await append(self, *args, **kwargs)

    monkeypatch.setattr(SQLiteLog, "append", failing)
    lines = [json.dumps({"type": "t", "key": "k", "body": i}) for i in range(1200)]
    file = lines_file(cli.path.parent, *lines)
    code, _, err = cli("produce", "orders", file, "--algebra", "plain")
    assert code == ExitCode.ERROR
    assert "failed: 500 of 1200 records written to 'orders'" in err
    assert "  written: 500 lines (1-500)\n" in err
    assert (
        "  in doubt, the append under way when it stopped (see 'wakuwaku tail orders'): "
        "500 lines (501-1000)\n"
    ) in err
    assert "  not written: 200 lines (1001-1200)\n" in err
    assert "the disk went away" in err
    monkeypatch.setattr(SQLiteLog, "append", append)
    assert len(cli.records("orders", 0)) == 500


def _sigint_default() -> None:
    """In the child, before it runs: SIGINT as a terminal's Ctrl-C finds it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_while_writing_says_how_many_records_were_written(tmp_path: Path) -> None:
    """A SIGINT in the middle of the appends: the lines written, in doubt and
    not written are named, and the log holds exactly what it says."""
    db = tmp_path / "log.db"
    url = f"sqlite:///{db}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("WAKUWAKU_LOG", None)
    wakuwaku = [sys.executable, "-m", "wakuwaku"]
    subprocess.run(
        [*wakuwaku, "topic", "create", "orders", "-p", "4", "--log", url],
        check=True,
        capture_output=True,
        env=env,
    )
    count = 100_000
    path = tmp_path / "many.jsonl"
    path.write_text(
        "".join(json.dumps({"type": "t", "key": f"k{i}", "body": i}) + "\n" for i in range(count))
    )
    process = subprocess.Popen(
        [*wakuwaku, "produce", "orders", str(path), "--algebra", "plain", "--log", url],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # A run started in the background by a shell without job control
        # ignores SIGINT, and so does every process it starts: Python then
        # installs no KeyboardInterrupt handler, and the signal did nothing
        # (seen: every record written, exit 0, in test runs started so).
        preexec_fn=_sigint_default,
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()  # printed when the writing starts
        assert first.startswith(f"checked {count} lines; writing {count} records"), first
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == ExitCode.INTERRUPTED, err
    assert err.startswith("interrupted: "), f"the signal came too late to test anything: {err}"
    written = int(err.split()[1])
    assert f"interrupted: {written} of {count} records written to 'orders'" in err
    assert "not written: " in err

    async def stored() -> int:
        async with SQLiteLog(db) as log:
            return sum((await log.end_offsets("orders")).values())

    in_doubt = 0
    for text in err.splitlines():
        if text.startswith("  in doubt"):
            in_doubt = int(text.split("): ", 1)[1].split()[0])
    assert written <= asyncio.run(stored()) <= written + in_doubt
