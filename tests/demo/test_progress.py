"""The demo's plain progress (what CI logs show): a line per running phase, events at once."""

from __future__ import annotations

import io
import time

from wakuwaku.demo.progress import PlainProgress


def test_plain_progress_prints_running_phases_and_events_as_they_come() -> None:
    stream = io.StringIO()
    progress = PlainProgress(time.perf_counter(), stream, every=0.0)
    progress.start("consume", 1_000)
    progress.update("consume", 500)
    assert "consume: 500 of 1,000 rows accounted (50 %)" in stream.getvalue()
    assert "keys quarantined now" in stream.getvalue()
    progress.event("chaos", "chaos: consumer SIGKILLed at 500 flights applied")
    assert stream.getvalue().rstrip().endswith("chaos: consumer SIGKILLed at 500 flights applied")
    progress.finish("consume", 1_000)
    assert stream.getvalue().rstrip().endswith("consume done: 1,000 rows accounted")
    progress.start("verify")
    before = stream.getvalue()
    progress.update("verify", 6)
    assert stream.getvalue() == before  # no periodic line for the checks
    assert [s.count for s in progress.samples if s.phase == "consume"] == [500, 1_000]


def test_no_eta_from_the_first_trickle() -> None:
    stream = io.StringIO()
    progress = PlainProgress(time.perf_counter(), stream, every=0.0)
    progress.start("consume", 100_000)
    progress.update("consume", 10)
    assert "ETA" not in stream.getvalue()
    assert progress.phases["consume"].eta(progress.now()) is None


def test_counts_of_one_are_singular_in_the_state_line_and_the_report() -> None:
    """A small --limit run printed "1 keys quarantined now" and "1 partitions per topic"."""
    from collections import Counter

    from wakuwaku.demo.options import DemoOptions
    from wakuwaku.demo.processes import Chaos
    from wakuwaku.demo.producers import Produced
    from wakuwaku.demo.verify import report

    progress = PlainProgress(time.perf_counter(), io.StringIO(), every=0.0)
    progress.quarantined, progress.dead_letters = 1, 1
    assert progress.state_line().startswith("1 key quarantined now, 1 dead letter, ")
    lines: list[str] = []
    ones = dict.fromkeys(
        ["handled", "handler_calls", "reduced_away", "inbox_skipped", "quarantined_keys"], 1
    )
    ones |= dict.fromkeys(["attempts", "attempts_failed", "routed", "transient_pauses"], 1)
    report(
        lines.append,
        opts=DemoOptions(partitions=1),
        log_url="sqlite:///x.db",
        produced=Produced(planes=1, refused=1),
        stats=ones,
        dead=Counter(),
        chaos=Chaos(),
        seconds=1.0,
        runs=1,
    )
    text = "\n".join(lines)
    assert "(1 partition per topic)" in text
    assert "1 flight without a tail number" in text
    assert "1 record in 1 handler call" in text
    assert "1 key quarantined, 1 attempt (1 failed), 1 record routed" in text
    assert "1 failed call retried in place" in text
    assert "1 records" not in text and "1 keys" not in text
