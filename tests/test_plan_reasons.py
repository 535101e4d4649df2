"""Why a unit waits, for the whole night (``idlegpu.scheduler.plan.wait_reason``): one constructed
plan per kind of reason, each said once and in words, with its times in the plan's zone; and the
plan over the queue's head (``plan_ahead``'s ``head``) equal to the plan over all of it."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from idlegpu.scheduler.plan import plan_ahead
from idlegpu.scheduler.types import FreeProfile, PolicySettings, RunningJob, WaitingJob

T0 = datetime(2026, 1, 28, 9, 0, tzinfo=UTC)  # Wed 18:00 in Seoul
SEOUL = ZoneInfo("Asia/Seoul")
STEPS_PER_HOUR = 12


def profile(*stretches: tuple[float, float], made_at: datetime = T0) -> FreeProfile:
    """A 26-hour free-GPU profile at 5-minute steps of ``(hours, free GPUs)`` stretches, then 0."""
    free = np.concatenate([np.full(int(h * STEPS_PER_HOUR), g, float) for h, g in stretches])
    free = np.concatenate([free, np.zeros(26 * STEPS_PER_HOUR - len(free))])
    return FreeProfile(T0, 300, free, 0.9, made_at)


def unit(id_, gpus, hours, *, priority=0, checkpointable=False, **kw) -> WaitingJob:
    return WaitingJob(id_, "t", gpus, hours * 3600, checkpointable, priority,
                      T0 - timedelta(hours=1), **kw)


GRACE = PolicySettings(grace_s=600)


def reasons(free: FreeProfile, queue, settings: PolicySettings = GRACE, **kw) -> dict:
    plan = plan_ahead(T0, free, queue, settings, horizon=timedelta(hours=24), tz=SEOUL, **kw)
    return {job.id: reason for job, reason in plan.waiting}


def test_its_deadline_passed_before_the_night():
    said = reasons(profile((2, 0), (12, 16)), [unit("late", 8, 1, deadline=T0)])
    assert said["late"] == "its deadline has passed (Wed 2026-01-28 18:00 KST)"


def test_its_deadline_passes_before_the_first_window_long_enough():
    said = reasons(profile((2, 0), (12, 16)),
                   [unit("soon", 8, 1, deadline=T0 + timedelta(hours=1))])
    assert said["soon"] == ("needs 8 GPUs; its deadline (Wed 19:00 KST) passes before the "
                            "first 8-GPU window long enough opens at Wed 20:00 KST")


def test_no_window_of_its_size_opens():
    said = reasons(profile((3, 2), (5, 40)), [unit("huge", 64, 2)])
    assert said["huge"] == ("needs 64 GPUs; 2 free now and at most 40 in the next 24 h (at "
                            "Wed 21:00 KST): no 64-GPU window opens")


def test_the_jobs_running_hold_the_gpus_all_night():
    held = RunningJob("r", "t", 16, 0, T0 - timedelta(hours=1), False, 30 * 3600, None, None,
                      "training")
    said = reasons(profile((26, 16)), [unit("x", 16, 1)], running=[held])
    assert said["x"] == ("needs 16 GPUs; the pool has 16 free from Wed 18:00 KST, but the jobs "
                         "running or planned ahead of it hold them: at most 0 left in the "
                         "next 24 h")


def test_no_window_is_long_enough_for_its_runtime():
    said = reasons(profile((2, 0), (2, 16), (3, 0), (1.5, 16)), [unit("long", 16, 3)])
    assert said["long"] == ("needs 16 GPUs for 3.0 h + grace without a stop; the longest "
                            "16-GPU window in the next 24 h is 2.0 h (from Wed 20:00 KST)")


def test_no_window_is_long_enough_for_a_worthwhile_segment():
    settings = PolicySettings(grace_s=600, min_segment_s=3600)
    said = reasons(profile((2, 0), (0.5, 16)), [unit("ckpt", 16, 6, checkpointable=True)],
                   settings)
    assert said["ckpt"] == ("needs 16 GPUs for a worthwhile segment (1.0 h + grace); the "
                            "longest 16-GPU window in the next 24 h is 0.5 h (from Wed 20:00 "
                            "KST)")


def test_the_jobs_planned_ahead_take_the_window():
    queue = [unit("a", 16, 4, priority=1), unit("b", 16, 4, priority=1), unit("c", 16, 4)]
    said = reasons(profile((2, 0), (12, 16)), queue)
    assert said == {"c": "needs 16 GPUs for 4.0 h + grace without a stop; the jobs running or "
                         "planned ahead of it take the 16-GPU window of Wed 20:00 KST – Thu "
                         "08:00 KST, leaving at most 4.0 h (from Thu 04:00 KST)"}


def test_an_elastic_unit_says_the_fewest_gpus_it_may_run_on():
    said = reasons(profile((24, 4)), [unit("elastic", 32, 1, min_gpus=8)])
    assert said["elastic"].startswith("needs at least 8 GPUs; 4 free now and at most 4")


def test_a_policy_gate_keeps_it_out_when_its_window_opens():
    # the forecast turns older than max_forecast_age_s (26 h) before the window opens
    stale = profile((2, 0), (12, 16), made_at=T0 - timedelta(hours=25))
    said = reasons(stale, [unit("x", 16, 1)])
    assert said["x"] == ("needs 16 GPUs; the first 16-GPU window long enough opens at Wed "
                         "20:00 KST, but the policy admits nothing then: the forecast is 27.0 h "
                         "old; refresh it")


def test_the_gpus_reserved_for_a_unit_ahead_keep_it_out_of_its_window():
    # R (16 GPUs) waits for the running job's 8 and has them reserved from 19:00; S would run
    # 3 h on the 8 free now but into R's reservation; R then misses its deadline, too late
    # for S's 3 h before the pool closes at 21:30
    held = RunningJob("r", "t", 8, 0, T0 - timedelta(hours=1), False, 3600, None, None,
                      "training")
    queue = [unit("R", 16, 1, priority=1, deadline=T0 + timedelta(minutes=30)),
             unit("S", 8, 3)]
    said = reasons(profile((3.5, 16)), queue, running=[held])
    assert said["S"] == ("needs 8 GPUs; the first 8-GPU window long enough is open now, but "
                         "starting there would delay R, which has the GPUs reserved from Wed "
                         "19:00 KST")
    assert said["R"] == ("needs 16 GPUs; its deadline (Wed 18:30 KST) passes before the first "
                         "16-GPU window long enough opens at Wed 19:00 KST")


def test_a_reason_is_never_of_now_at_a_later_step():
    # the service's ramp at Thu 07:30 stops the jobs: steps with GPUs "left" that the policy
    # does not offer yet (the stopping jobs hold them through the grace period); the old
    # reason read "the first 16-GPU window left opens at Thu 07:20, but then: needs 16 GPUs;
    # 0 free now" (the jobs' windows are theirs to the last pass before their stop_by: what
    # they leave opens at 07:20, no longer 07:15)
    queue = [unit(f"j{i}", 8, 20, checkpointable=True) for i in range(3)] + [unit("x", 16, 2)]
    said = reasons(profile((13.5, 24), (10, 2)), queue)
    assert said["x"] == ("needs 16 GPUs for 2.0 h + grace without a stop; the jobs running or "
                         "planned ahead of it take the 16-GPU window of Wed 18:00 KST – Thu "
                         "07:30 KST, leaving at most 0.2 h (from Thu 07:20 KST)")


@pytest.mark.parametrize("sizes, gaps", [((4,), False), ((4, 8, 16), False),
                                         ((1, 2, 4, 8, 32), True)])
def test_the_plan_over_the_queues_head_is_the_plan_over_all_of_it(sizes, gaps):
    rng = np.random.default_rng(len(sizes))
    queue = [WaitingJob(f"u{i:04d}", f"team{i % 3}", int(rng.choice(sizes)),
                        float(rng.uniform(0.5, 6)) * 3600, bool(rng.integers(2)),
                        int(rng.integers(3)), T0 - timedelta(minutes=int(rng.integers(600))),
                        deadline=T0 + timedelta(hours=3) if i % 7 == 0 else None,
                        min_gpus=max(1, sizes[0] // 2) if i % 11 == 0 else None)
             for i in range(600)]
    free = profile((1, 6), (3, 20), (8, 64), (2, 30), (10, 8),
                   made_at=T0 - timedelta(hours=8) if gaps else T0)
    if gaps:  # a hole in the forecast, and from 18 h on a forecast older than 26 h
        free.free[40:50] = np.nan
    usage = {"team0": 30.0, "team1": 5.0}
    held = [RunningJob("r", "team2", 8, 1, T0 - timedelta(hours=1), True, 5 * 3600, None,
                       None, "training")]
    settings = PolicySettings(grace_s=600)
    head = plan_ahead(T0, free, queue, settings, team_usage=usage, running=held, head=8)
    full = plan_ahead(T0, free, queue, settings, team_usage=usage, running=held, head=None)
    assert head.runs == full.runs and len(head.runs) > 20
    assert [j.id for j, _ in head.waiting] == [j.id for j, _ in full.waiting]


def test_no_reason_of_a_random_night_quotes_a_later_moments_now():
    """Random small nights (a profile of five stretches, eight units, one running job): every
    unit that waits gets one reason of the night's kinds, never a policy's "free now" of a
    moment after the first (the contradiction the plan used to print)."""
    rng = np.random.default_rng(7)
    seen = 0
    for _ in range(150):
        free = profile(*[(float(rng.choice([0.5, 1, 2, 3])), int(rng.choice([0, 4, 8, 16, 24])))
                         for _ in range(5)])
        queue = [unit(f"j{i}", int(rng.choice([4, 8, 16])), float(rng.choice([0.5, 1, 2, 4, 6])),
                      priority=int(rng.integers(3)), checkpointable=bool(rng.integers(2)))
                 for i in range(8)]
        held = RunningJob("r", "t", int(rng.choice([4, 8])), 0, T0 - timedelta(hours=1), False,
                          float(rng.choice([1, 2, 3])) * 3600, None, None, "training")
        for reason in reasons(free, queue, running=[held]).values():
            seen += 1
            assert "then" not in reason and "but there" not in reason, reason
            assert "free now" not in reason or reason.endswith("-GPU window opens"), reason
            assert reason.count(";") <= 1, reason  # said once
    assert seen > 300


def test_a_deadline_days_ago_names_its_date_not_a_weekday_that_reads_as_the_coming_one():
    # the newcomer's friction: "its deadline has passed (Fri 09:00 KST)" on a Wednesday
    friday = T0 - timedelta(days=5, hours=9)  # Fri 2026-01-23 09:00 in Seoul
    said = reasons(profile((2, 0), (12, 16)), [unit("late", 8, 1, deadline=friday)])
    assert said["late"] == "its deadline has passed (Fri 2026-01-23 09:00 KST)"
