"""The console's reports pages in a REAL headless Chromium against a real `idlegpu serve` app
(fixtures: tests/console_browser.py, the sample pool replayed at Wed 2026-01-28 17:00 Seoul).

The report is written by `idlegpu report` itself (in-process, the CLI's code) from a run table
of three months of nightly jobs (one team named ``<b>speech</b>``) and a recorded history of
the sample pool's last two weeks of January (so the month's forecast check refits a dozen
evenings, not forty), into ``reports/2026-01/`` of the console's reports dir. The accuracy is
asked for the last 3 evenings (``?days=3``; the default is 28) and compared with
``forecast_check_days`` called directly on the same history."""

from __future__ import annotations

import random
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from urllib.parse import urlparse
from zoneinfo import ZoneInfo

import pandas as pd
import pytest
import requests
from console_browser import login, make_console, need_chromium, start_browser
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from test_api_plan import HISTORY, NOW, settings_for

from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.reports import format_hours, format_money, format_share

REPO = Path(__file__).resolve().parents[1]
MONTH = "2026-01"
DAYS = 3
TEAM = "<b>speech</b>"
SECRET = "the console must never serve this"


def night_runs(seed: int = 7) -> pd.DataFrame:
    """Three months (Nov 2025 - Jan 2026) of nightly attempts of three teams, a few preempted."""
    rng = random.Random(seed)
    tz = ZoneInfo("Asia/Seoul")
    rows, day = [], datetime(2025, 11, 1, tzinfo=tz)
    while day < datetime(2026, 2, 1, tzinfo=tz):
        for k in range(rng.randint(1, 3)):
            start = day + timedelta(hours=rng.randint(19, 23), minutes=rng.choice((0, 30)))
            hours = rng.uniform(1.5, 8.0)
            gpus = rng.choice((4, 8, 16))
            preempted = rng.random() < 0.1
            held = gpus * hours
            rows.append({
                "job_id": f"{day:%m%d}-{k}", "team": rng.choice(("alignment", "vision", TEAM)),
                "kind": rng.choice(("sft", "eval")), "gpus": gpus, "start": start.isoformat(),
                "end": (start + timedelta(hours=hours)).isoformat(),
                "outcome": "preempted" if preempted else "finished", "gpu_hours": held,
                "lost_gpu_hours": held * 0.25 if preempted else 0.0})
        day += timedelta(days=1)
    return pd.DataFrame(rows)


def write_report(root: Path, reports: Path) -> Path:
    """``idlegpu report`` (the CLI in-process) into ``reports/2026-01``; its directory."""
    from idlegpu.scheduler.cli import main

    runs = root / "runs.csv"
    night_runs().to_csv(runs, index=False)
    history = read_history(HISTORY)
    recent = root / "history.parquet"
    history[history["ds"] >= pd.Timestamp("2026-01-17", tz="UTC")].to_parquet(recent)
    out = reports / MONTH
    try:
        main(["report", "--runs", str(runs), "--history", str(recent), "--month", MONTH,
              "--months", "3", "--out", str(out), "--config", str(REPO / "idlegpu.yaml")])
    except SystemExit as exc:
        assert not exc.code, f"idlegpu report exited {exc.code}"
    (reports / "secret.md").write_text(SECRET, encoding="utf-8")
    (out / "linked.png").symlink_to(reports / "secret.md")
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[tuple]:
    need_chromium()
    root = tmp_path_factory.mktemp("console_reports")
    console, server = make_console(root)
    folder = write_report(root, root / "reports")
    profile = Path(tempfile.mkdtemp(prefix="idlegpu-chromium-"))
    driver = start_browser(profile, 1366, 768)
    yield console, server, driver, folder
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)
    server.stop()
    console.store.close()


def wait(driver, seconds: float = 20):
    return WebDriverWait(driver, seconds, ignored_exceptions=(NoSuchElementException,
                                                              StaleElementReferenceException))


def session(driver) -> requests.Session:
    """A requests session with the browser's console cookie."""
    out = requests.Session()
    for cookie in driver.get_cookies():
        out.cookies.set(cookie["name"], cookie["value"])
    return out


def md_row(markdown: str, first_cell: str) -> list[str]:
    """The cells of the Markdown table row starting with ``first_cell`` (as written)."""
    for line in markdown.splitlines():
        if line.startswith(f"| {first_cell} |"):
            return [c.strip() for c in line.strip().strip("|").split(" | ")]
    raise AssertionError(f"no row {first_cell!r} in the report's Markdown")


