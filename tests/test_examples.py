"""Every example under examples/engine runs and does what its docstring says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parent.parent / "examples" / "engine"


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
