"""The dashboard's operator controls (docs/dashboard.md).

Pause and resume a topic, one partition or one key; run a quarantined key's
next attempt now or give the key up; reset the group's offsets; purge dead
letters. Every control is two steps, as the replay of dead letters is:

- a GET page under the topic's page (``/topic/T/group/G/pause?key=k1``)
  that says exactly what will happen (the scope; for a reset the plan of a
  dry run, per partition; for a purge the counts of a dry run), with a form
  that carries the CSRF token;
- the form's POST to ``/control/<action>`` (the topic and group in hidden
  fields, as ``/replay`` has them), which does it through
  :mod:`wakuwaku.admin` and shows what was done.

Without ``allow_replay`` (``--allow-replay``) both answer 403 and the pages
show no control. The POSTs pass the same layers as ``/replay``: the host
and origin checks, the token, the CSRF check even without a cookie. A
refusal is a page with a 4xx status and the reason: 404 for a topic, group
or partition that does not exist, 409 for a state that refuses (members of
the group run, the key is not quarantined, the log refused), 400 for input
that does not parse; 503 when the log cannot be reached.

Commands name who asked (``by``): the dashboard's operator name
(:func:`wakuwaku.admin.operator_name`, the user running the dashboard),
``via dashboard`` and the address the request came from.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import (
    ConfigError,
    GroupRunningError,
    LogError,
    LogUnavailableError,
    UnknownGroupError,
    UnknownPartitionError,
    UnknownTopicError,
    WakuwakuError,
    sanitize,
)
from .._control import Action, Command, Pause
from .._records import ReasonCode
from ..admin import (
    KeyNotQuarantinedError,
    OffsetResetPlan,
    ResetPosition,
    ResetTarget,
    give_up_key,
    operator_name,
    pause,
    plan_offset_reset,
    purge_dead_letters,
    reset_offsets,
    resume,
    retry_key_now,
)
from ._format import path_number, printable
from ._sampler import Target, View

if TYPE_CHECKING:
    from ._app import Dashboard

__all__ = ("CONTROL_PATHS", "Controls", "error_status", "reset_target")

REASON_LIMIT = 500
"""The longest reason a form takes (characters; the control topic keeps as many)."""

CONTROL_PATHS = {
    Action.PAUSE: "/control/pause",
    Action.RESUME: "/control/resume",
    Action.RETRY_NOW: "/control/retry-now",
    Action.GIVE_UP: "/control/give-up",
}
"""Where each command's confirmation form posts."""


