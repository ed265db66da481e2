"""The flights demo: its data facts, and the whole demo on a slice, as `make demo` runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wakuwaku.demo.data import expected_totals, read_planes


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
def test_the_demo_verifies_itself_on_a_slice_with_chaos_and_replay(tmp_path: Path) -> None:
    result = subprocess.run(
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
            str(tmp_path / "demo"),
            "--lock-seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.rstrip().endswith("VERIFIED") and "NOT VERIFIED" not in out
    assert "every row accounted for exactly once" in out
    assert "every flight with a tail number applied exactly once" in out
    assert "[FAILED]" not in out


@pytest.mark.slow
def test_a_consumer_killed_early_still_verifies(tmp_path: Path) -> None:
    """Issue 18: killed at 0.6 s, the planes partitions redo their batch while
    flights wait; the dead letters must still be exactly the unlisted planes'."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wakuwaku",
            "demo",
            "flights",
            "--limit",
            "1000",
            "--chaos",
            "--kill-at",
            "0.6",
            "--replay-dead-letters",
            "--workdir",
            str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SIGKILL at" in result.stdout
    assert "[FAILED]" not in result.stdout
    assert result.stdout.rstrip().endswith("\nVERIFIED")


def test_a_memory_log_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wakuwaku",
            "demo",
            "flights",
            "--log",
            "memory://",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3
    assert "another process" in result.stderr
