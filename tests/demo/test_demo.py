"""The flights demo: its data facts, and the whole demo on a slice, as `make demo` runs it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from wakuwaku import LogUnavailableError
from wakuwaku.demo import run
from wakuwaku.demo.data import expected_totals, read_planes
from wakuwaku.demo.options import DemoOptions
from wakuwaku.demo.processes import ConsumerProcess

from .. import iggy_support, kafka_support
from ..conftest import IGGY_URL, KAFKA_BOOTSTRAP, NATS_URL, REDIS_URL
from ..logs.test_redis import purge
from ..nats_support import drop_prefix, fresh_prefix


def demo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wakuwaku", "demo", "flights", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_verified(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.rstrip().endswith("\nVERIFIED"), out
    assert "[FAILED]" not in out
    assert "every row accounted for exactly once" in out


def test_the_data_is_as_messy_as_the_issue_says() -> None:
    expected = expected_totals()
    registered = {p.tailnum for p in read_planes()}
    assert expected.rows == 336_776
    assert expected.without_tail == 2_512
    unknown = set(expected.totals) - registered
    assert len(registered) == 3_322
    assert len(unknown) == 721
    assert expected.rows_of(unknown) == 50_094


@pytest.mark.slow
def test_the_demo_verifies_itself_on_a_slice_and_shows_progress_while_it_runs(
    tmp_path: Path,
) -> None:
    """Not a terminal: plain progress lines, read while the demo still runs."""
    workdir = tmp_path / "demo"
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wakuwaku",
            "demo",
            "flights",
            "--limit",
            "30000",
            "--chaos",
            "--replay-dead-letters",
            "--workdir",
            str(workdir),
            "--lock-seconds",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        lines: list[str] = []
        replay_started_at_first_progress: bool | None = None
        for line in proc.stdout:
            lines.append(line)
            if replay_started_at_first_progress is None and "] consume: " in line:
                # The replay's consumer run writes consumer-stats-3.json: had the
                # lines been held back to the end, the replay would be over.
                replay_started_at_first_progress = (workdir / "consumer-stats-3.json").exists()
        stderr = proc.stderr.read()
        assert proc.wait(timeout=300) == 0, "".join(lines) + stderr
    out = "".join(lines)
    assert replay_started_at_first_progress is False, out
    assert "chaos: projection locked" in out
    assert "chaos: consumer SIGKILLed" in out
    assert "replay done:" in out
    report = out[out.index("wakuwaku demo flights: report") :]
    assert report.rstrip().endswith("\nVERIFIED")
    assert "[FAILED]" not in report
    assert "every flight with a tail number applied exactly once" in report


@pytest.mark.slow
def test_a_consumer_killed_early_still_verifies(tmp_path: Path) -> None:
    """Killed at 0.3 s, the planes partitions redo their batch while
    flights wait; the dead letters must still be exactly the unlisted planes'.
    The kill happens in every chaos run, however soon the slice is consumed."""
    result = demo(
        "--limit",
        "1000",
        "--chaos",
        "--kill-at",
        "0.3",
        "--replay-dead-letters",
        "--workdir",
        str(tmp_path / "demo"),
    )
    assert_verified(result)
    assert "SIGKILL at" in result.stdout


@contextlib.asynccontextmanager
async def sqlite_url(tmp_path: Path) -> AsyncIterator[str]:
    yield f"sqlite:///{tmp_path / 'log.db'}"


@contextlib.asynccontextmanager
async def redis_url(tmp_path: Path) -> AsyncIterator[str]:
    prefix = f"wktest-{uuid.uuid4().hex}"
    try:
        yield f"{REDIS_URL}?prefix={prefix}"
    finally:
        await purge(REDIS_URL, prefix)


@contextlib.asynccontextmanager
async def nats_url(tmp_path: Path) -> AsyncIterator[str]:
    prefix = fresh_prefix()
    try:
        yield f"{NATS_URL}?prefix={prefix}"
    finally:
        await drop_prefix(NATS_URL, prefix)


@contextlib.asynccontextmanager
async def kafka_url(tmp_path: Path) -> AsyncIterator[str]:
    prefix = kafka_support.fresh_prefix()
    try:
        yield f"kafka://{KAFKA_BOOTSTRAP}?prefix={prefix}"
    finally:
        kafka_support.drop_prefix(prefix)


@contextlib.asynccontextmanager
async def iggy_url(tmp_path: Path) -> AsyncIterator[str]:
    stream = iggy_support.fresh_stream()
    try:
        yield f"{IGGY_URL}?stream={stream}"
    finally:
        await iggy_support.drop_stream(stream)


# One entry per engine: a fresh URL (unique prefix on the shared servers) and
# its cleanup. The demo itself only uses the Log interface.
ENGINES: dict[str, Callable[[Path], contextlib.AbstractAsyncContextManager[str]]] = {
    "sqlite": sqlite_url,
    "redis": redis_url,
    "nats": nats_url,
    "kafka": kafka_url,
    "iggy": iggy_url,
}


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("nats", marks=pytest.mark.nats),
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("iggy", marks=pytest.mark.iggy),
    ]
)
async def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh log URL of each engine; server-side names are removed afterwards."""
    async with ENGINES[request.param](tmp_path) as url:
        yield url


