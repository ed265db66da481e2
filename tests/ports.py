"""Loopback ports for the servers the tests start themselves."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback TCP port nothing listens on right now.

    The operating system picks it; the probe socket is closed before this
    returns, so another process may still take the port before the caller
    binds it.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
