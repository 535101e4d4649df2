"""Planned stops timed just after a checkpoint (policy.py ``_stops_after_checkpoint``): a
stop's SIGTERM saves nothing, so a unit that must go before its next checkpoint goes just
after its last one; segments are at least one checkpoint interval; and the simulator keeps
only what periodic checkpoints saved at a planned stop (unless the workload saves on SIGTERM)."""

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pandas as pd
from test_policy import FRESH, SETTINGS, STEP, T0, H, job, plan, profile

from idlegpu.scheduler.types import Action, RunningJob

HALF_HOUR = 1800.0


def unit(id="u", gpus=8, ckpt_ago_min=0.0, interval=HALF_HOUR, hours_left=6.0, **kw):
    return RunningJob(id=id, team="a", gpus=gpus, priority=0,
                      started_at=T0 - timedelta(hours=3), checkpointable=True,
                      remaining_s=hours_left * H,
                      last_checkpoint_at=T0 - timedelta(minutes=ckpt_ago_min),
                      checkpoint_interval_s=interval, **kw)


def ramp(minutes, free=16, after=0, hours=6):
    """``free`` GPUs for ``minutes``, then ``after``."""
    steps = int(minutes * 60 // STEP)
    return profile([free] * steps + [after] * (int(hours * 12) - steps))


def decisions(result):
    return {d.job_id: d for d in result.decisions}


def test_a_unit_that_cannot_checkpoint_again_before_the_ramp_stops_just_after_its_checkpoint():
    # 4 GPUs stay free for jobs from 11:35, the two units hold 12; unit a checkpointed at
    # 11:00 and would next at 11:30, after it must be told to go (11:35 less the grace
    # period, 11:25): a stop now loses nothing, a stop then would lose 25 minutes of 8 GPUs
    got = decisions(plan(ramp(35, after=4), running=[unit("a"), unit("b", gpus=4)]))
    assert got["a"].action is Action.PREEMPT and got["a"].planned and got["a"].cause == "forecast"
    assert got["a"].reason == ("the forecast needs 8 of their GPUs for the service from 11:35 "
                               "UTC, before its next checkpoint: it stops now, just after one, "
                               "losing nothing")
    assert "b" not in got  # 8 GPUs are the need: the 4-GPU unit runs on


def test_an_early_stop_waits_for_a_shortfall_the_median_expects_too():
    # (the promise plans the checkpointing units here, as for every unit before the median)
    promise_only = replace(SETTINGS, checkpointable_on_likely=False)
    on = replace(promise_only, early_stop_only_if_likely=True)
    running = [unit("a"), unit("b", gpus=4)]
    promise = ramp(35, after=4)
    # the median sees the pool stay quiet: the shortfall only the promise sees is more
    # likely not to come; a runs on (the usual rule stops it in time if it does come)
    quiet = replace(promise, likely=np.full(len(promise.free), 16.0))
    assert plan(quiet, running=running, settings=on).decisions == ()
    # the median falls short too, before a's next checkpoint (11:30) and the grace period:
    # stopping now, just after its checkpoint, saves its work
    busy = replace(promise, likely=ramp(40, after=4).free)
    got = decisions(plan(busy, running=running, settings=on))
    assert got["a"].action is Action.PREEMPT and got["a"].cause == "forecast"
    # ... but a median shortfall only after that (12:30) is no reason to stop early
    later = replace(promise, likely=ramp(90, after=4).free)
    assert plan(later, running=running, settings=on).decisions == ()
    # the knob off (the default): the promise alone decides, as without a median
    got = decisions(plan(quiet, running=running, settings=promise_only))
    assert got["a"].action is Action.PREEMPT
    # the median never keeps a stop the usual rule needs: within the grace period it goes
    (d,) = plan(replace(ramp(10, after=4), likely=np.full(72, 16.0)),
                running=[unit("a", ckpt_ago_min=10)], settings=on).decisions
    assert d.action is Action.PREEMPT and "within 0.2 h" in d.reason


def test_a_unit_that_checkpoints_again_in_time_runs_to_that_checkpoint():
    # the ramp at 12:00: leave by 11:50, the next checkpoint at 11:30 comes first
    assert plan(ramp(60), running=[unit("a")]).decisions == ()
    # ... and at 11:30, just after that checkpoint, it stops (the next, 12:00, is too late)
    now = T0 + timedelta(minutes=30)
    running = [replace(unit("a"), last_checkpoint_at=now)]
    (d,) = plan(ramp(60), running=running, now=now,
                signals=replace(FRESH, observed_at=now)).decisions
    assert d.action is Action.PREEMPT and d.cause == "forecast"


def test_a_unit_between_checkpoints_is_left_to_the_usual_rule():
    # it checkpointed 10 minutes ago: stopping now would lose 10 minutes; the usual rule
    # stops it a grace period before the need
    assert plan(ramp(35), running=[unit("a", ckpt_ago_min=10)]).decisions == ()
    (d,) = plan(ramp(10), running=[unit("a", ckpt_ago_min=10)]).decisions
    assert d.action is Action.PREEMPT and "within 0.2 h" in d.reason


def test_the_checkpoints_are_counted_from_the_last_known_one_by_the_interval():
    # last known checkpoint 2 h ago at a 30-minute interval: one is expected just now
    assert unit("a", ckpt_ago_min=120).last_checkpoint(T0) == T0
    assert unit("a", ckpt_ago_min=125).unsaved_work_s(T0) == 300.0
    assert unit("a", ckpt_ago_min=125, interval=None).unsaved_work_s(T0) == 125 * 60
    got = decisions(plan(ramp(35), running=[unit("a", ckpt_ago_min=120)]))
    assert got["a"].action is Action.PREEMPT
    # at 11:40 it would check in at 11:30 itself: not yet
    assert plan(ramp(40), running=[unit("a", ckpt_ago_min=120)]).decisions == ()


def test_a_window_that_closes_before_the_next_checkpoint_stops_the_unit_now():
    # its window closes at 11:30 (stop_by 11:20); its next checkpoint would be at 11:30
    running = [unit("a", stop_by=T0 + timedelta(minutes=20))]
    (d,) = plan(ramp(30), running=running).decisions  # the forecast closes it too
    assert d.action is Action.PREEMPT and d.planned and d.cause == "window"
    assert d.reason == ("its window closes at 11:30 UTC, before its next checkpoint: it stops "
                        "now, just after one, losing nothing")
    # a window closing after its next checkpoint: it runs on to it
    running = [unit("a", stop_by=T0 + timedelta(minutes=50))]
    assert plan(ramp(300), running=running).decisions == ()


def test_a_unit_that_saves_on_stop_is_not_stopped_early_for_a_checkpoint():
    # the same unit as above, but it saves when told to stop: stopping it now, 20 minutes
    # before it must go, would only give its GPUs back early; it goes at the usual rule's time
    saver = unit("a", saves_on_stop=True)
    assert saver.unsaved_work_s(T0 + timedelta(minutes=10), planned=True) == 0.0
    assert saver.unsaved_work_s(T0 + timedelta(minutes=10)) == 600.0  # a backstop's stop
    assert plan(ramp(35, after=4), running=[saver, unit("b", gpus=4, ckpt_ago_min=10)]
                ).decisions == ()
    (d,) = plan(ramp(10, after=4), running=[saver, unit("b", gpus=4, ckpt_ago_min=10)]
                ).decisions
    assert (d.job_id, d.action, d.cause) == ("a", Action.PREEMPT, "forecast")


def test_a_planned_stop_prefers_the_unit_that_saves_on_stop():
    # 8 GPUs needed within the grace period; both 8-GPU units checkpointed 20 minutes ago,
    # only one saves on stop: stopping it loses nothing, stopping the other 20 minutes
    running = [unit("keeps", ckpt_ago_min=20, saves_on_stop=True),
               unit("blind", ckpt_ago_min=20), unit("z", gpus=4, ckpt_ago_min=20)]
    got = decisions(plan(ramp(10, after=12), running=running))
    assert set(got) == {"keeps"} and got["keeps"].planned
    # for a live need (the backstop) the daemon counts the unsaved work lost either way:
    # the tie falls to the id
    pressed = replace(FRESH, gpus_short=8)
    got = decisions(plan(ramp(300, after=12), running=running, signals=pressed))
    assert set(got) == {"blind"} and got["blind"].cause == "live"


def test_units_that_cannot_checkpoint_or_whose_interval_is_unknown_are_not_timed():
    whole = replace(unit("w"), checkpointable=False)
    unknown = unit("x", interval=None)
    assert plan(ramp(35), running=[whole, unknown]).decisions == ()


def test_the_timing_can_be_turned_off():
    off = replace(SETTINGS, stop_after_checkpoint=False)
    assert plan(ramp(35), running=[unit("a")], settings=off).decisions == ()


def test_no_timed_stop_for_a_live_need_or_blind():
    pressed = replace(FRESH, gpus_short=4)
    got = decisions(plan(ramp(35), running=[unit("a")], signals=pressed))
    assert got["a"].cause == "live"  # the backstop's, not a timed one
    stale = replace(FRESH, observed_at=T0 - timedelta(hours=1))
    got = decisions(plan(ramp(35), running=[unit("a")], signals=stale))
    assert "a" not in got or got["a"].cause != "forecast"


def test_a_segment_shorter_than_one_checkpoint_interval_is_not_offered():
    # 1.5 h free: a 2-hourly checkpointing unit would save nothing of a 1.3 h segment
    two_hourly = job("slow", hours=6, ckpt=True, checkpoint_interval_s=2 * H)
    half_hourly = job("fast", hours=6, ckpt=True, checkpoint_interval_s=HALF_HOUR)
    prof = ramp(90, free=8, after=0)
    got = decisions(plan(prof, [two_hourly]))
    assert got["slow"].action is Action.DEFER
    got = decisions(plan(prof, [half_hourly]))
    assert got["fast"].action is Action.ADMIT and got["fast"].stop_by is not None


# --- the simulator's stop: only periodic checkpoints are kept --------------------------


def test_the_simulator_reads_saves_on_stop_from_each_request():
    from idlegpu.scheduler.simulate import trace_jobs
    from idlegpu.scheduler.specs import expand_units, validate_request

    class Entry:
        submit_at = T0

        def __init__(self, saves):
            self.request = validate_request({
                "name": "ft", "team": "nlp", "kind": "sft",
                "image": "registry.example.com/research/ft:1", "output": "s3://runs/{name}",
                "command": ["python", "ft.py"], "gpus": 4, "runtime_estimate": "2h",
                "checkpoint": {"enabled": True, "interval": "30m", "saves_on_stop": saves}})

        def units(self):
            return expand_units(self.request)

        def actual_runtime_s(self, step, member):
            return 2 * H

    (saver,), (blind,) = (trace_jobs([Entry(v)], lambda u: 2 * H) for v in (True, False))
    assert saver.saves_on_stop and not blind.saves_on_stop


def test_a_planned_stop_keeps_only_what_the_periodic_checkpoints_saved():
    from idlegpu.scheduler.simulate import SimJob, _Job, _Run, _stop

    spec = SimJob(id="u", team="a", kind="train", gpus=8, submit_at=T0, work_s=10 * H,
                  estimate_s=10 * H, checkpointable=True)
    for saves, lost_s in ((False, 20 * 60.0), (True, 0.0)):
        job = _Job(replace(spec, saves_on_stop=saves), saved_s=H, progress_s=20 * 60.0, gpus=8,
                   running=True, started_at=T0, last_checkpoint_at=T0 + timedelta(hours=1))
        runs = _Run()
        _stop(job, T0 + timedelta(hours=1, minutes=20), timedelta(minutes=10), planned=True,
              runs=runs, cause="forecast")
        assert job.lost_s == lost_s and job.preemptions == 0
        assert job.saved_s == H + 20 * 60.0 - lost_s
        assert pd.DataFrame(runs.rows)["lost_gpu_hours"].iloc[0] == 8 * lost_s / 3600


def test_a_window_stop_waits_for_a_checkpoint_due_by_its_stop_by():
    # stop_by 11:05 (the forecast closes its window at 11:15), the next checkpoint at 11:05 (30 min after 10:35): the usual last-pass
    # rule would stop it at 11:00 and lose 25 minutes; it stops at 11:05, just after it
    running = [unit("a", ckpt_ago_min=25, stop_by=T0 + timedelta(minutes=5))]
    assert plan(ramp(15), running=running).decisions == ()
    now = T0 + timedelta(minutes=5)
    running = [replace(running[0], last_checkpoint_at=now)]
    (d,) = plan(ramp(15), running=running, now=now,
                signals=replace(FRESH, observed_at=now)).decisions
    assert d.action is Action.PREEMPT and d.cause == "window" and d.planned
    # without the timing: the last pass before its stop_by, as before
    off = replace(SETTINGS, stop_after_checkpoint=False)
    running = [unit("a", ckpt_ago_min=25, stop_by=T0 + timedelta(minutes=5))]
    (d,) = plan(ramp(15), running=running, settings=off).decisions
    assert d.action is Action.PREEMPT and d.cause == "window"
