"""The tests' own event loop keeps the check asyncio's debug mode made.

The suite runs without asyncio's debug mode (its stack extraction per
callback cost 2 to 10 times the time of a test); ``ThreadCheckedLoop`` in
``conftest.py`` keeps the check that mattered: an adapter that schedules a
callback on the loop from its client's thread, instead of through
``call_soon_threadsafe``, fails the test.
"""

from __future__ import annotations

import asyncio
import threading


async def test_a_callback_scheduled_from_another_thread_fails_loudly() -> None:
    loop = asyncio.get_running_loop()
    refused: list[BaseException] = []

    def from_a_client_thread() -> None:
        def nothing() -> None:
            pass

        try:
            loop.call_soon(nothing)
        except RuntimeError as exc:
            refused.append(exc)
        try:
            loop.call_later(1.0, nothing)
        except RuntimeError as exc:
            refused.append(exc)

    thread = threading.Thread(target=from_a_client_thread)
    thread.start()
    thread.join()
    assert [str(exc) for exc in refused] == [
        "Non-thread-safe operation invoked on an event loop other than the current one"
    ] * 2


async def test_the_threadsafe_way_still_works() -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    threading.Thread(target=lambda: loop.call_soon_threadsafe(done.set)).start()
    await asyncio.wait_for(done.wait(), 10.0)
