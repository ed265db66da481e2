"""OpenTelemetry traces from producer to consumer (the ``otel`` extra).

With ``opentelemetry-api`` installed (``pip install 'wakuwaku[otel]'``):

- :class:`~wakuwaku.Producer` injects the current trace context into each
  record's properties (``wk-props``) with the globally configured
  propagator, W3C Trace Context by default: ``traceparent`` and, when set,
  ``tracestate`` (and ``baggage``);
- the consumer makes one span per handler call (one chunk), kind CONSUMER,
  named ``process <topic>``. Its parent is the context in the chunk's first
  record (the trace continues); the other records' distinct contexts are
  links. Attributes: ``messaging.system`` (``wakuwaku``),
  ``messaging.destination.name`` (topic),
  ``messaging.destination.partition.id``, ``messaging.batch.message_count``,
  ``wakuwaku.key``, ``wakuwaku.type``, ``wakuwaku.attempt`` (0 on the main
  topic, n for the n-th retry attempt), ``wakuwaku.offsets`` (main-topic
  offsets) and, when the call failed, ``wakuwaku.failure_class``
  (``transient``, ``retryable`` or ``unrecoverable``) with status ERROR and
  the exception recorded;
- a retry attempt's span (attempt >= 1) and a Transient retry in place link
  to the span of the key's last failed chunk in this process (the link is
  lost across a restart: the retry topic does not store span ids).

The handler's own spans are children of the chunk's span (it is current
while the handler runs). Until the application sets a tracer provider (the
SDK), the hooks return at once (no no-op spans: they cost 70 % of a no-op
handler's throughput, benchmarks/bench_tracing.py); without
``opentelemetry-api`` installed nothing is imported and every hook is a
function returning at once.
``WAKUWAKU_TRACING=off`` turns the hooks off with the package installed.
Spans are exported by whatever ``TracerProvider`` the application sets
(``opentelemetry.trace.set_tracer_provider``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanContext

__all__ = ("AVAILABLE", "ChunkSpan", "chunk_span", "inject", "refresh")

logger = logging.getLogger("wakuwaku.tracing")

AVAILABLE = (
    importlib.util.find_spec("opentelemetry") is not None  # finds, does not import
    and os.environ.get("WAKUWAKU_TRACING", "").lower() not in ("0", "off", "false", "no")
)
"""True when the hooks trace: opentelemetry-api is installed and
``WAKUWAKU_TRACING`` is not ``off``."""

_FAILED_KEYS = 10_000
"""Keys whose last failed span is remembered for links (least recently failed dropped)."""
_LINKS = 32
"""At most this many links per span (distinct producer contexts, then the failure)."""


class _Failure(Protocol):
    @property
    def value(self) -> str: ...


class ChunkSpan:
    """The span of one handler call; :meth:`end` closes it with the outcome."""

    __slots__ = ("_memory", "_span", "_token")

    def __init__(self, span: Span, token: object, memory: tuple[str, int, str]) -> None:
        self._span = span
        self._token = token
        self._memory = memory

    def end(self, failure: tuple[_Failure, BaseException] | None) -> None:
        """Close the span: OK, or ERROR with ``wakuwaku.failure_class`` and the
        exception; remember a failed span for the key's next attempt's link.
        Never raises (an error is logged): tracing never stops consumption."""
        try:
            self._end(failure)
        except Exception:
            logger.exception("tracing: cannot end a chunk span", extra={"key": self._memory[2]})

    def _end(self, failure: tuple[_Failure, BaseException] | None) -> None:
        from opentelemetry import context, trace

        span = self._span
        if failure is None or failure[0].value == "unrecoverable":
            _failed.pop(self._memory, None)  # no call of this chunk follows
        if failure is not None:
            error_class, exc = failure
            span.set_attribute("wakuwaku.failure_class", error_class.value)
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
        if failure is not None and failure[0].value != "unrecoverable":
            # a Retryable chunk is attempted again later, a Transient one in place
            _failed[self._memory] = span.get_span_context()
            _failed.move_to_end(self._memory)
            while len(_failed) > _FAILED_KEYS:
                _failed.popitem(last=False)
        span.end()
        context.detach(self._token)  # type: ignore[arg-type]


_failed: OrderedDict[tuple[str, int, str], SpanContext] = OrderedDict()


def _extract(props: Mapping[str, str]) -> Context | None:
    if "traceparent" not in props:
        return None
    from opentelemetry import propagate

    return propagate.extract(props)


_provider_set = False
_checked_at = -1e18


def _recording() -> bool:
    """True once the application set a tracer provider (an SDK): before that,
    every span would be a no-op one and the hooks skip the work. Checked at
    most once a second (a provider, once set, cannot be replaced)."""
    global _provider_set, _checked_at
    if _provider_set:
        return True
    now = time.monotonic()
    if now - _checked_at < 1.0:
        return False
    _checked_at = now
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    _provider_set = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return _provider_set


def refresh() -> bool:
    """Look for a tracer provider now, not at the next once-a-second check (call
    it after ``set_tracer_provider`` when the very next chunks must be traced).

    :returns: True when chunks are traced from now on.
    """
    global _checked_at
    _checked_at = -1e18
    return AVAILABLE and _recording()


def _chunk_span_on(
    topic: str, partition: int, key: str, type_tag: str, chunk: Any, attempt: int
) -> ChunkSpan | _NoSpan:
    try:
        if not _recording():
            return _NO_SPAN
        return _start(topic, partition, key, type_tag, chunk, attempt)
    except Exception:  # tracing never stops consumption
        logger.exception(
            "tracing: cannot start a chunk span",
            extra={"topic": topic, "partition": partition, "key": key, "type": type_tag},
        )
        return _NO_SPAN


def _start(
    topic: str, partition: int, key: str, type_tag: str, chunk: Any, attempt: int
) -> ChunkSpan:
    from opentelemetry import context, trace

    # The engine's run: per event an Item (props, main_offsets) or, for a
    # main-topic record without wk-props, the bare Record (no context to read).
    entries: Sequence[Any] = chunk.entries
    parent: Context | None = None
    links: list[Link] = []
    seen: set[int] = set()
    offsets: list[int] = []
    for entry in entries:
        props = getattr(entry, "props", None)
        if props is None:
            offsets.append(entry.offset)
            continue
        offsets.extend(entry.main_offsets)
        found = _extract(props)
        if found is None:
            continue
        span_context = trace.get_current_span(found).get_span_context()
        if not span_context.is_valid or span_context.span_id in seen:
            continue
        seen.add(span_context.span_id)
        if parent is None:
            parent = found
        elif len(links) < _LINKS - 1:
            links.append(trace.Link(span_context))
    memory = (topic, partition, key)
    failed = _failed.get(memory)
    if failed is not None:
        links.append(trace.Link(failed, {"wakuwaku.link": "failed_chunk"}))
    span = trace.get_tracer("wakuwaku").start_span(
        f"process {topic}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "messaging.system": "wakuwaku",
            "messaging.operation.type": "process",
            "messaging.destination.name": topic,
            "messaging.destination.partition.id": str(partition),
            "messaging.batch.message_count": len(entries),
            "wakuwaku.key": key,
            "wakuwaku.type": type_tag,
            "wakuwaku.attempt": attempt,
            "wakuwaku.offsets": offsets,
        },
    )
    token = context.attach(trace.set_span_in_context(span))
    return ChunkSpan(span, token, memory)


class _NoSpan:
    """What :func:`chunk_span` returns when tracing is off: ``end`` does nothing."""

    __slots__ = ()

    def end(self, failure: tuple[_Failure, BaseException] | None) -> None:
        """Nothing to close."""


_NO_SPAN = _NoSpan()


def _chunk_span_off(
    topic: str, partition: int, key: str, type_tag: str, chunk: Any, attempt: int
) -> ChunkSpan | _NoSpan:
    return _NO_SPAN


def _inject_on(properties: Mapping[str, str] | None) -> Mapping[str, str] | None:
    from opentelemetry import propagate, trace

    if not _recording() or not trace.get_current_span().get_span_context().is_valid:
        return properties
    carrier: dict[str, str] = dict(properties or {})
    propagate.inject(carrier)
    return carrier


def _inject_off(properties: Mapping[str, str] | None) -> Mapping[str, str] | None:
    return properties


chunk_span = _chunk_span_on if AVAILABLE else _chunk_span_off
"""``chunk_span(topic, partition, key, type_tag, chunk, attempt)``: start the span of
one handler call and make it current; returns an object whose
``end(failure)`` closes it (:meth:`ChunkSpan.end`; one that does nothing when
tracing is off). ``chunk`` is the
engine's run (its items carry ``props`` and ``main_offsets``)."""

inject = _inject_on if AVAILABLE else _inject_off
"""``inject(properties)``: ``properties`` with the current trace context added
(a new dict), or unchanged when there is no current span or tracing is off."""
