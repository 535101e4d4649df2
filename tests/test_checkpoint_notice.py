"""Planned stops with notice (the cooperative checkpoint): the policy tells a unit that
checkpoints a notice ahead of a planned stop, and the simulator lets it work on, save and
answer, or stops it blind at the deadline when it never answers."""

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
from test_checkpoint_timing import decisions, ramp, unit
from test_policy import SETTINGS, T0, plan
from test_simulate import TZ, at, job, pool

from idlegpu.scheduler.policy import policy_settings
from idlegpu.scheduler.simulate import simulate
from idlegpu.scheduler.types import Action

NOTICE = 600.0


# --- the policy ----------------------------------------------------------------------


def test_a_unit_with_notice_is_told_a_notice_ahead_of_the_forecast_s_need():
    # the pool needs the unit's GPUs from 11:20; grace 10 min: a blind unit between its
    # checkpoints is left to the usual rule until 11:10, a unit with 10 min of notice is
    # told now, and loses nothing by it
    blind = plan(ramp(20, after=0), running=[unit("a", ckpt_ago_min=10)])
    assert blind.decisions == ()
    (d,) = plan(ramp(20, after=0), running=[unit("a", ckpt_ago_min=10, notice_s=NOTICE)]
                ).decisions
    assert d.action is Action.PREEMPT and d.planned and d.cause == "forecast"
    assert "within 0.3 h" in d.reason


def test_a_window_stop_comes_a_notice_early():
    # its window's stop_by at 11:10 (the pool's need at 11:20, a grace period later): a blind
    # unit stops at the last pass before it, one with notice is told now (it works on
    # through the notice until it answers)
    stop_by = T0 + timedelta(minutes=10)
    assert plan(ramp(20), running=[unit("a", ckpt_ago_min=10, stop_by=stop_by)]).decisions == ()
    (d,) = plan(ramp(20), running=[unit("a", ckpt_ago_min=10, stop_by=stop_by,
                                        notice_s=NOTICE)]).decisions
    assert d.action is Action.PREEMPT and d.cause == "window" and d.planned


def test_a_unit_with_notice_loses_nothing_at_a_planned_stop():
    told = unit("a", ckpt_ago_min=20, notice_s=NOTICE)
    assert told.keeps_work_when_planned and told.unsaved_work_s(T0, planned=True) == 0.0
    assert told.unsaved_work_s(T0) == 20 * 60.0  # the backstop gives no notice
    # a unit that cannot checkpoint has nothing to save at a notice
    whole = replace(unit("w", notice_s=NOTICE), checkpointable=False)
    assert not whole.keeps_work_when_planned
    # just after a checkpoint, with the ramp before its next one, it is still stopped early
    # as a blind unit is (test_checkpoint_timing): the margin is the service's
    got = decisions(plan(ramp(35, after=4), running=[unit("a", notice_s=NOTICE)]))
    assert got["a"].action is Action.PREEMPT and got["a"].cause == "forecast"
    # and the cheaper victim of a planned cover is the one that loses nothing
    got = decisions(plan(ramp(15, after=8), running=[
        unit("blind", ckpt_ago_min=25, interval=3600.0),
        unit("told", ckpt_ago_min=25, interval=3600.0, notice_s=NOTICE)]))
    assert set(got) == {"told"}


def test_missing_signals_tell_units_with_notice_to_checkpoint_before_every_job_stops():
    from idlegpu.scheduler.types import ServingSignals

    after = 900.0
    settings = replace(SETTINGS, missing_signals_preempt_after_s=after)
    running = [unit("told", ckpt_ago_min=10, notice_s=NOTICE), unit("blind", ckpt_ago_min=10)]

    def missing(minutes):
        return ServingSignals(observed_at=None, missing_since=T0 - timedelta(minutes=minutes))

    # 7 min in: nobody is told yet (a notice starts once half the 15 minutes have passed)
    assert plan(ramp(300), running=running, signals=missing(7), settings=settings
                ).decisions == ()
    # 8 min in: the unit with notice is told, and has saved by about the 15th minute
    got = decisions(plan(ramp(300), running=running, signals=missing(8), settings=settings))
    assert set(got) == {"told"} and got["told"].planned and got["told"].cause == "signals"
    assert "stops at 15 min" in got["told"].reason
    # past 15 min every job stops, told or not, as before
    got = decisions(plan(ramp(300), running=running, signals=missing(16), settings=settings))
    assert set(got) == {"told", "blind"} and not any(d.planned for d in got.values())


# --- the simulator -------------------------------------------------------------------


def _settings_and_history(morning_hour: float = 8.0):
    settings, history = pool()
    local = pd.DatetimeIndex(history["ds"]).tz_convert(TZ)
    hours = local.hour + local.minute / 60
    history["y"] = np.where((hours >= 20) | (hours < morning_hour), 2.0, 9.0)
    return settings, history


