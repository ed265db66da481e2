"""The log contract on :class:`wakuwaku.MemoryLog`."""

from __future__ import annotations

import re
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


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("memory://?x=1", "unknown option 'x' for memory:// (it takes: none)"),
        ("memory://somewhere", "takes nothing after memory://"),
    ],
)
def test_a_memory_url_takes_nothing_after_the_scheme(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        open_log(url)
