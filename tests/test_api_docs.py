"""``/docs`` and ``/redoc`` in a REAL headless Chromium, served from the app's own assets under
a Content-Security-Policy that allows scripts from this origin only: Swagger UI and ReDoc both
render the API, nothing is fetched from another origin, and the browser reports no CSP
violation. ``api.docs: false`` switches them off."""

from __future__ import annotations

import re

import requests
from api_server import ApiServer
from console_browser import browser, console_server  # noqa: F401 - fixtures
from test_api_plan import settings_for

from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.server import create_server
from idlegpu.scheduler.api.docs import CSP


def _wait(driver, css: str, timeout: float = 30):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def test_the_docs_pages_render_from_our_own_assets_under_a_strict_policy(
        console_server, browser) -> None:  # noqa: F811
    url = console_server.url
    for path in ("/docs", "/redoc"):
        page = requests.get(url + path, timeout=10)
        assert page.status_code == 200
        assert page.headers["content-security-policy"] == CSP
        assert "frame-ancestors 'none'" in CSP and "script-src 'self';" in CSP
        assert page.headers["x-content-type-options"] == "nosniff"
        assert not re.search(r"""(src|href)=["']https?://""", page.text), page.text
        assert "<script>" not in page.text  # no inline script
        for asset in re.findall(r"""(?:src|href)="(/docs-static/[^"]+)\"""", page.text):
            assert requests.get(url + asset, timeout=10).status_code == 200, asset
    browser.get(url + "/docs")
    title = _wait(browser, ".swagger-ui .info .title")
    assert "idlegpu job API" in title.text
    _wait(browser, ".opblock-summary-path[data-path='/v1/requests']")
    browser.get(url + "/redoc")
    heading = _wait(browser, "#redoc h1")
    assert "idlegpu job API" in heading.text
    logged = [e["message"] for e in browser.get_log("browser")]
    # nothing of ours is refused (scripts, styles, the OpenAPI document, the search worker);
    # what the policy does refuse is ReDoc's own logo from its vendor's CDN: never fetched
    refused = [m for m in logged if "Content Security Policy" in m or "Refused" in m
               or "blocked" in m]
    ours = [m for m in refused if "https://cdn.redoc.ly/" not in m]
    assert not ours, ours
    assert all("Loading the image" in m for m in refused), refused


def test_docs_off_by_config(tmp_path) -> None:
    settings = settings_for(tmp_path / "reports")
    settings = settings.model_copy(update={"api": settings.api.model_copy(
        update={"docs": False})})
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    server = ApiServer(create_server(settings, store)).start()
    try:
        assert requests.get(server.url + "/docs", timeout=10).status_code == 404
        assert requests.get(server.url + "/redoc", timeout=10).status_code == 404
        assert requests.get(server.url + "/openapi.json", timeout=10).status_code == 200
    finally:
        server.stop()
        store.close()
