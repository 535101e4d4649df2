"""Screenshots of the web console for the README and the manual: docs/console-pool.png,
docs/console-queue.png and docs/console-submit.png (an example request previewed: its units,
their runtime estimates and tonight's estimated starts), from a real `idlegpu serve` app (uvicorn on loopback) with the sample
pool replayed at Wed 2026-01-28 17:00 in Seoul and queued units of two teams, in Debian's
headless Chromium at 1280 px (the fixtures of tests/console_browser.py).

    .venv/bin/python scripts/console_screenshots.py [--out docs]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    from console_browser import login, make_console, start_browser
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    root = Path(tempfile.mkdtemp(prefix="idlegpu-shots-"))
    console, server = make_console(root)
    driver = start_browser(root / "profile", 1280, 900)
    try:
        login(driver, console.url, console.tokens["alice"])
        WebDriverWait(driver, 60).until(
            lambda d: d.find_element(By.ID, "chart").get_attribute("data-drawn"))
        args.out.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out / "console-pool.png"))
        driver.get(console.url + "/queue?scope=all")
        driver.save_screenshot(str(args.out / "console-queue.png"))
        driver.get(console.url + "/submit?example=sft-rl-eval.yaml")
        WebDriverWait(driver, 60).until(
            lambda d: d.find_element(By.ID, "validity").text.startswith("valid"))
        driver.execute_script("document.getElementById('preview-h').scrollIntoView()")
        driver.save_screenshot(str(args.out / "console-submit.png"))
        print("wrote " + ", ".join(str(args.out / f"console-{name}.png")
                                   for name in ("pool", "queue", "submit")))
    finally:
        driver.quit()
        server.stop()
        console.store.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
