"""Records, the wire format version 1 headers, and their validation (design §3, §8, §9).

A record is headers (``str -> bytes``) plus body bytes plus an offset. The
producer stamps every ``wk-*`` header; the consumer checks them all with
:func:`validate_headers`, which returns either the parsed headers or one
:class:`ReasonCode` with a human explanation.

This module is the one home of every ``wk-*`` header name the library
writes or reads (the ``H_*`` constants: the producer's, the retry topic's,
the dead-letter ledger's), and of the one reader of ``wk-src``
(:func:`read_source`, with :func:`checked_source` for callers that only
need to know whether it is usable). Every other module imports them.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple

import msgspec

from ._errors import ConfigError
from ._events import Algebra, EventType

WIRE_VERSION = b"1"

H_VERSION = "wk-v"
H_TYPE = "wk-type"
H_KEY = "wk-key"
H_PROPS = "wk-props"
H_ALG = "wk-alg"
H_FAILED_AT = "wk-failed-at"
H_ERROR = "wk-error"
H_REASON = "wk-reason"
H_SRC = "wk-src"
H_FOR_GROUP = "wk-for-group"
H_MARKER = "wk-marker"
H_GROUP = "wk-group"
"""On every record the engine writes to a retry or dead-letter topic: the
consumer group that wrote it. Readers skip another group's records, so a
topic two groups were configured with by accident (or a dead-letter topic
shared on purpose) never mixes their work (design §6)."""

H_UNREADABLE = "wk-unreadable"
"""Reserved: set by a log on a stored record it could not decode (design §8),
to what was wrong; such a record is dead-lettered as ``malformed_header``.
A producer's record carrying it is refused the same way."""
H_RAW_HEADERS = "wk-raw-headers"
"""On an unreadable record: the stored header bytes the log could not decode,
kept as they were (absent when there were none)."""

H_THROUGH = "wk-through"
"""Retry topic, on a ``done`` marker: the last work offset it settles."""
H_RESET = "wk-reset"
"""Retry topic, on a ``done`` marker: the key's attempt count starts again."""
H_FAILURES = "wk-failures"
"""Retry topic, on a failed-attempt marker: the key's failures so far."""
H_AT = "wk-at"
"""Retry topic, on a marker: when it was written (ms since the epoch)."""
H_DUE = "wk-due-at"
"""Retry topic, on a work record: when its key's next attempt is due (ms since the epoch)."""
H_HELD = "wk-held"
"""Retry topic, on a work record: ``1`` when it was routed there because an
operator paused its key, not because it failed (a key quarantined only so
starts at 0 failures)."""
H_OPERATOR = "wk-operator"
"""Dead-letter topic: who gave the key up (reason ``given_up_by_operator``)."""
H_DLQ_OFFSET = "wk-dlq-offset"
"""Replay ledger: the dead letter's offset in its ``wk-dlq.<group>.<topic>`` partition."""
H_REPLAYED_TO = "wk-replayed-to"
"""Replay ledger: ``<partition>@<offset>`` of the copy in the main topic."""

RETRY_ONLY_HEADERS = frozenset(
    {H_FAILED_AT, H_MARKER, H_THROUGH, H_RESET, H_FAILURES, H_AT, H_HELD}
)
"""Headers the engine writes on its retry topic only (design §8): on a main-topic
record they make it ``malformed_header``, so that nobody can forge a marker or
a failure time through the main topic."""

_GROUP_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
MAX_GROUP_LENGTH = 100


