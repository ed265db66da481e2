"""Retry budgets (design §11, seed 000): one contract, run on Redis and on SQLite."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.conftest import REDIS_URL
from wakuwaku import ConfigError
from wakuwaku.reliability.budget import (
    AttemptLimit,
    RedisRetryBudget,
    RetryBudget,
    SQLiteRetryBudget,
)
from wakuwaku.testing import FakeClock

MAX_GAP = 300.0  # seconds between two attempts, at the very most


# -- the limit ----------------------------------------------------------------------------


def test_the_first_failure_still_allows_the_retry() -> None:
    # The seed appended the attempt, then checked ">= 1": the first failure was final.
    limit = AttemptLimit(max_attempts=2)
    assert not limit.exhausted(1)
    assert limit.remaining(1) == 1
    assert limit.exhausted(2)
    assert limit.remaining(2) == 0
    assert limit.remaining(7) == 0


def test_a_limit_of_one_attempt_means_no_retry() -> None:
    assert AttemptLimit(1).exhausted(1)


def test_a_limit_needs_at_least_one_attempt() -> None:
    with pytest.raises(ConfigError):
        AttemptLimit(0)


@pytest.mark.parametrize("gap", [0, -1, float("inf"), float("nan")])
def test_max_gap_must_be_a_positive_number(gap: float, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        SQLiteRetryBudget(tmp_path / "b.db", max_gap=gap)


# -- the contract, on both stores -----------------------------------------------------------


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "sqlite"])
async def budget(
    request: pytest.FixtureRequest, tmp_path: Path, prefix: str
) -> AsyncIterator[RetryBudget]:
    if request.param == "redis":
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            yield RedisRetryBudget(client, max_gap=MAX_GAP, prefix=prefix)
        finally:
            keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()
    else:
        async with SQLiteRetryBudget(tmp_path / "budget.db", max_gap=MAX_GAP) as store:
            yield store


async def test_spend_counts_from_one(budget: RetryBudget) -> None:
    assert await budget.spent("enq-1", "ocr") == 0
    assert [await budget.spend("enq-1", "ocr") for _ in range(4)] == [1, 2, 3, 4]
    assert await budget.spent("enq-1", "ocr") == 4


async def test_budgets_are_separate_per_enqueue_id_and_per_step(budget: RetryBudget) -> None:
    await budget.spend("enq-1", "ocr")
    await budget.spend("enq-1", "ocr")
    # Another job for the same entity and step has its own budget...
    assert await budget.spend("enq-2", "ocr") == 1
    # ...and a pre-processing sub-step does not eat the main step's.
    assert await budget.spend("enq-1", "ocr.preprocess") == 1
    assert await budget.spend("enq-1", "ocr") == 3


async def test_clear_forgets_the_counter(budget: RetryBudget) -> None:
    await budget.spend("enq-1", "ocr")
    await budget.clear("enq-1", "ocr")
    assert await budget.spent("enq-1", "ocr") == 0
    assert await budget.spend("enq-1", "ocr") == 1


async def test_concurrent_spends_each_get_their_own_number(budget: RetryBudget) -> None:
    counts = await asyncio.gather(*(budget.spend("enq-1", "ocr") for _ in range(40)))
    assert sorted(counts) == list(range(1, 41))


async def test_the_limit_decides_on_what_spend_returns(budget: RetryBudget) -> None:
    limit = AttemptLimit(max_attempts=2)
    decisions = []
    for _ in range(3):
        spent = await budget.spend("enq-9", "render")
        decisions.append("give up" if limit.exhausted(spent) else "retry")
    assert decisions == ["retry", "give up", "give up"]


@pytest.mark.parametrize(("job", "step"), [("", "s"), ("j", ""), ("j", "a:b")])
async def test_invalid_ids_are_refused(budget: RetryBudget, job: str, step: str) -> None:
    with pytest.raises(ConfigError):
        await budget.spend(job, step)


# -- Redis specifics ---------------------------------------------------------------------------


@pytest.mark.redis
async def test_redis_ttl_is_set_by_every_spend(redis_client: aioredis.Redis, prefix: str) -> None:
    budget = RedisRetryBudget(redis_client, max_gap=MAX_GAP, prefix=prefix)
    key = budget.key("enq-1", "ocr")
    full = 2 * MAX_GAP * 1000
    for _ in range(5):
        await budget.spend("enq-1", "ocr")
        ttl = await redis_client.pttl(key)
        assert ttl > 0  # never a moment without a TTL: one script does both
        assert full - 10_000 < ttl <= full  # and it counts from this spend
        # Pretend most of the TTL went by; the next spend must renew it.
        await redis_client.pexpire(key, 1000)


@pytest.mark.redis
async def test_redis_repairs_a_counter_left_without_a_ttl(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    # An older writer (INCR, then died before EXPIRE) left an immortal counter.
    budget = RedisRetryBudget(redis_client, max_gap=MAX_GAP, prefix=prefix)
    key = budget.key("enq-1", "ocr")
    await redis_client.set(key, 3)
    assert await redis_client.pttl(key) == -1
    assert await budget.spend("enq-1", "ocr") == 4
    assert await redis_client.pttl(key) > 0


@pytest.mark.redis
async def test_redis_counter_expires_with_its_ttl(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    budget = RedisRetryBudget(redis_client, max_gap=MAX_GAP, prefix=prefix)
    await budget.spend("enq-1", "ocr")
    await redis_client.delete(budget.key("enq-1", "ocr"))  # what expiry does
    assert await budget.spend("enq-1", "ocr") == 1


SPEND_IN_A_NEW_PROCESS = textwrap.dedent(
    """
    import asyncio, sys
    import redis.asyncio as aioredis
    from wakuwaku.reliability.budget import RedisRetryBudget, SQLiteRetryBudget

    async def main() -> None:
        kind, where, prefix = sys.argv[1:4]
        if kind == "redis":
            client = aioredis.Redis.from_url(where)
            budget = RedisRetryBudget(client, max_gap=300, prefix=prefix)
            print(await budget.spend("enq-1", "ocr"))
            await client.aclose()
        else:
            async with SQLiteRetryBudget(where, max_gap=300) as budget:
                print(await budget.spend("enq-1", "ocr"))

    asyncio.run(main())
    """
)


def _spend_in_subprocess(kind: str, where: str, prefix: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", SPEND_IN_A_NEW_PROCESS, kind, where, prefix],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip())


@pytest.mark.redis
async def test_redis_counter_survives_a_process_restart(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    assert await asyncio.to_thread(_spend_in_subprocess, "redis", REDIS_URL, prefix) == 1
    assert await asyncio.to_thread(_spend_in_subprocess, "redis", REDIS_URL, prefix) == 2
    budget = RedisRetryBudget(redis_client, max_gap=MAX_GAP, prefix=prefix)
    assert await budget.spend("enq-1", "ocr") == 3


# -- SQLite specifics --------------------------------------------------------------------------


async def test_sqlite_counter_survives_a_process_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "budget.db")
    assert await asyncio.to_thread(_spend_in_subprocess, "sqlite", path, "-") == 1
    assert await asyncio.to_thread(_spend_in_subprocess, "sqlite", path, "-") == 2
    async with SQLiteRetryBudget(path, max_gap=MAX_GAP) as budget:
        assert await budget.spend("enq-1", "ocr") == 3


async def test_sqlite_counter_survives_a_new_connection(tmp_path: Path) -> None:
    async with SQLiteRetryBudget(tmp_path / "b.db", max_gap=MAX_GAP) as first:
        await first.spend("enq-1", "ocr")
    async with SQLiteRetryBudget(tmp_path / "b.db", max_gap=MAX_GAP) as second:
        assert await second.spend("enq-1", "ocr") == 2


async def test_sqlite_expiry_slides_with_every_spend(tmp_path: Path) -> None:
    clock = FakeClock(autojump=False)
    async with SQLiteRetryBudget(tmp_path / "b.db", max_gap=10, clock=clock) as budget:
        assert budget.ttl == 20
        assert await budget.spend("enq-1", "ocr") == 1
        for expected in (2, 3, 4):
            clock.advance(19.5)  # just inside 2 * max_gap since the latest spend
            assert await budget.spend("enq-1", "ocr") == expected
        # Total age is 58.5 s, far beyond one TTL: a once-only TTL would have reset it.
        clock.advance(20)  # a full 2 * max_gap without a spend: gone
        assert await budget.spent("enq-1", "ocr") == 0
        assert await budget.spend("enq-1", "ocr") == 1


async def test_sqlite_purges_expired_rows(tmp_path: Path) -> None:
    import sqlite3

    clock = FakeClock(autojump=False)
    path = tmp_path / "b.db"
    async with SQLiteRetryBudget(path, max_gap=10, clock=clock) as budget:
        await budget.spend("old", "ocr")
        clock.advance(25)
        await budget.spend("new", "ocr")
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT job_id FROM wk_retry_budget").fetchall()
    assert rows == [("new",)]


async def test_a_closed_sqlite_budget_refuses_work(tmp_path: Path) -> None:
    budget = SQLiteRetryBudget(tmp_path / "b.db", max_gap=MAX_GAP)
    await budget.aclose()
    await budget.aclose()  # twice is fine
    with pytest.raises(ConfigError):
        await budget.spend("enq-1", "ocr")