def test_logged_out_the_reports_pages_redirect_to_the_login(site):
    console, _, driver, _ = site
    for page in ("/reports", f"/reports/{MONTH}", "/reports/accuracy?days=3",
                 f"/reports/{MONTH}/files/summary.csv"):
        answer = requests.get(console.url + page, allow_redirects=False, timeout=30)
        assert answer.status_code == 303, (page, answer.status_code)
        assert answer.headers["location"].startswith("/login?next="), page
    driver.delete_all_cookies()
    driver.get(console.url + f"/reports/{MONTH}")
    assert urlparse(driver.current_url).path == "/login"


@pytest.mark.slow  # long (over 15 s): scripts/test.sh and CI run it, a plain pytest does not
def test_the_accuracy_page_computes_off_the_request_and_shows_each_services_coverage(site):
    """The first test to ask for the accuracy (of 3 evenings): it is not computed yet."""
    from idlegpu.scheduler.reports import forecast_check_days

    console, _, driver, _ = site
    login(driver, console.url, console.tokens["olga"], f"/reports/accuracy?days={DAYS}")
    browser_session = session(driver)
    first = driver.find_element(By.ID, "accuracy")
    assert first.get_attribute("data-state") == "computing"
    progress = driver.find_element(By.ID, "accuracy-progress").text
    assert f"of {DAYS} evenings scored" in progress
    assert driver.find_element(By.CSS_SELECTOR, "meta[http-equiv=refresh]")
    # meanwhile the other pages answer (the refits run on their own thread)
    assert browser_session.get(f"{console.url}/reports/{MONTH}", timeout=30).status_code == 200
    assert browser_session.get(f"{console.url}/queue", timeout=30).status_code == 200
    # the same machinery called directly, on the same history up to the server's clock
    settings = settings_for(Path(tempfile.gettempdir()))
    history = read_history(HISTORY)
    history = history[history["ds"] <= pd.Timestamp(NOW)]
    last = date(2026, 1, 27)  # the last evening (17:00) whose next 24 h are over at 17:00
    direct = forecast_check_days(history, settings, last - timedelta(days=DAYS - 1), last)
    wait(driver, 180).until(
        lambda d: d.find_element(By.ID, "accuracy").get_attribute("data-state") == "ready")
    assert not driver.find_elements(By.CSS_SELECTOR, "meta[http-equiv=refresh]")
    assert driver.find_element(By.ID, "accuracy-first").text == "Sun 25 Jan 17:00 KST"
    assert driver.find_element(By.ID, "accuracy-last").text == "Tue 27 Jan 17:00 KST"
    rows = {r.get_attribute("data-service"): r for r in driver.find_elements(
        By.CSS_SELECTOR, "#accuracy-services tbody tr")}
    assert set(rows) == set(direct.services["service"]) == {"chat", "code", "summarize",
                                                           "embed"}
    for r in direct.services.itertuples():
        assert rows[r.service].find_element(By.CSS_SELECTOR, "td.coverage").text == \
            format_share(r.coverage)
        assert rows[r.service].find_element(By.CSS_SELECTOR, "td.strict").text == \
            format_share(r.strict_coverage)
        assert rows[r.service].find_element(By.CSS_SELECTOR, "td.verdict").text == r.verdict
        # the forecast that served it most (auto's choice) and that choice's skill
        served = rows[r.service].find_element(By.CSS_SELECTOR, "td.served-by").text
        assert served == r.served_by and re.fullmatch(r".+ \(\d+%\)", served)
        assert rows[r.service].find_element(By.CSS_SELECTOR, "td.skill").text == \
            f"{r.skill:+.0%}"
    pooled = {c.get_attribute("data-field"): c.text for c in driver.find_elements(
        By.CSS_SELECTOR, "#accuracy-pooled td[data-field]")}
    a = direct.accuracy
    assert pooled == {"coverage": format_share(a["coverage"]),
                      "strict": format_share(a["strict_coverage"]),
                      "precision": format_share(a["precision"]),
                      "recall": format_share(a["recall"])}
    lines = driver.find_elements(By.CSS_SELECTOR, "#daily-chart g.service")
    assert [int(g.get_attribute("data-points")) for g in lines] == [DAYS] * 4
    assert driver.find_element(By.CSS_SELECTOR, "#daily-chart line.target")
    assert driver.execute_script("return document.documentElement.scrollWidth") <= 1366
    driver.save_screenshot(str(Path(tempfile.gettempdir()) / "console-accuracy.png"))
    # /reports sums it up (the same figures), cached: no second computation
    driver.get(f"{console.url}/reports?days={DAYS}")
    summary = {r.get_attribute("data-service"): r.find_element(By.CSS_SELECTOR,
                                                               "td.coverage").text
               for r in driver.find_elements(By.CSS_SELECTOR, "#accuracy-services tbody tr")}
    assert summary == {r.service: format_share(r.coverage) for r in direct.services.itertuples()}
    assert driver.find_element(By.ID, "accuracy").get_attribute("data-state") == "ready"
    bad = browser_session.get(f"{console.url}/reports/accuracy?days=29", timeout=30)
    assert bad.status_code == 422 and "days: &#39;29&#39;" in bad.text and "1 to 28" in bad.text


