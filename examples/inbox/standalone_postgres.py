"""The PostgreSQL inbox in an async handler of another consumer (docs/inbox.md).

The shape of an aiokafka or faststream handler: it gets one message with its
topic, partition and offset, and applies it in one psycopg transaction that
also claims the message's key. Needs ``pip install 'wakuwaku[postgres]'``.
Run::

    python examples/inbox/standalone_postgres.py postgresql://localhost/app [SUFFIX]

(``SUFFIX`` is appended to the table names, so runs can share a database.)
"""

from __future__ import annotations

import asyncio
import json
import sys

import psycopg

from wakuwaku.inbox import InboxKey
from wakuwaku.inbox.postgres import PostgresInbox

MESSAGES = [
    ("payments", 0, 0, b'{"account": "alice", "cents": 500}'),
    ("payments", 0, 1, b'{"account": "bob", "cents": 300}'),
    ("payments", 0, 0, b'{"account": "alice", "cents": 500}'),  # delivered again
]


async def handle(
    conn: psycopg.AsyncConnection,
    inbox: PostgresInbox,
    balance: str,
    topic: str,
    partition: int,
    offset: int,
    payload: bytes,
) -> bool:
    """Apply one message exactly once; returns whether it was applied now."""
    key = InboxKey.for_message(topic, partition, offset)
    try:
        async with conn.transaction():
            claim = await inbox.claim(conn, [key])
            if not claim.new:
                return False  # applied before: skip
            message = json.loads(payload)
            await conn.execute(
                f"INSERT INTO {balance} VALUES (%s, %s) ON CONFLICT (account) "
                f"DO UPDATE SET cents = {balance}.cents + EXCLUDED.cents",
                (message["account"], message["cents"]),
            )
            return True
    except Exception as exc:
        # The transaction rolled back, claim included; record the failure apart.
        await inbox.record_failure(key, exc)
        raise


async def main(dsn: str, suffix: str = "") -> None:
    balance = f"balance{suffix}"
    inbox = PostgresInbox(dsn, group="balances", table=f"wk_inbox{suffix}")
    await inbox.ensure_schema()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {balance} "
            "(account text PRIMARY KEY, cents bigint NOT NULL)"
        )
        for topic, partition, offset, payload in MESSAGES:
            applied = await handle(conn, inbox, balance, topic, partition, offset, payload)
            print(f"{'applied' if applied else 'skipped duplicate'} {topic}/{partition}/{offset}")
        cur = await conn.execute(f"SELECT account, cents FROM {balance} ORDER BY account")
        for account, cents in await cur.fetchall():
            print(f"balance {account} = {cents}")


if __name__ == "__main__":
    if not 2 <= len(sys.argv) <= 3:
        sys.exit(f"usage: python {sys.argv[0]} POSTGRES_DSN [SUFFIX]")
    asyncio.run(main(*sys.argv[1:3]))
