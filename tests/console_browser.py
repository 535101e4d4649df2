"""A REAL headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by Selenium)
and a real ``idlegpu serve`` app on a uvicorn loopback port with the sample pool replayed at a
fixed moment (Wed 2026-01-28 17:00 in Seoul, as tests/test_api_plan.py) and queued units of two
teams: the fixtures of the console's tests (tests/test_console*.py).

Without Chromium the tests fail loudly under CI (``CI`` set) and skip elsewhere."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import yaml
from api_server import ApiServer, MovableClock
from test_api_plan import HISTORY, NOW, request, settings_for, token

from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.api.forecasts import Forecasts
from idlegpu.scheduler.server import create_server

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
OPTIONS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", "--window-size=1280,1000")


def need_chromium() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if not missing:
        return
    message = (f"the console's browser tests need Debian's chromium and chromium-driver "
               f"({', '.join(missing)} missing; scripts/test.sh installs them)")
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def start_browser(profile: Path, width: int = 1280, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for option in OPTIONS:
        options.add_argument(option)
    options.add_argument(f"--window-size={width},{height}")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    return driver


@dataclass
class Console:
    url: str
    store: JobStore
    tokens: dict[str, str]  # user -> token (alice, vera: members; victor: viewer; olga:
    # an operator of team platform)
    units: dict[str, str]  # request name -> its first unit id
    requests_: dict[str, str] = field(default_factory=dict)  # request name -> its id


def make_console(root: Path, extra_units: int = 0) -> tuple[Console, ApiServer]:
    reports = root / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    settings = settings_for(reports)
    store = JobStore(f"sqlite:///{root / 'console.db'}")
    clock = MovableClock(NOW)
    forecasts = Forecasts(settings, read_history(HISTORY))
    server = ApiServer(create_server(settings, store, clock=clock, forecasts=forecasts)).start()
    tokens = {"alice": token(store, "alice", "alignment", "member"),
              "vera": token(store, "vera", "vision", "member"),
              "victor": token(store, "victor", "vision", "viewer"),
              "olga": token(store, "olga", "platform", "operator")}
    console = Console(server.url, store, tokens, {})
    bodies = (("alice", request("fits-tonight", "alignment", 16)),
              ("alice", request("small", "alignment", 4, 1.0)),
              ("vera", request("never-fits", "vision", 64)),
              ("vera", request("vision-eval", "vision", 8, 3.0)))
    for user, body in bodies:
        answer = requests.post(server.url + "/v1/requests", json=body, timeout=30,
                               headers={"Authorization": f"Bearer {tokens[user]}"})
        assert answer.status_code == 201, answer.text
        console.units[body["name"]] = answer.json()["unit_ids"][0]
        console.requests_[body["name"]] = answer.json()["id"]
    if extra_units:
        bulk(store, extra_units)
    return console, server


def bulk(store: JobStore, count: int) -> None:
    """``count`` queued 4-GPU units of team alignment, straight into the store (the API's
    submit limits cap one request well below 10,000 units): requests of up to 250 members."""
    from test_api_plan import CONFIG

    from idlegpu.scheduler.adapters.store import AuditEntry
    from idlegpu.scheduler.config import load_config
    from idlegpu.scheduler.specs import expand_units, validate_request

    settings = load_config(data=yaml.safe_load(CONFIG.read_text(encoding="utf-8")))
    per, done, batch = 250, 0, 0
    while done < count:
        n = min(per, count - done)
        data = dict(request(f"bulk-{batch}", "alignment", 4, 2.0), args=["--seed", "{seed}"],
                    sweep={"seed": [str(done + i) for i in range(n)]})
        job = validate_request(data, settings.admission, source="bench")
        store.submit_from_api(
            principal="token:alice", idempotency_key=None, body_sha256=f"bulk{batch}",
            request_name=job.name, team=job.team, kind=job.kind,
            raw=job.model_dump(mode="json"), units=expand_units(job), now=NOW,
            audit=AuditEntry(at=NOW, actor="alice", auth="token", role="member",
                             team="alignment", action="submit", target=""),
            address="127.0.0.1")
        done, batch = done + n, batch + 1


@pytest.fixture(scope="module")
def console_server(tmp_path_factory) -> Iterator[Console]:
    console, server = make_console(tmp_path_factory.mktemp("console"))
    yield console
    server.stop()
    console.store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator:
    need_chromium()
    profile = Path(tempfile.mkdtemp(prefix="idlegpu-chromium-"))
    driver = start_browser(profile)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def login(driver, url: str, token_: str, next_: str = "/") -> None:
    """Log in through the form (after clearing the session)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/login")
    driver.delete_all_cookies()
    driver.get(url + "/login?next=" + requests.utils.quote(next_, safe=""))
    driver.find_element(By.ID, "token").send_keys(token_)
    driver.find_element(By.CSS_SELECTOR, "form.login button[type=submit]").click()
    WebDriverWait(driver, 20).until(ec.presence_of_element_located((By.ID, "who")))
