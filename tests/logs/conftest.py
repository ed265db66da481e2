"""Fixtures of the log tests that more than one module uses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..faults.servers import IggyServer


@pytest.fixture
def iggy_server(tmp_path: Path) -> Iterator[IggyServer]:
    """An Iggy server of the test's own (own ports and data), for tests that
    kill or restart it; closed after the test."""
    started = IggyServer(tmp_path)
    started.start()
    try:
        yield started
    finally:
        started.close()
