"""The error-text sanitizer (design §13, seed 000: normalize and redact, then truncate)."""

from __future__ import annotations

import sys
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wakuwaku
from wakuwaku import ConfigError
from wakuwaku._sanitize import (
    DEFAULT_LIMIT,
    PATH_MARKER,
    SECRET_MARKER,
    TRUNCATION_MARKER,
    URL_MARKER,
    sanitize,
)

BIDI_CONTROLS = [
    *range(0x202A, 0x202F),  # LRE RLE PDF LRO RLO
    *range(0x2066, 0x206A),  # LRI RLI FSI PDI
    0x200E,  # LRM
    0x200F,  # RLM
    0x061C,  # ALM
]
ZERO_WIDTH = [0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF]
OTHER_FORMAT = [0x00AD, 0x2061, 0xFFF9, 0xE0001, 0xE0041, 0x110BD]
C0 = [c for c in range(0x20) if chr(c) not in "\t\n\v\f\r"]
C1 = [c for c in range(0x80, 0xA0) if c != 0x85]
BREAKS = ["\t", "\n", "\v", "\f", "\r", "\r\n", "\x85", "\u2028", "\u2029"]

REMOVED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def _removed(c: str) -> bool:
    return unicodedata.category(c) in REMOVED_CATEGORIES


# -- character classes -------------------------------------------------------


@pytest.mark.parametrize("code", C0, ids=hex)
def test_c0_controls_are_removed(code: int) -> None:
    assert sanitize(f"a{chr(code)}b") == "ab"


def test_del_is_removed() -> None:
    assert sanitize("a\x7fb") == "ab"


@pytest.mark.parametrize("code", C1, ids=hex)
def test_c1_controls_are_removed(code: int) -> None:
    assert sanitize(f"a{chr(code)}b") == "ab"


@pytest.mark.parametrize("code", BIDI_CONTROLS, ids=hex)
def test_bidi_controls_are_removed(code: int) -> None:
    # The classic "Trojan Source" shape: an override that reorders what a reader sees.
    assert sanitize(f"user{chr(code)}nimda") == "usernimda"


@pytest.mark.parametrize("code", ZERO_WIDTH, ids=hex)
def test_zero_width_characters_are_removed(code: int) -> None:
    assert sanitize(f"pay{chr(code)}pal") == "paypal"


@pytest.mark.parametrize("code", OTHER_FORMAT, ids=hex)
def test_other_format_characters_are_removed(code: int) -> None:
    assert sanitize(f"x{chr(code)}y") == "xy"


@pytest.mark.parametrize("brk", BREAKS, ids=repr)
def test_line_breaks_and_tabs_become_one_space(brk: str) -> None:
    assert sanitize(f"line one{brk}line two") == "line one line two"


def test_runs_of_whitespace_collapse_and_ends_are_stripped() -> None:
    assert sanitize("\n\n  first\t\t\n  second  \x00 third \n") == "first second third"


def test_ansi_sequences_are_removed_whole() -> None:
    assert sanitize("\x1b[1;31mERROR\x1b[0m: \x1b]0;title\x07boom") == "ERROR: boom"


def test_every_format_and_control_character_of_this_python_is_covered() -> None:
    # Guards the hard-coded class against a newer Unicode database.
    leftovers = [
        hex(code)
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in {"Cc", "Cf"}
        and sanitize(f"a{chr(code)}b") != "ab"
        and chr(code) not in "\t\n\v\f\r\x85"
    ]
    assert leftovers == []


# -- decoding ----------------------------------------------------------------


def test_invalid_utf8_is_replaced() -> None:
    assert sanitize(b"caf\xc3\xa9 \xff\xfe ok \xe2\x82") == "café \ufffd\ufffd ok \ufffd"


def test_valid_utf8_bytes_round_trip() -> None:
    assert sanitize("日本語のエラー".encode()) == "日本語のエラー"


def test_lone_surrogates_in_str_are_replaced() -> None:
    out = sanitize("a\udcff\ud800b")
    assert out == "a\ufffd\ufffdb"
    out.encode("utf-8")


