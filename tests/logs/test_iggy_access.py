"""How an :class:`~wakuwaku.logs.iggy.IggyLog` reaches its server: TLS and personal access tokens.

The URL options (``tls``, ``tls_ca_file``, ``tls_domain``, ``token``) and
``WAKUWAKU_IGGY_TOKEN``, checked without a server; a personal access token
made on the shared server for one test (and deleted after it); TLS against
a private server started with a certificate this test makes.
"""

from __future__ import annotations

import struct
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from apache_iggy import IggyClient

from wakuwaku import ConfigError, LogError, LogUnavailableError, open_log
from wakuwaku.logs.iggy import PASSWORD_ENV, TLS, TOKEN_ENV, USERNAME_ENV, IggyLog

from ..conftest import IGGY_URL
from ..faults.servers import IggyServer, require_binary
from ..iggy_support import IGGY_ADDRESS, drop_stream, fresh_stream

SECRET = "S3CRET-tok3n"
PASSWORD = "pa55-w0rd"

_CREATE_PAT = 42
_DELETE_PAT = 43
"""Iggy's binary command codes for personal access tokens (apache-iggy 0.9.0
does not wrap them): a name (length byte, UTF-8), then for a new token its
expiry (u64, microseconds); the answer is the token (length byte, text)."""


def _name(text: str) -> bytes:
    raw = text.encode()
    return bytes((len(raw),)) + raw


def _shown(log: IggyLog) -> str:
    return f"{log.url} {log!r} {log.tls!r}"


# -- the URL, without a server --------------------------------------------------


def test_tls_options_round_trip_through_url_and_the_token_never_shows(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read before a connection")
    log = open_log(
        f"iggy://127.0.0.1:8090?stream=s&token={SECRET}&tls=1&tls_ca_file={ca}"
        "&tls_domain=iggy.example"
    )
    assert isinstance(log, IggyLog)
    assert log.tls == TLS(str(ca), "iggy.example")
    assert log._server.token == SECRET
    assert (
        log.url == f"iggy://127.0.0.1:8090?stream=s&tls=1&tls_ca_file={ca}&tls_domain=iggy.example"
    )
    assert SECRET not in _shown(log)
    again = open_log(log.url)
    assert isinstance(again, IggyLog)
    assert (again.url, again.tls) == (log.url, log.tls)
    # TLS with the system's roots and the host's name: tls=1 alone.
    plain = IggyLog.from_url("iggy://127.0.0.1:8090?tls=true")
    assert (plain.tls, plain.url) == (TLS(), "iggy://127.0.0.1:8090?tls=1")
    assert IggyLog.from_url("iggy://127.0.0.1:8090?tls=0").tls is None


def test_the_token_comes_from_the_environment_unless_the_url_names_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    log = IggyLog.from_url("iggy://127.0.0.1:8090?stream=s")
    assert log._server.token == SECRET
    assert SECRET not in _shown(log)
    given = IggyLog.from_url(f"iggy://alice:{PASSWORD}@127.0.0.1:8090")
    assert (given._server.token, given._password) == (None, PASSWORD)
    assert IggyLog.from_url("iggy://127.0.0.1:8090?token=other")._server.token == "other"
    # A token and a password both from the environment: which one was meant?
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    with pytest.raises(ConfigError, match=f"both {TOKEN_ENV} and {PASSWORD_ENV}") as caught:
        IggyLog.from_url("iggy://127.0.0.1:8090")
    assert SECRET not in str(caught.value) and PASSWORD not in str(caught.value)
    monkeypatch.delenv(TOKEN_ENV)
    assert IggyLog.from_url("iggy://127.0.0.1:8090")._server.token is None


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("tls_ca_file=/etc/hosts", "tls_ca_file needs tls=1"),
        ("tls=0&tls_domain=x.example", "tls_domain needs tls=1"),
        ("tls=1&tls_ca_file=/no/such/ca.pem", "tls_ca_file '/no/such/ca.pem' is not a file"),
        ("tls=1&tls_ca_file=", "tls_ca_file '' is not a file"),
        ("tls=1&tls_domain=", "tls_domain is empty"),
        ("tls=maybe", "tls must be 1/0"),
        ("tls_validate_certificate=0", "unknown option 'tls_validate_certificate'"),
        (f"token={SECRET}", "option 'token' is given twice"),
        ("timeout=0", "timeout must be seconds"),
    ],
)
def test_a_bad_option_is_refused_by_name_without_the_token(query: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        open_log(f"iggy://127.0.0.1:8090?token={SECRET}&{query}")
    assert SECRET not in str(caught.value)


def test_a_token_with_a_user_or_password_or_an_empty_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="option 'token' logs in instead of") as caught:
        open_log(f"iggy://alice:{PASSWORD}@127.0.0.1:8090?token={SECRET}")
    assert SECRET not in str(caught.value) and PASSWORD not in str(caught.value)
    with pytest.raises(ConfigError, match=r"token\) is empty"):
        open_log("iggy://127.0.0.1:8090?token=")
    # An unencoded '+' of a base64 token reads as a space: said, not sent.
    with pytest.raises(ConfigError, match="must be written %2B") as caught:
        open_log("iggy://127.0.0.1:8090?token=ab+cd/ef=")
    assert "cd/ef" not in str(caught.value)
    for user, password in ((None, PASSWORD), ("alice", None)):
        with pytest.raises(ConfigError, match="not both") as caught:
            IggyLog(token=SECRET, username=user, password=password)
        assert SECRET not in str(caught.value) and PASSWORD not in str(caught.value)
    with pytest.raises(ConfigError, match=r"tls is a wakuwaku\.logs\.iggy\.TLS"):
        IggyLog(tls=True)  # type: ignore[arg-type]


