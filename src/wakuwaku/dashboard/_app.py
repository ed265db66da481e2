"""The dashboard's Starlette application: routes and rendering.

Security model (docs/dashboard.md; the layers are in :mod:`._security`):

- only the host names it was started for are answered (DNS rebinding), and
  a POST from another origin is refused;
- read-only unless started with ``allow_replay``; the writes are ``POST
  /replay`` and the operator controls' ``POST /control/...``
  (:mod:`._controls`: pause, resume, retry-now, give-up, offset reset,
  purge), each after a confirmation page, and all are refused with 403
  otherwise (their confirmation pages too);
- every POST carries a CSRF token (asgi-csrf's signed double-submit cookie:
  the form field must match the cookie, both signed with a secret of this
  process); every POST route is checked even when the request has no cookie;
- with a token (``WAKUWAKU_DASHBOARD_TOKEN``) every request needs it, as
  HTTP Basic password (any user name) or ``Authorization: Bearer``;
  :func:`check_exposure` refuses a non-loopback address without one;
- templates autoescape everything; a Content-Security-Policy with a nonce per
  response allows only the dashboard's own inline script and style, so markup
  from a record could not run even if it were ever rendered raw.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import math
import secrets
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import jinja2
import msgspec
from asgi_csrf import asgi_csrf
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp

from .. import ConfigError, WakuwakuError, sanitize
from .._text import plural
from ..admin import parse_dead_letter, replay_dead_letters
from ..logs import Log, open_log
from ..reliability import redact_url
from ._charts import bar_chart, clock, line_chart
from ._controls import Controls
from ._format import path_number, printable, relative, when
from ._sampler import KEY_LIMIT, LetterEntry, Sampler, Target, View
from ._security import (
    HostGuard,
    SecurityHeaders,
    TokenAuth,
    allowed_host_names,
    check_exposure,
)

PAGE_SIZE = 100
"""Dead letters per page of the list."""
PARTIAL_HEADER = "x-wakuwaku-partial"
"""A request with this header gets only the page's live part (the polling script)."""


STALL_SHOWN = 30.0
"""A partition whose committed offset has not moved for this many seconds
while it has lag is marked "no progress" on the topic page (design §7)."""


@dataclass(frozen=True, slots=True)
class DashboardSettings:
    """How ``wakuwaku dashboard`` runs.

    :param log_url: the log to show.
    :param group: only this consumer group (None: every group found).
    :param namespace: the consumers' namespace prefix, if any.
    :param host: / :param port: where to listen.
    :param allowed_hosts: host names answered besides the loopback names and
        ``host`` (the ``Host`` header a browser sends: the name in its
        address bar); others get 400 (:class:`~._security.HostGuard`).
    :param allow_replay: allow the writes: replaying dead letters and the
        operator controls (pause, resume, retry-now, give-up, offset reset,
        purge); read-only otherwise.
    :param token: the access token every request must carry (None: none).
    :param interval: seconds between two reads of the log (and page updates).
    :param metrics_url: a consumer's Prometheus endpoint to link and show
        (``wakuwaku run --metrics-port``).
    :raises ConfigError: when ``interval`` is not finite seconds > 0, or a
        name of ``allowed_hosts`` is not a bare host name or address.
    """

    log_url: str
    group: str | None = None
    namespace: str = ""
    host: str = "127.0.0.1"
    port: int = 8765
    allowed_hosts: tuple[str, ...] = ()
    allow_replay: bool = False
    token: str | None = None
    interval: float = 5.0
    metrics_url: str | None = None

    def __post_init__(self) -> None:
        # nan passes every comparison: a page polling every nan seconds polls
        # as fast as it can.
        if not (isinstance(self.interval, int | float) and math.isfinite(self.interval)) or (
            self.interval <= 0
        ):
            raise ConfigError(
                f"the dashboard's interval must be finite seconds > 0, got {self.interval!r}"
            )
        allowed_host_names(self.host, self.allowed_hosts)


# ---------------------------------------------------------------- formatting


