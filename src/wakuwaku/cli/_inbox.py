"""``wakuwaku inbox stats`` and ``wakuwaku inbox dead``: look into an inbox (design §9, §14).

``--db`` is a SQLite file path (or ``sqlite:///path``) or a ``postgresql://``
DSN. Both commands only read: a SQLite file is opened read-only, and a
missing file or missing inbox tables is an error (exit 3), never created.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import click

from .._errors import ConfigError, UnsupportedLogURL, WakuwakuError
from .._sanitize import sanitize
from ..inbox import DEFAULT_TABLE, Inbox
from ..inbox.sqlite import SQLiteInbox
from ..logs import parse_log_url
from ._exit import ExitCode
from ._status import printable, when

T = TypeVar("T")

_PG_SCHEMES = ("postgresql://", "postgres://")


def open_inbox(db: str, group: str, table: str = DEFAULT_TABLE) -> Inbox:
    """The inbox ``--db`` names, opened for reading.

    :raises ConfigError: when the SQLite file does not exist, the table name
        is invalid, or ``db`` is a DSN and psycopg is not installed (the
        message gives the ``pip install`` line).
    """
    if db.startswith(_PG_SCHEMES):
        try:
            from ..inbox.postgres import PostgresInbox
        except ImportError as exc:
            raise ConfigError(str(exc)) from exc
        return PostgresInbox(db, group, table=table)
    if "://" in db:
        # The same parser as --log, with the schemes an inbox lives in.
        try:
            parsed = parse_log_url(db, {"sqlite": ()})
        except UnsupportedLogURL:
            raise ConfigError(
                f"--db {db!r}: an inbox lives in a SQLite file (a path or sqlite:///path) "
                "or in PostgreSQL (postgresql://...)"
            ) from None
        if not parsed.rest.startswith("/") or parsed.rest == "/":
            raise ConfigError(f"--db {db!r}: use sqlite:///relative.db or sqlite:////abs/path.db")
        db = parsed.rest[1:]
    path = Path(db)
    if not path.is_file():
        raise ConfigError(f"no SQLite database at {str(path)!r}")
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, timeout=5.0)

    return SQLiteInbox(connect, group, table=table)


def _run(inbox: Inbox, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work`` and turn a missing table or a database error into a WakuwakuError."""
    try:
        return asyncio.run(_call(work))
    except WakuwakuError:
        raise
    except Exception as exc:
        text = sanitize(exc, 300)
        if "no such table" in text or "does not exist" in text:
            raise ConfigError(
                f"no inbox table {inbox.table!r} in that database ({text}); "
                "the consumer creates it with ensure_schema()"
            ) from exc
        raise WakuwakuError(f"cannot read the inbox: {text}") from exc


async def _call(work: Callable[[], Awaitable[T]]) -> T:
    return await work()


def _options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--table",
        default=DEFAULT_TABLE,
        show_default=True,
        help="Claims table (the dead letters are in <table>_dead).",
    )(fn)
    fn = click.option("--group", "-g", required=True, help="Consumer group.")(fn)
    fn = click.option(
        "--db",
        required=True,
        metavar="PATH|DSN",
        help="SQLite file (or sqlite:///path) or postgresql:// DSN.",
    )(fn)
    return fn


def _unknown_group(inbox: Inbox, group: str) -> int:
    """Say that ``group`` has no row at all (a typo reads as an idle inbox
    otherwise), name the groups that have some; exit status 1."""
    groups = _run(inbox, inbox.groups)
    known = ", ".join(repr(g) for g in groups) if groups else "none"
    click.echo(
        f"group {group!r} has no claims, failures or dead letters in "
        f"{inbox.table!r}; groups with rows: {known}",
        err=True,
    )
    return ExitCode.FAILURE


@click.group("inbox")
def inbox_group() -> None:
    """Look into an inbox (deduplication store, design §9)."""


@inbox_group.command("stats")
@_options
def stats_command(db: str, group: str, table: str) -> int:
    """Count the group's applied claims, failing keys and dead letters.

    Exit status 1 when the group has no row at all (the groups that have
    some are named); 3 when the database or its tables are missing.
    """
    inbox = open_inbox(db, group, table)
    stats = _run(inbox, inbox.stats)
    if (stats.claims, stats.failing, stats.dead) == (0, 0, 0):
        return _unknown_group(inbox, group)
    click.echo(f"claims   {stats.claims}")
    click.echo(f"failing  {stats.failing}")
    click.echo(f"dead     {stats.dead}")
    return ExitCode.OK


@inbox_group.command("dead")
@_options
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=click.IntRange(min=1),
    help="List at most this many, most recent first.",
)
def dead_command(db: str, group: str, table: str, limit: int) -> int:
    """List poisoned messages: key, attempts, when, source and sanitized error."""
    inbox = open_inbox(db, group, table)
    dead = _run(inbox, lambda: inbox.dead(limit))
    if not dead:
        if group not in _run(inbox, inbox.groups):
            return _unknown_group(inbox, group)
        click.echo(f"no dead letters for group {group!r}")
        return ExitCode.OK
    for item in dead:
        source = (
            f"{item.source_topic}/{item.source_partition}@{item.source_offset}"
            if item.source_topic is not None
            else "-"
        )
        error = sanitize(item.last_error or "", 300)
        click.echo(
            f"{printable(item.message_key, 200)}\tattempts={item.attempts}\t"
            f"dead_at={when(item.dead_at)}\tsource={source}\terror={error}"
        )
    return ExitCode.OK


def register(group: click.Group) -> None:
    """Attach the ``inbox`` commands to the ``wakuwaku`` group."""
    group.add_command(inbox_group)
