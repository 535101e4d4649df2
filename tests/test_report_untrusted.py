"""Team names are chosen by users: the monthly report shows them literally in every format and
chart (no markup, no script, no matplotlib mathtext), and never crashes on them."""

from __future__ import annotations

import pandas as pd
from test_reports import TZ, run

from idlegpu.scheduler.reports import build_report, validate_runs, write_report

EVIL = ("a$b^{$c", "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "=1+1",
        "under_score*star~strike~")


def test_hostile_team_names_are_shown_literally_everywhere(tmp_path):
    rows = [run(f"j{k}", "2026-01-10T20:00", "2026-01-11T02:00", 4, team=team)
            for k, team in enumerate(EVIL)]
    report = build_report(validate_runs(pd.DataFrame(rows)), "2026-01", tz=TZ, price=3000,
                          currency="KRW", pool="<b>pool</b>")
    written = write_report(report, tmp_path)  # before: a$b^{$c raised ParseSyntaxException

    markdown = (tmp_path / "report-2026-01.md").read_text(encoding="utf-8")
    page = (tmp_path / "report-2026-01.html").read_text(encoding="utf-8")
    for text in (markdown, page):
        assert "<script" not in text and "<img src=x" not in text and "<b>pool" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in markdown
    assert r"a\$b^{\$c" in markdown  # no GitHub math between the two dollars
    assert r"under\_score\*star\~strike\~" in markdown
    assert "a$b^{$c" in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    charts = [p for p in written if p.suffix == ".png"]
    assert charts and all(p.stat().st_size > 5_000 for p in charts)
    summary = (tmp_path / "summary.csv").read_text(encoding="utf-8")
    assert "<" not in summary.split("\n", 1)[0]  # the header is ours
