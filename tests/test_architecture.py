"""The import contracts in pyproject.toml keep up with the source tree.

import-linter's forbidden contract cannot match "every module whose name starts
with an underscore", so pyproject.toml lists the private modules of the lower
packages by name; this test fails naming any that the list misses.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PRIVATE_CONTRACT = "Only a package's own modules import its private modules"
ENGINE_CONTRACT = (
    "The engine and the producer use the logs, inbox and reliability packages "
    "through their public faces"
)
ENGINE_LOWER = ("logs", "inbox", "reliability")


def private_contract(name: str = PRIVATE_CONTRACT) -> dict[str, Any]:
    """The forbidden contract ``name`` of pyproject.toml (by default the one that
    keeps the upper packages off the lower ones' private modules)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    found = [c for c in contracts if c["name"] == name]
    assert len(found) == 1, f"pyproject.toml has no contract named {name!r}"
    contract: dict[str, Any] = found[0]
    assert contract["type"] == "forbidden"
    return contract


def lower_packages(sources: list[str]) -> list[Path]:
    """The subpackages of wakuwaku that are not among the contract's source modules."""
    return [
        init.parent
        for init in sorted((SRC / "wakuwaku").glob("*/__init__.py"))
        if f"wakuwaku.{init.parent.name}" not in sources
    ]


def private_modules(package: Path) -> set[str]:
    """The dotted names of the private modules and subpackages in ``package``, at any
    depth; below a private one only its outermost name (the contract covers its
    descendants)."""
    names: set[str] = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for depth, part in enumerate(parts):
            if part.startswith("_") and not part.startswith("__"):
                names.add(".".join(parts[: depth + 1]))
                break
    return names


def test_the_lower_packages_are_the_ones_below_the_sources() -> None:
    sources = private_contract()["source_modules"]
    names = {f"wakuwaku.{p.name}" for p in lower_packages(sources)}
    # Not an exhaustive list: a new lower package is found by the walk; this
    # only shows the walk finds the packages it is meant for.
    assert {"wakuwaku.engine", "wakuwaku.logs", "wakuwaku.inbox", "wakuwaku.reliability"} <= names


def test_every_private_module_of_a_lower_package_is_forbidden_to_the_upper_ones() -> None:
    contract = private_contract()
    listed = set(contract["forbidden_modules"])
    private: set[str] = set()
    for package in lower_packages(contract["source_modules"]):
        private |= private_modules(package)
    missing = sorted(private - listed)
    assert not missing, (
        "add to forbidden_modules of the import-linter contract "
        f"{PRIVATE_CONTRACT!r} in pyproject.toml: {', '.join(missing)}"
    )
    stale = sorted(listed - private)
    assert not stale, f"forbidden_modules in pyproject.toml names no private module: {stale}"


def test_the_engine_is_kept_off_every_private_module_of_the_packages_below_it() -> None:
    contract = private_contract(ENGINE_CONTRACT)
    assert "wakuwaku.engine" in contract["source_modules"]
    private: set[str] = set()
    for name in ENGINE_LOWER:
        private |= private_modules(SRC / "wakuwaku" / name)
    listed = set(contract["forbidden_modules"])
    assert listed == private, (
        f"forbidden_modules of {ENGINE_CONTRACT!r} in pyproject.toml: "
        f"add {sorted(private - listed)}, remove {sorted(listed - private)}"
    )
