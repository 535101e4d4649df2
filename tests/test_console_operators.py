"""The operators' page of the web console in a REAL headless Chromium against a real `idlegpu
serve` app (uvicorn on loopback, the sample pool replayed at Wed 2026-01-28 17:00 in Seoul,
queued units of two teams: tests/console_browser.py): the daemon's replicas as they reported
to the store, pausing admission with a reason from the keyboard alone, the pool page's banner,
the queue's reasons, the audit log, resuming; members and viewers get a 403. And sessions
across two `idlegpu serve` apps on one store and one secret."""

# ruff: noqa: F811 - the fixtures imported from console_browser are the tests' parameters

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from api_server import ApiServer, MovableClock
from console_browser import Console, browser, login, make_console  # noqa: F401 - fixtures
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait
from test_api_plan import NOW, settings_for, token

from idlegpu.scheduler.adapters.store import SCHEMA_VERSION, DaemonStatus, JobStore
from idlegpu.scheduler.server import create_server
from idlegpu.scheduler.console.session import COOKIE

SHOTS = Path(os.environ.get("IDLEGPU_CONSOLE_SHOTS") or tempfile.mkdtemp(prefix="console-shots-"))
PAUSED = "admission is paused by olga since Wed 28 Jan 17:00 KST: node upgrade tonight"


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Console]:
    console, server = make_console(tmp_path_factory.mktemp("operators"))
    yield console
    server.stop()
    console.store.close()


def wait(driver, seconds: float = 20):
    return WebDriverWait(driver, seconds, ignored_exceptions=(NoSuchElementException,
                                                              StaleElementReferenceException))


def find(driver, css: str):
    return wait(driver).until(lambda d: d.find_element(By.CSS_SELECTOR, css))


def texts(driver, css: str) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, css)]


def test_a_member_or_a_viewer_has_no_operators_page(pool, browser):
    for user, role, team in (("alice", "member", "alignment"), ("victor", "viewer", "vision")):
        login(browser, pool.url, pool.tokens[user])
        assert "Operators" not in texts(browser, "header nav a")
        browser.get(pool.url + "/operators")
        message = find(browser, "p.error").text
        assert message.startswith("The operators' page is for operators only; you are "
                                  f"{user}, a {role} of team {team}.")
        answer = requests.get(pool.url + "/operators", timeout=30,
                              cookies={COOKIE: browser.get_cookie(COOKIE)["value"]})
        assert answer.status_code == 403


def test_no_daemon_has_reported_yet(pool, browser):
    login(browser, pool.url, pool.tokens["olga"])
    links = browser.find_elements(By.CSS_SELECTOR, "header nav a")
    assert "Operators" in [a.text for a in links]
    next(a for a in links if a.text == "Operators").click()
    assert find(browser, "#no-daemon").text.startswith("No daemon has reported to this store")
    assert find(browser, "#schema-version").text == str(SCHEMA_VERSION)
    assert "Open" in find(browser, "#admission-state").text


