"""The simulator on a small pool whose every step is known."""


import numpy as np
import pandas as pd
import pytest

from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.reports import useful
from idlegpu.scheduler.simulate import SimJob, delay_events, simulate
from idlegpu.scheduler.simulate.results import CAUSE_NAMES, lost_work

TZ = "Asia/Seoul"
START = pd.Timestamp("2026-01-05 00:00", tz=TZ)  # a Monday


def pool(days: int = 14, **fields):
    """One service of 4-GPU replicas in a 40-GPU pool (no headroom): 2 replicas from 20:00 to
    08:00 (32 GPUs free), 9 by day (4 free), over ``days`` days; ``fields`` add to ``pool:``."""
    settings = load_config(
        data={
            "pool": {"total_gpus": 40, "headroom_gpus": 0, "timezone": TZ, **fields},
            "query_templates": {"replicas": "r"},
            "services": [{"name": "svc", "gpus_per_replica": 4, "min_replicas": 2,
                          "max_replicas": 10}],
            "admission": {"grace_seconds": 900, "min_segment_seconds": 1800},
        }
    )
    local = pd.date_range(START, periods=days * 96, freq="15min")
    night = (local.hour >= 20) | (local.hour < 8)
    history = pd.DataFrame({"unique_id": "svc/replicas", "ds": local.tz_convert("UTC"),
                            "y": np.where(night, 2.0, 9.0)})
    return settings, history


def at(day, hour):
    return (START + pd.Timedelta(days=day, hours=hour)).tz_convert("UTC").to_pydatetime()


def job(id, gpus, hours, ckpt, submit=(7, 19), **kw):
    return SimJob(id=id, team="t", kind="x", gpus=gpus, submit_at=at(*submit),
                  work_s=hours * 3600, estimate_s=hours * 3600, checkpointable=ckpt,
                  checkpoint_interval_s=3600, **kw)


def run(policy, jobs, days=(7, 11), **options):
    settings, history = pool()
    return simulate(history, settings, jobs, policy, start=at(days[0], 0), end=at(days[1], 0),
                    **options)


def test_a_whole_night_job_finishes_under_every_policy():
    for policy in ("night", "reactive", "forecast", "oracle", "clairvoyant"):
        result = run(policy, [job("eval", 16, 6, ckpt=False)])
        m = result.metrics
        assert m["jobs_finished"] == 1, policy
        assert m["useful_gpu_hours"] == pytest.approx(16 * 6), policy
        assert m["lost_gpu_hours"] == 0 and m["service_delay_gpu_minutes"] == 0, policy
        start = pd.Timestamp(result.runs["start"].iloc[0]).tz_convert(TZ)
        assert start.hour >= 20 or start.hour < 8, policy


def test_reactive_runs_into_the_morning_and_the_service_waits():
    # submitted at 05:00: free now, but 6 h do not fit before 08:00
    eval_job = job("eval", 16, 6, ckpt=False, submit=(7, 5))
    reactive = run("reactive", [eval_job]).metrics
    assert reactive["lost_gpu_hours"] > 0  # killed at 08:00, started again later
    assert reactive["service_delay_gpu_minutes"] > 0  # the service waited out the grace period
    assert reactive["preemptions"] >= 1
    # each step the service waited is on record, at the morning scale-up (08:00), and adds up
    waited = run("reactive", [eval_job]).delays
    assert len(waited) >= 1 and (waited["gpus_short"] > 0).all()
    assert (waited["time"].dt.tz_convert(TZ).dt.hour == 8).all()
    assert (waited["gpus_short"].sum() * 15 == pytest.approx(
        reactive["service_delay_gpu_minutes"]))
    # the wait began as the service rose from 2 to 9 replicas in one step: 28 GPUs, above the
    # pool's headroom (none), one event per morning the job was in the way
    events = delay_events(waited, 900, headroom_gpus=0)
    assert waited["service_rise_gpus"].iloc[0] == 28
    assert (events["opening_rise_gpus"] == 28).all() and events["above_headroom"].all()
    assert events["gpu_minutes"].sum() == pytest.approx(reactive["service_delay_gpu_minutes"])
    assert events["steps"].sum() == len(waited)
    for policy in ("forecast", "oracle"):
        m = run(policy, [eval_job]).metrics
        assert m["lost_gpu_hours"] == 0 and m["service_delay_gpu_minutes"] == 0, policy
        assert m["jobs_finished"] == 1, policy