def test_exceptions_become_type_and_message() -> None:
    assert sanitize(ValueError("bad\nvalue")) == "ValueError: bad value"
    assert sanitize(KeyError()) == "KeyError"


def test_an_exception_whose_str_fails_is_still_reported() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert sanitize(Broken()) == "Broken: <unprintable>"


# -- redaction ---------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/a?b=c",
        "redis://user:s3cret@10.0.0.5:6379/0",
        "postgresql://app:hunter2@db.internal/prod",
        "amqp+ssl://guest:guest@mq/vhost",
        "file:///etc/shadow",
        "HTTP://EXAMPLE.COM",
    ],
)
def test_urls_are_redacted_with_their_credentials(url: str) -> None:
    assert sanitize(f"connect to {url} failed") == f"connect to {URL_MARKER} failed"


def test_a_url_hidden_by_a_zero_width_character_is_still_redacted() -> None:
    assert sanitize("see ht\u200btps://user:pw@host/x now") == f"see {URL_MARKER} now"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("open /home/alice/.ssh/id_rsa: denied", f"open {PATH_MARKER}: denied"),
        ('File "/usr/lib/python3.11/x.py", line 3', f'File "{PATH_MARKER}", line 3'),
        ("(see /etc/passwd)", f"(see {PATH_MARKER})"),
        ("path=/var/lib/app/data.db", f"path={PATH_MARKER}"),
        ("/tmp", PATH_MARKER),
        ("C:\\Users\\bob\\secrets.txt missing", f"{PATH_MARKER} missing"),
        ("d:/projects/app.ini missing", f"{PATH_MARKER} missing"),
        ("\\\\fileserver\\share\\hr\\salaries.xlsx locked", f"{PATH_MARKER} locked"),
        ("\\\\?\\C:\\very\\long\\path", PATH_MARKER),
    ],
)
def test_absolute_paths_are_redacted(text: str, expected: str) -> None:
    assert sanitize(text) == expected


@pytest.mark.parametrize(
    "text",
    ["and/or", "1/2 done", "10.0.0.0/24", "TCP/IP", "a / b", "ratio 3:/", "KeyError: 'x'"],
)
def test_text_that_is_not_a_path_is_kept(text: str) -> None:
    assert sanitize(text) == text


# -- truncation --------------------------------------------------------------


def test_short_text_is_not_truncated() -> None:
    assert sanitize("x" * DEFAULT_LIMIT) == "x" * DEFAULT_LIMIT


def test_long_text_is_cut_with_a_marker_within_the_limit() -> None:
    out = sanitize("x" * 5000, limit=100)
    assert len(out) == 100
    assert out.endswith(TRUNCATION_MARKER)


def test_truncation_counts_characters_not_bytes() -> None:
    out = sanitize("é" * 300, limit=50)
    assert out == "é" * (50 - len(TRUNCATION_MARKER)) + TRUNCATION_MARKER


@pytest.mark.parametrize("limit", [0, 1, 5, len(TRUNCATION_MARKER)])
def test_a_limit_too_small_for_the_marker_cuts_bare(limit: int) -> None:
    out = sanitize("abcdefghijklmnopqrstuvwxyz", limit=limit)
    assert out == "abcdefghijklmnopqrstuvwxyz"[:limit]


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ConfigError):
        sanitize("x", limit=-1)


SECRET_URL = "https://admin:T0pS3cr3t@internal.example.net/api/v1/keys"
SECRET_PATH = "/srv/customers/acme-corp/invoices/2024.pdf"
WINDOWS_PATH = "C:\\Users\\jdoe\\AppData\\token.json"


def _fragments(secret: str) -> list[str]:
    """Every 4-character piece of the secret, except those of the markers."""
    return sorted({secret[i : i + 4] for i in range(len(secret) - 3)})


