"""The log contract on :class:`wakuwaku.logs.kafka.KafkaLog`, and what only Kafka has."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

import wakuwaku as wk
from wakuwaku import ConfigError, LogError, LogUnavailableError, open_log, partition_for
from wakuwaku.engine import Consumer as WkConsumer
from wakuwaku.engine import ConsumerConfig, Handler
from wakuwaku.logs import BatchWrite, Log, OutgoingRecord
from wakuwaku.logs._base import check_record, check_records
from wakuwaku.logs.kafka import _FENCED_CODES, HEADER_ROOM, PASSWORD_ENV, KafkaLog

from ..conftest import KAFKA_BOOTSTRAP
from ..kafka_support import drop_prefix, fresh_prefix, kafka_log
from .contract import LogContract, rec

pytestmark = pytest.mark.kafka


class TestKafkaLog(LogContract):
    multiprocess = True
    lease_expiry = False
    nul_in_header_names = False
    chosen_partitions = False

    @pytest.fixture
    async def log(self) -> AsyncIterator[Log]:
        prefix = fresh_prefix()
        log = kafka_log(prefix)
        try:
            yield log
        finally:
            await log.close()
            await asyncio.to_thread(drop_prefix, prefix)


@pytest.fixture
async def log() -> AsyncIterator[KafkaLog]:
    prefix = fresh_prefix()
    log = kafka_log(prefix)
    try:
        yield log
    finally:
        await log.close()
        await asyncio.to_thread(drop_prefix, prefix)


def test_url_options_and_secrets_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log("kafka://alice:s3cret@127.0.0.1:9092,127.0.0.1:9094?prefix=p.&timeout=3")
    assert isinstance(log, KafkaLog)
    assert log.hosts == ["127.0.0.1:9092", "127.0.0.1:9094"]
    assert log.url == "kafka://127.0.0.1:9092,127.0.0.1:9094?prefix=p.&timeout=3"
    assert "s3cret" not in repr(log) and log.timeout == 3.0
    assert log._common["sasl.username"] == "alice"
    assert log._common["security.protocol"] == "SASL_PLAINTEXT"
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    monkeypatch.setenv("WAKUWAKU_KAFKA_USERNAME", "bob")
    other = KafkaLog.from_url("kafka://127.0.0.1:9092?security_protocol=sasl_ssl")
    assert other._common["sasl.password"] == "from-env"
    assert other._common["security.protocol"] == "SASL_SSL"
    with pytest.raises(ConfigError, match="unknown option 'fsync'"):
        open_log("kafka://127.0.0.1:9092?fsync=0")
    with pytest.raises(ConfigError, match="host:port"):
        open_log("kafka://")


async def test_topic_names_kafka_cannot_hold_are_refused(log: KafkaLog) -> None:
    with pytest.raises(ConfigError, match=r"\[A-Za-z0-9._-\]"):
        await log.create_topic("orders:eu", 1)


async def test_partition_owners_come_from_the_group_coordinator(log: KafkaLog) -> None:
    await log.create_topic("orders", 3)
    assert await log.partition_owners("g", "orders") == {}
    leases = [await log.acquire_partition("g", "orders", p, "a", ttl=60.0) for p in range(3)]
    assert all(lease is not None for lease in leases)
    found = await log.partition_owners("g", "orders")
    assert sorted(found) == [0, 1, 2]
    assert {(o.member, o.generation) for o in found.values()} == {
        ("a", lease.generation) for lease in leases if lease is not None
    }
    for lease in leases:
        assert lease is not None
        await log.release_partition(lease)
    assert await log.partition_owners("g", "orders") == {}


async def test_a_header_name_with_nul_is_refused_naming_it(log: KafkaLog) -> None:
    await log.create_topic("orders", 1)
    with pytest.raises(ConfigError, match="NUL"):
        await log.append("orders", 0, [rec(**{"a\x00b": b"1"})])
    assert await log.end_offsets("orders") == {0: 0}


async def test_a_record_over_the_topic_limit_is_refused_naming_it(log: KafkaLog) -> None:
    await log.create_topic("orders", 1)
    await log.create_topic("wk-retry.g.orders", 1)
    limit = await log.max_message_bytes_of("orders")
    assert await log.max_message_bytes_of("wk-retry.g.orders") == limit + HEADER_ROOM
    with pytest.raises(ConfigError, match=f"max.message.bytes is {limit}"):
        await log.append("orders", 0, [rec(b"x" * limit)])
    assert await log.end_offsets("orders") == {0: 0}
    # A record at the main topic's limit still fits its retry topic with more headers.
    big = rec(b"x" * (limit - 1024))
    assert await log.append("orders", 0, [big]) == [0]
    retry = ({**big[0], "wk-error": b"e" * 4000, "wk-src": b"orders/0/0"}, big[1])
    assert await log.append("wk-retry.g.orders", 0, [retry]) == [0]


async def test_a_configured_retry_topic_gets_header_room_whatever_its_name(
    log: KafkaLog,
) -> None:
    """design §6: names can be configured, so the room comes from ``derived_from``,
    not from the name's shape."""
    await log.create_topic("orders", 1)
    await log.create_topic("orders-retry", 1, derived_from="orders")
    await log.create_topic("orders-copy", 1)
    limit = await log.max_message_bytes_of("orders")
    assert await log.max_message_bytes_of("orders-retry") == limit + HEADER_ROOM
    assert await log.max_message_bytes_of("orders-copy") == limit


