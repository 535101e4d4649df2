"""The live correction of the forecast (``policy.nowcast``) and what it changes in decide()."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from idlegpu.scheduler.config import AdmissionConfig
from idlegpu.scheduler.policy import decide, nowcast, policy_settings
from idlegpu.scheduler.types import Action, FreeProfile, PolicySettings, ServingSignals, WaitingJob

T0 = datetime(2018, 4, 11, 4, 0, tzinfo=UTC)  # 21:00 in Los Angeles
STEP = 300
H = 3600
SETTINGS = PolicySettings(grace_s=600, min_segment_s=1800, headroom_gpus=8, pool_gpus=80)


def signals(idle):
    """No job runs: the services hold what is not idle."""
    return ServingSignals(observed_at=T0, idle_gpus=idle, service_gpus=80 - idle)


def job(gpus=32, hours=4.0, ckpt=False):
    return WaitingJob(id="pretrain", team="a", gpus=gpus, runtime_s=hours * H,
                      checkpointable=ckpt, priority=0, submitted_at=T0 - timedelta(hours=2))


def profile(values):
    return FreeProfile(start=T0, step_s=STEP, free=np.asarray(values, dtype=float),
                       confidence=0.9, made_at=T0 - timedelta(hours=4))


def test_the_gap_halves_every_half_life_ahead_and_the_past_is_left_alone():
    free = np.array([10.0] * 4 + [20.0] * 100)
    out = nowcast(free, 4, live_free=36.0, step_s=STEP, half_life_s=H)
    assert list(out[:4]) == [10.0] * 4
    assert out[4] == pytest.approx(36.0)  # now: what is seen
    assert out[4 + 12] == pytest.approx(20.0 + 16.0 / 2)  # an hour ahead: half the gap
    assert out[4 + 24] == pytest.approx(20.0 + 16.0 / 4)
    assert out[-1] == pytest.approx(20.0, abs=0.1)  # far ahead: the forecast


def test_a_busier_pool_lowers_the_promise_and_holes_stay_holes():
    free = np.array([30.0, 30.0, np.nan, 30.0])
    out = nowcast(free, 0, live_free=10.0, step_s=STEP, half_life_s=H)
    assert out[0] == 10.0 and out[1] < 30.0 and np.isnan(out[2]) and out[3] < 30.0


def test_no_half_life_or_no_promise_now_changes_nothing():
    free = np.array([np.nan, 5.0, 5.0])
    assert nowcast(free, 1, 40.0, STEP, 0.0) is free
    assert nowcast(free, 0, 40.0, STEP, H) is free  # a hole now: nothing to correct
    assert nowcast(free, 3, 40.0, STEP, H) is free  # past the forecast


def test_a_quiet_evening_lets_a_big_job_start_that_the_forecast_alone_holds_back():
    # the forecast promised 24 free GPUs tonight; 40 are idle now (headroom 8 on top)
    prof = profile([24.0] * 12 * 12)
    alone = decide(T0, prof, [], [job(ckpt=True)], signals(48), {}, SETTINGS)
    corrected = decide(T0, prof, [], [job(ckpt=True)], signals(48),
                       {}, replace(SETTINGS, nowcast_half_life_s=6 * H))
    assert alone.decisions[0].action is Action.DEFER
    assert "needs 32 GPUs" in alone.decisions[0].reason
    # 24 + 16 * 2**(-4/6) = 34 GPUs still promised 4 h ahead: the 4-hour job fits whole
    (d,) = corrected.decisions
    assert d.action is Action.ADMIT and d.stop_by is None


def test_a_quiet_evening_does_not_lure_a_unit_that_cannot_checkpoint():
    """The lift is the present's, not the forecast's: a unit that would lose everything if
    the quiet ends waits for a window the forecast itself promises; a busier pool than
    forecast still holds it back (the correction lowers the promise for every unit)."""
    live = replace(SETTINGS, nowcast_half_life_s=6 * H)
    quiet = decide(T0, profile([24.0] * 12 * 12), [], [job(ckpt=False)], signals(48), {}, live)
    assert quiet.decisions[0].action is Action.DEFER
    promised = decide(T0, profile([40.0] * 12 * 12), [], [job(ckpt=False)], signals(48), {},
                      live)
    assert promised.decisions[0].action is Action.ADMIT
    busy = decide(T0, profile([40.0] * 12 * 12), [], [job(ckpt=False)], signals(20), {}, live)
    assert busy.decisions[0].action is Action.DEFER


def test_the_daemons_policy_settings_carry_the_configured_half_life():
    config = policy_settings(AdmissionConfig(), 8, 80)
    assert config.nowcast_half_life_s == 6 * H and config.pool_gpus == 80
    off = policy_settings(AdmissionConfig(nowcast_half_life_seconds=0), 8, 80)
    assert off.nowcast_half_life_s == 0


def test_a_job_stopping_does_not_read_as_a_busier_pool():
    # 32 GPUs of a job in its grace period are neither idle nor held by a running job: the
    # pool is as free as forecast, and the correction must not take them for the service
    prof = profile([40.0] * 12 * 12)
    stopping = ServingSignals(observed_at=T0, idle_gpus=8, service_gpus=32)
    corrected = decide(T0, prof, [], [job(gpus=16, hours=2)], stopping, {},
                       replace(SETTINGS, nowcast_half_life_s=6 * H))
    alone = decide(T0, prof, [], [job(gpus=16, hours=2)], stopping, {}, SETTINGS)
    assert corrected == alone
    (d,) = corrected.decisions  # its GPUs are back within the hour: reserved, not refused
    assert d.action is Action.DEFER and d.start_at is not None