@pytest.mark.parametrize("secret", [SECRET_URL, SECRET_PATH, WINDOWS_PATH])
def test_redaction_before_truncation_leaves_nothing_of_a_straddling_secret(secret: str) -> None:
    prefix = "error while talking to backend: "
    text = f"{prefix}{secret} and then some more words to push it past the end"
    # Cut at every position inside the secret (and around it): nothing survives.
    for limit in range(len(prefix), len(prefix) + len(secret) + len(TRUNCATION_MARKER) + 5):
        out = sanitize(text, limit=limit)
        assert len(out) <= limit
        for piece in _fragments(secret):
            assert piece not in out, (limit, out)


def test_a_marker_torn_by_the_cut_is_dropped_whole() -> None:
    text = "x" * 40 + " " + SECRET_URL + " tail " * 20
    for limit in range(40, 60):
        out = sanitize(text, limit=limit)
        body = out.removesuffix(TRUNCATION_MARKER)
        assert "<" not in body or URL_MARKER in body, out


# -- properties --------------------------------------------------------------


@given(
    text=st.one_of(st.text(), st.binary(), st.text(st.characters(codec=None))),
    limit=st.integers(min_value=0, max_value=300),
)
def test_output_is_valid_short_and_clean(text: str | bytes, limit: int) -> None:
    out = sanitize(text, limit=limit)
    assert isinstance(out, str)
    out.encode("utf-8")  # never raises: no lone surrogates
    assert len(out) <= limit
    assert not any(_removed(c) for c in out)


@given(
    before=st.integers(min_value=0, max_value=120),
    limit=st.integers(min_value=0, max_value=200),
    secret=st.sampled_from([SECRET_URL, SECRET_PATH, WINDOWS_PATH]),
)
def test_no_fragment_of_a_secret_survives_any_limit(before: int, limit: int, secret: str) -> None:
    out = sanitize("w " * before + secret + " end" * 30, limit=limit)
    assert len(out) <= limit
    for piece in _fragments(secret):
        assert piece not in out