@pytest.mark.slow
async def test_the_demo_verifies_on_every_engine_and_refuses_a_used_log(
    log_url: str, tmp_path: Path
) -> None:
    args = ("--log", log_url, "--workdir", str(tmp_path / "demo"), "--progress", "none")
    # Killed at 0.8 s: the consumer is still starting or consuming 10 000 rows then.
    chaos = ("--chaos", "--lock-seconds", "1", "--kill-at", "0.8", "--replay-dead-letters")
    first = demo(*args, "--limit", "10000", *chaos)
    assert_verified(first)
    assert "SIGKILL at" in first.stdout
    assert "every flight with a tail number applied exactly once" in first.stdout

    again = demo(*args, "--limit", "1000")
    assert again.returncode == 3, again.stdout + again.stderr
    error = again.stderr.strip()
    assert len(error.splitlines()) == 1, error
    assert "already holds the flights demo's topics" in error and "--reset" in error
    assert "wakuwaku demo flights: report" not in again.stdout

    reset = demo(*args, "--limit", "1000", "--reset")
    assert_verified(reset)
    assert "every row accounted for exactly once: " in reset.stdout
    assert "of 1,000" in reset.stdout


def test_a_memory_log_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    result = demo("--log", "memory://", "--workdir", str(tmp_path), timeout=120)
    assert result.returncode == 3
    assert "another process" in result.stderr


@pytest.mark.redis
async def test_the_password_in_the_log_url_is_never_printed(tmp_path: Path) -> None:
    # The report's log line and the refusal of a used log printed the URL whole.
    async with redis_url(tmp_path) as url:
        secret = url.replace("redis://", "redis://default:S3cr3tPW@", 1)
        args = ("--log", secret, "--workdir", str(tmp_path / "demo"), "--progress", "none")
        first = demo(*args, "--limit", "300")
        assert_verified(first)
        again = demo(*args, "--limit", "300")
        assert again.returncode == 3
        assert "already holds" in again.stderr
        for result in (first, again):
            assert "S3cr3tPW" not in result.stdout + result.stderr
        assert "redis://***@" in first.stdout


async def test_a_failed_run_leaves_no_consumer_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose log failed mid-run (an Iggy restart) exited with status 3
    and left its consumer process running with no parent."""
    started: list[ConsumerProcess] = []

    async def failing(
        opts: object, log: object, url: object, consumer: ConsumerProcess, *rest: object
    ) -> object:
        started.append(consumer)
        raise LogUnavailableError("the log went away mid-run")

    monkeypatch.setattr(run, "_phases", failing)
    said: list[str] = []
    with pytest.raises(LogUnavailableError):
        await run.run_demo(
            DemoOptions(workdir=tmp_path, limit=200, progress="plain"), out=said.append
        )
    [consumer] = started
    assert consumer.process is not None and consumer.process.poll() is not None
    assert any("stopped the consumer" in line for line in said), said
