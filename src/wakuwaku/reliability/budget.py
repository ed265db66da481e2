"""Retry budgets: a monotonic attempt counter per ``(job id, step)`` (design §11, seed 000).

The counter answers "how many attempts has this enqueued job's step used?".
Its scope is the **enqueue id**, not the entity: two jobs a user triggered for
the same entity and step each get their own budget, and an internal re-queue
keeps the id (and so the count). A pre-processing sub-step counts under its
own step name, so it does not eat the main step's budget.

Each counter expires ``2 * max_gap`` seconds after its **latest** spend, where
``max_gap`` is the longest possible gap between two attempts (the longest
backoff plus the longest an attempt can run, not an average). Refreshing the
expiry on every spend, rather than only on the first as the seed did, makes
the bound hold for any number of attempts: with a TTL set once, an attempt
series longer than ``2 * max_gap`` in total would see its counter vanish
mid-retry and start again from 1, which is the endless re-queue in another
form. A counter that somehow lost its TTL is also repaired by its next spend.

Two stores share one contract (:class:`RetryBudget`):

* :class:`RedisRetryBudget`: ``INCR`` and ``PEXPIRE`` in one Lua script
  (``budget_spend.lua``), so no crash can leave an immortal counter behind;
* :class:`SQLiteRetryBudget`: one row per counter, updated in one
  transaction, expiry by timestamp on the injected clock.

:class:`AttemptLimit` turns a count into a decision. Attempts are numbered
from 1 and ``max_attempts`` counts the first one, so ``AttemptLimit(2)``
allows one retry: the first failure (count 1) is *not* final. The seed's
version appended the current attempt and then checked ``>= 1``, which made
every first failure final and no retry ever ran.
"""

from __future__ import annotations

import abc
import asyncio
import math
import os
import re
import sqlite3
import threading
from dataclasses import dataclass
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._clock import BLOCKING_CALLS, SYSTEM_CLOCK, Clock
from .._errors import ConfigError
from ._names import DEFAULT_PREFIX, check_job, name

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ("AttemptLimit", "RedisRetryBudget", "RetryBudget", "SQLiteRetryBudget")

_SPEND_LUA = resources.files(__package__).joinpath("budget_spend.lua").read_text("utf-8")


def _load_sql() -> dict[str, str]:
    text = resources.files(__package__).joinpath("budget.sql").read_text("utf-8")
    parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


_SQL = _load_sql()


@dataclass(frozen=True, slots=True)
class AttemptLimit:
    """How many attempts a ``(job, step)`` gets in all, the first one included.

    Call :meth:`RetryBudget.spend` once per attempt (when it starts or when it
    fails, always the same way) and pass the returned count here.

    :param max_attempts: total attempts allowed (>= 1); ``2`` means one retry.
    :raises ConfigError: when ``max_attempts < 1``.
    """

    max_attempts: int

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")

    def remaining(self, spent: int) -> int:
        """Attempts still allowed after ``spent`` were used (never negative)."""
        return max(0, self.max_attempts - spent)

    def exhausted(self, spent: int) -> bool:
        """Whether ``spent`` attempts used the whole budget (no retry may follow)."""
        return spent >= self.max_attempts


