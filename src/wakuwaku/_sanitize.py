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
"""Characters read past ``4 * limit``: a longer text is cut there first."""


def _scan_length(limit: int) -> int:
    return 4 * limit + _SCAN_MARGIN


def _precut(value: str, limit: int) -> tuple[str, bool]:
    """Cut a text far longer than ``limit`` before the regexes run over it.

    The cut backs up to the last whitespace, so a URL or path the cut would
    split is dropped whole rather than left as a fragment the redaction no
    longer recognises (seed 000's bug, the other way round). A head without
    whitespace is one token from its start, which the redaction sees whole.
    """
    scan = _scan_length(limit)
    if len(value) <= scan:
        return value, False
    head = value[:scan]
    space = max(head.rfind(" "), head.rfind("\t"), head.rfind("\n"), head.rfind("\r"))
    return (head[:space] if space > 0 else head), True


def _as_text(value: str | bytes | BaseException, limit: int) -> str:
    if isinstance(value, BaseException):
        name = type(value).__name__
        try:
            message = str(value)
        except Exception:  # noqa: BLE001 - a broken __str__ must not break error reporting
            message = "<unprintable>"
        text = f"{name}: {message}" if message else name
        # A lone surrogate cannot be encoded.
        return _SURROGATES.sub("\ufffd", text[: _scan_length(limit) + 1])
    if isinstance(value, bytes):
        # At most 4 bytes a character: decoding more could not reach the output.
        return value[: 4 * _scan_length(limit) + 4].decode("utf-8", errors="replace")
    return _SURROGATES.sub("\ufffd", value[: _scan_length(limit) + 1])


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
        :data:`TRUNCATION_MARKER` (unless ``limit`` is too small to hold it,
        then the cut is bare).
    :returns: one line of printable text without control, bidi or zero-width
        characters, with URLs replaced by :data:`URL_MARKER` and absolute
        paths by :data:`PATH_MARKER`; always encodable as UTF-8.
    :raises ConfigError: when ``limit`` is negative.

    Redaction runs before truncation, so a URL or path straddling the limit is
    replaced whole and no fragment of it survives (the postmortem's "truncate
    first and half a path no longer matches" bug). Only a text longer than
    ``4 * limit + 4096`` characters is cut before redaction, at whitespace,
    dropping the token the cut falls in; so a 20 MB message costs what its
    first few kilobytes cost.
    """
    if limit < 0:
        raise ConfigError(f"sanitize limit must be >= 0, got {limit}")
    value, cut = _precut(_as_text(text, limit), limit)
    value = _ANSI.sub("", value)
    value = _LINE_BREAKS.sub(" ", value)
    value = _REMOVED.sub("", value)
    value = _SPACES.sub(" ", value)
    value = _redact(_URL, URL_MARKER, value)
    value = _redact(_PATH, PATH_MARKER, value)
    value = value.strip()
    return _truncate(value, limit, cut)
