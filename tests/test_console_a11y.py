"""The console is keyboard-usable, labelled and readable, in a REAL headless Chromium against a
real `idlegpu serve` app (the sample pool replayed at Wed 2026-01-28 17:00 in Seoul, queued
units of two teams: tests/console_browser.py): on every page (pool, queue, a unit, a request,
submit, reports, operators) every control has an accessible name, nothing scrolls sideways at
1280x800 nor at 1366x768 (a laptop), and every time shown says its zone; the queue's filter, a
unit's page and a request's validation are reached and used with the keyboard alone."""

# ruff: noqa: F811 - the fixtures imported from console_browser are the tests' parameters

from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest
from console_browser import browser, console_server, login  # noqa: F401 - fixtures
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

SCREENS = ((1280, 800), (1366, 768))
ZONE = "KST"
# a clock time, and whether a zone follows it ("20:40 KST", "20:40:05 KST", "20:40+09:00")
TIME = re.compile(r"(?<![\w:.+-])\d{1,2}:\d{2}(?::\d{2})?(?![\d:])")
ZONED = re.compile(r"\s?(?:[A-Z]{2,5}\b|UTC[+-]?\d*|[+-]\d{2}:?\d{2})")

UNNAMED = """
return [...document.querySelectorAll('input, select, textarea, button')].filter(el => {
  if (el.type === 'hidden') return false;
  const by = (el.getAttribute('aria-labelledby') || '').split(/\\s+/).filter(Boolean)
    .map(id => (document.getElementById(id) || {}).textContent || '').join(' ');
  const labels = [...(el.labels || [])].map(l => l.textContent).join(' ');
  const text = el.tagName === 'BUTTON' ? el.textContent : '';
  const name = [el.getAttribute('aria-label'), by, labels, text,
                el.type === 'submit' || el.type === 'button' ? el.value : '']
    .join(' ').trim();
  return !name;
}).map(el => el.outerHTML.slice(0, 160));
"""
# the text a person reads: visible elements' own text, without the chart's SVG (whose axis
# is checked apart) and without scripts
SHOWN = """
const out = [];
const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let node = walk.nextNode(); node; node = walk.nextNode()) {
  const el = node.parentElement;
  if (!el || el.closest('svg, script, style, [hidden]')) continue;
  if (!el.getClientRects().length) continue;
  out.push(node.textContent);
}
return out.join('\\n');
"""
WIDTH = ("return [document.documentElement.scrollWidth, document.documentElement.clientWidth,"
         " document.body.scrollWidth]")


def wait(driver, seconds: float = 30):
    return WebDriverWait(driver, seconds, ignored_exceptions=(NoSuchElementException,
                                                              StaleElementReferenceException))


def viewport(driver, width: int, height: int) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def times_without_zone(text: str) -> list[str]:
    """Each clock time in ``text`` no zone follows, with what surrounds it."""
    bad = []
    for found in TIME.finditer(text):
        if not ZONED.match(text, found.end()):
            bad.append(text[max(0, found.start() - 30):found.end() + 12].replace("\n", " | "))
    return bad


def test_the_time_check_tells_a_zoned_time_from_a_bare_one():
    assert times_without_zone("starts Wed 28 Jan 20:40 KST, made 17:00:05 KST, "
                              "2026-01-28T20:40:00+09:00, image trainer:1.0, 2.5 h") == []
    (bare,) = times_without_zone("opens at Thu 07:30, then")
    assert "Thu 07:30, then" in bare
    (bare,) = times_without_zone("Wed 20:00 – Thu 08:00 KST")
    assert bare.startswith("Wed 20:00 – Th")


@pytest.fixture(scope="module")
def pages(console_server, browser) -> dict[str, str]:
    """Every console page, logged in as the operator (who sees them all)."""
    login(browser, console_server.url, console_server.tokens["olga"])
    return {"pool": "/", "queue": "/queue?scope=all",
            "unit": f"/units/{console_server.units['fits-tonight']}",
            "request": f"/requests/{console_server.requests_['never-fits']}",
            "submit": "/submit?example=sft-rl-eval.yaml", "reports": "/reports",
            "operators": "/operators"}