def valid_group_name(name: object) -> bool:
    """True for a consumer group name: 1 to 100 characters of ``A-Z a-z 0-9 _ -``
    (it is part of the group's retry and dead-letter topic names, design §6)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_GROUP_LENGTH
        and _GROUP_CHARS.issuperset(name)
    )


MAX_STORED_MS = 2**53
"""Stored times (ms since the epoch) are below this bound, so that any stored
time converts to a float and to a date (year < 285 000)."""

Headers = Mapping[str, bytes]


class Record(msgspec.Struct, frozen=True, gc=False):
    """One record read from a log partition.

    :param offset: its offset in the partition (int, monotonic per partition).
    :param headers: header name -> raw bytes. Read-only: records read
        together may share one dict when their headers are equal (the SQLite
        log does this); copy it before changing anything.
    :param body: the body bytes.
    :param timestamp: when the log stored it (seconds since the epoch).
    """

    offset: int
    headers: dict[str, bytes]
    body: bytes
    timestamp: float = 0.0


def unreadable_record(
    offset: int, what: str, body: bytes, raw_headers: bytes | None = None, timestamp: float = 0.0
) -> Record:
    """The record a log returns for a stored record it cannot decode (design §8).

    Nothing is dropped: ``body`` is the stored body, or the raw stored bytes
    when no body could be found; ``raw_headers`` (the stored header bytes,
    when there are any) goes into ``wk-raw-headers``. ``wk-unreadable`` says
    what was wrong (``what``: the log's own words, never record contents or
    connection details). The consumer dead-letters it as ``malformed_header``
    and goes on with the next record instead of failing the read forever.
    """
    headers = {H_UNREADABLE: what.encode("utf-8", "replace")}
    if raw_headers is not None:
        headers[H_RAW_HEADERS] = bytes(raw_headers)
    return Record(offset, headers, bytes(body), timestamp)


class ReasonCode(enum.StrEnum):
    """Why a record was dead-lettered (``wk-reason``, design §8)."""

    MALFORMED_HEADER = "malformed_header"
    """Type tag, key or props missing or broken; unknown header version; a
    record the log could not decode (``wk-unreadable``)."""
    UNKNOWN_TYPE = "unknown_type"
    """No handler is registered for the type tag."""
    ALGEBRA_MISMATCH = "algebra_mismatch"
    """The header's algebra marker differs from the registered type's."""
    UNDECODABLE_BODY = "undecodable_body"
    """The codec could not decode the body."""
    UNSERIALIZABLE_RETRY_RECORD = "unserializable_retry_record"
    """An event bound for the retry topic could not be encoded again."""
    RETRY_BACKLOG_FULL = "retry_backlog_full"
    """A newly failing key would exceed ``max_pending_retry``."""
    GAVE_UP_RETRY = "gave_up_retry"
    """The key's last retry attempt failed."""
    GIVEN_UP_BY_OPERATOR = "given_up_by_operator"
    """An operator gave the quarantined key up (``wakuwaku key give-up``);
    ``wk-operator`` names who."""
    UNRECOVERABLE = "unrecoverable"
    """A handler raised Unrecoverable (or an unknown exception classified so)."""


