"""The operations commands on the server logs (`wakuwaku status/tail/dlq`
work on them): one consumer run leaves a quarantined key and a dead letter
on Redis or NATS, and every command reads them back."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator, Sequence

import msgspec
import pytest

import wakuwaku as wk
from wakuwaku.cli import ExitCode, main
from wakuwaku.engine import Consumer, ConsumerConfig, Handler

from ..conftest import NATS_URL, REDIS_URL
from ..logs.test_redis import purge
from ..nats_support import drop_prefix


@wk.event("tests.cli.server-order", key="sku")
class Order(msgspec.Struct, frozen=True):
    sku: str
    n: int


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("nats", marks=pytest.mark.nats),
    ]
)
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis":
        prefix = f"wkcli-{uuid.uuid4().hex[:12]}"
        yield f"{REDIS_URL}?prefix={prefix}"
        asyncio.run(purge(REDIS_URL, prefix))
    else:
        prefix = f"wkcli{uuid.uuid4().hex[:12]}"
        yield f"{NATS_URL}?prefix={prefix}"
        asyncio.run(drop_prefix(NATS_URL, prefix))


async def _leave_a_dead_letter_and_a_quarantined_key(url: str) -> None:
    log = wk.open_log(url)
    try:
        await log.create_topic("orders", 2)
        await wk.Producer(log, "orders").publish_many(
            [Order("bad", 1), Order("late", 2), Order("ok", 3)]
        )

        async def handle(run: Sequence[Order]) -> None:
            if run[0].sku == "bad":
                raise wk.Unrecoverable("cannot parse the order")
            if run[0].sku == "late":
                raise wk.Retryable("stock row not there yet")

        config = ConsumerConfig(
            topic="orders", group="billing", retry_delays=(3600.0,), poll_interval=0.01
        )
        consumer = Consumer(config, [Handler(Order, handle)], log)
        task = asyncio.create_task(consumer.run(install_signal_handlers=False))
        deadline = asyncio.get_running_loop().time() + 30
        while not (
            consumer.stats.quarantined_keys
            and consumer.stats.dead_lettered()
            and consumer.assignment()
            and all(v.caught_up for v in consumer.partitions())
        ):
            assert asyncio.get_running_loop().time() < deadline, "the consumer got stuck"
            await asyncio.sleep(0.02)
        consumer.stop()
        await task
    finally:
        await log.close()


def test_status_dlq_and_tail_read_a_server_log(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_leave_a_dead_letter_and_a_quarantined_key(server_url))
    capsys.readouterr()

    assert main(["status", "orders", "-g", "billing", "--json", "--log", server_url]) == ExitCode.OK
    status = json.loads(capsys.readouterr().out)
    assert [q["key"] for q in status["quarantined"]] == ["late"]

    assert (
        main(["dlq", "list", "orders", "-g", "billing", "--json", "--log", server_url])
        == ExitCode.OK
    )
    [letter] = json.loads(capsys.readouterr().out)
    assert (letter["key"], letter["reason"]) == ("bad", "unrecoverable")

    assert main(["tail", "orders", "--from-beginning", "--log", server_url]) == ExitCode.OK
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(line["body"]["n"] for line in lines) == [1, 2, 3]

    assert (
        main(["dlq", "replay", "orders", "-g", "billing", "--dry-run", "--log", server_url])
        == ExitCode.OK
    )
    assert "would replay 1 dead letter into" in capsys.readouterr().out