class Refused(Exception):
    """A control cannot be done as asked: answered with ``status`` and ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_status(exc: WakuwakuError) -> int:
    """The HTTP status of a refusal by :mod:`wakuwaku.admin` (never a 5xx but
    for a log that cannot be reached)."""
    if isinstance(exc, UnknownTopicError | UnknownPartitionError | UnknownGroupError):
        return 404
    if isinstance(exc, GroupRunningError | KeyNotQuarantinedError):
        return 409
    if isinstance(exc, ConfigError):
        return 400
    if isinstance(exc, LogUnavailableError):
        return 503
    if isinstance(exc, LogError):
        return 409
    return 400


def reset_target(raw: str) -> ResetTarget:
    """Where an offset reset goes, from a form: ``earliest``, ``latest``, an
    offset (ASCII digits, at most 2**63 - 1) or a time
    (``2026-12-01T02:30[:SS]``, UTC unless it names a zone).

    :raises Refused: (400) for anything else.
    """
    text = raw.strip()
    if text in (ResetPosition.EARLIEST.value, ResetPosition.LATEST.value):
        return ResetPosition(text)
    if text.isascii() and text.isdigit():
        offset = path_number(text)
        if offset is None:
            raise Refused(400, f"offset {printable(text, 40)} is past 2**63 - 1")
        return offset
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise Refused(
            400,
            f"reset to {printable(text, 80)!r}: give earliest, latest, an offset (a whole "
            "number from 0) or a time like 2026-12-01T02:30 (UTC unless it names a zone)",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment


@dataclass(frozen=True, slots=True)
class Scope:
    """What a command acts on: the whole topic, one partition or one key."""

    partition: int | None = None
    key: str | None = None


def _partition(raw: str | None, view: View) -> int | None:
    """A partition from a form or query, checked against the topic.

    :raises Refused: 400 when it is not a whole number from 0 to 2**63 - 1,
        404 when the topic has no such partition.
    """
    if not raw:
        return None
    partition = path_number(raw)
    if partition is None:
        raise Refused(
            400,
            f"partition {printable(raw, 40)!r} is not a whole number from 0 to 2**63 - 1",
        )
    count = len(view.status.partitions) if view.status is not None else None
    if count is not None and partition >= count:
        raise Refused(
            404, f"topic {view.target.topic} has {count} partitions: there is no {partition}"
        )
    return partition


def _scope(fields: Mapping[str, str], view: View, *, key_needed: bool = False) -> Scope:
    partition = _partition(fields.get("partition"), view)
    key = fields.get("key")
    if key == "":
        # Never read as "no key": an emptied key field would widen a key's
        # pause to the whole topic.
        raise Refused(400, "the key is empty: give a key, or leave the key field out")
    if key is not None and partition is not None:
        raise Refused(400, "a command acts on a partition or on a key, not both")
    if key_needed and key is None:
        raise Refused(400, "say which key: this control acts on one quarantined key")
    return Scope(partition, key)


def _ending(view: View, scope: Scope) -> list[Pause]:
    """The pauses in force that resuming ``scope`` ends: a topic's resume ends
    them all (partitions' and keys' too), a partition's or key's its own."""
    if scope.key is not None:
        return [p for p in view.pauses if p.key == scope.key]
    if scope.partition is not None:
        return [p for p in view.pauses if p.key is None and p.partition == scope.partition]
    return list(view.pauses)


def _reason(fields: Mapping[str, str]) -> str:
    return (fields.get("reason") or "").strip()[:REASON_LIMIT]


class Controls:
    """The control routes, over a :class:`~._app.Dashboard` (its log,
    sampler, settings and rendering)."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self.operator = operator_name()

    def routes(self) -> list[Route]:
        """The GET confirmation pages and the POSTs they send."""
        page = "/topic/{topic}/group/{group}"
        routes = [
            Route(f"{page}/{action.value}", self._handled(self._confirm_page(action)))
            for action in CONTROL_PATHS
        ]
        routes += [
            Route(path, self._handled(self._command(action)), methods=["POST"])
            for action, path in CONTROL_PATHS.items()
        ]
        return [
            *routes,
            Route(f"{page}/reset-offsets", self._handled(self.reset_page)),
            Route("/control/reset-offsets", self._handled(self.reset), methods=["POST"]),
            Route(f"{page}/purge", self._handled(self.purge_page)),
            Route("/control/purge", self._handled(self.purge), methods=["POST"]),
        ]

    # -- common steps

    def _by(self, request: Request) -> str:
        client = request.client.host if request.client is not None else "an unknown address"
        return f"{self.operator} via dashboard from {client}"

    def _read_only(self, request: Request) -> Response | None:
        if self.dashboard.settings.allow_replay:
            return None
        return self.dashboard.error(
            request,
            403,
            "this dashboard is read-only: start it with --allow-replay to pause, resume, "
            "retry or give up keys, reset offsets and purge or replay dead letters",
        )

    async def _page_view(self, request: Request) -> View:
        view = await self.dashboard._view(request)
        if view is None:
            topic, group = request.path_params["topic"], request.path_params["group"]
            raise Refused(
                404,
                f"no topic {printable(topic)!r} with group {printable(group)!r} in this log "
                "(or the dashboard was started with another --group)",
            )
        return view

    async def _form(self, request: Request) -> tuple[dict[str, str], View]:
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        _, sampler = self.dashboard._ready()
        await sampler.ready()
        topic, group = fields.get("topic", ""), fields.get("group", "")
        view = sampler.views.get(Target(topic, group))
        if view is None:
            raise Refused(
                404,
                f"no topic {printable(topic)!r} with group {printable(group)!r} in this log "
                "(or the dashboard was started with another --group)",
            )
        return fields, view

    def _handled(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` behind the read-only check, with refusals as pages."""

        async def route(request: Request) -> Response:
            refusal = self._read_only(request)
            if refusal is not None:
                return refusal
            try:
                return await handler(request)
            except Refused as exc:
                return self.dashboard.error(request, exc.status, exc.message)
            except WakuwakuError as exc:
                return self.dashboard.error(request, error_status(exc), sanitize(exc, 500))
            except OSError as exc:  # the log's connection: try again
                text = sanitize(f"{type(exc).__name__}: {exc}", 300)
                return self.dashboard.error(request, 503, f"cannot reach the log: {text}")

        return route

    # -- pause, resume, retry-now, give-up

    def _confirm_page(self, action: Action) -> Callable[[Request], Awaitable[Response]]:
        async def page(request: Request) -> Response:
            view = await self._page_view(request)
            fields = dict(request.query_params)
            scope = _scope(fields, view, key_needed=action in (Action.RETRY_NOW, Action.GIVE_UP))
            quarantined = None
            if scope.key is not None and view.status is not None:
                found = [q for q in view.status.quarantined if q.key == scope.key]
                quarantined = found[0] if found else None
            if action in (Action.RETRY_NOW, Action.GIVE_UP) and quarantined is None:
                raise Refused(
                    409,
                    f"key {printable(scope.key, 200)!r} is not quarantined in group "
                    f"{view.target.group} (as of the last read of the log): nothing to "
                    f"{'retry' if action is Action.RETRY_NOW else 'give up'}",
                )
            return self.dashboard.render(
                request,
                "control.html",
                view=view,
                action=action.value,
                scope=scope,
                ending=_ending(view, scope),
                by=self._by(request),
                quarantined=quarantined,
                reason=_reason(fields),
                post_to=CONTROL_PATHS[action],
                reason_limit=REASON_LIMIT,
                command=None,
            )

        return page

    def _command(self, action: Action) -> Callable[[Request], Awaitable[Response]]:
        async def post(request: Request) -> Response:
            fields, view = await self._form(request)
            scope = _scope(fields, view, key_needed=action in (Action.RETRY_NOW, Action.GIVE_UP))
            command = await self._send(action, request, view, scope, _reason(fields))
            _, sampler = self.dashboard._ready()
            await sampler.refresh()
            return self.dashboard.render(
                request,
                "control.html",
                view=sampler.views.get(view.target, view),
                action=action.value,
                scope=scope,
                ending=[],
                by=command.by,
                quarantined=None,
                reason=command.reason,
                post_to=CONTROL_PATHS[action],
                reason_limit=REASON_LIMIT,
                command=command,
            )

        return post

    async def _send(
        self, action: Action, request: Request, view: View, scope: Scope, reason: str
    ) -> Command:
        log, _ = self.dashboard._ready()
        topic, group = view.target.topic, view.target.group
        namespace = self.dashboard.settings.namespace
        by = self._by(request)
        if action in (Action.PAUSE, Action.RESUME):
            call = pause if action is Action.PAUSE else resume
            return await call(
                log,
                group,
                topic,
                partition=scope.partition,
                key=scope.key,
                by=by,
                reason=reason,
                namespace=namespace,
            )
        assert scope.key is not None
        one_key = retry_key_now if action is Action.RETRY_NOW else give_up_key
        return await one_key(
            log, group, topic, scope.key, by=by, reason=reason, namespace=namespace
        )

    # -- reset offsets

    async def reset_page(self, request: Request) -> Response:
        """The offset reset's confirmation: the target chosen, then the plan."""
        view = await self._page_view(request)
        fields = dict(request.query_params)
        partition = _partition(fields.get("partition"), view)
        plan = None
        if (fields.get("to") or "").strip():
            log, _ = self.dashboard._ready()
            plan = await plan_offset_reset(
                log,
                view.target.group,
                view.target.topic,
                reset_target(fields["to"]),
                partition=partition,
                namespace=self.dashboard.settings.namespace,
            )
        return self._reset_render(request, view, fields, plan)

    async def reset(self, request: Request) -> Response:
        """Reset the offsets (planned again: the result says when the plan changed)."""
        fields, view = await self._form(request)
        target = reset_target(fields.get("to") or "")
        log, sampler = self.dashboard._ready()
        plan = await reset_offsets(
            log,
            view.target.group,
            view.target.topic,
            target,
            partition=_partition(fields.get("partition"), view),
            namespace=self.dashboard.settings.namespace,
        )
        await sampler.refresh()
        return self._reset_render(request, view, fields, plan)

    def _reset_render(
        self,
        request: Request,
        view: View,
        fields: Mapping[str, str],
        plan: OffsetResetPlan | None,
    ) -> Response:
        return self.dashboard.render(
            request,
            "reset.html",
            view=view,
            plan=plan,
            to=(fields.get("to") or "").strip(),
            partition=fields.get("partition") or "",
            expected=fields.get("expected"),
            planned=_plan_text(plan) if plan is not None else "",
        )

    # -- purge dead letters

    async def purge_page(self, request: Request) -> Response:
        """The purge's confirmation: the selection, then a dry run's counts."""
        view = await self._page_view(request)
        fields = dict(request.query_params)
        return await self._purge_run(request, view, fields, dry_run=True)

    async def purge(self, request: Request) -> Response:
        """Purge the dead letters selected (the result says when the count changed)."""
        fields, view = await self._form(request)
        return await self._purge_run(request, view, fields, dry_run=False)

    async def _purge_run(
        self, request: Request, view: View, fields: Mapping[str, str], *, dry_run: bool
    ) -> Response:
        reason = fields.get("reason") or None
        replayed = fields.get("replayed") == "yes"
        everything = fields.get("everything") == "yes"
        report = None
        log, sampler = self.dashboard._ready()
        if reason is not None or replayed or everything:
            report = await purge_dead_letters(
                log,
                view.target.topic,
                group=view.target.group,
                reason=reason,
                replayed=replayed,
                everything=everything,
                dry_run=dry_run,
                namespace=self.dashboard.settings.namespace,
            )
        elif not dry_run:
            raise Refused(
                400,
                "say which dead letters to purge: the replayed ones, those of one reason, "
                "or everything",
            )
        if not dry_run:
            await sampler.refresh()
        return self.dashboard.render(
            request,
            "purge.html",
            view=view,
            report=report,
            reason=reason,
            replayed=replayed,
            everything=everything,
            reasons=[r.value for r in ReasonCode],
            expected=fields.get("expected"),
        )


def _plan_text(plan: OffsetResetPlan) -> str:
    """The offsets a plan stores, ``0:5 1:3`` (to tell whether it changed)."""
    return " ".join(f"{p.partition}:{p.offset}" for p in plan.partitions)
