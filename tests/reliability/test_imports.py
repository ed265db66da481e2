"""wakuwaku.reliability works without the redis extra, and says how to get it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import wakuwaku.reliability as reliability

WITHOUT_REDIS = textwrap.dedent(
    """
    import sys
    sys.modules["redis"] = None  # as if the extra were not installed
    import wakuwaku.reliability as r
    assert "redis" not in [m for m in sys.modules if sys.modules[m] is not None]
    r.CircuitBreaker("x"); r.AttemptLimit(2); r.sanitize("ok")
    try:
        r.wait_for_result
    except ImportError as error:
        print(error)
    """
)


def test_the_package_imports_without_redis_and_the_waiter_names_the_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_REDIS], capture_output=True, text=True, check=True
    )
    assert "pip install 'wakuwaku[redis]'" in done.stdout


def _isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions (ruff RUF022's order)."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def test_all_is_sorted_and_complete() -> None:
    names = reliability.__all__
    assert list(names) == sorted(names, key=_isort_key)
    public = {n for n in dir(reliability) if not n.startswith("_")}
    submodules = {"breaker", "budget", "waiter", "annotations", "importlib"}
    assert public - submodules - {"TYPE_CHECKING", "Any"} <= set(names)
    for name in names:
        assert getattr(reliability, name) is not None
