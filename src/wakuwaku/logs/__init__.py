"""Log adapters and :func:`open_log`, which picks one from a URL.

- ``sqlite:///path.db``: :class:`~wakuwaku.logs.sqlite.SQLiteLog` (relative
  path; ``sqlite:////abs/path.db`` for an absolute one)
- ``memory://``: :class:`~wakuwaku.logs.memory.MemoryLog`
- ``redis://host:port/db`` (``rediss://`` for TLS):
  :class:`~wakuwaku.logs.redis.RedisLog`, with the ``redis`` extra
- ``nats://host:port`` (several servers comma-separated; ``token@`` or
  ``user:password@`` before the hosts): :class:`~wakuwaku.logs.nats.NatsLog`,
  with the ``nats`` extra
- ``kafka://host:port`` (several brokers comma-separated; ``user:password@``
  before them for SASL): :class:`~wakuwaku.logs.kafka.KafkaLog`, with the
  ``kafka`` extra
- ``iggy://[user:password@]host:port`` (``?token=`` for a personal access
  token, ``?tls=1`` for TLS): :class:`~wakuwaku.logs.iggy.IggyLog`, with the
  ``iggy`` extra

The default URL is ``sqlite:///wakuwaku.db`` (``./wakuwaku.db``).

URL options (a query; any other option name is refused by name):

==================  =========================================================
``sqlite``          ``fsync=1|0`` (default 1: every append and commit is on
                    disk before it returns), ``busy_timeout=SECONDS``
                    (default 30: how long a writer waits for the file lock)
``memory``          none
``redis``           ``prefix=NAME`` (default ``wk``: the first part of every
                    key), ``timeout=SECONDS`` (default 5: every call's bound)
``nats``            ``prefix=NAME``, ``timeout=SECONDS`` (``docs/logs.md``)
``kafka``           ``prefix``, ``timeout``, ``transactions=1|0``,
                    ``security_protocol``, ``sasl_mechanism``,
                    ``ssl_ca_location`` (``docs/logs.md``)
``iggy``            ``stream=NAME`` (default ``wakuwaku``: the Iggy stream
                    holding the topics), ``timeout=SECONDS`` (default 5),
                    ``tls=1|0``, ``tls_ca_file``, ``tls_domain``, ``token``
                    (a personal access token; ``docs/logs.md``)
==================  =========================================================
"""

from __future__ import annotations

from .._errors import ConfigError, UnsupportedLogURL
from .._sanitize import redact_url
from ._base import MAX_READ_RECORDS as MAX_READ_RECORDS
from ._base import MAX_READ_WAIT as MAX_READ_WAIT
from ._base import BatchWrite as BatchWrite
from ._base import Lease as Lease
from ._base import Log as Log
from ._base import OutgoingRecord as OutgoingRecord
from ._base import Page as Page
from ._base import TopicInfo as TopicInfo
from ._url import LOG_URL_OPTIONS, option_bool, option_seconds
from ._url import LogURL as LogURL
from ._url import parse_log_url as parse_log_url
from .memory import MemoryLog as MemoryLog
from .sqlite import SQLiteLog as SQLiteLog

__all__ = (
    "DEFAULT_LOG_URL",
    "MAX_READ_RECORDS",
    "MAX_READ_WAIT",
    "SUPPORTED_SCHEMES",
    "BatchWrite",
    "Lease",
    "Log",
    "LogURL",
    "MemoryLog",
    "OutgoingRecord",
    "SQLiteLog",
    "TopicInfo",
    "open_log",
    "parse_log_url",
    "sqlite_log_path",
)

DEFAULT_LOG_URL = "sqlite:///wakuwaku.db"
SUPPORTED_SCHEMES: tuple[str, ...] = tuple(LOG_URL_OPTIONS)


def open_log(url: str = DEFAULT_LOG_URL) -> Log:
    """Create the log adapter a URL names (see the module docstring).

    The URL is split by :func:`parse_log_url`, the one
    parser every command uses; options are given as a query
    (``sqlite:///x.db?fsync=0&busy_timeout=5``).

    :raises UnsupportedLogURL: for a scheme no adapter handles (the error
        lists the supported ones).
    :raises ConfigError: for a URL of a known scheme that lacks its parts,
        or an option the scheme does not take (named in the message) or a
        bad option value.
    :raises ImportError: for ``redis://`` without redis-py (the message gives
        ``pip install 'wakuwaku[redis]'``).
    :raises ImportError: for a ``nats://`` URL without nats-py installed
        (the message gives the ``pip install 'wakuwaku[nats]'`` line); the
        same for ``kafka://`` and ``iggy://`` without their extras.
    """
    parsed = parse_log_url(url)
    if parsed.scheme == "memory":
        if parsed.rest:
            raise ConfigError(
                f"bad memory log URL {redact_url(url)!r}: it takes nothing after memory://"
            )
        return MemoryLog()
    if parsed.scheme == "sqlite":
        return _open_sqlite(parsed)
    if parsed.scheme in ("redis", "rediss"):
        from .redis import RedisLog  # redis-py is optional: imported only for this scheme

        return RedisLog(url)
    if parsed.scheme == "nats":
        from .nats import NatsLog  # imported here: the root package never imports nats-py

        return NatsLog.from_url(url)
    if parsed.scheme == "kafka":
        from .kafka import KafkaLog  # confluent-kafka is optional: imported only for this scheme

        return KafkaLog.from_url(url)
    if parsed.scheme == "iggy":
        from .iggy import IggyLog  # apache-iggy is optional: imported only for this scheme

        return IggyLog.from_url(url)
    raise UnsupportedLogURL(redact_url(url), SUPPORTED_SCHEMES)


def sqlite_log_path(url: str) -> str | None:
    """The file a ``sqlite://`` log URL names, or None for another scheme.

    :raises ConfigError: / :raises UnsupportedLogURL: as :func:`open_log`.
    """
    parsed = parse_log_url(url)
    return _sqlite_path(parsed) if parsed.scheme == "sqlite" else None


def _sqlite_path(parsed: LogURL) -> str:
    # sqlite:///relative.db and sqlite:////absolute.db, as SQLAlchemy spells them.
    if not parsed.rest.startswith("/") or parsed.rest == "/":
        raise ConfigError(
            f"bad SQLite log URL {redact_url(parsed.url)!r}: use sqlite:///relative.db or "
            "sqlite:////abs/path.db"
        )
    return parsed.rest[1:]


def _open_sqlite(parsed: LogURL) -> SQLiteLog:
    return SQLiteLog(
        _sqlite_path(parsed),
        fsync=option_bool(parsed, "fsync", True),
        busy_timeout=option_seconds(parsed, "busy_timeout", 30.0),
    )