# -- a personal access token on the shared server --------------------------------


@pytest.fixture
async def token() -> AsyncIterator[str]:
    """A personal access token of the shared server's root user, deleted after the test."""
    admin = IggyClient.from_connection_string(IGGY_URL)
    await admin.connect()
    name = f"wkt-{uuid.uuid4().hex[:12]}"
    # It expires by itself in 10 minutes should the deletion below not run.
    raw = await admin.send_binary_request(_CREATE_PAT, _name(name) + struct.pack("<Q", 600_000_000))
    try:
        yield raw[1 : 1 + raw[0]].decode()
    finally:
        await admin.send_binary_request(_DELETE_PAT, _name(name))


@pytest.mark.iggy
async def test_a_personal_access_token_opens_the_log(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = fresh_stream()
    # Iggy's tokens are base64: '+' and '/' are percent-encoded in a URL.
    log = IggyLog.from_url(f"iggy://{IGGY_ADDRESS}?stream={stream}&token={quote(token, safe='')}")
    other: IggyLog | None = None
    try:
        await log.create_topic("orders", 2)
        assert await log.append("orders", 1, [({"wk-key": b"k"}, b"one")]) == [0]
        assert [r.body for r in await log.read("orders", 1, 0)] == [b"one"]
        assert token not in _shown(log)
        # Another process opens log.url and takes the token from its environment.
        monkeypatch.setenv(TOKEN_ENV, token)
        monkeypatch.delenv(PASSWORD_ENV, raising=False)
        monkeypatch.delenv(USERNAME_ENV, raising=False)
        other = open_log(log.url)  # type: ignore[assignment]
        assert isinstance(other, IggyLog) and other._server.token == token
        assert [r.body for r in await other.read("orders", 1, 0)] == [b"one"]
    finally:
        await log.close()
        if other is not None:
            await other.close()
        await drop_stream(stream)


async def refused_login(url: str, match: str) -> LogError:
    """The error a log opened on ``url`` raises at its first call (matching
    ``match``): refused, not unavailable, since trying again does not help."""
    log = IggyLog.from_url(url)
    try:
        with pytest.raises(LogError, match=match) as caught:
            await log.list_topics()
    finally:
        await log.close()
    assert not isinstance(caught.value, LogUnavailableError)
    return caught.value


@pytest.mark.iggy
async def test_a_refused_token_is_a_log_error_that_does_not_show_it() -> None:
    url = f"iggy://{IGGY_ADDRESS}?stream={fresh_stream()}&token={SECRET}"
    refused = await refused_login(url, "Invalid personal access token")
    assert SECRET not in str(refused)


@pytest.mark.iggy
async def test_a_login_refused_for_want_of_a_password_says_where_one_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no password in the URL nor the environment, the server's answer
    ("Invalid credentials") alone did not say that none was given."""
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    none = await refused_login(f"iggy://{IGGY_ADDRESS}?stream={fresh_stream()}", "no password")
    assert PASSWORD_ENV in str(none) and "iggy://user:password@" in str(none)
    # A password that was given and is wrong is the server's answer alone.
    url = f"iggy://iggy:wrong@{IGGY_ADDRESS}?stream={fresh_stream()}"
    wrong = await refused_login(url, r"Invalid (password|credentials)")
    assert "no password was given" not in str(wrong)


# -- TLS on a private server ----------------------------------------------------


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(CA, server certificate, server key) PEM files: a CA of its own signs a
    certificate for ``localhost`` and ``127.0.0.1``.

    Not one self-signed certificate: ``openssl req -x509`` marks it a CA,
    and the client's validation refused it as the server's certificate
    even with itself as ``tls_ca_file`` (a CA is no end-entity certificate).
    """
    openssl = require_binary("openssl", "apt-get install openssl")
    folder.mkdir()
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, csr = folder / "server.pem", folder / "server.key", folder / "server.csr"
    extensions = folder / "server.ext"
    extensions.write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
        "basicConstraints=CA:FALSE\n"
        "extendedKeyUsage=serverAuth\n"
    )
    new_key = ["-newkey", "rsa:2048", "-nodes"]
    make_ca = ["req", "-x509", *new_key, "-days", "2", "-keyout", ca_key, "-out", ca]
    request = ["req", *new_key, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"]
    sign = ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial"]
    sign += ["-out", cert, "-days", "2", "-extfile", extensions]
    for args in ([*make_ca, "-subj", "/CN=wakuwaku test CA"], request, sign):
        subprocess.run([openssl, *map(str, args)], check=True, capture_output=True, timeout=60)
    return ca, cert, key


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[IggyServer, Path]]:
    """A private Iggy server whose TCP listener speaks TLS only, and its CA file."""
    ca, cert, key = _certificates(tmp_path / "certs")
    server = IggyServer(tmp_path / "server", tls=(cert, key))
    server.start()
    try:
        yield server, ca
    finally:
        server.close()


