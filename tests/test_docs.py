"""The manual is a MkDocs site (docs/, mkdocs.yml) that builds with --strict: every page in
the navigation, no broken link or anchor; its home page is the README; the README stays a
short front page (what it is, the two commands, a tour, the manual's pages)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
README_MAX_LINES = 300


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=root, capture_output=True, text=True, timeout=300,
                          check=False, env=env)


def copy_of_the_manual(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copy(REPO / "README.md", root / "README.md")
    shutil.copytree(REPO / "docs", root / "docs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def nav_pages() -> list[str]:
    def walk(items):
        for item in items:
            for value in item.values():
                yield from walk(value) if isinstance(value, list) else [value]
    return list(walk(yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]))


def test_the_manual_builds_strictly_with_the_readme_as_its_home(tmp_path):
    result = build(REPO, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "A tour" in home and 'href="commands/"' in home  # the README, links made local
    for page in nav_pages():
        if page != "index.md":
            assert (tmp_path / "site" / page.removesuffix(".md") / "index.html").is_file(), page


def test_a_broken_link_or_a_page_left_out_fails_the_build(tmp_path):
    root = copy_of_the_manual(tmp_path)
    page = root / "docs" / "commands.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the old page](gone.md).\n",
                    encoding="utf-8")
    broken = build(root, tmp_path / "site1")
    assert broken.returncode != 0
    assert "gone.md" in broken.stdout + broken.stderr
    page.write_text(page.read_text(encoding="utf-8").replace("See [the old page](gone.md).", ""),
                    encoding="utf-8")
    (root / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    orphan = build(root, tmp_path / "site2")
    assert orphan.returncode != 0
    assert "orphan.md" in orphan.stdout + orphan.stderr


def test_every_page_on_disk_is_in_the_navigation_and_the_readme_links_them():
    on_disk = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").glob("*.md")}
    assert on_disk == set(nav_pages())
    linked = set(re.findall(r"\]\(docs/([a-z-]+\.md)\)", README))
    assert linked == on_disk - {"index.md"}


def test_the_readme_is_a_front_page():
    lines = README.splitlines()
    assert len(lines) <= README_MAX_LINES, f"{len(lines)} lines: move the detail into docs/"
    for part in ("## Quick start", "**1. Install and plan tonight", "**2. Run the whole test suite**",
                 "## A tour", "## The manual"):
        assert part in README, part


def test_a_benchmark_run_with_record_writes_what_it_printed_for_the_manual(tmp_path,
                                                                           monkeypatch):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import record
    finally:
        sys.path.remove(str(REPO / "bench"))
    monkeypatch.setattr(record, "DOCS", tmp_path / "docs" / "bench")
    monkeypatch.setattr(sys, "argv", ["bench/toy_bench.py", "--days", "3", "--record"])

    def main() -> None:
        assert "--record" not in sys.argv  # the benchmark's own parser never sees it
        print("| model | seconds |")
        print("|---|---|")
        print("| auto | 1.25 |")
        print("auto / curve 1.50x")
        print("")
        print("goal met")
        print("")
        print("           night  reactive")  # a text table, aligned by spaces
        print("useful      9.8      17.7")

    record.run("toy", main)
    written = (tmp_path / "docs" / "bench" / "toy.md").read_text(encoding="utf-8")
    head, body = written.split("\n\n", 1)
    assert "`python bench/toy_bench.py --days 3`" in head and "do not edit" in head
    assert body == ("| model | seconds |\n|---|---|\n| auto | 1.25 |\n\n"
                    "auto / curve 1.50x\n\ngoal met\n\n"
                    "```text\n           night  reactive\nuseful      9.8      17.7\n```\n")
    # without the flag nothing is written
    monkeypatch.setattr(sys, "argv", ["bench/toy_bench.py"])
    record.run("quiet", main)
    assert not (tmp_path / "docs" / "bench" / "quiet.md").exists()
