"""The web console in a REAL headless Chromium against a real `idlegpu serve` app (uvicorn on
loopback) with the sample pool replayed at Wed 2026-01-28 17:00 in Seoul and queued units of
two teams (fixtures: tests/console_browser.py)."""

# ruff: noqa: F811 - the fixtures imported from console_browser are the tests' parameters

from __future__ import annotations

import os
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import requests
import yaml
from api_server import IMAGE
from console_browser import browser, console_server, login  # noqa: F401 - fixtures
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

SHOTS = Path(os.environ.get("IDLEGPU_CONSOLE_SHOTS") or tempfile.mkdtemp(prefix="console-shots-"))
PAGES = ("/", "/queue", "/queue?scope=all", "/submit", "/units/x", "/requests/x")


def wait(driver, seconds: float = 20):
    """A wait that retries through a page being replaced (a stale element)."""
    return WebDriverWait(driver, seconds, ignored_exceptions=(NoSuchElementException,
                                                              StaleElementReferenceException))


def find(driver, css: str):
    """The element at ``css`` once the page has it (after a click that navigates)."""
    return wait(driver).until(lambda d: d.find_element(By.CSS_SELECTOR, css))


def chart_drawn(driver) -> None:
    wait(driver, 45).until(lambda d: d.find_element(By.ID, "chart").get_attribute("data-drawn"))


def points(driver, selector: str) -> list[int]:
    return [int(p.get_attribute("data-points") or 0)
            for p in driver.find_elements(By.CSS_SELECTOR, f"#chart {selector}")]


def test_logged_out_every_page_redirects_to_login(console_server, browser):
    for page in PAGES:
        answer = requests.get(console_server.url + page, allow_redirects=False, timeout=30)
        assert answer.status_code == 303, (page, answer.status_code)
        assert answer.headers["location"].startswith("/login?next="), page
    assert requests.get(console_server.url + "/console/pool.json",
                        timeout=30).status_code == 401
    browser.delete_all_cookies()
    browser.get(console_server.url + "/queue?scope=all")
    assert urlparse(browser.current_url).path == "/login"
    assert browser.find_element(By.CSS_SELECTOR, "label[for=token]").text == "idlegpu token"
    # a wrong token is refused at the form
    browser.find_element(By.ID, "token").send_keys("igt_not-a-token")
    browser.find_element(By.CSS_SELECTOR, "form.login button[type=submit]").click()
    assert "unknown token" in find(browser, "#login-error").text


def test_a_member_logs_in_and_sees_tonights_chart_drawn(console_server, browser):
    login(browser, console_server.url, console_server.tokens["alice"])
    assert "alice · team alignment · member" in browser.find_element(By.ID, "who").text
    chart_drawn(browser)
    history = points(browser, "path.history-free")
    assert len(history) == 1 and 500 <= history[0] <= 577, history  # 48 h of 5-min samples
    services = browser.find_elements(By.CSS_SELECTOR, "#chart path.service")
    assert {s.get_attribute("data-service") for s in services} == {"chat", "code",
                                                                    "summarize", "embed"}
    assert all(n > 500 for n in points(browser, "path.service"))
    median, lower = points(browser, "path.median"), points(browser, "path.lower")
    assert len(median) == 1 and 250 <= median[0] <= 289, median  # the next 24 h, 5-min steps
    assert lower and lower[0] == median[0]
    band = browser.find_element(By.CSS_SELECTOR, "#chart path.band").get_attribute("d")
    assert band.count("L") > 2 * 250 and band.endswith("Z")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart rect.window")) >= 1
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart line.now")) == 1
    assert "now Wed 17:00" in browser.find_element(By.CSS_SELECTOR, "#chart .now-label").text
    jobs = browser.find_elements(By.CSS_SELECTOR, "#chart rect.job")
    assert {j.get_attribute("data-unit") for j in jobs} >= {
        console_server.units["fits-tonight"], console_server.units["small"]}
    # stamps: the forecast is fresh (made now), the replayed signals are 5 min old at most
    forecast = browser.find_element(By.ID, "forecast-age")
    assert "forecast made: Wed 28 Jan 17:00:00 KST" in forecast.text
    assert "stale" not in forecast.get_attribute("class")
    assert "KST" in browser.find_element(By.ID, "signals-age").text
    assert "Asia/Seoul" in browser.find_element(By.CSS_SELECTOR, ".zone").text
    assert browser.find_elements(By.CSS_SELECTOR, "#windows li")
    browser.save_screenshot(str(SHOTS / "pool.png"))