def test_a_long_checkpointable_job_runs_over_several_nights_without_loss():
    train = job("train", 32, 30, ckpt=True, submit=(7, 18))
    # (restarts free: the checkpoints alone; test_a_resume_reloads_its_checkpoint charges them)
    result = run("oracle", [train], days=(7, 12), restart_cost_s=0)
    m = result.metrics
    assert m["jobs_finished"] == 1
    assert m["lost_gpu_hours"] == 0 and m["service_delay_gpu_minutes"] == 0
    assert m["planned_stops"] >= 2  # stopped before each morning, resumed each night
    assert (result.runs["outcome"] == "stopped").sum() == m["planned_stops"]
    # useful = held - lost, the report's definition, on the run table the report reads: the
    # 30 h of work, and the grace periods in which it checkpointed before each stop
    assert m["useful_gpu_hours"] == pytest.approx(useful(result.runs).sum())
    grace_h = 32 * m["planned_stops"] * 900 / 3600  # admission.grace_seconds of this pool
    assert m["useful_gpu_hours"] == pytest.approx(32 * 30 + grace_h, abs=32 * 5 / 60)


def test_dependencies_run_in_order():
    first = job("prep", 8, 1, ckpt=False)
    second = job("train", 8, 1, ckpt=False, depends_on=("prep",))
    runs = run("oracle", [second, first]).runs.set_index("job_id")
    assert runs.loc["train", "start"] >= runs.loc["prep", "end"]


def test_the_idle_share_is_useful_over_idle_gpu_hours():
    m = run("oracle", [job("eval", 16, 6, ckpt=False)]).metrics
    # 4 days: each has 12 night hours x 32 free + 12 day hours x 4 free
    assert m["idle_gpu_hours"] == pytest.approx(4 * (12 * 32 + 12 * 4))
    assert m["idle_share_used"] == pytest.approx(96 / m["idle_gpu_hours"])


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy 'greedy'"):
        run("greedy", [])


@pytest.mark.slow
@pytest.mark.parametrize("days", [90], ids=["90-days"])
def test_the_clairvoyant_is_an_upper_bound_on_the_sample(days):
    """On the sample pool and trace (the README's 90 days; ``days=None``: the whole sample as
    ``idlegpu simulate`` runs it by default, 50 s more, which the oracle once failed and the
    clairvoyant, never below the oracle by construction, passed), no policy harvests more
    useful GPU-hours than the clairvoyant reference, and none more than the physical limit."""
    from pathlib import Path

    from idlegpu.forecast.sources import read_history
    from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs
    from idlegpu.scheduler.simulate import POLICIES, trace_jobs
    from idlegpu.scheduler.specs import load_trace

    repo = Path(__file__).resolve().parents[1]
    settings = load_config(repo / "idlegpu.yaml")
    history = read_history(repo / "data/sample/history.parquet")
    estimator = RuntimeEstimator.from_config(load_runs(repo / "data/sample/runs.csv"),
                                             settings.admission)
    jobs = trace_jobs(load_trace(repo / "data/sample/jobs.yaml", settings.admission),
                      lambda unit: estimator.estimate(unit).seconds)
    if days is None:  # as the command picks it: two weeks of warm-up, to the end
        start = max(history["ds"].min() + pd.Timedelta(days=14),
                    min(j.submit_at for j in jobs))
        start, end = pd.Timestamp(start).ceil("h"), history["ds"].max()
    else:
        start = pd.Timestamp("2025-10-15T00:00:00+09:00").tz_convert("UTC")
        end = start + pd.Timedelta(days=days)
    metrics = {p: simulate(history, settings, jobs, p, start=start.to_pydatetime(),
                           end=end.to_pydatetime()).metrics for p in POLICIES}
    bound = metrics["clairvoyant"]
    assert bound["lost_gpu_hours"] == 0 and bound["service_delay_gpu_minutes"] == 0
    for policy, m in metrics.items():
        for figure in ("useful_gpu_hours", "work_gpu_hours"):
            assert m[figure] <= bound[figure] + 1e-6, (policy, figure, m[figure], bound[figure])
        assert m["work_gpu_hours"] <= m["useful_gpu_hours"] + 1e-6, policy
        assert m["useful_gpu_hours"] <= m["physical_limit_gpu_hours"], policy

def dips():
    """The pool of ``pool()`` held at 9 replicas (4 GPUs free), but for 30 minutes every two
    hours at 5 (20 free): windows too short for the oracle's worthwhile segment."""
    settings, history = pool()
    local = pd.date_range(START, periods=14 * 96, freq="15min")
    dip = (local.minute < 30) & (local.hour % 2 == 0)
    return settings, history.assign(y=np.where(dip, 5.0, 9.0))


