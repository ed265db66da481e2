"""Every example of docs/reliability.md runs, prints what the docs say, and is
embedded in the docs verbatim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "reliability"
DOC = ROOT / "docs" / "reliability.md"


def run(name: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
    )
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    "name", ["sanitize_error.py", "wait_for_result.py", "retry_budget.py", "circuit_breaker.py"]
)
def test_the_docs_embed_the_example_verbatim(name: str) -> None:
    assert (EXAMPLES / name).read_text("utf-8").strip() in DOC.read_text("utf-8")


def test_sanitize_example() -> None:
    assert run("sanitize_error.py") == [
        "connect failed: <url> Traceback in <path>: exe.tnemyap \ufffd",
        "connect failed: <url> Traceb…[truncated]",
        "ConnectionError: no route to host; config at <path>",
    ]


@pytest.mark.redis
def test_wait_for_result_example() -> None:
    assert run("wait_for_result.py", REDIS_URL) == [
        "job-1 done: {'width': 320}",
        "job-2 failed: GPU out of memory (retryable=True)",
        "job-3 broke the contract: not_json",
        "job-4: no result within 0.3 s",
    ]


def test_retry_budget_example_survives_a_restart(tmp_path: Path) -> None:
    database = str(tmp_path / "budget.db")
    assert run("retry_budget.py", database) == [
        "attempt 1 failed (encoder crashed): 2 left, retrying",
        "attempt 2 failed (encoder crashed): 1 left, retrying",
        "attempt 3 failed (encoder crashed): giving up",
        "probe budget: 1 spent",
    ]
    # Run again on the same file: the count goes on instead of starting over.
    assert run("retry_budget.py", database) == [
        "attempt 4 failed (encoder crashed): giving up",
        "probe budget: 2 spent",
    ]


def test_circuit_breaker_example() -> None:
    lines = run("circuit_breaker.py")
    assert lines == [
        "job-1: the service answered that the job failed (scene file is corrupt)",
        "  breaker is closed",
        "job-2: the service answered that the job failed (scene file is corrupt)",
        "  breaker is closed",
        "job-3: transport failure (connection reset by peer)",
        "  breaker is closed",
        "job-4: transport failure (connection reset by peer)",
        "  breaker is closed",
        "job-5: transport failure (connection reset by peer)",
        "  breaker is open",
        "job-6: breaker open, next probe in 0.2 s",
        "  breaker is open",
        "job-7 accepted",
        "  breaker is closed",
    ]
