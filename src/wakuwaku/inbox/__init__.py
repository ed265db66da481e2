"""The inbox: exactly-once effects for handlers that cannot be idempotent (design §9).

==============================================  =====================================
class                                           where the claims live
==============================================  =====================================
:class:`~wakuwaku.inbox.SQLiteInbox`            a SQLite file (stdlib ``sqlite3``)
``wakuwaku.inbox.postgres.PostgresInbox``       PostgreSQL (psycopg 3, the ``postgres``
                                                extra; imported from its own module so
                                                this package never imports psycopg)
==============================================  =====================================

See ``docs/inbox.md`` for the design and a standalone example.
"""

from __future__ import annotations

from ._base import DEFAULT_TABLE as DEFAULT_TABLE
from ._base import Claim as Claim
from ._base import DeadMessage as DeadMessage
from ._base import EntryStatus as EntryStatus
from ._base import FailureOutcome as FailureOutcome
from ._base import Inbox as Inbox
from ._base import InboxEntry as InboxEntry
from ._base import InboxKey as InboxKey
from ._base import InboxStats as InboxStats
from ._base import record_keys as record_keys
from .sqlite import SQLiteInbox as SQLiteInbox

__all__ = (
    "DEFAULT_TABLE",
    "Claim",
    "DeadMessage",
    "EntryStatus",
    "FailureOutcome",
    "Inbox",
    "InboxEntry",
    "InboxKey",
    "InboxStats",
    "SQLiteInbox",
    "record_keys",
)
