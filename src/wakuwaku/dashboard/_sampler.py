"""What the dashboard shows, read from the log on a timer (one reader for every page).

Each round, for every (topic, group) shown, the :class:`Sampler` takes the
group's :func:`~wakuwaku.admin.consumer_status` (lag, quarantined keys, dead
letters per reason), the partitions' owners (``partition_owners``, where the
log has it), the pauses in force (:func:`~wakuwaku.admin.pauses`, read from
the group's control topic) and the purged dead letters (the ledger), and
reads the dead-letter topic from where the last round stopped into a small
index (partition, offset, time, reason, key, type) that the dead-letter list
filters without reading the topic again. Committed and end offsets are kept
for the last ``history`` seconds: events/s is the growth of the committed
offsets between two rounds (what the group consumed), per partition and in
total.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import WakuwakuError, sanitize
from .._control import CONTROL_PREFIX, Pause
from .._records import H_ERROR
from ..admin import (
    MISSING_REASON,
    Status,
    committed_groups,
    consumer_status,
    dead_letter_groups,
    derived_topic_owner,
    parse_dead_letter,
    pauses,
    purged_offsets,
)
from ..engine import ConsumerConfig, GroupTopics, read_topic_names, topic_names_topic
from ..logs import Lease, Log

logger = logging.getLogger("wakuwaku.dashboard")

QUARANTINE_ERRORS = 200
"""First-failure texts read per round, for the earliest quarantined keys."""
KEY_LIMIT = 1000
"""Index entries keep at most this many characters of a key (a key may be 1 MiB)."""


@dataclass(frozen=True, slots=True)
class Target:
    """One (main topic, consumer group) the dashboard shows; ``topic`` unqualified."""

    topic: str
    group: str


@dataclass(frozen=True, slots=True)
class LetterEntry:
    """One dead letter as the index keeps it (its headers and body stay in the log).

    :param key: the key, cut after :data:`KEY_LIMIT` characters (``key_cut``
        says so); None when the dead letter has no usable key.
    :param timestamp: when the log stored it (seconds since the epoch).
    """

    partition: int
    offset: int
    timestamp: float
    reason: str
    key: str | None
    key_cut: bool
    type_tag: str | None


@dataclass
class _Index:
    """A group's dead-letter topic as read so far."""

    topic: str = ""
    next_offsets: dict[int, int] = field(default_factory=dict)
    entries: list[LetterEntry] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Sample:
    """One round's offsets of one target: wall time and, per partition,
    ``(committed or None, end offset)``."""

    at: float
    offsets: dict[int, tuple[int | None, int]]


@dataclass
class View:
    """The latest picture of one target, what the pages render.

    :param status: the group's status (None until the first round worked).
    :param owners: partition -> lease; None when the log cannot show owners.
    :param error: why the last round failed (sanitized), None when it worked.
    :param samples: the rounds of the last ``history`` seconds, oldest first.
    :param pauses: the pauses in force on the topic for the group, oldest first.
    :param purged: per dead-letter partition, the offsets of purged dead
        letters (the index keeps them; the pages leave them out or mark them).
    """

    target: Target
    status: Status | None = None
    owners: dict[int, Lease] | None = None
    error: str | None = None
    updated_at: float = 0.0
    samples: deque[Sample] = field(default_factory=deque)
    index: _Index = field(default_factory=_Index)
    errors: dict[tuple[int, int], str] = field(default_factory=dict)
    pauses: list[Pause] = field(default_factory=list)
    purged: dict[int, frozenset[int]] = field(default_factory=dict)

    def is_purged(self, entry: LetterEntry) -> bool:
        """True when ``dlq purge`` (or the dashboard) purged this dead letter."""
        return entry.offset in self.purged.get(entry.partition, ())

    def partition_pause(self, partition: int) -> Pause | None:
        """The pause that stops ``partition`` (its topic's or its own), or None."""
        for pause in self.pauses:
            if pause.key is None and pause.partition in (None, partition):
                return pause
        return None

    def key_pause(self, key: str) -> Pause | None:
        """The pause of ``key``, or None."""
        for pause in self.pauses:
            if pause.key == key:
                return pause
        return None

    def first_error(self, partition: int, retry_offset: int | None) -> str | None:
        """The sanitized error of a quarantined key's first pending work record
        (read for the :data:`QUARANTINE_ERRORS` earliest keys), None when unknown."""
        if retry_offset is None:
            return None
        return self.errors.get((partition, retry_offset))

    def rates(self) -> list[tuple[float, float]]:
        """``(wall time, events/s)`` consumed by the group between consecutive rounds."""
        out = []
        for before, after in zip(self.samples, list(self.samples)[1:], strict=False):
            span = after.at - before.at
            if span > 0:
                out.append((after.at, _consumed(before, after) / span))
        return out

    def partition_rate(self, partition: int) -> float | None:
        """Events/s consumed on ``partition`` over the history kept; None with
        fewer than two rounds."""
        if len(self.samples) < 2:
            return None
        first, last = self.samples[0], self.samples[-1]
        span = last.at - first.at
        if span <= 0:
            return None
        return _moved(first.offsets.get(partition), last.offsets.get(partition)) / span

    def stalled_for(self, partition: int) -> float | None:
        """Seconds ``partition``'s committed offset has not moved while it had
        records to read (lag > 0), over the rounds kept; None when it moved
        in the last round, has no lag, or fewer than two rounds were taken.

        What a stalled consumer looks like from outside (design §7): the
        engine's watchdog restarts a worker after its ``stall_timeout``; a
        partition shown stalled for longer has no live worker at all (its
        consumer is down, frozen or stuck).
        """
        samples = list(self.samples)
        if len(samples) < 2:
            return None
        last = samples[-1].offsets.get(partition)
        if last is None or last[0] is None or last[1] - last[0] <= 0:
            return None
        since = samples[-1].at
        for sample in reversed(samples[:-1]):
            offsets = sample.offsets.get(partition)
            if offsets is None or offsets[0] != last[0] or offsets[1] - (offsets[0] or 0) <= 0:
                break
            since = sample.at
        held = samples[-1].at - since
        return held if held > 0 else None

    @property
    def letters(self) -> Sequence[LetterEntry]:
        """Every dead letter read so far, by partition then offset."""
        return self.index.entries


