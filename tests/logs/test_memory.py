"""The log contract on :class:`wakuwaku.MemoryLog`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from wakuwaku import MemoryLog
from wakuwaku.logs import Log

from .contract import LogContract


class TestMemoryLog(LogContract):
    @pytest.fixture
    async def log(self) -> AsyncIterator[Log]:
        log = MemoryLog()
        yield log
        await log.close()