class Source(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Where a retry or dead-letter record came from (``wk-src``, design §3, §9).

    :param topic: the main topic.
    :param partition: the main topic's partition.
    :param offsets: the main-topic offsets the record stands for (a reduced
        event stands for several).
    :param ids: message identities (design §9) of those records, in order.
    """

    topic: str
    partition: int
    offsets: tuple[int, ...]
    ids: tuple[str, ...]


_src_encoder = msgspec.json.Encoder()
_src_decoder = msgspec.json.Decoder(Source)
_props_decoder = msgspec.json.Decoder(dict[str, str])


def encode_source(source: Source) -> bytes:
    """The ``wk-src`` header value of ``source``."""
    return _src_encoder.encode(source)


def decode_source(raw: bytes) -> Source:
    """Parse a ``wk-src`` header value, unchecked (:func:`read_source` checks).

    :raises msgspec.DecodeError: when it is not a valid source.
    """
    return _src_decoder.decode(raw)


def read_source(raw: bytes) -> Source:
    """The ``wk-src`` header value ``raw`` as a checked :class:`Source`.

    The one reader of ``wk-src``: a source names a partition >= 0, at least
    one offset, every offset >= 0, and at least one message id, none empty.

    :raises ValueError: saying what is wrong (not JSON of the right shape,
        or the rule above broken); ``msgspec.DecodeError`` is one.
    """
    source = _src_decoder.decode(raw)
    if not _follows_the_rule(source):
        raise ValueError(
            f"header wk-src needs message ids, offsets >= 0 and a partition >= 0, got {raw[:200]!r}"
        )
    return source


def _follows_the_rule(source: Source) -> bool:
    """The rule of :func:`read_source`: message ids, none empty, offsets >= 0
    (at least one) and a partition >= 0."""
    return bool(
        source.ids
        and source.offsets
        and source.partition >= 0
        and min(source.offsets) >= 0
        and all(source.ids)
    )


def message_id(
    topic: str, partition: int, offset: int, own_id: str | None = None, type_tag: str = ""
) -> str:
    """The message identity of one main-topic record (design §9).

    The one function every identity comes from: the inbox's claim, lookup,
    failure path and index, and the ``wk-src`` of retry and dead-letter copies.
    It is the event's own id when its type declares one (``id:<tag>:<id>``),
    otherwise ``<topic>/<partition>/<offset>`` of the record in the main
    topic. Properties such as a tenant never take part (seed 004's outage:
    a key whose halves came from different fields never matched its index).
    """
    if own_id is not None:
        return f"id:{type_tag}:{own_id}"
    return f"{topic}/{partition}/{offset}"


@dataclass(frozen=True, slots=True)
class ValidHeaders:
    """The parsed ``wk-*`` headers of a valid record."""

    type_tag: str
    key: str
    props: dict[str, str]
    algebra: Algebra
    event_type: EventType[Any]
    failed_at: float | None = None
    source: Source | None = None
    for_group: str | None = None
    """``wk-for-group``: only this consumer group handles the record (a
    replayed dead letter, design §8); None for every group."""


@dataclass(frozen=True, slots=True)
class InvalidHeaders:
    """Why a record's headers cannot be used: a reason code and a detail text."""

    reason: ReasonCode
    detail: str


def _text(headers: Headers, name: str) -> str | None:
    raw = headers.get(name)
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    return bytes(raw).decode("utf-8")


def validate_headers(
    headers: Headers, types: Mapping[str, EventType[Any]]
) -> ValidHeaders | InvalidHeaders:
    """Check every header of wire format version 1 (design §3, §8).

    One check per header, in a fixed order (the first problem found is the
    reason given): ``wk-unreadable`` (the log could not decode the stored
    record, or a producer used the reserved name), ``wk-v``, ``wk-type``, ``wk-key``, ``wk-props``,
    ``wk-alg``, ``wk-failed-at``, ``wk-for-group``, ``wk-src``, then the type
    tag against ``types``.

    :param headers: the record's headers.
    :param types: the event types the reader can handle, by type tag.
    :returns: :class:`ValidHeaders`, or :class:`InvalidHeaders` with reason
        ``malformed_header`` (version, type, key, props, algebra, failed-at or
        source missing or broken), ``unknown_type`` (tag not in ``types``) or
        ``algebra_mismatch`` (marker differs from the registered type's).
    """
    malformed = ReasonCode.MALFORMED_HEADER
    if H_UNREADABLE in headers:
        what = header_text(headers, H_UNREADABLE) or "no reason given"
        return InvalidHeaders(
            malformed,
            f"the log could not read the stored record ({H_UNREADABLE}, a reserved "
            f"header): {what[:300]}",
        )
    try:
        version, tag, key, alg_raw, failed_raw, for_group = (
            _text(headers, name)
            for name in (H_VERSION, H_TYPE, H_KEY, H_ALG, H_FAILED_AT, H_FOR_GROUP)
        )
    except (UnicodeDecodeError, TypeError) as exc:
        return InvalidHeaders(malformed, f"a wk-* header is not valid UTF-8: {exc}")
    identity = _check_identity(version, tag, key)
    if isinstance(identity, _Problem):
        return InvalidHeaders(malformed, identity.detail)
    tag, key = identity
    props = _check_props(headers.get(H_PROPS))
    if isinstance(props, _Problem):
        return InvalidHeaders(malformed, props.detail)
    algebra = _check_algebra(alg_raw)
    if isinstance(algebra, _Problem):
        return InvalidHeaders(malformed, algebra.detail)
    failed_at = _check_failed_at(failed_raw)
    if isinstance(failed_at, _Problem):
        return InvalidHeaders(malformed, failed_at.detail)
    if for_group is not None and not valid_group_name(for_group):
        return InvalidHeaders(
            malformed, f"header wk-for-group is not a consumer group name: {for_group[:120]!r}"
        )
    source = _check_source(headers.get(H_SRC))
    if isinstance(source, _Problem):
        return InvalidHeaders(malformed, source.detail)
    event_type = types.get(tag)
    if event_type is None:
        return InvalidHeaders(ReasonCode.UNKNOWN_TYPE, f"no handler for type tag {tag!r}")
    if event_type.algebra is not algebra:
        return InvalidHeaders(
            ReasonCode.ALGEBRA_MISMATCH,
            f"type {tag!r} is registered {event_type.algebra.value} "
            f"but the record says {algebra.value}",
        )
    return ValidHeaders(tag, key, props, algebra, event_type, failed_at, source, for_group)


class _Problem(NamedTuple):
    """What one check of :func:`validate_headers` found wrong (the reason's detail)."""

    detail: str


# The checks of validate_headers: each returns the parsed value, or a _Problem.


def _check_identity(
    version: str | None, tag: str | None, key: str | None
) -> tuple[str, str] | _Problem:
    if version is None:
        return _Problem("header wk-v is missing")
    if version != WIRE_VERSION.decode():
        return _Problem(f"unknown header version wk-v={version!r}")
    if not tag:
        return _Problem("header wk-type is missing or empty")
    if not key:
        return _Problem("header wk-key is missing or empty")
    return tag, key


def _check_props(raw: bytes | None) -> dict[str, str] | _Problem:
    if raw is None:
        return {}
    try:
        props: dict[str, str] = _props_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return _Problem(f"header wk-props is not a JSON string map: {exc}")
    return props


def _check_algebra(raw: str | None) -> Algebra | _Problem:
    if raw is None:
        return _Problem("header wk-alg is missing")
    try:
        return Algebra(raw)
    except ValueError:
        return _Problem(f"header wk-alg has unknown marker {raw!r}")


def _check_failed_at(raw: str | None) -> float | _Problem | None:
    if raw is None:
        return None
    failed_at = parse_ms(raw)
    if failed_at is None:
        return _Problem(
            f"header wk-failed-at is not ms since the epoch in [0, 2**53): {raw[:40]!r}"
        )
    return failed_at


def _check_source(raw: bytes | None) -> Source | _Problem | None:
    if raw is None:
        return None
    try:
        return read_source(raw)
    except msgspec.DecodeError as exc:
        return _Problem(f"header wk-src is broken: {exc}")
    except ValueError as exc:
        return _Problem(str(exc))


def checked_source(raw: bytes) -> Source | None:
    """A ``wk-src`` value as :func:`validate_headers` accepts it (ids,
    offsets >= 0, a partition >= 0), or None when it is not one; never raises."""
    try:
        source = _src_decoder.decode(raw)
    except Exception:  # noqa: BLE001 - a header may hold anything
        return None
    return source if _follows_the_rule(source) else None


class CheckedSource(msgspec.Struct, array_like=True, gc=False):
    """A ``wk-src`` value as :func:`checked_source` accepts it, checked by the
    decoder itself (:data:`decode_checked_source`): the rule of
    :func:`read_source` written as constraints (a partition >= 0, at least
    one offset, each >= 0, at least one message id, none empty), so that a
    caller that only wants the offsets runs no Python per record."""

    topic: str
    partition: Annotated[int, msgspec.Meta(ge=0)]
    offsets: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(min_length=1)]
    ids: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)]


