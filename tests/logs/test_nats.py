"""The log contract on :class:`wakuwaku.logs.nats.NatsLog`, and what only NATS has."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from wakuwaku.logs import Log

from ..conftest import NATS_URL
from ..nats_support import drop_prefix, fresh_prefix, nats_log
from .contract import LogContract

pytestmark = pytest.mark.nats


class TestNatsLog(LogContract):
    multiprocess = True

    @pytest.fixture
    async def log(self) -> AsyncIterator[Log]:
        prefix = fresh_prefix()
        log = nats_log(prefix)
        try:
            yield log
        finally:
            await log.close()
            await drop_prefix(NATS_URL, prefix)
