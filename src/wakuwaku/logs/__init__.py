"""Log adapters and :func:`open_log`, which picks one from a URL.

=====================  ==============================================
URL                    adapter
=====================  ==============================================
``sqlite:///path.db``  :class:`~wakuwaku.logs.sqlite.SQLiteLog` (relative path;
                       ``sqlite:////abs/path.db`` for an absolute one)
``memory://``          :class:`~wakuwaku.logs.memory.MemoryLog`
``nats://host:port``   :class:`~wakuwaku.logs.nats.NatsLog` (several
                       servers comma-separated; ``token@`` or
                       ``user:password@`` before the hosts; options
                       ``?prefix=...&timeout=...``; needs
                       ``pip install 'wakuwaku[nats]'``)
=====================  ==============================================

The default URL is ``sqlite:///wakuwaku.db`` (``./wakuwaku.db``).
"""

from __future__ import annotations

from .._errors import UnsupportedLogURL
from ._base import BatchWrite as BatchWrite
from ._base import Lease as Lease
from ._base import Log as Log
from ._base import OutgoingRecord as OutgoingRecord
from ._base import TopicInfo as TopicInfo
from .memory import MemoryLog as MemoryLog
from .sqlite import SQLiteLog as SQLiteLog

__all__ = ("DEFAULT_LOG_URL", "SUPPORTED_SCHEMES", "BatchWrite", "Lease", "Log", "MemoryLog",
           "OutgoingRecord", "SQLiteLog", "TopicInfo", "open_log")

DEFAULT_LOG_URL = "sqlite:///wakuwaku.db"
SUPPORTED_SCHEMES: tuple[str, ...] = ("sqlite", "memory", "nats")


def open_log(url: str = DEFAULT_LOG_URL) -> Log:
    """Create the log adapter a URL names (see the module docstring).

    :raises UnsupportedLogURL: for a scheme no adapter handles (the error
        lists the supported ones).
    :raises ConfigError: for a URL of a known scheme that lacks its parts.
    :raises ImportError: for a ``nats://`` URL without nats-py installed
        (the message gives the ``pip install 'wakuwaku[nats]'`` line).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise UnsupportedLogURL(url, SUPPORTED_SCHEMES)
    scheme = scheme.lower()
    if scheme == "memory":
        if rest:
            from .._errors import ConfigError

            raise ConfigError(f"bad memory log URL {url!r}: it takes nothing after memory://")
        return MemoryLog()
    if scheme == "sqlite":
        from .._errors import ConfigError

        # sqlite:///relative.db and sqlite:////absolute.db, as SQLAlchemy spells them.
        if not rest.startswith("/") or rest == "/":
            raise ConfigError(
                f"bad SQLite log URL {url!r}: use sqlite:///relative.db or sqlite:////abs/path.db"
            )
        if "?" in rest or "#" in rest:
            raise ConfigError(
                f"bad SQLite log URL {url!r}: URL options are not supported; "
                f"pass them to SQLiteLog (e.g. SQLiteLog(path, fsync=False))"
            )
        return SQLiteLog(rest[1:])
    if scheme == "nats":
        from .nats import NatsLog  # imported here: the root package never imports nats-py

        return NatsLog.from_url(url)
    raise UnsupportedLogURL(url, SUPPORTED_SCHEMES)
