"""The apache-iggy client's own send and poll loops, and IggyLog's append and read over them.

200 000 records of a 110-byte JSON body and the four usual ``wk-*``
headers, sent 1 000 per call to one partition and read back 1 000 per
poll, on the shared server (``WAKUWAKU_TEST_IGGY``, default
``iggy://iggy:iggy@127.0.0.1:8090``), in a stream of its own deleted after.
Prints records per second for each loop.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from apache_iggy import Consumer, IggyClient, PollingStrategy, SendMessage

from wakuwaku.logs.iggy import IggyLog

URL = os.environ.get("WAKUWAKU_TEST_IGGY", "iggy://iggy:iggy@127.0.0.1:8090")
COUNT, BATCH = 200_000, 1_000
HEADERS = {"wk-v": b"1", "wk-type": b"bench.item", "wk-key": b"key-17", "wk-alg": b"plain"}
BODY = b'{"key":"key-17","n":12345,"note":"' + b"x" * 70 + b'"}'


async def main() -> None:
    stream = f"wkbench{uuid.uuid4().hex[:8]}"
    client = IggyClient.from_connection_string(URL)
    await client.connect()
    await client.create_stream(stream)
    await client.create_topic(stream, "raw", 1)
    try:
        started = time.perf_counter()
        for _ in range(COUNT // BATCH):
            batch = [SendMessage(BODY, HEADERS) for _ in range(BATCH)]
            await client.send_messages(stream, "raw", 0, batch)
        print(f"client send: {COUNT / (time.perf_counter() - started):,.0f} records/s")
        started, offset, reader = time.perf_counter(), 0, Consumer.Single("bench")
        while offset < COUNT:
            got = await client.poll_messages(
                stream,
                "raw",
                consumer=reader,
                polling_strategy=PollingStrategy.Offset(offset),
                count=BATCH,
                auto_commit=False,
                partition_id=0,
            )
            for message in got:
                message.payload()
                message.user_headers()
            offset = got[-1].offset() + 1
        print(f"client poll + headers: {COUNT / (time.perf_counter() - started):,.0f} records/s")
        log = IggyLog.from_url(f"{URL}?stream={stream}")
        await log.create_topic("log", 1)
        started = time.perf_counter()
        for _ in range(COUNT // BATCH):
            await log.append("log", 0, [(HEADERS, BODY)] * BATCH)
        print(f"IggyLog append: {COUNT / (time.perf_counter() - started):,.0f} records/s")
        started, offset = time.perf_counter(), 0
        while offset < COUNT:
            page = await log.read("log", 0, offset, BATCH)
            offset = page[-1].offset + 1
        print(f"IggyLog read: {COUNT / (time.perf_counter() - started):,.0f} records/s")
        await log.close()
    finally:
        await client.delete_stream(stream)


if __name__ == "__main__":
    asyncio.run(main())
