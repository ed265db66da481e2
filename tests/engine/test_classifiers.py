"""design §5.8: the ready-made classifiers for database drivers, by the data they carry."""

from __future__ import annotations

import sqlite3

import pytest

from wakuwaku import ErrorClass, LogUnavailableError, Retryable
from wakuwaku.engine.classifiers import (
    chain,
    classify_network,
    classify_postgres,
    classify_sqlite,
)


class FakePgError(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


class OperationalError(Exception):
    """Named like psycopg's, without a SQLSTATE (a lost connection)."""


@pytest.mark.parametrize(
    ("sqlstate", "expected"),
    [
        ("40001", ErrorClass.RETRYABLE),  # serialization failure
        ("40P01", ErrorClass.RETRYABLE),  # deadlock detected
        ("55P03", ErrorClass.RETRYABLE),  # lock not available
        ("08006", ErrorClass.TRANSIENT),  # connection failure
        ("57P01", ErrorClass.TRANSIENT),  # admin shutdown
        ("23505", ErrorClass.UNRECOVERABLE),  # unique violation: a bug or bad data
        ("22P02", ErrorClass.UNRECOVERABLE),  # invalid text representation
    ],
)
def test_postgres_sqlstates(sqlstate: str, expected: ErrorClass) -> None:
    assert classify_postgres(FakePgError(sqlstate)) is expected


def test_postgres_driver_errors_without_sqlstate_are_transient() -> None:
    assert classify_postgres(OperationalError("server closed the connection")) is (
        ErrorClass.TRANSIENT
    )
    assert classify_postgres(ValueError("bug")) is ErrorClass.UNRECOVERABLE


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (sqlite3.OperationalError("database is locked"), ErrorClass.TRANSIENT),
        (sqlite3.OperationalError("database table is locked"), ErrorClass.TRANSIENT),
        (sqlite3.OperationalError("no such table: planes"), ErrorClass.UNRECOVERABLE),
        (sqlite3.IntegrityError("UNIQUE constraint failed"), ErrorClass.UNRECOVERABLE),
    ],
)
def test_sqlite(exc: Exception, expected: ErrorClass) -> None:
    assert classify_sqlite(exc) is expected


def test_network_errors_are_transient_and_handle_errors_keep_their_class() -> None:
    assert classify_network(ConnectionResetError()) is ErrorClass.TRANSIENT
    assert classify_network(TimeoutError()) is ErrorClass.TRANSIENT
    assert classify_network(LogUnavailableError("down")) is ErrorClass.TRANSIENT
    assert classify_network(KeyError("x")) is ErrorClass.UNRECOVERABLE
    assert classify_sqlite(Retryable("later")) is ErrorClass.RETRYABLE


def test_chain_takes_the_first_answer_that_is_not_unrecoverable() -> None:
    classify = chain(classify_postgres, classify_sqlite)
    assert classify(sqlite3.OperationalError("database is locked")) is ErrorClass.TRANSIENT
    assert classify(FakePgError("40001")) is ErrorClass.RETRYABLE
    assert classify(ValueError()) is ErrorClass.UNRECOVERABLE
