"""OpenTelemetry (the ``otel`` extra, wakuwaku.tracing): the producer injects W3C
trace context into ``wk-props``, the consumer makes one span per chunk that
continues it, and a retry attempt links to the failed chunk's span. Spans are
read with the SDK's in-memory exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler, SamplingResult

import wakuwaku as wk
from wakuwaku import tracing
from wakuwaku.engine import Handler
from wakuwaku.logs import Log
from wakuwaku.testing import FakeClock

from .conftest import Item, consumer, read_all, setup_topic

_EXPORTER = InMemorySpanExporter()


class _Switch(Sampler):
    """Samples while a tracing test runs; drops afterwards, so the tests that run
    later in this process (the provider cannot be unset) make no recorded spans."""

    on = False

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return (ALWAYS_ON if self.on else ALWAYS_OFF).should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return "wakuwaku tests: on while a tracing test runs"


_SWITCH = _Switch()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once: OpenTelemetry allows one) with an
    in-memory exporter, sampling and emptied for each test only."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider(sampler=_SWITCH)
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    assert tracing.refresh()  # not a second later
    _EXPORTER.clear()
    _SWITCH.on = True
    try:
        yield _EXPORTER
    finally:
        _SWITCH.on = False
        _EXPORTER.clear()


def chunk_spans(exporter: InMemorySpanExporter, key: str) -> list[ReadableSpan]:
    found = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "process t" and s.attributes and s.attributes.get("wakuwaku.key") == key
    ]
    return sorted(found, key=lambda s: s.start_time or 0)


async def test_the_consumer_continues_the_producers_trace_one_span_per_chunk(
    log: Log, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    assert tracing.AVAILABLE
    producer = await setup_topic(log)
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("checkout") as parent:
        await producer.publish_many([Item("a", 1), Item("a", 2)])
    await producer.publish(Item("b", 3))  # no current span: no trace context
    [first, _, third] = await read_all(log, "t")
    props = json.loads(first.headers["wk-props"])
    context = parent.get_span_context()
    assert props["traceparent"] == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    )
    assert "wk-props" not in third.headers or "traceparent" not in json.loads(
        third.headers["wk-props"]
    )

    seen: list[bool] = []

    async def handle(chunk: Sequence[Item]) -> None:
        seen.append(trace.get_current_span().get_span_context().is_valid)

    await consumer(log, clock, [Handler(Item, handle, max_batch=10)]).drain()
    [span_a] = chunk_spans(spans, "a")
    assert span_a.parent is not None and span_a.parent.span_id == context.span_id
    assert span_a.context is not None and span_a.context.trace_id == context.trace_id
    assert span_a.kind is trace.SpanKind.CONSUMER
    assert dict(span_a.attributes or {}) == {
        "messaging.system": "wakuwaku",
        "messaging.operation.type": "process",
        "messaging.destination.name": "t",
        "messaging.destination.partition.id": "0",
        "messaging.batch.message_count": 2,
        "wakuwaku.key": "a",
        "wakuwaku.type": "test.item",
        "wakuwaku.attempt": 0,
        "wakuwaku.offsets": (0, 1),
    }
    assert span_a.status.is_ok
    [span_b] = chunk_spans(spans, "b")
    assert span_b.parent is None  # a record without context starts a trace
    assert seen == [True, True]  # the chunk's span is current in the handler


async def test_failures_are_classified_and_a_retry_attempt_links_to_the_failed_span(
    log: Log, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    producer = await setup_topic(log)
    await producer.publish_many([Item("flaky", 1), Item("poison", 2)])
    calls = {"flaky": 0}

    async def handle(chunk: Sequence[Item]) -> None:
        for item in chunk:
            if item.key == "poison":
                raise wk.Unrecoverable("bad total")
            calls["flaky"] += 1
            if calls["flaky"] <= 2:
                raise wk.Retryable("row locked")

    await consumer(log, clock, [Handler(Item, handle)], retry_delays=(1.0, 2.0, 4.0)).drain()
    first, retry1, retry2 = chunk_spans(spans, "flaky")
    assert [s.attributes["wakuwaku.attempt"] for s in (first, retry1, retry2)] == [0, 1, 2]  # type: ignore[index]
    for failed in (first, retry1):
        assert failed.attributes["wakuwaku.failure_class"] == "retryable"  # type: ignore[index]
        assert failed.status.status_code is trace.StatusCode.ERROR
        assert [e.name for e in failed.events] == ["exception"]
    assert retry2.status.is_ok and "wakuwaku.failure_class" not in (retry2.attributes or {})
    # each attempt links to the chunk span that failed before it
    assert first.context is not None and retry1.context is not None
    assert [link.context.span_id for link in retry1.links] == [first.context.span_id]
    assert [link.context.span_id for link in retry2.links] == [retry1.context.span_id]
    assert retry1.attributes["wakuwaku.offsets"] == (0,)  # type: ignore[index]
    [poison] = chunk_spans(spans, "poison")
    assert poison.attributes["wakuwaku.failure_class"] == "unrecoverable"  # type: ignore[index]
    assert poison.links == ()


def test_no_opentelemetry_import_until_a_chunk_is_traced_and_off_by_env() -> None:
    code = (
        "import sys, wakuwaku, wakuwaku.engine, wakuwaku.tracing as t;"
        "print(any(m.startswith('opentelemetry') for m in sys.modules), t.AVAILABLE,"
        " t.chunk_span('t', 0, 'k', 'x', None, 0).end(None))"
    )
    env = {**os.environ, "WAKUWAKU_TRACING": "off"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "False", "None"]
    env.pop("WAKUWAKU_TRACING")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code.replace(" t.chunk_span('t', 0, 'k', 'x', None, 0).end(None)", " 0"),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["False", "True", "0"]
