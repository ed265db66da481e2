"""The flights demo's slice, run N times on a busy machine: every run must verify.

The load is what made the demo fail its own verification before: part of the
test suite running in a loop and two CPU-bound processes (pure Python busy
loops), all for the whole duration. Each round runs the demo test's slice
(30 000 flights, chaos, replay) and, with ``--crash``, the crash case too
(1 000 flights, SIGKILL at 0.6 s). The demo's outcome is decided by the data
and the library's rules, so every run must print VERIFIED; this prints one
line per run and exits 1 if any did not.

    python benchmarks/demo_under_load.py [--runs 10] [--tests tests/engine] [--no-crash]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _args import positive_int

BURN = "while True:\n    sum(i * i for i in range(10_000))\n"


def demo(workdir: Path, *extra: str) -> tuple[bool, float, str]:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "wakuwaku", "demo", "flights", "--workdir", str(workdir), *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - started
    ok = result.returncode == 0 and result.stdout.rstrip().endswith("\nVERIFIED")
    failed = [line.strip() for line in result.stdout.splitlines() if "[FAILED]" in line]
    return ok, seconds, "; ".join(failed) or result.stderr.strip()[-300:]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive_int, default=10)
    parser.add_argument("--tests", default="tests/engine", help="test paths run as load")
    parser.add_argument("--no-crash", action="store_true", help="skip the crash case")
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    root = Path(__file__).resolve().parent.parent
    out = subprocess.DEVNULL
    load = [
        subprocess.Popen([sys.executable, "-c", BURN], stdout=out, stderr=out) for _ in range(2)
    ]
    suite = (
        f"while true; do {sys.executable} -m pytest -q -x -p no:cacheprovider "
        f"{args.tests} >/dev/null 2>&1; done"
    )
    suite_loop = subprocess.Popen(
        ["bash", "-c", suite], cwd=root, start_new_session=True, stdout=out, stderr=out
    )
    failures = 0
    try:
        time.sleep(2.0)  # let the load start
        with tempfile.TemporaryDirectory() as tmp:
            for run in range(1, args.runs + 1):
                cases = [("slice 30000", ["--limit", "30000", "--lock-seconds", "1"])]
                if not args.no_crash:
                    cases.append(("crash 1000", ["--limit", "1000", "--kill-at", "0.6"]))
                for name, extra in cases:
                    ok, seconds, detail = demo(
                        Path(tmp) / f"{run}", "--chaos", "--replay-dead-letters", *extra
                    )
                    failures += not ok
                    print(
                        f"run {run:2d} {name}: {'VERIFIED' if ok else 'NOT VERIFIED'} "
                        f"in {seconds:.1f} s (load average {os.getloadavg()[0]:.1f})"
                        + ("" if ok else f": {detail}"),
                        flush=True,
                    )
    finally:
        os.killpg(suite_loop.pid, 9)  # the suite loop and the pytest it runs
        suite_loop.wait()
        for proc in load:
            proc.kill()
            proc.wait()
    total = args.runs * (1 if args.no_crash else 2)
    print(f"{total - failures} of {total} runs verified")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
