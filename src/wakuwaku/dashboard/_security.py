"""The dashboard's security layers, wrapped around its pages (docs/dashboard.md).

From the outside in:

- :class:`HostGuard`: a request must name, in its ``Host`` header, a host
  name the dashboard was started for (the loopback names, the address it
  listens on, and ``--allowed-host`` names), else 400. A page of another
  site whose name resolves to 127.0.0.1 (DNS rebinding) sends its own name
  and is refused. A POST whose ``Origin`` (or, without one, ``Referer``) is
  present and not the dashboard's own is refused with 403;
- :class:`TokenAuth`: with a token (``WAKUWAKU_DASHBOARD_TOKEN``) every
  request needs it, as HTTP Basic password (any user name) or
  ``Authorization: Bearer``; :func:`check_exposure` refuses a non-loopback
  address without one;
- asgi-csrf (in ``_app``): every POST carries a CSRF token;
- :class:`SecurityHeaders`: a Content-Security-Policy with a nonce per
  response, and the defensive headers.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import ipaddress
import secrets
import urllib.parse
from collections.abc import Iterable
from typing import Any

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp

from .. import ConfigError

TOKEN_ENV = "WAKUWAKU_DASHBOARD_TOKEN"
"""The environment variable the dashboard reads its access token from."""

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""The host names every dashboard answers to."""

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None) -> None:
    """Refuse to listen beyond this machine without an access token.

    :raises ConfigError: when ``host`` is not a loopback address and no token
        is set (the message names the variable).
    """
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"refusing to listen on {host!r} without a token: set {TOKEN_ENV} "
            "(every request must then carry it) or listen on 127.0.0.1"
        )


def host_name(name: str) -> str:
    """``name`` as the host checks compare it: lower case, without the
    brackets of an IPv6 address and without a final dot.

    :raises ConfigError: when ``name`` is empty or is not a bare host name or
        address (a scheme, a port, a path or a space in it).
    """
    bare = name.strip().lower().removesuffix(".")
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not bare or any(c in bare for c in ":/@?#[] \t") or not bare.isprintable():
            raise ConfigError(
                f"allowed host {name!r} is not a host name or address "
                "(give a bare name such as dashboard.example or 192.0.2.7: no scheme, "
                "port or path)"
            ) from None
    return bare


def allowed_host_names(host: str, extra: Iterable[str]) -> frozenset[str]:
    """The host names a dashboard listening on ``host`` answers to: the
    loopback names, ``host`` itself and ``extra``.

    :raises ConfigError: for a name of ``extra`` that :func:`host_name` refuses.
    """
    names = {host_name(n) for n in (*LOOPBACK_NAMES, *extra)}
    with contextlib.suppress(ConfigError):  # an address no client names ("")
        names.add(host_name(host))
    return frozenset(names)


def _split(authority: str) -> tuple[str, int | None] | None:
    """``(host name, port or None)`` of ``host[:port]``, None when it does not parse."""
    try:
        parts = urllib.parse.urlsplit("//" + authority)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.path:
        return None
    return parts.hostname.removesuffix("."), port


def _origin(url: str) -> tuple[str, int | None] | None:
    """``(host name, port)`` of an Origin or Referer URL; the port is None
    when it is its scheme's default (as a Host header without a port)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if port == {"http": 80, "https": 443}[parts.scheme]:
        port = None
    return parts.hostname.removesuffix("."), port


class HostGuard:
    """Answer only requests for a host name in ``names`` (else 400), and
    refuse a POST from another origin (403).

    The origin check compares the ``Origin`` header (``Referer`` when there
    is none) with the request's own ``Host``: the same name and port. A
    POST with neither still needs its CSRF token; ``Origin: null`` (a
    sandboxed or privacy-stripped request) is another origin.

    :param app: the application inside.
    :param names: the host names answered (:func:`allowed_host_names`).
    """

    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app = app
        self.names = names

    def _shown_names(self) -> str:
        return ", ".join(f"[{n}]" if ":" in n else n for n in sorted(self.names))

    def _refusal(self, scope: Any) -> tuple[int, str] | None:
        headers = dict(scope.get("headers") or ())
        raw_host = headers.get(b"host", b"").decode("latin-1")
        host = _split(raw_host) if raw_host else None
        if host is not None and host[1] == {"http": 80, "https": 443}.get(scope.get("scheme", "")):
            host = (host[0], None)
        if host is None or host[0] not in self.names:
            return 400, (
                f"this dashboard does not answer to the host name {raw_host!r}: it answers "
                f"to {self._shown_names()} (start it with --allowed-host NAME to add one)"
            )
        if scope.get("method", "GET") in _SAFE_METHODS:
            return None
        sent = headers.get(b"origin") or headers.get(b"referer")
        if sent is None:
            return None
        origin = _origin(sent.decode("latin-1"))
        if origin != host:
            what = "Origin" if b"origin" in headers else "Referer"
            return 403, (
                f"refusing a {scope.get('method')} from another site: its {what} "
                f"{sent.decode('latin-1')[:200]!r} is not this dashboard ({raw_host!r})"
            )
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, text = refusal
        await PlainTextResponse(text, status_code=status)(scope, receive, send)


class SecurityHeaders(BaseHTTPMiddleware):
    """A CSP nonce per request (``request.state.nonce``) and defensive headers.

    ``Referrer-Policy: same-origin``: the dashboard's own form posts carry
    their ``Origin`` (with ``no-referrer`` a browser sends ``Origin: null``,
    which :class:`HostGuard` refuses), and no address of the dashboard goes
    to another site.
    """

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        request.state.nonce = secrets.token_urlsafe(16)
        response = await call_next(request)
        nonce = request.state.nonce
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Cache-Control"] = "no-store"
        return response


class TokenAuth:
    """Every request must carry ``token``: Basic (as the password) or Bearer."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _allowed(self, header: str) -> bool:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer":
            return hmac.compare_digest(value.strip().encode(), self.token)
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True)
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(decoded.partition(b":")[2], self.token)
        return False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if self._allowed(headers.get(b"authorization", b"").decode("latin-1")):
            await self.app(scope, receive, send)
            return
        response = PlainTextResponse(
            "this dashboard needs its token (the password; any user name)",
            status_code=401,
            headers={"WWW-Authenticate": 'Basic realm="wakuwaku dashboard", charset="UTF-8"'},
        )
        await response(scope, receive, send)
