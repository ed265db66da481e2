"""The benchmarks' command lines: a value no run can use is a usage error (exit code 2).

Only the parsers run here (each benchmark's ``parse_args(argv)``): no
benchmark, no service. A module whose client library is not installed skips.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import wakuwaku

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# Every benchmark with command-line options (bench_tracing.py and
# bench_iggy_client.py take none).
WITH_OPTIONS = (
    "bench_consumer",
    "bench_failing_key",
    "bench_iggy",
    "bench_inbox",
    "bench_kafka",
    "bench_kafka_clients",
    "bench_kafka_store",
    "bench_nats",
    "bench_nats_fence",
    "bench_pipeline",
    "bench_producer",
    "bench_redis",
    "bench_retry_memory",
    "bench_scale_out",
    "bench_sqlite_log",
    "bench_waiter",
    "demo_under_load",
)


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test imports its benchmark afresh, as running the script does: with
    the benchmarks' folder on the path (they import ``_args`` and ``_ticks`` as
    top-level modules) and an empty event registry (``bench_failing_key.py``
    and ``_ticks.py`` each define their own ``bench.tick``)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(wakuwaku.default_registry, "_by_tag", {})
    yield
    for name, module in list(sys.modules.items()):
        if Path(getattr(module, "__file__", None) or "/").parent == BENCHMARKS:
            del sys.modules[name]


def benchmark(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] in {"apache_iggy", "confluent_kafka"}:
            pytest.skip(f"{name} needs {exc.name}")
        raise


def refused(name: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error line ``name``'s parser prints for ``argv``, after checking it exits with 2."""
    with pytest.raises(SystemExit) as exited:
        benchmark(name).parse_args(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("usage:"), lines
    return lines[-1]


@pytest.mark.parametrize("name", WITH_OPTIONS)
def test_the_defaults_parse(name: str) -> None:
    assert isinstance(benchmark(name).parse_args([]), argparse.Namespace)


@pytest.mark.parametrize(
    ("name", "argv", "message"),
    [
        ("bench_redis", ["--events", "0"], "argument --events: must be 1 or more, got 0"),
        ("bench_redis", ["--events", "-5"], "argument --events: must be 1 or more, got -5"),
        ("bench_redis", ["--rounds", "0"], "argument --rounds: must be 1 or more, got 0"),
        ("bench_redis", ["--partitions", "0"], "argument --partitions: must be 1 or more"),
        ("bench_redis", ["--keys", "ten"], "argument --keys: 'ten' is not a whole number"),
        ("bench_consumer", ["--keys", "0"], "argument --keys: must be 1 or more, got 0"),
        ("bench_consumer", ["--rounds", "-1"], "argument --rounds: must be 1 or more, got -1"),
        ("bench_consumer", ["--max-poll-records", "500", "0"], "--max-poll-records: must be 1"),
        (
            "bench_consumer",
            ["--events", "10", "--keys", "1000"],
            "--events 10 is fewer than --keys 1000",
        ),
        ("bench_failing_key", ["--rounds", "0"], "argument --rounds: must be 1 or more, got 0"),
        ("bench_failing_key", ["--events", "0"], "argument --events: must be 1 or more, got 0"),
        ("bench_failing_key", ["--events", "19"], "--events must be 20 or more, got 19"),
        ("bench_pipeline", ["--wide", "0"], "argument --wide: must be 1 or more, got 0"),
        ("bench_pipeline", ["--wide", "16"], "--wide 16 is the default max_concurrency"),
        ("bench_retry_memory", ["--keys", "0"], "argument --keys: must be 1 or more, got 0"),
        ("bench_retry_memory", ["--records", "-5"], "argument --records: must be 1 or more"),
        ("bench_retry_memory", ["--records", "0"], "argument --records: must be 1 or more"),
        ("bench_retry_memory", ["--route", "-1"], "argument --route: must be 0 or more, got -1"),
        ("bench_retry_memory", ["--body", "-1"], "argument --body: must be 0 or more, got -1"),
        ("bench_retry_memory", ["--log", "foo://bar"], "argument --log: unsupported log URL"),
        ("bench_retry_memory", ["--log", "memory://"], "a memory log lives in one process"),
        (
            "bench_retry_memory",
            ["--records", "5", "--keys", "10"],
            "--records 5 is fewer than --keys 10",
        ),
        ("bench_scale_out", ["--timeout", "nan"], "argument --timeout: must be a finite number"),
        ("bench_scale_out", ["--join-wait", "-1"], "argument --join-wait: must be a finite"),
        ("bench_producer", ["--engines", "redis,mongo"], "unknown engine(s) 'mongo'"),
        ("bench_iggy", ["--partitions", "1001"], "--partitions must be at most 1000 on Iggy"),
        ("bench_waiter", ["0"], "argument rounds: must be 1 or more, got 0"),
        ("bench_inbox", ["--keys", "3"], "--keys must be 4 or more, got 3"),
        ("demo_under_load", ["--runs", "0"], "argument --runs: must be 1 or more, got 0"),
    ],
)
def test_a_value_no_run_can_use_is_a_usage_error(
    name: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused(name, argv, capsys)


def test_valid_values_parse_as_given() -> None:
    args = benchmark("bench_scale_out").parse_args(
        ["--events", "2000", "--rounds", "1", "--join-wait", "0", "--timeout", "1.5"]
    )
    assert (args.events, args.rounds, args.join_wait, args.timeout) == (2000, 1, 0.0, 1.5)


def test_zero_is_a_count_where_it_means_none() -> None:
    args = benchmark("bench_retry_memory").parse_args(["--route", "0", "--body", "0"])
    assert (args.route, args.body) == (0, 0)


def test_a_failing_record_cheaper_than_a_handled_one_is_noise() -> None:
    failing_cost = benchmark("bench_failing_key").failing_cost
    assert failing_cost(2.5, 10e-6, 0.003) == "per failing record 25.00 us (2.5x)"
    # The run with the failing key took 1.2 ms less CPU: no negative cost is printed.
    noise = failing_cost(-32.6, 10e-6, -0.0012)
    assert noise == (
        "per failing record: within this round's noise "
        "(the run with it took 1.2 ms less CPU than the baseline)"
    )


@pytest.mark.parametrize("name", ["bench_producer", "bench_iggy"])
def test_single_round_figures_are_not_the_default(name: str) -> None:
    # docs/engine.md's figures are medians of 3 rounds: one round moves by tens of points.
    assert benchmark(name).parse_args([]).rounds == 3
