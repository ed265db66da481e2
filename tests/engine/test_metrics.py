"""The Prometheus exporter (design §14) on a real CollectorRegistry."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import prometheus_client
import pytest

import wakuwaku as wk
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.metrics import ConsumerCollector
from wakuwaku.testing import FakeClock

T0 = 1_700_000_000.0
GROUP = "metered"
DOCS = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


@wk.event("tests.metrics.job", key="key")
class Job(msgspec.Struct, frozen=True):
    key: str
    n: int


async def until(clock: FakeClock, condition: Callable[[], bool]) -> None:
    for _ in range(100_000):
        if condition():
            return
        await clock.sleep(0.05)
    raise AssertionError("condition not met")


class Scripted:
    """n == 1: Unrecoverable; key 'stuck': Retryable; n == 2: Transient once."""

    def __init__(self) -> None:
        self.transient_left = 1

    async def __call__(self, chunk: Sequence[Job]) -> None:
        for job in chunk:
            if job.n == 1:
                raise wk.Unrecoverable("poison")
            if job.key == "stuck":
                raise wk.Retryable("locked")
            if job.n == 2 and self.transient_left:
                self.transient_left -= 1
                raise wk.Transient("database down")


def sample(registry: prometheus_client.CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, {"group": GROUP, **labels})
    assert value is not None, f"no sample {name} {labels}"
    return float(value)


async def test_collector_exports_counters_retry_state_and_lag() -> None:
    log = wk.MemoryLog()
    await log.create_topic("jobs", 2)
    producer = wk.Producer(log, "jobs")
    jobs = [Job("a", 0), Job("a", 1), Job("b", 2), Job("stuck", 3), Job("stuck", 4), Job("c", 5)]
    await producer.publish_many(jobs)
    clock = FakeClock(T0)
    consumer = Consumer(
        ConsumerConfig(
            topic="jobs", group=GROUP, clock=clock, retry_delays=(5.0, 1000.0), lease_ttl=3600.0
        ),
        [Handler(Job, Scripted())],
        log,
    )
    registry = prometheus_client.CollectorRegistry()
    collector = ConsumerCollector(consumer)
    registry.register(collector)
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    # The Transient chunk is retried after 5 s; the stuck key's first attempt (at
    # T0 + 5) fails and the next one is due 1000 s later.
    await until(
        clock,
        lambda: (
            len(consumer.assignment()) == 2
            and all(v.caught_up for v in consumer.partitions())
            and consumer.stats.handled == 3
            and consumer.stats.attempts_failed == 1
        ),
    )
    consumer.stop()
    await task

    assert sample(registry, "wakuwaku_polled_records_total") == 6
    assert sample(registry, "wakuwaku_handled_records_total") == 3
    assert sample(registry, "wakuwaku_handler_calls_total") == 3
    assert sample(registry, "wakuwaku_handler_failures_total", **{"class": "unrecoverable"}) == 1
    assert sample(registry, "wakuwaku_handler_failures_total", **{"class": "retryable"}) == 2
    assert sample(registry, "wakuwaku_retry_attempts_total") == 1
    assert sample(registry, "wakuwaku_retry_attempts_failed_total") == 1
    assert sample(registry, "wakuwaku_handler_failures_total", **{"class": "transient"}) == 1
    assert sample(registry, "wakuwaku_dead_letters_total", reason="unrecoverable") == 1
    assert sample(registry, "wakuwaku_quarantines_total") == 1
    assert sample(registry, "wakuwaku_retry_written_records_total") == 2
    assert sample(registry, "wakuwaku_transient_pauses_total") == 1
    # Every handle() call is in the latency summary, failed ones included.
    assert sample(registry, "wakuwaku_handler_seconds_count") == 3 + 4
    assert sample(registry, "wakuwaku_handler_seconds_sum") >= 0

    stuck = str(wk.partition_for("stuck", 2))
    other = str(1 - int(stuck))
    assert sample(registry, "wakuwaku_retry_backlog_records", topic="jobs", partition=stuck) == 2
    assert sample(registry, "wakuwaku_quarantined_keys", topic="jobs", partition=stuck) == 1
    assert sample(registry, "wakuwaku_quarantined_keys", topic="jobs", partition=other) == 0
    assert (
        sample(
            registry, "wakuwaku_next_retry_attempt_timestamp_seconds", topic="jobs", partition=stuck
        )
        == T0 + 5.0 + 1000.0
    )
    assert (
        registry.get_sample_value(
            "wakuwaku_next_retry_attempt_timestamp_seconds",
            {"group": GROUP, "topic": "jobs", "partition": other},
        )
        is None
    )

    # No lag before the end offsets were read; then end - position per partition.
    assert (
        registry.get_sample_value(
            "wakuwaku_lag_records", {"group": GROUP, "topic": "jobs", "partition": "0"}
        )
        is None
    )
    await producer.publish_many([Job("stuck", 6), Job("stuck", 7), Job("stuck", 8)])
    await collector.refresh_lag()
    assert sample(registry, "wakuwaku_lag_records", topic="jobs", partition=stuck) == 3
    assert sample(registry, "wakuwaku_lag_records", topic="jobs", partition=other) == 0

    text = prometheus_client.generate_latest(registry).decode()
    assert "# TYPE wakuwaku_handled_records_total counter" in text
    assert "# TYPE wakuwaku_lag_records gauge" in text


async def test_a_scrape_from_another_thread_while_consuming() -> None:
    log = wk.MemoryLog()
    await log.create_topic("jobs", 1)
    await wk.Producer(log, "jobs").publish_many(Job(f"k{n % 5}", n + 10) for n in range(200))
    consumer = Consumer(
        ConsumerConfig(topic="jobs", group=GROUP, clock=FakeClock(T0), lease_ttl=3600.0),
        [Handler(Job, Scripted())],
        log,
    )
    registry = prometheus_client.CollectorRegistry()
    registry.register(ConsumerCollector(consumer, namespace="app"))
    drained = asyncio.create_task(consumer.drain())
    texts = [await asyncio.to_thread(prometheus_client.generate_latest, registry) for _ in range(5)]
    await drained
    assert all(b"app_polled_records_total" in t for t in texts)
    assert registry.get_sample_value("app_handled_records_total", {"group": GROUP}) == 200


async def test_lag_refresher_survives_a_failing_log(caplog: pytest.LogCaptureFixture) -> None:
    log = wk.MemoryLog()
    await log.create_topic("jobs", 1)
    clock = FakeClock(T0)
    consumer = Consumer(
        ConsumerConfig(topic="jobs", group=GROUP, clock=clock, lease_ttl=3600.0),
        [Handler(Job, Scripted())],
        log,
    )
    await consumer.start()
    consumer.workers[("jobs", 0)] = object()  # type: ignore[assignment]  # only the key is read
    collector = ConsumerCollector(consumer)
    calls = 0
    real = log.end_offsets

    async def flaky(topic: str) -> dict[int, int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise wk.LogUnavailableError("down")
        return await real(topic)

    log.end_offsets = flaky  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="wakuwaku.metrics"):
        refresher = asyncio.create_task(collector.keep_lag_fresh(interval=5.0))
        await until(clock, lambda: calls >= 2)
        refresher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await refresher
    assert "cannot read end offsets for the lag metric" in caplog.text
    assert clock.now() - T0 >= 5.0  # the second try waited the interval


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_without_prometheus_client_the_import_error_names_the_extra() -> None:
    result = _python("import sys; sys.modules['prometheus_client'] = None\nimport wakuwaku.metrics")
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "pip install 'wakuwaku[prometheus]'" in result.stderr


def test_the_root_package_and_the_cli_never_import_prometheus() -> None:
    result = _python(
        "import sys, wakuwaku, wakuwaku.admin\n"
        "from wakuwaku.cli import build_cli; build_cli()\n"
        "bad = [m for m in ('prometheus_client', 'wakuwaku.metrics') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    assert result.returncode == 0, result.stderr


async def test_one_collector_for_two_groups_and_no_duplicate_registration() -> None:
    log = wk.MemoryLog()
    await log.create_topic("jobs", 1)
    await wk.Producer(log, "jobs").publish_many([Job("a", 10), Job("b", 1)])
    consumers = [
        Consumer(
            ConsumerConfig(topic="jobs", group=group, clock=FakeClock(T0), lease_ttl=3600.0),
            [Handler(Job, Scripted())],
            log,
        )
        for group in ("first", "second")
    ]
    for consumer in consumers:
        await consumer.drain()
    registry = prometheus_client.CollectorRegistry()
    collector = ConsumerCollector(*consumers)
    registry.register(collector)
    await collector.refresh_lag()
    for group in ("first", "second"):
        labels = {"group": group}
        assert registry.get_sample_value("wakuwaku_handled_records_total", labels) == 1
        assert (
            registry.get_sample_value(
                "wakuwaku_dead_letters_total", {**labels, "reason": "unrecoverable"}
            )
            == 1
        )
        assert (
            registry.get_sample_value(
                "wakuwaku_lag_records", {**labels, "topic": "jobs", "partition": "0"}
            )
            == 0
        )
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(ConsumerCollector(consumers[0]))
    with pytest.raises(wk.ConfigError, match="one group"):
        ConsumerCollector(consumers[0], consumers[0])


async def test_operator_pauses_are_gauges_per_partition() -> None:
    from wakuwaku import admin

    log = wk.MemoryLog()
    await log.create_topic("jobs", 2)
    held = wk.partition_for("held", 2)
    await admin.pause(log, GROUP, "jobs", partition=1 - held)
    await admin.pause(log, GROUP, "jobs", key="held")
    await wk.Producer(log, "jobs").publish(Job("held", 0))
    clock = FakeClock(T0)
    consumer = Consumer(
        ConsumerConfig(topic="jobs", group=GROUP, clock=clock), [Handler(Job, Scripted())], log
    )
    registry = prometheus_client.CollectorRegistry()
    registry.register(ConsumerCollector(consumer))
    runner = asyncio.create_task(consumer.run(install_signal_handlers=False))
    try:
        await until(
            clock,
            lambda: (
                any(v.retry_pending for v in consumer.partitions())
                and all(v.started for v in consumer.partitions())
            ),
        )
        paused, running = str(1 - held), str(held)
        assert sample(registry, "wakuwaku_partition_paused", topic="jobs", partition=paused) == 1
        assert sample(registry, "wakuwaku_partition_paused", topic="jobs", partition=running) == 0
        assert sample(registry, "wakuwaku_paused_keys", topic="jobs", partition=running) == 1
        assert sample(registry, "wakuwaku_paused_keys", topic="jobs", partition=paused) == 0
    finally:
        consumer.stop()
        await runner
