"""Traces from producer to consumer with OpenTelemetry (pip install 'wakuwaku[otel]').

The producer publishes inside a span; the consumer's span for the chunk
continues that trace. A key that fails Retryable once is attempted again,
and the attempt's span links to the failed one. Spans go to an in-memory
exporter and are printed: name, key, attempt, failure class, parent and links.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, handler

exporter = InMemorySpanExporter()  # in production: an OTLP exporter
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # before the first chunk: wakuwaku traces from then on


@wk.event("shop.order-placed", key="order_id")
class OrderPlaced(msgspec.Struct, frozen=True):
    order_id: str
    cents: int


failures = {"o-2": 1}  # o-2 fails once, then succeeds on its retry attempt


@handler(OrderPlaced)
async def bill(orders: Sequence[OrderPlaced]) -> None:
    for order in orders:
        if failures.get(order.order_id, 0) > 0:
            failures[order.order_id] -= 1
            raise wk.Retryable("payment service busy")


async def main() -> None:
    log = wk.MemoryLog()
    await log.create_topic("orders", 1)
    with trace.get_tracer("shop").start_as_current_span("checkout"):
        await wk.Producer(log, "orders").publish_many(
            [OrderPlaced("o-1", 500), OrderPlaced("o-2", 700)]
        )
    config = ConsumerConfig(topic="orders", group="billing", retry_delays=(0.05,))
    await Consumer(config, [bill], log).drain()
    names = {s.context.span_id: s.name for s in exporter.get_finished_spans() if s.context}
    for span in exporter.get_finished_spans():
        attributes = span.attributes or {}
        if span.name != "process orders":
            continue
        parent = names.get(span.parent.span_id, "-") if span.parent else "-"
        print(
            f"{span.name}: key {attributes['wakuwaku.key']!s}"
            f" attempt {attributes['wakuwaku.attempt']!s}"
            f" failure {attributes.get('wakuwaku.failure_class', '-')} parent {parent}"
            f" links {len(span.links)}"
        )


if __name__ == "__main__":
    asyncio.run(main())