def _run(policy, jobs, *, history=None, settings=None, days=(7, 12), timing=False, **options):
    if history is None:
        settings, history = _settings_and_history()
    config = replace(policy_settings(settings.admission, settings.pool.headroom_gpus,
                                     settings.pool.total_gpus), stop_after_checkpoint=timing)
    return simulate(history, settings, jobs, policy, start=at(days[0], 0), end=at(days[1], 0),
                    policy_config=config, **options)


def test_a_notice_saves_the_work_a_blind_stop_loses():
    train = job("train", 32, 30, ckpt=True, submit=(7, 18))
    blind_run = _run("oracle", [train])
    told_run = _run("oracle", [train], checkpoint_notice_s=NOTICE)
    blind, told = blind_run.metrics, told_run.metrics
    # blind: each morning's stop loses what it did since its hourly checkpoint
    assert blind["lost_gpu_hours"] > 0 and blind["notices"] == 0
    assert told["notices"] == told["notices_answered"] == told["planned_stops"] >= 2
    # it loses no work: only each night's resume reloads its checkpoint (10 min of 32 GPUs)
    resumes = len(told_run.runs) - 1
    assert resumes >= 2 and told["restart_gpu_hours"] == pytest.approx(32 * resumes / 6)
    assert told["lost_gpu_hours"] == pytest.approx(told["restart_gpu_hours"])
    assert told["lost_checkpointing_gpu_hours"] == pytest.approx(told["restart_gpu_hours"])
    assert told["notice_saved_gpu_hours"] > 0
    assert told["service_delay_gpu_minutes"] == 0 == blind["service_delay_gpu_minutes"]
    # the run table counts them apart, stop by stop, as the metrics do
    runs = told_run.runs
    assert (runs["notice"] == "answered").sum() == told["notices_answered"]
    assert runs["notice_saved_gpu_hours"].sum() == pytest.approx(told["notice_saved_gpu_hours"])
    assert (blind_run.runs["notice"] == "").all()
    # what the blind stops lost was done again: the told unit finishes first

    def finished(result):
        runs = result.runs
        return pd.Timestamp(runs.loc[runs["outcome"] == "finished", "end"].iloc[0])

    assert told["jobs_finished"] == blind["jobs_finished"] == 1
    assert finished(told_run) < finished(blind_run)


def test_a_unit_that_never_answers_is_stopped_blind_at_the_deadline():
    train = job("train", 32, 30, ckpt=True, submit=(7, 18))
    silent = _run("oracle", [train], checkpoint_notice_s=NOTICE, unanswered_share=1.0)
    m = silent.metrics
    assert m["notices"] >= 2 and m["notices_answered"] == 0
    assert m["lost_gpu_hours"] > 0 and m["notice_saved_gpu_hours"] == 0
    # its notice and grace period were planned for: the service never waits
    assert m["service_delay_gpu_minutes"] == 0
    stops = silent.runs[silent.runs["outcome"] == "stopped"]
    ends = pd.to_datetime(stops["end"], utc=True).dt.tz_convert(TZ)
    assert (ends.dt.hour < 8).all()  # gone before the morning's replicas come


def test_a_notice_the_service_needs_the_gpus_before_is_cut_short():
    # night: free until 08:00 (stop_by 07:45 with this pool's 15-min grace), so a notice of
    # 60 min is told at 06:30; the service comes at 07:00 on every morning
    settings, history = _settings_and_history(morning_hour=7.0)
    # (checkpoints every 90 min from 20:00: the last before 07:00 at 06:30)
    train = replace(job("train", 32, 30, ckpt=True, submit=(7, 18)), checkpoint_interval_s=5400)
    quick = _run("night", [train], history=history, settings=settings,
                 checkpoint_notice_s=3600, notice_answer_s=15 * 60).metrics
    late = _run("night", [train], history=history, settings=settings,
                checkpoint_notice_s=3600, notice_answer_s=50 * 60).metrics
    # answered at 06:45: all it did is saved (night then starts it again until 08:00, its
    # own mistake, and the service evicts that attempt at 07:00)
    assert quick["notices"] >= 2 and quick["notices_answered"] == quick["notices"]
    assert quick["notice_saved_gpu_hours"] > 0
    # an answer due at 07:20 never comes: the service needs the GPUs at 07:00 and cuts the
    # notice short, a blind stop that loses the work since the last checkpoint
    assert late["notices"] >= 2 and late["notices_answered"] == 0
    assert late["notice_saved_gpu_hours"] == 0 and late["lost_gpu_hours"] > 0
    assert (late_runs := _run("night", [train], history=history, settings=settings,
                              checkpoint_notice_s=3600, notice_answer_s=50 * 60).runs
            )["notice"].eq("cut").sum() == late["notices"]
    del late_runs


def test_bad_notice_options_are_refused():
    settings, history = _settings_and_history()
    for options in ({"unanswered_share": 1.5}, {"checkpoint_notice_s": -1}):
        with pytest.raises(ValueError):
            simulate(history, settings, [], "forecast", start=at(7, 0), end=at(8, 0),
                     **options)