@pytest.mark.iggy
@pytest.mark.slow
async def test_tls_connects_with_the_servers_ca_and_validation_refuses_the_rest(
    tls_server: tuple[IggyServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, ca = tls_server
    base = f"iggy://iggy:iggy@127.0.0.1:{server.port}?timeout=10"
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    log = IggyLog.from_url(f"{base}&tls=1&tls_ca_file={ca}")
    try:
        await log.create_topic("orders", 1)
        assert await log.append("orders", 0, [({"wk-key": b"k"}, b"sealed")]) == [0]
        assert [r.body for r in await log.read("orders", 0, 0)] == [b"sealed"]
    finally:
        await log.close()
    # The name the certificate carries, said: connects too.
    named = IggyLog.from_url(f"{base}&tls=1&tls_ca_file={ca}&tls_domain=localhost")
    try:
        assert [t.name for t in await named.list_topics()] == ["orders"]
    finally:
        await named.close()
    # The right user and password each time: only TLS can refuse these.
    for refused in (
        "&tls=1",  # the system's roots do not know the test's CA
        f"&tls=1&tls_ca_file={ca}&tls_domain=iggy.example",  # not the certificate's name
        "",  # plain TCP to a TLS listener
    ):
        log = IggyLog.from_url(base + refused)
        try:
            with pytest.raises(
                LogError, match=r"Cannot establish connection|Disconnected"
            ) as caught:
                await log.list_topics()
        finally:
            await log.close()
        assert "iggy:iggy" not in str(caught.value), refused
