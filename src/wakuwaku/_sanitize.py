"""Sanitizing error text before it is stored or shown (design §14).

Error text written into retry and dead-letter headers, the inbox and logs
often comes from somewhere we do not control: a producer's result payload, a
driver's exception, a remote server's HTML error page. :func:`sanitize` turns
any of those into one short, single-line, printable ``str``:

1. bytes are decoded as UTF-8 with replacement (U+FFFD); lone surrogates in a
   ``str`` become U+FFFD too, so the result always encodes to UTF-8;
2. ANSI escape sequences are removed whole, then line breaks and tabs
   (``\\n \\r \\t \\v \\f``, U+0085, U+2028, U+2029) collapse to one space;
3. every other control character (C0, DEL, C1: category ``Cc``) and every
   format character (category ``Cf``: the bidi controls U+061C, U+200E,
   U+200F, U+202A-U+202E, U+2066-U+2069, the zero-width characters
   U+200B-U+200D, U+2060, U+FEFF, soft hyphen, tag characters...) is
   removed;
4. URLs (anything with ``://``, credentials included) become ``<url>``;
   credentials become ``<redacted>``: the value of a ``key=value`` or
   ``key: value`` pair whose key names a secret (``password``, ``passwd``,
   ``pwd``, ``secret``, ``token``, ``api_key``, ``access_key``,
   ``private_key``, ``client_secret``, ``credentials``, ``session_id``...,
   any case, with any prefix such as ``db_`` or ``X-``), an
   ``Authorization:`` value (the scheme ``Bearer``/``Basic``/``Token``... is
   kept), the token after a bare ``Bearer``, and well-known token shapes
   (JWTs, AWS access key ids, GitHub, Slack, Stripe and Google API keys,
   PEM private key blocks); absolute paths (POSIX ``/x/y`` and ``~/x``
   after any character that is not part of a word, Windows ``C:\\x``, UNC
   ``\\\\host\\share``) become ``<path>``;
5. **then** the text is truncated to ``limit`` characters, ending in
   ``…[truncated]``.

The order is the point of the seed postmortem (000): characters are removed
before redaction so that ``ht\\u200btps://`` cannot hide a URL from the
pattern, and redaction happens before truncation so that a URL or path that
straddles the limit leaves nothing of itself (a half URL no longer matches a
redaction pattern).

Redaction errs on the side of hiding: a URL, path or unquoted secret value
runs to the next whitespace (trailing ``.,;:)]}>'"`` and closing quotes are
given back), so ``(see /etc/x)`` becomes ``(see <path>)`` but
``/etc/o'neil's`` hides everything up to the space. A path or secret value
that opens with a quote runs to its closing quote, spaces included
(``'C:\\Program Files\\x y.txt'``); an unquoted path goes on over a space
while the next word holds a path separator (``C:\\My Files\\x``). What an
unquoted path's last component holds after a space cannot be told from
the prose that follows it, and is not hidden.
"""

from __future__ import annotations

import functools
import re
from typing import Any
from urllib.parse import unquote_plus

from ._errors import ConfigError

__all__ = (
    "DEFAULT_LIMIT",
    "PATH_MARKER",
    "SECRET_MARKER",
    "TRUNCATION_MARKER",
    "URL_MARKER",
    "redact_url",
    "sanitize",
)

DEFAULT_LIMIT = 1024
"""Default maximum length of sanitized text, in characters (code points)."""

URL_MARKER = "<url>"
"""What a redacted URL is replaced with."""

PATH_MARKER = "<path>"
"""What a redacted absolute filesystem path is replaced with."""

SECRET_MARKER = "<redacted>"
"""What a redacted credential (a secret value, a token) is replaced with."""

TRUNCATION_MARKER = "…[truncated]"
"""Appended to text cut at the limit (counted inside the limit)."""

_SURROGATES = re.compile("[\ud800-\udfff]")

# CSI sequences (colours, cursor moves) and OSC sequences (terminal titles,
# hyperlinks), removed whole so that no "[31m" debris stays behind.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")