def test_a_huge_text_is_cut_before_redaction_without_leaking_a_split_url() -> None:
    limit = 100
    scan = 4 * limit + 4096
    # A URL with a secret straddles the point where the long text is first cut.
    text = "a " * ((scan - 10) // 2) + "https://user:hunter2@db.internal/x " + "b " * 10_000_000
    out = sanitize(text, limit=limit)
    assert len(out) <= limit and out.endswith("…[truncated]")
    assert "hunter2" not in out and "https" not in out


def test_a_huge_text_after_many_urls_never_shows_a_fragment_of_the_cut_one() -> None:
    # Redaction shrinks the head a lot, so text near the first cut reaches the output.
    limit = 1000
    scan = 4 * limit + 4096
    urls = "http://x.example/" + "p" * 60 + " "
    head = urls * (scan // len(urls))
    text = head[: scan - 12] + " /home/alice/.ssh/id_rsa_secret and more " * 50_000
    out = sanitize(text, limit=limit)
    assert "alice" not in out and "/ho" not in out
    assert out.endswith("…[truncated]") and len(out) <= limit


@pytest.mark.parametrize("make", [str, lambda t: t.encode(), ValueError])
def test_a_huge_message_keeps_its_head(make: Any) -> None:
    out = sanitize(make("start " + "x" * 30_000_000), limit=50)
    assert out.startswith(("start", "ValueError: start")) and out.endswith("…[truncated]")


@pytest.mark.parametrize(
    "text",
    [
        "\x1b[/home/alice/.ssh/id_rsa",
        "see \x1b[0 /home/alice/x",
        "open \x1b[ C:\\Users\\alice\\key",
        "\x1b[31mhttps://alice:pw@db/x\x1b[0m",
    ],
)
def test_an_escape_sequence_that_swallows_the_start_of_a_path_hides_nothing(text: str) -> None:
    out = sanitize(text)
    assert "alice" not in out, out


@pytest.mark.parametrize("padding", [" " * 5000, "\x1b[0m" * 1200, "\n" * 4600, "\u200b" * 9000])
def test_padding_that_cleans_away_does_not_hide_the_message_behind_it(padding: str) -> None:
    assert sanitize(padding + "Error: disk full", 100) == "Error: disk full"


def test_an_integral_float_limit_is_accepted_and_other_limits_are_refused() -> None:
    assert sanitize("short", 10.0) == "short"  # type: ignore[arg-type]
    for bad in (1.5, "10", True, -1):
        with pytest.raises(ConfigError, match="limit"):
            sanitize("short", bad)  # type: ignore[arg-type]


# -- credentials -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A leak seen in real text: a libpq connection string in a driver's message.
        (
            "connection to 'host=db user=app password=Hunter2Secret dbname=x' failed",
            f"connection to 'host=db user=app password={SECRET_MARKER} dbname=x' failed",
        ),
        ("Authorization: Bearer eyJabc.def-ghi_jkl", f"Authorization: Bearer {SECRET_MARKER}"),
        ("authorization: basic dXNlcjpwYXNz", f"authorization: basic {SECRET_MARKER}"),
        (
            "Proxy-Authorization: Token 0123456789abcdef ok",
            f"Proxy-Authorization: Token {SECRET_MARKER} ok",
        ),
        (
            'Authorization: Digest username="a", response="6629fae49393a0" ok',
            f'Authorization: Digest {SECRET_MARKER}" ok',
        ),
        ("Authorization: sk-live-key1234 refused", f"Authorization: {SECRET_MARKER}"),
        ("sent bearer abcdefgh12345678 to the api", f"sent bearer {SECRET_MARKER} to the api"),
        ("PASSWORD=Hunter2 USER=bob", f"PASSWORD={SECRET_MARKER} USER=bob"),
        ("passwd: letmein", f"passwd: {SECRET_MARKER}"),
        ("pwd = s3cr3t;", f"pwd = {SECRET_MARKER};"),
        ("MYSQL_PWD=s3cr3t", f"MYSQL_PWD={SECRET_MARKER}"),
        ("client_secret=abc123XYZ&x", f"client_secret={SECRET_MARKER}"),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG", f"AWS_SECRET_ACCESS_KEY={SECRET_MARKER}"),
        ("X-Api-Key: 9f8e7d6c", f"X-Api-Key: {SECRET_MARKER}"),
        ("apikey=9f8e7d6c ApiKey=zz99", f"apikey={SECRET_MARKER} ApiKey={SECRET_MARKER}"),
        (
            "access_token=ya29.a0AfH6 refresh_token=1//0gabc",
            f"access_token={SECRET_MARKER} refresh_token={SECRET_MARKER}",
        ),
        ("private_key: MIIEvQIBADAN", f"private_key: {SECRET_MARKER}"),
        (
            '{"password": "my pass phrase", "user": "x"}',
            f'{{"password": "{SECRET_MARKER}", "user": "x"}}',
        ),
        ("{'api_key': 'abc def', 'n': 1}", f"{{'api_key': '{SECRET_MARKER}', 'n': 1}}"),
        ("secret=“quoted value”", f"secret=“{SECRET_MARKER}”"),
        ("pass\u200bword=Hunter2 ok", f"password={SECRET_MARKER} ok"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl done", f"jwt {SECRET_MARKER} done"),
        ("key id AKIAIOSFODNN7EXAMPLE denied", f"key id {SECRET_MARKER} denied"),
        ("temp ASIAY34FZKBOKMUTVV7A.", f"temp {SECRET_MARKER}."),
        ("gh ghp_" + "a1B2" * 9 + " x", f"gh {SECRET_MARKER} x"),
        ("slack xoxb-1234567890-abcdef", f"slack {SECRET_MARKER}"),
        ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", f"stripe {SECRET_MARKER}"),
        ("google AIzaSyA-1234567890abcdefghijklmnopqrstu", f"google {SECRET_MARKER}"),
        (
            "-----BEGIN RSA PRIVATE KEY----- MIIEpAIB qsd -----END RSA PRIVATE KEY----- after",
            f"{SECRET_MARKER} after",
        ),
        ("-----BEGIN PRIVATE KEY----- MIIEpAIB cut", SECRET_MARKER),
    ],
)
def test_credentials_are_redacted(text: str, expected: str) -> None:
    assert sanitize(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "wrong password for user bob",
        "token expired",
        "author: bob",
        "a design: plain",
        'password authentication failed for user "app"',
        "KeyError: 'token'",
        "bypass: yes",
    ],
)
def test_text_that_names_a_secret_without_giving_one_is_kept(text: str) -> None:
    assert sanitize(text) == text


