"""Key and channel names shared by the Redis parts of :mod:`wakuwaku.reliability`.

Every name is ``<prefix>:<kind>:<job_id>:<step>``. ``step`` may not contain
``:``, so the last ``:`` always separates the step from the job id and two
different ``(job_id, step)`` pairs never share a key (``"a:b", "c"`` versus
``"a", "b:c"`` would otherwise collide).
"""

from __future__ import annotations

from .._errors import ConfigError

DEFAULT_PREFIX = "wk"
"""The default first segment of every key and channel name."""


def check_job(job_id: str, step: str) -> None:
    """Refuse ids that cannot name a key unambiguously.

    :raises ConfigError: when ``job_id`` or ``step`` is empty or not a
        ``str``, or ``step`` contains ``:``.
    """
    if not isinstance(job_id, str) or not job_id:
        raise ConfigError(f"job_id must be a non-empty str, got {job_id!r}")
    if not isinstance(step, str) or not step:
        raise ConfigError(f"step must be a non-empty str, got {step!r}")
    if ":" in step:
        raise ConfigError(f"step must not contain ':' (it separates key segments), got {step!r}")


def name(prefix: str, kind: str, job_id: str, step: str) -> str:
    """Build ``<prefix>:<kind>:<job_id>:<step>`` after :func:`check_job`."""
    check_job(job_id, step)
    if not prefix:
        raise ConfigError("key prefix must not be empty")
    return f"{prefix}:{kind}:{job_id}:{step}"
