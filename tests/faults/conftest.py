"""Fault-test fixtures: a private server per engine, CPU burners on request.

``WAKUWAKU_TEST_BURN_CPUS=N`` runs N processes that only burn CPU
(``while True: pass``) beside every fault test, so the suite is also proven
on a starved machine (timeouts fire late, the consumer and the server get
their CPU in bursts). Unset or 0: none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

BURN_ENV = "WAKUWAKU_TEST_BURN_CPUS"


@pytest.fixture(autouse=True)
def cpu_burners() -> Iterator[int]:
    """Starts ``$WAKUWAKU_TEST_BURN_CPUS`` CPU-burning processes for the test; how many."""
    count = int(os.environ.get(BURN_ENV) or 0)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield count
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(10)