_LINE_BREAKS = re.compile("[\t\n\v\f\r\x85\u2028\u2029]")
_SPACES = re.compile(" {2,}")

# Category Cc (C0, DEL, C1) and category Cf, as of Unicode 15.1. A test checks
# that every Cf character of the running Python's unicodedata is covered, so a
# newer Unicode version that adds one fails the build instead of leaking.
_REMOVED = re.compile(
    "["
    "\x00-\x1f\x7f-\x9f"
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"
    "\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
    "]+"
)

# Redaction patterns. Each can only start where the previous character is
# not part of the same token (the look-behinds), so matching stays linear
# even on a megabyte of letters without a single "://".
_URL = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z0-9+.\-]*://\S*")

# Where an absolute path starts: UNC \\host, Windows C:\ or C:/, POSIX / or ~/.
# A POSIX path starts after any character that cannot be part of a word or of
# a relative path ("and/or", "1/2", "10.0.0.0/24" and "a.b/c" are not paths);
# an HTML closing tag "</b>" is not one either.
_STARTS = (
    r"(?<!\\)\\\\[^\s\\]",
    r"(?<![A-Za-z0-9])[A-Za-z]:[\\/]",
    r"(?<![\w.\\/~\-])(?<!<(?=/[A-Za-z][A-Za-z0-9]*>))/(?=\S)",
    r"(?<![\w.\\/~\-])~[A-Za-z0-9_.\-]*/(?=\S)",
    # The second pass: a path the first pass held, whose quote a removed
    # character kept apart from it ('\u200bC:\x y') runs on to that quote.
    "\ue001",
)
_PATH_START = "(?:" + "|".join(_STARTS) + ")"
# The quotes a path or a secret value may open with, and what closes each.
_QUOTES = {"'": "'", '"': '"', "`": "`", "\u2018": "\u2019", "\u201c": "\u201d"}
_PATH_WORDS = 8
"""At most this many more words an unquoted path runs over (a bound, so that a
megabyte of "/a /b" does not become one path that hides the whole window)."""
# One alternation, so the leftmost path wins and "\\?\C:\x" is one UNC path,
# not a Windows path inside a UNC prefix. A quoted path runs to its closing
# quote (or the end); an unquoted one to the next whitespace, and on over up
# to three more words when the word after them holds a separator
# ("C:\Program Files (x86)\x").
_PATH = re.compile(
    "|".join(f"(?<={re.escape(o)}){_PATH_START}[^{re.escape(c)}]*" for o, c in _QUOTES.items())
    + rf"|{_PATH_START}\S*(?: +(?:[^\s\\/]+ +){{0,3}}[^\s\\/]*[\\/]\S*){{0,{_PATH_WORDS}}}"
)

