"""Appends whose answer was lost, and where to look for their records.

Iggy keeps no append token and drops no duplicate message, and a send that
timed out may still be carried out (a frozen server stored it once it went
on): sending such an append again stored its records twice. So the records
of an append named by a token carry Iggy message ids made from it
(:func:`batch_ids`), and this part remembers, per log instance:

- per partition, an offset at or below where this instance's next send
  lands: one past its last confirmed send there, or the partition's end,
  asked once before the first send named by a token;
- per append named by a token whose send raised
  :class:`~wakuwaku.LogUnavailableError` or was cancelled: that offset, its
  record count and its first message's id, for :data:`TTL` seconds, at most
  :data:`LIMIT` of them.

:meth:`Unanswered.find` looks for such an append's first message from that
offset on (from the partition's start when its end is now below it: the
topic was made again) and remembers how far it looked, so a look that
failed part way, or found nothing, goes on from there next time.

May call: nothing of the log; it is handed the log's poll and end offsets.
Called by :mod:`._messages`.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..._errors import ConfigError

__all__ = ("LIMIT", "TTL", "Unanswered", "batch_ids")

TTL = 300.0
"""Seconds an unanswered append is remembered (as :class:`AppendTokens` keeps a token)."""
LIMIT = 10_000
"""Unanswered appends remembered at most (the oldest are forgotten first)."""
_PAGE = 100  # records per poll of a look (their bodies come too: up to 64 MB each)

Poll = Callable[[str, int, int, int], Awaitable[list[Any]]]
"""``poll(topic, partition, offset, count)``: Iggy messages from ``offset`` on."""
Ends = Callable[[str], Awaitable[dict[int, int]]]
"""``ends(topic)``: per partition, the offset one past its last record."""


def batch_ids(token: str, count: int) -> list[int]:
    """The Iggy message ids of an append named by ``token``: a 96-bit hash of
    the token above each record's index (from 1), never 0 (which lets the
    server choose)."""
    digest = hashlib.blake2b(token.encode("ascii"), digest_size=12).digest()
    base = int.from_bytes(digest, "big") << 32
    return [base + n for n in range(1, count + 1)]


@dataclass
class _Lost:
    since: int  # its records are at this offset or later
    count: int
    first_id: int
    at: float  # time.monotonic() when its send failed


class Unanswered:
    """The appends of one log instance whose answer was lost, per (topic, partition, token)."""

    def __init__(self, poll: Poll, ends: Ends) -> None:
        self._poll = poll
        self._ends_of = ends
        self._ends: dict[tuple[str, int], int] = {}
        # Oldest first; an OrderedDict finds its oldest entry in O(1), where a
        # dict's next(iter()) scans the slots earlier deletions emptied.
        self._lost: OrderedDict[tuple[str, int, str], _Lost] = OrderedDict()

    def forget(self, topic: str) -> None:
        """``topic`` was deleted: its offsets start again."""
        for key in [k for k in self._ends if k[0] == topic]:
            del self._ends[key]
        for lost in [k for k in self._lost if k[0] == topic]:
            del self._lost[lost]

    async def since(self, topic: str, partition: int, token: str) -> int:
        """An offset at or below where the next send of ``token``'s append lands."""
        lost = self._live(topic, partition, token)
        known = self._ends.get((topic, partition))
        if known is None:
            known = (await self._ends_of(topic)).get(partition, 0)
            self._ends[(topic, partition)] = known
        return known if lost is None else max(known, lost.since)

    def failed(
        self, topic: str, partition: int, token: str, since: int, count: int, first_id: int
    ) -> None:
        """The send of ``token``'s append raised or was cancelled: it may be stored."""
        now = time.monotonic()
        self._lost.pop((topic, partition, token), None)
        self._lost[(topic, partition, token)] = _Lost(since, count, first_id, now)
        while self._lost:
            oldest_key = next(iter(self._lost))
            if len(self._lost) <= LIMIT and now - self._lost[oldest_key].at <= TTL:
                break
            del self._lost[oldest_key]

    def stored(self, topic: str, partition: int, token: str | None, end: int) -> None:
        """A send to ``partition`` was confirmed; its records end before ``end``."""
        if token is not None:
            self._lost.pop((topic, partition, token), None)
        self._ends[(topic, partition)] = max(end, self._ends.get((topic, partition), 0))

    async def find(self, topic: str, partition: int, token: str, count: int) -> list[int] | None:
        """The offsets of ``token``'s unanswered append when its records are
        stored; None when it is not unanswered or they are not (yet) there.

        :raises ConfigError: when the token was used for another number of
            records (a token names one append).
        :raises LogUnavailableError: / :raises LogError: from the polls; how
            far the look got is kept.
        """
        lost = self._live(topic, partition, token)
        if lost is None:
            return None
        if lost.count != count:
            raise ConfigError(
                f"append token {token!r} on {topic}/{partition} was used for an append of "
                f"{lost.count} records, now {count}: a token names one append"
            )
        if (await self._ends_of(topic)).get(partition, 0) < lost.since:
            lost.since = 0  # the partition was made again: its offsets started over
        while page := await self._poll(topic, partition, lost.since, _PAGE):
            for message in page:
                if message.id() == lost.first_id:
                    start = int(message.offset())
                    self.stored(topic, partition, token, start + count)
                    return list(range(start, start + count))
            lost.since = int(page[-1].offset()) + 1
        return None

    def _live(self, topic: str, partition: int, token: str) -> _Lost | None:
        lost = self._lost.get((topic, partition, token))
        if lost is not None and time.monotonic() - lost.at > TTL:
            del self._lost[(topic, partition, token)]
            return None
        return lost
