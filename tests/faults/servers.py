"""Private servers for fault tests: one process per test, on free loopback ports.

Every class here starts its own server (never the shared ones on 6379, 4222,
9092 and 8090) with its data in a folder of the test's own, and implements one
:class:`Server` protocol, so a fault test is written once for every engine:

- ``start()`` starts the process (again, on the same data) and returns once
  it accepts connections;
- ``kill()`` sends SIGKILL (the process gets no chance to flush or say goodbye);
- ``freeze()`` / ``thaw()`` send SIGSTOP / SIGCONT (the sockets stay open and
  silent: a client only notices by its own timeouts);
- ``close()`` ends whatever is left (a frozen process is thawed first);
- ``url`` is what the engine's log is opened with.

Only what a SIGKILL cannot lose is acknowledged: redis-server runs with an
append-only file fsynced on every write; nats-server's JetStream and the
Kafka broker store every acknowledged write before they answer.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import pytest

from ..ports import free_port
from ..processes import stop

ROOT = Path(__file__).resolve().parents[2]
KAFKA_LIB = Path(os.environ.get("WAKUWAKU_SERVICES_DIR", ROOT / ".services")) / "kafka" / "lib"


def answers(port: int, timeout: float = 0.5) -> bool:
    """True when something accepts a TCP connection on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        sock.settimeout(timeout)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(name: str, hint: str) -> str:
    """The path of ``name``; skips locally (fails with ``CI=true``) when it is missing."""
    found = shutil.which(name)
    if found is None:
        if in_ci():
            pytest.fail(f"{name} is not installed ({hint}); CI must run every fault test")
        pytest.skip(f"{name} is not installed ({hint})")
    return found


class Server(Protocol):
    """What a fault test does to a server, whatever the engine."""

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def kill(self) -> None: ...

    def freeze(self) -> None: ...

    def thaw(self) -> None: ...

    def close(self) -> None: ...


