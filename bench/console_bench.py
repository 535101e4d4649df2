"""Benchmark: time to first render of the web console's pool and queue pages with 10,000
queued units, server time and browser time, in one run.

    OMP_NUM_THREADS=1 python bench/console_bench.py [--queued 10000] [--repeats 3]

A real ``idlegpu serve`` app (uvicorn on loopback, in this process) over a SQLite store with the
sample pool replayed at Wed 2026-01-28 17:00 in Seoul, the four queued units of the tests and
``--queued`` more 4-GPU units of team alignment (tests/console_browser.py); Debian's headless
Chromium at 1280 px, logged in as a member of alignment. The forecast is made once before
timing (the server refits once per clock hour; its cost is the plan route's,
see docs/benchmarks.md).

* **server**: the HTML route's time (``GET /`` and ``GET /queue?scope=all`` from ``requests``
  with the session cookie), and the pool's JSON (``GET /console/pool.json``: history, forecast,
  plan), which the chart waits for;
* **browser**: navigation start to the chart drawn (the page's ``idlegpu-chart-drawn``
  performance mark, set when the SVG is in the DOM) and to the queue table parsed
  (``domContentLoadedEventEnd`` of the navigation entry; the table is server-rendered, its
  first page of 500 units), from the Performance API.

Each is measured with the plan made for the load (the console's plan cache emptied first: the
first page after 30 s or after a change) and with the plan shared (median of ``--repeats``).
Prints the figures and the page sizes.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import record  # bench/record.py: --record writes the output into docs/bench/


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import requests
    from console_browser import login, make_console, need_chromium, start_browser
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    need_chromium()
    root = Path(tempfile.mkdtemp(prefix="idlegpu-console-bench-"))
    started = time.perf_counter()
    console, server = make_console(root, extra_units=args.queued)
    print(f"store: {args.queued + 4} queued units, filled in {time.perf_counter() - started:.1f} s")
    driver = start_browser(root / "profile", 1280, 900)
    try:
        login(driver, console.url, console.tokens["alice"])
        cookies = {c["name"]: c["value"] for c in driver.get_cookies()}
        http = requests.Session()
        http.cookies.update(cookies)
        warm = time.perf_counter()
        assert http.get(console.url + "/console/pool.json", timeout=600).ok
        print(f"first plan (forecast fit and plan of {args.queued + 4} units): "
              f"{time.perf_counter() - warm:.1f} s (not counted below)")

        cache = server.server.config.app.state.console_plan_cache

        def server_ms(path: str, cold: bool) -> tuple[float, int]:
            times, size = [], 0
            for _ in range(1 if cold else args.repeats):
                if cold:
                    cache.clear()
                t = time.perf_counter()
                answer = http.get(console.url + path, timeout=600)
                times.append((time.perf_counter() - t) * 1000)
                assert answer.status_code == 200, (path, answer.status_code)
                size = len(answer.content)
            return statistics.median(times), size

        def browser_ms(path: str, script: str, ready, cold: bool) -> float:
            times = []
            for _ in range(1 if cold else args.repeats):
                driver.get("about:blank")
                if cold:
                    cache.clear()
                driver.get(console.url + path)
                WebDriverWait(driver, 600).until(ready)
                times.append(float(driver.execute_script(script)))
            return statistics.median(times)

        drawn_js = "return performance.getEntriesByName('idlegpu-chart-drawn')[0].startTime"
        drawn = (lambda d: d.execute_script(
            "return performance.getEntriesByName('idlegpu-chart-drawn').length"))
        parsed_js = ("return performance.getEntriesByType('navigation')[0]"
                     ".domContentLoadedEventEnd")
        parsed = (lambda d: d.execute_script(parsed_js + " > 0"))
        rows = []
        for cold in (True, False):
            plan = "plan made" if cold else "plan shared"
            html, size = server_ms("/", cold)
            rows.append(("server", "GET / (pool page HTML, no plan needed)", html, size))
            data, size = server_ms("/console/pool.json", cold)
            rows.append(("server", f"GET /console/pool.json ({plan})", data, size))
            queue, size = server_ms("/queue?scope=all", cold)
            rows.append(("server", f"GET /queue?scope=all ({plan})", queue, size))
            rows.append(("browser", f"pool: navigation to the chart drawn ({plan})",
                         browser_ms("/", drawn_js, drawn, cold), None))
            rows.append(("browser", f"queue: navigation to the table parsed ({plan})",
                         browser_ms("/queue?scope=all", parsed_js, parsed, cold), None))
        count = len(driver.find_elements(By.CSS_SELECTOR, "#queue tbody tr[data-unit]"))
        print(f"\nconsole, {args.queued + 4} queued units ({count} rows on the queue's first page); "
              f"'plan made': the plan cache emptied first (one load), 'plan shared': median "
              f"of {args.repeats}:")
        for side, what, ms, size in rows:
            extra = f"  ({size / 1e6:.2f} MB)" if size else ""
            print(f"  {side:<8} {what:<52} {ms:8.0f} ms{extra}")
    finally:
        driver.quit()
        server.stop()
        console.store.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    record.run("console", main)
