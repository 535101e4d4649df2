"""decide(): table-driven cases and properties (hypothesis)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from idlegpu.scheduler.policy import decide
from idlegpu.scheduler.types import (
    Action,
    FreeProfile,
    PolicySettings,
    RunningJob,
    ServingSignals,
    WaitingJob,
)

T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)  # 20:00 in Seoul
STEP = 300
H = 3600
SETTINGS = PolicySettings(grace_s=600, min_segment_s=1800)
FRESH = ServingSignals(observed_at=T0, requests_waiting_per_replica=0.0, kv_cache_usage=0.3)


def profile(values, made_at=T0, start=T0):
    return FreeProfile(start=start, step_s=STEP, free=np.asarray(values, dtype=float),
                       confidence=0.9, made_at=made_at)


def flat(gpus, hours, then=0, then_hours=2):
    """``gpus`` free for ``hours``, then ``then`` free for ``then_hours``."""
    return profile([gpus] * int(hours * 12) + [then] * int(then_hours * 12))


def job(id, gpus=8, hours=2.0, ckpt=False, priority=0, team="a", age_h=0.0, **kw):
    return WaitingJob(id=id, team=team, gpus=gpus, runtime_s=hours * H, checkpointable=ckpt,
                      priority=priority, submitted_at=T0 - timedelta(hours=age_h + 1), **kw)


def run(id, gpus=8, hours_left=4.0, priority=0, since_ckpt_h=1.0, ckpt=True, stop_by=None):
    return RunningJob(id=id, team="a", gpus=gpus, priority=priority,
                      started_at=T0 - timedelta(hours=5), checkpointable=ckpt,
                      remaining_s=hours_left * H,
                      last_checkpoint_at=T0 - timedelta(hours=since_ckpt_h), stop_by=stop_by)


def plan(prof, queue=(), running=(), signals=FRESH, usage=None, settings=SETTINGS, now=T0):
    return decide(now, prof, list(running), list(queue), signals, usage or {}, settings)


def actions(result):
    return {d.job_id: d.action for d in result.decisions}


# ----------------------------------------------------------------------------- admission


def test_a_job_that_fits_whole_is_admitted_without_a_stop():
    result = plan(flat(16, 6), [job("j", gpus=8, hours=3)])
    (d,) = result.decisions
    assert d.action is Action.ADMIT and d.stop_by is None
    assert "8 GPUs stay free for its 3.0 h" in d.reason


def test_a_job_that_does_not_fit_whole_waits_with_the_reason():
    result = plan(flat(16, 2), [job("j", gpus=8, hours=3)])
    (d,) = result.decisions
    assert d.action is Action.DEFER
    assert "do not stay free whole" in d.reason or "past the end" in d.reason


def test_no_free_gpus_says_so():
    (d,) = plan(flat(0, 6, then=0), [job("j", gpus=4, hours=1)]).decisions
    assert d.action is Action.DEFER and "needs 4 GPUs; 0 free now" in d.reason


def test_a_checkpointable_long_job_runs_a_segment_that_ends_before_the_ramp():
    # 10 h window of 32 GPUs; a 40 h job gets a segment that stops grace before the window ends
    (d,) = plan(flat(32, 10, then=0, then_hours=14), [job("big", gpus=32, hours=40, ckpt=True)]).decisions
    assert d.action is Action.ADMIT
    assert d.stop_by == T0 + timedelta(hours=10) - timedelta(seconds=600)
    assert "segment" in d.reason


def test_a_window_shorter_than_a_worthwhile_segment_is_not_used():
    (d,) = plan(flat(32, 0.5, then=0, then_hours=20), [job("big", gpus=32, hours=40, ckpt=True)]).decisions
    assert d.action is Action.DEFER


def test_exhausted_preemptions_mean_the_job_must_fit_whole():
    prof = flat(32, 10, then=0, then_hours=14)
    tired = job("big", gpus=32, hours=40, ckpt=True, preemptions=5, max_preemptions=5)
    (d,) = plan(prof, [tired]).decisions
    assert d.action is Action.DEFER


@pytest.mark.parametrize(
    ("queue", "winner"),
    [
        ([job("low", priority=0, age_h=9), job("high", priority=5)], "high"),
        ([job("busy", team="x"), job("idle", team="y")], "idle"),  # fair share (usage below)
        ([job("young", age_h=0), job("old", age_h=3)], "old"),
        ([job("b"), job("a")], "a"),  # total tie-break on the id
    ],
)
def test_order_is_priority_then_fair_share_then_age(queue, winner):
    result = plan(flat(8, 6), queue, usage={"x": 100.0, "y": 5.0})
    admitted = [d.job_id for d in result.of(Action.ADMIT)]
    assert admitted == [winner]


def test_the_head_job_gets_a_reservation_and_small_jobs_backfill_around_it():
    # 16 GPUs now, 48 from hour 2 to hour 12
    prof = profile([16] * 24 + [48] * 120 + [0] * 24)
    head = job("head", gpus=48, hours=6, priority=1)
    short = job("short", gpus=8, hours=1)  # ends before the reservation starts
    long = job("long", gpus=16, hours=5)  # would eat into the reservation
    result = plan(prof, [head, short, long])
    got = actions(result)
    assert got == {"head": Action.DEFER, "short": Action.ADMIT, "long": Action.DEFER}
    reserved = next(d for d in result.decisions if d.job_id == "head")
    assert reserved.start_at == T0 + timedelta(hours=2)
    assert "reserved" in reserved.reason


def test_deadline_passed():
    (d,) = plan(flat(16, 6), [job("late", deadline=T0 - timedelta(hours=1))]).decisions
    assert d.action is Action.DEFER and "deadline" in d.reason


# ----------------------------------------------------------------------------- gates


def test_stale_signals_block_admission_but_do_not_preempt_yet():
    stale = ServingSignals(observed_at=T0 - timedelta(minutes=5))
    result = plan(flat(32, 6), [job("j")], running=[run("r")], signals=stale)
    assert actions(result) == {"j": Action.DEFER}
    assert "not admitting blind" in result.decisions[0].reason


def test_signals_missing_too_long_preempt_everything():
    gone = ServingSignals(observed_at=T0 - timedelta(minutes=30))
    result = plan(flat(32, 6), [job("j")], running=[run("r1"), run("r2")], signals=gone)
    assert actions(result) == {"r1": Action.PREEMPT, "r2": Action.PREEMPT, "j": Action.DEFER}
    never = plan(flat(32, 6), [], running=[run("r1")], signals=ServingSignals(observed_at=None))
    assert actions(never) == {"r1": Action.PREEMPT}
    relaxed = PolicySettings(missing_signals_preempt_after_s=None)
    kept = plan(flat(32, 6), [], running=[run("r1")], signals=gone, settings=relaxed)
    assert actions(kept) == {}
    # missing since a known moment (a restart found the source down): blind at once, but the
    # jobs are only given up after the configured time
    lately = ServingSignals(observed_at=None, missing_since=T0 - timedelta(minutes=5))
    result = plan(flat(32, 6), [job("j")], running=[run("r1")], signals=lately)
    assert actions(result) == {"j": Action.DEFER}
    assert "live signals missing for 300 s; not admitting blind" in result.decisions[0].reason
    long_ago = ServingSignals(observed_at=None, missing_since=T0 - timedelta(minutes=16))
    result = plan(flat(32, 6), [], running=[run("r1")], signals=long_ago)
    assert actions(result) == {"r1": Action.PREEMPT}
    assert "missing for 16 min" in result.decisions[0].reason


def test_a_unit_that_cannot_checkpoint_runs_through_a_metrics_outage_unless_told_to_stop():
    """Signals missing for good: the units that can checkpoint stop (they keep their work);
    one that cannot is left running (its stop would lose everything; the cluster's preemption
    still serves the service) and nothing new starts. The old rule on request."""
    from dataclasses import replace

    gone = ServingSignals(observed_at=T0 - timedelta(minutes=30))
    queue, running = [job("j")], [run("saves"), run("whole", ckpt=False)]
    result = plan(flat(32, 6), queue, running=running, signals=gone)
    assert actions(result) == {"saves": Action.PREEMPT, "j": Action.DEFER}
    assert "every job that can checkpoint" in result.decisions[0].reason
    strict = replace(SETTINGS, whole_units_through_outages=False)
    result = plan(flat(32, 6), queue, running=running, signals=gone, settings=strict)
    assert actions(result) == {"saves": Action.PREEMPT, "whole": Action.PREEMPT,
                               "j": Action.DEFER}


def test_an_old_forecast_blocks_admission():
    old = profile([32] * 100, made_at=T0 - timedelta(hours=27))
    (d,) = plan(old, [job("j")]).decisions
    assert d.action is Action.DEFER and "forecast is 27.0 h old" in d.reason


# ----------------------------------------------------------------------------- preemption


def test_forecast_ramp_preempts_just_enough_before_it_arrives():
    # 24 GPUs free for 5 minutes, then 8: the ramp is inside the grace period
    prof = profile([24] * 1 + [8] * 50)
    result = plan(prof, running=[run("a", gpus=8), run("b", gpus=16, since_ckpt_h=0.1)])
    assert actions(result) == {"b": Action.PREEMPT}  # frees 16 >= need 16
    assert "forecast" in result.decisions[0].reason


def test_a_ramp_beyond_the_grace_period_waits():
    prof = profile([24] * 6 + [8] * 50)  # ramp in 30 min, grace 10 min
    assert actions(plan(prof, running=[run("a", gpus=8), run("b", gpus=16)])) == {}


def test_victims_lose_the_least_work_lowest_priority_first():
    running = [
        run("vip", gpus=8, priority=9, since_ckpt_h=0.0),
        run("fresh-ckpt", gpus=8, since_ckpt_h=0.1),
        run("stale-ckpt", gpus=8, since_ckpt_h=3.0),
        run("no-ckpt", gpus=8, ckpt=False),
    ]
    signals = ServingSignals(observed_at=T0, gpus_short=8)
    result = plan(flat(32, 6), running=running, signals=signals)
    assert actions(result) == {"fresh-ckpt": Action.PREEMPT}
    assert "cannot get" in result.decisions[0].reason
    more = plan(flat(32, 6), running=running, signals=ServingSignals(observed_at=T0, gpus_short=12))
    assert set(actions(more)) == {"fresh-ckpt", "stale-ckpt"}


def test_kv_pressure_preempts_one_replica_worth_and_stops_admission():
    signals = ServingSignals(observed_at=T0, kv_cache_usage=0.97)
    result = plan(flat(32, 6), [job("j", gpus=4)], running=[run("r", gpus=4)], signals=signals)
    assert actions(result) == {"r": Action.PREEMPT, "j": Action.DEFER}
    assert "under pressure" in result.of(Action.DEFER)[0].reason


def test_a_closing_window_stops_its_job_as_planned():
    running = [run("seg", gpus=8, stop_by=T0 + timedelta(minutes=5))]
    result = plan(flat(32, 0.25), running=running)  # the forecast still closes it
    assert actions(result) == {"seg": Action.PREEMPT}
    assert "window closes" in result.decisions[0].reason


def test_a_window_the_forecast_no_longer_closes_is_renewed_not_stopped_and_restarted():
    """A unit whose window closes, where the pass would admit it again on the same GPUs, runs
    on (no grace period, reload and warm-up spent on a stop and a restart): to its end when
    its work left fits, else into a new window, as an admission would give it."""
    running = [run("seg", gpus=8, hours_left=4.0, stop_by=T0 + timedelta(minutes=5))]
    result = plan(flat(32, 6), running=running)
    (renewal,) = result.decisions
    assert (renewal.action, renewal.gpus, renewal.stop_by) == (Action.RENEW, 8, None)
    assert "window closes" in renewal.reason and "runs on" in renewal.reason
    # a longer run than the new window: renewed into it, to stop before it closes
    running = [run("seg", gpus=8, hours_left=9.0, stop_by=T0 + timedelta(minutes=5))]
    (renewal,) = plan(flat(32, 6), running=running).decisions
    assert renewal.action is Action.RENEW
    assert renewal.stop_by == T0 + timedelta(hours=6) - timedelta(seconds=SETTINGS.grace_s)
    # blind: no admission, so no renewal either; it stops as planned
    stale = ServingSignals(observed_at=T0 - timedelta(hours=1), kv_cache_usage=0.3)
    assert actions(plan(flat(32, 6), running=running, signals=stale))["seg"] is Action.PREEMPT


def test_a_renewal_keeps_the_queue_order():
    """The unit renewed takes its place in the queue: a unit ahead of it (higher priority)
    that waits for its GPUs gets them once its grace period is over; one behind it waits."""
    closing = run("seg", gpus=8, hours_left=9.0, stop_by=T0 + timedelta(minutes=5))
    ahead = job("vip", gpus=8, hours=2.0, priority=5)
    result = plan(flat(8, 6), [ahead], running=[closing])
    assert actions(result) == {"seg": Action.PREEMPT, "vip": Action.DEFER}
    assert "reserved" in result.of(Action.DEFER)[0].reason
    behind = job("later", gpus=8, hours=2.0)
    result = plan(flat(8, 6), [behind], running=[closing])
    assert actions(result) == {"seg": Action.RENEW, "later": Action.DEFER}


def test_a_segment_stops_at_the_last_pass_before_its_stop_by_not_a_grace_period_early():
    """A segment's ``stop_by`` is its window's end less the grace period: stopped at the last
    pass (5-minute steps) before it, its GPUs are back by the window's end. It used to be
    stopped once ``stop_by`` was within a grace period, giving back 10 minutes of its window."""
    stop_by = T0 + timedelta(minutes=20)
    for minutes, stops in ((0, False), (10, False), (15, True)):
        now = T0 + timedelta(minutes=minutes)
        running = [run("seg", gpus=8, stop_by=stop_by)]
        # the profile closes the window where stop_by says (else it is renewed)
        result = plan(profile([32] * 6 + [0] * 66, start=T0), running=running, now=now,
                      signals=ServingSignals(observed_at=now, kv_cache_usage=0.3))
        assert (actions(result) == {"seg": Action.PREEMPT}) is stops, minutes
        if stops:  # released a grace period later: 5 minutes past stop_by, before the end
            assert now + timedelta(seconds=SETTINGS.grace_s) <= stop_by + timedelta(
                seconds=SETTINGS.grace_s)


# ----------------------------------------------------------------------------- properties


waiting_jobs = st.lists(
    st.builds(
        lambda i, gpus, hours, ckpt, prio, team: job(f"j{i}", gpus=gpus, hours=hours, ckpt=ckpt,
                                                    priority=prio, team=team, age_h=i % 5),
        st.integers(0, 10_000), st.sampled_from([1, 4, 8, 16, 32]),
        st.floats(0.1, 30), st.booleans(), st.integers(0, 3), st.sampled_from("abc"),
    ),
    max_size=25, unique_by=lambda j: j.id,
)
profiles = st.lists(st.integers(0, 64), min_size=1, max_size=60).map(
    lambda v: profile(np.repeat(v, 4))
)


@hsettings(max_examples=150, deadline=None)
@given(prof=profiles, queue=waiting_jobs)
def test_admissions_never_overcommit_the_profile(prof, queue):
    result = plan(prof, queue)
    load = np.zeros(len(prof.free))
    by_id = {j.id: j for j in queue}
    for d in result.of(Action.ADMIT):
        j = by_id[d.job_id]
        seconds = (d.stop_by - T0).total_seconds() if d.stop_by else j.runtime_s
        steps = int(np.ceil((seconds + SETTINGS.grace_s) / STEP))
        assert steps <= len(prof.free), "admitted past the forecast"
        load[:steps] += j.gpus
        if not j.checkpointable:
            assert d.stop_by is None
            assert prof.free[:steps].min() >= j.gpus  # fits whole
    assert (load <= prof.free + 1e-9).all()


@hsettings(max_examples=60, deadline=None)
@given(prof=profiles, queue=waiting_jobs, seed=st.integers(0, 100))
def test_same_inputs_same_decisions_whatever_the_input_order(prof, queue, seed):
    shuffled = list(queue)
    np.random.default_rng(seed).shuffle(shuffled)
    assert plan(prof, queue) == plan(prof, shuffled)


@hsettings(max_examples=150, deadline=None)
@given(
    gpus=st.lists(st.sampled_from([1, 4, 8, 16, 32]), min_size=1, max_size=10),
    ckpt_hours=st.lists(st.floats(0, 10), min_size=10, max_size=10),
    need=st.integers(1, 100),
)
def test_preemption_frees_enough_and_no_more_victims_than_needed(gpus, ckpt_hours, need):
    running = [run(f"r{i}", gpus=g, since_ckpt_h=ckpt_hours[i]) for i, g in enumerate(gpus)]
    signals = ServingSignals(observed_at=T0, gpus_short=need)
    result = plan(flat(400, 6), running=running, signals=signals)  # room for every job
    victims = [d for d in result.of(Action.PREEMPT)]
    freed = sum(d.gpus for d in victims)
    if sum(gpus) >= need:
        assert freed >= need
        assert all(freed - d.gpus < need for d in victims)  # each victim is necessary
    else:
        assert len(victims) == len(running)


def test_pressure_is_served_by_idle_gpus_before_any_job_goes():
    signals = ServingSignals(observed_at=T0, kv_cache_usage=0.97, idle_gpus=6)
    result = plan(flat(32, 6), [job("j", gpus=4)], running=[run("r", gpus=4)], signals=signals)
    assert actions(result) == {"j": Action.ADMIT}


def test_new_jobs_get_no_more_than_what_is_idle_now():
    # the forecast promises 32, but the service spiked: only 12 GPUs are idle (4 headroom)
    signals = ServingSignals(observed_at=T0, idle_gpus=12)
    capped = PolicySettings(headroom_gpus=4, live_cap_s=3600)
    result = plan(flat(32, 6), [job("big", gpus=16, hours=2), job("small", gpus=8, hours=2)],
                  signals=signals, settings=capped)
    assert actions(result) == {"big": Action.DEFER, "small": Action.ADMIT}


# ----------------------------------------------------------------------------- forecast holes

NAN = float("nan")


def test_a_hole_now_admits_nothing_and_stops_nothing():
    prof = profile([NAN] * 12 + [32] * 60)
    result = plan(prof, [job("j", gpus=4, hours=1)], running=[run("r", gpus=8)])
    assert actions(result) == {"j": Action.DEFER}
    assert "hole" in result.decisions[0].reason and "blind" in result.decisions[0].reason


def test_nothing_is_admitted_into_a_hole_ahead_but_a_segment_stops_before_it():
    prof = profile([32] * 36 + [NAN] * 12 + [32] * 60)  # a hole from 3 h on
    result = plan(prof, [job("whole", gpus=8, hours=4), job("ckpt", gpus=8, hours=6, ckpt=True)])
    by_id = {d.job_id: d for d in result.decisions}
    assert by_id["whole"].action is Action.DEFER
    assert by_id["ckpt"].action is Action.ADMIT
    assert by_id["ckpt"].stop_by <= T0 + timedelta(hours=3) - timedelta(seconds=SETTINGS.grace_s)


def test_a_hole_within_the_grace_period_is_no_demand():
    prof = profile([16] + [NAN] * 24 + [16] * 60)
    assert actions(plan(prof, running=[run("a", gpus=8), run("b", gpus=8)])) == {}
    # a real ramp beside the hole still stops what is needed
    ramp = profile([16, NAN, 8] + [8] * 60)
    assert len(plan(ramp, running=[run("a", gpus=8), run("b", gpus=8)]).of(Action.PREEMPT)) == 1


@hsettings(max_examples=100, deadline=None)
@given(prof=st.lists(st.one_of(st.integers(0, 64), st.just(-1)), min_size=1, max_size=40).map(
    lambda v: profile(np.repeat([NAN if x < 0 else x for x in v], 4))), queue=waiting_jobs)
def test_never_a_crash_nor_an_admission_into_a_hole(prof, queue):
    running = [run("r", gpus=8, hours_left=3.0)]
    result = plan(prof, queue, running=running)  # never raises
    by_id = {j.id: j for j in queue}
    for d in result.of(Action.ADMIT):
        j = by_id[d.job_id]
        seconds = (d.stop_by - T0).total_seconds() if d.stop_by else j.runtime_s
        steps = int(np.ceil((seconds + SETTINGS.grace_s) / STEP))
        assert not np.isnan(prof.free[:steps]).any()
    for d in result.of(Action.PREEMPT):  # only for a real demand, never for a hole
        window = prof.free[: int(SETTINGS.grace_s // STEP) + 1]
        assert (window[~np.isnan(window)] < 8).any()


# ----------------------------------------------------------------------------- victims


def test_a_small_shortfall_stops_the_small_job_not_a_big_one_past_its_checkpoint():
    running = [run("big", gpus=32, since_ckpt_h=0.05), run("small", gpus=4, since_ckpt_h=1.0)]
    short = ServingSignals(observed_at=T0, gpus_short=4)
    # 32 GPUs x (3 min + 10 min restart) > 4 GPUs x (60 min + 10 min)
    assert actions(plan(flat(64, 6), running=running, signals=short)) == {"small": Action.PREEMPT}
    # without a restart cost only the unsaved work counts: the big one has the least
    free_restart = PolicySettings(grace_s=600, min_segment_s=1800, restart_cost_s=0)
    assert actions(plan(flat(64, 6), running=running, signals=short,
                        settings=free_restart)) == {"big": Action.PREEMPT}


def test_victims_free_the_need_at_the_least_cost_not_greedily():
    # 12 GPUs: the two 8-GPU jobs have no unsaved work, but restarting both costs
    # 16 x 600 GPU-s; the 12-GPU one, checkpointed 72 s ago, costs 12 x (72 + 600)
    running = [run("y8", gpus=8, since_ckpt_h=0.0), run("z8", gpus=8, since_ckpt_h=0.0),
               run("x12", gpus=12, since_ckpt_h=0.02)]
    short = ServingSignals(observed_at=T0, gpus_short=12)
    assert actions(plan(flat(64, 6), running=running, signals=short)) == {"x12": Action.PREEMPT}


def test_higher_priority_jobs_are_spared_while_lower_ones_can_cover_the_need():
    running = [run("vip", gpus=4, priority=5, since_ckpt_h=0.0),
               run("low", gpus=32, priority=0, since_ckpt_h=2.0)]
    short = ServingSignals(observed_at=T0, gpus_short=4)
    assert actions(plan(flat(64, 6), running=running, signals=short)) == {"low": Action.PREEMPT}


def test_known_runtimes_spare_a_job_that_ends_before_the_ramp():
    prof = profile([16] * 2 + [8] * 60)  # a ramp in 10 min, within the grace period
    ending = [run("ends", gpus=8, hours_left=5 / 60), run("stays", gpus=8)]
    assert len(plan(prof, running=ending).of(Action.PREEMPT)) == 1  # nobody is trusted
    known = PolicySettings(grace_s=600, min_segment_s=1800, runtimes_known=True)
    assert actions(plan(prof, running=ending, settings=known)) == {}  # 8 GPUs left: enough
    ramp = profile([16] * 2 + [4] * 60)
    assert actions(plan(ramp, running=ending, settings=known)) == {"stays": Action.PREEMPT}


def test_a_closing_window_and_a_ramp_together_stop_enough():
    # 24 GPUs held, 8 of them stopping as planned; the ramp leaves 8: 8 more must go
    running = [run("seg", gpus=8, stop_by=T0 + timedelta(minutes=5)),
               run("a", gpus=8), run("b", gpus=8)]
    result = plan(profile([8] * 60), running=running)
    assert len(result.of(Action.PREEMPT)) == 2 and "seg" in actions(result)


def test_every_stop_names_its_cause():
    """What made each stop, for the simulator's lost-work breakdown: the window, the profile,
    the live backstop, missing signals or a growth (``STOP_CAUSES``), agreeing with
    ``planned``."""
    from idlegpu.scheduler.types import STOP_CAUSES

    window = plan(flat(32, 0.25), running=[run("seg", stop_by=T0 + timedelta(minutes=5))])
    ramp = plan(profile([24] * 1 + [8] * 50), running=[run("a"), run("b", gpus=16)])
    live = plan(flat(32, 6), running=[run("r")],
                signals=ServingSignals(observed_at=T0, gpus_short=8))
    gone = plan(flat(32, 6), running=[run("r")],
                signals=ServingSignals(observed_at=T0 - timedelta(minutes=30)))
    on_half = RunningJob(id="e", team="a", gpus=16, priority=0,
                         started_at=T0 - timedelta(hours=3), checkpointable=True,
                         remaining_s=10 * H, last_checkpoint_at=T0 - timedelta(minutes=2),
                         min_gpus=16, gpus_step=8, max_gpus=32, checkpoint_interval_s=1800.0)
    grow = plan(flat(40, 6), running=[on_half])
    seen = {}
    for name, result in (("window", window), ("forecast", ramp), ("live", live),
                         ("signals", gone), ("grow", grow)):
        (d,) = result.of(Action.PREEMPT)
        seen[name] = (d.cause, d.planned)
    assert seen == {"window": ("window", True), "forecast": ("forecast", True),
                    "live": ("live", False), "signals": ("signals", False),
                    "grow": ("grow", True)}
    assert set(STOP_CAUSES) == {cause for cause, _ in seen.values()}
    admitted = plan(flat(32, 6), [job("j")]).decisions[0]
    assert admitted.action is Action.ADMIT and admitted.cause == ""


# ------------------------------------------------------- units that cannot checkpoint


def test_a_ramp_the_forecast_expects_stops_checkpointable_units_only():
    # 24 GPUs free now, 8 from the next step: the ramp is inside the grace period
    prof = profile([24] * 1 + [8] * 50)
    running = [run("eval", gpus=16, ckpt=False), run("train", gpus=8, since_ckpt_h=0.1)]
    result = plan(prof, running=running)
    # 16 GPUs short within the grace period: only the checkpointable 8 go; the eval, which
    # would lose all it has done, runs on until the service needs its GPUs now
    assert actions(result) == {"train": Action.PREEMPT}
    assert result.decisions[0].cause == "forecast"


def test_a_unit_that_cannot_checkpoint_is_stopped_once_the_service_needs_its_gpus_now():
    running = [run("eval", gpus=16, ckpt=False), run("train", gpus=8, since_ckpt_h=0.1)]
    # 12 GPUs free now for the 24 held: 12 short now
    result = plan(profile([12] * 50), running=running)
    assert set(actions(result)) == {"eval"}  # the cheapest cover of 12 GPUs needed now
    # a live need stops it as before
    live = plan(flat(40, 6), running=running,
                signals=ServingSignals(observed_at=T0, gpus_short=16))
    assert actions(live) == {"eval": Action.PREEMPT}


def test_without_live_signals_a_forecast_alone_stops_no_unit_that_cannot_checkpoint():
    # the signals are 30 s old (fresh) vs missing: missing, the present step is the forecast's
    # only, and the missing-signals rule (not the forecast) stops everything on its own clock
    stale = ServingSignals(observed_at=T0 - timedelta(minutes=5))
    result = plan(profile([4] * 50), running=[run("eval", gpus=16, ckpt=False)], signals=stale)
    assert result.of(Action.PREEMPT) == []


@hsettings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.integers(0, 64), min_size=4, max_size=30),
    jobs=st.lists(st.tuples(st.sampled_from([1, 4, 8, 16]), st.booleans(), st.floats(0, 5)),
                  min_size=1, max_size=8),
)
def test_a_unit_that_cannot_checkpoint_is_never_stopped_while_the_service_does_not_need_it(
        free, jobs):
    """The issue's rule, for any profile and mix: while the GPUs free now (the profile's
    present step) cover every running unit and no live signal asks for more, no unit that
    cannot checkpoint is stopped, whatever the forecast expects later."""
    running = [run(f"r{i}", gpus=g, ckpt=c, since_ckpt_h=h) for i, (g, c, h) in enumerate(jobs)]
    held = sum(j.gpus for j in running)
    free = [max(free[0], held), *free[1:]]  # the service does not need their GPUs now
    result = plan(profile(free), running=running)
    whole = {j.id for j in running if not j.checkpointable}
    assert not whole & {d.job_id for d in result.of(Action.PREEMPT)}
    # and whatever the forecast needs is still freed by the units that can checkpoint
    ckpt = sum(j.gpus for j in running if j.checkpointable)
    need = max(0, held - min(free[:3]))
    freed = sum(d.gpus for d in result.of(Action.PREEMPT))
    assert freed >= min(need, ckpt)


def test_a_unit_admitted_at_a_refresh_is_not_stopped_by_the_next_when_the_need_is_the_same():
    """The evening refresh re-forecasts the same need: what one refresh admitted, the next
    does not stop (no admit-then-stop churn across a refresh)."""
    settings = PolicySettings(grace_s=600, min_segment_s=1800, headroom_gpus=8, pool_gpus=80,
                              nowcast_half_life_s=6 * H)
    need = [40.0] * 12 * 8 + [8.0] * 12 * 16  # 40 free for 8 h, then 8 for 16 h
    first = FreeProfile(start=T0, step_s=STEP, free=np.asarray(need), confidence=0.9,
                        made_at=T0)
    seen = ServingSignals(observed_at=T0, idle_gpus=48, service_gpus=32)
    queue = [job("eval", gpus=16, hours=3), job("train", gpus=16, hours=12, ckpt=True)]
    admitted = plan(first, queue, signals=seen, settings=settings)
    assert {d.job_id: d.action for d in admitted.decisions} == {"eval": Action.ADMIT,
                                                                "train": Action.ADMIT}
    stop_by = {d.job_id: d.stop_by for d in admitted.decisions}
    # an hour later, the next refresh: the same need from its own start on
    later = T0 + timedelta(hours=1)
    second = FreeProfile(start=later, step_s=STEP, free=np.asarray(need[12:]),
                         confidence=0.9, made_at=later)
    running = [RunningJob(id=d.job_id, team="a", gpus=d.gpus, priority=0, started_at=T0,
                          checkpointable=d.job_id == "train",
                          remaining_s=(3 if d.job_id == "eval" else 12) * H - H,
                          last_checkpoint_at=T0, stop_by=stop_by[d.job_id])
               for d in admitted.decisions]
    now_seen = ServingSignals(observed_at=later, idle_gpus=16, service_gpus=32)
    again = decide(later, second, running, [], now_seen, {}, settings)
    assert again.decisions == ()


def test_a_unit_admitted_on_a_forecast_that_just_holds_is_not_stopped_by_the_next_pass():
    """The real-traffic pool's ``overruns`` variant, Thursday 2018-04-05 21:00-21:50: a
    32-GPU pretraining unit was admitted, stopped five minutes later, admitted again at
    21:20 and stopped at 21:25, three times in an hour, each stop losing its five minutes.
    The pool did not move (the service at 40 GPUs, 32 free beyond the headroom); the live
    correction re-anchored on it each pass, so the forecast a few steps ahead drifted by a
    tenth of a GPU, and a stop asked only more than nothing of it. A stop asks a whole GPU."""
    settings = PolicySettings(grace_s=600, min_segment_s=1800, headroom_gpus=8, pool_gpus=80,
                              nowcast_half_life_s=6 * H)
    free = [30.2, 30.3, 30.3, 30.3, 30.3] + [31.0] * 7 + [35.0] * 200  # the 17:00 refresh's
    refresh = profile(free, made_at=T0 - timedelta(hours=4), start=T0)
    quiet = ServingSignals(observed_at=T0, idle_gpus=40, service_gpus=40)
    unit = job("pretrain", gpus=32, hours=600, ckpt=True, checkpoint_interval_s=H)
    (admitted,) = plan(refresh, [unit], signals=quiet, settings=settings).decisions
    assert admitted.action is Action.ADMIT
    later = T0 + timedelta(seconds=STEP)
    running = RunningJob(id="pretrain", team="a", gpus=32, priority=0, started_at=T0,
                         checkpointable=True, remaining_s=600 * H - STEP, last_checkpoint_at=T0,
                         checkpoint_interval_s=H, stop_by=admitted.stop_by)
    same_pool = ServingSignals(observed_at=later, idle_gpus=8, service_gpus=40)
    again = plan(refresh, running=[running], signals=same_pool, settings=settings, now=later)
    assert again.decisions == ()
    # a whole GPU short is a need: the service two GPUs up stops it (headroom or not)
    busier = ServingSignals(observed_at=later, idle_gpus=6, service_gpus=42)
    stopped = plan(refresh, running=[running], signals=busier, settings=settings, now=later)
    assert [d.action for d in stopped.decisions] == [Action.PREEMPT]


def test_a_unit_that_cannot_checkpoint_runs_into_the_headroom_until_the_service_needs_it():
    """The headroom is there for the stops that take a grace period. A unit that cannot
    checkpoint loses all it has done when stopped and gives its GPUs back within a step:
    the service eating into the headroom does not stop it (a checkpointable unit beside it
    is stopped instead, when there is one); the service short of GPUs does."""
    settings = PolicySettings(grace_s=600, min_segment_s=1800, headroom_gpus=8, pool_gpus=80,
                              nowcast_half_life_s=6 * H)
    refresh = flat(40, 12)
    sft = run("sft", gpus=16, hours_left=6, ckpt=False)
    # the service at 58 of 80 GPUs: 14 free beyond the headroom for the 16 the unit holds,
    # 6 idle
    into_headroom = ServingSignals(observed_at=T0, idle_gpus=6, service_gpus=58)
    assert plan(refresh, running=[sft], signals=into_headroom, settings=settings).decisions == ()
    # the simulator's reactive baseline keeps the rule it was measured with: it stops then
    baseline = replace(settings, whole_units_into_headroom=False)
    (stop,) = plan(refresh, running=[sft], signals=into_headroom, settings=baseline).decisions
    assert stop.action is Action.PREEMPT and stop.job_id == "sft"
    # beside a checkpointable unit, that one covers the headroom
    train = run("train", gpus=8, hours_left=6, ckpt=True)
    tight = ServingSignals(observed_at=T0, idle_gpus=0, service_gpus=56)
    stops = plan(refresh, running=[sft, train], signals=tight, settings=settings)
    assert {d.job_id: d.action for d in stops.decisions} == {"train": Action.PREEMPT}
    # the service short of GPUs (the autoscaler's replicas pending): it is stopped
    short = ServingSignals(observed_at=T0, idle_gpus=0, service_gpus=64, gpus_short=4)
    (stop,) = plan(refresh, running=[sft], signals=short, settings=settings).decisions
    assert stop.action is Action.PREEMPT and stop.job_id == "sft" and not stop.planned


def test_a_resume_needs_a_segment_that_outlasts_its_reload_by_a_checkpoint_interval():
    # a checkpoint every 30 min, a 10-min reload first when it resumes: a fresh start saves
    # its first checkpoint 30 min in, a resume only 40 min in
    fresh = job("sft", gpus=16, hours=4.0, ckpt=True, checkpoint_interval_s=1800)
    resume = replace(fresh, runtime_s=4 * H + 600, reload_s=600)
    window = flat(16, 45 / 60)  # 45 min: 30 min + grace, not 40 min + grace
    (d,) = decide(T0, window, [], [fresh], FRESH, {}, SETTINGS).decisions
    assert d.action is Action.ADMIT and d.stop_by is not None
    (d,) = decide(T0, window, [], [resume], FRESH, {}, SETTINGS).decisions
    assert d.action is Action.DEFER
    (d,) = decide(T0, flat(16, 55 / 60), [], [resume], FRESH, {}, SETTINGS).decisions
    assert d.action is Action.ADMIT and d.stop_by is not None
