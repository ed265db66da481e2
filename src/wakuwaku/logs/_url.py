"""Parsing a log URL: ``scheme://rest?option=value&...`` (one parser for every command).

Each scheme declares the URL options it takes in :data:`LOG_URL_OPTIONS`; an
option a scheme does not take is refused by name, so a typo
(``?fsycn=0``) is an error rather than part of a file name or silently
ignored. A new adapter adds its scheme and option names there and reads its
options from :attr:`LogURL.options` in :func:`~wakuwaku.logs.open_log`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote

from .._errors import ConfigError, UnsupportedLogURL
from .._sanitize import redact_url

__all__ = (
    "LOG_URL_OPTIONS",
    "MAX_CALL_TIMEOUT",
    "LogURL",
    "check_servers",
    "check_timeout",
    "log_url",
    "option_bool",
    "option_seconds",
    "option_timeout",
    "parse_log_url",
)

LOG_URL_OPTIONS: dict[str, Collection[str]] = {
    "sqlite": ("fsync", "busy_timeout"),
    "memory": (),
    "redis": ("prefix", "timeout"),
    "rediss": ("prefix", "timeout"),
    "nats": ("prefix", "timeout"),
    "kafka": (
        "prefix",
        "timeout",
        "transactions",
        "security_protocol",
        "sasl_mechanism",
        "ssl_ca_location",
    ),
    "iggy": ("stream", "timeout", "tls", "tls_ca_file", "tls_domain", "token"),
}
"""The URL options each scheme takes (``docs/logs.md`` says what each means)."""

MAX_CALL_TIMEOUT = 3600.0
"""The longest bound a log takes for one server call (seconds)."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class LogURL:
    """A log URL split into its parts.

    :param url: the URL as given.
    :param scheme: the scheme, lower-cased (``sqlite``).
    :param rest: what lies between ``://`` and ``?`` (``/relative.db``).
    :param options: the query's options by name, as text.
    """

    url: str
    scheme: str
    rest: str
    options: Mapping[str, str] = field(default_factory=dict)


def log_url(scheme: str, rest: str, options: Sequence[tuple[str, object, object]] = ()) -> str:
    """The URL :func:`~wakuwaku.logs.open_log` opens a log with, as its ``url``.

    The one builder of every adapter's ``url``: ``scheme://rest``, then each
    option ``(name, value, default)`` whose value is not its default, in the
    order given, so another process (the demo's consumer, a CLI command
    shown the URL) opens the same log with the same options. A bool is
    written ``1``/``0``, a float with ``:g``, anything else as percent-quoted
    text. Callers never pass a credential: the URL is shown in messages.
    """
    query: list[str] = []
    for name, value, default in options:
        if value is None or value == default:
            continue
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, float):
            text = f"{value:g}"
        else:
            text = quote(str(value), safe="/:,._-")
        query.append(f"{name}={text}")
    return f"{scheme}://{rest}" + ("?" + "&".join(query) if query else "")


def parse_log_url(url: str, allowed: Mapping[str, Collection[str]] | None = None) -> LogURL:
    """Split ``url`` into scheme, rest and options, checking the options.

    :param url: ``scheme://rest`` with an optional ``?name=value&...`` query.
    :param allowed: the options each scheme takes (default
        :data:`LOG_URL_OPTIONS`); its keys are the supported schemes.
    :raises UnsupportedLogURL: when there is no ``://`` or the scheme is not
        one of ``allowed`` (the error lists those).
    :raises ConfigError: for a ``#`` fragment, a query that is not
        ``name=value`` pairs, an option named twice, or an option the scheme
        does not take (named, with the ones it does).
    """
    table = LOG_URL_OPTIONS if allowed is None else allowed
    shown = redact_url(url)  # every error below echoes the URL: never its password
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in table:
        raise UnsupportedLogURL(shown, tuple(table))
    if "#" in rest:
        raise ConfigError(f"bad log URL {shown!r}: a URL fragment ('#...') means nothing here")
    rest, _, query = rest.partition("?")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigError(
            f"bad log URL {shown!r}: options must be name=value pairs joined by '&'"
        ) from None
    options: dict[str, str] = {}
    takes = tuple(table[scheme])
    for name, value in pairs:
        if name not in takes:
            known = ", ".join(takes) if takes else "none"
            raise ConfigError(
                f"bad log URL {shown!r}: unknown option {name!r} for {scheme}:// "
                f"(it takes: {known})"
            )
        if name in options:
            raise ConfigError(f"bad log URL {shown!r}: option {name!r} is given twice")
        options[name] = value
    return LogURL(url, scheme, rest, options)