def test_a_queued_unit_shows_its_estimated_start_and_why_it_waits(console_server, browser):
    login(browser, console_server.url, console_server.tokens["alice"], "/queue?scope=all")
    rows = {r.get_attribute("data-unit"): r
            for r in browser.find_elements(By.CSS_SELECTOR, "#queue tbody tr[data-unit]")}
    assert set(console_server.units.values()) <= set(rows)
    fits = rows[console_server.units["fits-tonight"]]
    start = fits.find_element(By.CSS_SELECTOR, "td.start").text
    assert re.match(r"^(Wed 28|Thu 29) Jan \d\d:\d\d KST$", start), start
    never = rows[console_server.units["never-fits"]]
    assert never.find_element(By.CSS_SELECTOR, "td.start").text == "not tonight"
    reason = never.find_element(By.CSS_SELECTOR, "td.reason").text
    assert reason.startswith("needs 64 GPUs;") and "no 64-GPU window opens" in reason
    # full ids, never cut, with a copy button each
    unit_id = console_server.units["never-fits"]
    assert never.find_element(By.CSS_SELECTOR, "td.id code").text == unit_id
    assert never.find_element(By.CSS_SELECTOR, "button.copy").get_attribute(
        "data-copy") == unit_id
    # sorted by estimated start: what starts comes before what waits
    order = [r.get_attribute("data-unit") for r in
             browser.find_elements(By.CSS_SELECTOR, "#queue tbody tr[data-unit]")]
    assert order.index(console_server.units["fits-tonight"]) < order.index(unit_id)
    browser.save_screenshot(str(SHOTS / "queue.png"))
    # scope and filter
    browser.get(console_server.url + "/queue?scope=team")
    teams = {r.find_elements(By.TAG_NAME, "td")[2].text
             for r in browser.find_elements(By.CSS_SELECTOR, "#queue tbody tr[data-unit]")}
    assert teams == {"alignment"}
    browser.get(console_server.url + "/queue?scope=all&q=never")
    assert [r.get_attribute("data-unit") for r in browser.find_elements(
        By.CSS_SELECTOR, "#queue tbody tr[data-unit]")] == [unit_id]


def bad_request() -> str:
    return yaml.safe_dump({"name": "console-sft", "team": "alignment", "kind": "sft",
                           "image": "docker.io/someone/trainer:1.0", "gpus": 4,
                           "runtime_estimate": "1h", "command": ["python", "train.py"]},
                          sort_keys=False)


