"""The Apache Iggy log: topics are Iggy topics of one stream (URL ``iggy://user:password@host:port``).

Logs in with a user and password or a personal access token (``?token=``
or ``WAKUWAKU_IGGY_TOKEN``); ``?tls=1`` (with ``tls_ca_file``,
``tls_domain``) speaks TLS, the server's certificate validated.

Mapping (``docs/logs.md``, "The Apache Iggy log"):

- one Iggy stream (default ``wakuwaku``, created on first use) holds the
  log's topics; a topic is an Iggy topic with the same partition count,
  partitions numbered from 0;
- headers are Iggy user headers (string keys, raw byte values); what Iggy
  cannot carry as a header (an empty value, a name or value over 255 bytes)
  and an empty body travel in the payload, under the reserved header
  ``wk-iggy-envelope``;
- a key's partition is Iggy's own message-key partitioning (xxHash32 of the
  key bytes, seed 0, modulo the partition count), so a record any Iggy
  producer sends by message key lands where ours does;
- offsets are Iggy offsets (dense from 0);
- ownership is Iggy's consumer groups: a member joins the Iggy consumer
  group ``<group>`` of each topic it reads, over a connection of its own, and
  owns the partitions the server assigns it (see :class:`IggyLog`);
- a group's committed offsets are stored on the server as the offsets of
  the Iggy consumer named ``<group>``; a member's commit of a partition it
  owns also passes the server's consumer-group offset fence first.

Iggy has no transactions and no conditional append: what a member that lost
a partition can still write is said in :class:`IggyLog` and the docs.

apache-iggy (the Rust SDK behind an asyncio API) is imported by this
package only (extra ``iggy``); every call is bounded by the log's
``timeout``.

The package's modules, each owning one part (their docstrings say what
they may call):

- ``_log``: :class:`IggyLog`, the facade that implements the contract;
- ``_server``: the connection, bounded calls and their errors, the stream,
  the topics and their cache, Iggy's identifiers;
- ``_messages``: records as Iggy messages (headers, the envelope, size
  limits), sends, reads, start offsets;
- ``_unanswered``: appends whose answer was lost, and where to look for
  their records before one is sent again;
- ``_offsets``: the groups' stored offsets (the binary offset commands),
  commits through the consumer-group offset fence, their deletion;
- ``_groups``: the group members, their Iggy consumer-group memberships and
  assignment syncs, who owns which partition;
- ``_ghosts``: members a killed server kept in a group (ghosts), found and
  cleared.
"""

from __future__ import annotations

try:
    import apache_iggy  # noqa: F401 - only to say which extra is missing
    import xxhash  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Iggy log needs apache-iggy: pip install 'wakuwaku[iggy]'") from exc

from ._log import PASSWORD_ENV as PASSWORD_ENV
from ._log import TOKEN_ENV as TOKEN_ENV
from ._log import USERNAME_ENV as USERNAME_ENV
from ._log import IggyLog as IggyLog
from ._log import iggy_partition as iggy_partition
from ._messages import HEADER_ROOM as HEADER_ROOM
from ._messages import MAX_PAYLOAD as MAX_PAYLOAD
from ._offsets import KIND_GROUP
from ._server import TLS as TLS

__all__ = (
    "HEADER_ROOM",
    "MAX_PAYLOAD",
    "PASSWORD_ENV",
    "TLS",
    "TOKEN_ENV",
    "USERNAME_ENV",
    "IggyLog",
    "iggy_partition",
)

_KIND_GROUP = KIND_GROUP
"""The kind of an Iggy consumer group's offset (a test stores one as a stale member's)."""
