"""The SQLite log's read path: pages, the records read ahead of them, the poll loop.

Owns, on the event loop side, what one log keeps between reads: per
partition the records read ahead of the last page and the offset after the
last record a read returned. A read there (a poll loop reading on) or a
partition's first read fetches up to 2 500 records (at most 1 MiB) in one
worker call and keeps what its page does not take; any other read fetches
only its page (:meth:`~wakuwaku.logs.sqlite.SQLiteLog.read` says why).
While a read finds nothing and its ``wait`` has not run out, the file is
polled every 25 ms, so appends of other processes are seen.

May call: :mod:`._sqlite_file` (the worker thread, the topic ids),
:mod:`._sqlite_records` (selecting and decoding rows), and the
worker-thread fetch the log hands to each read (``SQLiteLog._read``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from .._records import Record
from ._sqlite_file import SQLiteFile
from ._sqlite_records import fetch, select

__all__ = ("Fetch", "Reads")

_POLL_INTERVAL = 0.025
# A read fetches up to this many records in one worker call; what the caller
# did not ask for is kept for its next read (measured: bigger fetches lose
# more to CPU cache misses than they save in thread hops).
_READ_BATCH = 2_500
_READ_AHEAD_BYTES = 1 << 20

Fetch = Callable[[str, int, int, int, bool], tuple[list[Record], list[Record]]]
"""The worker-thread half of a read, :meth:`Reads.fetch_page`: ``(topic, partition,
offset, max_records, read_ahead) -> (page, records read ahead)``."""


class Reads:
    """The read path of one SQLite log.

    :param file: the log's file.
    """

    def __init__(self, file: SQLiteFile) -> None:
        self._file = file
        # Records read ahead per (topic, partition).
        self._ahead: dict[tuple[str, int], list[Record]] = {}
        # Per partition, the offset after the last record a read returned: a
        # read there reads on, and only such a read (or a partition's first)
        # fetches records ahead.
        self._read_next: dict[tuple[str, int], int] = {}

    async def read(
        self,
        fetch_page: Fetch,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        wait: float,
    ) -> list[Record]:
        """Up to ``max_records`` records with offsets ``>= offset``; see
        :meth:`SQLiteLog.read <wakuwaku.logs.sqlite.SQLiteLog.read>`.

        :param fetch_page: :meth:`fetch_page`, or what stands for it (the log
            hands its ``_read``), run on the worker thread.
        :param wait: how long to poll while nothing is there (seconds).
        """
        key = (topic, partition)
        sequential = self._read_next.get(key, offset) == offset
        head = self._read_ahead(topic, partition, offset, max_records)
        if len(head) == max_records:
            self._read_next[key] = head[-1].offset + 1
            return head
        if head:  # the rest of the page follows the records read ahead
            offset = head[-1].offset + 1
            max_records -= len(head)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            found, ahead = await self._file.run(
                fetch_page, topic, partition, offset, max_records, sequential
            )
            if ahead:
                self._ahead[key] = ahead
            if head or found:
                page = head + found if head else found
                self._read_next[key] = page[-1].offset + 1
                return page
            if max_records < 1:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return found
            await asyncio.sleep(min(_POLL_INTERVAL, remaining))

    def _read_ahead(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> list[Record]:
        """The start of the page from the records read ahead: all of it, part
        of it (the caller reads the rest from the file), or nothing."""
        self._file.check_open()
        key = (topic, partition)
        ahead = self._ahead.pop(key, None)
        if ahead is None or max_records < 1:
            return []
        index = offset - ahead[0].offset  # offsets are dense: index = distance
        if index < 0 or index >= len(ahead):
            return []
        end = index + max_records
        if end < len(ahead):
            self._ahead[key] = ahead[end:]
        return ahead[index:end]

    def fetch_page(
        self, topic: str, partition: int, offset: int, max_records: int, read_ahead: bool
    ) -> tuple[list[Record], list[Record]]:
        """On the worker thread: the page, and when ``read_ahead`` and the page
        is full, the records behind it (up to 2 500 in all, at most 1 MiB).

        :raises TopicGone: when nothing is there because the topic was deleted.
        """
        db = self._file.db()
        topic_id = self._file.partition(db, topic, partition)
        if max_records < 1:
            return [], []
        extra = max(0, _READ_BATCH - max_records) if read_ahead else 0
        cursor = select(db, topic_id, partition, offset, max_records + extra)
        try:
            found = fetch(cursor, max_records)
            ahead: list[Record] = []
            if extra and len(found) == max_records:
                size = sum(len(r.body) for r in found) // len(found) + 64
                ahead = fetch(cursor, min(extra, _READ_AHEAD_BYTES // size))
        finally:
            cursor.close()  # ends the read snapshot at once
        if not found:
            self._file.check_alive(db, topic_id)
        return found, ahead

    def forget(self, topic: str) -> None:
        """Drop records read ahead of ``topic`` (retention may have deleted them)."""
        for key in [key for key in self._ahead if key[0] == topic]:
            self._ahead.pop(key, None)

    def clear(self) -> None:
        """Drop every record read ahead (the log is closing)."""
        self._ahead.clear()