def shown_url(url: str) -> str:
    """``url`` without its user information (:func:`wakuwaku.redact_url`)."""
    return redact_url(url)


def decoded_body(body: bytes) -> tuple[str, str]:
    """``(kind, text)`` of a record body: pretty JSON, UTF-8 text or hex."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "hex", body.hex(" ", 2)
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return "text", text
    return "json", json.dumps(value, indent=2, ensure_ascii=False)


def _templates() -> Jinja2Templates:
    folder = resources.files(__package__) / "templates"
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(
        when=when, printable=printable, clock=clock, shown_url=shown_url, plural=plural
    )
    return Jinja2Templates(env=env)


# ------------------------------------------------------------------- filters


@dataclass(frozen=True, slots=True)
class LetterFilter:
    """The dead-letter list's search: key (exact), reason, time range (UTC),
    and whether purged dead letters are shown (marked) or left out, as
    ``wakuwaku dlq list`` and its ``--include-purged`` do."""

    key: str | None = None
    reason: str | None = None
    since: float | None = None
    until: float | None = None
    purged: bool = False

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> LetterFilter:
        """Read ``key``, ``reason``, ``since``, ``until`` (``YYYY-MM-DDTHH:MM[:SS]``,
        UTC) and ``purged`` (``yes``: show purged dead letters too).

        :raises ValueError: for a time that does not parse (the message names it).
        """
        return cls(
            query.get("key") or None,
            query.get("reason") or None,
            _time(query.get("since"), "since"),
            _time(query.get("until"), "until"),
            query.get("purged") == "yes",
        )

    def matches(self, entry: LetterEntry, purged: bool = False) -> bool:
        """True when ``entry`` (``purged`` or not) is shown."""
        return (
            (self.purged or not purged)
            and (self.key is None or (entry.key == self.key and not entry.key_cut))
            and (self.reason is None or entry.reason == self.reason)
            and (self.since is None or entry.timestamp >= self.since)
            and (self.until is None or entry.timestamp < self.until)
        )

    @property
    def by_time(self) -> bool:
        return self.since is not None or self.until is not None


def _time(raw: str | None, name: str) -> float | None:
    if not raw:
        return None
    try:
        moment = datetime.datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{name}: {raw!r} is not a time like 2026-12-01T02:30 (UTC)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


# --------------------------------------------------------------------- pages


class Dashboard:
    """The routes, over one open log and its :class:`Sampler`."""

    def __init__(self, settings: DashboardSettings, opener: Callable[[], Log]) -> None:
        self.settings = settings
        self.opener = opener
        self.templates = _templates()
        self.log: Log | None = None
        self.sampler: Sampler | None = None

    # -- lifetime

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.log = self.opener()
        self.sampler = Sampler(
            self.log,
            group=self.settings.group,
            namespace=self.settings.namespace,
            interval=self.settings.interval,
        )
        self.sampler.start()
        try:
            yield
        finally:
            await self.sampler.stop()
            await self.log.close()

    def _ready(self) -> tuple[Log, Sampler]:
        assert self.log is not None and self.sampler is not None, "used outside its lifespan"
        return self.log, self.sampler

    def render(
        self, request: Request, name: str, status_code: int = 200, **context: Any
    ) -> Response:
        _, sampler = self._ready()
        csrf = request.scope.get("csrftoken")
        context.update(
            settings=self.settings,
            nonce=request.state.nonce,
            csrftoken=csrf() if csrf is not None else "",
            now=datetime.datetime.now(datetime.UTC).timestamp(),
            sampler_error=sampler.error,
            relative=relative,
            stall_shown=STALL_SHOWN,
            link_limit=KEY_LIMIT,
        )
        return self.templates.TemplateResponse(request, name, context, status_code=status_code)

    def error(self, request: Request, status_code: int, message: str) -> Response:
        return self.render(request, "error.html", status_code, message=message)

    async def _view(self, request: Request) -> View | None:
        _, sampler = self._ready()
        await sampler.ready()
        target = Target(request.path_params["topic"], request.path_params["group"])
        return sampler.views.get(target)

    # -- routes

    async def index(self, request: Request) -> Response:
        _, sampler = self._ready()
        await sampler.ready()
        views = sorted(sampler.views.values(), key=lambda v: (v.target.topic, v.target.group))
        name = "_index_live.html" if PARTIAL_HEADER in request.headers else "index.html"
        return self.render(request, name, views=views, live=True)

    async def topic(self, request: Request) -> Response:
        view = await self._view(request)
        if view is None:
            return self._unknown(request)
        chart = line_chart(view.rates())
        dead = bar_chart((e.timestamp, e.reason) for e in view.letters)
        name = "_topic_live.html" if PARTIAL_HEADER in request.headers else "topic.html"
        return self.render(request, name, view=view, chart=chart, dead=dead, live=True)

    def _unknown(self, request: Request) -> Response:
        topic, group = request.path_params["topic"], request.path_params["group"]
        return self.error(
            request,
            404,
            f"no topic {printable(topic)!r} with group {printable(group)!r} in this log "
            "(or the dashboard was started with another --group)",
        )

    async def dead_letters(self, request: Request) -> Response:
        view = await self._view(request)
        if view is None:
            return self._unknown(request)
        try:
            search = LetterFilter.from_query(request.query_params)
        except ValueError as exc:
            return self.error(request, 400, str(exc))
        found = [e for e in view.letters if search.matches(e, view.is_purged(e))]
        with_purged = dataclasses.replace(search, purged=True)
        purged_count = sum(
            1 for e in view.letters if view.is_purged(e) and with_purged.matches(e, True)
        )
        pages = max(1, -(-len(found) // PAGE_SIZE))
        page = min(max(1, path_number(request.query_params.get("page", "1")) or 1), pages)
        shown = found[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        reasons = sorted({e.reason for e in view.letters})
        return self.render(
            request,
            "dead_letters.html",
            view=view,
            search=search,
            found=len(found),
            purged_count=0 if search.purged else purged_count,
            shown=shown,
            page=page,
            pages=pages,
            reasons=reasons,
            query=request.query_params,
        )

    async def dead_letter(self, request: Request) -> Response:
        view = await self._view(request)
        if view is None:
            return self._unknown(request)
        log, sampler = self._ready()
        dlq = sampler.dead_letter_topic(view.target)
        raw_partition, raw_offset = request.path_params["partition"], request.path_params["offset"]
        partition, offset = path_number(raw_partition), path_number(raw_offset)
        if partition is None or offset is None:
            where = f"{dlq}/{printable(raw_partition, 40)}@{printable(raw_offset, 40)}"
            return self.error(
                request,
                404,
                f"no dead letter at {where} (a partition and an offset are whole "
                "numbers from 0 to 2**63 - 1)",
            )
        try:
            records = await log.read(dlq, partition, offset, 1)
        except WakuwakuError as exc:
            return self.error(request, 404, f"no dead letter there: {sanitize(exc, 300)}")
        if not records or records[0].offset != offset:
            return self.error(request, 404, f"no dead letter at {dlq}/{partition}@{offset}")
        letter = parse_dead_letter(partition, records[0])
        kind, body = decoded_body(letter.body)
        headers = [
            (name, bytes(value).decode("utf-8", "replace"))
            for name, value in sorted(letter.headers.items())
        ]
        return self.render(
            request,
            "dead_letter.html",
            view=view,
            letter=letter,
            purged=offset in view.purged.get(partition, ()),
            dlq=dlq,
            headers=headers,
            body_kind=kind,
            body=body,
        )

    async def replay(self, request: Request) -> Response:
        if not self.settings.allow_replay:
            return self.error(
                request,
                403,
                "this dashboard is read-only: start it with --allow-replay to replay dead letters",
            )
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        target = Target(fields.get("topic", ""), fields.get("group", ""))
        log, sampler = self._ready()
        await sampler.ready()
        view = sampler.views.get(target)
        if view is None:
            return self.error(request, 404, "unknown topic or group")
        key = fields.get("key") or None
        reason = fields.get("reason") or None
        confirmed = fields.get("confirm") == "yes"
        expected = fields.get("expected")
        try:
            report = await replay_dead_letters(
                log,
                target.topic,
                group=target.group,
                key=key,
                reason=reason,
                dry_run=not confirmed,
                namespace=self.settings.namespace,
            )
        except WakuwakuError as exc:
            return self.error(request, 400, sanitize(exc, 500))
        if confirmed:
            await sampler.refresh()
        return self.render(
            request,
            "replay.html",
            view=view,
            report=report,
            key=key,
            reason=reason,
            confirmed=confirmed,
            expected=expected,
        )

    async def metrics(self, request: Request) -> Response:
        url = self.settings.metrics_url
        samples: list[tuple[str, str]] = []
        problem = None
        if url is not None:
            try:
                text = await asyncio.to_thread(_fetch, url)
                for line in text.splitlines():
                    if line.startswith("wakuwaku_") and " " in line:
                        name, value = line.rsplit(" ", 1)
                        samples.append((name, value))
            except OSError as exc:
                problem = sanitize(f"{type(exc).__name__}: {exc}", 300)
        return self.render(request, "metrics.html", samples=samples, problem=problem)

    def routes(self) -> list[Route]:
        """Every page, the replay and the operator controls (:mod:`._controls`)."""
        return [
            Route("/", self.index),
            Route("/topic/{topic}/group/{group}", self.topic),
            Route("/topic/{topic}/group/{group}/dead-letters", self.dead_letters),
            # Numbers are read by path_number, not Starlette's int convertor,
            # which takes any count of digits (an offset past 2**63 was a 500).
            Route(
                "/topic/{topic}/group/{group}/dead-letters/{partition}/{offset}",
                self.dead_letter,
            ),
            Route("/replay", self.replay, methods=["POST"]),
            Route("/consumer-metrics", self.metrics),
            Route("/favicon.ico", lambda request: Response(status_code=204)),
            *Controls(self).routes(),
        ]

    def app(self, routes: list[Route]) -> Starlette:
        """The ASGI application of ``routes``, with its security headers."""
        return Starlette(
            routes=routes, middleware=[Middleware(SecurityHeaders)], lifespan=self.lifespan
        )


def posted_paths(routes: list[Route]) -> set[str]:
    """The paths of the routes that take a POST: the writes (``/replay``,
    ``/control/...``)."""
    return {r.path for r in routes if r.methods is not None and "POST" in r.methods}


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5.0) as response:
        body: bytes = response.read(4 * 1024 * 1024)
    return body.decode("utf-8", "replace")


def create_app(
    settings: DashboardSettings, opener: Callable[[], Log] | None = None
) -> Callable[[Any, Any, Any], Awaitable[None]]:
    """The dashboard as an ASGI application (run it with uvicorn).

    :param settings: what to show and how.
    :param opener: opens the log at start-up (default: ``open_log(settings.log_url)``);
        the log is closed at shutdown.
    :raises ConfigError: from :func:`check_exposure`.
    """
    check_exposure(settings.host, settings.token)
    dashboard = Dashboard(settings, opener or (lambda: open_log(settings.log_url)))
    routes = dashboard.routes()
    protected: ASGIApp = asgi_csrf(
        dashboard.app(routes),
        signing_secret=secrets.token_hex(32),
        # Every write is checked even when the request has no cookie.
        always_protect=posted_paths(routes),
        cookie_samesite="Strict",
    )
    if settings.token:
        protected = TokenAuth(protected, settings.token)
    protected = HostGuard(protected, allowed_host_names(settings.host, settings.allowed_hosts))

    # The lifespan events reach Starlette through the wrappers (asgi-csrf and
    # the middleware pass non-http scopes on).
    async def application(scope: Any, receive: Any, send: Any) -> None:
        await protected(scope, receive, send)

    return application
