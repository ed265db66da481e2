"""Ready-made ``classify`` functions for the usual database drivers (design §5.8).

They read the exception's data (SQLSTATE codes, driver error classes by
name), so neither psycopg nor any other driver is imported here.

- PostgreSQL: SQLSTATE ``40001`` (serialization failure), ``40P01``
  (deadlock), ``55P03`` (lock not available) are Retryable: this key lost a
  race and will likely win later. Connection, pool, TLS and "server shutting
  down" errors (SQLSTATE classes ``08``, ``57P0x``, psycopg's
  ``OperationalError``/``InterfaceError``/``PoolTimeout``) are Transient.
- SQLite: "database is locked" / "database is busy" are Transient: the file
  is held by another process and nothing can succeed until it lets go.
- Network: ``ConnectionError``, ``TimeoutError`` and other ``OSError`` are Transient.
- Everything else is Unrecoverable.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from .._errors import ErrorClass, HandleError, LogUnavailableError

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
TRANSIENT_SQLSTATE_PREFIXES = ("08", "57P01", "57P02", "57P03", "53300")
_TRANSIENT_DRIVER_ERRORS = frozenset(
    {"OperationalError", "InterfaceError", "PoolTimeout", "PoolClosed", "ConnectionTimeout"}
)


def _sqlstate(exc: BaseException) -> str | None:
    for attr in ("sqlstate", "pgcode"):
        code = getattr(exc, attr, None)
        if isinstance(code, str):
            return code
    diag = getattr(exc, "diag", None)
    code = getattr(diag, "sqlstate", None)
    return code if isinstance(code, str) else None


def classify_postgres(exc: BaseException) -> ErrorClass:
    """Classify a PostgreSQL driver exception (psycopg 3, psycopg2, asyncpg) by SQLSTATE."""
    if isinstance(exc, HandleError) and isinstance(getattr(exc, "error_class", None), ErrorClass):
        return exc.error_class
    code = _sqlstate(exc)
    if code in RETRYABLE_SQLSTATES:
        return ErrorClass.RETRYABLE
    if code is not None and code.startswith(TRANSIENT_SQLSTATE_PREFIXES):
        return ErrorClass.TRANSIENT
    if code is None and type(exc).__name__ in _TRANSIENT_DRIVER_ERRORS:
        return ErrorClass.TRANSIENT
    return classify_network(exc)


def classify_sqlite(exc: BaseException) -> ErrorClass:
    """Classify a :mod:`sqlite3` exception: locked/busy databases are Transient."""
    if isinstance(exc, HandleError) and isinstance(getattr(exc, "error_class", None), ErrorClass):
        return exc.error_class
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        if "locked" in text or "busy" in text or "disk i/o error" in text:
            return ErrorClass.TRANSIENT
    return classify_network(exc)


def classify_network(exc: BaseException) -> ErrorClass:
    """Connection and timeout errors are Transient; anything else Unrecoverable."""
    if isinstance(exc, (ConnectionError, TimeoutError, LogUnavailableError)):
        return ErrorClass.TRANSIENT
    if isinstance(exc, OSError):
        return ErrorClass.TRANSIENT
    return ErrorClass.UNRECOVERABLE


Classifier = Callable[[BaseException], ErrorClass]


def chain(*classifiers: Classifier) -> Classifier:
    """The first classifier's answer that is not Unrecoverable, else Unrecoverable."""

    def classify(exc: BaseException) -> ErrorClass:
        for one in classifiers:
            answer = one(exc)
            if answer is not ErrorClass.UNRECOVERABLE:
                return answer
        return ErrorClass.UNRECOVERABLE

    return classify