def test_a_viewer_sees_the_months_figures_as_the_report_wrote_them(site):
    console, _, driver, folder = site
    login(driver, console.url, console.tokens["victor"], f"/reports?days={DAYS}")
    assert "victor · team vision · viewer" in driver.find_element(By.ID, "who").text
    row = driver.find_element(By.CSS_SELECTOR, f"#months tr[data-month='{MONTH}']")
    assert row.find_element(By.CSS_SELECTOR, "td").text.endswith("KST")
    summary = pd.read_csv(folder / "summary.csv", dtype={"month": str})
    mine = summary[summary["month"] == MONTH].iloc[0]
    assert format_hours(mine.useful_gpu_hours) in row.text
    row.find_element(By.LINK_TEXT, MONTH).click()
    wait(driver).until(lambda d: d.find_element(By.ID, "figures"))
    figures = {f.get_attribute("data-field"): f.find_element(By.TAG_NAME, "dd").text
               for f in driver.find_elements(By.CSS_SELECTOR, "#figures .figure")}
    # the headline figures are summary.csv's, read back and written as the report writes them
    assert figures["useful_gpu_hours"] == format_hours(mine.useful_gpu_hours)
    assert figures["savings"] == format_money(mine.savings, "KRW")
    assert figures["cumulative_savings"] == format_money(mine.cumulative_savings, "KRW")
    assert figures["idle_share_used"] == format_share(mine.idle_share_used)
    assert figures["jobs_run"] == f"{int(mine.jobs_run):,}"
    # ... and equal to the Markdown's summary row, which the page shows as a table
    markdown = (folder / f"report-{MONTH}.md").read_text(encoding="utf-8")
    written = md_row(markdown, MONTH)
    assert written[2] == figures["useful_gpu_hours"] and written[10] == figures["savings"]
    tables = driver.find_elements(By.CSS_SELECTOR, "table.report")
    captions = [t.find_element(By.TAG_NAME, "caption").get_attribute("textContent")
                for t in tables]  # a caption right under its heading is for screen readers
    assert captions[0] == "Summary" and f"By team, {MONTH}" in captions
    shown = [c.text for c in tables[0].find_elements(By.XPATH, f".//tr[th='{MONTH}']/*")]
    assert shown == written
    assert all(h.get_attribute("scope") == "col" for h in tables[0].find_elements(
        By.CSS_SELECTOR, "thead th"))
    # a team's name is text, never markup: the hostile one is shown as typed
    teams = tables[captions.index(f"By team, {MONTH}")]
    names = [th.text for th in teams.find_elements(By.CSS_SELECTOR, "tbody th")]
    assert TEAM in names and not teams.find_elements(By.CSS_SELECTOR, "tbody b")
    assert f"| {TEAM.replace('<', '&lt;').replace('>', '&gt;')} |" in markdown
    # the per-service forecast check of the month, from the report's coverage table
    coverage = pd.read_csv(folder / f"report-{MONTH}_coverage.csv")
    check = tables[[c.startswith("Per service") for c in captions].index(True)]
    for r in coverage.itertuples():
        cells = [c.text for c in check.find_elements(By.XPATH, f".//tr[th='{r.service}']/*")]
        assert cells[2] == f"{format_share(r.strict_coverage)} / {format_share(r.coverage)}"
    # every chart of the report is loaded through the authenticated route
    pngs = sorted(p.name for p in folder.glob("*.png") if not p.is_symlink())
    assert len(pngs) == 5
    images = driver.find_elements(By.CSS_SELECTOR, "figure.report-chart img")
    assert sorted(i.get_attribute("src").rsplit("/", 1)[1] for i in images) == pngs
    wait(driver).until(lambda d: all(d.execute_script(
        "return arguments[0].complete && arguments[0].naturalWidth", i) for i in images))
    assert all(driver.execute_script("return arguments[0].naturalWidth", i) > 300
               for i in images)
    assert "KST" in driver.find_element(By.CSS_SELECTOR, ".stamps").text
    # laid out for a 1366x768 laptop: nothing wider than the window but the scrolled tables
    assert driver.execute_script("return document.documentElement.scrollWidth") <= 1366
    driver.save_screenshot(str(Path(tempfile.gettempdir()) / "console-report.png"))
    # the downloads are the report's files, as attachments
    browser_session = session(driver)
    links = {a.text: a.get_attribute("href") for a in driver.find_elements(
        By.CSS_SELECTOR, "a.download")}
    assert {f"report-{MONTH}.md", f"report-{MONTH}.html", "summary.csv"} <= set(links)
    answer = browser_session.get(links[f"report-{MONTH}.md"], timeout=30)
    assert answer.status_code == 200 and answer.text == markdown
    assert answer.headers["content-disposition"].startswith("attachment")


