"""Elastic jobs (``min_gpus``): the spec rules, shrinks chosen by decide() when they cost less
than whole stops, admission on fewer GPUs, and the simulator's accounting of both."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.policy import decide
from idlegpu.scheduler.reports import useful
from idlegpu.scheduler.simulate import SimJob, simulate, trace_jobs
from idlegpu.scheduler.specs import (
    SpecError,
    TraceEntry,
    expand_units,
    resize_unit,
    validate_request,
)
from idlegpu.scheduler.types import (
    Action,
    FreeProfile,
    PolicySettings,
    RunningJob,
    ServingSignals,
    WaitingJob,
)

REPO = Path(__file__).resolve().parents[1]
IMAGE = "registry.example.com/research/trainer:1.4.2"
T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)
H = 3600
SETTINGS = PolicySettings(grace_s=600, min_segment_s=1800, restart_cost_s=600)


# ----------------------------------------------------------------------------- the spec


def request(**over) -> dict:
    data = {
        "name": "sft-elastic", "team": "alignment", "kind": "sft", "image": IMAGE,
        "args": ["--out", "{output}"], "gpus": 16, "min_gpus": 8,
        "checkpoint": {"interval": "30m", "resume_args": ["--resume", "{output}/ckpt"]},
        "runtime_estimate": "6h", "output": "s3://runs/{team}/{name}/{step}/{member}",
    }
    data.update(over)
    return {k: v for k, v in data.items() if v is not None}


def test_min_gpus_reaches_the_unit_and_a_resized_attempt_scales_with_it():
    (unit,) = expand_units(validate_request(request(cpu=64, memory="512Gi")))
    assert unit.gpus == 16 and unit.min_gpus == 8
    half = resize_unit(unit, 8)
    assert (half.gpus, half.min_gpus, half.cpu, half.memory) == (8, 8, 32.0, "256Gi")
    assert dict(half.env)["IDLEGPU_GPUS"] == "8" and half.args == unit.args
    assert resize_unit(unit, 16) is unit
    with pytest.raises(ValueError, match="runs on 8 to 16 GPUs, not 4"):
        resize_unit(unit, 4)
    # left out, or equal to gpus: not elastic
    (plain,) = expand_units(validate_request(request(min_gpus=None)))
    (same,) = expand_units(validate_request(request(min_gpus=16)))
    assert plain.min_gpus is None and same.min_gpus is None


def test_a_step_inherits_min_gpus_or_sets_its_own():
    steps = [{"name": "sft", "args": ["--out", "{output}"]},
             {"name": "eval", "gpus": 4, "min_gpus": 2, "args": ["--out", "{output}"]}]
    units = expand_units(validate_request(request(steps=steps)))
    assert [(u.step, u.gpus, u.min_gpus) for u in units] == [("sft", 16, 8), ("eval", 4, 2)]


@pytest.mark.parametrize("over, field, words", [
    ({"min_gpus": 0}, "min_gpus:", "must be at least 1 (got 0)"),
    ({"min_gpus": 24}, "min_gpus:", ("min_gpus 24 is above the unit's 16 GPUs; set min_gpus "
                                     "to at most 16")),
    ({"min_gpus": "eight"}, "min_gpus:", "use a whole number of GPUs from 1 to the unit's gpus"),
    ({"checkpoint": None}, "min_gpus:", "needs checkpointing; add checkpoint:"),
    ({"args": ["--world-size", "{gpus}"]}, "min_gpus:", "read the IDLEGPU_GPUS environment"),
    ({"steps": [{"name": "sft"}, {"name": "eval", "gpus": 4}]}, "min_gpus:",
     "in step 'eval': min_gpus 8 is above the unit's 4 GPUs"),
    ({"steps": [{"name": "sft", "min_gpus": 20}]}, "steps.0.min_gpus:", "is above the unit's"),
])
def test_min_gpus_errors_name_the_field_and_the_fix(over, field, words):
    with pytest.raises(SpecError) as err:
        validate_request(request(**over), source="req.yaml")
    text = str(err.value)
    assert f"req.yaml: {field}" in text and words in text, text
    assert "\n" not in text


def test_the_elastic_example_is_valid_and_elastic():
    from idlegpu.scheduler.specs import load_request
    units = expand_units(load_request(REPO / "examples/jobs/sft-elastic.yaml"))
    assert units and all(u.min_gpus is not None and u.min_gpus < u.gpus for u in units
                         if u.step == "sft")


# ----------------------------------------------------------------------------- decide()


def flat(gpus, hours=6):
    return FreeProfile(start=T0, step_s=300, free=np.full(int(hours * 12), float(gpus)),
                       confidence=0.9, made_at=T0)


def running(id, gpus, since_ckpt_h, min_gpus=None, priority=0, hours_left=4.0, ckpt=True):
    return RunningJob(id=id, team="a", gpus=gpus, priority=priority,
                      started_at=T0 - timedelta(hours=5), checkpointable=ckpt,
                      remaining_s=hours_left * H,
                      last_checkpoint_at=T0 - timedelta(hours=since_ckpt_h), min_gpus=min_gpus)


def short(n):
    return ServingSignals(observed_at=T0, gpus_short=n)


def test_a_shortfall_shrinks_an_elastic_job_rather_than_stop_a_costlier_one():
    # 4 GPUs short: stopping the 4-GPU eval loses 4 x 0.4 h = 1.6 GPU-h of unsaved work plus
    # 4 restarts (8,160 GPU-s); the 16-GPU SFT just checkpointed: stopping it loses 16
    # restarts (9,600 GPU-s), shrinking it to 12 only the 12 restarts (7,200 GPU-s)
    jobs = [running("0012-sft", 16, since_ckpt_h=0.0, min_gpus=8),
            running("0040-eval", 4, since_ckpt_h=0.4)]
    plan = decide(T0, flat(64), jobs, [], short(4), {}, SETTINGS)
    (d,) = plan.decisions
    assert (d.action, d.job_id, d.gpus, d.planned) == (Action.SHRINK, "0012-sft", 12, False)
    assert d.reason == ("shrink 0012-sft from 16 to 12 GPUs: the services want 4 GPUs they "
                        "cannot get; cheaper than stopping 0040-eval (1.6 GPU-h unsaved)")
    # the same plan every time
    assert decide(T0, flat(64), jobs[::-1], [], short(4), {}, SETTINGS) == plan


def test_a_shrink_that_costs_more_than_a_whole_stop_is_not_chosen():
    # the SFT is an hour past its checkpoint: a shrink loses 16 GPU-h; the eval just saved
    jobs = [running("0012-sft", 16, since_ckpt_h=1.0, min_gpus=8),
            running("0040-eval", 4, since_ckpt_h=0.0)]
    plan = decide(T0, flat(64), jobs, [], short(4), {}, SETTINGS)
    assert [(d.action, d.job_id) for d in plan.decisions] == [(Action.PREEMPT, "0040-eval")]
    # and a shrink never beats the same cover by whole stops when it costs more: the eval
    # 0.6 h past its checkpoint (4 x (2,160 + 600) = 11,040 GPU-s) against the SFT 0.1 h
    # past its own (16 x 360 + 12 x 600 = 12,960 GPU-s to shrink, 15,360 to stop)
    jobs = [running("0012-sft", 16, since_ckpt_h=0.1, min_gpus=8),
            running("0040-eval", 4, since_ckpt_h=0.6)]
    plan = decide(T0, flat(64), jobs, [], short(4), {}, SETTINGS)
    assert [(d.action, d.job_id) for d in plan.decisions] == [(Action.PREEMPT, "0040-eval")]
    # a higher priority protects an elastic job from shrinking like from a stop
    jobs = [running("0012-sft", 16, since_ckpt_h=0.0, min_gpus=8, priority=5),
            running("0040-eval", 4, since_ckpt_h=0.4)]
    plan = decide(T0, flat(64), jobs, [], short(4), {}, SETTINGS)
    assert [(d.action, d.job_id) for d in plan.decisions] == [(Action.PREEMPT, "0040-eval")]


def test_a_shrink_frees_exactly_the_need_and_never_goes_below_min_gpus():
    jobs = [running("sft", 16, since_ckpt_h=0.0, min_gpus=8)]
    (d,) = decide(T0, flat(64), jobs, [], short(5), {}, SETTINGS).decisions
    assert (d.action, d.gpus) == (Action.SHRINK, 11)
    assert "cheaper than stopping it" in d.reason
    # more than it can give (16 - 10 = 6 < 8): the eval stops and the SFT gives the other 6
    # (10 x 600 + 4 x 600 GPU-s, against 16 x 600 to stop the SFT); it keeps the GPUs the
    # stop frees beyond the need, so the need is met exactly
    jobs = [running("sft", 16, since_ckpt_h=0.0, min_gpus=8),
            running("eval", 4, since_ckpt_h=0.0)]
    plan = decide(T0, flat(64), jobs, [], short(10), {}, SETTINGS)
    assert {(d.job_id, d.action, d.gpus) for d in plan.decisions} == {
        ("sft", Action.SHRINK, 10), ("eval", Action.PREEMPT, 4)}
    plan = decide(T0, flat(64), jobs, [], short(12), {}, SETTINGS)
    assert {(d.job_id, d.action, d.gpus) for d in plan.decisions} == {
        ("sft", Action.SHRINK, 8), ("eval", Action.PREEMPT, 4)}


def test_min_gpus_10_cannot_free_10_of_16():
    jobs = [running("sft", 16, since_ckpt_h=0.0, min_gpus=10),
            running("eval", 4, since_ckpt_h=0.0)]
    plan = decide(T0, flat(64), jobs, [], short(10), {}, SETTINGS)
    # shrink by 6 (to 10) and stop the eval (4): 10 x 600 + 4 x 600 GPU-s, less than
    # stopping the SFT whole (16 x 600)
    assert {(d.job_id, d.action, d.gpus) for d in plan.decisions} == {
        ("sft", Action.SHRINK, 10), ("eval", Action.PREEMPT, 4)}


def test_a_job_that_cannot_checkpoint_is_never_shrunk():
    jobs = [running("gen", 16, since_ckpt_h=0.0, min_gpus=8, ckpt=False)]
    (d,) = decide(T0, flat(64), jobs, [], short(4), {}, SETTINGS).decisions
    assert d.action is Action.PREEMPT


def test_a_forecast_ramp_shrinks_as_planned_and_the_shrunk_job_keeps_its_gpus_in_the_plan():
    prof = FreeProfile(start=T0, step_s=300, free=np.array([16.0] * 1 + [12.0] * 70),
                       confidence=0.9, made_at=T0)
    jobs = [running("sft", 16, since_ckpt_h=0.0, min_gpus=8)]
    queue = [WaitingJob(id="w", team="b", gpus=1, runtime_s=H, checkpointable=False,
                        priority=0, submitted_at=T0 - timedelta(hours=1))]
    plan = decide(T0, prof, jobs, queue, ServingSignals(observed_at=T0, idle_gpus=0), {},
                  SETTINGS)
    shrink = plan.of(Action.SHRINK)
    assert [(d.job_id, d.gpus, d.planned) for d in shrink] == [("sft", 12, True)]
    assert "the forecast needs 4 of their GPUs" in shrink[0].reason
    # the 12 GPUs it keeps leave nothing for the waiting job
    assert [d.action for d in plan.decisions if d.job_id == "w"] == [Action.DEFER]


def waiting(id, gpus, hours, min_gpus=None, ckpt=True):
    return WaitingJob(id=id, team="a", gpus=gpus, runtime_s=hours * H, checkpointable=ckpt,
                      priority=0, submitted_at=T0 - timedelta(hours=1), min_gpus=min_gpus)


def test_an_elastic_job_is_admitted_on_fewer_gpus_with_its_runtime_scaled():
    (d,) = decide(T0, flat(12, 12), [], [waiting("sft", 16, 6, min_gpus=8)],
                  ServingSignals(observed_at=T0), {}, SETTINGS).decisions
    assert (d.action, d.gpus, d.stop_by) == (Action.ADMIT, 12, None)
    assert d.reason == ("12 of its 16 GPUs (16 do not fit now; it may run on 8): 12 GPUs stay "
                        "free for its 8.0 h")
    # the scaled runtime must fit: 6 h x 16 / 12 = 8 h does not fit a 7 h window whole...
    whole = waiting("sft", 16, 6, min_gpus=8, ckpt=False)
    (d,) = decide(T0, flat(12, 7), [], [whole], ServingSignals(observed_at=T0), {},
                  SETTINGS).decisions
    assert d.action is Action.DEFER
    # ... nor below min_gpus, and a job that is not elastic waits for all its GPUs
    for job in (waiting("sft", 16, 6, min_gpus=14), waiting("sft", 16, 6)):
        (d,) = decide(T0, flat(12, 12), [], [job], ServingSignals(observed_at=T0), {},
                      SETTINGS).decisions
        assert d.action is Action.DEFER and d.gpus == 16


def test_full_size_first_when_it_fits():
    (d,) = decide(T0, flat(16, 12), [], [waiting("sft", 16, 6, min_gpus=8)],
                  ServingSignals(observed_at=T0), {}, SETTINGS).decisions
    assert (d.action, d.gpus) == (Action.ADMIT, 16)


# ----------------------------------------------------------------------------- simulate()

TZ = "Asia/Seoul"
START = pd.Timestamp("2026-01-05 00:00", tz=TZ)


def sim_pool(day_replicas=9.0):
    """40 GPUs, one service of 4-GPU replicas: 2 replicas by night (32 free), ``day_replicas``
    by day."""
    settings = load_config(data={
        "pool": {"total_gpus": 40, "headroom_gpus": 0, "timezone": TZ},
        "query_templates": {"replicas": "r"},
        "services": [{"name": "svc", "gpus_per_replica": 4, "min_replicas": 2,
                      "max_replicas": 10}],
        "admission": {"grace_seconds": 900, "min_segment_seconds": 1800},
    })
    local = pd.date_range(START, periods=14 * 96, freq="15min")
    night = (local.hour >= 20) | (local.hour < 8)
    history = pd.DataFrame({"unique_id": "svc/replicas", "ds": local.tz_convert("UTC"),
                            "y": np.where(night, 2.0, day_replicas)})
    return settings, history


def at(day, hour):
    return (START + pd.Timedelta(days=day, hours=hour)).tz_convert("UTC").to_pydatetime()


def sim_job(id, gpus, hours, min_gpus=None, submit=(7, 19), ckpt=True):
    return SimJob(id=id, team="t", kind="sft", gpus=gpus, submit_at=at(*submit),
                  work_s=hours * H, estimate_s=hours * H, checkpointable=ckpt,
                  checkpoint_interval_s=H, min_gpus=min_gpus)


def check_conservation(result, grace_h=0.25):
    """Every GPU-hour held is useful, lost, a grace period, or the end of a finishing step."""
    m, runs = result.metrics, result.runs
    held = float(runs["gpu_hours"].sum())
    assert m["lost_gpu_hours"] == pytest.approx(float(runs["lost_gpu_hours"].sum()))
    overhead = held - m["useful_gpu_hours"] - m["lost_gpu_hours"]
    graces = runs.loc[runs["outcome"].isin(["stopped", "preempted"]), "gpus"].sum() * grace_h
    last_steps = runs.loc[runs["outcome"] == "finished", "gpus"].sum() * 0.25
    assert -1e-6 <= overhead <= graces + last_steps + 1e-6, (held, m)


def test_an_elastic_job_starts_on_the_gpus_free_now_and_finishes_its_work():
    settings, history = sim_pool()
    # 32 free at night; a 40-GPU ask would never fit, 32 of it does (work 4 h at 40 GPUs)
    jobs = [sim_job("big", 40, 4.0, min_gpus=16)]
    for policy in ("reactive", "oracle"):
        result = simulate(history, settings, jobs, policy, start=at(7, 0), end=at(9, 0))
        m = result.metrics
        assert m["jobs_finished"] == 1, policy
        assert m["useful_gpu_hours"] == pytest.approx(40 * 4), policy
        assert set(result.runs["gpus"]) == {32}, policy
        # 4 h x 40 / 32 = 5 h at 32 GPUs
        run = result.runs.iloc[0]
        assert (run["end"] - run["start"]) == pd.Timedelta(hours=5), policy
        check_conservation(result)


def test_the_simulator_shrinks_for_the_morning_ramp_and_conserves_gpu_hours():
    # the day leaves 12 GPUs (7 replicas): a 16-GPU elastic job that may run on 12 shrinks
    # at the morning ramp instead of stopping, and runs on through the day
    settings, history = sim_pool(day_replicas=7.0)
    elastic = [sim_job("sft", 16, 14.0, min_gpus=12, submit=(7, 20))]
    result = simulate(history, settings, elastic, "oracle", start=at(7, 0), end=at(10, 0))
    m = result.metrics
    assert m["shrinks"] >= 1 and m["jobs_finished"] == 1
    # it loses no work: only the resumes on 12 GPUs reload their checkpoint (10 min each)
    assert m["lost_gpu_hours"] == pytest.approx(m["restart_gpu_hours"])
    assert m["restart_gpu_hours"] == pytest.approx(12 * m["shrinks"] / 6)
    assert m["service_delay_gpu_minutes"] == 0
    # held - lost (the report's definition): the 224 GPU-hours of work and the grace periods
    # of the shrinks, in which it checkpointed
    assert m["useful_gpu_hours"] == pytest.approx(useful(result.runs).sum())
    assert 16 * 14 <= m["useful_gpu_hours"] <= 16 * 14 + 16 * m["shrinks"]
    assert {16, 12} <= set(result.runs["gpus"])
    check_conservation(result)
    # without min_gpus the same job stops each morning and waits for the night
    rigid = [sim_job("sft", 16, 14.0, submit=(7, 20))]
    base = simulate(history, settings, rigid, "oracle", start=at(7, 0), end=at(10, 0)).metrics
    assert base["shrinks"] == 0 and base["planned_stops"] >= 1
    assert base["jobs_finished"] == 1
    finished = result.runs.loc[result.runs["outcome"] == "finished", "end"].max()
    assert finished < at(8, 20)  # finished during the day, not the next night


def test_trace_jobs_carries_min_gpus():
    entry = TraceEntry.model_validate({
        "submit_at": "2026-01-12T19:00:00+09:00", "actual_runtime": "6h",
        "request": request(),
    })
    (job,) = trace_jobs([entry], lambda unit: 6 * H)
    assert (job.gpus, job.min_gpus) == (16, 8)
    assert job.as_waiting().min_gpus == 8 and job.as_waiting().elastic


def window_closing(id, gpus, min_gpus, **over):
    """A unit that just checkpointed, with 6 h of work left, whose window closes in 5 min."""
    return RunningJob(id=id, team="a", gpus=gpus, priority=0,
                      started_at=T0 - timedelta(hours=5), checkpointable=True,
                      remaining_s=6 * H, last_checkpoint_at=T0,
                      stop_by=T0 + timedelta(minutes=5), min_gpus=min_gpus, **over)


def falls_to(before, after):
    """``before`` GPUs free for the next two steps, then ``after``."""
    return FreeProfile(start=T0, step_s=300, free=np.array([before] * 2 + [after] * 70),
                       confidence=0.9, made_at=T0)


def test_an_elastic_job_whose_window_closes_shrinks_to_what_stays_free():
    prof = falls_to(16.0, 12.0)
    closing = window_closing("sft", 16, 8)
    (d,) = decide(T0, prof, [closing], [], ServingSignals(observed_at=T0), {},
                  SETTINGS).decisions
    assert (d.action, d.gpus, d.planned) == (Action.SHRINK, 12, True)
    assert d.reason == ("shrink sft from 16 to 12 GPUs: its window closes for 16, 12 stay free; "
                        "checkpoint and restart as planned")
    # below its min_gpus, or a job that is not elastic: the planned stop as before
    for job in (replace(closing, min_gpus=14), replace(closing, min_gpus=None)):
        (d,) = decide(T0, prof, [job], [], ServingSignals(observed_at=T0), {},
                      SETTINGS).decisions
        assert d.action is Action.PREEMPT and d.planned


def test_the_daemon_rechecks_min_gpus_on_a_stored_unit():
    from idlegpu.scheduler.config import AdmissionConfig
    from idlegpu.scheduler.specs import recheck_unit

    (unit,) = expand_units(validate_request(request()))
    recheck_unit(unit, "alignment", AdmissionConfig())
    for bad in (replace(unit, min_gpus=16), replace(unit, min_gpus=0),
                replace(unit, checkpointable=False)):
        with pytest.raises(SpecError, match="min_gpus: min_gpus .* does not fit a unit of 16"):
            recheck_unit(bad, "alignment", AdmissionConfig())


def test_a_shrunk_job_stops_before_its_smaller_window_closes_or_stops_now_without_one():
    closing = window_closing("sft", 16, 8)
    # 12 stay free for 2 h after the grace period, then none
    prof = FreeProfile(start=T0, step_s=300, free=np.array([16.0] * 2 + [12.0] * 24 + [0.0] * 40),
                       confidence=0.9, made_at=T0)
    (d,) = decide(T0, prof, [closing], [], ServingSignals(observed_at=T0), {},
                  SETTINGS).decisions
    assert (d.action, d.gpus) == (Action.SHRINK, 12)
    assert d.stop_by == T0 + timedelta(minutes=130) - timedelta(seconds=600)
    # 12 free for 20 min only: not worth a restart (min_segment_s is 30 min): a planned stop
    prof = FreeProfile(start=T0, step_s=300, free=np.array([16.0] * 2 + [12.0] * 6 + [0.0] * 40),
                       confidence=0.9, made_at=T0)
    (d,) = decide(T0, prof, [closing], [], ServingSignals(observed_at=T0), {},
                  SETTINGS).decisions
    assert (d.action, d.reason) == (Action.PREEMPT,
                                    "its window closes: checkpoint and stop as planned")


@given(st.lists(st.tuples(st.integers(1, 16), st.floats(0.0, 3.0), st.booleans(),
                          st.integers(0, 1)), min_size=1, max_size=6),
       st.integers(1, 40))
@hsettings(max_examples=300, deadline=None)
def test_a_cover_frees_the_need_exactly_when_it_shrinks_and_never_costs_more(jobs, need):
    from idlegpu.scheduler.policy import _cover, _shrink_cost, _stop_cost, _victims

    running_jobs = [running(f"j{i}", g, since_ckpt_h=h, min_gpus=max(1, g // 2) if e else None,
                            priority=p) for i, (g, h, e, p) in enumerate(jobs)]
    cover = _cover(running_jobs, need, T0, {}, restart_cost_s=600)
    whole = _victims(running_jobs, need, T0, {}, restart_cost_s=600)
    freed = sum(j.gpus - keep for j, keep in cover)
    total = sum(j.gpus for j in running_jobs)
    assert freed >= min(need, total)
    for job, keep in cover:
        assert keep == 0 or (job.min_gpus <= keep < job.gpus and job.elastic)
    if any(keep for _, keep in cover):
        assert freed == need  # a shrink frees exactly what the need leaves open

    def cost(c):
        return sum(_shrink_cost(j, k, T0, 600) if k else _stop_cost(j, T0, 600) for j, k in c)

    # with one priority, never dearer than the whole stops (but for the tie-break on the
    # number of victims)
    if len({j.priority for j in running_jobs}) == 1:
        ceiling = cost([(j, 0) for j in whole])
        assert cost(cover) <= ceiling * (1 + 1e-5) + 1e-6


# ----------------------------------------------------------------------------- gpus_step


def test_gpus_step_reaches_the_unit_and_a_resize_off_the_step_is_refused():
    (unit,) = expand_units(validate_request(request(gpus=32, min_gpus=16, gpus_step=8)))
    assert (unit.gpus, unit.min_gpus, unit.gpus_step) == (32, 16, 8)
    assert resize_unit(unit, 24).gpus == 24 and resize_unit(unit, 16).gpus == 16
    with pytest.raises(ValueError, match="runs on 16 to 32 GPUs in steps of 8, not 20"):
        resize_unit(unit, 20)
    (plain,) = expand_units(validate_request(request()))
    assert plain.gpus_step == 1
    # a step inherits the job's, or sets its own
    steps = [{"name": "sft"}, {"name": "eval", "gpus": 4, "min_gpus": 2, "gpus_step": 2}]
    units = expand_units(validate_request(request(gpus=32, min_gpus=16, gpus_step=8,
                                                  steps=steps)))
    assert [(u.step, u.gpus_step) for u in units] == [("sft", 8), ("eval", 2)]


@pytest.mark.parametrize("over, field, words", [
    ({"gpus_step": 3}, "gpus_step:", "must both be multiples of gpus_step 3"),
    ({"gpus_step": 3}, "gpus_step:", "use a gpus_step that divides both, e.g. 2"),
    ({"gpus_step": 0}, "gpus_step:", "gpus_step must be at least 1 (got 0)"),
    ({"gpus_step": 10**30}, "gpus_step:", "e.g. 8"),
    ({"gpus_step": "x"}, "gpus_step:", "dividing gpus and min_gpus, or leave it out"),
    ({"gpus_step": 4, "min_gpus": None}, "gpus_step:",
     "only applies to an elastic unit, which this is not; add min_gpus"),
    ({"steps": [{"name": "sft", "gpus_step": 5}]}, "steps.0.gpus_step:", "multiples of"),
])
def test_gpus_step_errors_name_the_field_and_the_fix(over, field, words):
    with pytest.raises(SpecError) as err:
        expand_units(validate_request(request(**over), source="req.yaml"))
    text = str(err.value)
    assert f"req.yaml: {field}" in text and words in text, text
    assert "\n" not in text


def test_the_daemon_rechecks_gpus_step_on_a_stored_unit():
    from idlegpu.scheduler.config import AdmissionConfig
    from idlegpu.scheduler.specs import recheck_unit

    (unit,) = expand_units(validate_request(request(gpus_step=4)))
    recheck_unit(unit, "alignment", AdmissionConfig())
    for bad in (replace(unit, gpus_step=3), replace(unit, gpus_step=0),
                replace(unit, gpus_step=4, min_gpus=None)):
        with pytest.raises(SpecError, match="gpus_step: gpus_step .* does not fit"):
            recheck_unit(bad, "alignment", AdmissionConfig())


def test_a_stepped_elastic_job_starts_on_the_largest_whole_step_that_fits():
    job = replace(waiting("pretrain", 32, 6, min_gpus=16), gpus_step=8)
    (d,) = decide(T0, flat(31, 12), [], [job], ServingSignals(observed_at=T0), {},
                  SETTINGS).decisions
    assert (d.action, d.gpus) == (Action.ADMIT, 24)
    assert d.reason.startswith("24 of its 32 GPUs (32 do not fit now; it may run on 16 in "
                               "steps of 8)")
    # 23 free: 16, not 23; 15 free: not at all
    (d,) = decide(T0, flat(23, 12), [], [job], ServingSignals(observed_at=T0), {},
                  SETTINGS).decisions
    assert (d.action, d.gpus) == (Action.ADMIT, 16)
    (d,) = decide(T0, flat(15, 12), [], [job], ServingSignals(observed_at=T0), {},
                  SETTINGS).decisions
    assert d.action is Action.DEFER
    # with a step of 1 the same job takes every GPU free
    (d,) = decide(T0, flat(23, 12), [], [replace(job, gpus_step=1)],
                  ServingSignals(observed_at=T0), {}, SETTINGS).decisions
    assert (d.action, d.gpus) == (Action.ADMIT, 23)


def test_a_stepped_shrink_frees_a_whole_step_for_a_smaller_need():
    job = replace(running("pretrain", 32, since_ckpt_h=0.0, min_gpus=16), gpus_step=8)
    (d,) = decide(T0, flat(64), [job], [], short(3), {}, SETTINGS).decisions
    assert (d.action, d.gpus) == (Action.SHRINK, 24)
    (d,) = decide(T0, flat(64), [job], [], short(9), {}, SETTINGS).decisions
    assert (d.action, d.gpus) == (Action.SHRINK, 16)
    # more than it can give: a whole stop
    (d,) = decide(T0, flat(64), [job], [], short(17), {}, SETTINGS).decisions
    assert d.action is Action.PREEMPT
    # 10 short beside a 2-GPU eval: two steps (16 x 600 GPU-s of reload) cost less than a
    # step and the eval (24 x 600 + 2 x 600), though they free 6 GPUs beyond the need
    jobs = [job, running("eval", 2, since_ckpt_h=0.0)]
    plan = decide(T0, flat(64), jobs, [], short(10), {}, SETTINGS)
    assert [(d.job_id, d.action, d.gpus) for d in plan.decisions] == [
        ("pretrain", Action.SHRINK, 16)]


def test_the_simulator_runs_a_stepped_elastic_job_on_whole_steps_only():
    # 32 GPUs free at night, 12 by day (7 replicas): a 24-GPU unit elastic down to 8 runs on
    # 24 by night and on 8 by day with a step of 8, never on 12
    settings, history = sim_pool(day_replicas=7.0)
    jobs = [replace(sim_job("pretrain", 24, 30.0, min_gpus=8, submit=(7, 20)), gpus_step=8)]
    entry = TraceEntry.model_validate({
        "submit_at": "2026-01-12T19:00:00+09:00", "actual_runtime": "6h",
        "request": request(gpus=24, min_gpus=8, gpus_step=8)})
    assert trace_jobs([entry], lambda unit: 6 * H)[0].gpus_step == 8
    assert jobs[0].as_waiting().gpus_step == 8
    for policy in ("reactive", "forecast"):
        result = simulate(history, settings, jobs, policy, start=at(7, 0), end=at(10, 0))
        sizes = set(result.runs["gpus"])
        assert sizes <= {24, 16, 8} and 8 in sizes, (policy, sizes)
        check_conservation(result)
    stepless = simulate(history, settings, [replace(jobs[0], gpus_step=1)], "reactive",
                        start=at(7, 0), end=at(10, 0))
    assert 12 in set(stepless.runs["gpus"])


def test_a_stepped_elastic_job_whose_window_closes_keeps_a_whole_step():
    prof = falls_to(32.0, 30.0)
    closing = window_closing("pretrain", 32, 16, gpus_step=8)
    (d,) = decide(T0, prof, [closing], [], ServingSignals(observed_at=T0), {},
                  SETTINGS).decisions
    assert (d.action, d.gpus, d.planned) == (Action.SHRINK, 24, True)
    (d,) = decide(T0, prof, [replace(closing, gpus_step=1)], [], ServingSignals(observed_at=T0),
                  {}, SETTINGS).decisions
    assert (d.action, d.gpus) == (Action.SHRINK, 30)


@given(st.lists(st.tuples(st.sampled_from([(8, 4, 4), (16, 8, 8), (32, 16, 8), (24, 8, 8),
                                           (6, 2, 2), (4, None, 1), (2, None, 1)]),
                          st.floats(0.0, 3.0), st.integers(0, 1)), min_size=1, max_size=6),
       st.integers(1, 60))
@hsettings(max_examples=300, deadline=None)
def test_a_stepped_cover_shrinks_by_whole_steps_and_overshoots_by_less_than_one(jobs, need):
    from idlegpu.scheduler.policy import _cover, _shrink_cost, _stop_cost, _victims

    running_jobs = [replace(running(f"j{i}", g, since_ckpt_h=h, min_gpus=m, priority=p),
                            gpus_step=s) for i, ((g, m, s), h, p) in enumerate(jobs)]
    cover = _cover(running_jobs, need, T0, {}, restart_cost_s=600)
    freed = sum(j.gpus - keep for j, keep in cover)
    assert freed >= min(need, sum(j.gpus for j in running_jobs))
    shrunk = [j for j, keep in cover if keep]
    for job, keep in cover:
        assert keep == 0 or (job.min_gpus <= keep < job.gpus and keep % job.gpus_step == 0)
    if shrunk:
        # what the shrinks free beyond the need is less than any one of them could give back
        assert freed - need < min(j.gpus_step for j in shrunk)

    def cost(c):
        return sum(_shrink_cost(j, k, T0, 600) if k else _stop_cost(j, T0, 600) for j, k in c)

    if len({j.priority for j in running_jobs}) == 1:
        whole = _victims(running_jobs, need, T0, {}, restart_cost_s=600)
        assert cost(cover) <= cost([(j, 0) for j in whole]) * (1 + 1e-5) + 1e-6
