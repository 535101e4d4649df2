"""Benchmark: time to first render of the web console's pool and queue pages with 10,000
queued units, server time and browser time, in one run.

    OMP_NUM_THREADS=1 python bench/console_bench.py [--queued 10000] [--repeats 3]

A real ``idlegpu serve`` app (uvicorn on loopback, in this process) over a SQLite store with the
sample pool replayed at Wed 2026-01-28 17:00 in Seoul, the four queued units of the tests and
``--queued`` more 4-GPU units of team alignment (tests/console_browser.py); Debian's headless
Chromium at 1280 px, logged in as a member of alignment. The forecast is made once before
timing (the server refits once per clock hour; its cost is the plan route's, see the README).

* **server**: the HTML route's time (``GET /`` and ``GET /queue?scope=all`` from ``requests``
  with the session cookie), and the pool's JSON (``GET /console/pool.json``: history, forecast,
  plan), which the chart waits for;
* **browser**: navigation start to the chart drawn (the page's ``idlegpu-chart-drawn``
  performance mark, set when the SVG is in the DOM) and to the queue table parsed
  (``domContentLoadedEventEnd`` of the navigation entry; the table is server-rendered), from
  the Performance API.

Prints the median of ``--repeats`` loads of each and the page sizes.
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

        def server_ms(path: str) -> tuple[float, int]:
            times, size = [], 0
            for _ in range(args.repeats):
                t = time.perf_counter()
                answer = http.get(console.url + path, timeout=600)
                times.append((time.perf_counter() - t) * 1000)
                assert answer.status_code == 200, (path, answer.status_code)
                size = len(answer.content)
            return statistics.median(times), size

        def browser_ms(path: str, script: str, ready) -> float:
            times = []
            for _ in range(args.repeats):
                driver.get("about:blank")
                driver.get(console.url + path)
                WebDriverWait(driver, 600).until(ready)
                times.append(float(driver.execute_script(script)))
            return statistics.median(times)

        rows = []
        html, size = server_ms("/")
        rows.append(("server", "GET / (pool page HTML)", html, size))
        data, size = server_ms("/console/pool.json")
        rows.append(("server", "GET /console/pool.json (history, forecast, plan)", data, size))
        queue, size = server_ms("/queue?scope=all")
        rows.append(("server", "GET /queue?scope=all (HTML, every unit)", queue, size))
        drawn = browser_ms(
            "/", "return performance.getEntriesByName('idlegpu-chart-drawn')[0].startTime",
            lambda d: d.execute_script(
                "return performance.getEntriesByName('idlegpu-chart-drawn').length"))
        rows.append(("browser", "pool: navigation start to the chart drawn", drawn, None))
        table = browser_ms(
            "/queue?scope=all",
            "return performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd",
            lambda d: d.execute_script(
                "return performance.getEntriesByType('navigation')[0]"
                ".domContentLoadedEventEnd > 0"))
        count = len(driver.find_elements(By.CSS_SELECTOR, "#queue tbody tr[data-unit]"))
        rows.append(("browser", f"queue: navigation start to the table parsed ({count} rows)",
                     table, None))
        print(f"\nconsole, {args.queued + 4} queued units, median of {args.repeats}:")
        for side, what, ms, size in rows:
            extra = f"  ({size / 1e6:.2f} MB)" if size else ""
            print(f"  {side:<8} {what:<58} {ms:8.0f} ms{extra}")
    finally:
        driver.quit()
        server.stop()
        console.store.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
