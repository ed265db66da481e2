"""The dashboard's operator controls over HTTP (Starlette's TestClient): pause
and resume, retry-now and give-up, offset reset and purge. Each one's
refusals (read-only, CSRF, another origin, bad input, a state that refuses)
and its effect, read back through :mod:`wakuwaku.admin` and the log."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from typing import TypeVar

import pytest
from starlette.testclient import TestClient

from wakuwaku._control import Action
from wakuwaku.admin import list_dead_letters, pauses, read_commands
from wakuwaku.dashboard import DashboardSettings, create_app
from wakuwaku.logs import Log, open_log

from .kit import DEAD, GROUP, SCRIPT_KEY, STUCK, TOPIC, build, log_urls, purge, url_for
from .test_pages import BASE, NUMBERS_OUT_OF_BOUNDS, PAGE, client

T = TypeVar("T")

POSTS = (
    "/control/pause",
    "/control/resume",
    "/control/retry-now",
    "/control/give-up",
    "/control/reset-offsets",
    "/control/purge",
)
"""Every write the controls add."""
PAGES = (
    f"{PAGE}/pause",
    f"{PAGE}/resume",
    f"{PAGE}/retry-now?key={STUCK}",
    f"{PAGE}/give-up?key={STUCK}",
    f"{PAGE}/reset-offsets?to=earliest",
    f"{PAGE}/purge?everything=yes",
)
"""Every confirmation page."""


@pytest.fixture(params=log_urls())
def built(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = url_for(request.param, tmp_path)
    asyncio.run(build(url))
    yield url
    asyncio.run(purge(request.param, url))


@pytest.fixture
def sqlite_log(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/log.db"
    asyncio.run(build(url))
    return url


def on_log(url: str, call: Callable[[Log], Awaitable[T]]) -> T:
    """``call(log)`` on a log of its own, in a thread of its own (a browser
    test's thread runs Playwright's event loop)."""

    async def run() -> T:
        log = open_log(url)
        try:
            return await call(log)
        finally:
            await log.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


def committed(url: str) -> dict[int, int | None]:
    async def read(log: Log) -> dict[int, int | None]:
        return {p: await log.committed(GROUP, TOPIC, p) for p in (0, 1)}

    return on_log(url, read)


def commands(url: str) -> list[tuple[Action, str | None, int | None]]:
    async def read(log: Log) -> list[tuple[Action, str | None, int | None]]:
        found = await read_commands(log, GROUP)
        return [(r.command.action, r.command.key, r.command.partition) for r in found if r.command]

    return on_log(url, read)


class _Forms(HTMLParser):
    """The fields of the form with one id: hidden and text inputs, as sent."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.found = False
        self.action = ""
        self.fields: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "form" and named.get("id") == self.form_id:
            self.inside = self.found = True
            self.action = named.get("action") or ""
        elif tag == "input" and self.inside and named.get("name"):
            kind = named.get("type") or "text"
            if kind in ("hidden", "text"):
                self.fields[named["name"] or ""] = named.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False


def form(page: str, form_id: str = "confirm-form") -> tuple[str, dict[str, str]]:
    """``(action, fields)`` of the form ``form_id`` of ``page`` (values unescaped)."""
    parser = _Forms(form_id)
    parser.feed(page)
    assert parser.found, f"the page has no form {form_id!r}"
    return parser.action, parser.fields


def confirm(http: TestClient, path: str, **fields: str) -> tuple[str, str]:
    """Open a confirmation page, then post its form (``fields`` added);
    ``(the confirmation's text, the result's text)``."""
    page = http.get(path)
    assert page.status_code == 200, (path, page.status_code, page.text[-600:])
    action, sent = form(page.text)
    assert sent["csrftoken"]
    done = http.post(action, data={**sent, **fields})
    assert done.status_code == 200, (action, done.status_code, done.text[-600:])
    return page.text, done.text