# Credentials. The value of a pair whose key names a secret (any prefix:
# "db_password", "X-Api-Key", "AWS_SECRET_ACCESS_KEY"), quoted or not.
_SECRET_WORDS = (
    r"pass(?:word|wd|phrase)|pwd|secret|token|credentials?|auth"
    r"|api[_\-]?key|access[_\-]?key|private[_\-]?key|client[_\-]?secret|session[_\-]?id"
)
# A value already redacted (by the first pass) is not taken again, so that a
# form that hides two words does not hide one more word per pass.
_DONE = "(?!\ue002|<redacted>)"
_VALUE = (
    f"{_DONE}(?P<value>"
    + "|".join(f"{re.escape(o)}[^{re.escape(c)}]*{re.escape(c)}?" for o, c in _QUOTES.items())
    + r"|\S+)"
)
_KEY_VALUE = re.compile(
    rf"(?<![A-Za-z0-9_.\-])[A-Za-z0-9_.\-]*?(?i:{_SECRET_WORDS})"
    rf"(?i:s|[_\-]?(?:key|id|value|hash))?[\"'\u2019\u201d]?[ \t]*[=:][ \t]*{_VALUE}"
)
# Authorization values: a known scheme is kept, the credentials after it are
# hidden (Digest's comma-separated parameters included); without a known
# scheme, the next two words are hidden.
_AUTH_SCHEMES = r"bearer|basic|token|digest|negotiate|ntlm|hoba|mutual|vapid|aws4-hmac-sha256"
_AUTH_KNOWN = re.compile(
    rf"(?<![A-Za-z0-9_\-])(?i:(?:proxy-)?authorization)[\"']?[ \t]*[=:][ \t]*"
    rf"(?i:{_AUTH_SCHEMES}) +{_DONE}(?P<value>[^\s,]+(?: *, *[^\s,]+)*)"
)
_AUTH_OTHER = re.compile(
    rf"(?<![A-Za-z0-9_\-])(?i:(?:proxy-)?authorization)[\"']?[ \t]*[=:][ \t]*"
    rf"(?!(?i:{_AUTH_SCHEMES}) ){_DONE}(?P<value>\S+(?: +[^\s,]+)?)"
)
_BEARER = re.compile(r"(?<![A-Za-z0-9_\-])(?i:bearer) +(?P<value>[A-Za-z0-9._~+/=\-]{8,})")
# Token shapes that are secrets wherever they stand.
_TOKENS = re.compile(
    r"(?<![A-Za-z0-9_.\-])eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*"  # JWT
    r"|(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA|ASCA)"
    r"[A-Z0-9]{16}(?![A-Za-z0-9])"  # AWS access key id
    r"|(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"  # GitHub
    r"|(?<![A-Za-z0-9_])xox[abposr]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|(?<![A-Za-z0-9_])[rs]k_(?:live|test)_[A-Za-z0-9]{10,}"  # Stripe
    r"|(?<![A-Za-z0-9_\-])AIza[A-Za-z0-9_\-]{35}"  # Google API key
    r"|-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)"
)

_GIVE_BACK = ".,;:)]}>'\"`\u2019\u201d\u00bb"
_GIVE_BACK_VALUE = 3
"""At most this many trailing characters of an unquoted secret value are given back."""


def _redact_values(pattern: re.Pattern[str], marker: str, text: str) -> str:
    """Replace group ``value`` of each match (its quotes kept, a few trailing
    punctuation marks of an unquoted one given back), or the whole match when
    the pattern has no such group."""

    def replace(match: re.Match[str]) -> str:
        whole = match.group()
        if "value" not in pattern.groupindex:
            return marker
        start = match.start("value") - match.start()
        value = match.group("value")
        closer = _QUOTES.get(value[:1])
        if closer is not None:
            end = value[-1:] if len(value) > 1 and value.endswith(closer) else ""
            return f"{whole[:start]}{value[0]}{marker}{end}"
        core = value.rstrip(_GIVE_BACK)
        core = core if len(value) - len(core) <= _GIVE_BACK_VALUE else value[:-_GIVE_BACK_VALUE]
        if not core:
            return whole
        return whole[:start] + marker + value[len(core) :]

    return pattern.sub(replace, text)


def _redact_secrets(marker: str, text: str) -> str:
    """Every credential form of design §14 (Authorization values, key=value
    pairs, bearer tokens, token shapes), replaced by ``marker``."""
    for pattern in (_TOKENS, _AUTH_KNOWN, _AUTH_OTHER, _BEARER, _KEY_VALUE):
        text = _redact_values(pattern, marker, text)
    return text