def test_a_credential_in_a_handler_error_never_reaches_the_stored_text() -> None:
    error = RuntimeError(
        "connection to 'host=db user=app password=Hunter2Secret dbname=x' "
        "failed; Authorization: Bearer abc.def.ghi"
    )
    out = sanitize(error)
    assert "Hunter2" not in out and "abc.def" not in out
    assert out.startswith("RuntimeError: connection to 'host=db user=app password=")


# -- paths wherever they start -----------------------------------------------


@pytest.mark.parametrize("opener", ["`", "‘", "“", "<", "@", "#", "*", "'", '"', "(", "=", "|"])
def test_a_unix_path_is_found_after_any_punctuation(opener: str) -> None:
    out = sanitize(f"failed to read {opener}/home/bob/.ssh/id_rsa")
    assert "bob" not in out and "id_rsa" not in out and PATH_MARKER in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("failed to read `/home/bob/.ssh/id_rsa`", f"failed to read `{PATH_MARKER}`"),
        ("see ‘/home/bob/x’ and “/etc/y”", f"see ‘{PATH_MARKER}’ and “{PATH_MARKER}”"),
        ("open C:\\Program Files\\App\\secret.txt failed", f"open {PATH_MARKER} failed"),
        ("open 'C:\\Program Files\\My App\\x y.txt' failed", f"open '{PATH_MARKER}' failed"),
        ('at "\\\\srv\\share\\hr files\\pay roll.xlsx"', f'at "{PATH_MARKER}"'),
        ("key ~/.ssh/id_rsa missing", f"key {PATH_MARKER} missing"),
        ("home ~bob/notes.txt", f"home {PATH_MARKER}"),
        ("<html>502 Bad Gateway</html>", "<html>502 Bad Gateway</html>"),
    ],
)
def test_paths_are_redacted_wherever_they_start(text: str, expected: str) -> None:
    assert sanitize(text) == expected


# -- the property ------------------------------------------------------------

# Characters a secret can follow or be followed by in real text; the leaks
# found came from the ones the old patterns did not expect.
_BEFORE = [
    " ",
    "'",
    '"',
    "`",
    "‘",
    "“",
    "<",
    "@",
    "#",
    "*",
    "(",
    "[",
    "{",
    "=",
    ":",
    ",",
    "|",
    "\n",
    "\t",
    ">",
]
_AFTER = [" ", "\n", "\t", ", ", "; ", ". ", ""]
_FILLER = st.text(
    st.sampled_from(list("abcdefghijkl mnopqrstuvwxyz ,.;!?()-_=:'\"<>\u200b\n")), max_size=25
)
_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_WORD = st.text(st.sampled_from(list(_ALNUM)), min_size=4, max_size=12)
_VALUE_CHARS = list(_ALNUM + "+/_!@$%^&*.-~")
_KEYS = [
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "api-key",
    "access_key",
    "private_key",
    "client_secret",
    "credentials",
    "session_id",
    "passphrase",
]


def _case(draw: Any, word: str) -> str:
    choice: str = draw(st.sampled_from([word, word.upper(), word.title()]))
    return choice


Shape = tuple[str, str, str]
"""``(visible prefix, secret, visible suffix)``: only ``secret`` must not survive."""


def _url(draw: Any, words: list[str]) -> Shape:
    scheme = draw(st.sampled_from(["https", "postgresql", "redis", "amqp+ssl"]))
    return "", f"{scheme}://{words[0]}:{words[1]}@db.internal/{'/'.join(words[2:])}", ""


def _windows(draw: Any, words: list[str]) -> Shape:
    # Unquoted, spaces only in directory names (a separator follows them).
    return "", f"C:\\{' '.join(words[:-1])}\\{words[-1]}.txt", ""


