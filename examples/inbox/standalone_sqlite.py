"""The inbox in a consumer that is not wakuwaku's own (docs/inbox.md).

Any consumer that knows a message's topic, partition and offset (aiokafka,
faststream, a hand-written loop) can get exactly-once effects: claim the
message's key in the same SQLite transaction as the effect, skip it when the
claim says duplicate, and record failures on the inbox's own connection.

Here a plain list plays the broker: it delivers three messages a second time
(as after a rebalance) and one message that always fails. Run::

    python examples/inbox/standalone_sqlite.py [DATABASE_FILE]
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

from wakuwaku.inbox import InboxKey, SQLiteInbox

# (topic, partition, offset, payload) as another consumer library hands them over.
MESSAGES = [
    ("payments", 0, 0, b'{"account": "alice", "cents": 500}'),
    ("payments", 0, 1, b'{"account": "bob", "cents": 300}'),
    ("payments", 1, 0, b'{"account": "alice", "cents": 250}'),
    ("payments", 1, 1, b'{"account": "bob", "cents": "lots"}'),  # always fails
    ("payments", 0, 2, b'{"account": "bob", "cents": 120}'),
]
DELIVERIES = MESSAGES + MESSAGES[:3] + [MESSAGES[3]] * 2  # redeliveries and retries


async def consume(database: Path) -> None:
    inbox = SQLiteInbox(database, group="balances", max_attempts=3)
    await inbox.ensure_schema()
    conn = sqlite3.connect(database, isolation_level=None)  # we say BEGIN ourselves
    conn.execute("CREATE TABLE IF NOT EXISTS balance (account TEXT PRIMARY KEY, cents INTEGER)")

    for topic, partition, offset, payload in DELIVERIES:
        key = InboxKey.for_message(topic, partition, offset)
        conn.execute("BEGIN IMMEDIATE")
        try:
            claim = inbox.claim(conn, [key])  # in the same transaction as the effect
            if claim.new:
                message = json.loads(payload)
                cents = message["cents"]
                if not isinstance(cents, int):
                    raise ValueError(f"cents must be an integer, got {cents!r}")
                conn.execute(
                    "INSERT INTO balance VALUES (?, ?) "
                    "ON CONFLICT (account) DO UPDATE SET cents = cents + excluded.cents",
                    (message["account"], cents),
                )
            conn.execute("COMMIT")
        except (ValueError, KeyError) as exc:  # what this handler can fail with
            conn.execute("ROLLBACK")  # the claim rolls back with the effect
            outcome = await inbox.record_failure(key, exc)  # its own transaction
            print(
                f"failed {key.message_key}: attempt {outcome.attempts}, "
                f"dead-lettered={outcome.dead_lettered}"
            )
            continue
        print(f"{'applied' if claim.new else 'skipped duplicate'} {key.message_key}")

    for account, cents in conn.execute("SELECT account, cents FROM balance ORDER BY account"):
        print(f"balance {account} = {cents}")
    stats = await inbox.stats()
    print(f"claims={stats.claims} failing={stats.failing} dead={stats.dead}")
    conn.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(consume(Path(sys.argv[1])))
    else:
        with tempfile.TemporaryDirectory() as directory:
            asyncio.run(consume(Path(directory) / "balances.db"))