def load(driver, url: str, name: str) -> None:
    driver.get(url)
    wait(driver).until(lambda d: d.execute_script("return document.readyState") == "complete")
    if name == "pool":  # the chart is drawn from /console/pool.json
        wait(driver, 120).until(lambda d: d.execute_script(
            "return performance.getEntriesByName('idlegpu-chart-drawn').length"))
    if name == "submit":  # the live validation's answer (the operator's team is not the
        # example's: the error at the field)
        wait(driver, 60).until(lambda d: d.find_element(By.ID, "validity").text not in (
            "", "checking…"))


@pytest.mark.parametrize("name", ["pool", "queue", "unit", "request", "submit", "reports",
                                  "operators"])
def test_every_page_is_labelled_fits_the_screen_and_zones_its_times(
        console_server, browser, pages, name):
    url = console_server.url + pages[name]
    for width, height in SCREENS:
        viewport(browser, width, height)
        load(browser, url, name)
        assert urlparse(browser.current_url).path == urlparse(url).path, browser.current_url
        assert browser.execute_script(UNNAMED) == [], f"{name}: controls without a name"
        scroll, client, body = browser.execute_script(WIDTH)
        assert max(scroll, body) <= client, (
            f"{name} scrolls sideways at {width}x{height}: {max(scroll, body)} px in {client}")
        shown = browser.execute_script(SHOWN)
        assert times_without_zone(shown) == [], f"{name}: times without their zone"
        assert ZONE in shown  # every page says the pool's zone (the header at least)
    if name == "pool":  # the chart's time axis names its zone once
        axis = browser.find_element(By.CSS_SELECTOR, "#chart svg .axis-zone").text
        assert ZONE in axis


def tab_to(driver, matches, limit: int = 60):
    """Press Tab until the focused element ``matches``; the element."""
    for _ in range(limit):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        focused = driver.switch_to.active_element
        if matches(focused):
            return focused
    raise AssertionError("not reachable with Tab")


def test_the_queue_filter_and_a_units_page_with_the_keyboard_alone(console_server, browser):
    viewport(browser, 1366, 768)
    login(browser, console_server.url, console_server.tokens["alice"], "/queue?scope=all")
    tab_to(browser, lambda e: e.get_attribute("id") == "q")
    ActionChains(browser).send_keys("fits-tonight", Keys.ENTER).perform()
    wait(browser).until(lambda d: "q=fits-tonight" in d.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "#queue tbody tr[data-unit]")
    assert [r.get_attribute("data-unit") for r in rows] == [console_server.units["fits-tonight"]]
    link = tab_to(browser, lambda e: (e.get_attribute("href") or "").startswith(
        console_server.url + "/units/"))
    target = urlparse(link.get_attribute("href")).path
    ActionChains(browser).send_keys(Keys.ENTER).perform()
    wait(browser).until(lambda d: urlparse(d.current_url).path == target)
    assert browser.find_element(By.ID, "unit-state").text


def test_a_request_is_typed_and_validated_with_the_keyboard_alone(console_server, browser):
    viewport(browser, 1280, 800)
    login(browser, console_server.url, console_server.tokens["alice"], "/submit")
    tab_to(browser, lambda e: e.get_attribute("id") == "request")
    from api_server import IMAGE

    typed = ["name: keyboard-sft", "team: alignment", "kind: sft", f"image: {IMAGE}",
             "gpus: 4", "runtime_estimate: 1h", "command: [python, train.py]"]
    ActionChains(browser).send_keys("\n".join(typed)).perform()
    button = tab_to(browser, lambda e: e.tag_name == "button" and e.text == "Validate")
    assert button.get_attribute("value") == "validate"
    form = browser.find_element(By.ID, "submit-form")
    ActionChains(browser).send_keys(Keys.ENTER).perform()
    wait(browser).until(ec.staleness_of(form))  # the server's answer: the page again
    # the server's preview, then the page's own check of what it shows (rows redrawn)
    wait(browser).until(lambda d: d.find_element(By.ID, "validity").text.startswith("valid"))
    assert "keyboard-sft" in browser.find_element(By.ID, "request").get_attribute("value")
    (row,) = browser.find_elements(By.CSS_SELECTOR, "#preview tbody tr")
    assert not browser.find_element(By.ID, "field-error").is_displayed()
    assert "1.3 h (user)" in row.text and ZONE in row.find_element(By.CSS_SELECTOR,
                                                                   "td.start").text
    assert "keyboard-sft" not in {u.request_name for u in console_server.store.find_units()}
