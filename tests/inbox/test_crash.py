"""SIGKILL between the effects and the offset commit, restart: the sum is exact (design §7, §9).

``crash_consumer.py`` runs as a subprocess, without the consumer engine. It
is killed at seeded random points, either right after a projection commit
(before the log's offset commit: the whole batch comes again) or in the
middle of a projection transaction (the claim and the addition roll back
together), and restarted until it finishes. The sum must then equal the sum
of the values exactly, every record applied once; the same schedule without
the inbox must come out wrong, which proves the schedule really redelivers.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import POSTGRES_DSN

from . import crash_consumer
from .crash_consumer import PARTITIONS, TOPIC

SCRIPT = Path(crash_consumer.__file__)
MESSAGES = 150
KILLS = 6  # at most 6 x 20 records get committed before the kills run out


async def _seed_log(path: Path, values: list[int]) -> None:
    log = crash_consumer.open_log(str(path))
    try:
        await log.create_topic(TOPIC, PARTITIONS)
        for partition in range(PARTITIONS):
            await log.append(
                TOPIC,
                partition,
                [
                    ({}, str(v).encode())
                    for i, v in enumerate(values)
                    if i % PARTITIONS == partition
                ],
            )
    finally:
        await log.close()


def _run_until_done(log: Path, projection: str, suffix: str, seed: int, use_inbox: bool) -> int:
    """Run the consumer, killing it ``KILLS`` times; returns how many kills happened."""
    rng = random.Random(seed)
    for run in range(KILLS + 5):
        env = dict(os.environ)
        if not use_inbox:
            env["WK_NO_INBOX"] = "1"
        if run < KILLS:
            env["WK_KILL_AT"] = str(rng.randint(1, 25))
            env["WK_KILL_PHASE"] = rng.choice(["after", "after", "mid"])
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), str(log), projection, suffix],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode == 0:
            return run  # every run before this one was killed
        assert proc.returncode == -signal.SIGKILL, proc.stderr
    raise AssertionError("the consumer never finished")


def _sqlite_total(path: Path) -> tuple[int, int, int]:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT sum, applied, duplicates FROM total").fetchone()
    finally:
        conn.close()
    return int(row[0]), int(row[1]), int(row[2])


@pytest.mark.slow
@pytest.mark.parametrize("use_inbox", [True, False], ids=["inbox", "no-inbox-control"])
def test_sqlite_projection_sum_is_exact_after_sigkills(tmp_path: Path, use_inbox: bool) -> None:
    rng = random.Random(1)
    values = [rng.randint(1, 1000) for _ in range(MESSAGES)]
    log = tmp_path / "log.db"
    asyncio.run(_seed_log(log, values))
    projection = tmp_path / "projection.db"
    kills = _run_until_done(log, str(projection), "t", seed=20240601, use_inbox=use_inbox)
    assert kills == KILLS
    total, applied, duplicates = _sqlite_total(projection)
    if use_inbox:
        assert (total, applied) == (sum(values), MESSAGES)
        assert duplicates > 0, "no record was ever delivered twice: the test proved nothing"
    else:
        assert total > sum(values), "the kill schedule never redelivered an applied record"


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_projection_sum_is_exact_after_sigkills(tmp_path: Path) -> None:
    psycopg: Any = pytest.importorskip("psycopg")
    rng = random.Random(2)
    values = [rng.randint(1, 1000) for _ in range(MESSAGES)]
    log = tmp_path / "log.db"
    asyncio.run(_seed_log(log, values))
    suffix = uuid.uuid4().hex[:12]
    tables = f"wk_crash_total_{suffix}, wk_crash_inbox_{suffix}, wk_crash_inbox_{suffix}_dead"
    try:
        kills = _run_until_done(log, POSTGRES_DSN, suffix, seed=7, use_inbox=True)
        assert kills == KILLS
        with psycopg.connect(POSTGRES_DSN) as conn:
            row = conn.execute(
                f"SELECT sum, applied, duplicates FROM wk_crash_total_{suffix}"
            ).fetchone()
        total, applied, duplicates = int(row[0]), int(row[1]), int(row[2])
        assert (total, applied) == (sum(values), MESSAGES)
        assert duplicates > 0, "no record was ever delivered twice: the test proved nothing"
    finally:
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {tables}")
