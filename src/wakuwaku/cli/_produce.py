"""``wakuwaku produce TOPIC [FILE]``: JSON lines written as records with every
``wk-*`` header (design §3), without the Python event class.

One JSON document per line: an envelope ``{"type": T, "key": K, "body":
{...}, "props": {...}, "alg": A}`` (no other field), or, with ``--type T
--key-field F``, the body object itself. Blank lines are skipped.

All or nothing, as far as the log allows: every line is read and checked
first (JSON, type, key, body, props, algebra, the log's record size limit);
one bad line, and every bad line is reported with its number and key, and
nothing is written (exit status 1). Only then are the records written, in
the order of the lines, per partition in appends of at most
:data:`BATCH` lines. A log fails or the command is interrupted while
writing: it says which lines were written, which may have been (the append
under way) and which were not. ``--dry-run`` checks and prints what would
be written.

The algebra (``wk-alg``) a consumer checks each record against (a record
whose marker differs from the registered type's is dead-lettered
``algebra_mismatch``, and a replay cannot fix it) comes from the
application's own types (``--app``, as ``run`` loads it), else from the
envelope's ``"alg"`` or ``--algebra``; a line with none of them is refused,
naming its type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import click
import msgspec

from .._events import Algebra, EventType, JsonCodec
from .._json import DuplicateKeyError, decode_strict
from .._records import build_headers
from .._sanitize import sanitize
from .._text import counted, plural, shown_key
from ..logs import Log, OutgoingRecord
from ._exit import ExitCode
from ._run import app_types
from ._status import log_option, with_log
from ._topics import refuse_configured_topic, refuse_engine_topic

BATCH = 500
"""Lines per round of appends (one append per partition of the round)."""

ENVELOPE_FIELDS = ("type", "key", "body", "props", "alg")
"""The fields an envelope may have; any other is refused, not ignored."""

_ENGINE_WRITES = "only the consumer writes it (a record there would be read as its own work)"
_REPLAY_INSTEAD = "produce to the main topic, or replay dead letters with 'wakuwaku dlq replay'"
_KEY_SHOWN = 80
"""Characters of a key a message shows."""
_MISSING = object()
"""A field the document does not have (told apart from one that is null)."""


class Refused(Exception):
    """One input line that cannot become a record; the message says why.

    :param key: the line's key when it was read before the problem was found.
    """

    def __init__(self, why: str, key: str | None = None) -> None:
        super().__init__(why)
        self.key = key


@dataclass(frozen=True, slots=True)
class Line:
    """One input line checked and turned into a record.

    :param number: the line number in the input (from 1).
    :param size: bytes of body and headers, as the logs count a record.
    """

    number: int
    key: str
    tag: str
    algebra: Algebra
    partition: int
    record: OutgoingRecord
    size: int


def where(number: int, key: str | None) -> str:
    """``line 7 (key 'o-1')``: how every message names a line."""
    return f"line {number}" + ("" if key is None else f" (key {shown_key(key, _KEY_SHOWN)})")


class LineReader:
    """Turns input lines into :class:`Line` records with the headers of design §3.

    :param type_tag: / :param key_field: ``--type`` and ``--key-field`` (plain bodies).
    :param algebra: ``--algebra``, None when not given.
    :param types: the application's types by tag (``--app``), None without one.
    :param app: what ``--app`` said (for the messages).
    :param partitions: the topic's partition count; :param log: the log
        (its partitioner and its record size limit).
    """

    def __init__(
        self,
        *,
        type_tag: str | None,
        key_field: str | None,
        algebra: Algebra | None,
        types: Mapping[str, EventType[Any]] | None,
        app: str | None,
        partitions: int,
        log: Log,
    ) -> None:
        self.type_tag = type_tag
        self.key_field = key_field
        self.algebra = algebra
        self.types = types
        self.app = app
        self.partitions = partitions
        self.log = log
        self.limit = log.max_record_size
        self._plain: dict[tuple[str, Algebra], EventType[Any]] = {}

    def read(self, number: int, text: str) -> Line:
        """Check line ``number``.

        :raises Refused: saying what is wrong with it.
        """
        document = _document(text)
        if self.type_tag is not None:
            assert self.key_field is not None
            key = _key(document.get(self.key_field, _MISSING), f"field {self.key_field!r}")
            return self._line(number, self.type_tag, key, document, None, None)
        unknown = sorted(set(document) - set(ENVELOPE_FIELDS))
        raw_key = document.get("key")
        known_key = raw_key if isinstance(raw_key, str) else None
        if unknown:
            names = ", ".join(f'"{name}"' for name in unknown)
            hint = " (the partition comes from the key)" if "partition" in unknown else ""
            raise Refused(
                f"unknown envelope {plural(len(unknown), 'field')} {names}{hint}: an "
                f"envelope has {', '.join(ENVELOPE_FIELDS)} (or use --type and --key-field "
                "for plain bodies)",
                known_key,
            )
        tag = document.get("type")
        if not isinstance(tag, str) or not tag:
            raise Refused(
                'the envelope needs a non-empty string "type" '
                "(or use --type and --key-field for plain bodies)",
                known_key,
            )
        if "body" not in document:
            raise Refused('the envelope has no "body"', known_key)
        key = _key(document.get("key", _MISSING), '"key"')
        alg_raw = document.get("alg")
        given: tuple[Algebra, str] | None = None
        if alg_raw is not None:
            try:
                given = Algebra(alg_raw), '"alg"'
            except ValueError:
                raise Refused(f'unknown algebra "alg": {alg_raw!r}', key) from None
        props = document.get("props")
        if props is not None and not (
            isinstance(props, dict) and all(isinstance(v, str) for v in props.values())
        ):
            raise Refused('"props" must be an object of strings', key)
        return self._line(number, tag, key, document["body"], props, given)

    def _line(
        self,
        number: int,
        tag: str,
        key: str,
        body: object,
        props: dict[str, str] | None,
        given: tuple[Algebra, str] | None,
    ) -> Line:
        if given is None and self.algebra is not None:
            given = self.algebra, "--algebra"
        event_type = self._type(tag, key, given)
        encoded = msgspec.json.encode(body)
        if self.types is not None:
            try:
                event_type.decode(encoded)
            except Exception as exc:  # noqa: BLE001 - any codec error: the consumer could not read it
                raise Refused(
                    f"the body is not a {tag!r} as --app {self.app} declares it "
                    f"({event_type.cls.__qualname__}): {sanitize(exc, 200)}",
                    key,
                ) from None
        headers = build_headers(event_type, key, props)
        size = len(encoded) + sum(len(name) + len(value) for name, value in headers.items())
        if self.limit and size > self.limit:
            raise Refused(
                f"the record is {size} bytes (body and headers); the log takes records of "
                f"at most {self.limit} bytes (max_record_size)",
                key,
            )
        partition = self.log.partition_for(key, self.partitions)
        return Line(number, key, tag, event_type.algebra, partition, (headers, encoded), size)

    def _type(self, tag: str, key: str, given: tuple[Algebra, str] | None) -> EventType[Any]:
        """The type a line's record is written as: the application's, or a
        tag and an algebra (``build_headers`` reads only those two)."""
        if self.types is not None:
            declared = self.types.get(tag)
            if declared is None:
                known = ", ".join(repr(t) for t in sorted(self.types)[:10]) or "none"
                raise Refused(
                    f"type {tag!r} is not one of --app {self.app}'s types (its consumer "
                    f"would dead-letter the record unknown_type); its types: {known}",
                    key,
                )
            if given is not None and given[0] is not declared.algebra:
                raise Refused(
                    f"type {tag!r} is {declared.algebra.value} in --app {self.app}, but "
                    f"{given[1]} says {given[0].value} (its consumer would dead-letter the "
                    "record algebra_mismatch)",
                    key,
                )
            return declared
        if given is None:
            raise Refused(
                f'type {tag!r} has no algebra: the line has no "alg" and --algebra was '
                "not given; give one, or --app MODULE[:ATTR] whose event types declare it "
                "(a consumer dead-letters a record whose wk-alg is not its type's)",
                key,
            )
        algebra = given[0]
        found = self._plain.get((tag, algebra))
        if found is None:
            found = EventType(tag, dict, self.key_field or "key", algebra, JsonCodec(dict))
            self._plain[(tag, algebra)] = found
        return found


def _document(text: str) -> dict[str, Any]:
    try:
        document = decode_strict(text)
    except msgspec.DecodeError as exc:
        raise Refused(f"not JSON: {exc}") from None
    except UnicodeEncodeError:  # undecodable input bytes, kept as surrogates
        raise Refused("not UTF-8") from None
    except DuplicateKeyError as exc:  # which "key" or "type" was meant is unknown
        raise Refused(str(exc)) from None
    if not isinstance(document, dict):
        raise Refused(f"expected a JSON object, got {type(document).__name__}")
    return document


def _key(value: object, what: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value and not value.isspace():
        return value
    if value is _MISSING:
        raise Refused(f"no usable key: {what} is missing")
    raise Refused(f"no usable key: {what} is {msgspec.json.encode(value).decode()}")


# -- writing -------------------------------------------------------------------


@dataclass
class Progress:
    """What a produce run has written so far (read when it stops early).

    :param written: line numbers whose records the log acknowledged.
    :param in_doubt: line numbers of the append under way when it stopped.
    :param total: records to write.
    """

    total: int = 0
    written: list[int] = field(default_factory=list)
    in_doubt: list[int] = field(default_factory=list)
    started: bool = False

    def not_written(self, lines: Sequence[Line]) -> list[int]:
        done = set(self.written) | set(self.in_doubt)
        return [line.number for line in lines if line.number not in done]


def ranges(numbers: Iterable[int], most: int = 8) -> str:
    """``1-500, 503, 507-510``: sorted numbers as ranges, the first ``most``
    of them, then how many ranges more."""
    spans: list[tuple[int, int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], n)
        else:
            spans.append((n, n))
    shown = [f"{a}-{b}" if a != b else str(a) for a, b in spans[:most]]
    if len(spans) > most:
        shown.append(f"and {len(spans) - most} more {plural(len(spans) - most, 'range')}")
    return ", ".join(shown)


def rounds(lines: Sequence[Line]) -> Iterator[dict[int, list[Line]]]:
    """The lines in order, :data:`BATCH` at a time, grouped by partition."""
    for start in range(0, len(lines), BATCH):
        by_partition: dict[int, list[Line]] = {}
        for line in lines[start : start + BATCH]:
            by_partition.setdefault(line.partition, []).append(line)
        yield by_partition


async def write(log: Log, topic: str, lines: Sequence[Line], progress: Progress) -> None:
    """Append ``lines`` to ``topic``, noting in ``progress`` what is done."""
    progress.started = True
    progress.total = len(lines)
    for by_partition in rounds(lines):
        for partition, batch in by_partition.items():
            progress.in_doubt = [line.number for line in batch]
            await log.append(topic, partition, [line.record for line in batch])
            progress.written.extend(progress.in_doubt)
            progress.in_doubt = []


def stopped_report(topic: str, lines: Sequence[Line], progress: Progress, why: str) -> list[str]:
    """What a run stopped while writing says: the lines written, in doubt
    (the append under way) and not written."""
    written = len(progress.written)
    text = [f"{why}: {written} of {counted(progress.total, 'record')} written to {topic!r}"]
    if progress.written:
        text.append(f"  written: {counted(written, 'line')} ({ranges(progress.written)})")
    if progress.in_doubt:
        text.append(
            f"  in doubt, the append under way when it stopped (see 'wakuwaku tail {topic}'): "
            f"{counted(len(progress.in_doubt), 'line')} ({ranges(progress.in_doubt)})"
        )
    rest = progress.not_written(lines)
    if rest:
        text.append(f"  not written: {counted(len(rest), 'line')} ({ranges(rest)})")
    return text


# -- the command -----------------------------------------------------------------


@dataclass
class _Checked:
    lines: list[Line] = field(default_factory=list)
    refused: list[tuple[int, str | None, str]] = field(default_factory=list)
    read: int = 0


async def _check(
    log: Log, topic: str, texts: Sequence[tuple[int, str]], options: Mapping[str, Any]
) -> _Checked:
    refuse_engine_topic(topic, _ENGINE_WRITES, _REPLAY_INSTEAD)
    await refuse_configured_topic(log, topic, _ENGINE_WRITES, _REPLAY_INSTEAD)
    partitions = (await log.describe_topic(topic)).partitions
    app = options["app"]
    reader = LineReader(
        type_tag=options["type_tag"],
        key_field=options["key_field"],
        algebra=options["algebra"],
        types=await app_types(app, options["log_url"]) if app else None,
        app=app,
        partitions=partitions,
        log=log,
    )
    checked = _Checked()
    for number, text in texts:
        if not text.strip():
            continue
        checked.read += 1
        try:
            checked.lines.append(reader.read(number, text))
        except Refused as exc:
            checked.refused.append((number, exc.key, str(exc)))
    return checked


def _print_dry_run(topic: str, lines: Sequence[Line]) -> None:
    per: dict[int, int] = {}
    for line in lines:
        click.echo(
            f"line {line.number}\tkey={shown_key(line.key, _KEY_SHOWN)}\ttype={line.tag}\t"
            f"alg={line.algebra.value}\tpartition={line.partition}\tbytes={line.size}"
        )
        per[line.partition] = per.get(line.partition, 0) + 1
    parts = ", ".join(f"partition {p}: {n}" for p, n in sorted(per.items()))
    click.echo(
        f"would produce {counted(len(lines), 'record')} to {topic}"
        + (f" ({parts})" if parts else "")
        + "; nothing written (--dry-run)",
        err=True,
    )


def _print_refused(checked: _Checked) -> None:
    for number, key, why in checked.refused:
        click.echo(f"{where(number, key)}: {why}", err=True)
    click.echo(
        f"refused {len(checked.refused)} of {counted(checked.read, 'line')}; nothing "
        "written (fix them and run again)",
        err=True,
    )


def _produce(
    log_url: str,
    topic: str,
    texts: Sequence[tuple[int, str]],
    options: Mapping[str, Any],
    dry_run: bool,
) -> int:
    """Check ``texts``, then write them unless one is refused or ``dry_run``."""
    progress = Progress()
    lines: list[Line] = []
    checked = _Checked()

    # work() returns nothing: asyncio.run's SIGINT check on Python 3.11 formats
    # the repr of the main task, result included (2 s for 100,000 lines).
    async def work(log: Log) -> None:
        found = await _check(log, topic, texts, options)
        checked.lines, checked.refused, checked.read = found.lines, found.refused, found.read
        if checked.refused or dry_run:
            return
        lines.extend(checked.lines)
        await asyncio.sleep(0)  # a Ctrl-C while checking stops here, before any write
        click.echo(
            f"checked {counted(checked.read, 'line')}; writing "
            f"{counted(len(lines), 'record')} to {topic}",
            err=True,
        )
        try:
            await write(log, topic, lines, progress)
        except Exception:
            for text in stopped_report(topic, lines, progress, "failed"):
                click.echo(text, err=True)
            raise

    try:
        with_log(log_url, work)
    except (KeyboardInterrupt, asyncio.CancelledError):
        if not progress.started:
            click.echo("interrupted before writing: nothing written", err=True)
        else:
            for text in stopped_report(topic, lines, progress, "interrupted"):
                click.echo(text, err=True)
        return ExitCode.INTERRUPTED
    if checked.refused:
        _print_refused(checked)
        return ExitCode.FAILURE
    if dry_run:
        _print_dry_run(topic, checked.lines)
    else:
        click.echo(f"produced {counted(len(lines), 'record')} to {topic}", err=True)
    return ExitCode.OK


@click.command("produce")
@click.argument("topic")
@click.argument(
    "file", type=click.File("r", encoding="utf-8", errors="surrogateescape"), default="-"
)
@click.option(
    "--type",
    "type_tag",
    metavar="TAG",
    help="Lines are plain bodies of this type (needs --key-field).",
)
@click.option("--key-field", metavar="FIELD", help="The body field that holds the key.")
@click.option(
    "--app",
    metavar="MODULE[:ATTR]",
    default=None,
    help="The application whose event types give each line's algebra and check its body: "
    "a module (its @wakuwaku.event types), or MODULE:ATTR as `run` takes it (a Consumer or "
    "a factory of one) or a Registry.",
)
@click.option(
    "--algebra",
    type=click.Choice([a.value for a in Algebra]),
    default=None,
    help='The wk-alg marker of lines without "alg" (and of --type bodies) when no --app '
    "declares their type; a line with no algebra at all is refused.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check every line and print what would be written; write nothing.",
)
@log_option
def produce_command(
    topic: str,
    file: IO[str],
    type_tag: str | None,
    key_field: str | None,
    app: str | None,
    algebra: str | None,
    dry_run: bool,
    log_url: str,
) -> int:
    """Write JSON lines from FILE (default stdin) to TOPIC, one record each, all or none.

    A line is an envelope {"type": ..., "key": ..., "body": {...}, "props": {...},
    "alg": ...} or, with --type and --key-field, the body object itself. The
    algebra comes from --app's types, else "alg" or --algebra. The partition
    is the log's own for the key, as the library's producer picks it
    (murmur2 like Kafka's producers; xxHash32 on Iggy, as Iggy's message-key
    partitioning). Every line is checked before
    anything is written: a bad line is reported with its number and key, and
    then nothing is written (exit status 1). Interrupted or failing while
    writing, it says which lines were written.
    """
    if (type_tag is None) != (key_field is None):
        raise click.UsageError("--type and --key-field go together")
    if type_tag is not None and not type_tag.strip():
        raise click.UsageError("--type needs a non-empty type tag")
    options = {
        "type_tag": type_tag,
        "key_field": key_field,
        "algebra": Algebra(algebra) if algebra is not None else None,
        "app": app,
        "log_url": log_url,
    }
    try:
        # Read whole before the log is opened: Ctrl-C while a terminal is
        # typing lines stops at once, and nothing can be half-written.
        texts = list(enumerate(file, start=1))
    except KeyboardInterrupt:
        click.echo("interrupted while reading the lines: nothing written", err=True)
        return ExitCode.INTERRUPTED
    return _produce(log_url, topic, texts, options, dry_run)


def register(group: click.Group) -> None:
    """Attach ``produce`` to the ``wakuwaku`` group."""
    group.add_command(produce_command)