def _windows_quoted(draw: Any, words: list[str]) -> Shape:
    quote, close = draw(st.sampled_from([("'", "'"), ('"', '"'), ("“", "”")]))
    return quote, f"D:\\{words[0]}\\{' '.join(words[1:])}.txt", close


def _key_value(draw: Any, words: list[str]) -> Shape:
    key = draw(st.sampled_from(["", "db_", "X-", "AWS_", "my."])) + _case(
        draw, draw(st.sampled_from(_KEYS))
    )
    if draw(st.booleans()):  # quoted, as JSON or a Python repr prints it
        quote = draw(st.sampled_from(["'", '"']))
        sep = draw(st.sampled_from([": ", ":", "=", " = "]))
        return f"{quote}{key}{quote}{sep}{quote}", " ".join(words), quote
    sep = draw(st.sampled_from(["=", ": ", ":", " = ", "\t=\t"]))
    return key + sep, draw(st.text(st.sampled_from(_VALUE_CHARS), min_size=4, max_size=24)), ""


def _authorization(draw: Any, words: list[str]) -> Shape:
    scheme = draw(st.sampled_from(["Bearer", "Basic", "Token", "bearer"]))
    token = draw(st.text(st.sampled_from(_VALUE_CHARS), min_size=4, max_size=40))
    return f"{_case(draw, 'authorization')}: {scheme} ", token, ""


def _bearer(draw: Any, words: list[str]) -> Shape:
    alphabet = st.sampled_from(list("abcdefXYZ0123456789._-"))
    return "Bearer ", draw(st.text(alphabet, min_size=8, max_size=40)), ""


