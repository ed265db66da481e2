"""``wakuwaku.__all__`` lists every public name, in the order ruff's RUF022 keeps
(httpx ``tests/test_exported_members.py``, anyio ``tests/test_all_attributes.py``)."""

from __future__ import annotations

import re
import types

import wakuwaku


def public_names() -> set[str]:
    return {
        name
        for name, value in vars(wakuwaku).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


def ruff_isort_key(name: str) -> tuple[int, list[tuple[int, int | str]]]:
    """RUF022's "isort-style" order: SCREAMING_SNAKE_CASE, then CamelCase, then
    the rest, each group in natural order (digits compared as numbers)."""
    if len(name) > 1 and name.isupper():
        group = 0
    elif name[:1].isupper():
        group = 1
    else:
        group = 2
    natural = [
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part
    ]
    return group, natural


def test_all_lists_every_public_name() -> None:
    exported = set(wakuwaku.__all__)
    assert public_names() - exported == set(), "public but missing from __all__"
    assert exported - public_names() == set(), "in __all__ but not defined"


def test_all_has_no_duplicates() -> None:
    assert len(wakuwaku.__all__) == len(set(wakuwaku.__all__))


def test_all_is_sorted_as_ruff_sorts_it() -> None:
    assert list(wakuwaku.__all__) == sorted(wakuwaku.__all__, key=ruff_isort_key)


def test_exported_objects_say_they_are_public() -> None:
    for name in wakuwaku.__all__:
        value = getattr(wakuwaku, name)
        module = getattr(value, "__module__", None)
        if isinstance(value, type) or callable(value):
            assert module is not None and module.startswith("wakuwaku"), name


def test_the_root_package_imports_no_optional_dependency() -> None:
    import subprocess
    import sys

    code = (
        "import sys, wakuwaku; bad = {'redis', 'nats', 'psycopg', 'prometheus_client'} "
        "& set(sys.modules); print(sorted(bad)); sys.exit(bool(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
