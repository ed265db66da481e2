"""Sanitizing error text before it is stored or shown (SPEC 13).

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
4. URLs (anything with ``://``, credentials included) become ``<url>`` and
   absolute paths (POSIX ``/x/y``, Windows ``C:\\x``, UNC ``\\\\host\\share``)
   become ``<path>``;
5. **then** the text is truncated to ``limit`` characters, ending in
   ``…[truncated]``.

The order is the point of the seed postmortem (000): characters are removed
before redaction so that ``ht\\u200btps://`` cannot hide a URL from the
pattern, and redaction happens before truncation so that a URL or path that
straddles the limit leaves nothing of itself (a half URL no longer matches a
redaction pattern).

Redaction errs on the side of hiding: a URL or path runs to the next
whitespace (trailing ``.,;:)]}>'"`` are given back), so ``(see /etc/x)``
becomes ``(see <path>)`` but ``/etc/o'neil's`` hides everything up to the
space.
"""

from __future__ import annotations

import re
from typing import Any

from ._errors import ConfigError

__all__ = ("DEFAULT_LIMIT", "PATH_MARKER", "TRUNCATION_MARKER", "URL_MARKER", "sanitize")

DEFAULT_LIMIT = 1024
"""Default maximum length of sanitized text, in characters (code points)."""

URL_MARKER = "<url>"
"""What a redacted URL is replaced with."""

PATH_MARKER = "<path>"
"""What a redacted absolute filesystem path is replaced with."""

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
# One alternation, so the leftmost path wins and "\\?\C:\x" is one UNC path,
# not a Windows path inside a UNC prefix.
_PATH = re.compile(
    r"(?<!\\)\\\\[^\s\\]\S*"  # UNC: \\host\share...
    r"|(?<![A-Za-z0-9])[A-Za-z]:[\\/]\S*"  # Windows: C:\x or C:/x
    r"|(?<![^\s\"'(\[{>=,:;|])/\S+"  # POSIX: /x... at the start of a token
)

_GIVE_BACK = ".,;:)]}>'\""


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
# The second pass also takes a placeholder with the scheme letters that a
# removed zero-width character had kept apart from it ("ht\u200btps://...").
_URL_AGAIN = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z0-9+.\-]*(?:://|\ue000)\S*")


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
    for marker in (URL_MARKER, PATH_MARKER):
        start = head.rfind("<", max(0, room - len(marker) + 1))
        if start != -1 and text.startswith(marker, start) and start + len(marker) > room:
            head = head[:start]
    return head.rstrip() + TRUNCATION_MARKER


def sanitize(text: str | bytes | BaseException, limit: int = DEFAULT_LIMIT) -> str:
    """Make untrusted error text safe to store and show (SPEC 13, seed 000).

    :param text: the raw text; ``bytes`` are decoded as UTF-8 with
        replacement; an exception becomes ``"TypeName: message"`` (just the
        type name when the message is empty).
    :param limit: the maximum length of the result in characters (code
        points); the result is never longer. When the text is cut, it ends in
        :data:`TRUNCATION_MARKER` (unless ``limit`` leaves no room for any
        text before it, then the cut is bare).
    :returns: one line of printable text without control, bidi or zero-width
        characters, with URLs replaced by :data:`URL_MARKER` and absolute
        paths by :data:`PATH_MARKER`; always encodable as UTF-8.

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
    value, cut = _clean_head(_as_text(text), limit)
    # Second pass: URLs and paths that escapes or controls were hiding.
    value = _redact(_URL_AGAIN, URL_MARKER, value)
    value = _redact(_PATH, PATH_MARKER, value)
    value = value.replace(_URL_HOLD, URL_MARKER).replace(_PATH_HOLD, PATH_MARKER).strip()
    return _truncate(value, limit, cut)
