"""The dashboard over HTTP (Starlette's TestClient): what each page shows, on
every log a dashboard can read, and its security rules."""

from __future__ import annotations

import asyncio
import base64
import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from wakuwaku import ConfigError
from wakuwaku.admin import list_dead_letters, purge_dead_letters, replay_dead_letters
from wakuwaku.cli import ExitCode, main
from wakuwaku.dashboard import DashboardSettings, Target, View, create_app
from wakuwaku.dashboard._app import shown_url
from wakuwaku.dashboard._sampler import Sample
from wakuwaku.logs import open_log

from .kit import (
    CONFIGURED,
    DEAD,
    GROUP,
    SCRIPT_KEY,
    STUCK,
    TOPIC,
    build,
    log_urls,
    purge,
    url_for,
)

PAGE = f"/topic/{TOPIC}/group/{GROUP}"


@pytest.fixture(params=log_urls())
def built(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = url_for(request.param, tmp_path)
    asyncio.run(build(url))
    yield url
    asyncio.run(purge(request.param, url))


BASE = "http://127.0.0.1:8765"
"""Where the test client says it sends its requests: a name the dashboard answers."""


def client(url: str, **settings: object) -> TestClient:
    options: dict[str, object] = {"interval": 3600.0}
    options.update(settings)
    app = create_app(DashboardSettings(url, **options))  # type: ignore[arg-type]
    return TestClient(app, base_url=BASE)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrftoken" value="([^"]+)"', html)
    assert found is not None, "the page has no CSRF field"
    return found.group(1)


async def _ends(url: str, topic: str) -> dict[int, int]:
    log = open_log(url)
    try:
        return await log.end_offsets(topic)
    finally:
        await log.close()


def ends(url: str, topic: str = TOPIC) -> int:
    """The topic's summed end offsets (in a thread of its own: a browser test's
    thread runs Playwright's event loop)."""
    with ThreadPoolExecutor(1) as pool:
        return sum(pool.submit(asyncio.run, _ends(url, topic)).result().values())


def test_pages_show_partitions_quarantined_keys_and_dead_letters(built: str) -> None:
    with client(built) as http:
        index = http.get("/")
        assert index.status_code == 200
        assert f'href="{PAGE}"' in index.text
        page = http.get(PAGE)
        assert page.status_code == 200
        text = page.text
        assert re.search(rf'id="dead-count">{DEAD}<', text)
        assert re.search(r'id="quarantined-count">1<', text)
        assert re.search(r'id="lag">0<', text)
        # the quarantined key with its attempt, pending records and first error
        row = re.search(r'<table id="quarantined">.*?</table>', text, re.S)
        assert row is not None
        assert f"<code>{STUCK}</code>" in row.group(0)
        assert "order 3: row locked" in row.group(0)
        assert re.search(r'<td class="num">2</td>\s*<td>', row.group(0))  # pending
        # dead letters per reason, and both partitions' rows
        assert re.search(rf'unrecoverable</a></td><td class="num">{DEAD}<', text)
        assert (
            text.count('<td class="num">0</td>\n  <td>')
            + text.count('<td class="num">1</td>\n  <td>')
            >= 2
        )
        # the live part alone, for the polling script
        partial = http.get(PAGE, headers={"X-Wakuwaku-Partial": "1"})
        assert (
            partial.text.lstrip().startswith('<div id="live">')
            or 'id="live"' in (partial.text[:300])
        )
        assert "<html" not in partial.text


@pytest.mark.parametrize("kind", log_urls())
def test_configured_topic_names_are_read_and_never_shown_as_topics(
    kind: str, tmp_path: Path
) -> None:
    """design §6: the dashboard finds a group's configured retry and dead-letter
    topics where its consumer noted them, and does not list them as main topics."""
    url = url_for(kind, tmp_path)
    try:
        asyncio.run(build(url, **CONFIGURED))
        with client(url) as http:
            index = http.get("/")
            shown = {
                link.split("/")[2] for link in re.findall(r'href="(/topic/[^"]+)"', index.text)
            }
            assert shown == {TOPIC}
            text = http.get(PAGE).text
            assert re.search(rf'id="dead-count">{DEAD}<', text)
            assert re.search(r'id="quarantined-count">1<', text)
            assert "order 3: row locked" in text  # the first error, read from orders-retry
            letters = http.get(f"{PAGE}/dead-letters").text
            assert re.search(rf'id="found-count">{DEAD}<', letters)
            link = re.search(r'href="(/topic/[^"]+/dead-letters/\d+/\d+)"', letters)
            assert link is not None
            assert http.get(link.group(1)).status_code == 200  # read from orders-dlt
    finally:
        asyncio.run(purge(kind, url))


def test_owners_are_shown_from_the_leases(built: str) -> None:
    async def hold() -> int:
        log = open_log(built)
        try:
            lease = await log.acquire_partition(GROUP, TOPIC, 1, "worker-a", ttl=600.0)
            assert lease is not None
            return lease.generation
        finally:
            await log.close()

    generation = asyncio.run(hold())
    with client(built) as http:
        text = http.get(PAGE).text
    rows = re.findall(r"<tr>\s*<td class=\"num\">(\d)</td>\s*<td>(.*?)</td>", text, re.S)
    owners = {int(p): cell for p, cell in rows[:2]}
    assert "worker-a" in owners[1] and f"gen {generation}," in owners[1]
    assert "none" in owners[0]


def test_dead_letters_filter_by_key_and_reason_and_render_markup_as_text(built: str) -> None:
    with client(built) as http:
        every = http.get(f"{PAGE}/dead-letters")
        assert re.search(rf'id="found-count">{DEAD}<', every.text)
        one = http.get(f"{PAGE}/dead-letters", params={"key": SCRIPT_KEY})
        assert re.search(r'id="found-count">1<', one.text)
        assert "<script>alert" not in one.text
        assert "&lt;script&gt;alert(&#34;key&#34;)&lt;/script&gt;" in one.text
        poison = http.get(f"{PAGE}/dead-letters", params={"key": "k-poison"})
        assert re.search(r'id="found-count">2<', poison.text)
        none = http.get(f"{PAGE}/dead-letters", params={"reason": "gave_up_retry"})
        assert re.search(r'id="found-count">0<', none.text)
        later = http.get(f"{PAGE}/dead-letters", params={"since": "2999-01-01T00:00"})
        assert re.search(r'id="found-count">0<', later.text)
        bad = http.get(f"{PAGE}/dead-letters", params={"since": "yesterday"})
        assert bad.status_code == 400 and "not a time" in bad.text
        link = re.search(r'href="(/topic/[^"]+/dead-letters/\d+/\d+)"', one.text)
        assert link is not None
        record = http.get(link.group(1))
        assert record.status_code == 200
        assert "<script>" not in record.text.replace('<script nonce="', "")
        assert "&lt;img src=x onerror=alert(1)&gt;" in record.text  # the body, escaped
        assert "&lt;b&gt;bad&lt;/b&gt;" in record.text  # the error, escaped
        assert "wk-reason" in record.text  # the headers
        csp = record.headers["content-security-policy"]
        assert "script-src 'nonce-" in csp and "unsafe-inline" not in csp


def test_replay_is_refused_without_allow_replay(built: str) -> None:
    with client(built) as http:
        page = http.get(f"{PAGE}/dead-letters")
        assert 'id="replay-form"' not in page.text
        token = csrf_of(http.get("/").text) if 'name="csrftoken"' in page.text else None
        form = {"topic": TOPIC, "group": GROUP, "confirm": "yes", "csrftoken": token or ""}
        refused = http.post("/replay", data=form)
        # asgi-csrf refuses a POST without a valid token first; with one, the app says read-only
        assert refused.status_code == 403
    assert ends(built) == 7


def test_replay_without_the_csrf_token_is_refused(built: str) -> None:
    with client(built, allow_replay=True) as http:
        http.get(f"{PAGE}/dead-letters")  # sets the CSRF cookie
        form = {"topic": TOPIC, "group": GROUP, "confirm": "yes"}
        assert http.post("/replay", data=form).status_code == 403
        assert http.post("/replay", data={**form, "csrftoken": "forged"}).status_code == 403
        http.cookies.clear()
        assert http.post("/replay", data=form).status_code == 403  # no cookie: still checked
    assert ends(built) == 7


def replay_form(http: TestClient, key: str = "k-poison") -> dict[str, str]:
    """The hidden fields of the dead-letter list's replay form (CSRF token included)."""
    page = http.get(f"{PAGE}/dead-letters", params={"key": key}).text
    part = page.split('id="replay-form"', 1)[1].split("</form>", 1)[0]
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', part))


def test_a_host_name_it_was_not_started_for_is_refused(tmp_path: Path) -> None:
    """DNS rebinding: a page of evil.example, whose name now resolves to
    127.0.0.1, sends its own name as Host; neither a page nor a replay answers."""
    url = f"sqlite:///{tmp_path}/log.db"
    asyncio.run(build(url))
    evil = {"Host": "evil.example:8771", "Origin": "http://evil.example:8771"}
    with client(url, allow_replay=True) as http:
        form = replay_form(http)
        for path in ("/", PAGE, f"{PAGE}/dead-letters", "/consumer-metrics"):
            refused = http.get(path, headers=evil)
            assert refused.status_code == 400, path
            assert "'evil.example:8771'" in refused.text and "--allowed-host" in refused.text
        dry = http.post("/replay", data=form, headers=evil)
        assert dry.status_code == 400 and "would-count" not in dry.text
        confirmed = http.post("/replay", data={**form, "confirm": "yes"}, headers=evil)
        assert confirmed.status_code == 400
        assert http.get("/", headers={"Host": "evil.example:8771"}).status_code == 400
    assert ends(url) == 7


def test_the_loopback_names_the_bound_host_and_allowed_hosts_are_answered(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    asyncio.run(build(url))
    with client(url, allowed_hosts=("Dash.Example", "[2001:db8::7]")) as http:
        for host in (
            "localhost:8765",
            "LOCALHOST",
            "localhost.:8765",
            "127.0.0.1:8765",
            "[::1]:8765",
            "dash.example",
            "dash.example:443",
            "[2001:db8::7]:8765",
        ):
            assert http.get("/", headers={"Host": host}).status_code == 200, host
        for host in (
            "evil.example",
            "127.0.0.2",
            "dash.example.evil.example",
            "localhost@evil.example",
            "",
            "[::1",
            "localhost:notaport",
        ):
            assert http.get("/", headers={"Host": host}).status_code == 400, host
    app = create_app(DashboardSettings(url, host="192.0.2.7", token="t", interval=3600.0))
    with TestClient(app, base_url="http://192.0.2.7:8765") as http:
        assert http.get("/", headers={"Authorization": "Bearer t"}).status_code == 200


@pytest.mark.parametrize("name", ["", " ", "http://dash.example", "dash.example:80", "a/b", "a b"])
def test_an_allowed_host_must_be_a_bare_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="is not a host name or address"):
        DashboardSettings(f"sqlite:///{tmp_path}/log.db", allowed_hosts=(name,))


def test_cli_refuses_a_bad_allowed_host_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["dashboard", "--allowed-host", "http://dash.example", "--log", "sqlite:///x.db"])
    assert code == ExitCode.ERROR
    assert "'http://dash.example' is not a host name" in capsys.readouterr().err


def test_a_post_from_another_origin_is_refused(built: str) -> None:
    with client(built, allow_replay=True) as http:
        form = replay_form(http)
        for headers in (
            {"Origin": "http://evil.example:8765"},
            {"Origin": "http://127.0.0.1:9999"},  # another port is another site
            {"Origin": "null"},  # a sandboxed frame, a privacy redirect
            {"Origin": "garbage"},
            {"Referer": "http://evil.example/page"},
            {"Referer": "http://127.0.0.1:9999/"},
        ):
            refused = http.post("/replay", data=form, headers=headers)
            assert refused.status_code == 403, headers
            assert "from another site" in refused.text
        for headers in (
            {"Origin": BASE},
            {"Origin": "http://127.0.0.1:8765/"},
            {"Referer": f"{BASE}{PAGE}/dead-letters?key=k-poison"},
            {},  # neither: the CSRF token still guards it
        ):
            dry = http.post("/replay", data=form, headers=headers)
            assert dry.status_code == 200, headers
            assert re.search(r'id="would-count">2<', dry.text)
    assert ends(built) == 7


def test_read_only_refusal_with_a_valid_token_names_the_flag(built: str) -> None:
    with client(built) as http:
        page = http.get(f"{PAGE}/dead-letters").text
        assert "--allow-replay" in page
        token = http.cookies.get("csrftoken")
        assert token is not None
        # the form token is the cookie's value (asgi-csrf's double submit)
        form = {"topic": TOPIC, "group": GROUP, "confirm": "yes", "csrftoken": token}
        refused = http.post("/replay", data=form)
        assert refused.status_code == 403 and "read-only" in refused.text


def test_dry_run_counts_then_confirmed_replay_writes_the_records(built: str) -> None:
    with client(built, allow_replay=True) as http:
        page = http.get(f"{PAGE}/dead-letters", params={"key": "k-poison"}).text
        form = dict(
            re.findall(
                r'<input type="hidden" name="(\w+)" value="([^"]*)">',
                page.split('id="replay-form"', 1)[1].split("</form>", 1)[0],
            )
        )
        assert form["key"] == "k-poison"
        dry = http.post("/replay", data=form)
        assert dry.status_code == 200
        assert re.search(r'id="would-count">2<', dry.text)
        assert ends(built) == 7  # a dry run writes nothing
        confirm = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', dry.text))
        assert confirm["confirm"] == "yes" and confirm["expected"] == "2"
        done = http.post("/replay", data=confirm)
        assert re.search(r'id="replayed-count">2<', done.text)
        assert ends(built) == 9
        again = http.post("/replay", data={**form})
        assert re.search(r'id="would-count">0<', again.text)
        assert "2 matching dead letters were replayed before" in again.text


def test_unknown_topic_or_group_is_404(built: str) -> None:
    with client(built) as http:
        assert http.get(f"/topic/{TOPIC}/group/nobody").status_code == 404
        assert http.get(f"{PAGE}/dead-letters/0/999999").status_code == 404


NUMBERS_OUT_OF_BOUNDS = [
    "99999999999999999999999",  # OverflowError in SQLite: the page answered 500
    str(2**63),
    str(2**64 + 1),
    "9" * 5000,  # more digits than int() reads
    "-1",
    "+1",
    "1.0",
    "0x10",
    "1e3",
    "٣",  # a digit, not an ASCII one
    "%20",
    "x",
]


def test_every_numeric_path_part_out_of_bounds_is_404(tmp_path: Path) -> None:
    """The dead-letter route is the one with numeric parts (partition, offset):
    each is an int in [0, 2**63) and a partition of the topic, else 404."""
    url = f"sqlite:///{tmp_path}/log.db"
    asyncio.run(build(url))
    with TestClient(
        create_app(DashboardSettings(url, interval=3600.0)),
        base_url=BASE,
        raise_server_exceptions=False,
    ) as http:
        for bad in NUMBERS_OUT_OF_BOUNDS:
            for route in (f"{PAGE}/dead-letters/{bad}/0", f"{PAGE}/dead-letters/0/{bad}"):
                answer = http.get(route)
                assert answer.status_code == 404, (route, answer.status_code)
                assert "no dead letter" in answer.text, route
        # in bounds but beyond the topic: 404 as well
        for route in (f"{PAGE}/dead-letters/2/0", f"{PAGE}/dead-letters/0/{2**63 - 1}"):
            assert http.get(route).status_code == 404, route


def test_a_page_number_out_of_bounds_shows_a_page(built: str) -> None:
    with client(built) as http:
        for page in ("99999999999999999999999", "-3", "0", "x", "9" * 5000):
            answer = http.get(f"{PAGE}/dead-letters", params={"page": page})
            assert answer.status_code == 200, page
            assert re.search(rf'id="found-count">{DEAD}<', answer.text)


def test_group_option_shows_only_that_group(built: str) -> None:
    with client(built, group="someone-else") as http:
        text = http.get("/").text
        assert "someone-else" in text and f"<td>{GROUP}</td>" not in text


def test_a_token_is_required_beyond_loopback_and_then_on_every_request(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    asyncio.run(build(url))
    with pytest.raises(ConfigError, match="WAKUWAKU_DASHBOARD_TOKEN"):
        create_app(DashboardSettings(url, host="0.0.0.0"))
    with pytest.raises(ConfigError, match="WAKUWAKU_DASHBOARD_TOKEN"):
        create_app(DashboardSettings(url, host="192.0.2.1"))
    create_app(DashboardSettings(url, host="::1"))  # loopback: no token needed
    app = create_app(DashboardSettings(url, host="0.0.0.0", token="s3cret", interval=3600.0))
    with TestClient(app, base_url=BASE) as http:
        assert http.get("/").status_code == 401
        assert http.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        basic = base64.b64encode(b"me:s3cret").decode()
        assert http.get("/", headers={"Authorization": f"Basic {basic}"}).status_code == 200
        assert http.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_cli_refuses_a_public_address_without_a_token_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WAKUWAKU_DASHBOARD_TOKEN", raising=False)
    url = f"sqlite:///{tmp_path}/log.db"
    asyncio.run(build(url))
    code = main(["dashboard", "--log", url, "--host", "0.0.0.0"])
    err = capsys.readouterr().err
    assert code == ExitCode.ERROR
    assert len(err.strip().splitlines()) == 1 and "WAKUWAKU_DASHBOARD_TOKEN" in err
    assert main(["dashboard", "--log", f"sqlite:///{tmp_path}/none.db"]) == ExitCode.ERROR
    assert "no log at" in capsys.readouterr().err


def test_events_per_second_is_the_growth_of_committed_offsets() -> None:
    view = View(Target(TOPIC, GROUP))
    view.samples = deque(
        [
            Sample(100.0, {0: (10, 50), 1: (None, 5)}),
            Sample(110.0, {0: (30, 60), 1: (None, 5)}),
            Sample(130.0, {0: (30, 60), 1: (4, 9)}),
        ]
    )
    # partition 1 had no commit before 130: its growth is unknown, not counted
    assert view.rates() == [(110.0, 2.0), (130.0, 0.0)]
    assert view.partition_rate(0) == 20 / 30
    assert view.partition_rate(1) == 0.0  # no commit at the start: no known growth
    assert View(Target(TOPIC, GROUP)).partition_rate(0) is None


def test_a_partition_whose_committed_offset_holds_while_it_has_lag_is_stalled() -> None:
    """What a silent stall looks like from outside (design §7): lag, and a
    committed offset that does not move; a partition caught up is not stalled."""
    view = View(Target(TOPIC, GROUP))
    view.samples = deque(
        [
            Sample(100.0, {0: (10, 50), 1: (5, 5), 2: (0, 9)}),
            Sample(140.0, {0: (30, 60), 1: (5, 5), 2: (0, 9)}),
            Sample(180.0, {0: (30, 70), 1: (5, 5), 2: (0, 9)}),
            Sample(220.0, {0: (30, 80), 1: (5, 5), 2: (9, 9)}),
        ]
    )
    assert view.stalled_for(0) == 80.0  # held at 30 since 140 while records waited
    assert view.stalled_for(1) is None  # no lag: idle, not stalled
    assert view.stalled_for(2) is None  # moved in the last round
    assert view.stalled_for(3) is None
    assert View(Target(TOPIC, GROUP)).stalled_for(0) is None


def test_the_consumers_metrics_are_linked_and_shown(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    registry = CollectorRegistry()
    handled = Counter("wakuwaku_handled_records", "Handled.", ["group"], registry=registry)
    handled.labels(group="<b>billing</b>").inc(12)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"sqlite:///{tmp_path}/log.db"
        asyncio.run(build(url))
        metrics = f"http://127.0.0.1:{server.server_port}/metrics"
        with client(url, metrics_url=metrics) as http:
            page = http.get("/consumer-metrics").text
            assert f'href="{metrics}"' in page
            assert (
                "wakuwaku_handled_records_total{group=&#34;&lt;b&gt;billing&lt;/b&gt;&#34;}" in page
            )
            assert '<td class="num">12.0</td>' in page
        with client(url) as http:
            assert "--metrics-url" in http.get("/consumer-metrics").text
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10.0)


def test_a_log_urls_password_is_never_shown() -> None:
    # The user information goes as a whole: a NATS token stands where a user would.
    assert shown_url("redis://:s3cret@127.0.0.1:6379/0?prefix=x") == (
        "redis://***@127.0.0.1:6379/0?prefix=x"
    )
    assert shown_url("nats://me:pw@host:4222") == "nats://***@host:4222"
    assert shown_url("nats://s3cret-token@host:4222") == "nats://***@host:4222"
    assert shown_url("sqlite:///demo-out/log.db") == "sqlite:///demo-out/log.db"


@pytest.mark.parametrize("interval", [float("nan"), float("inf"), 0.0, -1.0])
def test_settings_refuse_an_interval_that_is_not_finite_seconds(interval: float) -> None:
    with pytest.raises(ConfigError, match="interval must be finite seconds > 0"):
        DashboardSettings("sqlite:///x.db", interval=interval)


def test_every_time_shown_carries_its_zone(built: str) -> None:
    """A bare ``2026-05-01 10:15:04`` reads as local time to whoever looks."""
    stamp = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d)?(?! UTC)(?!Z)(?!:\d)")
    with client(built) as http:
        pages = [http.get("/").text, http.get(PAGE).text]
        letters = http.get(f"{PAGE}/dead-letters").text
        pages.append(letters)
        link = re.search(r'href="(/topic/[^"]+/dead-letters/\d+/\d+)"', letters)
        assert link is not None
        pages.append(http.get(link.group(1)).text)
    for text in pages:
        shown = re.sub(r"<[^>]*>", " ", text)  # not the attributes: the text shown
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown)
        assert not stamp.search(shown), stamp.search(shown)


async def _replay_and_purge_the_replayed(url: str, key: str) -> int:
    """Replay ``key``'s dead letters, then purge the replayed ones (``dlq purge
    --replayed``); the count of dead letters ``dlq list`` still lists."""
    log = open_log(url)
    try:
        await replay_dead_letters(log, TOPIC, group=GROUP, key=key)
        report = await purge_dead_letters(log, TOPIC, group=GROUP, replayed=True)
        assert len(report.purged) == 2
        return len(await list_dead_letters(log, TOPIC, group=GROUP))
    finally:
        await log.close()


def test_purged_dead_letters_are_left_out_as_dlq_list_does(built: str) -> None:
    listed = asyncio.run(_replay_and_purge_the_replayed(built, "k-poison"))
    assert listed == DEAD - 2
    with client(built) as http:
        assert re.search(rf'id="dead-count">{listed}<', http.get(PAGE).text)
        letters = http.get(f"{PAGE}/dead-letters")
        assert re.search(rf'id="found-count">{listed}<', letters.text)
        assert "2 purged dead letters are left out" in letters.text
        assert "k-poison" not in letters.text.split('id="letters"', 1)[1]
        every = http.get(f"{PAGE}/dead-letters", params={"purged": "yes"})
        assert re.search(rf'id="found-count">{DEAD}<', every.text)
        assert every.text.count('class="bad purged">purged<') == 2
        poison = http.get(f"{PAGE}/dead-letters", params={"key": "k-poison", "purged": "yes"})
        link = re.search(r'href="(/topic/[^"]+/dead-letters/\d+/\d+)"', poison.text)
        assert link is not None
        assert 'id="purged">purged<' in http.get(link.group(1)).text
        none = http.get(f"{PAGE}/dead-letters", params={"key": "k-poison"})
        assert re.search(r'id="found-count">0<', none.text)
        assert "2 purged dead letters are left out" in none.text
