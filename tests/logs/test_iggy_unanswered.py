"""Where the Iggy log looks for an append whose answer was lost (no server:
a fake partition of messages with ids)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from wakuwaku import ConfigError, LogUnavailableError
from wakuwaku.logs.iggy import _unanswered
from wakuwaku.logs.iggy._unanswered import Unanswered, batch_ids


@dataclass
class _Message:
    ident: int
    at: int

    def id(self) -> int:
        return self.ident

    def offset(self) -> int:
        return self.at


class _Partition:
    """One partition ``("t", 0)``: its messages' ids, the polls asked, and a
    poll that fails once when ``fail_at`` is reached."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.polls: list[int] = []
        self.fail_at: int | None = None

    def add(self, ids: list[int]) -> None:
        self.ids.extend(ids)

    async def poll(self, topic: str, partition: int, offset: int, count: int) -> list[_Message]:
        self.polls.append(offset)
        if self.fail_at is not None and offset >= self.fail_at:
            self.fail_at = None
            raise LogUnavailableError("no answer")
        return [_Message(i, n) for n, i in enumerate(self.ids)][offset : offset + count]

    async def ends(self, topic: str) -> dict[int, int]:
        return {0: len(self.ids)}


async def test_a_lost_append_is_found_from_where_the_partition_ended_before_it() -> None:
    part = _Partition()
    lost = Unanswered(part.poll, part.ends)
    part.add([1, 2, 3])
    since = await lost.since("t", 0, "tok")
    assert since == 3
    ids = batch_ids("tok", 2)
    part.add([7] * 250 + ids)  # another writer's records, then the lost send's
    lost.failed("t", 0, "tok", since, 2, ids[0])
    assert await lost.find("t", 0, "tok", 2) == [253, 254]
    assert part.polls == [3, 103, 203]  # from the bound on, 100 records a poll
    assert await lost.find("t", 0, "tok", 2) is None  # found once: forgotten
    assert await lost.since("t", 0, "other") == 255  # past the found records


async def test_a_look_goes_on_from_where_it_stopped_and_a_miss_is_kept() -> None:
    part = _Partition()
    lost = Unanswered(part.poll, part.ends)
    ids = batch_ids("tok", 1)
    part.add([7] * 250)
    lost.failed("t", 0, "tok", 0, 1, ids[0])
    part.fail_at = 200
    with pytest.raises(LogUnavailableError):
        await lost.find("t", 0, "tok", 1)
    assert await lost.find("t", 0, "tok", 1) is None  # not stored (yet)
    assert part.polls == [0, 100, 200, 200, 250]
    part.add(ids)  # a frozen server stored it late
    part.polls.clear()
    assert await lost.find("t", 0, "tok", 1) == [250]
    assert part.polls == [250]


async def test_a_partition_made_again_is_looked_at_from_its_start() -> None:
    part = _Partition()
    lost = Unanswered(part.poll, part.ends)
    ids = batch_ids("tok", 1)
    lost.failed("t", 0, "tok", 500, 1, ids[0])
    part.add([7, *ids])  # the topic was deleted and made again: end 2 < 500
    assert await lost.find("t", 0, "tok", 1) == [1]


async def test_a_token_sent_again_with_other_records_is_refused() -> None:
    part = _Partition()
    lost = Unanswered(part.poll, part.ends)
    lost.failed("t", 0, "tok", 0, 2, batch_ids("tok", 2)[0])
    with pytest.raises(ConfigError, match="append of 2 records, now 3"):
        await lost.find("t", 0, "tok", 3)


async def test_lost_appends_are_kept_for_a_while_and_only_so_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    part = _Partition()
    lost = Unanswered(part.poll, part.ends)
    now = [1000.0]
    monkeypatch.setattr(_unanswered, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(_unanswered, "LIMIT", 3)
    for n in range(4):
        lost.failed("t", 0, f"tok{n}", 0, 1, batch_ids(f"tok{n}", 1)[0])
    part.add([batch_ids(f"tok{n}", 1)[0] for n in range(4)])
    assert await lost.find("t", 0, "tok0", 1) is None  # the oldest went past the limit
    assert await lost.find("t", 0, "tok1", 1) == [1]
    now[0] += _unanswered.TTL + 1.0
    assert await lost.find("t", 0, "tok2", 1) is None  # past the TTL
    lost.forget("t")
    assert await lost.find("t", 0, "tok3", 1) is None  # its topic was deleted


def test_batch_ids_are_distinct_and_never_zero() -> None:
    ids = batch_ids("a", 3) + batch_ids("b", 3)
    assert len(set(ids)) == 6 and all(0 < i < 2**128 for i in ids)
