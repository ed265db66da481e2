"""The inbox contract: exactly-once effects for handlers that cannot be idempotent (design §9).

A handler whose effect cannot be repeated (adding to a sum, sending an email)
*claims* the message identity of every record it applies, inside the same
database transaction as the effect. The claim is one atomic statement
(``INSERT ... ON CONFLICT ... RETURNING message_key``) whose returned rows
say which keys are new; the rest are duplicates and must be skipped. If the
transaction rolls back, the claim rolls back with the effect; if it commits,
both are there. A crash between the commit and the log's offset commit
redelivers the record, and the second claim says "duplicate".

Rules that come from seed 004 (an inbox whose lookup key never matched its
unique index, so every redelivery looked new and backlogs were re-applied
every 45 s for weeks):

- every identity comes from :func:`wakuwaku._records.message_id`, through
  :meth:`InboxKey.for_message` or :func:`record_keys`; properties such as a
  tenant never take part;
- claim, lookup, failure path and primary key all use exactly
  ``(consumer_group, message_key)``, both ``NOT NULL``;
- a unique violation is never read as "someone else did it": no code path
  catches an integrity error; the statement's ``RETURNING`` rows decide;
- the failure path finds the same row, advances its attempt counter and,
  at the limit, moves it to the dead-letter table.

Row life cycle (one row per ``(consumer_group, message_key)``)::

    (no row) --claim, tx commits--> done
    (no row) --record_failure-----> failing (attempts=1)
    failing  --record_failure-----> failing (attempts+1) --at max_attempts--> dead table
    failing  --claim, tx commits--> done (attempts kept)
    done     --purge (old, below the committed offset)--> (no row)

A ``done`` row is never turned back into ``failing``: a failure recorded for
an applied key changes nothing and says so (:attr:`FailureOutcome.already_claimed`).
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError
from .._events import EventType
from .._records import H_SRC, Record, message_id, read_source

DEFAULT_TABLE = "wk_inbox"
"""The default claims table; the dead-letter table is ``<table>_dead``."""

DEFAULT_MAX_ATTEMPTS = 5
"""How many failures a message may have before it is dead-lettered."""

DEFAULT_ERROR_LIMIT = 1024
"""The longest stored error text, in characters (after sanitizing, design §14)."""

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")


@dataclass(frozen=True, slots=True)
class InboxKey:
    """A message identity plus where the message was read (for housekeeping only).

    Only :attr:`message_key` is the identity; the source fields are stored
    next to it so :meth:`Inbox.purge` knows whether the log may still
    deliver the message again, and are never part of any lookup.

    :param message_key: the identity, as :func:`wakuwaku.message_id` returns it.
    :param topic: the main topic the message was read from, or None.
    :param partition: its partition, or None.
    :param offset: its offset in the main topic, or None.
    :raises ConfigError: when the key is empty or not a string, or the source
        is partly given (topic, partition and offset go together).
    """

    message_key: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.message_key, str) or not self.message_key:
            raise ConfigError(
                f"an inbox message key must be a non-empty str, got {self.message_key!r}"
            )
        given = (self.topic is not None, self.partition is not None, self.offset is not None)
        if any(given) and not all(given):
            raise ConfigError(
                f"inbox key {self.message_key!r}: source topic, partition and offset go "
                f"together (got {self.topic!r}, {self.partition!r}, {self.offset!r})"
            )

    @classmethod
    def for_message(
        cls,
        topic: str,
        partition: int,
        offset: int,
        own_id: str | None = None,
        type_tag: str = "",
    ) -> InboxKey:
        """The key of a message read from ``topic``/``partition`` at ``offset``.

        For consumers that are not wakuwaku's (faststream, aiokafka...): the
        identity is :func:`wakuwaku.message_id` of the same arguments, the
        event's own id when it has one, else ``topic/partition/offset``.

        :param own_id: the event's own unique id, if its type declares one.
        :param type_tag: the event type's tag (scopes ``own_id``).
        """
        return cls(message_id(topic, partition, offset, own_id, type_tag), topic, partition, offset)


def record_keys(
    topic: str,
    partition: int,
    record: Record,
    event_type: EventType[Any] | None = None,
    event: object = None,
) -> list[InboxKey]:
    """The inbox keys of one record, computed exactly as the consumer engine does.

    - A record read from a main topic stands for one message:
      ``message_id(topic, partition, record.offset, own_id, type_tag)``, where
      ``own_id`` is ``event_type.id_of(event)`` when the type declares an id.
    - A retry or dead-letter copy (it has a ``wk-src`` header) stands for the
      messages listed in its header: their ids (``Source.ids``), in order, with
      the main topic, partition and offsets they came from. ``topic`` and
      ``partition`` (the retry topic's) play no part.

    Properties (``wk-props``, a tenant...) never take part (design §9, seed 004).

    :param topic: the topic the record was read from.
    :param partition: the partition it was read from.
    :param event_type: the record's event type; needed only when the type
        declares its own id.
    :param event: the decoded event; when None and the type declares an id,
        the body is decoded with ``event_type``.
    :raises ValueError: when the ``wk-src`` header is broken or lists no ids
        (``msgspec.DecodeError`` is a ValueError).
    :raises Exception: whatever the codec raises when it must decode the body.
    """
    raw_src = record.headers.get(H_SRC)
    if raw_src is not None:
        try:
            source = read_source(raw_src)
        except ValueError as exc:
            raise ValueError(
                f"the wk-src header of the record at {topic}/{partition}/{record.offset}: {exc}"
            ) from exc
        if len(source.offsets) != len(source.ids):
            return [InboxKey(mid) for mid in source.ids]
        return [
            InboxKey(mid, source.topic, source.partition, off)
            for mid, off in zip(source.ids, source.offsets, strict=True)
        ]
    own_id: str | None = None
    tag = ""
    if event_type is not None:
        tag = event_type.tag
        if event_type.id_name is not None:
            own_id = event_type.id_of(
                event if event is not None else event_type.decode(record.body)
            )
    return [InboxKey.for_message(topic, partition, record.offset, own_id, tag)]


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim found: which keys are new (apply them) and which are duplicates.

    Both lists keep the order of the keys given; a key given twice in one
    call is new at most once, its repetitions are duplicates.
    """

    new: list[str]
    duplicate: list[str]

    def is_new(self, key: str | InboxKey) -> bool:
        """Whether ``key`` was new in this claim (apply its effect)."""
        return _text(key) in self.new


class EntryStatus(enum.StrEnum):
    """Where a message key stands in the inbox."""

    DONE = "done"
    """Claimed by a committed transaction: its effect is applied."""
    FAILING = "failing"
    """Failures were recorded and no claim has committed yet."""
    DEAD = "dead"
    """Over its attempt limit: moved to the dead-letter table."""


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """One key's row, as :meth:`Inbox.entries` reads it.

    :param claimed_at: when the committed claim was written (seconds since the
        epoch), None while it never was.
    :param failed_at: when the last failure was recorded (seconds since the
        epoch), None when none was.
    """

    message_key: str
    status: EntryStatus
    attempts: int
    last_error: str | None
    claimed_at: float | None
    failed_at: float | None
    source_topic: str | None
    source_partition: int | None
    source_offset: int | None


@dataclass(frozen=True, slots=True)
class FailureOutcome:
    """What :meth:`Inbox.record_failure` did.

    :param attempts: the key's failure count after this one.
    :param dead_lettered: the key reached the attempt limit and is now in the
        dead-letter table; do not retry it.
    :param already_claimed: the key's claim had committed before (its effect
        is applied); nothing was recorded and ``attempts`` is unchanged.
    """

    message_key: str
    attempts: int
    dead_lettered: bool
    already_claimed: bool = False


@dataclass(frozen=True, slots=True)
class InboxStats:
    """Counts for one consumer group: applied claims, failing keys, dead letters."""

    claims: int
    failing: int
    dead: int


@dataclass(frozen=True, slots=True)
class DeadMessage:
    """A message moved to the dead-letter table (``wakuwaku inbox dead``).

    :param failed_at: its last failure (seconds since the epoch).
    :param dead_at: when it was dead-lettered (seconds since the epoch).
    :param last_error: the sanitized error text (design §14).
    """

    message_key: str
    attempts: int
    last_error: str | None
    failed_at: float | None
    dead_at: float
    source_topic: str | None
    source_partition: int | None
    source_offset: int | None


class Inbox(abc.ABC):
    """The inbox of one consumer group in one database: one base, one class per backend.

    The claim itself (``claim(conn, keys)``) is each backend's own, because it
    runs on the caller's connection and transaction: synchronous
    ``sqlite3.Connection`` for :class:`~wakuwaku.inbox.SQLiteInbox`, async
    psycopg connection for :class:`~wakuwaku.inbox.postgres.PostgresInbox`.
    Everything else runs on the inbox's own connections and is async.

    :param group: the consumer group; first half of every key.
    :param max_attempts: failures allowed before a message is dead-lettered
        (the ``max_attempts``-th recorded failure moves it).
    :param table: the claims table; the dead-letter table is ``<table>_dead``.
    :param clock: where ``claimed_at``/``failed_at`` come from (seconds).
    :param error_limit: the longest stored error text, in characters.
    :raises ConfigError: for an empty group, ``max_attempts`` or
        ``error_limit`` below 1, or a table name that is not a plain SQL
        identifier (letters, digits, ``_``; at most 48 characters).
    """

    def __init__(
        self,
        group: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        table: str = DEFAULT_TABLE,
        clock: Clock = SYSTEM_CLOCK,
        error_limit: int = DEFAULT_ERROR_LIMIT,
    ) -> None:
        if not isinstance(group, str) or not group:
            raise ConfigError(f"an inbox needs a non-empty consumer group, got {group!r}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if not isinstance(error_limit, int) or error_limit < 1:
            raise ConfigError(f"error_limit must be an int >= 1, got {error_limit!r}")
        self.group = group
        self.max_attempts = max_attempts
        self.table = check_identifier(table)
        self.dead_table = f"{self.table}_dead"
        self.clock = clock
        self.error_limit = error_limit

    @abc.abstractmethod
    async def ensure_schema(self) -> None:
        """Create the claims and dead-letter tables and their index; idempotent."""

    @abc.abstractmethod
    async def claimed(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` have a committed claim (their effect is applied).

        The consumer engine calls this on each batch, outside any handler
        transaction, and drops those records before reduction. A failing or
        dead key is not claimed. The answer is a snapshot: a concurrent claim
        may commit right after it, so handlers still claim inside their
        transaction.
        """

    @abc.abstractmethod
    async def entries(self, keys: Sequence[str]) -> dict[str, InboxEntry]:
        """The rows of ``keys`` (claims, failing or dead), by key; absent keys are left out."""

    @abc.abstractmethod
    async def record_failure(
        self, key: str | InboxKey, error: BaseException | str | bytes
    ) -> FailureOutcome:
        """Record that handling ``key`` failed, in the inbox's own transaction.

        Call it after the handler's transaction rolled back: that transaction
        is gone (and in PostgreSQL an aborted transaction accepts nothing), so
        the failure is written and committed on a connection of the inbox's.

        It finds the row by ``(consumer_group, message_key)``, the very columns
        of the claim and of the primary key (seed 004: the failure path's
        lookup never matched, so attempts never advanced and nothing was ever
        dead-lettered). It advances ``attempts``, stores ``error`` sanitized
        (design §14) and cut to ``error_limit`` characters, and at
        ``max_attempts`` moves the row to the dead-letter table. A key that
        was dead-lettered before and fails again goes straight back there with
        its count continued, never restarted.
        """

    @abc.abstractmethod
    async def purge(self, older_than: float, committed: Mapping[tuple[str, int], int]) -> int:
        """Delete applied claims older than ``older_than`` seconds that cannot come back.

        A claim whose source offset is ``>=`` the group's committed offset of
        its ``(topic, partition)`` may still be delivered again, so it is
        kept; so is one whose ``(topic, partition)`` is not in ``committed``.
        A claim without a source (keys given as plain strings) is deleted by
        age alone. Failing rows and dead letters are never purged: an attempt
        counter must not restart.

        :param older_than: the age window (seconds); claims written earlier
            than ``now - older_than`` are candidates.
        :param committed: ``(topic, partition) -> committed offset`` (the
            next offset to read) of the group.
        :returns: how many claims were deleted.
        :raises ConfigError: when ``older_than`` is negative.
        """

    @abc.abstractmethod
    async def stats(self) -> InboxStats:
        """Counts of the group's applied claims, failing keys and dead letters."""

    @abc.abstractmethod
    async def dead(self, limit: int = 100) -> list[DeadMessage]:
        """The group's dead letters, most recent first, at most ``limit``."""

    @abc.abstractmethod
    async def groups(self) -> list[str]:
        """Every consumer group with a row (claim, failure or dead letter) in
        this inbox's tables, sorted: so a command asked about a group without
        any can say which groups there are."""

    def _failure_text(self, error: BaseException | str | bytes) -> str:
        return sanitized(error, self.error_limit)

    def _cutoff(self, older_than: float) -> float:
        if not older_than >= 0:
            raise ConfigError(f"purge: older_than must be >= 0 seconds, got {older_than!r}")
        return self.clock.now() - older_than


def check_identifier(name: str) -> str:
    """Return ``name`` when it is a plain SQL identifier usable as a table name.

    :raises ConfigError: otherwise (it is pasted into SQL text, never quoted).
    """
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise ConfigError(
            f"invalid inbox table name {name!r}: use letters, digits and '_', "
            "starting with a letter or '_', at most 48 characters"
        )
    return name


def sanitized(error: BaseException | str | bytes, limit: int) -> str:
    """Error text made safe to store (design §14), via :func:`wakuwaku._sanitize.sanitize`."""
    from .._sanitize import sanitize

    return sanitize(error, limit)


def normalize_keys(keys: Sequence[str | InboxKey]) -> tuple[list[str], list[InboxKey]]:
    """The keys as text in the caller's order, and the distinct keys sorted by text.

    Sorting makes every claimer lock overlapping keys in the same order, so
    two claims of the same keys cannot deadlock each other.

    :raises ConfigError: for an empty or non-string key, or a str passed
        where a sequence of keys is expected.
    """
    if isinstance(keys, str | bytes):
        raise ConfigError("claim takes a sequence of keys, not a single string")
    order: list[str] = []
    distinct: dict[str, InboxKey] = {}
    for item in keys:
        key = item if isinstance(item, InboxKey) else InboxKey(item)
        order.append(key.message_key)
        distinct.setdefault(key.message_key, key)
    return order, [distinct[k] for k in sorted(distinct)]


def plain_keys(keys: Sequence[str]) -> list[str]:
    """Distinct ``keys`` in order, checked like :func:`normalize_keys`.

    :raises ConfigError: for an empty or non-string key, or a str passed
        where a sequence of keys is expected.
    """
    if isinstance(keys, str | bytes):
        raise ConfigError("claim takes a sequence of keys, not a single string")
    # The consumer looks up every batch's ids here: plain non-empty strings
    # need no InboxKey each (building them was 4 % of the flights demo).
    if all(type(key) is str and key for key in keys):
        return list(dict.fromkeys(keys))
    order, _ = normalize_keys(keys)
    return list(dict.fromkeys(order))


def split_claim(order: Sequence[str], returned: set[str]) -> Claim:
    """Turn the keys a claim statement returned into :class:`Claim`.

    Only a returned key is new, and only at its first position; everything
    else is a duplicate. Nothing else is ever read as "new".
    """
    new: list[str] = []
    duplicate: list[str] = []
    seen: set[str] = set()
    for key in order:
        if key in returned and key not in seen:
            new.append(key)
        else:
            duplicate.append(key)
        seen.add(key)
    return Claim(new, duplicate)


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """``items`` in slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def load_queries(filename: str, table: str, dead_table: str) -> dict[str, str]:
    """The named statements of a ``.sql`` file next to this module.

    A statement starts at a line ``-- name: <name>``; ``{table}`` and
    ``{dead_table}`` are replaced by the (checked) table names.
    """
    text = resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in [*text.splitlines(), "-- name: <end>"]:
        if line.startswith("-- name: "):
            if name is not None:
                queries[name] = "\n".join(lines).strip()
            name, lines = line.removeprefix("-- name: ").strip(), []
        elif name is not None and not line.lstrip().startswith("--"):
            lines.append(line)
    return {
        n: q.replace("{dead_table}", dead_table).replace("{table}", table)
        for n, q in queries.items()
    }


def _text(key: str | InboxKey) -> str:
    return key.message_key if isinstance(key, InboxKey) else key
