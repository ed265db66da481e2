"""The circuit breaker (design §12, seed 000), on a fake clock that moves only when told."""

from __future__ import annotations

import asyncio

import pytest

from wakuwaku import (
    CircuitOpenError,
    ConfigError,
    ErrorClass,
    LogUnavailableError,
    ProtocolError,
    Retryable,
    StepError,
    Transient,
    Unrecoverable,
)
from wakuwaku.reliability.breaker import (
    BreakerConfig,
    BreakerState,
    CallOutcome,
    CircuitBreaker,
    default_call_outcome,
)
from wakuwaku.testing import FakeClock

CONFIG = BreakerConfig(failure_threshold=3, open_for=10.0, half_open_probes=1, probe_deadline=5.0)


def state_of(breaker: CircuitBreaker) -> BreakerState:
    """Read the state anew (mypy keeps an earlier ``assert breaker.state is X`` narrowing)."""
    return breaker.state


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(autojump=False)


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker("compute", CONFIG, clock=clock)


async def fail_with(breaker: CircuitBreaker, exc: BaseException) -> None:
    with pytest.raises(type(exc)):
        async with breaker.call():
            raise exc


async def succeed(breaker: CircuitBreaker) -> None:
    async with breaker.call():
        pass


async def open_it(breaker: CircuitBreaker) -> None:
    for _ in range(CONFIG.failure_threshold):
        await fail_with(breaker, ConnectionResetError("reset"))
    assert breaker.state is BreakerState.OPEN


async def half_open_it(breaker: CircuitBreaker, clock: FakeClock) -> None:
    await open_it(breaker)
    clock.advance(CONFIG.open_for)
    assert breaker.state is BreakerState.HALF_OPEN