async def test_a_plain_kafka_producers_record_is_handled(log: KafkaLog) -> None:
    await log.create_topic("orders", 3)
    producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP, "partitioner": "murmur2_random"})
    headers: list[tuple[str, str | bytes | None]] = [
        ("wk-v", b"1"),
        ("wk-type", b"kafka.tick"),
        ("wk-alg", b"plain"),
    ]
    for n in range(6):
        key = b"o%d" % (n % 2)
        producer.produce(
            log._name("orders"), b'{"key":"%s","n":%d}' % (key, n), key, headers=headers
        )
    producer.flush(10)
    seen: list[tuple[str, int]] = []

    async def handle(run: Sequence[_Tick]) -> None:
        seen.extend((e.key, e.n) for e in run)

    config = ConsumerConfig(topic="orders", group="interop", poll_interval=0.01)
    stats = await WkConsumer(config, [Handler(_Tick, handle)], log).drain()
    assert stats.handled == 6
    for name in ("o0", "o1"):
        assert [n for k, n in seen if k == name] == [n for n in range(6) if f"o{n % 2}" == name]
    assert await log.committed("interop", "orders", partition_for("o0", 3)) is not None


class ReportingProducer:
    """Stands in for the log's idempotent producer: takes the records, and
    :meth:`deliver` serves their delivery reports from another thread (as the
    poll thread does), in the order given, offsets 100, 101... in produce order."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes, Any, int, Any]] = []

    def produce(self, topic: str, value: bytes, key: Any, partition: int, **kw: Any) -> None:
        self.produced.append((topic, value, key, partition, kw["on_delivery"]))

    def deliver(self, order: Sequence[int], failed: int | None = None) -> None:
        def serve() -> None:
            for i in order:
                report = self.produced[i][4]
                if i == failed:
                    report(KafkaError(KafkaError.INVALID_RECORD, "refused"), None)
                else:
                    report(None, SimpleNamespace(offset=lambda i=i: 100 + i))

        thread = threading.Thread(target=serve)
        thread.start()
        thread.join()


async def _scripted_append(
    order: Sequence[int], failed: int | None = None
) -> tuple[ReportingProducer, asyncio.Task[list[int]]]:
    log = KafkaLog("127.0.0.1:9", timeout=1.0)  # never connects: the producer is scripted
    producer = ReportingProducer()
    log._appender._producer = producer
    records = [({"wk-key": b"k", "h": bytes([i])}, bytes([i])) for i in range(len(order))]
    task = asyncio.create_task(log._appender.append("orders", 2, records))
    await asyncio.sleep(0)  # the append produces every record before its first wait
    assert len(producer.produced) == len(order)
    producer.deliver(order, failed)
    return producer, task


async def test_an_appends_offsets_follow_its_records_whatever_order_reports_come_in() -> None:
    # One delivery callback for all of an append's records: the offsets are
    # matched to the records by their order (the idempotent producer writes a
    # partition's records in produce order), not by the order of the reports.
    producer, task = await _scripted_append([3, 0, 4, 1, 2])
    assert await task == [100, 101, 102, 103, 104]
    assert [(p[1], p[2], p[3]) for p in producer.produced] == [
        (bytes([i]), b"k", 2) for i in range(5)
    ]
    assert len({id(p[4]) for p in producer.produced}) == 1  # one callback, not one per record


async def test_a_failed_delivery_fails_the_append_naming_topic_and_partition() -> None:
    _, task = await _scripted_append([0, 1, 2, 3], failed=2)
    with pytest.raises(LogError, match="append to orders/2"):
        await task


def test_an_appends_records_are_checked_as_one_by_one() -> None:
    # The Kafka append checks its records in one pass (check_records); what
    # it gives, and refuses, is what check_record gives for each.
    plain: Any = [({"wk-key": b"k", "h": b"v"}, b"body"), ({"wk-key": b"j"}, b"")]
    assert check_records(plain) == plain
    assert check_records(iter(plain)) == plain  # read once, even from an iterator
    as_lists: Any = [list(r) for r in plain]
    assert check_records(as_lists) == plain
    mixed: Any = [({"wk-key": bytearray(b"k")}, memoryview(b"body")), plain[0]]
    checked = check_records(mixed)
    assert checked == [(check_record(h, b), b) for h, b in mixed]
    assert type(checked[0][0]["wk-key"]) is bytes
    bad_value: Any = [plain[0], ({"wk-key": "k"}, b"")]
    with pytest.raises(ConfigError, match="must map str to bytes"):
        check_records(bad_value)
    bad_body: Any = [plain[0], ({"wk-key": b"k"}, "body")]
    with pytest.raises(ConfigError, match="body must be bytes"):
        check_records(bad_body)


async def test_our_keys_land_where_the_java_partitioner_puts_them(log: KafkaLog) -> None:
    # The Java client's DefaultPartitioner / BuiltInPartitioner for a keyed
    # record is toPositive(murmur2(key)) % partitions; these are its answers
    # (Kafka's own test vectors for murmur2) and librdkafka's murmur2_random.
    await log.create_topic("orders", 6)
    producer = wk.Producer(log, "orders")
    keys = [f"key-{n}" for n in range(40)]
    published = await producer.publish_many([_Tick(k) for k in keys])
    plain = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP, "partitioner": "murmur2_random"})
    landed: dict[bytes, int] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None
        landed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    for key in keys:
        plain.produce(log._name("orders"), b"{}", key.encode(), on_delivery=delivered)
    plain.flush(10)
    for item in published:
        assert item.partition == landed[item.key.encode()] == partition_for(item.key, 6)
    assert partition_for(b"21", 2**31 - 1) == (-973932308 & 0x7FFFFFFF) % (2**31 - 1)


@wk.event("kafka.tick", key="key")
class _Tick(msgspec.Struct, frozen=True):
    key: str
    n: int = 0


async def test_a_zombies_transaction_is_fenced_by_the_broker(log: KafkaLog) -> None:
    """KIP-447: a member that left the group (a zombie that still believes it
    owns its partition) has its retry write and its offsets refused by the
    broker: the transaction aborts and nothing becomes visible."""
    await log.create_topic("orders", 1)
    await log.create_topic("wk-retry.g.orders", 1)
    old = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
    assert old is not None
    zombie = log._members[("g", "a")]
    stale = zombie.metadata
    await log.release_partition(old)  # a leaves the group ...
    other = kafka_log(log.prefix)
    try:
        new = await other.acquire_partition("g", "orders", 0, "b", ttl=60.0)
        assert new is not None  # ... and b owns the partition in a newer generation
        zombie.metadata = stale  # ... while a still holds its old group metadata
        batches: list[tuple[str, int, Sequence[OutgoingRecord]]] = [
            ("wk-retry.g.orders", 0, [rec(b"late")])
        ]
        offsets = [TopicPartition(log._name("orders"), 0, 5)]
        with pytest.raises(KafkaException) as caught:
            await asyncio.to_thread(log._transaction, zombie, batches, offsets, [("orders", 0, 5)])
        assert caught.value.args[0].code() in _FENCED_CODES
        assert await other.read("wk-retry.g.orders", 0, 0) == []
        assert await other.committed("g", "orders", 0) is None
        # The owner's transaction goes through.
        write = BatchWrite(
            "g", appends=[("wk-retry.g.orders", 0, [rec(b"owner")])], commits=[("orders", 0, 5)]
        )
        await other.store(write, fence=new)
        assert [r.body for r in await other.read("wk-retry.g.orders", 0, 0)] == [b"owner"]
        assert await other.committed("g", "orders", 0) == 5
    finally:
        await other.close()
        zombie.close()


async def test_an_offset_in_an_open_transaction_is_never_read_as_no_offset(
    log: KafkaLog,
) -> None:
    """Offsets sent in a transaction are unstable (``UNSTABLE_OFFSET_COMMIT``)
    until its commit markers are written. ``committed`` waits for them, never
    answers "no offset" meanwhile (a restarting worker would start
    the partition from its first record), and names the group when a
    transaction stays open past the log's timeout."""
    await log.create_topic("orders", 1)
    await log.commit("g", "orders", 0, 3)
    producer = Producer({"bootstrap.servers": KAFKA_BOOTSTRAP, "transactional.id": log.prefix})
    group = Consumer({"bootstrap.servers": KAFKA_BOOTSTRAP, "group.id": log._name("g")})
    try:
        await asyncio.to_thread(producer.init_transactions, 10)
        producer.begin_transaction()
        offsets = [TopicPartition(log._name("orders"), 0, 9)]
        metadata = group.consumer_group_metadata()
        await asyncio.to_thread(producer.send_offsets_to_transaction, offsets, metadata, 10)
        impatient = KafkaLog(KAFKA_BOOTSTRAP, prefix=log.prefix, timeout=1.0)
        try:
            with pytest.raises(LogUnavailableError, match=r"group 'g'.*UNSTABLE_OFFSET_COMMIT"):
                await impatient.committed("g", "orders", 0)
        finally:
            await impatient.close()
        await asyncio.to_thread(producer.commit_transaction, 10)
        assert await log.committed("g", "orders", 0) == 9
    finally:
        group.close()