def test_the_files_route_serves_only_the_months_own_files(site):
    console, _, driver, folder = site
    login(driver, console.url, console.tokens["victor"], f"/reports/{MONTH}")
    browser_session = session(driver)
    chart = browser_session.get(f"{console.url}/reports/{MONTH}/files/monthly-{MONTH}.png",
                                timeout=30)
    assert chart.status_code == 200 and chart.content == (folder / f"monthly-{MONTH}.png"
                                                         ).read_bytes()
    for path in (f"/reports/{MONTH}/files/..%2Fsecret.md",
                 f"/reports/{MONTH}/files/%2E%2E%2F%2E%2E%2Fconsole.db",
                 f"/reports/{MONTH}/files/..%5Csecret.md",
                 f"/reports/{MONTH}/files/linked.png",  # a link out of the directory
                 "/reports/..%2F/files/secret.md", f"/reports/{MONTH}/files/secret.md"):
        answer = browser_session.get(console.url + path, timeout=30, allow_redirects=False)
        assert answer.status_code in (404, 422), (path, answer.status_code)
        assert SECRET not in answer.text and "SQLite" not in answer.text, path
    # requests normalises ../ in a URL; a raw request line does not
    import http.client

    host = urlparse(console.url)
    raw = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
    raw.request("GET", f"/reports/{MONTH}/files/../../reports/secret.md",
                headers={"Cookie": "; ".join(f"{k}={v}" for k, v in
                                             browser_session.cookies.items())})
    answer = raw.getresponse()
    assert SECRET not in answer.read().decode("utf-8", "replace")
    raw.close()
    # a month without a report says how to make one; a bad month names the field
    missing = browser_session.get(f"{console.url}/reports/2026-02", timeout=30)
    assert missing.status_code == 404 and "idlegpu report --month 2026-02" in missing.text
    bad = browser_session.get(f"{console.url}/reports/2026-13", timeout=30)
    assert bad.status_code == 422 and "month: &#39;2026-13&#39; is not a month" in bad.text


def test_a_history_too_short_for_the_window_says_so():
    from jinja2 import Environment, PackageLoader, select_autoescape

    from idlegpu.scheduler.console.report_pages import AccuracyChecks, accuracy_view

    settings = settings_for(Path(tempfile.gettempdir()))
    history = read_history(HISTORY)
    recent = history[history["ds"] >= pd.Timestamp("2026-01-24", tz="UTC")]
    checks = AccuracyChecks(settings, lambda start, end: recent[recent["ds"] <= end],
                            lambda: NOW)
    state = checks.get(DAYS)
    deadline = time.monotonic() + 60
    while not state.ready and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state.check is None and "does not cover 2026-01-25 to 2026-01-27" in state.error
    assert checks.get(DAYS) is state  # kept for the day: it cannot be made
    env = Environment(loader=PackageLoader("idlegpu.scheduler.console", "templates"),
                      autoescape=select_autoescape(["html"]))
    view = accuracy_view(state, settings, lambda when, seconds=False: str(when))
    view.update(ahead=0, finished_at=None, query="")
    page = env.get_template("reports_accuracy_part.html").render(accuracy=view, full=True)
    assert 'id="accuracy-error"' in page and "a week before a refresh" in page


def test_an_accuracy_that_failed_for_a_passing_reason_is_tried_again():
    from idlegpu.forecast.errors import SourceUnavailableError
    from idlegpu.scheduler.console.report_pages import AccuracyChecks

    calls = []

    def down(start, end):
        calls.append((start, end))
        raise SourceUnavailableError("Prometheus at http://prometheus:9090 did not answer")

    checks = AccuracyChecks(settings_for(Path(tempfile.gettempdir())), down, lambda: NOW)
    state = checks.get(DAYS)
    deadline = time.monotonic() + 30
    while not state.ready and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "did not answer" in state.error and state.retry_at is not None
    assert checks.get(DAYS) is state  # not at once: every reload would ask Prometheus again
    # five weeks of history before the first evening (as the daemon reads), up to now
    first = datetime(2026, 1, 25, 17, tzinfo=ZoneInfo("Asia/Seoul"))
    assert calls == [(first - timedelta(days=35), NOW)]
    state.retry_at = time.monotonic()  # the retry delay is over
    again = checks.get(DAYS)
    assert again is not state and not again.ready
