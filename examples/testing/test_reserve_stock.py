"""Testing a wakuwaku handler with pytest: the memory log and a fake clock (docs/testing.md).

A test file to copy next to your own tests. The event and the handler at the
top stand for your code; the fixtures and tests below are the part to keep.
It needs pytest and pytest-asyncio (in either of its modes). Run it where you
copied it::

    python -m pytest test_reserve_stock.py

(The test suite runs a copy so, in a directory of its own: in this
repository, pytest's ``--markdown-docs`` option would import the file a
second time under another name, and its event type would be registered twice.)

No server and no real sleeping: the log lives in memory, and the fake clock
jumps to the next retry attempt as soon as everything else waits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import msgspec
import pytest
import pytest_asyncio

import wakuwaku
from wakuwaku.admin import list_dead_letters
from wakuwaku.engine import QuarantinedKey
from wakuwaku.testing import FakeClock, MemoryLog, running, wait_until

# ---------------------------------------------------------------- your code


@wakuwaku.event("example.order-placed", key="order_id")
class OrderPlaced(msgspec.Struct, frozen=True):
    order_id: str
    sku: str
    quantity: int


class Warehouse:
    """What the handler writes to (in your code, a database)."""

    def __init__(self, stock: dict[str, int]) -> None:
        self.stock = dict(stock)
        self.reserved: dict[str, int] = {}


def reserve_handler(warehouse: Warehouse) -> wakuwaku.Handler[OrderPlaced]:
    """The handler, built around its dependency so that a test can give it a fake one."""

    @wakuwaku.handler(OrderPlaced)
    async def reserve(run: Sequence[OrderPlaced]) -> None:
        for order in run:
            if order.quantity <= 0:
                raise wakuwaku.Unrecoverable(ValueError(f"quantity {order.quantity}"))
            if order.sku not in warehouse.stock:
                # The product may be added later: this key waits, the others go on.
                raise wakuwaku.Retryable(LookupError(f"no stock row for {order.sku}"))
            warehouse.stock[order.sku] -= order.quantity
            warehouse.reserved[order.order_id] = order.quantity

    return reserve


# ----------------------------------------------------------------- fixtures


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest_asyncio.fixture
async def log() -> AsyncIterator[MemoryLog]:
    log = MemoryLog()
    await log.create_topic("orders", 2)
    yield log
    await log.close()


@pytest.fixture
def warehouse() -> Warehouse:
    return Warehouse({"apple": 10})


@pytest.fixture
def producer(log: MemoryLog) -> wakuwaku.Producer:
    return wakuwaku.Producer(log, "orders")


@pytest.fixture
def consumer(log: MemoryLog, clock: FakeClock, warehouse: Warehouse) -> wakuwaku.Consumer:
    config = wakuwaku.ConsumerConfig(
        topic="orders", group="stock", clock=clock, retry_delays=(2.0, 4.0)
    )
    return wakuwaku.Consumer(config, [reserve_handler(warehouse)], log)


# -------------------------------------------------------------------- tests


def quarantined(consumer: wakuwaku.Consumer) -> list[QuarantinedKey]:
    """The keys waiting for a retry attempt, over the consumer's partitions."""
    return [key for view in consumer.partitions() for key in view.quarantined]


@pytest.mark.asyncio
async def test_orders_are_reserved(
    producer: wakuwaku.Producer, consumer: wakuwaku.Consumer, warehouse: Warehouse
) -> None:
    await producer.publish_many([OrderPlaced("o-1", "apple", 2), OrderPlaced("o-2", "apple", 3)])
    stats = await consumer.drain()
    assert warehouse.reserved == {"o-1": 2, "o-2": 3}
    assert warehouse.stock == {"apple": 5}
    assert stats.handled == 2 and stats.dead_lettered() == 0


@pytest.mark.asyncio
async def test_an_unknown_product_waits_in_quarantine_until_its_retry(
    producer: wakuwaku.Producer,
    consumer: wakuwaku.Consumer,
    warehouse: Warehouse,
    clock: FakeClock,
) -> None:
    await producer.publish(OrderPlaced("o-3", "pear", 1))
    async with running(consumer):
        await wait_until(clock, lambda: quarantined(consumer))
        [key] = quarantined(consumer)
        assert (key.key, key.failures) == ("o-3", 1)
        assert key.next_attempt_at == key.first_failed_at + 2.0  # the first retry delay
        await clock.sleep(1.5)  # not due yet
        assert "o-3" not in warehouse.reserved
        warehouse.stock["pear"] = 4  # the product arrives
        await wait_until(clock, lambda: "o-3" in warehouse.reserved)  # the attempt ran
        assert clock.now() >= key.next_attempt_at
        assert quarantined(consumer) == []
    assert consumer.stats.attempts == 1


@pytest.mark.asyncio
async def test_a_bad_order_is_dead_lettered_with_its_reason(
    producer: wakuwaku.Producer, consumer: wakuwaku.Consumer, log: MemoryLog
) -> None:
    await producer.publish_many([OrderPlaced("o-4", "apple", 0), OrderPlaced("o-5", "plum", 1)])
    await consumer.drain()  # waits out o-5's retries: 2 + 4 s on the fake clock
    letters = await list_dead_letters(log, "orders", group="stock")
    assert sorted((letter.key, letter.reason) for letter in letters) == [
        ("o-4", "unrecoverable"),
        ("o-5", "gave_up_retry"),
    ]
    [bad] = [letter for letter in letters if letter.key == "o-4"]
    assert bad.error == "Unrecoverable: ValueError: quantity 0"
    assert wakuwaku.event_type(OrderPlaced).decode(bad.body) == OrderPlaced("o-4", "apple", 0)
