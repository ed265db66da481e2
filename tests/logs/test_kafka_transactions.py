"""How the Kafka log ends a transaction whose commit got no answer.

``commit_transaction`` that times out (the broker went away under it) leaves
the outcome open: the coordinator may have logged the commit. The engine
retries a failed store as it was, so a log that wrote it again gave a record
two dead letters (seen in the fault suite: a broker restarted twice, the
doomed key's first record dead-lettered twice). The log keeps the producer,
resumes the commit before the next store, and returns the first store's
offsets when that store is sent again and had committed. librdkafka's part
is played by a scripted producer: which answer a real broker gives at which
moment cannot be chosen from outside.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException

from wakuwaku import LogUnavailableError
from wakuwaku.logs.kafka import KafkaLog

TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True)
ABORT = KafkaError(KafkaError._STATE, "abort needed", txn_requires_abort=True)
FATAL = KafkaError(KafkaError._FENCED, "fenced", fatal=True)


class ScriptedProducer:
    """A transactional producer whose commit answers follow a script.

    ``commits`` holds one entry per ``commit_transaction`` call: None
    commits, a KafkaError raises it. Produced records get the next offsets;
    ``committed`` lists the transactions that committed (their bodies).
    """

    def __init__(self, commits: list[KafkaError | None]) -> None:
        self.commits = commits
        self.next_offset = 0
        self.open: list[bytes] = []
        self.committed: list[list[bytes]] = []
        self.aborted = 0
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")
        self.open = []

    def produce(self, topic: str, value: bytes, key: Any, partition: int, **kw: Any) -> None:
        offset, self.next_offset = self.next_offset, self.next_offset + 1
        self.open.append(value)
        kw["on_delivery"](None, SimpleNamespace(offset=lambda: offset))

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.calls.append("offsets")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        answer = self.commits.pop(0)
        if answer is not None:
            raise KafkaException(answer)
        self.committed.append(self.open)
        self.open = []

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        self.aborted += 1
        self.open = []


@pytest.fixture
def log() -> Iterator[KafkaLog]:
    yield KafkaLog("127.0.0.1:9", timeout=1.0)  # never connects: the producer is scripted


def member_with(log: KafkaLog, producer: ScriptedProducer) -> Any:
    return cast(Any, SimpleNamespace(txn=producer, unsettled=None, metadata=None, log=log))


def batch(*bodies: bytes) -> list[tuple[str, int, Any]]:
    return [("wk-dlq.g.orders", 0, [({"wk-key": b"k"}, body) for body in bodies])]


COMMITS = [("orders", 0, 7)]


def test_a_store_sent_again_after_its_commit_went_through_is_not_written_twice(
    log: KafkaLog,
) -> None:
    producer = ScriptedProducer([TIMED_OUT, None])  # no answer, then: it did commit
    member = member_with(log, producer)
    with pytest.raises(KafkaException):
        log._transaction(member, batch(b"dead"), [], COMMITS)
    assert member.unsettled is not None and producer.aborted == 0
    assert log._transaction(member, batch(b"dead"), [], COMMITS) == [[0]]
    assert producer.committed == [[b"dead"]]
    assert producer.calls == ["begin", "commit", "commit"]  # no second transaction
    assert member.unsettled is None and member.txn is producer


def test_a_commit_that_did_not_go_through_is_aborted_and_the_store_written_once(
    log: KafkaLog,
) -> None:
    producer = ScriptedProducer([TIMED_OUT, ABORT, None])
    member = member_with(log, producer)
    with pytest.raises(KafkaException):
        log._transaction(member, batch(b"dead"), [], COMMITS)
    assert log._transaction(member, batch(b"dead"), [], COMMITS) == [[1]]
    assert producer.committed == [[b"dead"]] and producer.aborted == 1


def test_a_commit_still_unanswered_fails_the_next_store_without_writing(log: KafkaLog) -> None:
    producer = ScriptedProducer([TIMED_OUT, TIMED_OUT, None])
    member = member_with(log, producer)
    for _ in range(2):
        with pytest.raises(KafkaException):
            log._transaction(member, batch(b"dead"), [], COMMITS)
    assert producer.calls == ["begin", "commit", "commit"]
    assert log._transaction(member, batch(b"dead"), [], COMMITS) == [[0]]
    assert producer.committed == [[b"dead"]]


def test_another_store_after_a_settled_commit_is_written(log: KafkaLog) -> None:
    producer = ScriptedProducer([TIMED_OUT, None, None])
    member = member_with(log, producer)
    with pytest.raises(KafkaException):
        log._transaction(member, batch(b"first"), [], COMMITS)
    assert log._transaction(member, batch(b"second"), [], COMMITS) == [[1]]
    assert producer.committed == [[b"first"], [b"second"]]


def test_a_fatal_commit_error_drops_the_producer(log: KafkaLog) -> None:
    producer = ScriptedProducer([FATAL])
    member = member_with(log, producer)
    with pytest.raises(KafkaException):
        log._transaction(member, batch(b"dead"), [], COMMITS)
    assert member.txn is None and member.unsettled is None and producer.aborted == 0


# librdkafka's send_offsets_to_transaction can block past its timeout while
# the group coordinator is down (librdkafka issue 5456): the store waited for
# ever, and the test process could not exit (the default executor's shutdown
# joined the wedged thread). A store waits a bounded time; a wedged
# transaction is abandoned, or, when it wedged in its commit, settled once
# the call returns.


class WedgingProducer(ScriptedProducer):
    """A scripted producer whose ``wedge`` call blocks until ``release`` is set."""

    def __init__(self, commits: list[KafkaError | None], wedge: str) -> None:
        super().__init__(commits)
        self.wedge = wedge
        self.release = threading.Event()
        self.entered = threading.Event()

    def _block(self, call: str) -> None:
        if call == self.wedge:
            self.entered.set()
            self.release.wait(30)

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self._block("offsets")
        super().send_offsets_to_transaction(*args)
        if self.wedge == "offsets":
            raise KafkaException(FENCED)

    def commit_transaction(self, timeout: float) -> None:
        self._block("commit")
        self.wedge = ""  # only the first commit wedges
        super().commit_transaction(timeout)


FENCED = KafkaError(KafkaError._FENCED, "fenced by a newer producer", fatal=True)


@pytest.fixture
def quick(log: KafkaLog, monkeypatch: pytest.MonkeyPatch) -> list[ScriptedProducer]:
    """Producers the log makes when it needs a new one (a wedged one was dropped)."""
    made: list[ScriptedProducer] = []

    def new(member: Any) -> Any:
        if member.txn is None:
            member.txn = ScriptedProducer([None] * 5)
            made.append(member.txn)
        return member.txn

    monkeypatch.setattr(log, "timeout", 0.05)  # a store then waits at most 1.2 s
    monkeypatch.setattr(log, "_transactional", new)
    return made


def wedged_member(log: KafkaLog, producer: ScriptedProducer) -> Any:
    member = member_with(log, producer)
    member.member, member.group = "m1", "g"
    return member


async def test_a_transaction_wedged_before_its_commit_is_abandoned_for_a_new_producer(
    log: KafkaLog, quick: list[ScriptedProducer]
) -> None:
    wedged = WedgingProducer([None], wedge="offsets")
    member = wedged_member(log, wedged)
    offsets = [object()]
    with pytest.raises(LogUnavailableError, match=r"did not answer within 1\.2 s"):
        await log._transact(member, batch(b"dead"), offsets, COMMITS)
    assert member.txn is None and member.unsettled is None
    assert await log._transact(member, batch(b"dead"), offsets, COMMITS) == [[0]]
    assert quick[0].committed == [[b"dead"]] and wedged.committed == []
    wedged.release.set()  # the wedged call fails at last (fenced): the new producer stays
    await asyncio.to_thread(wait_until, lambda: wedged.calls[-1:] == ["offsets"])
    assert member.txn is quick[0]


async def test_a_transaction_wedged_in_its_commit_is_settled_when_the_call_returns(
    log: KafkaLog, quick: list[ScriptedProducer]
) -> None:
    wedged = WedgingProducer([None, None], wedge="commit")
    member = wedged_member(log, wedged)
    with pytest.raises(LogUnavailableError):
        await log._transact(member, batch(b"dead"), [], COMMITS)
    assert member.unsettled is not None and member.txn is wedged
    with pytest.raises(LogUnavailableError, match="has not returned"):  # outcome unknown yet
        await log._transact(member, batch(b"dead"), [], COMMITS)
    wedged.release.set()  # the commit went through after all
    await asyncio.to_thread(wait_until, lambda: wedged.committed == [[b"dead"]])
    assert await log._transact(member, batch(b"dead"), [], COMMITS) == [[0]]
    assert wedged.committed == [[b"dead"]] and quick == []  # written once, same producer


def wait_until(done: Callable[[], bool], limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not done():
        assert time.monotonic() < deadline, "the wedged call did not return"
        time.sleep(0.005)
