"""One number per quantity: the simulator's figures are the report's, computed the same way
from the same run table; a shorter simulation counts only its own jobs; the report names the
planned stops whose GPU-hours it counts as lost."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from idlegpu.forecast.config import load_config
from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.plan import planning_estimate
from idlegpu.scheduler.reports import build_report, render_markdown, useful, validate_runs
from idlegpu.scheduler.simulate import simulate, trace_jobs
from idlegpu.scheduler.specs import load_trace

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def simulated():
    settings = load_config(REPO / "idlegpu.yaml")
    history = read_history(REPO / "data/sample/history.parquet")
    entries = load_trace(REPO / "data/sample/jobs.yaml", settings.admission)
    jobs = trace_jobs(entries, planning_estimate(settings))
    start = datetime.fromisoformat("2026-01-05T00:00:00+09:00")
    end = start + timedelta(days=4)
    result = simulate(history, settings, jobs, "oracle", start=start, end=end)
    return result, jobs, start, end


def test_the_simulators_useful_gpu_hours_are_the_reports(simulated):
    result, _, _, _ = simulated
    m = result.metrics
    runs = validate_runs(result.runs.drop(columns=["nodes"], errors="ignore"))
    assert m["useful_gpu_hours"] == pytest.approx(useful(runs).sum())
    report = build_report(runs, "2026-01", tz="Asia/Seoul")
    assert report.row.useful_gpu_hours == pytest.approx(m["useful_gpu_hours"])
    assert report.row.lost_gpu_hours == pytest.approx(m["lost_gpu_hours"])
    assert report.row.preemptions == m["preemptions"]
    assert report.row.planned_stops == m["planned_stops"]
    if (runs["outcome"] == "running").any():  # an attempt still running counts the same way
        assert useful(runs[runs["outcome"] == "running"]).sum() > 0


def test_a_shorter_simulation_counts_only_the_jobs_it_could_run(simulated):
    result, jobs, _, end = simulated
    by_end = sum(j.submit_at <= end for j in jobs)  # the backlog from before its start too
    assert 0 < by_end < len(jobs)
    assert result.metrics["jobs"] == by_end
    assert result.metrics["jobs_finished"] <= result.metrics["jobs"]


def test_the_report_says_planned_stops_lost_the_gpu_hours_not_preemptions():
    rows = [{"job_id": "a", "team": "t", "kind": "train", "gpus": 8,
             "start": "2026-01-10T20:00:00+09:00", "end": "2026-01-11T07:00:00+09:00",
             "outcome": "stopped", "gpu_hours": 88.0, "lost_gpu_hours": 2.0},
            {"job_id": "a", "team": "t", "kind": "train", "gpus": 8,
             "start": "2026-01-11T20:00:00+09:00", "end": "2026-01-12T02:00:00+09:00",
             "outcome": "finished", "gpu_hours": 48.0, "lost_gpu_hours": 0.0}]
    report = build_report(validate_runs(pd.DataFrame(rows)), "2026-01", tz="Asia/Seoul")
    text = " ".join(render_markdown(report, {}).split())
    assert "0 preemptions and 1 planned stops lost 2.0 GPU-hours" in text
