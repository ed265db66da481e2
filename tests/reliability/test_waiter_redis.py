"""The result waiter against a real Redis (db 15; a private server for restarts)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from tests.faults.servers import RedisServer
from wakuwaku import ProtocolError, StepError
from wakuwaku.reliability.waiter import (
    Backoff,
    ProtocolReason,
    ReadMode,
    ResultTimeoutError,
    Verdict,
    WaitObserver,
    delete_result,
    publish_result,
    result_channel,
    result_key,
    wait_for_result,
)

from .test_waiter_unit import CONTRACT

pytestmark = pytest.mark.redis

JOB, STEP = "job-42", "render"
MODES = [ReadMode.DESTRUCTIVE, ReadMode.NON_DESTRUCTIVE]


class RecordingRedis(aioredis.Redis):
    """A real client that also records the read commands the waiter sends."""

    reads: list[str]

    async def get(self, name: Any) -> Any:
        self.reads.append("get")
        return await super().get(name)

    async def getdel(self, name: Any) -> Any:
        self.reads.append("getdel")
        return await super().getdel(name)

    async def exists(self, *names: Any) -> Any:
        self.reads.append("exists")
        return await super().exists(*names)


@pytest.fixture
async def recording(redis_client: aioredis.Redis) -> Any:
    client = RecordingRedis(connection_pool=redis_client.connection_pool)
    client.reads = []
    yield client


class Events(WaitObserver):
    def __init__(self) -> None:
        self.subscribed_event = asyncio.Event()
        self.transient_event = asyncio.Event()
        self.transients: list[BaseException] = []
        self.verdicts: list[Verdict] = []

    async def subscribed(self, job_id: str, step: str) -> None:
        self.subscribed_event.set()

    def transient(self, job_id: str, step: str, error: BaseException, delay: float) -> None:
        self.transients.append(error)
        self.transient_event.set()

    def read(self, job_id: str, step: str, verdict: Verdict) -> None:
        self.verdicts.append(verdict)


# -- the seed's table, each payload on its own, in both modes --------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("case", "raw", "expected"), CONTRACT, ids=[c[0] for c in CONTRACT])
async def test_each_payload_in_each_mode(
    recording: Any, prefix: str, mode: ReadMode, case: str, raw: bytes, expected: object
) -> None:
    key = result_key(JOB, STEP, prefix=prefix)
    await recording.set(key, raw)
    wait = wait_for_result(recording, JOB, STEP, 10, mode=mode, poll_interval=3600, prefix=prefix)
    if expected is StepError:
        with pytest.raises(StepError):
            await wait
    elif isinstance(expected, ProtocolReason):
        with pytest.raises(ProtocolError) as info:
            await wait
        assert info.value.reason == expected
    else:
        result = await wait
        assert result.content == expected
        if mode is ReadMode.NON_DESTRUCTIVE:
            assert await recording.exists(key) == 1
            assert await result.ack() is True
    # Terminal at once: one read, never a second look.
    assert recording.reads.count("get" if mode is ReadMode.NON_DESTRUCTIVE else "getdel") == 1
    remaining = await recording.exists(key)
    if mode is ReadMode.DESTRUCTIVE:
        assert remaining == 0  # consumed by the read, whatever it held
    elif expected in (StepError,) or isinstance(expected, ProtocolReason):
        assert remaining == 1  # left for the caller (delete_result) or an operator


async def test_destructive_mode_never_waits_after_a_failed_parse(
    recording: Any, prefix: str
) -> None:
    # The seed's outage: a payload that cannot be parsed arrives while waiting.
    events = Events()
    key = result_key(JOB, STEP, prefix=prefix)

    async def produce() -> None:
        await events.subscribed_event.wait()
        await recording.set(key, b"Traceback (most recent call last): ...")
        await recording.publish(result_channel(JOB, STEP, prefix=prefix), b"done")

    producer = asyncio.create_task(produce())
    with pytest.raises(ProtocolError) as info:
        await wait_for_result(
            recording,
            JOB,
            STEP,
            30,
            mode=ReadMode.DESTRUCTIVE,
            poll_interval=3600,
            prefix=prefix,
            observer=events,
        )
    await producer
    assert info.value.reason == ProtocolReason.NOT_JSON
    assert await recording.exists(key) == 0  # the payload is gone: there is nothing to wait for
    assert recording.reads.count("getdel") == 1
    assert events.verdicts[-1] is Verdict.TERMINAL


# -- nudges -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_result_published_between_subscribe_and_first_read_is_not_lost(
    recording: Any, redis_client: aioredis.Redis, prefix: str, mode: ReadMode
) -> None:
    channel = result_channel(JOB, STEP, prefix=prefix)

    class PublishRightAfterSubscribing(WaitObserver):
        async def subscribed(self, job_id: str, step: str) -> None:
            # The subscription is live on the server before any read was sent...
            numsub = dict(await redis_client.pubsub_numsub(channel))
            assert numsub[channel.encode()] == 1
            assert recording.reads == []
            # ...and the producer finishes right now, nudge included.
            receivers = await publish_result(
                redis_client, JOB, STEP, "done", content=[1, 2], prefix=prefix
            )
            assert receivers == 1

    result = await wait_for_result(
        recording,
        JOB,
        STEP,
        10,
        mode=mode,
        poll_interval=3600,
        prefix=prefix,
        observer=PublishRightAfterSubscribing(),
    )
    assert result.content == [1, 2]


@pytest.mark.parametrize("mode", MODES)
async def test_a_nudge_wakes_the_waiter_long_before_the_poll(
    redis_client: aioredis.Redis, prefix: str, mode: ReadMode
) -> None:
    first_read = asyncio.Event()

    class Observer(WaitObserver):
        def read(self, job_id: str, step: str, verdict: Verdict) -> None:
            first_read.set()

    async def produce() -> None:
        await first_read.wait()
        await publish_result(redis_client, JOB, STEP, "done", content="hi", prefix=prefix)

    producer = asyncio.create_task(produce())
    # poll_interval 3600 s: only the nudge can end this wait within the timeout.
    result = await wait_for_result(
        redis_client,
        JOB,
        STEP,
        10,
        mode=mode,
        poll_interval=3600,
        prefix=prefix,
        observer=Observer(),
    )
    await producer
    assert result.content == "hi"


async def test_polling_finds_a_result_written_without_a_nudge(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    first_read = asyncio.Event()

    class Observer(WaitObserver):
        def read(self, job_id: str, step: str, verdict: Verdict) -> None:
            first_read.set()

    async def produce() -> None:
        await first_read.wait()
        await redis_client.set(result_key(JOB, STEP, prefix=prefix), b'{"status": "done"}')

    producer = asyncio.create_task(produce())
    result = await wait_for_result(
        redis_client, JOB, STEP, 10, poll_interval=0.02, prefix=prefix, observer=Observer()
    )
    await producer
    assert result.content is None


async def test_a_step_error_published_while_waiting_is_raised_with_its_flag(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    events = Events()

    async def produce() -> None:
        await events.subscribed_event.wait()
        await publish_result(
            redis_client,
            JOB,
            STEP,
            "error",
            message="GPU out of memory at /opt/x",
            retryable=True,
            prefix=prefix,
        )

    producer = asyncio.create_task(produce())
    with pytest.raises(StepError) as info:
        await wait_for_result(
            redis_client, JOB, STEP, 10, poll_interval=3600, prefix=prefix, observer=events
        )
    await producer
    assert info.value.retryable is True
    assert info.value.message == "GPU out of memory at <path>"
    # Non-destructive: the error stays until the caller deletes it.
    assert await delete_result(redis_client, JOB, STEP, prefix=prefix) is True
    assert await delete_result(redis_client, JOB, STEP, prefix=prefix) is False


async def test_times_out_on_the_real_clock(redis_client: aioredis.Redis, prefix: str) -> None:
    with pytest.raises(ResultTimeoutError):
        await wait_for_result(redis_client, JOB, STEP, 0.2, poll_interval=0.05, prefix=prefix)


# -- publish and ack ------------------------------------------------------------------------


async def test_publish_sets_a_ttl_and_the_payload(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    await publish_result(redis_client, JOB, STEP, "done", content={"a": 1}, ttl=60, prefix=prefix)
    key = result_key(JOB, STEP, prefix=prefix)
    assert 0 < await redis_client.pttl(key) <= 60_000
    assert await redis_client.get(key) == b'{"status":"done","content":{"a":1}}'


async def test_ack_deletes_only_the_payload_that_was_read(
    redis_client: aioredis.Redis, prefix: str
) -> None:
    await publish_result(redis_client, JOB, STEP, "done", content=1, prefix=prefix)
    first = await wait_for_result(redis_client, JOB, STEP, 10, prefix=prefix)
    # The job ran again and wrote a newer result before the first reader acked.
    await publish_result(redis_client, JOB, STEP, "done", content=2, prefix=prefix)
    assert await first.ack() is False
    second = await wait_for_result(redis_client, JOB, STEP, 10, prefix=prefix)
    assert second.content == 2
    assert await second.ack() is True
    assert await redis_client.exists(result_key(JOB, STEP, prefix=prefix)) == 0


async def test_decode_responses_clients_work_too(prefix: str) -> None:
    from tests.conftest import REDIS_URL

    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        await publish_result(client, JOB, STEP, "done", content="é", prefix=prefix)
        result = await wait_for_result(client, JOB, STEP, 10, prefix=prefix)
        assert result.content == "é"
        assert await result.ack() is True
    finally:
        await client.aclose()


# -- a Redis restart in the middle of a wait -----------------------------------------------


# A wait across a Redis restart hung about one run in eight under load: a
# cancelled read returned normally inside redis-py, so the poller never
# ended; the wait now stops its loops itself (test_waiter_unit.py).
@pytest.mark.parametrize("mode", MODES)
async def test_a_redis_restart_is_transient_then_the_result_arrives(
    own_redis: RedisServer, mode: ReadMode
) -> None:
    def client() -> aioredis.Redis:
        return aioredis.Redis(
            host="127.0.0.1",
            port=own_redis.port,
            socket_timeout=2,
            socket_connect_timeout=1,
            retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 1),
        )

    waiter_client, producer_client = client(), client()
    events = Events()
    try:
        waiting = asyncio.create_task(
            wait_for_result(
                waiter_client,
                JOB,
                STEP,
                60,
                mode=mode,
                poll_interval=0.05,
                backoff=Backoff(0.02, 0.2),
                observer=events,
            )
        )
        await events.subscribed_event.wait()
        own_redis.kill()
        await events.transient_event.wait()
        assert not waiting.done()
        own_redis.start()  # empty: nothing was saved
        await publish_result(producer_client, JOB, STEP, "done", content="after restart")
        result = await asyncio.wait_for(waiting, 90)  # fails here, not at pytest's timeout
        assert result.content == "after restart"
        assert events.transients, "the restart must have been seen as transient"
    finally:
        await waiter_client.aclose()
        await producer_client.aclose()
