"""Setup faults: failures of the consumer's own calls that no retry can fix (design §7).

The consumer retries its own log and inbox calls on the schedule, forever,
as Transient (design §5.6): a broker that restarts comes back. A missing
table, a topic that does not exist, a refused credential or permission do
not: retried, they print the same warning every few seconds and the
consumer never ends (an inbox whose table was never created logged "no such
table: wk_inbox" sixty times a minute under ``run --drain``). Such a fault
stops the consumer with one error line naming it, and :meth:`Consumer.run`
raises :class:`~wakuwaku.SetupError` (the CLI exits non-zero).

:func:`setup_fault` recognizes them by reading the exception and its causes
(an adapter's :class:`~wakuwaku.LogUnavailableError` keeps its driver's
error as ``__cause__``), without importing any optional driver: the
standard library's sqlite3, psycopg (SQLSTATE), redis-py, nats-py and
confluent-kafka, by type name, code or message.

May call: nothing of the engine. Called by :mod:`._shared` (the retrying call).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

from .._errors import SetupError, UnknownTopicError


@dataclass(frozen=True, slots=True)
class SetupFault:
    """What :func:`setup_fault` found.

    :ivar what: the fault in a few words ("the table does not exist").
    :ivar hint: what fixes it, for the error line.
    :ivar tries: how many failures in a row make it certain: 1 for a fault
        a server states (no such table, a refused password); more for one
        that a server may answer for a moment while it settles (a topic
        just created, whose metadata has not reached every broker yet).
    """

    what: str
    hint: str
    tries: int = 1


#: SQLSTATE classes and codes that no retry fixes: 28 invalid authorization,
#: 3D000 no such database, 3F000 no such schema, 42P01 no such table,
#: 42703 no such column, 42501 insufficient privilege, 42883 no such function.
_PG_CODES = {"3D000", "3F000", "42P01", "42703", "42501", "42883"}

_SQLITE_SETUP = (
    "no such table",
    "no such column",
    "readonly database",
    "no such function",
    "unable to open database file",
)

#: What PostgreSQL says of a missing database or role while connecting
#: (psycopg gives those errors no SQLSTATE).
_PG_MISSING = re.compile(r'\b(database|role) "[^"]*" does not exist')

_AUTH_NAMES = {
    "AuthenticationError",
    "AuthenticationWrongNumberOfArgsError",
    "NoPermissionError",
    "AuthorizationError",
}

_AUTH_TEXTS = (
    "wrongpass",
    "noauth",
    "noperm",
    "authorization violation",
    "authentication failed",
    "authentication error",
    "authorization_failed",
    "sasl authentication",
    "permissions violation",
    "invalid username-password",
    "password authentication failed",
    "already authenticated",  # Redis: HELLO before AUTH, a URL without its password
    "authentication required",
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its causes and contexts, each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def setup_fault(exc: BaseException) -> SetupFault | None:
    """The setup fault ``exc`` (or one of its causes) is, or None when a retry may help.

    Recognized: :class:`~wakuwaku.SetupError` itself; a missing topic
    (:class:`~wakuwaku.UnknownTopicError`, certain after 3 in a row);
    SQLite's "no such table", "no such column", "readonly database",
    "unable to open database file";
    PostgreSQL's SQLSTATE class 28 and codes 3D000, 3F000, 42P01, 42703,
    42501, 42883, and a database or role that does not exist (said while
    connecting, without an SQLSTATE); refused credentials or permissions of Redis, NATS and
    Kafka (by the client's error type or the server's words). Everything
    else (a lost connection, a timeout, a locked database) is left to the
    retry schedule.
    """
    for cause in _chain(exc):
        found = _one(cause)
        if found is not None:
            return found
    return None


def _one(exc: BaseException) -> SetupFault | None:
    if isinstance(exc, SetupError):
        return SetupFault(exc.what, exc.hint)
    if isinstance(exc, UnknownTopicError):
        return SetupFault(
            f"topic {exc.topic!r} does not exist",
            "create it (wakuwaku topic create) or fix the consumer's topic names",
            tries=3,
        )
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        if any(part in text for part in _SQLITE_SETUP):
            return SetupFault(
                f"SQLite refused: {exc}",
                "create the schema first (an inbox: await inbox.ensure_schema()) "
                "or fix the path and permissions",
            )
        return None
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if isinstance(code, str) and (code.startswith("28") or code in _PG_CODES):
        return SetupFault(
            f"PostgreSQL refused (SQLSTATE {code}): {exc}",
            "create the schema first (an inbox: await inbox.ensure_schema()) "
            "or fix the credentials and grants",
        )
    name = type(exc).__name__
    text = str(exc).lower()
    if _PG_MISSING.search(text):
        return SetupFault(
            f"PostgreSQL refused the connection: {exc}",
            "create the database or role, or fix the DSN",
        )
    if name in _AUTH_NAMES or any(part in text for part in _AUTH_TEXTS):
        return SetupFault(
            f"the server refused the credentials or a permission: {exc}",
            "fix the user, password or token in the log URL, or the server's permissions",
        )
    return None
