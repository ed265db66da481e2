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

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException

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
