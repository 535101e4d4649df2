"""The commands write under out/ unless told otherwise: nothing lands beside the committed
reports/sample/ or over data/sample/ by default."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import typer.main
from test_reports import run

from idlegpu.scheduler.cli import app
from idlegpu.scheduler.reports import validate_runs

REPO = Path(__file__).resolve().parents[1]


def _default(command: str, option: str):
    group = typer.main.get_command(app)
    params = {p.name: p for p in group.commands[command].params}
    return params[option].default


def test_report_writes_under_out_by_default(tmp_path, cli, monkeypatch):
    rows = [run("a", "2026-01-10T20:00", "2026-01-11T02:00", 4)]
    runs = tmp_path / "runs.csv"
    validate_runs(pd.DataFrame(rows)).to_csv(runs, index=False)
    shutil.copy(REPO / "idlegpu.yaml", tmp_path / "idlegpu.yaml")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(["report", "--runs", str(runs), "--month", "2026-01"])
    assert code == 0, err
    assert (tmp_path / "out" / "reports" / "report-2026-01.md").is_file()
    assert not (tmp_path / "reports").exists()


def test_sample_and_report_defaults_are_under_out():
    assert str(_default("sample", "out")) == "out/sample"
    assert str(_default("report", "out")) == "out/reports"
    assert str(_default("plan", "out")).startswith("out/")