def test_submit_shows_the_error_at_the_field_then_submits_and_cancels(console_server, browser):
    login(browser, console_server.url, console_server.tokens["alice"], "/submit")
    options = [o.get_attribute("value") for o in
               browser.find_elements(By.CSS_SELECTOR, "#example option") if o.get_attribute("value")]
    assert "sft-rl-eval.yaml" in options
    area = browser.find_element(By.ID, "request")
    browser.execute_script("arguments[0].value = arguments[1];"
                           "arguments[0].dispatchEvent(new Event('input'));", area, bad_request())
    error = browser.find_element(By.ID, "field-error")
    wait(browser).until(lambda d: error.is_displayed())
    assert error.get_attribute("data-field") == "image"
    assert error.find_element(By.CSS_SELECTOR, "strong.field").text == "image"
    assert "registry.example.com/" in error.text and "(line 4)" in error.text, error.text
    assert area.get_attribute("aria-invalid") == "true"
    # fixed: valid, the units previewed, then submitted
    fixed = bad_request().replace("docker.io/someone/trainer:1.0", IMAGE)
    browser.execute_script("arguments[0].value = arguments[1];"
                           "arguments[0].dispatchEvent(new Event('input'));", area, fixed)
    wait(browser).until(lambda d: d.find_element(By.ID, "validity").text.startswith("valid"))
    assert not error.is_displayed()
    (row,) = browser.find_elements(By.CSS_SELECTOR, "#preview tbody tr")
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    # the planner's estimate (the user's 1 h times 1.3) and tonight's start as if submitted
    # now, in the pool's zone, as the API's dry run planned it
    assert cells[3] == "1.3 h (user)", cells
    planned = requests.post(f"{console_server.url}/v1/requests/validate", data=fixed,
                            timeout=60, headers={"Content-Type": "application/yaml",
                                                 "Authorization": "Bearer "
                                                 + console_server.tokens["alice"]}).json()
    start = planned["units"][0]["plan"]["start_at"]
    assert start and row.find_element(By.CSS_SELECTOR, "td.start time").get_attribute(
        "datetime") == start
    shown = datetime.fromisoformat(start).strftime("%a %d %b %H:%M") + " KST"
    assert cells[4] == shown and cells[5] == planned["units"][0]["plan"]["reason"]
    browser.find_element(By.ID, "submit").click()
    wait(browser).until(lambda d: urlparse(d.current_url).path.startswith("/requests/"))
    assert find(browser, "#notice").text == "submitted"
    request_id = browser.find_element(By.ID, "request-id").text
    console_server.requests_["console-sft"] = request_id
    unit = browser.find_element(By.CSS_SELECTOR, "#units tbody tr").get_attribute("data-unit")
    console_server.units["console-sft"] = unit
    # the unit's page: its plan, then cancel it
    browser.get(console_server.url + f"/units/{unit}")
    assert "queued" in browser.find_element(By.ID, "unit-state").text
    assert browser.find_element(By.ID, "unit-plan").text
    assert "submitted" in browser.find_element(By.ID, "timeline").text
    browser.find_element(By.ID, "reason").send_keys("not needed")
    browser.find_element(By.ID, "cancel").click()
    wait(browser).until(lambda d: "cancelled" in d.find_element(By.ID, "unit-state").text)
    assert "cancelled 1 unit(s)" in find(browser, ".notice").text
    assert not browser.find_elements(By.ID, "cancel")  # nothing left to cancel
    state = console_server.store.unit(unit).state.value
    assert state == "cancelled"


def test_a_request_file_is_loaded_and_validated_a_binary_or_too_big_one_refused(
        console_server, browser, tmp_path):
    login(browser, console_server.url, console_server.tokens["alice"], "/submit")
    upload = browser.find_element(By.ID, "upload")
    status = browser.find_element(By.ID, "upload-status")
    label = browser.find_element(By.CSS_SELECTOR, "label[for=upload]").text
    assert "request file" in label
    good = tmp_path / "mine.yaml"
    good.write_text(bad_request().replace("docker.io/someone/trainer:1.0", IMAGE), "utf-8")
    upload.send_keys(str(good))
    wait(browser).until(lambda d: d.find_element(By.ID, "validity").text.startswith("valid"))
    assert browser.find_element(By.ID, "request").get_attribute("value") == good.read_text()
    assert status.text == f"loaded mine.yaml ({good.stat().st_size} bytes)"
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    upload.send_keys(str(binary))
    wait(browser).until(lambda d: "not a text file" in status.text)
    assert status.get_attribute("class") == "error"
    limit = int(browser.find_element(By.ID, "submit-form").get_attribute("data-max-bytes"))
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * limit + "\n", "utf-8")
    upload.send_keys(str(big))
    wait(browser).until(lambda d: "over the server's limit" in status.text)
    assert f"big.yaml is {big.stat().st_size} bytes" in status.text
    assert "(api.max_body_bytes)" in status.text
    # neither replaced what was loaded
    assert browser.find_element(By.ID, "request").get_attribute("value") == good.read_text()