def _redact(pattern: re.Pattern[str], marker: str, text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        whole = match.group()
        core = whole.rstrip(_GIVE_BACK)
        if len(core) < 2:  # "/)" is punctuation, not a path
            return whole
        return marker + whole[len(core) :]

    return pattern.sub(replace, text)


_SCAN_MARGIN = 4096
"""Cleaned characters kept past ``4 * limit`` when a long text is cut early."""
_MAX_WINDOW = 256
"""At most this many times that much raw text is read looking for it."""

# Placeholders for what the first redaction pass (before escape sequences
# are removed) replaced: private-use characters that no later pattern eats.
_URL_HOLD = "\ue000"
_PATH_HOLD = "\ue001"
_SECRET_HOLD = "\ue002"
# The second pass also takes a placeholder with the scheme letters that a
# removed zero-width character had kept apart from it ("ht\u200btps://...").
# So does a scheme whose "//" the first pass took for a path ("https:\u200b//").
# A secret the first pass held takes the rest of its token, both sides: a
# removed character had cut it short ("Bearer 0123\u200b4567", "eyJa.\u200beyJb.c").
_SECRET_AGAIN = re.compile("(?<![A-Za-z0-9_.\\-])[A-Za-z0-9_.\\-]*\ue002\\S*")
_URL_AGAIN = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z0-9+.\-]*(?:://|\ue000|:\ue001)\S*")


def _as_text(value: str | bytes | BaseException) -> str:
    if isinstance(value, BaseException):
        name = type(value).__name__
        try:
            message = str(value)
        except Exception:  # noqa: BLE001 - a broken __str__ must not break error reporting
            message = "<unprintable>"
        return f"{name}: {message}" if message else name
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _clean(text: str) -> str:
    """One line without escapes, controls or runs of spaces; URLs and paths
    already redacted once (as placeholders), so an escape sequence that
    swallows the start of a path cannot leave the rest of it readable."""
    text = _SURROGATES.sub("\ufffd", text)  # a lone surrogate cannot be encoded
    # Runs of whitespace end URLs and paths either way: fold them first, so
    # the patterns below do not try every position of a megabyte of padding.
    text = _SPACES.sub(" ", _LINE_BREAKS.sub(" ", text))
    text = _redact(_URL, _URL_HOLD, text)
    text = _redact_secrets(_SECRET_HOLD, text)
    text = _redact(_PATH, _PATH_HOLD, text)
    text = _ANSI.sub("", text)
    text = _REMOVED.sub("", text)
    return _SPACES.sub(" ", text)


def _clean_head(raw: str, limit: int) -> tuple[str, bool]:
    """The cleaned text, or for a text far longer than ``limit`` its cleaned
    head: the window read grows until its cleaned form is long enough (so
    padding that cleans away does not hide the message behind it), and the
    head is cut at whitespace so a token the cut would split is dropped
    whole. Past ``256`` times the head's length of raw text, what follows
    padding is given up. Returns the text and whether anything was cut."""
    scan = 4 * limit + _SCAN_MARGIN
    window = scan
    while True:
        cleaned = _clean(raw[:window])
        if window >= len(raw):
            return cleaned, False
        if len(cleaned) > scan or window >= _MAX_WINDOW * scan:
            break
        window *= 4
    head = cleaned[:scan]
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head), True


def _truncate(text: str, limit: int, cut: bool = False) -> str:
    """``text`` within ``limit``, ending in the marker when anything was cut
    (here, or before: ``cut``)."""
    if len(text) <= limit and not cut:
        return text
    if len(text) + len(TRUNCATION_MARKER) <= limit:
        return text.rstrip() + TRUNCATION_MARKER
    room = limit - len(TRUNCATION_MARKER)
    if room <= 0:
        # No space for the marker: a hard cut is the only way to respect limit.
        return text[:limit]
    head = text[:room]
    # Do not leave a torn "<ur" / "<pa" behind: back up over a cut marker.
    for marker in (URL_MARKER, PATH_MARKER, SECRET_MARKER):
        start = head.rfind("<", max(0, room - len(marker) + 1))
        if start != -1 and text.startswith(marker, start) and start + len(marker) > room:
            head = head[:start]
    return head.rstrip() + TRUNCATION_MARKER