def test_the_clairvoyant_bounds_reactive_where_the_oracle_does_not():
    settings, history = dips()
    jobs = [job("train", 16, 20, ckpt=True, submit=(7, 0)),
            job("eval", 16, 0.5, ckpt=False, submit=(7, 0))]
    m = {p: simulate(history, settings, jobs, p, start=at(7, 0), end=at(8, 0)).metrics
         for p in ("reactive", "oracle", "clairvoyant")}
    # reactive harvests the dips (and loses work, and makes the service wait, at their end);
    # the oracle, planning only whole worthwhile segments, harvests nothing
    assert m["oracle"]["useful_gpu_hours"] < m["reactive"]["useful_gpu_hours"]
    assert m["reactive"]["lost_gpu_hours"] > 0 and m["reactive"]["service_delay_gpu_minutes"] > 0
    clairvoyant = m["clairvoyant"]
    assert clairvoyant["useful_gpu_hours"] > m["reactive"]["useful_gpu_hours"]
    assert clairvoyant["work_gpu_hours"] > m["reactive"]["work_gpu_hours"]
    assert clairvoyant["work_gpu_hours"] <= clairvoyant["physical_limit_gpu_hours"]
    # it saves and resumes at will: no work lost, no reload
    assert clairvoyant["lost_gpu_hours"] == 0 == clairvoyant["restart_gpu_hours"]
    assert clairvoyant["service_delay_gpu_minutes"] == 0
    assert clairvoyant["jobs_finished"] == 1  # the eval fits a dip whole


def test_the_clairvoyant_stops_every_unit_without_loss_a_grace_period_ahead():
    settings, history = pool()
    # a 6-hour eval that cannot checkpoint, submitted at 05:00: only 3 hours to the ramp
    result = simulate(history, settings, [job("eval", 16, 6, ckpt=False, submit=(7, 5))],
                      "clairvoyant", start=at(7, 0), end=at(9, 0))
    m, runs = result.metrics, result.runs
    assert m["lost_gpu_hours"] == 0 and m["service_delay_gpu_minutes"] == 0
    assert m["jobs_finished"] == 1
    first = runs.iloc[0]
    assert first["outcome"] == "stopped"  # saved at will, though it cannot checkpoint
    # it left before the service came back at 08:00, after a 15-minute grace period
    assert pd.Timestamp(first["end"]).tz_convert(TZ) <= pd.Timestamp("2026-01-12 08:00", tz=TZ)
    assert m["useful_gpu_hours"] == pytest.approx(16 * 6 + 16 * 0.25)


def test_the_clairvoyant_is_never_below_the_oracle():
    settings, history = pool()
    jobs = [job(f"j{i}", 8 * (1 + i % 4), 2 + i % 5, ckpt=i % 2 == 0, submit=(7, 18 + i % 6))
            for i in range(10)]
    m = {p: simulate(history, settings, jobs, p, start=at(7, 0), end=at(11, 0)).metrics
         for p in ("oracle", "clairvoyant")}
    assert m["clairvoyant"]["work_gpu_hours"] >= m["oracle"]["work_gpu_hours"]


def test_work_is_what_was_done_and_kept_and_useful_adds_the_checkpointing_grace():
    train = job("train", 32, 30, ckpt=True, submit=(7, 18))
    m = run("oracle", [train], days=(7, 12), restart_cost_s=0).metrics
    assert m["work_gpu_hours"] == pytest.approx(32 * 30)  # all of it, finished
    # every planned stop held its 32 GPUs through a 15-minute grace: held, not work
    assert m["useful_gpu_hours"] - m["work_gpu_hours"] == pytest.approx(
        32 * m["planned_stops"] * 0.25, abs=32 * 5 / 60)
    lost = run("reactive", [job("eval", 16, 6, ckpt=False, submit=(7, 5))]).metrics
    assert lost["work_gpu_hours"] == pytest.approx(16 * 6)  # the killed attempt is no work


def test_delay_events_group_consecutive_steps_and_name_the_rise_that_opened_them():
    t = pd.Timestamp("2026-01-05 08:00", tz="UTC")
    step = pd.Timedelta(minutes=5)
    delays = pd.DataFrame({
        "time": [t, t + step, t + 4 * step, t + 9 * step],
        "gpus_short": [3.0, 1.0, 2.0, 4.0],
        "service_rise_gpus": [20.0, 0.0, 6.0, 9.0],
    })
    events = delay_events(delays, 300, headroom_gpus=8)
    assert list(events["steps"]) == [2, 1, 1]
    assert list(events["gpu_minutes"]) == [20.0, 10.0, 20.0]
    assert list(events["opening_rise_gpus"]) == [20.0, 6.0, 9.0]
    assert list(events["above_headroom"]) == [True, False, True]
    assert delay_events(delays.iloc[:0], 300, 8).empty


