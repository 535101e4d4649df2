"""Monthly reports: hand-computed figures, rendered files read back, clear errors."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pandas as pd
import pytest

from idlegpu.forecast.errors import PermanentError
from idlegpu.scheduler.config import ReportConfig, load_config
from idlegpu.scheduler.reports import (
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    Month,
    ReportError,
    build_report,
    daily_usage,
    format_change,
    format_gpus,
    format_hours,
    format_money,
    gpu_equivalent,
    month_range,
    read_runs,
    runs_from_store,
    validate_runs,
    write_report,
)

TZ = "Asia/Seoul"
KST = ZoneInfo(TZ)


def kst(text: str) -> str:
    """A local Seoul time written as an ISO 8601 instant with its offset."""
    return datetime.fromisoformat(text).replace(tzinfo=KST).isoformat()


def run(job, start, end, gpus, outcome="finished", lost=0.0, team="alpha", kind="eval"):
    hours = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() / 3600
    return {"job_id": job, "team": team, "kind": kind, "gpus": gpus, "start": kst(start),
            "end": kst(end), "outcome": outcome, "gpu_hours": gpus * hours,
            "lost_gpu_hours": lost}


def hand_runs() -> pd.DataFrame:
    rows = [
        # crosses Jan -> Feb: 4 GPUs x 6 h = 24 GPU-h, 2 h (8) in January, 4 h (16) in February
        run("x", "2026-01-31T22:00", "2026-02-01T04:00", 4, team="alpha", kind="train"),
        # two overlapping runs: 8 x 12 h = 96 and 4 x 4 h = 16 -> 112 GPU-h
        run("a", "2026-01-10T20:00", "2026-01-11T08:00", 8, team="alpha", kind="eval"),
        run("b", "2026-01-10T22:00", "2026-01-11T02:00", 4, team="beta", kind="eval"),
        # preempted in January: 2 x 6 h = 12 GPU-h, 4 lost -> 8 useful
        run("p", "2026-01-20T20:00", "2026-01-21T02:00", 2, "preempted", 4.0, team="beta",
            kind="train"),
        # preempted across Feb (28 days) -> Mar: 1 x 6 h, 3 lost -> 3 useful spread 4:2 by time;
        # the 3 lost GPU-hours and the preemption belong to March (where it ended)
        run("q", "2026-02-28T20:00", "2026-03-01T02:00", 1, "preempted", 3.0, team="beta",
            kind="train"),
    ]
    return validate_runs(pd.DataFrame(rows))


@pytest.fixture
def report():
    return build_report(hand_runs(), "2026-03", months=3, tz=TZ, price=3000, currency="KRW",
                        pool="test-pool")


# --------------------------------------------------------------------------- definitions


def test_gpu_equivalents_of_40920_gpu_hours_in_a_31_day_month():
    assert gpu_equivalent(40_920, 31, 12) == pytest.approx(110)
    assert gpu_equivalent(40_920, 31, 24) == pytest.approx(55)
    # the same through the report: 55 GPUs held all of January 2026 (local) = 40,920 GPU-h
    runs = validate_runs(pd.DataFrame([run("big", "2026-01-01T00:00", "2026-02-01T00:00", 55)]))
    row = build_report(runs, "2026-01", tz=TZ).row
    assert row.days == 31
    assert row.useful_gpu_hours == pytest.approx(40_920)
    assert row.gpus_12h == pytest.approx(110) and row.gpus_24h == pytest.approx(55)


@pytest.mark.parametrize(("month", "days"), [("2026-02", 28), ("2026-04", 30), ("2026-01", 31),
                                             ("2024-02", 29)])
def test_month_lengths_and_equivalents(month, days):
    m = Month.parse(month)
    assert m.days == days
    end = (m.shift(1).label + "-01T00:00")
    runs = validate_runs(pd.DataFrame([run("j", f"{month}-01T00:00", end, 10)]))
    row = build_report(runs, month, tz=TZ).row
    assert row.useful_gpu_hours == pytest.approx(10 * 24 * days)
    assert row.gpus_24h == pytest.approx(10) and row.gpus_12h == pytest.approx(20)


def test_month_range_ends_with_the_month_and_crosses_years():
    assert [m.label for m in month_range("2026-01", 3)] == ["2025-11", "2025-12", "2026-01"]
    with pytest.raises(ReportError, match="YYYY-MM"):
        Month.parse("2026-13")
    with pytest.raises(ReportError, match="at least 1"):
        month_range("2026-01", 0)


def test_month_boundaries_are_local_time():
    jan = Month(2026, 1)
    assert jan.start(TZ) == pd.Timestamp("2025-12-31T15:00", tz="UTC")
    assert jan.end(TZ) == pd.Timestamp("2026-01-31T15:00", tz="UTC")


# --------------------------------------------------------------------------- hand figures


def test_hand_computed_monthly_figures(report):
    s = report.summary.set_index("month")
    assert list(s.index) == ["2026-01", "2026-02", "2026-03"]
    assert list(s["days"]) == [31, 28, 31]
    # January: 8 (2/6 of the crossing run) + 112 (overlapping runs) + 8 (preempted, useful)
    assert s.loc["2026-01", "useful_gpu_hours"] == pytest.approx(128)
    assert s.loc["2026-01", "lost_gpu_hours"] == pytest.approx(4)
    assert s.loc["2026-01", "preemptions"] == 1
    assert s.loc["2026-01", "jobs_run"] == 4 and s.loc["2026-01", "jobs_finished"] == 2
    # February: 16 (4/6 of the crossing run) + 2 (4/6 of q's 3 useful)
    assert s.loc["2026-02", "useful_gpu_hours"] == pytest.approx(18)
    assert s.loc["2026-02", "lost_gpu_hours"] == 0 and s.loc["2026-02", "preemptions"] == 0
    assert s.loc["2026-02", "jobs_run"] == 2 and s.loc["2026-02", "jobs_finished"] == 1
    # March: 1 useful (2/6 of 3), the 3 lost GPU-hours and the preemption of q
    assert s.loc["2026-03", "useful_gpu_hours"] == pytest.approx(1)
    assert s.loc["2026-03", "lost_gpu_hours"] == pytest.approx(3)
    assert s.loc["2026-03", "preemptions"] == 1
    assert s.loc["2026-03", "jobs_run"] == 1 and s.loc["2026-03", "jobs_finished"] == 0
    # equivalents
    assert s.loc["2026-01", "gpus_12h"] == pytest.approx(128 / (12 * 31))
    assert s.loc["2026-02", "gpus_24h"] == pytest.approx(18 / (24 * 28))
    # month over month: December had nothing -> n/a
    assert math.isnan(s.loc["2026-01", "mom_change"])
    assert s.loc["2026-02", "mom_change"] == pytest.approx(18 / 128 - 1)
    assert s.loc["2026-03", "mom_change"] == pytest.approx(1 / 18 - 1)
    # savings at KRW 3,000 per GPU-hour and cumulative totals
    assert list(s["savings"]) == pytest.approx([384_000, 54_000, 3_000])
    assert list(s["cumulative_savings"]) == pytest.approx([384_000, 438_000, 441_000])
    assert set(s["currency"]) == {"KRW"}


def test_overlapping_runs_split_by_local_day():
    runs = hand_runs()
    daily = daily_usage(runs, [Month(2026, 1)], TZ)
    # Jan 10: a 8 GPUs x 4 h + b 4 x 2 h = 40; Jan 11: 8 x 8 + 4 x 2 = 72
    assert daily.loc["2026-01-10", ["alpha", "beta"]].sum() == pytest.approx(40)
    assert daily.loc["2026-01-11", ["alpha", "beta"]].sum() == pytest.approx(72)
    assert daily.loc["2026-01-10", "beta"] == pytest.approx(8)
    # the whole month adds up to January's useful GPU-hours
    assert daily[["alpha", "beta"]].to_numpy().sum() == pytest.approx(128)
    # held counts lost GPU-hours too: January held = 128 + 4
    assert daily["held"].sum() == pytest.approx(132)


def test_team_and_kind_breakdowns(report):
    teams = report.teams.set_index("team")  # March: only q (beta)
    assert list(teams.index) == ["beta"]
    assert teams.loc["beta", "lost_gpu_hours"] == pytest.approx(3)
    jan = build_report(hand_runs(), "2026-01", tz=TZ)
    teams = jan.teams.set_index("team")
    assert teams.loc["alpha", "useful_gpu_hours"] == pytest.approx(8 + 96)
    assert teams.loc["beta", "useful_gpu_hours"] == pytest.approx(16 + 8)
    assert teams.loc["beta", "preemptions"] == 1
    assert teams["share"].sum() == pytest.approx(1)
    kinds = jan.kinds.set_index("kind")
    assert kinds.loc["eval", "jobs_run"] == 2 and kinds.loc["eval", "jobs_finished"] == 2
    assert kinds.loc["train", "jobs_run"] == 2 and kinds.loc["train", "jobs_finished"] == 0


def test_attempt_ending_at_local_midnight_belongs_to_the_month_before():
    runs = validate_runs(pd.DataFrame([run("m", "2025-12-31T20:00", "2026-01-01T00:00", 2)]))
    with pytest.raises(ReportError, match="no runs in 2026-01"):
        build_report(runs, "2026-01", tz=TZ)
    row = build_report(runs, "2025-12", tz=TZ).row
    assert row.jobs_finished == 1 and row.useful_gpu_hours == pytest.approx(8)


def test_idle_share_uses_held_gpu_hours():
    runs = hand_runs()
    idle = pd.Series([100.0] * 31, index=pd.date_range("2026-01-01", periods=31, freq="D"))
    row = build_report(runs, "2026-01", tz=TZ, idle_daily=idle).row
    assert row.idle_gpu_hours == pytest.approx(3100)
    assert row.idle_share_used == pytest.approx(132 / 3100)


# --------------------------------------------------------------------------- money


def test_currency_formatting():
    assert format_money(75_000_000, "KRW") == "KRW 75,000,000"
    assert format_money(1234.4, "KRW") == "KRW 1,234"
    assert format_money(1234.5, "USD") == "USD 1,234.50"
    assert format_money(0.5, "EUR") == "EUR 0.50"
    assert format_money(1_000_000, "JPY") == "JPY 1,000,000"
    assert format_money(-12.345, "USD") == "-USD 12.35"
    assert format_money(float("nan"), "USD") == "n/a"


def test_report_config_validates_the_currency():
    assert ReportConfig().currency == "KRW" and ReportConfig().price_per_gpu_hour == 3000
    for bad in ("krw", "KR", "KRWX", "12$"):
        with pytest.raises(ValueError, match="ISO 4217"):
            ReportConfig(currency=bad)
    settings = load_config("idlegpu.yaml")
    assert settings.report == ReportConfig()


def test_build_report_refuses_a_bad_currency_or_price():
    with pytest.raises(ReportError, match="ISO 4217"):
        build_report(hand_runs(), "2026-01", tz=TZ, currency="usd")
    with pytest.raises(ReportError, match="price"):
        build_report(hand_runs(), "2026-01", tz=TZ, price=-1)


# --------------------------------------------------------------------------- rendered


def test_rendered_report_reads_back(report, tmp_path):
    files = write_report(report, tmp_path)
    names = {p.name for p in files}
    assert {"report-2026-03.md", "report-2026-03.html", "summary.csv"} <= names
    assert len([n for n in names if n.endswith(".png")]) == 4
    back = pd.read_csv(tmp_path / "summary.csv")
    assert list(back.columns) == list(SUMMARY_COLUMNS)
    for col in SUMMARY_COLUMNS:
        if col in ("month", "currency"):
            assert list(back[col]) == list(report.summary[col])
        else:
            assert back[col].to_numpy(dtype=float) == pytest.approx(
                report.summary[col].to_numpy(dtype=float), nan_ok=True, abs=1e-5)
    md = (tmp_path / "report-2026-03.md").read_text(encoding="utf-8")
    for row in back.itertuples():
        for text in (format_hours(row.useful_gpu_hours), format_gpus(row.gpus_12h),
                     format_gpus(row.gpus_24h), format_money(row.savings, row.currency),
                     format_money(row.cumulative_savings, row.currency),
                     format_change(row.mom_change)):
            assert text in md
    assert "| 2026-01 | 31 | 128.0 | 0.3 | 0.2 | n/a |" in md
    assert "KRW 441,000" in md and "KRW 384,000" in md
    for png in (n for n in names if n.endswith(".png")):
        assert f"]({png})" in md
    page = (tmp_path / "report-2026-03.html").read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == 4
    assert ".png\"" not in page and "KRW 441,000" in page and "<style>" in page


def test_markdown_escapes_names(tmp_path):
    runs = hand_runs()
    runs.loc[runs["team"] == "beta", "team"] = "<img src=x>|be_ta*"
    report = build_report(runs, "2026-01", tz=TZ, pool="pool [a](http://x)")
    write_report(report, tmp_path)
    md = (tmp_path / "report-2026-01.md").read_text(encoding="utf-8")
    assert "<img" not in md and "[a](" not in md
    assert "| &lt;img src=x&gt;\\|be\\_ta\\* |" in md
    assert "# pool \\[a\\](http://x): harvested GPUs, 2026-01" in md
    page = (tmp_path / "report-2026-01.html").read_text(encoding="utf-8")
    assert "<img src=x>" not in page and "&lt;img src=x&gt;|be_ta*" in page


def test_cli_report_from_a_runs_file(cli, tmp_path):
    path = tmp_path / "runs.csv"
    pd.DataFrame([run("big", "2026-01-01T00:00", "2026-02-01T00:00", 55)]).to_csv(path,
                                                                                  index=False)
    code, out, err = cli(["report", "--runs", str(path), "--month", "2026-01", "--out",
                          str(tmp_path / "out"), "--config", "idlegpu.yaml", "--price", "2.5",
                          "--currency", "USD"])
    assert code == 0, err
    assert "110.0 GPUs (12 h)" in out and "55.0 GPUs (24 h)" in out
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert summary.loc[0, "savings"] == pytest.approx(40_920 * 2.5)
    md = (tmp_path / "out" / "report-2026-01.md").read_text(encoding="utf-8")
    assert "USD 102,300.00" in md and "40,920.0" in md


# --------------------------------------------------------------------------- errors


def _write(tmp_path, rows, drop=None):
    frame = pd.DataFrame(rows)
    if drop:
        frame = frame.drop(columns=drop)
    path = tmp_path / "runs.csv"
    frame.to_csv(path, index=False)
    return path


def _good():
    return [run("a", "2026-01-10T20:00", "2026-01-11T08:00", 8),
            run("b", "2026-01-12T20:00", "2026-01-13T08:00", 4)]


@pytest.mark.parametrize(("change", "pattern"), [
    ({"start": "yesterday"}, r"runs\.csv line 3: start 'yesterday' is not an ISO 8601 time"),
    ({"end": kst("2026-01-12T19:00")}, r"line 3: end .* is before start"),
    ({"gpus": -4}, r"line 3: gpus must be a positive whole number \(got -4\)"),
    ({"gpus": "many"}, r"line 3: gpus 'many' is not a number"),
    ({"outcome": "exploded"}, r"line 3: outcome 'exploded' is unknown"),
    ({"lost_gpu_hours": 999}, r"line 3: lost_gpu_hours \(999\) is above gpu_hours"),
    ({"team": ""}, r"line 3: team is empty"),
])
def test_bad_rows_name_the_line_and_field(tmp_path, change, pattern):
    rows = _good()
    rows[1].update(change)
    with pytest.raises(ReportError, match=pattern) as info:
        read_runs(_write(tmp_path, rows))
    assert "\n" not in str(info.value)
    assert isinstance(info.value, PermanentError)


def test_missing_column_is_named(tmp_path):
    with pytest.raises(ReportError, match=r"missing column\(s\) end;"):
        read_runs(_write(tmp_path, _good(), drop=["end"]))


def test_missing_runs_file(tmp_path):
    with pytest.raises(ReportError, match="not found"):
        read_runs(tmp_path / "nope.csv")


def test_empty_month_is_an_error():
    with pytest.raises(ReportError, match=r"no runs in 2026-05 \(Asia/Seoul\): the runs cover "
                       r"2026-01-10 to 2026-03-01"):
        build_report(hand_runs(), "2026-05", tz=TZ)
    empty = validate_runs(pd.DataFrame(columns=list(RUN_COLUMNS)))
    with pytest.raises(ReportError, match="the runs are empty"):
        build_report(empty, "2026-01", tz=TZ)


def test_month_with_only_failures_is_an_error():
    rows = [run("f", "2026-01-10T20:00", "2026-01-11T00:00", 2, "failed", 8.0),
            run("g", "2026-01-12T20:00", "2026-01-12T22:00", 1, "preempted", 2.0)]
    with pytest.raises(ReportError, match=r"no useful GPU-hours in 2026-01 .* all 2 attempt\(s\) "
                       r"failed or lost their work \(1 failed or cancelled, 1 preempted"):
        build_report(validate_runs(pd.DataFrame(rows)), "2026-01", tz=TZ)


def test_earlier_empty_months_show_zeros():
    report = build_report(hand_runs(), "2026-01", months=3, tz=TZ)
    s = report.summary.set_index("month")
    assert s.loc["2025-11", "useful_gpu_hours"] == 0 and s.loc["2025-11", "jobs_run"] == 0
    assert math.isnan(s.loc["2025-12", "mom_change"])


def test_cli_errors_are_one_line(cli, tmp_path):
    rows = _good()
    rows[0]["gpus"] = -1
    code, _out, err = cli(["report", "--runs", str(_write(tmp_path, rows)), "--month", "2026-01",
                          "--out", str(tmp_path / "o"), "--config", "idlegpu.yaml"])
    assert code == 2
    assert "line 2: gpus must be a positive whole number" in err
    assert len(err.strip().splitlines()) <= 2  # rich may wrap; no traceback
    assert "Traceback" not in err


# --------------------------------------------------------------------------- store


def test_runs_from_store_maps_attempts():
    t0 = datetime(2026, 1, 10, 11, tzinfo=UTC)
    unit = SimpleNamespace(id="r1-0-0", team="alpha", kind="eval")
    attempts = [
        SimpleNamespace(admitted_at=t0, ended_at=t0 + timedelta(hours=2), outcome="preempted",
                        gpus=4, gpu_seconds=4 * 7200.0, lost_gpu_seconds=3600.0),
        SimpleNamespace(admitted_at=t0 + timedelta(hours=3), ended_at=t0 + timedelta(hours=5),
                        outcome="succeeded", gpus=4, gpu_seconds=4 * 7200.0,
                        lost_gpu_seconds=None),
        SimpleNamespace(admitted_at=t0 + timedelta(hours=6), ended_at=None, outcome=None,
                        gpus=4, gpu_seconds=None, lost_gpu_seconds=None),
    ]
    store = SimpleNamespace(queue=lambda include_terminal: [unit], attempts=lambda _id: attempts)
    runs = runs_from_store(store, t0 + timedelta(hours=7))
    assert list(runs["outcome"]) == ["preempted", "finished", "running"]
    assert list(runs["gpu_hours"]) == pytest.approx([8, 8, 4])
    assert list(runs["lost_gpu_hours"]) == pytest.approx([1, 0, 0])
    row = build_report(runs, "2026-01", tz=TZ).row
    assert row.useful_gpu_hours == pytest.approx(19) and row.preemptions == 1


def test_forecast_accuracy_of_a_month_uses_only_the_past():
    from pathlib import Path

    from idlegpu.forecast.sources import read_history
    from idlegpu.scheduler.config import load_config
    from idlegpu.scheduler.reports import ReportError, forecast_accuracy

    repo = Path(__file__).resolve().parents[1]
    settings = load_config(repo / "idlegpu.yaml")
    history = read_history(repo / "data" / "sample" / "history.parquet")
    early = history[history["ds"] < pd.Timestamp("2025-10-12T15:00Z")]  # to Oct 13 00:00 KST
    accuracy = forecast_accuracy(early, settings, "2025-10")
    assert accuracy["cutoffs"] == 4  # Oct 8-11 at 17:00 (the refresh hour): a week behind, a day ahead
    assert 0 <= accuracy["mae"] < 1 and 0 < accuracy["pinball"] < 1
    assert 0.5 <= accuracy["coverage"] <= 1 and 0.5 <= accuracy["precision"] <= 1
    assert accuracy["strict_coverage"] <= accuracy["coverage"]
    assert accuracy["refresh_hour"] == settings.daemon.forecast_refresh_hour
    with pytest.raises(ReportError, match="does not cover 2026-03"):
        forecast_accuracy(early, settings, "2026-03")


def test_the_months_checkpoint_notices_have_their_own_table(tmp_path):
    notices = {"sent": 5.0, "answered": 3.0, "missed": 1.0, "cut": 1.0, "ended": 0.0,
               "saved_gpu_hours": 42.5}
    report = build_report(hand_runs(), "2026-03", months=3, tz=TZ, notices=notices)
    write_report(report, tmp_path)
    md = (tmp_path / "report-2026-03.md").read_text(encoding="utf-8")
    assert "## Checkpoint notices, 2026-03" in md
    assert "| 5 | 3 | 1 | 1 | 0 | 42.5 |" in md
    page = (tmp_path / "report-2026-03.html").read_text(encoding="utf-8")
    assert "Checkpoint notices, 2026-03" in page
    # a month without notices (or a report from a run table) has no such section
    write_report(build_report(hand_runs(), "2026-03", months=3, tz=TZ), tmp_path / "none")
    assert "Checkpoint notices" not in (tmp_path / "none" / "report-2026-03.md").read_text()