def sanitize(text: str | bytes | BaseException, limit: int = DEFAULT_LIMIT) -> str:
    """Make untrusted error text safe to store and show (design §14, seed 000).

    :param text: the raw text; ``bytes`` are decoded as UTF-8 with
        replacement; an exception becomes ``"TypeName: message"`` (just the
        type name when the message is empty).
    :param limit: the maximum length of the result in characters (code
        points); the result is never longer. When the text is cut, it ends in
        :data:`TRUNCATION_MARKER` (unless ``limit`` leaves no room for any
        text before it, then the cut is bare).
    :returns: one line of printable text without control, bidi or zero-width
        characters, with URLs replaced by :data:`URL_MARKER`, credentials
        (secret ``key=value`` / ``key: value`` values, ``Authorization``
        values, bearer tokens, token shapes) by :data:`SECRET_MARKER` and
        absolute paths by :data:`PATH_MARKER`; always encodable as UTF-8.

    Redaction runs before truncation, so a URL or path straddling the limit is
    replaced whole and no fragment of it survives (the postmortem's "truncate
    first and half a path no longer matches" bug). Redaction runs twice: on
    the raw text (an escape sequence can swallow the start of a path) and
    after escapes and controls are gone (they can split one). A text whose
    cleaned form is longer than ``4 * limit + 4096`` characters is cut there
    first, at whitespace, dropping the token the cut falls in; so a 20 MB
    message costs what its first few kilobytes cost.

    :raises ConfigError: when ``limit`` is not an int >= 0 (an integral
        float is accepted).
    """
    given: Any = limit  # callers may be untyped
    if isinstance(given, float) and given.is_integer():
        limit = int(given)
    elif isinstance(given, bool) or not isinstance(given, int) or given < 0:
        raise ConfigError(f"sanitize limit must be an int >= 0, got {given!r}")
    raw = _as_text(text)
    if len(raw) <= _CACHED_TEXT:
        return _sanitize_cached(raw, limit)
    return _sanitize(raw, limit)


_CACHED_TEXT = 1024
"""Texts up to this many characters are sanitized once and remembered (the
same few error texts repeat for every failing event of a key; one call costs
~70 us of regular expressions: without this the flights demo's consumer spent
5 % of its time sanitizing 25 000 texts of 700 kinds)."""


@functools.lru_cache(maxsize=4096)
def _sanitize_cached(raw: str, limit: int) -> str:
    return _sanitize(raw, limit)


def _sanitize(raw: str, limit: int) -> str:
    value, cut = _clean_head(raw, limit)
    # Second pass: URLs and paths that escapes or controls were hiding.
    value = _redact(_URL_AGAIN, URL_MARKER, value)
    value = _redact(_SECRET_AGAIN, SECRET_MARKER, value)
    value = _redact_secrets(SECRET_MARKER, value)
    value = _redact(_PATH, PATH_MARKER, value)
    for hold, marker in (
        (_URL_HOLD, URL_MARKER),
        (_PATH_HOLD, PATH_MARKER),
        (_SECRET_HOLD, SECRET_MARKER),
    ):
        value = value.replace(hold, marker)
    value = value.strip()
    return _truncate(value, limit, cut)


_SECRET_OPTION = re.compile(rf"(?i:{_SECRET_WORDS})")
"""A query option whose name says it holds a secret (``token``, ``password``...)."""


def _redact_query(query: str) -> str:
    """``query`` with the value of each option whose name names a secret
    replaced by ``***`` (``stream=s&token=x`` gives ``stream=s&token=***``)."""
    pairs = query.split("&")
    for i, pair in enumerate(pairs):
        name, eq, _ = pair.partition("=")
        if eq and _SECRET_OPTION.search(unquote_plus(name)):  # as parse_qsl reads it
            pairs[i] = f"{name}=***"
    return "&".join(pairs)


def redact_url(url: str) -> str:
    """``url`` with the user information before ``@`` replaced by ``***``
    (``redis://u:secret@host:6379/0`` gives ``redis://***@host:6379/0``),
    and the value of each query option whose name names a secret too
    (``iggy://host:8090?token=x`` gives ``iggy://host:8090?token=***``).

    For echoing a log or database URL in an error or a page: user name and
    password go as a whole, whatever they hold; a URL with neither comes
    back unchanged. Never raises.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    path, mark, query = tail.partition("?")
    if mark:
        query, hash_, fragment = query.partition("#")
        tail = f"{path}?{_redact_query(query)}{hash_}{fragment}"
    return f"{scheme}{sep}{authority}{tail}"