def text_of(page: str, element_id: str) -> str:
    """The text of the element ``element_id`` (one that holds no element of its own tag)."""
    found = re.search(rf'<(\w+)[^>]*\bid="{element_id}"[^>]*>(.*?)</\1>', page, re.S)
    assert found is not None, f"no element {element_id!r}"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", found.group(2))).split())


# ------------------------------------------------------------------ refusals


def test_read_only_shows_no_control_and_refuses_every_one(sqlite_log: str) -> None:
    before = committed(sqlite_log)
    with client(sqlite_log) as http:
        page = http.get(PAGE).text
        assert 'id="read-only"' in page and "--allow-replay" in page
        for absent in ('id="controls"', "/retry-now?", "/give-up?", "/pause?", "/purge"):
            assert absent not in page, absent
        for path in PAGES:
            refused = http.get(path)
            assert refused.status_code == 403, path
            assert "--allow-replay" in refused.text
        token = http.cookies.get("csrftoken")
        assert token is not None
        fields = {"csrftoken": token, "topic": TOPIC, "group": GROUP, "key": STUCK}
        for path in POSTS:
            refused = http.post(path, data={**fields, "to": "earliest", "everything": "yes"})
            assert refused.status_code == 403, path
            assert "read-only" in refused.text
    assert commands(sqlite_log) == []
    assert committed(sqlite_log) == before
    assert len(on_log(sqlite_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP))) == DEAD


def test_a_control_without_the_csrf_token_is_refused(sqlite_log: str) -> None:
    before = committed(sqlite_log)
    with client(sqlite_log, allow_replay=True) as http:
        http.get(PAGE)  # sets the CSRF cookie
        fields = {"topic": TOPIC, "group": GROUP, "key": STUCK, "to": "earliest"}
        fields["everything"] = "yes"
        for path in POSTS:
            assert http.post(path, data=fields).status_code == 403, path
            assert http.post(path, data={**fields, "csrftoken": "forged"}).status_code == 403
        http.cookies.clear()
        for path in POSTS:  # no cookie at all: still checked
            assert http.post(path, data=fields).status_code == 403, path
    assert commands(sqlite_log) == []
    assert committed(sqlite_log) == before


def test_a_control_posted_from_another_site_is_refused(sqlite_log: str) -> None:
    evil = {"Host": "evil.example:8765", "Origin": "http://evil.example:8765"}
    with client(sqlite_log, allow_replay=True) as http:
        _, sent = form(http.get(f"{PAGE}/pause?key=k-ok").text)
        for path in POSTS:
            fields = {**sent, "to": "earliest", "everything": "yes", "key": STUCK}
            for headers in ({"Origin": "http://evil.example:8765"}, {"Origin": "null"}):
                refused = http.post(path, data=fields, headers=headers)
                assert refused.status_code == 403, (path, headers)
                assert "from another site" in refused.text
            assert http.post(path, data=fields, headers=evil).status_code == 400, path
        for path in PAGES:
            assert http.get(path, headers={"Host": "evil.example"}).status_code == 400, path
        # the same form from the dashboard's own origin goes through
        done = http.post("/control/pause", data=sent, headers={"Origin": BASE})
        assert done.status_code == 200
    assert [(a, k) for a, k, _ in commands(sqlite_log)] == [(Action.PAUSE, "k-ok")]


