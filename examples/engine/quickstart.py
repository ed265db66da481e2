"""Quickstart: declare events, publish them, consume them with the three failure classes.

Run it: ``python examples/engine/quickstart.py`` (an in-memory log, a short
retry schedule; it prints what happened and exits).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import msgspec

import wakuwaku


@wakuwaku.event("shop.stock-adjusted", key="sku", algebra="associative")
class StockAdjusted(msgspec.Struct, frozen=True):
    sku: str
    delta: int

    def combine(self, other: StockAdjusted) -> StockAdjusted:
        return StockAdjusted(self.sku, self.delta + other.delta)


stock: dict[str, int] = {}
known_skus = {"apple", "pear"}


@wakuwaku.handler(StockAdjusted, max_batch=10)
async def apply_stock(run: Sequence[StockAdjusted]) -> None:
    for adjustment in run:
        if adjustment.sku == "poison":
            raise wakuwaku.Unrecoverable(ValueError("no such product, ever"))
        if adjustment.sku not in known_skus:
            # The product row may be created later by another stream.
            raise wakuwaku.Retryable(LookupError(f"no stock row for {adjustment.sku}"))
        stock[adjustment.sku] = stock.get(adjustment.sku, 0) + adjustment.delta


async def main() -> None:
    log = wakuwaku.MemoryLog()
    await log.create_topic("inventory", 2)
    producer = wakuwaku.Producer(log, "inventory")
    await producer.publish_many(
        [
            StockAdjusted("apple", 5),
            StockAdjusted("apple", -2),
            StockAdjusted("plum", 7),
            StockAdjusted("poison", 1),
            StockAdjusted("pear", 1),
        ]
    )
    config = wakuwaku.ConsumerConfig(topic="inventory", group="stock", retry_delays=[0.05, 0.1])
    consumer = wakuwaku.Consumer(config, [apply_stock], log)
    stats = await consumer.drain()
    print("stock:", dict(sorted(stock.items())))
    print("reduced away:", stats.reduced_away, "dead letters:", dict(stats.dead_letters))


if __name__ == "__main__":
    stderr = logging.StreamHandler()
    # Appends the fields each log line carries (topic, partition, key, offsets...).
    stderr.setFormatter(wakuwaku.StructuredFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[stderr])
    asyncio.run(main())
