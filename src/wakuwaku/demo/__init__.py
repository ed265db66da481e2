"""``wakuwaku demo flights``: the library end to end on the 2013 New York flights.

See :mod:`wakuwaku.demo.run` for the phases and the README for a real report.
"""

from .run import DemoOptions as DemoOptions
from .run import run_demo as run_demo

__all__ = ("DemoOptions", "run_demo")
