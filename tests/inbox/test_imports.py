"""The PostgreSQL backend is optional: nothing else imports psycopg."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest


def test_missing_psycopg_gives_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "wakuwaku.inbox.postgres", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'wakuwaku\[postgres\]'"):
        importlib.import_module("wakuwaku.inbox.postgres")


def test_inbox_package_and_cli_never_import_psycopg() -> None:
    code = (
        "import sys, wakuwaku, wakuwaku.inbox, wakuwaku.cli._inbox; "
        "sys.exit(1 if 'psycopg' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_inbox_all_is_sorted_and_complete() -> None:
    import wakuwaku.inbox as package

    # ruff's RUF022 order: constants first, then classes and functions.
    assert list(package.__all__) == sorted(package.__all__, key=lambda n: (not n.isupper(), n))
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    public.discard("annotations")  # the __future__ import
    assert public == set(package.__all__)
