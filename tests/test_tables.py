"""Every CSV we write follows one convention (idlegpu.forecast.tables): times as ISO 8601 with the
offset, to the second; plain decimals; text that cannot run as a spreadsheet formula."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from idlegpu.forecast.tables import csv_ready, write_csv

REPO = Path(__file__).resolve().parents[1]
OFFSET_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d$")


def test_formula_text_is_escaped_and_other_text_kept():
    frame = pd.DataFrame({"team": ["=HYPERLINK(\"http://x\")", "+1", "-2+3", "@SUM(A1)",
                                   "\tx", "alignment", "a-b"], "n": range(7)})
    out = csv_ready(frame)
    assert list(out["team"]) == ["'=HYPERLINK(\"http://x\")", "'+1", "'-2+3", "'@SUM(A1)",
                                 "'\tx", "alignment", "a-b"]
    assert list(out["n"]) == list(range(7))  # numbers are numbers, negative ones too


def test_times_are_iso_with_the_offset_to_the_second(tmp_path):
    at = pd.Timestamp("2026-01-28 05:11:07.600", tz="UTC")
    frame = pd.DataFrame({"start": [at], "when": [at.to_pydatetime()], "gpu_hours": [12_260.5]})
    path = write_csv(frame, tmp_path / "t.csv", tz="Asia/Seoul", decimals=2)
    text = path.read_text(encoding="utf-8")
    assert text.splitlines() == ["start,when,gpu_hours",
                                 "2026-01-28T14:11:07+09:00,2026-01-28T14:11:07+09:00,12260.50"]
    assert "e+" not in text


def test_a_series_named_like_a_formula_is_not_a_formula_in_the_forecast_csv(
        tmp_path, cli, monkeypatch):
    ds = pd.date_range("2026-01-01", periods=14 * 288, freq="5min", tz="UTC")
    hours = ds.hour.to_numpy()
    history = pd.DataFrame({"unique_id": "=cmd|' /C calc'!A0/replicas", "ds": ds,
                            "y": 4.0 + (hours > 12)})
    source = tmp_path / "h.csv"
    history.to_csv(source, index=False)
    out = tmp_path / "f.csv"
    monkeypatch.chdir(tmp_path)  # no ./idlegpu.yaml: the history alone
    code, _, err = cli(["forecast", "-H", str(source), "--out", str(out), "-m",
                        "seasonal_naive", "--horizon", "2h"])
    assert code == 0, err
    lines = out.read_text(encoding="utf-8").splitlines()
    assert all(line.startswith("'=cmd") for line in lines[1:])
    times = pd.read_csv(out)["ds"]
    assert times.map(lambda t: bool(OFFSET_TIME.match(t))).all()


def test_plan_and_windows_csvs_share_the_pools_local_offset(tmp_path, cli):
    code, _, err = cli([
        "plan", "--history", str(REPO / "data/sample/history.parquet"),
        "--config", str(REPO / "idlegpu.yaml"), "--jobs", str(REPO / "data/sample/jobs.yaml"),
        "--runs", str(REPO / "data/sample/runs.csv"), "--now", "2026-01-28T18:00:00+09:00",
        "--out", str(tmp_path)])
    assert code == 0, err
    for name in ("plan.csv", "windows.csv"):
        table = pd.read_csv(tmp_path / name, dtype=str)
        if name == "plan.csv":  # the units that wait are listed too, each with its reason
            waiting = table[table["outcome"] == "waits"]
            assert len(waiting) and waiting["reason"].str.len().min() > 10
            assert waiting["start"].isna().all()
            table = table[table["outcome"] != "waits"]
        assert len(table), name
        for column in ("start", "end"):
            assert table[column].str.match(OFFSET_TIME.pattern).all(), (name, column)
            assert table[column].str.endswith("+09:00").all(), (name, column)


def test_a_data_file_keeps_every_digit_without_an_exponent(tmp_path):
    frame = pd.DataFrame({"gpu_hours": [4 + 1 / 3, 1e-7, 12_260.5, 2.0]})
    path = write_csv(frame, tmp_path / "runs.csv", decimals=None)
    text = path.read_text(encoding="utf-8")
    assert "e-" not in text and "e+" not in text
    back = pd.read_csv(path)["gpu_hours"]
    assert list(back) == list(frame["gpu_hours"])  # read back exactly
