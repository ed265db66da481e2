"""``wakuwaku dashboard``: a web page over one log's consumer groups.

Install with ``pip install 'wakuwaku[dashboard]'`` (Starlette, uvicorn,
Jinja2); nothing else in wakuwaku imports this package. It reads the log
only through :mod:`wakuwaku.admin` and the log's read calls, so it works on
every log: per (topic, group) the partitions (owner, committed and end
offsets, lag, events/s), the quarantined keys, the pauses in force, the
dead letters (by reason, over time, searchable, each record's headers and
body) and, when started with ``allow_replay``, the operator controls, each
behind a confirmation page: replay and purge dead letters, pause and resume
a topic, partition or key, retry or give up a quarantined key now, reset
the group's offsets. docs/dashboard.md has the pages and the security model.

::

    from wakuwaku.dashboard import DashboardSettings, serve
    serve(DashboardSettings("sqlite:///demo-out/log.db"))
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn
except ImportError as exc:  # pragma: no cover - exercised by the CLI's message
    raise ImportError(
        f"wakuwaku.dashboard needs {exc.name}: pip install 'wakuwaku[dashboard]'"
    ) from exc

from collections.abc import Callable

from ..logs import Log
from ._app import DashboardSettings, create_app
from ._sampler import Sampler, Target, View
from ._security import TOKEN_ENV, check_exposure, is_loopback

__all__ = (
    "TOKEN_ENV",
    "DashboardSettings",
    "Sampler",
    "Target",
    "View",
    "check_exposure",
    "create_app",
    "is_loopback",
    "serve",
)


def serve(settings: DashboardSettings, opener: Callable[[], Log] | None = None) -> None:
    """Run the dashboard with uvicorn until interrupted (SIGINT/SIGTERM).

    :param opener: opens the log (default: ``open_log(settings.log_url)``).
    :raises ConfigError: when ``settings.host`` is not a loopback address and
        ``settings.token`` is not set (:func:`check_exposure`).
    """
    app = create_app(settings, opener)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="info", lifespan="on"
    )
    uvicorn.Server(config).run()
