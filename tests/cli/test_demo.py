"""``wakuwaku demo``: the demo loads only when its command runs.

Every command builds the whole ``wakuwaku`` group, the ``demo`` family with
it; were the demo loaded then, its event types would sit in the default
registry of every CLI process, ``wakuwaku run``'s consumers included.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from wakuwaku.cli import ExitCode

# Runs the CLI with its arguments, then reports what it loaded and registered,
# and which tags the demo's events add once they are loaded after it.
PROBE = """\
import json, sys
from wakuwaku._events import default_registry
from wakuwaku.cli import main
status = main(sys.argv[1:])
loaded = sorted(name for name in sys.modules if name.startswith("wakuwaku.demo"))
registered = {t.tag for t in default_registry}
import wakuwaku.demo.flights
demo_tags = {t.tag for t in default_registry} - registered
print(json.dumps({"status": status, "loaded": loaded, "demo_tags": sorted(demo_tags)}))
"""
LIGHT = ["wakuwaku.demo", "wakuwaku.demo.options"]
"""What the CLI may load of the demo without running it: stdlib-only options."""
DEMO_TAGS = [
    "demo.flight-cancelled",
    "demo.flight-flown",
    "demo.plane-registered",
    "demo.register-published",
]


def probe(tmp_path: Path, *argv: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return report


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["demo", "--help"],
        ["demo", "flights", "--help"],
        ["topic", "create", "orders", "--partitions", "2", "--log", "sqlite:///log.db"],
    ],
    ids=["help", "demo-help", "demo-flights-help", "topic-create"],
)
def test_a_command_other_than_the_demo_loads_neither_its_modules_nor_its_events(
    tmp_path: Path, argv: list[str]
) -> None:
    report = probe(tmp_path, *argv)
    assert report["status"] == ExitCode.OK
    assert report["loaded"] == LIGHT
    # Tags the demo's events add after the command: none were registered by it.
    assert report["demo_tags"] == DEMO_TAGS


def test_the_demo_command_loads_the_demo(tmp_path: Path) -> None:
    """The other side: running it imports the demo (a memory log is refused at once)."""
    report = probe(tmp_path, "demo", "flights", "--log", "memory://", "--workdir", "out")
    assert report["status"] == ExitCode.ERROR
    assert {"wakuwaku.demo.run", "wakuwaku.demo.flights"} <= set(report["loaded"])
    assert report["demo_tags"] == []
