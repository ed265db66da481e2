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