def test_bad_numbers_and_scopes_are_refused_with_a_page(sqlite_log: str) -> None:
    with TestClient(
        create_app(DashboardSettings(sqlite_log, allow_replay=True, interval=3600.0)),
        base_url=BASE,
        raise_server_exceptions=False,
    ) as http:
        for bad in NUMBERS_OUT_OF_BOUNDS:
            for path in (f"{PAGE}/pause", f"{PAGE}/resume", f"{PAGE}/reset-offsets"):
                answer = http.get(path, params={"partition": bad, "to": "earliest"})
                assert answer.status_code == 400, (path, bad, answer.status_code)
                assert "not a whole number" in answer.text
        for path in (f"{PAGE}/pause", f"{PAGE}/reset-offsets"):
            beyond = http.get(path, params={"partition": "2", "to": "earliest"})
            assert beyond.status_code == 404 and "has 2 partitions" in beyond.text
        both = http.get(f"{PAGE}/pause", params={"partition": "0", "key": "k"})
        assert both.status_code == 400 and "not both" in both.text
        # An emptied key field never widens a key's pause to the whole topic.
        for path in (f"{PAGE}/pause", f"{PAGE}/resume", f"{PAGE}/retry-now"):
            empty = http.get(path, params={"key": ""})
            assert empty.status_code == 400 and "the key is empty" in empty.text, path
        assert http.get(f"{PAGE}/retry-now").status_code == 400  # no key
        for to in ("yesterday", "-1", "1.5", "99999999999999999999999"):
            answer = http.get(f"{PAGE}/reset-offsets", params={"to": to})
            assert answer.status_code == 400, to
        unknown = http.get(f"/topic/{TOPIC}/group/nobody/pause")
        assert unknown.status_code == 404 and "no topic" in unknown.text
        assert http.get(f"/topic/nothing/group/{GROUP}/reset-offsets").status_code == 404
        # the POSTs read the same way
        _, sent = form(http.get(f"{PAGE}/pause").text)
        for path in POSTS:
            cases: list[tuple[dict[str, str], int]] = [({"group": "nobody"}, 404)]
            if path != "/control/purge":  # a purge has no partition
                cases += [
                    ({"partition": "99999999999999999999999"}, 400),
                    ({"partition": "-1"}, 400),
                    ({"partition": "2"}, 404),
                ]
            for extra, status in cases:
                fields = {**sent, "to": "earliest", "everything": "yes", **extra}
                answer = http.post(path, data=fields)
                assert answer.status_code == status, (path, extra, answer.status_code)
                assert 'id="message"' in answer.text
        for path in ("/control/pause", "/control/resume", "/control/give-up"):
            empty = http.post(path, data={**sent, "key": ""})
            assert empty.status_code == 400 and "the key is empty" in empty.text, path
        purge_nothing = http.post("/control/purge", data=sent)
        assert purge_nothing.status_code == 400 and "say which" in purge_nothing.text
        bad_reason = http.get(f"{PAGE}/purge", params={"reason": "no-such-reason"})
        assert bad_reason.status_code == 400 and "unknown dead-letter reason" in bad_reason.text
    assert commands(sqlite_log) == []
    assert len(on_log(sqlite_log, lambda log: list_dead_letters(log, TOPIC, group=GROUP))) == DEAD


# -------------------------------------------------------------------- pauses


def test_pause_a_key_shows_it_in_force_and_resume_ends_it(built: str) -> None:
    with client(built, allow_replay=True) as http:
        assert 'id="pause-key-form"' in http.get(PAGE).text
        asked, done = confirm(http, f"{PAGE}/pause?key=k-ok", reason="bad <b>deploy</b>")
        assert "holds the records of key" in text_of(asked, "what-happens")
        assert "k-ok" in text_of(asked, "what-happens")
        outcome = text_of(done, "outcome")
        assert "key 'k-ok' of orders" in outcome and "UTC" in outcome
        assert "bad <b>deploy</b>" in outcome and "<b>deploy" not in done
        in_force = on_log(built, lambda log: pauses(log, GROUP))
        assert [(p.topic, p.key, p.reason) for p in in_force] == [
            (TOPIC, "k-ok", "bad <b>deploy</b>")
        ]
        assert "via dashboard from" in in_force[0].by
        table = text_of(http.get(PAGE).text, "pauses")
        assert "key 'k-ok' of orders" in table and "via dashboard" in table
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", table)
        assert "bad <b>deploy</b>" in table
        assert re.search(r'<span class="paused"[^>]*>1</span>', http.get("/").text)
        asked, done = confirm(http, f"{PAGE}/resume?key=k-ok")
        assert "key 'k-ok' of orders" in text_of(asked, "ending")
        assert "Resumed" in text_of(done, "outcome")
        assert on_log(built, lambda log: pauses(log, GROUP)) == []
        assert 'id="no-pauses"' in http.get(PAGE).text