def test_a_member_of_another_team_sees_it_but_cannot_cancel_an_operator_can(console_server, browser):
    login(browser, console_server.url, console_server.tokens["vera"])
    unit = console_server.units["small"]  # alignment's, queued
    browser.get(console_server.url + f"/units/{unit}")
    assert browser.find_element(By.ID, "unit-id").text == unit
    assert not browser.find_elements(By.ID, "cancel")
    browser.get(console_server.url + f"/requests/{console_server.requests_['small']}")
    assert not browser.find_elements(By.ID, "cancel")
    # her own team's: cancellable
    browser.get(console_server.url + f"/units/{console_server.units['vision-eval']}")
    assert browser.find_elements(By.ID, "cancel")
    # an operator (of another team still) may cancel anyone's
    login(browser, console_server.url, console_server.tokens["olga"], f"/units/{unit}")
    assert browser.find_elements(By.ID, "cancel")


def test_a_viewer_has_no_forms(console_server, browser):
    login(browser, console_server.url, console_server.tokens["victor"])
    assert not browser.find_elements(By.LINK_TEXT, "Submit")
    for page in ("/", "/queue?scope=all", f"/units/{console_server.units['vision-eval']}",
                 f"/requests/{console_server.requests_['vision-eval']}", "/submit"):
        browser.get(console_server.url + page)
        posts = [f.get_attribute("action") for f in
                 browser.find_elements(By.CSS_SELECTOR, "form[method=post]")]
        assert [urlparse(a).path for a in posts] == ["/logout"], (page, posts)
        assert not browser.find_elements(By.TAG_NAME, "textarea")
    assert "viewers read only" in browser.find_element(By.CSS_SELECTOR, ".error").text


