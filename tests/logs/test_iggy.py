"""The log contract on :class:`wakuwaku.logs.iggy.IggyLog`, and what only Iggy has."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from wakuwaku.logs import Log
from wakuwaku.logs.iggy import IggyLog

from ..iggy_support import drop_stream, fresh_stream, iggy_log
from .contract import LogContract

pytestmark = pytest.mark.iggy


class TestIggyLog(LogContract):
    multiprocess = True
    lease_expiry = False
    chosen_partitions = False
    commits_past_the_end = False
    exact_retention = False

    @pytest.fixture
    async def log(self) -> AsyncIterator[Log]:
        stream = fresh_stream()
        log = iggy_log(stream)
        try:
            yield log
        finally:
            await log.close()
            await drop_stream(stream)


@pytest.fixture
async def log() -> AsyncIterator[IggyLog]:
    stream = fresh_stream()
    log = iggy_log(stream)
    try:
        yield log
    finally:
        await log.close()
        await drop_stream(stream)