async def test_a_members_second_topic_is_assigned_even_when_it_subscribes_while_connecting(
    log: KafkaLog,
) -> None:
    """A member's subscription grows one topic at a time (the engine acquires
    the planes partitions, then the flights ones). When it grows while
    librdkafka has no usable broker connection yet (early in a member's life:
    about one member in twenty here), librdkafka marks the new topic "not
    available" and rejoined only at its next periodic metadata refresh, 300 s
    by default: the flights demo stalled for 300 s that way. The members
    refresh every few seconds, so the second acquire gets its lease within
    the log's timeout, for every fresh member."""
    await log.create_topic("planes", 2)
    await log.create_topic("flights", 2)
    for n in range(30):
        member = kafka_log(log.prefix)
        try:
            assert await member.acquire_partition(f"g{n}", "planes", 0, "m", ttl=60.0)
            assert await member.acquire_partition(f"g{n}", "flights", 0, "m", ttl=60.0), n
        finally:
            await member.close()


async def test_a_group_is_deleted_only_once_its_members_are_gone(log: KafkaLog) -> None:
    """``topics``/``group delete`` and the demo's ``--reset`` delete a group:
    Kafka refuses while it has members. A member of another process still
    running is named as the reason, nothing is deleted; one that just left
    (the coordinator may list it a moment longer) is waited for."""
    await log.create_topic("t", 1)
    await log.commit("g", "t", 0, 3)
    other = kafka_log(log.prefix)
    impatient = KafkaLog(KAFKA_BOOTSTRAP, prefix=log.prefix, timeout=1.0)
    try:
        lease = await other.acquire_partition("g", "t", 0, "m", ttl=60.0)
        assert lease is not None
        with pytest.raises(LogError, match=r"group 'g' still has members.*stop its consumers"):
            await impatient.delete_group("g")
        assert await log.committed("g", "t", 0) == 3
        await other.release_partition(lease)  # m leaves the group
        assert await log.delete_group("g") == 1
        assert await log.committed("g", "t", 0) is None
    finally:
        await impatient.close()
        await other.close()