def _aws(draw: Any, words: list[str]) -> Shape:
    alphabet = st.sampled_from(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"))
    tail = draw(st.text(alphabet, min_size=16, max_size=16))
    return "", draw(st.sampled_from(["AKIA", "ASIA"])) + tail, ""


_SHAPES: dict[str, Any] = {
    "url": _url,
    "posix": lambda draw, words: ("", "/" + "/".join(words), ""),
    "home": lambda draw, words: ("", "~/" + "/".join(words), ""),
    "windows": _windows,
    "windows_quoted": _windows_quoted,
    "unc": lambda draw, words: ("", "\\\\" + "\\".join(words), ""),
    "key_value": _key_value,
    "authorization": _authorization,
    "bearer": _bearer,
    "jwt": lambda draw, words: ("", f"eyJ{words[0]}.eyJ{words[1]}.{''.join(words[2:])}", ""),
    "aws": _aws,
    "github": lambda draw, words: ("", "ghp_" + "".join(words) * 4, ""),
    "pem": lambda draw, words: (
        "",
        f"-----BEGIN PRIVATE KEY----- {' '.join(words)} -----END PRIVATE KEY-----",
        "",
    ),
}


@st.composite
def _secret_shapes(draw: Any) -> Shape:
    """One credential, URL or path as it appears in error text."""
    make = _SHAPES[draw(st.sampled_from(sorted(_SHAPES)))]
    shape: Shape = make(draw, draw(st.lists(_WORD, min_size=2, max_size=4)))
    return shape


_MARKERS = URL_MARKER + PATH_MARKER + SECRET_MARKER + TRUNCATION_MARKER
PROPERTY_EXAMPLES = 400
"""Hypothesis examples of the property below; each is cut at every length, so
it makes ``len(text) + 2`` sanitize calls: 400 examples, 20 168 calls in one
run; 6 000 examples (about 300 000 calls) passed once by hand."""


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None)
@given(
    before=_FILLER,
    opener=st.sampled_from(_BEFORE),
    shape=_secret_shapes(),
    closer=st.sampled_from(_AFTER),
    after=_FILLER,
    zero_width=st.integers(min_value=-1),
)
def test_no_piece_of_a_secret_survives_in_random_text_at_any_cut(
    before: str,
    opener: str,
    shape: tuple[str, str, str],
    closer: str,
    after: str,
    zero_width: int,
) -> None:
    visible, secret, visible_end = shape
    if not closer:  # "" stands for the end of the text
        after = ""
    hidden = secret
    if zero_width >= 0:  # a zero-width character inside the secret must not hide it
        at = zero_width % (len(secret) + 1)
        hidden = secret[:at] + "\u200b" + secret[at:]
    text = before + opener + visible + hidden + visible_end + closer + after
    # Pieces that also occur outside the secret may legitimately be printed.
    elsewhere = before + opener + visible + " " + visible_end + closer + after + _MARKERS
    elsewhere = elsewhere.replace("\n", " ").replace("\t", " ").replace("\u200b", "")
    pieces = [p for p in _fragments(secret) if p not in elsewhere]
    for limit in range(len(text) + 2):
        out = sanitize(text, limit=limit)
        assert len(out) <= limit
        leaked = [p for p in pieces if p in out]
        assert not leaked, (limit, text, out, leaked)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://u:S3cret@127.0.0.1:6379/0?x=1", "redis://***@127.0.0.1:6379/0?x=1"),
        ("nats://tok@h:4222", "nats://***@h:4222"),
        ("kafka://a:p@w@h1:9092,h2:9092", "kafka://***@h1:9092,h2:9092"),
        ("postgresql://u:pw@db/x?a=b@c", "postgresql://***@db/x?a=b@c"),
        ("sqlite:///dir@x/log.db", "sqlite:///dir@x/log.db"),
        ("memory://u:S3cret@x", "memory://***@x"),
        ("no scheme@all", "no scheme@all"),
        ("iggy://h:8090?stream=s&token=S3cret&tls=1", "iggy://h:8090?stream=s&token=***&tls=1"),
        ("iggy://u:p@h:8090?tok%65n=S3cret#x", "iggy://***@h:8090?tok%65n=***#x"),
        ("x://h/p?db_password=S3cret&api_key=k&a=b", "x://h/p?db_password=***&api_key=***&a=b"),
    ],
)
def test_redact_url_drops_the_user_information_and_secret_options_only(
    url: str, shown: str
) -> None:
    assert wakuwaku.redact_url(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:S3cret@127.0.0.1:6379/0?bogus=1",
        "redis://u:S3cret@127.0.0.1:6379/0?prefix=a&prefix=b",
        "nats://u:S3cret@127.0.0.1:4222?bogus=1",
        "kafka://u:S3cret@127.0.0.1:9092?bogus=1",
        "kafka://u:S3cret@127.0.0.1:9092?transactions=maybe",
        "memory://u:S3cret@x",
        "amqp://u:S3cret@host",
        "redis://u:S3cret@h?a&b#frag",
    ],
)
def test_no_log_url_error_echoes_its_password(url: str) -> None:
    # One parser for every scheme: each of its errors shows the URL redacted.
    from wakuwaku.logs import open_log

    with pytest.raises(ConfigError) as info:
        open_log(url)
    assert "S3cret" not in str(info.value) and "***@" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "nats://127.0.0.1:99999",
        "nats://127.0.0.1:0",
        "nats://:4222",
        "nats://h:4222,",
        "nats://u:pw@",
        "kafka://127.0.0.1:99999",
        "kafka://u:pw@:9092",
        "kafka://h1:9092,,h2:9092",
        "kafka://host",
    ],
)
def test_a_server_list_with_a_bad_host_or_port_is_one_clear_error(url: str) -> None:
    from wakuwaku.logs import open_log

    with pytest.raises(ConfigError, match=r"bad (NATS|Kafka) log URL"):
        open_log(url)


@given(st.text(max_size=1500), st.integers(min_value=0, max_value=300))
@settings(max_examples=200)
def test_a_remembered_result_is_the_result_of_sanitizing_the_text(text: str, limit: int) -> None:
    # Short texts are sanitized once and remembered: a repeat, with
    # the same or another limit, gives what sanitizing that text gives.
    from wakuwaku._sanitize import _as_text, _sanitize

    assert sanitize(text, limit) == _sanitize(text, limit)
    assert sanitize(text, limit) == _sanitize(text, limit)
    assert sanitize(text, limit + 1) == _sanitize(text, limit + 1)
    assert sanitize(ValueError(text), limit) == _sanitize(_as_text(ValueError(text)), limit)