def test_a_shifted_trace_meets_another_stretch_of_the_same_traffic():
    from datetime import timedelta

    from idlegpu.scheduler.simulate import shifted_jobs

    jobs = [job("eval", 16, 6, ckpt=False, deadline=at(9, 8)), job("train", 8, 3, ckpt=True)]
    later = shifted_jobs(jobs, timedelta(hours=24))
    assert [j.submit_at for j in later] == [at(8, 19), at(8, 19)]
    assert later[0].deadline == at(10, 8) and later[1].deadline is None
    assert [(j.id, j.work_s, j.gpus) for j in later] == [(j.id, j.work_s, j.gpus) for j in jobs]
    assert shifted_jobs(jobs, timedelta(0)) == jobs
    # a night later, the unit starts a night later: the simulation meets the shifted submission
    first = pd.Timestamp(run("forecast", jobs[:1]).runs["start"].iloc[0])
    second = pd.Timestamp(run("forecast", later[:1]).runs["start"].iloc[0])
    assert second - first == pd.Timedelta(hours=24)


def test_a_window_a_later_forecast_keeps_open_is_renewed_not_stopped_and_restarted():
    """Admitted at 20:00 on a forecast of a rise at 23:00, a checkpointable unit is renewed
    at its window's end by the 21:00 forecast that sees the night stay free: one attempt,
    finished, no stop; with the first forecast alone it stops before 23:00 (just after its
    22:00 checkpoint)."""
    from idlegpu.scheduler.types import FreeProfile

    settings, history = pool()
    first_made = at(7, 0)
    steps = np.arange(3 * 96)
    hour = (steps % 96) / 4
    night = (hour >= 20) | (hour < 8)

    def forecast(made, rise_at):
        free = np.where(night, 32.0, 4.0)
        if rise_at is not None:
            free[(steps >= rise_at * 4) & (steps < 32 * 4)] = 4.0  # a rise till 08:00
        return FreeProfile(first_made, 900, free, 0.9, made)

    early = {first_made: forecast(first_made, 23)}
    both = {**early, at(7, 21): forecast(at(7, 21), None)}
    unit = job("train", 16, 5, ckpt=True, submit=(7, 19))
    runs = {}
    for name, profiles in (("early", early), ("both", both)):
        result = simulate(history, settings, [unit], "forecast", start=at(7, 0), end=at(9, 0),
                          forecast_profiles=profiles)
        runs[name] = result
    renewed = runs["both"]
    assert renewed.metrics["renewals"] == 1 and renewed.metrics["planned_stops"] == 0
    assert len(renewed.runs) == 1 and renewed.runs["outcome"].iloc[0] == "finished"
    stopped = runs["early"]
    assert stopped.metrics["renewals"] == 0 and stopped.metrics["planned_stops"] >= 1
    assert pd.Timestamp(stopped.runs["end"].iloc[0]) <= pd.Timestamp(at(7, 23))


def test_a_resume_reloads_its_checkpoint_holding_its_gpus_and_doing_no_work():
    # admission.restart_cost_seconds (600 s): what the simulator charges by default
    train = job("train", 32, 30, ckpt=True, submit=(7, 18))
    result = run("oracle", [train], days=(7, 12))
    m, runs = result.metrics, result.runs
    assert m["jobs_finished"] == 1 and m["work_gpu_hours"] == pytest.approx(32 * 30)
    # the fresh start's load is part of its runtime; each resume reloads for 10 minutes
    assert runs["restart_gpu_hours"].iloc[0] == 0
    assert list(runs["restart_gpu_hours"].iloc[1:]) == pytest.approx([32 / 6] * (len(runs) - 1))
    assert m["restart_gpu_hours"] == pytest.approx(runs["restart_gpu_hours"].sum())
    # the reload is lost (held, no work); the stops, just after a checkpoint, lose at most
    # the step the daemon takes to act on it
    stops_lost = m["lost_gpu_hours"] - m["restart_gpu_hours"]
    assert 0 <= stops_lost <= m["planned_stops"] * 32 * 0.25
    assert m["useful_gpu_hours"] == pytest.approx(useful(runs).sum())
    free = run("oracle", [train], days=(7, 12), restart_cost_s=0).metrics
    assert free["restart_gpu_hours"] == 0 and free["lost_gpu_hours"] == 0
    # lost work by cause names the reloads apart, one "stop" per resumed attempt
    lost = lost_work(runs, TZ).set_index(["by", "value"])
    restart = lost.loc[("cause", CAUSE_NAMES["restart"])]
    assert restart["stops"] == len(runs) - 1
    assert restart["lost_gpu_hours"] == pytest.approx(m["restart_gpu_hours"])
    assert lost.loc["cause", "lost_gpu_hours"].sum() == pytest.approx(m["lost_gpu_hours"])


def test_a_unit_that_cannot_checkpoint_starts_afresh_without_a_reload():
    # killed by the morning ramp, it runs again from nothing: its load is in its runtime
    result = run("reactive", [job("eval", 16, 6, ckpt=False, submit=(7, 5))])
    assert len(result.runs) >= 2 and result.metrics["lost_gpu_hours"] > 0
    assert result.metrics["restart_gpu_hours"] == 0
    with pytest.raises(ValueError, match="restart_cost_s"):
        run("reactive", [], restart_cost_s=-1)