class RetryBudget(abc.ABC):
    """A monotonic attempt counter per ``(job_id, step)`` that expires (design §11).

    :param max_gap: the longest possible gap between two attempts of one job
        and step (seconds, > 0); a counter lives ``2 * max_gap`` after its
        latest spend.
    :raises ConfigError: when ``max_gap`` is not positive.

    Ids follow the Redis key rules of the package: non-empty ``job_id`` and
    ``step``, and no ``:`` in ``step``. Usable as an async context manager
    that closes the store.
    """

    def __init__(self, *, max_gap: float) -> None:
        if not (max_gap > 0 and math.isfinite(max_gap)):
            raise ConfigError(f"max_gap must be a positive number of seconds, got {max_gap!r}")
        self.max_gap = float(max_gap)

    @property
    def ttl(self) -> float:
        """How long a counter lives after its latest spend: ``2 * max_gap`` (seconds)."""
        return 2 * self.max_gap

    @abc.abstractmethod
    async def spend(self, job_id: str, step: str) -> int:
        """Count one attempt and return the count so far: 1 on the first spend.

        The count and the expiry change together, atomically.

        :raises ConfigError: for an invalid id or step.
        """

    @abc.abstractmethod
    async def spent(self, job_id: str, step: str) -> int:
        """The attempts counted so far, without spending one (0 when none or expired).

        :raises ConfigError: for an invalid id or step.
        """

    @abc.abstractmethod
    async def clear(self, job_id: str, step: str) -> None:
        """Forget the counter (for example once the step finally succeeded).

        :raises ConfigError: for an invalid id or step.
        """

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing
        """Release what the store holds (nothing by default)."""

    async def __aenter__(self) -> RetryBudget:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class RedisRetryBudget(RetryBudget):
    """Retry budget in Redis: key ``<prefix>:budget:<job_id>:<step>``, one Lua script per spend.

    :param redis: a ``redis.asyncio.Redis`` client (the caller owns and closes it).
    :param max_gap: see :class:`RetryBudget` (seconds).
    :param prefix: first segment of the key names.
    :raises ConfigError: when ``max_gap`` is not positive.

    Every method may raise ``redis.exceptions.RedisError`` when Redis fails; a
    spend that raised may or may not have counted (at most one attempt extra).
    """

    def __init__(
        self, redis: aioredis.Redis, *, max_gap: float, prefix: str = DEFAULT_PREFIX
    ) -> None:
        super().__init__(max_gap=max_gap)
        self._redis = redis
        self._prefix = prefix
        self._script = redis.register_script(_SPEND_LUA)
        self._ttl_ms = max(1, math.ceil(self.ttl * 1000))

    def key(self, job_id: str, step: str) -> str:
        """The Redis key of the counter of ``(job_id, step)``."""
        return name(self._prefix, "budget", job_id, step)

    async def spend(self, job_id: str, step: str) -> int:
        return int(await self._script(keys=[self.key(job_id, step)], args=[self._ttl_ms]))

    async def spent(self, job_id: str, step: str) -> int:
        value = await self._redis.get(self.key(job_id, step))
        return int(value) if value is not None else 0

    async def clear(self, job_id: str, step: str) -> None:
        await self._redis.delete(self.key(job_id, step))


class SQLiteRetryBudget(RetryBudget):
    """Retry budget in a SQLite file: table ``wk_retry_budget``, one transaction per spend.

    :param path: the database file (created when missing); several processes
        may share it. ``":memory:"`` works but does not survive a restart.
    :param max_gap: see :class:`RetryBudget` (seconds).
    :param clock: wall-clock source for expiry (``now()``, seconds since the
        epoch: the times are stored, so they must survive a restart).
    :param busy_timeout: how long to wait for another writer's lock (seconds).
    :raises ConfigError: when ``max_gap`` is not positive.
    :raises sqlite3.Error: when the file cannot be opened or the table created.

    The blocking SQLite calls run in a worker thread, one at a time. Expired
    rows are deleted in the transaction of each spend.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_gap: float,
        clock: Clock = SYSTEM_CLOCK,
        busy_timeout: float = 5.0,
    ) -> None:
        super().__init__(max_gap=max_gap)
        self._clock = clock
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            os.fspath(path), timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        with self._lock:
            self._conn.execute(_SQL["schema"])
            self._conn.execute(_SQL["schema_index"])

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ConfigError("this SQLiteRetryBudget is closed")
        return self._conn

    def _spend(self, params: dict[str, Any]) -> int:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(_SQL["purge"], {"now": params["now"]})
                conn.execute(_SQL["spend"], params)
                row = conn.execute(_SQL["spent"], params).fetchone()
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return int(row[0])

    def _spent(self, params: dict[str, Any]) -> int:
        with self._lock:
            row = self._connection().execute(_SQL["spent"], params).fetchone()
        return int(row[0]) if row is not None else 0

    def _clear(self, params: dict[str, Any]) -> None:
        with self._lock:
            self._connection().execute(_SQL["clear"], params)

    def _params(self, job_id: str, step: str) -> dict[str, Any]:
        check_job(job_id, step)
        now = self._clock.now()
        return {"job_id": job_id, "step": step, "now": now, "expires_at": now + self.ttl}

    async def spend(self, job_id: str, step: str) -> int:
        params = self._params(job_id, step)
        with BLOCKING_CALLS.track():  # a fake clock must not jump while SQLite works
            return await asyncio.to_thread(self._spend, params)

    async def spent(self, job_id: str, step: str) -> int:
        params = self._params(job_id, step)
        with BLOCKING_CALLS.track():
            return await asyncio.to_thread(self._spent, params)

    async def clear(self, job_id: str, step: str) -> None:
        params = self._params(job_id, step)
        with BLOCKING_CALLS.track():
            await asyncio.to_thread(self._clear, params)

    async def aclose(self) -> None:
        """Close the database connection; later calls raise :class:`~wakuwaku.ConfigError`."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
