"""The Apache Iggy log: :class:`IggyLog` (URL ``iggy://user:password@host:port``).

The log and its mapping onto Iggy are in :mod:`._log`; this package keeps
``wakuwaku.logs.iggy`` the one name users import it by.
"""

from __future__ import annotations

from ._log import _KIND_GROUP as _KIND_GROUP
from ._log import HEADER_ROOM as HEADER_ROOM
from ._log import MAX_PAYLOAD as MAX_PAYLOAD
from ._log import PASSWORD_ENV as PASSWORD_ENV
from ._log import USERNAME_ENV as USERNAME_ENV
from ._log import IggyLog as IggyLog
from ._log import iggy_partition as iggy_partition

__all__ = (
    "HEADER_ROOM",
    "MAX_PAYLOAD",
    "PASSWORD_ENV",
    "USERNAME_ENV",
    "IggyLog",
    "iggy_partition",
)