def test_a_post_without_the_csrf_token_is_refused(console_server, browser):
    login(browser, console_server.url, console_server.tokens["alice"])
    cookies = {c["name"]: c["value"] for c in browser.get_cookies()}
    cookie = next(c for c in browser.get_cookies() if c["name"] == "idlegpu_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert browser.execute_script("return document.cookie") == ""  # invisible to scripts
    unit = console_server.units["small"]
    session = requests.Session()
    session.cookies.update(cookies)
    url = console_server.url
    for data in ({}, {"csrf": "forged"}):
        answer = session.post(f"{url}/units/{unit}/cancel", data=data, allow_redirects=False)
        assert answer.status_code == 403, answer.text
        assert "CSRF" in answer.text
        answer = session.post(f"{url}/submit", data={**data, "request": bad_request()},
                              allow_redirects=False)
        assert answer.status_code == 403
    # the /v1 API with the cookie but without X-CSRF-Token: refused; reads are fine
    answer = session.post(f"{url}/v1/units/{unit}/cancel", json={})
    assert answer.status_code == 403 and "CSRF" in answer.json()["error"]["message"]
    assert session.get(f"{url}/v1/whoami").json()["user"] == "alice"
    assert console_server.store.unit(unit).state.value == "queued"  # nothing changed
    # logging out ends the session, and its copy too
    browser.get(url + "/")
    browser.find_element(By.CSS_SELECTOR, "form[action='/logout'] button").click()
    wait(browser).until(lambda d: urlparse(d.current_url).path == "/login")
    assert session.get(f"{url}/queue", allow_redirects=False).status_code == 303


def test_every_asset_a_page_loads_is_served_by_the_app(console_server, browser):
    login(browser, console_server.url, console_server.tokens["alice"])
    origin = console_server.url
    seen = set()
    for page in ("/", "/queue?scope=all", "/submit",
                 f"/units/{console_server.units['small']}",
                 f"/requests/{console_server.requests_['small']}", "/login"):
        browser.get(origin + page)
        if page == "/":
            chart_drawn(browser)
        entries = browser.execute_script(
            "return performance.getEntriesByType('resource').map("
            "e => [e.name, e.initiatorType]);")
        assert entries, page
        for name, kind in entries:
            assert name.startswith(origin + "/"), (page, name, kind)
            seen.add((urlparse(name).path, kind))
    paths = {p for p, _ in seen}
    assert {"/console/static/console.css", "/console/static/pool.js",
            "/console/static/submit.js", "/console/pool.json"} <= paths, paths
    # and the pages forbid anything else
    answer = requests.get(origin + "/login", timeout=30)
    assert "default-src 'self'" in answer.headers["content-security-policy"]


def test_the_validate_route_expands_without_storing(console_server):
    url, before = console_server.url, len(console_server.store.find_units(limit=10_000))
    alice = {"Authorization": f"Bearer {console_server.tokens['alice']}"}
    good = bad_request().replace("docker.io/someone/trainer:1.0", IMAGE)
    answer = requests.post(f"{url}/v1/requests/validate", data=good, timeout=30,
                           headers={**alice, "Content-Type": "application/yaml"})
    assert answer.status_code == 200, answer.text
    assert [(u["step"], u["gpus"]) for u in answer.json()["units"]] == [("main", 4)]
    answer = requests.post(f"{url}/v1/requests/validate", data=bad_request(), timeout=30,
                           headers={**alice, "Content-Type": "application/yaml"})
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "image"
    viewer = {"Authorization": f"Bearer {console_server.tokens['victor']}"}
    assert requests.post(f"{url}/v1/requests/validate", json={}, headers=viewer,
                         timeout=30).status_code == 403
    assert len(console_server.store.find_units(limit=10_000)) == before  # nothing stored


def test_behind_the_trusted_proxy_the_login_is_automatic(tmp_path):
    from api_server import ApiServer, MovableClock, api_settings

    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.server import create_server

    store = JobStore(f"sqlite:///{tmp_path / 'proxy.db'}")
    settings = api_settings(trusted_proxies=["127.0.0.1/32"], identities=[
        {"group": "ml-alignment", "team": "alignment", "role": "member"}])
    server = ApiServer(create_server(settings, store, clock=MovableClock())).start()
    try:
        proxy = {"X-Remote-User": "ada@corp", "X-Remote-Group": "ml-alignment"}
        answer = requests.get(server.url + "/submit", headers=proxy, allow_redirects=False,
                              timeout=30)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login")
        answer = requests.get(server.url + answer.headers["location"], headers=proxy,
                              allow_redirects=False, timeout=30)
        assert answer.status_code == 303 and answer.headers["location"] == "/submit"
        cookie = answer.headers["set-cookie"]
        assert "idlegpu_session=" in cookie and "HttpOnly" in cookie
        assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
        assert "Secure" not in cookie  # plain http on loopback
        session = requests.Session()
        session.cookies.update(answer.cookies)
        page = session.get(server.url + "/submit", allow_redirects=False, timeout=30)
        assert page.status_code == 200
        assert "ada@corp · team alignment · member" in page.text
        # without the proxy's headers and cookie: the login form
        assert requests.get(server.url + "/login", timeout=30).status_code == 200
    finally:
        server.stop()
        store.close()


def test_old_live_signals_are_shown_red(tmp_path, browser):
    """The replayed history ends 20 minutes before the server's clock: the forecast is still
    made (STALE_AFTER is 30 min), the live signals are shown stale."""
    import pandas as pd
    from api_server import ApiServer, MovableClock
    from test_api_plan import HISTORY, NOW, settings_for, token

    from idlegpu.forecast.sources import read_history
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.server import create_server
    from idlegpu.scheduler.api.forecasts import Forecasts

    history = read_history(HISTORY)
    history = history[history["ds"] <= pd.Timestamp(NOW) - pd.Timedelta(minutes=20)]
    settings = settings_for(tmp_path)
    store = JobStore(f"sqlite:///{tmp_path / 'stale.db'}")
    server = ApiServer(create_server(settings, store, clock=MovableClock(NOW),
                                  forecasts=Forecasts(settings, history))).start()
    try:
        login(browser, server.url, token(store, "alice", "alignment", "member"))
        chart_drawn(browser)
        signals = browser.find_element(By.ID, "signals-age")
        assert "stale" in signals.get_attribute("class") and "20 min ago" in signals.text
        assert "Wed 28 Jan 16:40:00 KST" in signals.text
        forecast = browser.find_element(By.ID, "forecast-age")
        assert "stale" not in forecast.get_attribute("class")
    finally:
        server.stop()
        store.close()


def test_a_units_page_shows_its_checkpoint_notice_and_what_its_workload_reported(
        console_server, browser):
    from datetime import timedelta

    from test_api_plan import NOW

    from idlegpu.scheduler.adapters.store import NoticeOutcome
    from idlegpu.scheduler.specs import expand_units, validate_request

    store = console_server.store
    body = {"name": "noticed-sft", "team": "alignment", "kind": "sft", "image": IMAGE,
            "gpus": 4, "runtime_estimate": "2h", "command": ["python", "train.py"],
            "checkpoint": {"interval": "30m", "notice": True}}
    req = validate_request(body)
    store.submit(req.name, req.team, req.kind, body, expand_units(req), NOW)
    unit = next(r.id for r in store.queue() if r.request_name == "noticed-sft")
    store.admit(unit, NOW)
    store.started(unit, NOW + timedelta(minutes=1))
    store.workload_report(unit, NOW + timedelta(minutes=20), kind="progress", step=900)
    store.send_notice(unit, NOW + timedelta(minutes=30), NOW + timedelta(minutes=40),
                      "the forecast's ramp")
    hostile = "/ckpt/<img src=x onerror=alert(1)>"  # what a workload reports is shown as text
    store.workload_report(unit, NOW + timedelta(minutes=31), kind="checkpoint", step=1000,
                          path=hostile)
    store.close_notice(f"{unit}/1", NOW + timedelta(minutes=31), NoticeOutcome.ANSWERED)
    login(browser, console_server.url, console_server.tokens["alice"], f"/units/{unit}")
    timeline = find(browser, "#timeline").text
    assert "attempt 1: checkpoint notice, deadline Wed 28 Jan 17:40:00 KST: the forecast's ramp" \
        in timeline
    assert f"attempt 1: notice answered, saved step 1000 at {hostile}" in timeline
    assert "notice answered in time: stopped at the acknowledgement" in timeline
    assert not browser.find_elements(By.CSS_SELECTOR, "#timeline img")
    assert browser.find_element(By.ID, "unit-progress").text.startswith("step 900 at Wed 28 Jan")


def test_the_queue_lists_kueue_workloads_and_users_jobs_to_their_team(console_server, browser):
    from idlegpu.scheduler.types import ExternalUnit

    store = console_server.store
    store.record_external([
        ExternalUnit(id="kueue/alignment/job-rm-1", origin="kueue", namespace="alignment",
                     name="job-rm-1", team="alignment", gpus=8, state="waiting",
                     reason="waits: needs 8 GPUs for 9.0 h; first fits Thu 21:40"),
        ExternalUnit(id="job/vision/<b>train</b>", origin="job", namespace="vision",
                     name="<b>train</b>", team="vision", gpus=4, state="refused",
                     reason="spec.template.spec.containers[0].image: <script>x</script>"),
    ], datetime.now(UTC), ["kueue", "job"])
    try:
        login(browser, console_server.url, console_server.tokens["alice"], "/queue?scope=all")
        rows = {r.get_attribute("data-unit"): r for r in
                browser.find_elements(By.CSS_SELECTOR, "#external tbody tr[data-unit]")}
        assert set(rows) == {"kueue/alignment/job-rm-1", "job/vision/<b>train</b>"}
        workload = rows["kueue/alignment/job-rm-1"]
        assert workload.find_element(By.CSS_SELECTOR, "td.origin").text == "Kueue Workload"
        assert "first fits Thu 21:40" in workload.find_element(By.CSS_SELECTOR,
                                                               "td.reason").text
        # a hostile name and reason are text, never markup
        refused = rows["job/vision/<b>train</b>"]
        assert "<script>x</script>" in refused.find_element(By.CSS_SELECTOR, "td.reason").text
        browser.get(console_server.url + "/queue?scope=team")
        assert [r.get_attribute("data-unit") for r in browser.find_elements(
            By.CSS_SELECTOR, "#external tbody tr[data-unit]")] == ["kueue/alignment/job-rm-1"]
        browser.get(console_server.url + "/queue?scope=mine")
        assert browser.find_elements(By.CSS_SELECTOR, "#external") == []
    finally:
        store.record_external([], datetime.now(UTC), ["kueue", "job"])
