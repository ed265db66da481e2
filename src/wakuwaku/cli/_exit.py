"""The exit statuses of ``wakuwaku`` (shared by every command family)."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """The exit statuses of ``wakuwaku``."""

    OK = 0
    """Success."""
    FAILURE = 1
    """The command ran and failed (verification failed, records refused...)."""
    USAGE = 2
    """Bad arguments or options (click's own usage errors)."""
    ERROR = 3
    """A wakuwaku error: unknown topic, bad log URL, corrupt log file..."""
    INTERRUPTED = 130
    """Stopped by SIGINT."""
