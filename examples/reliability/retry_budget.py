"""Count attempts per enqueued job and step, and stop in time (docs/reliability.md, design §11).

Run::

    python examples/reliability/retry_budget.py [DATABASE_FILE]

The counter lives in SQLite here (``RedisRetryBudget`` has the same methods),
so it survives a restart of this script: run it twice with the same file and
the second run starts where the first stopped.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from wakuwaku.reliability import AttemptLimit, SQLiteRetryBudget

LIMIT = AttemptLimit(max_attempts=3)  # the first attempt and two retries
ENQUEUE_ID = "enq-7f3a"  # the id of this enqueue, not of the video it is about


def transcode() -> None:
    raise RuntimeError("encoder crashed")  # this job always fails


async def main(database: Path) -> None:
    # The longest possible gap between two attempts: the longest backoff (10 min)
    # plus the longest an attempt may run (20 min). Counters live twice that.
    async with SQLiteRetryBudget(database, max_gap=30 * 60) as budget:
        while True:
            try:
                transcode()
                break
            except RuntimeError as error:
                spent = await budget.spend(ENQUEUE_ID, "transcode")
                if LIMIT.exhausted(spent):
                    print(f"attempt {spent} failed ({error}): giving up")
                    break
                print(f"attempt {spent} failed ({error}): {LIMIT.remaining(spent)} left, retrying")
        # A pre-processing sub-step has a budget of its own.
        print(f"probe budget: {await budget.spend(ENQUEUE_ID, 'transcode.probe')} spent")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(Path(sys.argv[1])))
    else:
        with tempfile.TemporaryDirectory() as folder:
            asyncio.run(main(Path(folder) / "budget.db"))