def test_a_topic_resume_ends_the_pauses_of_its_partitions_and_keys(sqlite_log: str) -> None:
    with client(sqlite_log, allow_replay=True) as http:
        asked, _ = confirm(http, f"{PAGE}/pause?partition=1")
        assert "stops starting work on partition 1 of topic" in text_of(asked, "what-happens")
        asked, _ = confirm(http, f"{PAGE}/pause")
        assert "all its partitions" in text_of(asked, "what-happens")
        confirm(http, f"{PAGE}/pause?key={SCRIPT_KEY}")
        page = http.get(PAGE).text
        assert page.count('<span class="paused" title="topic orders">paused</span>') == 1
        assert page.count(">paused</span>") >= 2  # both partitions
        assert "<script>alert" not in page
        scopes = {(p.partition, p.key) for p in on_log(sqlite_log, lambda log: pauses(log, GROUP))}
        assert len(scopes) == 3 and (1, None) in scopes and (None, None) in scopes
        asked, _ = confirm(http, f"{PAGE}/resume")
        ending = text_of(asked, "ending")
        assert "partition 1 of orders" in ending and "topic orders" in ending
        assert "alert(" in ending  # the key, as text
        assert on_log(sqlite_log, lambda log: pauses(log, GROUP)) == []
        not_paused, _ = confirm(http, f"{PAGE}/resume?partition=0")
        assert 'id="not-paused"' in not_paused


# ------------------------------------------------------- a quarantined key now


def test_retry_now_and_give_up_write_their_commands(built: str) -> None:
    with client(built, allow_replay=True) as http:
        page = http.get(PAGE).text
        assert f'href="{PAGE}/retry-now?key={STUCK}"' in page
        asked, done = confirm(http, f"{PAGE}/retry-now?key={STUCK}")
        assert "runs at once" in text_of(asked, "what-happens")
        assert f"key '{STUCK}' of orders" in text_of(done, "outcome")
        assert "Asked for the next attempt now" in text_of(done, "outcome")
        asked, done = confirm(http, f"{PAGE}/give-up?key={STUCK}", reason="poison")
        assert text_of(asked, "pending").strip() == "2"
        assert "given_up_by_operator" in text_of(asked, "what-happens")
        assert "Gave up" in text_of(done, "outcome")
    written = commands(built)
    assert [(a, k) for a, k, _ in written] == [(Action.RETRY_NOW, STUCK), (Action.GIVE_UP, STUCK)]


def test_a_key_that_is_not_quarantined_is_a_409_page(sqlite_log: str) -> None:
    with client(sqlite_log, allow_replay=True) as http:
        for action in ("retry-now", "give-up"):
            page = http.get(f"{PAGE}/{action}", params={"key": "k-ok"})
            assert page.status_code == 409 and "is not quarantined" in page.text
        _, sent = form(http.get(f"{PAGE}/retry-now?key={STUCK}").text)
        for path in ("/control/retry-now", "/control/give-up"):
            refused = http.post(path, data={**sent, "key": "k-ok"})
            assert refused.status_code == 409, path
            assert "is not quarantined" in refused.text and 'id="message"' in refused.text
    assert commands(sqlite_log) == []


# -------------------------------------------------------------- offset reset


