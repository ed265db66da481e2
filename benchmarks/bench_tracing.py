"""What the OpenTelemetry hooks (wakuwaku.tracing) cost the consumer.

The same memory log of 40,000 ticks over 20,000 keys (mostly one-event chunks:
the most spans per record) is drained three times, each in a fresh process:

- ``off``: ``WAKUWAKU_TRACING=off``, the hooks return at once (the baseline,
  what a process without the ``otel`` extra runs);
- ``api``: opentelemetry-api installed, no SDK configured (no-op spans);
- ``sdk``: the SDK's TracerProvider with a batch processor and an exporter
  that drops everything (spans are made and recorded).

Prints records/s per mode, the best of five interleaved runs each, and the
ratio to ``off``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

EVENTS = 40_000
KEYS = 20_000
RUNS = 5


def child(mode: str) -> None:
    if mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Drop(SpanExporter):
            def export(self, spans: object) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)

    import wakuwaku as wk
    from _ticks import consume, fill

    async def main() -> None:
        log = wk.MemoryLog()
        await fill(log, EVENTS, KEYS, partitions=4)
        started = time.perf_counter()
        seconds, handled = await consume(log, "bench", max_poll=500)
        assert handled == EVENTS, handled
        print(f"{handled / seconds:.0f} {time.perf_counter() - started:.3f}")

    asyncio.run(main())


def once(mode: str) -> float:
    env = dict(os.environ)
    if mode == "off":
        env["WAKUWAKU_TRACING"] = "off"
    else:
        env.pop("WAKUWAKU_TRACING", None)
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0])


def main() -> None:
    print(f"tracing overhead: {EVENTS:,} events, {KEYS:,} keys, memory log, best of {RUNS}")
    modes = {"off": "off (baseline)", "api": "api, no SDK", "sdk": "sdk, spans recorded"}
    best = dict.fromkeys(modes, 0.0)
    for _ in range(RUNS):  # interleaved: a busy machine slows every mode alike
        for mode in modes:
            best[mode] = max(best[mode], once(mode))
    for mode, label in modes.items():
        ratio = best[mode] / best["off"]
        print(f"  {label:<20} {best[mode]:>10,.0f} records/s  ({ratio:.2f} of off)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
