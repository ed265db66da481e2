"""The fault tests' SIGSTOP helper: a process is frozen when it returns."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from .processes import all_threads_stopped, stop

# Four threads that wake up every 0.1 ms, as a server's do for its sockets and timers.
BUSY = """
import threading, time
def spin():
    while True:
        time.sleep(0.0001)
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
print("ready", flush=True)
spin()
"""


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[bytes]]:
    with subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE) as process:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        try:
            yield process
        finally:
            process.kill()


def test_every_thread_has_stopped_when_stop_returns(busy: subprocess.Popen[bytes]) -> None:
    # kill(2) alone returned before all threads stopped in 9 of 200 tries on
    # a quiet machine (144 of 200 beside two CPU burners), so 100 tries catch
    # a helper that only sends the signal.
    for _ in range(100):
        stop(busy)
        assert all_threads_stopped(busy.pid)
        busy.send_signal(signal.SIGCONT)


def test_a_running_process_is_not_reported_stopped(busy: subprocess.Popen[bytes]) -> None:
    assert not all_threads_stopped(busy.pid)
