"""``wakuwaku run module:attr`` (design §14): finding the consumer, draining, graceful
shutdown on SIGINT/SIGTERM in a real process, metrics, and clear errors."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import wakuwaku as wk
from wakuwaku.cli import ExitCode, main
from wakuwaku.logs.sqlite import SQLiteLog

from ..engine.consumers import recorder
from ..ports import free_port

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests.engine.consumers.recorder:build"


@pytest.fixture
def ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A SQLite log with 20 ticks on 2 partitions; WK_TEST_OUT points at the output file."""
    db, out = tmp_path / "log.db", tmp_path / "handled.txt"
    asyncio.run(recorder.seed(str(db), 20, partitions=2, keys=4))
    monkeypatch.setenv("WK_TEST_OUT", str(out))
    monkeypatch.setattr(sys, "path", list(sys.path))  # run puts the cwd first
    return f"sqlite:///{db}", out


def test_run_drain_consumes_everything_and_exits_0(
    ticks: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    url, out = ticks
    assert main(["run", TARGET, "--drain", "--log", url]) == ExitCode.OK
    assert sorted(recorder.handled_ids(str(out))) == list(range(20))
    err = capsys.readouterr().err
    assert "consumer starting" in err and "consumer stopped" in err
    # Structured fields of the engine's log records reach stderr as key=value.
    assert "group='recorder'" in err

    async def committed() -> list[int | None]:
        log = SQLiteLog(url.removeprefix("sqlite:///"))
        try:
            return [await log.committed("recorder", "ticks", p) for p in range(2)]
        finally:
            await log.close()

    ends = sum(x or 0 for x in asyncio.run(committed()))
    assert ends == 20


def test_run_exports_the_log_url_and_accepts_a_zero_arg_factory(
    ticks: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, out = ticks
    module = tmp_path / "wk_run_factory_mod.py"
    module.write_text(
        "import os\n"
        "from wakuwaku.logs import open_log\n"
        "from tests.engine.consumers.recorder import build\n"
        "URL = os.environ['WAKUWAKU_LOG']\n"
        "async def make():\n"
        "    return build(open_log(URL))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delenv("WAKUWAKU_LOG", raising=False)
    try:
        assert main(["run", "wk_run_factory_mod:make", "--drain", "--log", url]) == ExitCode.OK
        assert url == sys.modules["wk_run_factory_mod"].URL
    finally:
        sys.modules.pop("wk_run_factory_mod", None)
    assert sorted(recorder.handled_ids(str(out))) == list(range(20))


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", "is not module:attr"),
        ("tests.engine.consumers.no_such_module:build", "no module named"),
        ("tests.engine.consumers.recorder:no_such_attr", "has no attribute 'no_such_attr'"),
        ("tests.engine.consumers.recorder:NOT_CALLABLE", "is a str, not a wakuwaku Consumer"),
        ("tests.engine.consumers.recorder:not_a_consumer", "returned a int, not a wakuwaku"),
    ],
)
def test_run_refuses_a_target_that_is_not_a_consumer_with_exit_2(
    ticks: tuple[str, Path], target: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = ticks
    assert main(["run", target, "--log", url]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert message in err


def test_run_reports_a_failing_factory_or_module_with_exit_3(
    ticks: tuple[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _ = ticks
    assert main(["run", "tests.engine.consumers.recorder:broken", "--log", url]) == ExitCode.ERROR
    assert "raised RuntimeError: the factory is broken" in capsys.readouterr().err
    (tmp_path / "wk_run_broken_mod.py").write_text("import wk_missing_dependency_xyz\n")
    (tmp_path / "wk_run_raising_mod.py").write_text("raise ValueError('bad config')\n")
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["run", "wk_run_broken_mod:x", "--log", url]) == ExitCode.ERROR
        assert "importing module 'wk_run_broken_mod' failed" in capsys.readouterr().err
        assert main(["run", "wk_run_raising_mod:x", "--log", url]) == ExitCode.ERROR
        assert "ValueError: bad config" in capsys.readouterr().err
    finally:
        sys.modules.pop("wk_run_broken_mod", None)
        sys.modules.pop("wk_run_raising_mod", None)


def test_run_on_an_unknown_topic_or_a_missing_log_exits_3(
    ticks: tuple[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _ = ticks
    monkeypatch.setenv("WK_TEST_TOPIC", "nope")
    assert main(["run", TARGET, "--drain", "--log", url]) == ExitCode.ERROR
    assert "topic 'nope' does not exist" in capsys.readouterr().err
    missing = tmp_path / "missing.db"
    assert main(["run", TARGET, "--log", f"sqlite:///{missing}"]) == ExitCode.ERROR
    assert "no log at" in capsys.readouterr().err
    assert not missing.exists()
    assert main(["run", TARGET, "--log-level", "LOUD"]) == ExitCode.USAGE


# ------------------------------------------------------------- real processes


def _wait_for(condition: object, what: str, timeout: float = 30.0) -> None:
    """Poll a real process's progress (not a timing check: just waiting for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_process_gracefully_and_a_restart_goes_on(
    ticks: tuple[str, Path], sig: signal.Signals
) -> None:
    url, out = ticks
    env = {**os.environ, "WK_TEST_HANDLE_SECONDS": "0.05"}
    env.pop("WAKUWAKU_LOG", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "wakuwaku", "run", TARGET, "--log", url],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: len(recorder.handled_ids(str(out))) >= 3, "3 handled events")
        process.send_signal(sig)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == ExitCode.OK, err
    assert "signal received; stopping gracefully" in err
    assert f"signal='{sig.name}'" in err
    before = recorder.handled_ids(str(out))
    assert len(before) < 20, "the signal came too late to test anything"
    drained = subprocess.run(
        [sys.executable, "-m", "wakuwaku", "run", TARGET, "--drain", "--log", url],
        cwd=ROOT,
        env={**env, "WK_TEST_HANDLE_SECONDS": "0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert drained.returncode == ExitCode.OK, drained.stderr
    assert set(recorder.handled_ids(str(out))) == set(range(20)), "an event was lost"


@pytest.mark.slow
def test_run_serves_prometheus_metrics(ticks: tuple[str, Path]) -> None:
    pytest.importorskip("prometheus_client")
    url, out = ticks
    port = free_port()
    env = {**os.environ, "WK_TEST_FAIL": "7"}
    env.pop("WAKUWAKU_LOG", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wakuwaku",
            "run",
            TARGET,
            "--log",
            url,
            "--metrics-port",
            str(port),
            "--metrics-addr",
            "127.0.0.1",
        ],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    scraped = ""

    def done() -> bool:
        nonlocal scraped
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                scraped = r.read().decode()
        except OSError:
            return False
        return 'wakuwaku_handled_records_total{group="recorder"} 19.0' in scraped

    try:
        _wait_for(done, "the metrics to show 19 handled records")
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == ExitCode.OK
    assert 'wakuwaku_dead_letters_total{group="recorder",reason="unrecoverable"} 1.0' in scraped
    assert 'wakuwaku_handler_failures_total{class="unrecoverable",group="recorder"} 1.0' in scraped
    assert len(recorder.handled_ids(str(out))) == 19


def test_the_consumer_module_of_docs_operations_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python block of docs/operations.md, saved as billing/consumer.py, runs as shown."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert block.startswith("# billing/consumer.py")
    package = tmp_path / "billing"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "consumer.py").write_text(block)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    db = tmp_path / "log.db"
    try:
        import billing.consumer as doc  # type: ignore[import-not-found]

        async def seed() -> None:
            log = SQLiteLog(db)
            try:
                await log.create_topic("payments", 2)
                await wk.Producer(log, "payments").publish_many(
                    doc.PaymentReceived(account, cents)
                    for account, cents in [("a", 5), ("b", 7), ("a", 10)]
                )
            finally:
                await log.close()

        asyncio.run(seed())
        assert (
            main(["run", "billing.consumer:build", "--drain", "--log", f"sqlite:///{db}"])
            == ExitCode.OK
        )
        assert doc.totals == {"a": 15, "b": 7}
    finally:
        for name in ("billing", "billing.consumer"):
            sys.modules.pop(name, None)


def test_metrics_listen_on_loopback_unless_asked(
    ticks: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--metrics-port`` alone served every interface (0.0.0.0)."""
    pytest.importorskip("prometheus_client")
    import wakuwaku.metrics

    bound: list[tuple[int, str]] = []

    def start(port: int, addr: str = "", **_: object) -> None:
        bound.append((port, addr))

    monkeypatch.setattr(wakuwaku.metrics, "start_http_server", start)
    url, _ = ticks
    assert main(["run", TARGET, "--drain", "--metrics-port", "9100", "--log", url]) == ExitCode.OK
    addr = "0.0.0.0"
    assert (
        main(
            [
                "run",
                TARGET,
                "--drain",
                "--metrics-port",
                "9100",
                "--metrics-addr",
                addr,
                "--log",
                url,
            ]
        )
        == ExitCode.OK
    )
    assert bound == [(9100, "127.0.0.1"), (9100, "0.0.0.0")]


@pytest.mark.slow
def test_a_second_sigint_stops_at_once_naming_what_is_left(
    ticks: tuple[str, Path], tmp_path: Path
) -> None:
    """As uvicorn, dramatiq and celery do: the first SIGINT waits for running
    chunks (up to shutdown_timeout, 30 s), the second cancels them now. The
    handler here takes 120 s a call; without the second signal taking over,
    the process outlives the test's deadline."""
    url, out = ticks
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "WK_TEST_HANDLE_SECONDS": "120", "WK_TEST_CALLS": str(calls)}
    env.pop("WAKUWAKU_LOG", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "wakuwaku", "run", TARGET, "--log", url],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        _wait_for(lambda: calls.exists() and calls.read_text().strip(), "a handler call")
        process.send_signal(signal.SIGINT)
        for text in process.stderr:  # the first signal is taken: graceful, and says so
            lines.append(text)
            if "signal received; stopping gracefully" in text:
                break
        assert "a second signal stops at once" in lines[-1]
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=25)  # the first signal alone waits 30 s
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    err = "".join(lines) + rest
    assert process.returncode == ExitCode.INTERRUPTED, err
    second = next(t for t in err.splitlines() if "second signal; stopping now" in t)
    assert "signal='SIGINT'" in second and "draining=['ticks/" in second
    assert "stop forced; cancelled running chunks" in err
    assert "exiting without waiting for handler calls still running in threads" in err
    assert recorder.handled_ids(str(out)) == []  # the calls never finished
    drained = subprocess.run(
        [sys.executable, "-m", "wakuwaku", "run", TARGET, "--drain", "--log", url],
        cwd=ROOT,
        env={**env, "WK_TEST_HANDLE_SECONDS": "0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert drained.returncode == ExitCode.OK, drained.stderr
    assert sorted(recorder.handled_ids(str(out))) == list(range(20)), "an event was lost"