def test_reset_offsets_shows_the_plan_then_stores_it(built: str) -> None:
    before = committed(built)
    assert sum(c or 0 for c in before.values()) == 7
    with client(built, allow_replay=True) as http:
        choose = http.get(f"{PAGE}/reset-offsets")
        assert choose.status_code == 200 and 'id="reset-choose"' in choose.text
        assert 'id="confirm-form"' not in choose.text
        asked, done = confirm(http, f"{PAGE}/reset-offsets?to=earliest")
        rows = re.findall(
            r'<tr>\s*<td class="num">(\d)</td>\s*<td class="num">(\d+)</td>\s*'
            r'<td class="num">(\d+)</td>',
            asked.split('id="plan"', 1)[1],
        )
        assert {int(p): (int(f), int(t)) for p, f, t in rows} == {
            p: (c or 0, 0) for p, c in before.items()
        }
        assert text_of(asked, "replayed").strip() == "7"
        assert text_of(asked, "skipped").strip() == "0"
        assert "nothing is stored yet" in text_of(asked, "what-happens")
        assert "Stored the offsets" in text_of(done, "outcome")
        assert committed(built) == {0: 0, 1: 0}
        # one partition, to an offset past its end: clamped, and the plan says so
        asked, _ = confirm(http, f"{PAGE}/reset-offsets?to=999&partition=1")
        assert "clamped to" in text_of(asked, "plan")
        after = committed(built)
        assert after[0] == 0 and after[1] == before[1]


def test_reset_offsets_is_refused_while_a_member_runs(sqlite_log: str) -> None:
    async def hold(log: Log) -> None:
        assert await log.acquire_partition(GROUP, TOPIC, 1, "worker-a", ttl=600.0)

    before = committed(sqlite_log)
    on_log(sqlite_log, hold)
    with client(sqlite_log, allow_replay=True) as http:
        page = http.get(f"{PAGE}/reset-offsets", params={"to": "earliest"})
        assert page.status_code == 200
        assert "worker-a" in text_of(page.text, "running")
        _, sent = form(page.text)
        refused = http.post("/control/reset-offsets", data=sent)
        assert refused.status_code == 409
        assert "worker-a" in refused.text and "stop them first" in refused.text
    assert committed(sqlite_log) == before


# --------------------------------------------------------------------- purge


def test_purge_counts_first_then_purges_and_the_list_agrees(built: str) -> None:
    with client(built, allow_replay=True) as http:
        choose = http.get(f"{PAGE}/purge")
        assert choose.status_code == 200 and 'id="purge-choose"' in choose.text
        assert 'id="confirm-form"' not in choose.text
        asked, done = confirm(http, f"{PAGE}/purge?reason=unrecoverable")
        assert text_of(asked, "would-count").strip() == str(DEAD)
        assert "unrecoverable" in text_of(asked, "by-reason")
        assert "not erasure" in text_of(asked, "what-happens")
        assert text_of(done, "purged-count").strip() == str(DEAD)
        assert on_log(built, lambda log: list_dead_letters(log, TOPIC, group=GROUP)) == []
        letters = http.get(f"{PAGE}/dead-letters").text
        assert re.search(r'id="found-count">0<', letters)
        assert re.search(r'id="dead-count">0<', http.get(PAGE).text)
        again = http.get(f"{PAGE}/purge", params={"everything": "yes"}).text
        assert text_of(again, "would-count").strip() == "0"
        assert f"{DEAD} matching dead letters were purged before" in text_of(again, "already")
        assert 'id="confirm-form"' not in again


# ---------------------------------------------------------------- structure


def test_every_post_route_is_csrf_checked_even_without_a_cookie() -> None:
    from wakuwaku.dashboard._app import Dashboard, posted_paths

    dashboard = Dashboard(DashboardSettings("sqlite:///x.db"), lambda: open_log("memory://"))
    assert posted_paths(dashboard.routes()) == {"/replay", *POSTS}


def test_the_control_topic_is_not_shown_as_a_topic(sqlite_log: str) -> None:
    with client(sqlite_log, allow_replay=True) as http:
        confirm(http, f"{PAGE}/pause?key=k-ok")
    for settings in ({}, {"group": GROUP}):
        with client(sqlite_log, **settings) as http:
            index = http.get("/").text
            shown = {link.split("/")[2] for link in re.findall(r'href="(/topic/[^"]+)"', index)}
            assert shown == {TOPIC}, settings
