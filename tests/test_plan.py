"""Tonight's plan: the dry run of decide() over a forecast, and the plan command."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from idlegpu.scheduler.plan import plan_ahead
from idlegpu.scheduler.types import FreeProfile, PolicySettings, WaitingJob

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 1, 28, 9, 0, tzinfo=UTC)  # 18:00 in Seoul


def job(id, gpus, hours, ckpt=False):
    return WaitingJob(id, "t", gpus, hours * 3600, ckpt, 0, T0 - timedelta(hours=1))


def test_jobs_run_back_to_back_in_the_window_and_long_ones_stop_before_it_closes():
    # 2 h of 0 free, then 12 h of 16 free, then 0
    profile = FreeProfile(T0, 300, np.array([0] * 24 + [16] * 144 + [0] * 120, float), 0.9, T0)
    queue = [job("a", 16, 4), job("b", 16, 4), job("long", 8, 40, ckpt=True)]
    plan = plan_ahead(T0, profile, queue, PolicySettings(grace_s=600), horizon=timedelta(hours=24))
    runs = {r.job_id: r for r in plan.runs}
    assert runs["a"].start == T0 + timedelta(hours=2)
    assert runs["a"].outcome == "finishes"
    assert runs["b"].start >= runs["a"].end  # 16 GPUs: one after the other
    window_end = T0 + timedelta(hours=14)
    assert runs["long"].outcome == "checkpoints and stops"
    assert runs["long"].end <= window_end - timedelta(seconds=600)
    assert all(r.end <= window_end for r in plan.runs)
    assert not plan.waiting


def test_a_job_that_never_fits_waits_with_its_reason():
    profile = FreeProfile(T0, 300, np.full(288, 8.0), 0.9, T0)
    plan = plan_ahead(T0, profile, [job("huge", 32, 2)], PolicySettings())
    assert plan.runs == ()
    (waiting, reason), = plan.waiting
    assert waiting.id == "huge" and "needs 32 GPUs; 8 free now" in reason


def test_a_job_past_its_deadline_says_so_not_which_window_opens():
    profile = FreeProfile(T0, 300, np.array([0] * 24 + [16] * 144 + [0] * 120, float), 0.9, T0)
    late = WaitingJob("late", "t", 8, 3600, False, 0, T0 - timedelta(days=2),
                      deadline=T0 - timedelta(hours=1))
    plan = plan_ahead(T0, profile, [late], PolicySettings(), horizon=timedelta(hours=24))
    (waiting, reason), = plan.waiting
    assert waiting.id == "late" and reason == "its deadline has passed (Wed 2026-01-28 08:00 UTC)"


def test_plan_command_on_the_sample(tmp_path, cli):
    code, out, err = cli([
        "plan", "--history", str(REPO / "data/sample/history.parquet"),
        "--config", str(REPO / "idlegpu.yaml"), "--jobs", str(REPO / "data/sample/jobs.yaml"),
        "--runs", str(REPO / "data/sample/runs.csv"), "--now", "2026-01-28T18:00:00+09:00",
        "--out", str(tmp_path),
    ])
    assert code == 0, err
    assert "Plan from Wed 2026-01-28 18:00" in out and "Jobs that start" in out
    plan = pd.read_csv(tmp_path / "plan.csv", parse_dates=["start", "end"])
    assert plan.loc[plan["outcome"] == "waits", "reason"].str.len().min() > 10
    plan = plan[plan["outcome"] != "waits"]  # the units that start
    assert len(plan) >= 5
    local = plan["start"].dt.tz_convert("Asia/Seoul")
    assert (local >= pd.Timestamp("2026-01-28 18:00", tz="Asia/Seoul")).all()
    assert set(plan["outcome"]) <= {"finishes", "checkpoints and stops", "runs on"}
    assert (tmp_path / "free_gpus.png").stat().st_size > 10_000


def test_plan_without_now_starts_right_after_the_newest_sample(tmp_path, cli):
    from idlegpu.forecast.sources import read_history

    history = read_history(REPO / "data/sample/history.parquet")
    last = history[history["ds"] < pd.Timestamp("2026-01-20T09:00:00Z")]
    path = tmp_path / "history.parquet"
    last.to_parquet(path)
    code, out, err = cli([
        "plan", "--history", str(path), "--config", str(REPO / "idlegpu.yaml"),
        "--jobs", str(REPO / "data/sample/jobs.yaml"), "--runs",
        str(REPO / "data/sample/runs.csv"), "--out", str(tmp_path / "plan"),
    ])
    assert code == 0, err
    # the newest sample is 08:55 UTC (17:55 in Seoul): the plan starts one 5-minute step later
    assert "Plan from Tue 2026-01-20 18:00" in out


def test_plan_from_the_store_counts_what_already_runs(tmp_path, cli):
    from datetime import datetime

    from idlegpu.scheduler.adapters.store import JobStore

    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    for name in ("pretrain.yaml", "datagen.yaml"):
        code, _, err = cli(["submit", str(REPO / "examples/jobs" / name), "--store", store,
                            "--now", "2026-01-28T17:00:00+09:00"])
        assert code == 0, err
    with JobStore(store) as jobs:
        unit = next(u for u in jobs.queue() if u.request_name.startswith("pretrain"))
        began = datetime.fromisoformat("2026-01-28T17:30:00+09:00")
        jobs.admit(unit.id, began)
        jobs.started(unit.id, began)
    code, out, err = cli([
        "plan", "--history", str(REPO / "data/sample/history.parquet"), "--store", store,
        "--config", str(REPO / "idlegpu.yaml"), "--runs", str(REPO / "data/sample/runs.csv"),
        "--now", "2026-01-28T18:00:00+09:00", "--out", str(tmp_path / "plan"),
    ])
    assert code == 0, err
    plan = pd.read_csv(tmp_path / "plan" / "plan.csv")
    held = plan[plan["job_id"] == unit.id]
    assert list(held["reason"]) == ["already running"]  # its 32 GPUs are not offered again
