"""The result waiter without Redis: the payload contract, the one classifier,
and schedules on a fake clock against a scripted stand-in client."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import pytest
from redis import exceptions as redis_errors

from wakuwaku import ConfigError, ProtocolError, StepError
from wakuwaku.reliability.waiter import (
    Backoff,
    ProtocolReason,
    ReadMode,
    Result,
    ResultTimeoutError,
    Verdict,
    WaitObserver,
    parse_result,
    publish_result,
    read_verdict,
    result_channel,
    result_key,
    wait_for_result,
)
from wakuwaku.testing import FakeClock

JOB, STEP = "job-1", "ocr"

# The seed's table, plus the cases the allow-list adds.
CONTRACT: list[tuple[str, bytes, object]] = [
    ("done", b'{"status": "done", "content": {"pages": 3}}', {"pages": 3}),
    ("done_without_content", b'{"status": "done"}', None),
    ("error", b'{"status": "error", "message": "out of memory"}', StepError),
    ("empty_object", b"{}", ProtocolReason.NO_STATUS),
    ("status_number", b'{"status": 123}', ProtocolReason.STATUS_NOT_STRING),
    ("status_null", b'{"status": null}', ProtocolReason.STATUS_NOT_STRING),
    ("status_failed", b'{"status": "failed"}', ProtocolReason.UNKNOWN_STATUS),
    ("status_DONE", b'{"status": "DONE"}', ProtocolReason.UNKNOWN_STATUS),
    ("not_json", b"<html>502 Bad Gateway</html>", ProtocolReason.NOT_JSON),
    ("truncated_json", b'{"status": "do', ProtocolReason.NOT_JSON),
    ("invalid_utf8", b'{"status": "\xff"}', ProtocolReason.NOT_JSON),
    ("json_array", b'["done"]', ProtocolReason.NOT_OBJECT),
    # The last duplicate won, so an error read as done.
    ("duplicate_status", b'{"status":"error","status":"done"}', ProtocolReason.DUPLICATE_KEY),
    (
        "duplicate_in_content",
        b'{"status": "done", "content": {"a": 1, "a": 2}}',
        ProtocolReason.DUPLICATE_KEY,
    ),
    (
        "duplicate_in_list",
        b'{"status": "done", "content": [{"b": 1, "b": 1}]}',
        ProtocolReason.DUPLICATE_KEY,
    ),
    (
        "same_key_in_two_objects",
        b'{"status": "done", "content": [{"b": 1}, {"b": 2}]}',
        [{"b": 1}, {"b": 2}],
    ),
    ("json_string", b'"done"', ProtocolReason.NOT_OBJECT),
    ("message_number", b'{"status": "error", "message": 7}', ProtocolReason.MESSAGE_NOT_STRING),
    (
        "retryable_string",
        b'{"status": "error", "retryable": "yes"}',
        ProtocolReason.RETRYABLE_NOT_BOOL,
    ),
]


def check(raw: bytes, expected: object) -> None:
    if expected is StepError:
        with pytest.raises(StepError):
            parse_result(raw, job_id=JOB, step=STEP)
    elif isinstance(expected, ProtocolReason):
        with pytest.raises(ProtocolError) as info:
            parse_result(raw, job_id=JOB, step=STEP)
        assert info.value.reason == expected
    else:
        assert parse_result(raw, job_id=JOB, step=STEP) == expected


@pytest.mark.parametrize(("case", "raw", "expected"), CONTRACT, ids=[c[0] for c in CONTRACT])
def test_payload_contract(case: str, raw: bytes, expected: object) -> None:
    check(raw, expected)


def test_step_error_carries_a_sanitized_message_and_the_retryable_flag() -> None:
    raw = b'{"status": "error", "message": "disk /srv/x full\\n\\u202e see https://a:b@c/d",'
    raw += b' "retryable": true}'
    with pytest.raises(StepError) as info:
        parse_result(raw, job_id=JOB, step=STEP)
    assert info.value.message == "disk <path> full see <url>"
    assert info.value.retryable is True
    assert (info.value.job_id, info.value.step) == (JOB, STEP)


def test_step_error_without_flag_leaves_retry_undecided() -> None:
    with pytest.raises(StepError) as info:
        parse_result(b'{"status": "error"}', job_id=JOB, step=STEP)
    assert info.value.retryable is None
    assert info.value.message == "(no message)"


def test_a_protocol_error_never_contains_the_raw_payload() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_result(b"SECRET-TOKEN-123 not json", job_id=JOB, step=STEP)
    assert "SECRET" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize(
    ("outcome", "verdict"),
    [
        (None, Verdict.NOT_READY),
        (StepError(JOB, STEP, "x"), Verdict.TERMINAL),
        (ProtocolError(JOB, STEP, "not_json"), Verdict.TERMINAL),
        (redis_errors.ConnectionError("reset"), Verdict.TRANSIENT),
        (redis_errors.BusyLoadingError("LOADING Redis is loading"), Verdict.TRANSIENT),
        (redis_errors.TimeoutError("timed out"), Verdict.TRANSIENT),
        (redis_errors.ReadOnlyError("READONLY"), Verdict.TRANSIENT),
        (redis_errors.TryAgainError("TRYAGAIN"), Verdict.TRANSIENT),
        (TimeoutError(), Verdict.TRANSIENT),
        (ConnectionRefusedError(), Verdict.TRANSIENT),
        (OSError("network unreachable"), Verdict.TRANSIENT),
        (redis_errors.AuthenticationError("WRONGPASS"), Verdict.TERMINAL),
        (redis_errors.AuthorizationError("NOPERM"), Verdict.TERMINAL),
        (redis_errors.ResponseError("WRONGTYPE"), Verdict.TERMINAL),
        (ValueError("a bug"), Verdict.TERMINAL),
    ],
    ids=repr,
)
def test_classify(outcome: BaseException | None, verdict: Verdict) -> None:
    assert read_verdict(outcome) is verdict


def test_a_result_is_terminal() -> None:
    result = Result(JOB, STEP, None, ReadMode.DESTRUCTIVE, None, "k", b"")  # type: ignore[arg-type]
    assert read_verdict(result) is Verdict.TERMINAL


def test_backoff_doubles_up_to_its_maximum() -> None:
    backoff = Backoff(initial=0.05, maximum=0.3)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.05, 0.1, 0.2, 0.3, 0.3, 0.3]
    with pytest.raises(ConfigError):
        Backoff(initial=0)
    with pytest.raises(ConfigError):
        Backoff(initial=1, maximum=0.5)


def test_names() -> None:
    assert result_key("j:1", "ocr") == "wk:result:j:1:ocr"
    assert result_channel("j:1", "ocr", prefix="app") == "app:nudge:j:1:ocr"
    for job, step in [("", "s"), ("j", ""), ("j", "a:b")]:
        with pytest.raises(ConfigError):
            result_key(job, step)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"status": "failed"},
        {"status": "done", "message": "x"},
        {"status": "done", "retryable": True},
        {"status": "error", "content": 1},
        {"status": "done", "ttl": 0},
    ],
    ids=repr,
)
async def test_publish_result_refuses_a_broken_contract(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        await publish_result(None, JOB, "s", **kwargs)  # type: ignore[arg-type]


async def test_wait_refuses_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        await wait_for_result(None, JOB, STEP, 0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        await wait_for_result(None, JOB, STEP, 1, poll_interval=0)  # type: ignore[arg-type]


# -- a scripted stand-in for redis.asyncio.Redis ------------------------------------

Step = Any  # bytes | None | int | BaseException


class StubPubSub:
    def __init__(self, owner: StubRedis) -> None:
        self.owner = owner
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    async def subscribe(self, channel: str) -> None:
        if self.owner.subscribe_hangs:
            await asyncio.Event().wait()
        if self.owner.subscribe_errors:
            raise self.owner.subscribe_errors.popleft()
        self.owner.subscriptions += 1
        self.queue.put_nowait({"type": "subscribe", "channel": channel, "data": 1})
        self.owner.pubsubs.append(self)

    async def get_message(
        self,
        timeout: float | None = 0.0,  # noqa: ASYNC109 - mirrors redis-py's signature
    ) -> dict[str, Any] | None:
        message = await self.queue.get()
        if isinstance(message, BaseException):
            raise message
        return message  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        self.owner.closed += 1


class StubRedis:
    """Answers each command from its own script; records (command, fake time)."""

    def __init__(self, clock: FakeClock, **scripts: list[Step]) -> None:
        self.clock = clock
        self.scripts = {name: deque(steps) for name, steps in scripts.items()}
        self.calls: list[tuple[str, float]] = []
        self.subscribe_errors: deque[BaseException] = deque()
        self.subscribe_hangs = False
        self.subscriptions = 0
        self.closed = 0
        self.pubsubs: list[StubPubSub] = []

    def _answer(self, command: str) -> Any:
        self.calls.append((command, self.clock.monotonic()))
        script = self.scripts.get(command)
        step = script.popleft() if script and len(script) > 1 else (script[0] if script else None)
        if isinstance(step, BaseException):
            raise step
        return step

    async def get(self, key: str) -> Any:
        return self._answer("get")

    async def exists(self, key: str) -> Any:
        return self._answer("exists")

    async def getdel(self, key: str) -> Any:
        return self._answer("getdel")

    def pubsub(self) -> StubPubSub:
        return StubPubSub(self)

    def nudge(self) -> None:
        for pubsub in self.pubsubs:
            pubsub.queue.put_nowait({"type": "message", "data": b"done"})


DONE = b'{"status": "done", "content": "ok"}'


def times(stub: StubRedis, command: str) -> list[float]:
    return [round(t, 6) for c, t in stub.calls if c == command]


async def test_polls_on_the_ticker_when_no_nudge_comes() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[None, None, None, DONE])
    result = await wait_for_result(stub, JOB, STEP, 60, poll_interval=1.5, clock=clock)  # type: ignore[arg-type]
    assert result.content == "ok"
    assert times(stub, "get") == [0.0, 1.5, 3.0, 4.5]


async def test_transient_errors_back_off_exponentially_then_the_result_comes() -> None:
    clock = FakeClock()
    down = redis_errors.ConnectionError("Connection refused")
    stub = StubRedis(clock, get=[down, down, down, down, DONE])
    seen: list[float] = []

    class Observer(WaitObserver):
        def transient(self, job_id: str, step: str, error: BaseException, delay: float) -> None:
            seen.append(delay)

    result = await wait_for_result(
        stub,  # type: ignore[arg-type]
        JOB,
        STEP,
        60,
        poll_interval=5,
        backoff=Backoff(0.1, 0.4),
        clock=clock,
        observer=Observer(),
    )
    assert result.content == "ok"
    assert seen == [0.1, 0.2, 0.4, 0.4]
    assert times(stub, "get") == [0.0, 0.1, 0.3, 0.7, 1.1]


async def test_loading_is_transient() -> None:
    clock = FakeClock()
    loading = redis_errors.BusyLoadingError("LOADING Redis is loading the dataset in memory")
    stub = StubRedis(clock, get=[loading, DONE])
    result = await wait_for_result(stub, JOB, STEP, 60, clock=clock)  # type: ignore[arg-type]
    assert result.content == "ok"


async def test_a_nudge_triggers_a_read_before_the_tick() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[None, DONE])

    class Observer(WaitObserver):
        def read(self, job_id: str, step: str, verdict: Verdict) -> None:
            if verdict is Verdict.NOT_READY:
                asyncio.get_running_loop().call_soon(stub.nudge)

    result = await wait_for_result(
        stub,  # type: ignore[arg-type]
        JOB,
        STEP,
        60,
        poll_interval=100,
        clock=clock,
        observer=Observer(),
    )
    assert result.content == "ok"
    assert times(stub, "get") == [0.0, 0.0]


async def test_times_out_with_a_stdlib_timeout_error() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[None])
    with pytest.raises(TimeoutError) as info:
        await wait_for_result(stub, JOB, STEP, 10, poll_interval=3, clock=clock)  # type: ignore[arg-type]
    assert isinstance(info.value, ResultTimeoutError)
    assert info.value.last_error is None
    assert clock.monotonic() == 10
    assert times(stub, "get") == [0, 3, 6, 9]
    assert stub.closed == 1  # the subscription is closed on the way out


async def test_a_timeout_while_the_store_is_down_says_why() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[redis_errors.ConnectionError("refused to 10.1.2.3:6379")])
    with pytest.raises(ResultTimeoutError) as info:
        await wait_for_result(stub, JOB, STEP, 5, clock=clock)  # type: ignore[arg-type]
    assert info.value.last_error == "ConnectionError: refused to 10.1.2.3:6379"


async def test_an_unknown_error_is_raised_at_once_not_waited_on() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[redis_errors.ResponseError("WRONGTYPE Operation against a key")])
    with pytest.raises(redis_errors.ResponseError):
        await wait_for_result(stub, JOB, STEP, 60, clock=clock)  # type: ignore[arg-type]
    assert clock.monotonic() == 0


async def test_subscribing_comes_before_the_first_read() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[DONE])
    order: list[str] = []

    class Observer(WaitObserver):
        async def subscribed(self, job_id: str, step: str) -> None:
            order.append(f"subscribed, reads so far: {len(stub.calls)}")

    await wait_for_result(stub, JOB, STEP, 60, clock=clock, observer=Observer())  # type: ignore[arg-type]
    assert order == ["subscribed, reads so far: 0"]


async def test_pubsub_down_does_not_stop_polling() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[None, None, DONE])
    stub.subscribe_errors.extend([redis_errors.ConnectionError("down")] * 100)
    result = await wait_for_result(stub, JOB, STEP, 60, poll_interval=1, clock=clock)  # type: ignore[arg-type]
    assert result.content == "ok"


async def test_a_terminal_subscription_error_ends_the_wait() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[None])
    stub.subscribe_errors.append(redis_errors.AuthenticationError("WRONGPASS"))
    with pytest.raises(redis_errors.AuthenticationError):
        await wait_for_result(stub, JOB, STEP, 60, clock=clock)  # type: ignore[arg-type]


async def test_a_lost_subscription_is_made_again_and_triggers_a_read() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[None, DONE])

    class Observer(WaitObserver):
        def read(self, job_id: str, step: str, verdict: Verdict) -> None:
            if len(stub.calls) == 1:  # after the first read, the connection drops
                stub.pubsubs[0].queue.put_nowait(redis_errors.ConnectionError("reset by peer"))

    result = await wait_for_result(
        stub,  # type: ignore[arg-type]
        JOB,
        STEP,
        60,
        poll_interval=1000,
        clock=clock,
        observer=Observer(),
    )
    assert result.content == "ok"
    assert stub.subscriptions == 2
    assert stub.closed >= 1
    # Read at 0, then right after subscribing again (one 0.05 s backoff), not at the tick.
    assert times(stub, "get") == [0.0, 0.05]


# -- destructive reads ----------------------------------------------------------------


async def test_destructive_read_claims_only_a_key_it_saw() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, exists=[0, 0, 1], getdel=[DONE])
    result = await wait_for_result(
        stub,  # type: ignore[arg-type]
        JOB,
        STEP,
        60,
        mode=ReadMode.DESTRUCTIVE,
        poll_interval=1,
        clock=clock,
    )
    assert result.content == "ok"
    assert [c for c, _ in stub.calls] == ["exists", "exists", "exists", "getdel"]
    assert await result.ack() is False  # nothing left to delete


async def test_destructive_read_of_a_bad_payload_fails_at_once() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, exists=[1], getdel=[b"not json at all"])
    with pytest.raises(ProtocolError) as info:
        await wait_for_result(
            stub,  # type: ignore[arg-type]
            JOB,
            STEP,
            60,
            mode=ReadMode.DESTRUCTIVE,
            clock=clock,
        )
    assert info.value.reason == ProtocolReason.NOT_JSON
    assert clock.monotonic() == 0
    assert [c for c, _ in stub.calls] == ["exists", "getdel"]


async def test_destructive_read_that_came_back_empty_is_a_lost_result() -> None:
    # A key we saw, then GETDEL found nothing: another reader (or a retried
    # GETDEL whose first reply was lost) consumed it. Waiting would never end.
    clock = FakeClock()
    stub = StubRedis(clock, exists=[1], getdel=[None])
    with pytest.raises(ProtocolError) as info:
        await wait_for_result(
            stub,  # type: ignore[arg-type]
            JOB,
            STEP,
            60,
            mode=ReadMode.DESTRUCTIVE,
            clock=clock,
        )
    assert info.value.reason == ProtocolReason.RESULT_LOST
    assert clock.monotonic() == 0


async def test_destructive_read_whose_reply_was_lost_fails_instead_of_hanging() -> None:
    clock = FakeClock()
    reset = redis_errors.ConnectionError("Connection reset by peer")
    stub = StubRedis(clock, exists=[1, 0], getdel=[reset])
    with pytest.raises(ProtocolError) as info:
        await wait_for_result(
            stub,  # type: ignore[arg-type]
            JOB,
            STEP,
            60,
            mode=ReadMode.DESTRUCTIVE,
            clock=clock,
        )
    assert info.value.reason == ProtocolReason.RESULT_LOST
    assert clock.monotonic() == pytest.approx(0.05)  # one backoff, not the 60 s timeout


async def test_destructive_read_retries_a_claim_that_never_reached_redis() -> None:
    clock = FakeClock()
    reset = redis_errors.ConnectionError("Connection refused")
    stub = StubRedis(clock, exists=[1, 1], getdel=[reset, DONE])
    result = await wait_for_result(
        stub,  # type: ignore[arg-type]
        JOB,
        STEP,
        60,
        mode=ReadMode.DESTRUCTIVE,
        clock=clock,
    )
    assert result.content == "ok"


async def test_a_hanging_subscription_delays_polling_by_one_interval_only() -> None:
    clock = FakeClock()
    stub = StubRedis(clock, get=[None, DONE])
    stub.subscribe_hangs = True
    result = await wait_for_result(stub, JOB, STEP, 60, poll_interval=2, clock=clock)  # type: ignore[arg-type]
    assert result.content == "ok"
    assert times(stub, "get") == [2.0, 4.0]


class CancelSwallowingRedis(StubRedis):
    """A client whose ``get`` waits for an answer that never comes and, when its
    task is cancelled, returns as if nothing happened: what redis-py 8.1 was
    seen to do under load (a command returned normally in a cancelled task)."""

    async def get(self, key: str) -> Any:
        self.calls.append(("get", self.clock.monotonic()))
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        return None


async def test_a_wait_ends_at_its_timeout_even_when_the_client_swallows_the_cancel() -> None:
    # The poller's read was cancelled at the timeout, the client swallowed the
    # cancel, and the poller went on polling: the wait never returned, with no
    # timer left in the event loop (one run in a few hundred under load).
    clock = FakeClock()
    stub = CancelSwallowingRedis(clock)
    waiting = wait_for_result(stub, JOB, STEP, 10, poll_interval=1, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(ResultTimeoutError):
        await asyncio.wait_for(waiting, 5)  # real seconds: it hung forever before
    assert stub.closed == 1
