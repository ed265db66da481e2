"""Prometheus metrics of a consumer (design §14), an optional extra.

Install with ``pip install 'wakuwaku[prometheus]'``; the root package never
imports this module. A custom collector reads the consumer's always-on
:class:`~wakuwaku.engine.ConsumerStats` and its partition workers' retry
state at scrape time, so nothing is counted twice and the handler path pays
nothing for metrics::

    from prometheus_client import CollectorRegistry, start_http_server
    from wakuwaku.metrics import ConsumerCollector

    collector = ConsumerCollector(consumer)
    registry = CollectorRegistry()
    registry.register(collector)
    start_http_server(9100, registry=registry)
    asyncio.create_task(collector.keep_lag_fresh())   # lag needs the log's end offsets

``wakuwaku run module:consumer --metrics-port 9100`` does all of that. Several
consumers of one process share one collector (``ConsumerCollector(a, b)``),
their samples told apart by the ``group`` label.

=====================================================  =======  ==========================
metric                                                 type     labels
=====================================================  =======  ==========================
``wakuwaku_polled_records_total``                      counter  group
``wakuwaku_handled_records_total``                     counter  group
``wakuwaku_handler_calls_total`` (successful calls)    counter  group
``wakuwaku_handler_failures_total``                    counter  group, class
``wakuwaku_dead_letters_total``                        counter  group, reason
``wakuwaku_reduced_away_records_total``                counter  group
``wakuwaku_inbox_skipped_records_total``               counter  group
``wakuwaku_other_group_skipped_records_total``         counter  group
``wakuwaku_offset_gap_records_total``                  counter  group
``wakuwaku_routed_records_total``                      counter  group
``wakuwaku_retry_written_records_total``               counter  group
``wakuwaku_quarantines_total``                         counter  group
``wakuwaku_retry_attempts_total``                      counter  group
``wakuwaku_retry_attempts_failed_total``               counter  group
``wakuwaku_retry_give_ups_total``                      counter  group
``wakuwaku_transient_pauses_total``                    counter  group
``wakuwaku_log_call_retries_total``                    counter  group
``wakuwaku_partition_stalls_total``                    counter  group
``wakuwaku_handler_seconds`` (count: every call)       summary  group
``wakuwaku_retry_backlog_records``                     gauge    group, topic, partition
``wakuwaku_quarantined_keys``                          gauge    group, topic, partition
``wakuwaku_partition_paused`` (1: an operator paused)  gauge    group, topic, partition
``wakuwaku_paused_keys``                               gauge    group, topic, partition
``wakuwaku_next_retry_attempt_timestamp_seconds``      gauge    group, topic, partition
``wakuwaku_lag_records``                               gauge    group, topic, partition
=====================================================  =======  ==========================

Handler latency is a summary (count and sum), so ``rate(sum) / rate(count)``
is the mean call time (seconds); :class:`ConsumerStats` keeps no per-call
distribution, so there are no quantiles or buckets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, TypeVar

try:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        Metric,
        SummaryMetricFamily,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "wakuwaku.metrics needs prometheus-client: pip install 'wakuwaku[prometheus]'"
    ) from exc

from ._errors import ConfigError

if TYPE_CHECKING:
    from .engine import Consumer, ConsumerStats

__all__ = ("ConsumerCollector", "start_metrics_server")

logger = logging.getLogger("wakuwaku.metrics")

T = TypeVar("T")

# (ConsumerStats field, metric name without _total, help)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("polled", "polled_records", "Main-topic records read."),
    (
        "handled",
        "handled_records",
        "Main-topic records whose events a handler completed (a reduced event counts "
        "every record it stands for).",
    ),
    ("handler_calls", "handler_calls", "Successful handle() calls."),
    ("reduced_away", "reduced_away_records", "Records merged into another event by reduction."),
    ("inbox_skipped", "inbox_skipped_records", "Records dropped because the inbox held their id."),
    (
        "other_group_skipped",
        "other_group_skipped_records",
        "Main-topic records addressed to another group (its replayed dead letters).",
    ),
    (
        "offset_gaps",
        "offset_gap_records",
        "Records deleted by retention before this group read them.",
    ),
    (
        "routed",
        "routed_records",
        "Records routed to the retry topic because their key was quarantined.",
    ),
    (
        "retry_written",
        "retry_written_records",
        "Work records written to the retry topic after a Retryable failure.",
    ),
    ("quarantined_keys", "quarantines", "Keys that entered quarantine."),
    ("attempts", "retry_attempts", "Retry attempts run (one per due key)."),
    ("attempts_failed", "retry_attempts_failed", "Retry attempts that failed Retryable."),
    ("gave_up_keys", "retry_give_ups", "Keys whose last retry attempt failed (give-ups)."),
    (
        "transient_pauses",
        "transient_pauses",
        "Transient handler failures that paused a partition (each in-place retry counts).",
    ),
    ("log_call_retries", "log_call_retries", "Failed log calls of the consumer that were retried."),
    (
        "stalls",
        "partition_stalls",
        "Partition workers restarted after making no progress while their log answered.",
    ),
)

_ATTEMPTS = 3


def _stable(read: Callable[[], T]) -> T:
    """Read a structure the event loop may be changing from another thread.

    Copying a dict while the loop thread adds a key raises RuntimeError; the
    copy is simply tried again (the loop holds the GIL only briefly).
    """
    for _ in range(_ATTEMPTS - 1):
        try:
            return read()
        except RuntimeError:
            continue
    return read()


class ConsumerCollector(Collector):
    """A Prometheus collector for one or more :class:`~wakuwaku.engine.Consumer` (design §14).

    :param consumer: the consumer; its stats and workers are read at scrape
        time (from any thread).
    :param more: further consumers of the same process (another group, other
        topics): their samples share the metric families, told apart by the
        ``group`` label (and ``topic``, ``partition``).
    :param namespace: the metric name prefix (default ``wakuwaku``).
    :raises ConfigError: when two consumers have the same group and one of
        the partition metrics would repeat a label set.

    Lag needs the log's end offsets, which only the event loop can read:
    :meth:`refresh_lag` (or :meth:`keep_lag_fresh` as a task) stores them,
    and a scrape reports ``max(0, end - position)`` per owned partition,
    where ``position`` is the worker's next offset to read. Partitions
    without a known end offset report no lag.

    Registering one collector twice (or two with the same namespace) in a
    registry raises prometheus_client's ``ValueError: Duplicated timeseries``.
    """

    def __init__(self, consumer: Consumer, *more: Consumer, namespace: str = "wakuwaku") -> None:
        self.consumers: tuple[Consumer, ...] = (consumer, *more)
        groups = [c.config.group for c in self.consumers]
        if len(set(groups)) != len(groups):
            raise ConfigError(
                f"ConsumerCollector: two consumers of one group would share samples: {groups!r}"
            )
        self.namespace = namespace
        self._ends: dict[tuple[int, str, int], int] = {}

    def _name(self, name: str) -> str:
        return f"{self.namespace}_{name}" if self.namespace else name

    async def refresh_lag(self) -> None:
        """Read the end offsets of every topic the consumers own partitions of.

        :raises LogError: what a log raises (e.g. LogUnavailableError).
        """
        for index, consumer in enumerate(self.consumers):
            topics = sorted({topic for topic, _ in _stable(consumer.assignment)})
            for topic in topics:
                for partition, end in (await consumer.log.end_offsets(topic)).items():
                    self._ends[(index, topic, partition)] = end

    async def keep_lag_fresh(self, interval: float = 10.0) -> None:
        """Call :meth:`refresh_lag` every ``interval`` seconds (on the first
        consumer's clock) until cancelled; a failing log is logged at warning
        and tried again at the next interval."""
        clock = self.consumers[0].config.clock
        while True:
            try:
                await self.refresh_lag()
            except Exception as exc:  # noqa: BLE001 - metrics must never stop the consumer
                logger.warning(
                    "cannot read end offsets for the lag metric",
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )
            await clock.sleep(interval)

    def describe(self) -> Iterator[Metric]:
        """The metric families (so a registry refuses a duplicate at registration)."""
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        """Build every metric family from the consumers' counters and workers."""
        snapshots: list[tuple[str, ConsumerStats, dict[str, int], dict[str, int]]] = [
            (
                c.config.group,
                c.stats,
                _stable(partial(dict, c.stats.failed_by_class)),
                _stable(partial(dict, c.stats.dead_letters)),
            )
            for c in self.consumers
        ]
        for field_name, name, doc in _COUNTERS:
            counter = CounterMetricFamily(self._name(name), doc, labels=["group"])
            for group, stats, _, _ in snapshots:
                counter.add_metric([group], float(getattr(stats, field_name)))
            yield counter
        failures = CounterMetricFamily(
            self._name("handler_failures"),
            "Handler failures by error class.",
            labels=["group", "class"],
        )
        dead = CounterMetricFamily(
            self._name("dead_letters"),
            "Dead-lettered records by reason code.",
            labels=["group", "reason"],
        )
        summary = SummaryMetricFamily(
            self._name("handler_seconds"),
            "Time spent in handle() calls, successful or not (seconds).",
            labels=["group"],
        )
        for group, stats, by_class, by_reason in snapshots:
            for error_class, count in sorted(by_class.items()):
                failures.add_metric([group, error_class], float(count))
            for reason, count in sorted(by_reason.items()):
                dead.add_metric([group, reason], float(count))
            summary.add_metric(
                [group],
                count_value=stats.handler_calls + sum(by_class.values()),
                sum_value=stats.handler_seconds,
            )
        yield failures
        yield dead
        yield summary
        yield from self._partition_gauges()

    def _partition_gauges(self) -> Iterator[Metric]:
        labels = ["group", "topic", "partition"]
        backlog = GaugeMetricFamily(
            self._name("retry_backlog_records"),
            "Pending work records in the retry partition.",
            labels=labels,
        )
        keys = GaugeMetricFamily(
            self._name("quarantined_keys"), "Keys quarantined in the partition now.", labels=labels
        )
        due = GaugeMetricFamily(
            self._name("next_retry_attempt_timestamp_seconds"),
            "When the partition's earliest retry attempt is due, as stored "
            "(seconds since the epoch).",
            labels=labels,
        )
        paused = GaugeMetricFamily(
            self._name("partition_paused"),
            "1 while an operator's pause (of the topic or the partition) stops the partition.",
            labels=labels,
        )
        held = GaugeMetricFamily(
            self._name("paused_keys"),
            "Keys of the partition an operator paused (their records wait in the retry topic).",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            self._name("lag_records"),
            "Records after the worker's position (end offset - position).",
            labels=labels,
        )
        for index, consumer in enumerate(self.consumers):
            group = consumer.config.group
            for view in _stable(consumer.partitions):
                topic, partition = view.topic, view.partition
                values = [group, topic, str(partition)]
                backlog.add_metric(values, float(view.retry_pending))
                keys.add_metric(values, float(len(view.quarantined)))
                paused.add_metric(values, 0.0 if view.paused_by is None else 1.0)
                held.add_metric(values, float(view.paused_keys))
                next_due = view.next_attempt_at
                if next_due is not None:
                    due.add_metric(values, next_due)
                end = self._ends.get((index, topic, partition))
                if end is not None and view.started:
                    lag.add_metric(values, float(view.lag(end)))
        yield backlog
        yield keys
        yield paused
        yield held
        yield due
        yield lag


def start_metrics_server(
    consumer: Consumer,
    port: int,
    *,
    addr: str = "127.0.0.1",
    registry: CollectorRegistry | None = None,
) -> ConsumerCollector:
    """Serve ``consumer``'s metrics over HTTP on ``addr:port`` (a daemon thread).

    :param addr: the address to listen on; loopback by default, ``"0.0.0.0"``
        for every interface (the metrics name topics, groups and error
        reasons: expose them on purpose).

    :param registry: where to register the collector; default a new
        :class:`~prometheus_client.CollectorRegistry` holding only it.
    :returns: the collector; run ``collector.keep_lag_fresh()`` as a task on
        the consumer's event loop to get the lag metric.
    :raises OSError: when the port cannot be bound.
    """
    collector = ConsumerCollector(consumer)
    target = registry if registry is not None else CollectorRegistry()
    target.register(collector)
    start_http_server(port, addr=addr, registry=target)
    return collector
