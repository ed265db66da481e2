"""``wakuwaku demo flights``: the library end to end on the 2013 New York flights.

See :mod:`wakuwaku.demo.run` for the phases and the README for a real report.

Importing this package loads only :mod:`wakuwaku.demo.options`: the CLI
imports it for every command, and the demo's events (:mod:`.flights`)
register in the default registry only once :func:`run_demo` is first looked
up here, or :mod:`wakuwaku.demo.run` imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .options import DemoOptions as DemoOptions

if TYPE_CHECKING:
    from .run import run_demo as run_demo

__all__ = ("DemoOptions", "run_demo")


def __getattr__(name: str) -> Any:
    """``run_demo``, imported from :mod:`.run` on first use.

    :raises AttributeError: for any other name.
    """
    if name == "run_demo":
        from .run import run_demo

        return run_demo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