def test_an_operator_sees_each_replica_red_when_its_passes_are_old(pool, browser):
    # what two replicas of `idlegpu run` wrote after their last passes (the daemon's own
    # writes are tested in tests/test_admission_pause.py): the leader 30 s ago, a replica
    # that stopped ten minutes ago
    pool.store.record_daemon_status(DaemonStatus(
        identity="idlegpu-daemon-7f-a", host="node-3", pid=1, role="leader",
        updated_at=NOW - timedelta(seconds=10), last_reconcile_at=NOW - timedelta(seconds=40),
        last_backstop_at=NOW - timedelta(seconds=10), last_pass="backstop", admitted=0,
        stopped=1, errors=0, forecast_made_at=NOW - timedelta(hours=1), signals_age_s=12.0))
    pool.store.record_daemon_status(DaemonStatus(
        identity="idlegpu-daemon-7f-b", host="node-5", pid=1, role="leader",
        updated_at=NOW - timedelta(minutes=10), last_reconcile_at=NOW - timedelta(minutes=10),
        last_backstop_at=NOW - timedelta(minutes=10, seconds=5), last_pass="reconcile",
        admitted=2, stopped=0, errors=3, forecast_made_at=NOW - timedelta(hours=20),
        signals_age_s=400.0))
    login(browser, pool.url, pool.tokens["olga"], "/operators")
    assert find(browser, "#leader").text == "idlegpu-daemon-7f-a"
    rows = {r.get_attribute("data-replica"): r
            for r in browser.find_elements(By.CSS_SELECTOR, "#replicas tbody tr")}
    assert list(rows) == ["idlegpu-daemon-7f-a", "idlegpu-daemon-7f-b"]  # newest first
    fresh, old = rows["idlegpu-daemon-7f-a"], rows["idlegpu-daemon-7f-b"]
    cell = fresh.find_element(By.CSS_SELECTOR, "td.pass-reconcile")
    assert "Wed 28 Jan 16:59:20 KST" in cell.text and "40 s ago" in cell.text
    assert "stale" not in cell.get_attribute("class")
    assert "backstop: 0 admitted, 1 stopped, 0 errors" in fresh.find_element(
        By.CSS_SELECTOR, "td.counts").text
    assert "12 s old" in fresh.find_element(By.CSS_SELECTOR, "td.signals").text
    assert "60 min old" in fresh.find_element(By.CSS_SELECTOR, "td.forecast").text
    for kind in ("reconcile", "backstop"):  # ten minutes: over three reconcile periods
        cell = old.find_element(By.CSS_SELECTOR, f"td.pass-{kind}")
        assert "stale" in cell.get_attribute("class") and "10 min ago" in cell.text
    assert "stale" in old.find_element(By.CSS_SELECTOR, "td.signals").get_attribute("class")
    assert old.get_attribute("data-healthy") == "no" and fresh.get_attribute(
        "data-healthy") == "yes"
    assert find(browser, "#store").text.count("sqlite:///") == 1


def tab_to(driver, element_id: str, limit: int = 40) -> int:
    """Press Tab until ``element_id`` has the focus; how many presses it took."""
    for presses in range(1, limit + 1):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        if driver.switch_to.active_element.get_attribute("id") == element_id:
            return presses
    raise AssertionError(f"#{element_id} is not reachable with Tab")


def test_an_operator_pauses_from_the_keyboard_and_every_page_says_so(pool, browser):
    login(browser, pool.url, pool.tokens["olga"], "/operators")
    find(browser, "#pause-form")  # a page just loaded: the focus is on the document
    presses = tab_to(browser, "pause-reason")
    assert presses <= 12  # skip link, the navigation, log out, then the form
    ActionChains(browser).send_keys("node upgrade tonight", Keys.ENTER).perform()
    assert find(browser, "#notice").text == "admission paused"
    state = find(browser, "#admission-state").text
    assert state == ("Paused by olga since Wed 28 Jan 17:00 KST: node upgrade tonight")
    assert pool.store.admission().reason == "node upgrade tonight"
    browser.save_screenshot(str(SHOTS / "operators-paused.png"))
    # the audit log, newest first, local times with the zone
    newest = browser.find_element(By.CSS_SELECTOR, "#audit-log tbody tr")
    assert newest.get_attribute("data-action") == "admission.pause"
    assert newest.find_element(By.CSS_SELECTOR, "td.actor").text == "olga (token)"
    assert newest.find_element(By.CSS_SELECTOR, "td.at").text == "Wed 28 Jan 17:00:00 KST"
    assert '"reason": "node upgrade tonight"' in newest.find_element(
        By.CSS_SELECTOR, "td.detail").text
    # filtered by action and actor: only that
    browser.find_element(By.ID, "audit-actor").send_keys("olga")
    Select(browser.find_element(By.ID, "audit-action")).select_by_value("admission.pause")
    browser.find_element(By.CSS_SELECTOR, "#audit-filters button[type=submit]").click()
    wait(browser).until(lambda d: "actor=olga" in d.current_url)
    assert texts(browser, "#audit-log td.action") == ["admission.pause"]
    # a member's pool page has the banner, the queue's reasons say paused
    login(browser, pool.url, pool.tokens["alice"])
    assert find(browser, "#admission-paused").text == "A" + PAUSED[1:]
    browser.save_screenshot(str(SHOTS / "pool-paused.png"))
    browser.get(pool.url + "/queue?scope=all")
    rows = browser.find_elements(By.CSS_SELECTOR, "#queue tbody tr[data-unit]")
    assert {r.get_attribute("data-unit") for r in rows} >= set(pool.units.values())
    for row in rows:
        assert row.find_element(By.CSS_SELECTOR, "td.reason").text == PAUSED
        assert row.find_element(By.CSS_SELECTOR, "td.start").text == "not tonight"
    # resume, from the keyboard too
    login(browser, pool.url, pool.tokens["olga"], "/operators")
    tab_to(browser, "resume")
    ActionChains(browser).send_keys(Keys.ENTER).perform()
    assert find(browser, "#notice").text == "admission resumed"
    assert "Open" in find(browser, "#admission-state").text
    assert [a for a in texts(browser, "#audit-log td.action")[:2]] == [
        "admission.resume", "admission.pause"]
    login(browser, pool.url, pool.tokens["alice"])
    find(browser, "#now-text")
    assert not browser.find_elements(By.ID, "admission-paused")
    browser.get(pool.url + "/queue?scope=all")
    fits = find(browser, f"#queue tr[data-unit='{pool.units['fits-tonight']}'] td.start").text
    assert re.match(r"^(Wed 28|Thu 29) Jan \d\d:\d\d KST$", fits), fits