decode_checked_source = msgspec.json.Decoder(CheckedSource).decode
"""A ``wk-src`` value as a :class:`CheckedSource`; raises ``msgspec.DecodeError``
(or ``TypeError`` for what is not bytes-like) for every value
:func:`checked_source` refuses. For the hottest loop (a restart folds in
every pending record, :meth:`RetryState.apply_all
<wakuwaku.engine._retry.RetryState.apply_all>`), where a call of
:func:`source_top` per record costs more than the decode."""


def source_top(raw: bytes) -> int | None:
    """The highest main offset of a ``wk-src`` value that :func:`checked_source`
    accepts, or None when it accepts none; never raises.

    Retry state wants only this number from each pending record: the
    decoder checks the rule in C and builds no :class:`Source`, half the
    cost of :func:`checked_source`.
    """
    try:
        return max(decode_checked_source(raw).offsets)
    except Exception:  # noqa: BLE001 - a header may hold anything
        return None


def parse_ms(raw: str | bytes) -> float | None:
    """Seconds from a stored ``ms since the epoch`` text, or None when it is
    not a plain integer in ``[0, MAX_STORED_MS)`` (a header may hold
    anything: ``"9" * 400`` must not raise)."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    if not 0 < len(text) <= 16 or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value / 1000.0 if value < MAX_STORED_MS else None


def build_headers(
    event_type: EventType[Any],
    key: str,
    properties: Mapping[str, str] | None = None,
    extra: Iterable[tuple[str, bytes]] = (),
) -> dict[str, bytes]:
    """The ``wk-*`` headers the producer stamps on a record of ``event_type``.

    :raises ConfigError: when a property name or value is not a string.
    """
    headers = {
        H_VERSION: WIRE_VERSION,
        H_TYPE: event_type.tag.encode(),
        H_KEY: key.encode(),
        H_ALG: event_type.algebra.value.encode(),
    }
    if properties:
        for name, value in properties.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ConfigError(
                    f"properties must map str to str; got {name!r}: {value!r} "
                    f"on an event of type {event_type.tag!r}"
                )
        headers[H_PROPS] = json.dumps(
            dict(properties), ensure_ascii=False, separators=(",", ":")
        ).encode()
    headers.update(extra)
    return headers


def header_text(headers: Headers, name: str) -> str | None:
    """A header as text (invalid UTF-8 replaced), or None when absent."""
    raw = headers.get(name)
    if raw is None:
        return None
    return bytes(raw).decode("utf-8", "replace")


def key_or_none(headers: Headers) -> str | None:
    """A record's ``wk-key`` as text, or None when it is missing or is not
    valid UTF-8 (for reports and recovery paths that must never raise)."""
    try:
        return header_text(headers, H_KEY)
    except (UnicodeDecodeError, TypeError):
        return None


def offsets_of(records: Sequence[Record]) -> list[int]:
    """The offsets of ``records``, in order."""
    return [r.offset for r in records]