async def test_the_engines_state_topics_are_kept_forever_by_the_broker(log: KafkaLog) -> None:
    """A pause in the control topic holds until resumed: the broker's default
    retention (7 days) must not forget it. Main topics keep the broker's default."""
    from confluent_kafka import admin as kafka_admin

    for topic in ("wk-control.g", "wk-topic-names", "orders"):
        await log.create_topic(topic, 1)
    admin = kafka_admin.AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP})
    resource_type, config_resource = kafka_admin.ResourceType, kafka_admin.ConfigResource  # type: ignore[attr-defined]

    def retention(topic: str) -> tuple[str, str]:
        resource = config_resource(resource_type.TOPIC, log.prefix + topic)
        configs = admin.describe_configs([resource])[resource].result(timeout=30)
        return configs["retention.ms"].value, configs["retention.bytes"].value

    assert await asyncio.to_thread(retention, "wk-control.g") == ("-1", "-1")
    assert await asyncio.to_thread(retention, "wk-topic-names") == ("-1", "-1")
    assert (await asyncio.to_thread(retention, "orders"))[0] != "-1"


class _LeaderlessAtFirst:
    """A consumer whose broker knows no leader for the partition ``failures``
    times (a partition just created on a loaded broker), then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked = 0

    def consume(self, count: int, timeout: float) -> list[object]:
        return []

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(p.topic, p.partition, -1001) for p in partitions]

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float, cached: bool
    ) -> tuple[int, int]:
        self.asked += 1
        if self.asked <= self.failures:
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return 0, 0


async def test_a_read_asks_again_while_a_partitions_leader_is_not_known(log: KafkaLog) -> None:
    """A read right after create_topic failed once beside two CPU burners:
    the broker answered the high watermark question "not leader for
    partition". Only that question is asked again, within the call's bound;
    past it the error stays (the consumer pauses on it, a Transient)."""
    fetch = log._readers._fetch
    settling = _LeaderlessAtFirst(failures=2)
    found = await asyncio.to_thread(fetch, settling, "t", 0, 0, 10, 0.0, threading.Event())
    assert found == ([], 0) and settling.asked == 3
    never = _LeaderlessAtFirst(failures=10**9)
    with pytest.raises(KafkaException):
        await asyncio.to_thread(fetch, never, "t", 0, 0, 10, 0.0, threading.Event())
    assert never.asked > 3