def test_a_pause_needs_a_reason_and_the_form_its_csrf_token(pool, browser):
    login(browser, pool.url, pool.tokens["olga"], "/operators")
    cookie = {COOKIE: browser.get_cookie(COOKIE)["value"]}
    csrf = browser.find_element(By.CSS_SELECTOR, "#pause-form input[name=csrf]").get_attribute(
        "value")
    forged = requests.post(pool.url + "/operators/pause", data={"reason": "x"}, cookies=cookie,
                           timeout=30, allow_redirects=False)
    assert forged.status_code == 403 and not pool.store.admission().paused
    blank = requests.post(pool.url + "/operators/pause", data={"reason": " ", "csrf": csrf},
                          cookies=cookie, timeout=30, allow_redirects=False)
    assert blank.status_code == 422 and "a pause needs a reason" in blank.text
    assert not pool.store.admission().paused
    member = requests.Session()
    login(browser, pool.url, pool.tokens["alice"])
    member.cookies.set(COOKIE, browser.get_cookie(COOKIE)["value"])
    page = member.get(pool.url + "/", timeout=30).text
    member_csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    refused = member.post(pool.url + "/operators/pause", data={"reason": "x",
                                                               "csrf": member_csrf},
                          timeout=30, allow_redirects=False)
    assert refused.status_code == 403 and not pool.store.admission().paused


# --------------------------------------------------------------------------- two replicas


def form_csrf(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def test_a_session_works_on_every_replica_and_a_logout_ends_it_on_all(tmp_path, monkeypatch):
    monkeypatch.setenv("IDLEGPU_API__SESSION_SECRET", "shared-secret-of-the-replicas-0123456")
    settings = settings_for(tmp_path / "reports")
    assert settings.api.session_secret.get_secret_value().startswith("shared-secret")
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    stores = [JobStore(url), JobStore(url)]  # one store, as two replicas open it
    servers = [ApiServer(create_server(settings, s, clock=MovableClock(NOW))).start()
               for s in stores]
    try:
        secret = token(stores[0], "alice", "alignment", "member")
        first, second = (s.url for s in servers)
        browser_ = requests.Session()
        login_page = browser_.get(first + "/login", timeout=30)
        answer = browser_.post(first + "/login", timeout=30, allow_redirects=False, data={
            "token": secret, "next": "/submit", "csrf": form_csrf(login_page.text)})
        assert answer.status_code == 303, answer.text
        cookie = {COOKIE: browser_.cookies[COOKIE]}
        for where in (first, second):  # issued by the first, good on the second
            page = requests.get(where + "/submit", cookies=cookie, timeout=30,
                                allow_redirects=False)
            assert page.status_code == 200 and "alice · team alignment · member" in page.text
        out = requests.post(first + "/logout", cookies=cookie, timeout=30,
                            allow_redirects=False, data={"csrf": form_csrf(page.text)})
        assert out.status_code == 303
        for where in (first, second):  # the copy of the cookie is refused by both
            page = requests.get(where + "/submit", cookies=cookie, timeout=30,
                                allow_redirects=False)
            assert page.status_code == 303 and page.headers["location"].startswith("/login")
            api = requests.get(where + "/v1/whoami", cookies=cookie, timeout=30)
            assert api.status_code == 401
    finally:
        for server in servers:
            server.stop()
        for s in stores:
            s.close()