class _Process:
    """One server process: start on the same data, SIGKILL, SIGSTOP, SIGCONT."""

    name = "server"
    start_timeout = 15.0

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.frozen = False

    def command(self) -> Sequence[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        return answers(self.port)

    @property
    def output(self) -> Path:
        return self.folder / f"{self.name}.log"

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        with self.output.open("ab") as out:
            self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT)
        self.frozen = False
        deadline = time.monotonic() + self.start_timeout
        while not self.ready():  # waiting for real I/O: the server to accept connections
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.output.read_text(errors="replace")[-2000:]
                self.close()
                raise AssertionError(f"{self.name} did not start on port {self.port}:\n{tail}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
        self.frozen = False

    def freeze(self) -> None:
        """SIGSTOP, and wait until every thread of the server has stopped
        (:func:`tests.processes.stop`)."""
        assert self.process is not None and self.process.poll() is None, "not running"
        stop(self.process)
        self.frozen = True

    def thaw(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
        self.frozen = False

    def stop(self) -> None:
        """A graceful stop (SIGTERM), SIGKILL when it takes more than a minute."""
        if self.process is None or self.process.poll() is not None:
            return
        self.thaw()
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()

    def close(self) -> None:
        if self.frozen:
            self.thaw()
        self.kill()


class RedisServer(_Process):
    """redis-server on 127.0.0.1:<free port>, data in ``folder``.

    ``durable`` (the default): append-only file, fsync on every write, so a
    SIGKILL loses nothing the server acknowledged. ``durable=False``: no
    persistence at all, a restart comes back empty. ``password``: the
    server requires it (``requirepass``).
    """

    name = "redis-server"

    def __init__(self, folder: Path, *, durable: bool = True, password: str | None = None) -> None:
        super().__init__(folder)
        self.binary = require_binary("redis-server", "make services")
        self.durable = durable
        self.password = password

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> Sequence[str]:
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.durable else "no",
            "--appendfsync",
            "always",
            "--dir",
            str(self.folder),
            "--daemonize",
            "no",
            *(["--requirepass", self.password] if self.password else []),
        ]

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False


class NatsServer(_Process):
    """nats-server with JetStream on 127.0.0.1:<free port>, storing in ``folder/js``."""

    name = "nats-server"

    def __init__(
        self,
        folder: Path,
        binary: str | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        super().__init__(folder)
        self.binary = binary or require_binary("nats-server", "make services")
        self.store = folder / "js"
        self.login = ["--user", user, "--pass", password or ""] if user else []

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> Sequence[str]:
        return [
            self.binary,
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.store),
            *self.login,
        ]


def iggy_server_binary() -> str:
    """The Iggy server the services script runs: the copy in
    ``$WAKUWAKU_SERVICES_DIR/iggy`` (default ``.services/iggy``), else
    ``../shared/iggy``, ``WAKUWAKU_IGGY_SERVER`` or ``iggy-server`` on PATH.
    Skips locally (fails with ``CI=true``) when there is none."""
    services = Path(os.environ.get("WAKUWAKU_SERVICES_DIR", ROOT / ".services"))
    named = os.environ.get("WAKUWAKU_IGGY_SERVER")
    for candidate in (
        shutil.which(named) if named else None,
        str(services / "iggy" / "iggy-server"),
        str(ROOT.parent / "shared" / "iggy" / "iggy-server"),
        shutil.which("iggy-server"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return require_binary("iggy-server", "make services, or set WAKUWAKU_IGGY_SERVER")


class IggyServer(_Process):
    """An Apache Iggy server on 127.0.0.1:<free port> (TCP; HTTP, QUIC and
    WebSocket off), data in ``folder/data``, root user ``iggy``/``iggy``.
    ``tls``: (certificate, key) PEM files; its TCP listener speaks TLS only.

    Never the shared server on 8090: its own ports and data folder.
    """

    name = "iggy-server"

    def __init__(self, folder: Path, *, tls: tuple[Path, Path] | None = None) -> None:
        super().__init__(folder)
        self.binary = iggy_server_binary()
        self.tls = (
            [
                "IGGY_TCP_TLS_ENABLED=true",
                "IGGY_TCP_TLS_SELF_SIGNED=false",
                f"IGGY_TCP_TLS_CERT_FILE={tls[0]}",
                f"IGGY_TCP_TLS_KEY_FILE={tls[1]}",
            ]
            if tls
            else []
        )

    @property
    def url(self) -> str:
        return f"iggy://iggy:iggy@127.0.0.1:{self.port}"

    def command(self) -> Sequence[str]:
        return [
            "env",
            f"IGGY_SYSTEM_PATH={self.folder / 'data'}",
            f"IGGY_TCP_ADDRESS=127.0.0.1:{self.port}",
            "IGGY_HTTP_ENABLED=false",
            "IGGY_QUIC_ENABLED=false",
            "IGGY_WEBSOCKET_ENABLED=false",
            "IGGY_ROOT_USERNAME=iggy",
            "IGGY_ROOT_PASSWORD=iggy",
            *self.tls,
            self.binary,
        ]


class KafkaBroker(_Process):
    """A single-node KRaft broker (broker and controller in one JVM) of our own.

    Started from the jars ``ci/services.sh`` installs
    (``$WAKUWAKU_SERVICES_DIR/kafka/lib``, default ``.services/kafka/lib``)
    with ``ci/kafka/server.properties`` on two free loopback ports and a data
    folder of its own; the first :meth:`start` formats the storage.
    """

    name = "kafka"
    start_timeout = 90.0

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        java = shutil.which("java")
        if not KAFKA_LIB.is_dir() or java is None:
            message = f"no Kafka jars in {KAFKA_LIB} or no java"
            if in_ci():
                pytest.fail(f"{message}: run ci/services.sh kafka")
            pytest.skip(f"{message} (set WAKUWAKU_SERVICES_DIR)")
        self.controller = free_port()
        text = (ROOT / "ci" / "kafka" / "server.properties").read_text()
        text = text.replace("9093", str(self.controller)).replace("9092", str(self.port))
        self.config = folder / "server.properties"
        self.config.write_text(text + f"\nlog.dirs={folder / 'data'}\n")
        self.java = [
            java,
            "-Xms64m",
            "-Xmx384m",
            f"-Dlog4j2.configurationFile={ROOT / 'ci' / 'kafka' / 'log4j2.properties'}",
            "-cp",
            f"{KAFKA_LIB}/*",
        ]
        self.formatted = False

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def format(self) -> None:
        """Format the data folder for a new cluster (once, before the first start)."""
        tool = [*self.java, "kafka.tools.StorageTool"]
        run = subprocess.run([*tool, "random-uuid"], check=True, capture_output=True, timeout=60)
        cluster = run.stdout.decode().split()[-1]
        subprocess.run(
            [*tool, "format", "-t", cluster, "-c", str(self.config)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.formatted = True

    def command(self) -> Sequence[str]:
        return [*self.java, "kafka.Kafka", str(self.config)]

    def start(self) -> None:
        if not self.formatted:
            self.format()
        super().start()
