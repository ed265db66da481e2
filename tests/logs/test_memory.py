"""The log contract on :class:`wakuwaku.MemoryLog`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from wakuwaku import ConfigError, MemoryLog, open_log
from wakuwaku.logs import Log

from .contract import LogContract


class TestMemoryLog(LogContract):
    @pytest.fixture
    async def log(self) -> AsyncIterator[Log]:
        log = MemoryLog()
        yield log
        await log.close()


@pytest.mark.parametrize("url", ["memory://?x=1", "memory://somewhere"])
def test_a_memory_url_takes_nothing_after_the_scheme(url: str) -> None:
    with pytest.raises(ConfigError, match="takes nothing after memory://"):
        open_log(url)