# -- classification -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (StepError("j", "s", "bad input"), CallOutcome.DOMAIN_FAILURE),
        (Retryable("deadlock"), CallOutcome.DOMAIN_FAILURE),
        (Unrecoverable("bad event"), CallOutcome.DOMAIN_FAILURE),
        (ProtocolError("j", "s", "not_json"), CallOutcome.FAILURE),
        (ConnectionRefusedError(), CallOutcome.FAILURE),
        (OSError("no route"), CallOutcome.FAILURE),
        (TimeoutError(), CallOutcome.FAILURE),
        (LogUnavailableError("down"), CallOutcome.FAILURE),
        (Transient("db down"), CallOutcome.FAILURE),
        (RuntimeError("unknown"), CallOutcome.FAILURE),
        (asyncio.CancelledError(), CallOutcome.CANCELLED),
        (KeyboardInterrupt(), CallOutcome.CANCELLED),
    ],
    ids=repr,
)
def test_default_classification(exc: BaseException, outcome: CallOutcome) -> None:
    assert default_call_outcome(exc) is outcome


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failure_threshold": 0},
        {"open_for": 0},
        {"half_open_probes": 0},
        {"probe_deadline": -1},
    ],
)
def test_config_is_checked(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        BreakerConfig(**kwargs)  # type: ignore[arg-type]


# -- closed and open ------------------------------------------------------------------------


async def test_consecutive_transport_failures_open_it(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    await fail_with(breaker, ConnectionResetError())
    await fail_with(breaker, TimeoutError())
    assert breaker.state is BreakerState.CLOSED
    await fail_with(breaker, OSError("unreachable"))
    assert state_of(breaker) is BreakerState.OPEN
    clock.advance(4)
    with pytest.raises(CircuitOpenError) as info:
        async with breaker.call():
            pytest.fail("an open breaker must not run the call")
    assert info.value.retry_in == pytest.approx(6.0)
    assert isinstance(info.value, Transient)  # so a consumer pauses (design §1, §5.6)
    assert info.value.error_class is ErrorClass.TRANSIENT


async def test_protocol_errors_open_it(breaker: CircuitBreaker) -> None:
    for _ in range(CONFIG.failure_threshold):
        await fail_with(breaker, ProtocolError("j", "s", "unknown_status"))
    assert breaker.state is BreakerState.OPEN


@pytest.mark.parametrize(
    "exc",
    [StepError("j", "s", "bad input"), Retryable("row not there"), Unrecoverable("bad event")],
    ids=repr,
)
async def test_domain_failures_never_open_it(breaker: CircuitBreaker, exc: Exception) -> None:
    for _ in range(50):
        await fail_with(breaker, exc)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.failures == 0


async def test_a_success_resets_the_count(breaker: CircuitBreaker) -> None:
    await fail_with(breaker, ConnectionResetError())
    await fail_with(breaker, ConnectionResetError())
    await succeed(breaker)
    assert breaker.failures == 0
    await fail_with(breaker, ConnectionResetError())
    await fail_with(breaker, ConnectionResetError())
    assert breaker.state is BreakerState.CLOSED


async def test_a_domain_failure_in_the_closed_state_changes_nothing(
    breaker: CircuitBreaker,
) -> None:
    await fail_with(breaker, ConnectionResetError())
    await fail_with(breaker, ConnectionResetError())
    await fail_with(breaker, StepError("j", "s", "bad input"))
    assert breaker.failures == 2  # neither counted nor reset: it is not a probe
    permit = breaker.acquire()
    breaker.release_probe_as_success(permit)  # from a closed-period call: no effect
    assert breaker.failures == 2
    await fail_with(breaker, ConnectionResetError())
    assert breaker.state is BreakerState.OPEN


# -- half open ------------------------------------------------------------------------------


async def test_after_open_for_one_probe_goes_through(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    await open_it(breaker)
    clock.advance(CONFIG.open_for - 0.001)
    with pytest.raises(CircuitOpenError):
        breaker.acquire()
    clock.advance(0.001)
    probe = breaker.acquire()
    assert probe.probe
    with pytest.raises(CircuitOpenError) as info:
        breaker.acquire()  # the only slot is taken
    assert info.value.retry_in == pytest.approx(CONFIG.probe_deadline)
    breaker.record_success(probe)
    assert breaker.state is BreakerState.CLOSED


async def test_a_failed_probe_opens_it_again(breaker: CircuitBreaker, clock: FakeClock) -> None:
    await half_open_it(breaker, clock)
    before = breaker.generation
    await fail_with(breaker, ConnectionResetError())
    assert breaker.state is BreakerState.OPEN
    assert breaker.generation > before
    with pytest.raises(CircuitOpenError) as info:
        breaker.acquire()
    assert info.value.retry_in == pytest.approx(CONFIG.open_for)


async def test_a_probe_that_fails_in_the_domain_is_released_as_success(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    # The seed's follow-up bug: skipping both failure and success left the slot
    # taken and the breaker half open, refusing everything, until a restart.
    await half_open_it(breaker, clock)
    await fail_with(breaker, StepError("j", "s", "the job failed; the server answered"))
    assert breaker.state is BreakerState.CLOSED
    assert breaker.probes_in_flight == 0
    await succeed(breaker)


async def test_a_cancelled_probe_frees_its_slot_without_closing(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    await half_open_it(breaker, clock)
    entered = asyncio.Event()

    async def probe() -> None:
        async with breaker.call():
            entered.set()
            await asyncio.Event().wait()  # hangs until cancelled

    task = asyncio.create_task(probe())
    await entered.wait()
    assert breaker.probes_in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breaker.state is BreakerState.HALF_OPEN  # shutdown proves nothing
    assert breaker.probes_in_flight == 0  # but the slot is free again
    await succeed(breaker)
    assert state_of(breaker) is BreakerState.CLOSED


async def test_a_hung_probe_is_freed_by_its_deadline(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    await half_open_it(breaker, clock)
    hung = breaker.acquire()  # never finishes in time
    clock.advance(CONFIG.probe_deadline - 1)
    with pytest.raises(CircuitOpenError) as info:
        breaker.acquire()
    assert info.value.retry_in == pytest.approx(1.0)
    clock.advance(1)
    fresh = breaker.acquire()
    assert fresh.probe
    # The hung probe's late answer is void: it no longer owns a slot.
    breaker.record_success(hung)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.probes_in_flight == 1
    breaker.record_failure(fresh)
    assert state_of(breaker) is BreakerState.OPEN


async def test_probes_are_bounded(clock: FakeClock) -> None:
    breaker = CircuitBreaker(
        "x", BreakerConfig(failure_threshold=1, open_for=1, half_open_probes=2), clock=clock
    )
    await fail_with(breaker, ConnectionResetError())
    clock.advance(1)
    first, second = breaker.acquire(), breaker.acquire()
    with pytest.raises(CircuitOpenError):
        breaker.acquire()
    breaker.record_failure(first)
    assert breaker.state is BreakerState.OPEN
    breaker.record_success(second)  # from the period that just ended: ignored
    assert breaker.state is BreakerState.OPEN


# -- generations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "late", [CallOutcome.SUCCESS, CallOutcome.FAILURE, CallOutcome.DOMAIN_FAILURE]
)
async def test_slow_calls_from_the_closed_period_cannot_touch_a_later_half_open_period(
    breaker: CircuitBreaker, clock: FakeClock, late: CallOutcome
) -> None:
    # Started while closed; they take a long time (enough of them to open it, too).
    slow = [breaker.acquire() for _ in range(CONFIG.failure_threshold)]
    assert not any(permit.probe for permit in slow)
    await half_open_it(breaker, clock)
    probe = breaker.acquire()
    generation = breaker.generation
    for permit in slow:
        breaker.record(permit, late)  # they finish now, in the half-open period
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.generation == generation
    assert breaker.failures == 0
    assert breaker.probes_in_flight == 1  # the real probe still owns its slot
    breaker.record_success(probe)
    assert state_of(breaker) is BreakerState.CLOSED


async def test_a_slow_call_cannot_reopen_a_breaker_that_closed_again(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    slows = [breaker.acquire() for _ in range(CONFIG.failure_threshold)]
    await half_open_it(breaker, clock)
    await succeed(breaker)
    assert breaker.state is BreakerState.CLOSED
    for permit in slows:
        breaker.record_failure(permit)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.failures == 0


async def test_a_permit_is_settled_once(breaker: CircuitBreaker) -> None:
    permit = breaker.acquire()
    breaker.record_failure(permit)
    breaker.record_failure(permit)
    breaker.record_failure(permit)
    assert breaker.failures == 1


# -- pluggable classification ---------------------------------------------------------------


async def test_classification_is_pluggable(clock: FakeClock) -> None:
    def classify(exc: BaseException) -> CallOutcome:
        if isinstance(exc, KeyError):
            return CallOutcome.DOMAIN_FAILURE
        return default_call_outcome(exc)

    breaker = CircuitBreaker("x", CONFIG, clock=clock, classify=classify)
    for _ in range(10):
        await fail_with(breaker, KeyError("no such row"))
    assert breaker.state is BreakerState.CLOSED


async def test_a_classifier_that_raises_counts_a_failure(clock: FakeClock) -> None:
    def classify(exc: BaseException) -> CallOutcome:
        raise RuntimeError("classifier bug")

    breaker = CircuitBreaker("x", CONFIG, clock=clock, classify=classify)
    await fail_with(breaker, ValueError("x"))
    assert breaker.failures == 1


async def test_the_call_exception_always_propagates(breaker: CircuitBreaker) -> None:
    with pytest.raises(StepError):
        async with breaker.call() as permit:
            assert not permit.probe
            raise StepError("j", "s", "x")
