"""Reliability parts around event consumers: result waiter, retry budget, circuit breaker.

* :mod:`wakuwaku.reliability.waiter` (design §10): wait for an out-of-band job
  result in Redis, and publish one. Needs the ``redis`` extra, so its names
  are imported on first use: ``from wakuwaku.reliability import
  wait_for_result`` raises :class:`ImportError` with the ``pip install
  'wakuwaku[redis]'`` line when redis is missing, and importing this package
  never does.
* :mod:`wakuwaku.reliability.budget` (design §11): a monotonic attempt counter
  per ``(job id, step)`` in Redis or SQLite, and :class:`AttemptLimit`.
* :mod:`wakuwaku.reliability.breaker` (design §12): a circuit breaker that
  does not count domain failures and cannot be flipped by stale calls.

* :func:`sanitize` (design §13), re-exported from :mod:`wakuwaku._sanitize`:
  make untrusted error text safe to store.

See ``docs/reliability.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._sanitize import DEFAULT_LIMIT as DEFAULT_LIMIT
from .._sanitize import redact_url as redact_url
from .._sanitize import sanitize as sanitize
from .breaker import BreakerCall as BreakerCall
from .breaker import BreakerConfig as BreakerConfig
from .breaker import BreakerState as BreakerState
from .breaker import CallOutcome as CallOutcome
from .breaker import CircuitBreaker as CircuitBreaker
from .breaker import Permit as Permit
from .breaker import default_call_outcome as default_call_outcome
from .budget import AttemptLimit as AttemptLimit
from .budget import RedisRetryBudget as RedisRetryBudget
from .budget import RetryBudget as RetryBudget
from .budget import SQLiteRetryBudget as SQLiteRetryBudget

if TYPE_CHECKING:
    from .waiter import Backoff as Backoff
    from .waiter import ProtocolReason as ProtocolReason
    from .waiter import ReadMode as ReadMode
    from .waiter import Result as Result
    from .waiter import ResultStatus as ResultStatus
    from .waiter import ResultTimeoutError as ResultTimeoutError
    from .waiter import Verdict as Verdict
    from .waiter import WaitObserver as WaitObserver
    from .waiter import delete_result as delete_result
    from .waiter import parse_result as parse_result
    from .waiter import publish_result as publish_result
    from .waiter import read_verdict as read_verdict
    from .waiter import result_channel as result_channel
    from .waiter import result_key as result_key
    from .waiter import wait_for_result as wait_for_result

_WAITER_NAMES = frozenset(
    {
        "Backoff",
        "ProtocolReason",
        "ReadMode",
        "Result",
        "ResultStatus",
        "ResultTimeoutError",
        "Verdict",
        "WaitObserver",
        "read_verdict",
        "delete_result",
        "parse_result",
        "publish_result",
        "result_channel",
        "result_key",
        "wait_for_result",
    }
)

__all__ = (
    "DEFAULT_LIMIT",
    "AttemptLimit",
    "Backoff",
    "BreakerCall",
    "BreakerConfig",
    "BreakerState",
    "CallOutcome",
    "CircuitBreaker",
    "Permit",
    "ProtocolReason",
    "ReadMode",
    "RedisRetryBudget",
    "Result",
    "ResultStatus",
    "ResultTimeoutError",
    "RetryBudget",
    "SQLiteRetryBudget",
    "Verdict",
    "WaitObserver",
    "default_call_outcome",
    "delete_result",
    "parse_result",
    "publish_result",
    "read_verdict",
    "redact_url",
    "result_channel",
    "result_key",
    "sanitize",
    "wait_for_result",
)


def __getattr__(name: str) -> Any:
    """Import the Redis-backed waiter only when one of its names is used (PEP 562)."""
    if name in _WAITER_NAMES:
        waiter = importlib.import_module(".waiter", __name__)
        return getattr(waiter, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