def _moved(before: tuple[int | None, int] | None, after: tuple[int | None, int] | None) -> int:
    if before is None or after is None or before[0] is None or after[0] is None:
        return 0
    return max(0, after[0] - before[0])


def _consumed(before: Sample, after: Sample) -> int:
    return sum(_moved(before.offsets.get(p), off) for p, off in after.offsets.items())


class Sampler:
    """Reads what the pages show, every ``interval`` seconds, into :class:`View` s.

    :param log: the open log.
    :param group: show only this group (None: every group found per topic).
    :param namespace: the consumers' namespace prefix, if any.
    :param interval: seconds between rounds.
    :param history: seconds of offsets kept for events/s.
    """

    def __init__(
        self,
        log: Log,
        *,
        group: str | None = None,
        namespace: str = "",
        interval: float = 5.0,
        history: float = 900.0,
    ) -> None:
        self.log = log
        self.group = group
        self.namespace = namespace
        self.interval = interval
        self.history = history
        self.views: dict[Target, View] = {}
        self.error: str | None = None
        self.rounds = 0
        """Rounds completed (a failed listing of topics counts as one)."""
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        # The configured names consumers noted, read once per round.
        self._noted: dict[tuple[str, str], GroupTopics] = {}

    async def targets(self) -> list[Target]:
        """The (topic, group) pairs to show: every main topic (not a retry,
        dead-letter or ledger topic, derived or configured, nor the
        topic-names topic or a group's control topic) with every group that
        has a dead-letter topic for it or a committed offset on it, or only
        ``group``."""
        prefix = f"{self.namespace}." if self.namespace else ""
        self._noted = noted = await read_topic_names(self.log, self.namespace)
        engine_made = {topic_names_topic(self.namespace)}
        for names in noted.values():
            engine_made.update((names.retry, names.dead_letter, names.replay_ledger))
        found: list[Target] = []
        for info in await self.log.list_topics():
            if prefix and not info.name.startswith(prefix):
                continue
            topic = info.name[len(prefix) :]
            if (
                derived_topic_owner(topic) is not None
                or info.name in engine_made
                or topic.startswith(CONTROL_PREFIX)
            ):
                continue
            if self.group is not None:
                groups = {self.group}
            else:
                groups = set(await dead_letter_groups(self.log, topic, self.namespace))
                groups.update(await committed_groups(self.log, info.name) or ())
            found.extend(Target(topic, g) for g in sorted(groups))
        return found

    async def refresh(self) -> None:
        """One round over every target (one round at a time)."""
        async with self._lock:
            try:
                targets = await self.targets()
            except (WakuwakuError, OSError) as exc:
                self.error = sanitize(f"{type(exc).__name__}: {exc}", 500)
                logger.warning("dashboard: cannot list topics", extra={"error": self.error})
                self.rounds += 1
                return
            self.error = None
            views: dict[Target, View] = {}
            for target in targets:
                views[target] = self.views.get(target) or View(target)
                await self._refresh_view(views[target])
            self.views = views  # pages see whole rounds only
            self.rounds += 1

    async def _refresh_view(self, view: View) -> None:
        target = view.target
        try:
            status = await consumer_status(
                self.log, target.topic, target.group, namespace=self.namespace
            )
            owners = await self._owners(status.topic, target.group)
            await self._read_letters(view)
            view.errors = await self._first_errors(view.target, status, view.errors)
            in_force = await pauses(self.log, target.group, self.namespace)
            purged = await purged_offsets(
                self.log, target.topic, group=target.group, namespace=self.namespace
            )
        except (WakuwakuError, OSError) as exc:
            view.error = sanitize(f"{type(exc).__name__}: {exc}", 500)
            logger.warning(
                "dashboard: cannot read status",
                extra={"topic": target.topic, "group": target.group, "error": view.error},
            )
            return
        now = time.time()
        view.status, view.owners, view.error, view.updated_at = status, owners, None, now
        view.pauses = [p for p in in_force if p.topic == status.topic]
        view.purged = purged
        view.samples.append(
            Sample(now, {p.partition: (p.committed, p.end_offset) for p in status.partitions})
        )
        while view.samples and view.samples[0].at < now - self.history:
            view.samples.popleft()

    def names(self, target: Target) -> GroupTopics:
        """The (qualified) topics of ``target``'s group: the configured names its
        consumer noted (as of the last round), else the derived ones."""
        config = ConsumerConfig(topic=target.topic, group=target.group, namespace=self.namespace)
        main = config.topics[0]
        return self._noted.get((main, target.group)) or config.group_topics(main)

    def dead_letter_topic(self, target: Target) -> str:
        """The (qualified) dead-letter topic of ``target``'s group."""
        return self.names(target).dead_letter

    async def _first_errors(
        self, target: Target, status: Status, known: dict[tuple[int, int], str]
    ) -> dict[tuple[int, int], str]:
        retry = self.names(target).retry
        found: dict[tuple[int, int], str] = {}
        for q in status.quarantined[:QUARANTINE_ERRORS]:
            if q.retry_offset is None:
                continue
            where = (q.partition, q.retry_offset)
            if where not in known:
                page = await self.log.read(retry, q.partition, q.retry_offset, 1)
                raw = page[0].headers.get(H_ERROR) if page else None
                known[where] = sanitize(bytes(raw), 500) if raw is not None else ""
            found[where] = known[where]
        return found

    async def _owners(self, topic: str, group: str) -> dict[int, Lease] | None:
        return await self.log.partition_owners(group, topic)

    async def _read_letters(self, view: View) -> None:
        names = self.names(view.target)
        dlq = names.dead_letter
        if dlq not in {t.name for t in await self.log.list_topics()}:
            view.index = _Index(topic=dlq)
            return
        if view.index.topic != dlq:  # the group's dead-letter topic was configured anew
            view.index = _Index(topic=dlq)
        starts = await self.log.start_offsets(dlq)
        ends = await self.log.end_offsets(dlq)
        index = view.index
        if any(ends.get(p, 0) < index.next_offsets.get(p, 0) for p in ends):
            index = view.index = _Index(topic=dlq)  # the topic was deleted and made again
        for p, end in sorted(ends.items()):
            offset = max(index.next_offsets.get(p, 0), starts.get(p, 0))
            while offset < end:
                page = await self.log.read(dlq, p, offset, min(500, end - offset))
                if not page:
                    break
                for record in page:
                    letter = parse_dead_letter(p, record)
                    if not letter.belongs_to(names.topic, names.group):
                        continue  # another group's, in a shared dead-letter topic
                    key = letter.key
                    cut = key is not None and len(key) > KEY_LIMIT
                    index.entries.append(
                        LetterEntry(
                            p,
                            letter.offset,
                            letter.timestamp,
                            letter.reason or MISSING_REASON,
                            key[:KEY_LIMIT] if key is not None and cut else key,
                            cut,
                            letter.type_tag,
                        )
                    )
                offset = page[-1].offset + 1
            index.next_offsets[p] = offset
        index.entries.sort(key=lambda e: (e.partition, e.offset))

    async def ready(self) -> None:
        """Run the first round when none ran yet."""
        if self.rounds == 0:
            await self.refresh()

    def start(self) -> None:
        """Start refreshing in the background (on the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the background rounds."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # a dashboard keeps showing the last picture
                logger.exception("dashboard: refresh failed")
            await asyncio.sleep(self.interval)