def option_bool(parsed: LogURL, name: str, default: bool) -> bool:
    """Option ``name`` as a bool (``1/0``, ``true/false``, ``yes/no``, ``on/off``).

    :raises ConfigError: for any other value.
    """
    raw = parsed.options.get(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ConfigError(
        f"bad log URL {redact_url(parsed.url)!r}: {name} must be 1/0, true/false, "
        f"yes/no or on/off, got {raw!r}"
    )


def option_seconds(parsed: LogURL, name: str, default: float) -> float:
    """Option ``name`` as finite seconds >= 0 (a float).

    :raises ConfigError: for anything else.
    """
    raw = parsed.options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"bad log URL {redact_url(parsed.url)!r}: {name} must be seconds >= 0, got {raw!r}"
        )
    return value


def check_timeout(value: object, name: str = "timeout") -> float:
    """``value`` as a bound on one server call: finite seconds in
    ``(0, MAX_CALL_TIMEOUT]``, as a float.

    One rule for every log's constructor and URL: a bound of 0 fails every
    call, NaN compares false with every deadline (no call would ever time
    out), and infinity is no bound at all.

    :raises ConfigError: for a bool, a non-number or a value outside the range,
        naming ``name`` and the value.
    """
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    if number is None or not 0 < number <= MAX_CALL_TIMEOUT:  # False for NaN too
        raise ConfigError(
            f"{name} must be seconds above 0 and at most {MAX_CALL_TIMEOUT:g}, got {value!r}"
        )
    return number


def option_timeout(parsed: LogURL, name: str, default: float) -> float:
    """Option ``name`` as a call bound (:func:`check_timeout`), ``default`` when absent.

    :raises ConfigError: for a value :func:`check_timeout` refuses, naming the
        URL (without its password), the option and the value.
    """
    raw = parsed.options.get(name)
    if raw is None:
        return default
    try:
        if raw != raw.strip() or "_" in raw:  # float() takes " 1 " and "1_0"; a URL should not
            raise ValueError(raw)
        return check_timeout(float(raw), name)
    except (ValueError, ConfigError):
        raise ConfigError(
            f"bad log URL {redact_url(parsed.url)!r}: {name} must be seconds above 0 and at "
            f"most {MAX_CALL_TIMEOUT:g}, got {raw!r}"
        ) from None


def check_servers(kind: str, hosts: str, example: str) -> list[str]:
    """The ``host:port`` entries of a comma-separated server list, checked.

    :param kind: the log's name for the error (``NATS``, ``Kafka``).
    :param hosts: what lies between ``@`` (or ``://``) and ``?``.
    :param example: the URL form the error shows (``nats://host:port``).
    :raises ConfigError: for an empty list or entry, a missing host, a
        path after the servers (these URLs take none), or a port that is
        not a number in 1..65535 (named, with the entry).
    """
    entries = [h.strip() for h in hosts.split(",")]
    if not hosts or not all(entries):
        raise ConfigError(f"bad {kind} log URL: it names no server; use {example}")
    for entry in entries:
        if "/" in entry:
            server, _, path = entry.partition("/")
            raise ConfigError(
                f"bad {kind} log URL: {server[:80]!r} is followed by a path ({'/' + path[:40]!r}); "
                f"a {kind} URL takes none: use {example}"
            )
        host, colon, port = entry.rpartition(":")
        bracketed = host.startswith("[") or host.endswith("]")
        if bracketed and not (host.startswith("[") and host.endswith("]") and len(host) > 2):
            raise ConfigError(
                f"bad {kind} log URL: {entry[:80]!r} has a broken [IPv6] host; use {example}"
            )
        if not colon or not host.strip("[]"):
            raise ConfigError(f"bad {kind} log URL: {entry[:80]!r} is not host:port; use {example}")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"bad {kind} log URL: the port of {entry[:80]!r} is not a number in 1..65535"
            )
    return entries
