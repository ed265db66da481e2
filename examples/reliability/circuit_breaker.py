"""Protect calls to a remote service with a circuit breaker (docs/reliability.md, design §12).

Run::

    python examples/reliability/circuit_breaker.py
"""

from __future__ import annotations

import asyncio

from wakuwaku import CircuitOpenError, StepError
from wakuwaku.reliability import BreakerConfig, CircuitBreaker

breaker = CircuitBreaker(
    "render-service",
    BreakerConfig(failure_threshold=3, open_for=0.2, half_open_probes=1, probe_deadline=5.0),
)


async def submit(job: str, fail_with: Exception | None) -> str:
    """Stands for a network call to the render service."""
    async with breaker.call():
        if fail_with is not None:
            raise fail_with
        return f"{job} accepted"


async def attempt(job: str, fail_with: Exception | None = None) -> None:
    try:
        print(await submit(job, fail_with))
    except StepError as error:
        print(f"{job}: the service answered that the job failed ({error.message})")
    except CircuitOpenError as error:  # a Transient: a consumer pauses and retries later
        print(f"{job}: breaker open, next probe in {error.retry_in:.1f} s")
    except ConnectionError as error:
        print(f"{job}: transport failure ({error})")
    print(f"  breaker is {breaker.state}")


async def main() -> None:
    # Explicit failures prove the service is up: they never open the breaker.
    await attempt("job-1", StepError("job-1", "render", "scene file is corrupt"))
    await attempt("job-2", StepError("job-2", "render", "scene file is corrupt"))
    # Transport failures do.
    for job in ("job-3", "job-4", "job-5"):
        await attempt(job, ConnectionResetError("connection reset by peer"))
    await attempt("job-6")
    await asyncio.sleep(0.25)  # open_for passes; the next call is a probe
    await attempt("job-7")


if __name__ == "__main__":
    asyncio.run(main())
