"""Every example under examples/engine and examples/testing runs and does what
its docstring says."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples" / "engine"
TEST_FILE = Path(__file__).parent.parent / "examples" / "testing" / "test_reserve_stock.py"


def test_quickstart_handles_combines_retries_and_dead_letters() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "stock: {'apple': 3, 'pear': 1}" in result.stdout
    assert "'unrecoverable': 1" in result.stdout and "'gave_up_retry': 1" in result.stdout
    assert "giving up retry" in result.stderr


def test_tracing_continues_the_producers_trace_and_links_the_retry_attempt() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "tracing.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "process orders: key o-1 attempt 0 failure - parent checkout links 0",
        "process orders: key o-2 attempt 0 failure retryable parent checkout links 0",
        "process orders: key o-2 attempt 1 failure - parent checkout links 1",
    ]


@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_the_pytest_example_passes_where_a_user_copies_it(tmp_path: Path, mode: str) -> None:
    # A copy in a directory of its own, under a minimal pytest configuration
    # (pytest-asyncio in either mode, warnings as errors): as in a user's
    # project, not under this repository's options (--markdown-docs imports
    # the file a second time under another name).
    shutil.copy(TEST_FILE, tmp_path)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\n"
        f"asyncio_mode = {mode}\n"
        "asyncio_default_fixture_loop_scope = function\n"
        "filterwarnings = error\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", TEST_FILE.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout
