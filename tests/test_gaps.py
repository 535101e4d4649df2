"""A metrics gap in one service's replicas: ``simulate``, ``plan`` and a daemon pass go on
without a crash and admit nothing blind.

The sample history with ``chat/replicas`` cut out for 26 hours from 23:00 on Monday
2025-10-20 (Seoul), over the 17:00 refit of Tuesday: jobs run when it starts, the evening
forecast is fitted on a series that stopped 18 hours before. A 60-hour gap is longer than
the forecast can bridge and leaves holes (NaN) in the free-GPU profile.
"""

from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_controller import REQUEST, MemoryCluster

from idlegpu.forecast.capacity import FREE, pool_usage
from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.daemon import ForecastProvider
from idlegpu.scheduler.policy import decide, policy_settings
from idlegpu.scheduler.ports import JobPhase
from idlegpu.scheduler.replay import HistorySignals, forecast_profile
from idlegpu.scheduler.runtime import RuntimeEstimator, load_runs
from idlegpu.scheduler.simulate import POLICIES, forecast_profiles_for, simulate, trace_jobs
from idlegpu.scheduler.specs import expand_units, load_trace, validate_request
from idlegpu.scheduler.types import Action, ServingSignals

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
TZ = "Asia/Seoul"


def kst(text: str) -> pd.Timestamp:
    return pd.Timestamp(text, tz=TZ).tz_convert("UTC")


GAP_START = kst("2025-10-20 23:00")
GAP_END = GAP_START + pd.Timedelta(hours=26)  # Wednesday 01:00
REFIT = kst("2025-10-21 17:00")  # inside the gap
SIM_START = kst("2025-10-15 00:00")
SIM_END = SIM_START + pd.Timedelta(days=10)


def cut(history: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp) -> pd.DataFrame:
    drop = ((history["unique_id"] == "chat/replicas") & (history["ds"] >= start)
            & (history["ds"] < end))
    return history[~drop].reset_index(drop=True)


@pytest.fixture(scope="module")
def settings():
    return load_config(REPO / "idlegpu.yaml")


@pytest.fixture(scope="module")
def sample():
    return read_history(SAMPLE / "history.parquet")


@pytest.fixture(scope="module")
def gapped(sample):
    return cut(sample, GAP_START, GAP_END)


@pytest.fixture(scope="module")
def simulated(gapped, settings):
    estimator = RuntimeEstimator.from_config(load_runs(SAMPLE / "runs.csv"), settings.admission)
    jobs = trace_jobs(load_trace(SAMPLE / "jobs.yaml", settings.admission),
                      lambda unit: estimator.estimate(unit).seconds)
    return {policy: simulate(gapped, settings, jobs, policy, start=SIM_START.to_pydatetime(),
                             end=SIM_END.to_pydatetime())
            for policy in POLICIES}


def blind_limit(settings) -> pd.Timestamp:
    """The latest a job may hold GPUs into the gap: signals missing for the configured time,
    then its grace period, within a step."""
    admission = settings.admission
    return GAP_START + pd.Timedelta(seconds=admission.missing_signals_preempt_after_seconds
                                    + admission.grace_seconds + 300)


# ----------------------------------------------------------------------------- simulate


def test_simulate_goes_through_the_gap_and_admits_nothing_in_it(simulated, settings):
    ran_into = 0
    for policy, result in simulated.items():
        runs = result.runs
        start = pd.to_datetime(runs["start"], utc=True)
        end = pd.to_datetime(runs["end"], utc=True)
        assert not ((start >= GAP_START) & (start < GAP_END)).any(), policy
        into = (start < GAP_START) & (end > GAP_START)
        # whatever ran into the gap stopped once the signals had been missing long enough
        assert (end[into] <= blind_limit(settings)).all(), policy
        ran_into += int(into.sum())
        assert result.metrics["useful_gpu_hours"] > 0, policy
    assert ran_into > 0  # the gap starts while jobs run


def test_gap_hours_are_unobserved_never_idle(simulated, sample, settings):
    usage = pool_usage(sample, settings)
    period = usage.loc[(usage.index >= SIM_START) & (usage.index < SIM_END), FREE]
    in_gap = (period.index >= GAP_START) & (period.index < GAP_END)
    expected_idle = period[~in_gap].sum() * 300 / 3600
    for policy, result in simulated.items():
        m = result.metrics
        assert m["unobserved_hours"] == pytest.approx(26.0), policy
        assert m["idle_gpu_hours"] == pytest.approx(expected_idle), policy
        assert m["useful_gpu_hours"] <= m["physical_limit_gpu_hours"] + 1e-6, policy


def test_the_forecast_across_the_gap_has_no_hole_where_it_is_used(gapped, settings):
    # chat's replicas stopped 18 h before the refit: forecast that much further, it still
    # covers the whole horizon
    profile = forecast_profile(gapped, settings, REFIT.to_pydatetime())
    assert profile.start == REFIT.to_pydatetime()
    assert not np.isnan(profile.free).any()
    assert len(profile.free) >= 48 * 12


# ----------------------------------------------------------------------------- plan


@pytest.mark.parametrize("now", ["2025-10-21T17:00:00+09:00", "2025-10-21T23:30:00+09:00"])
def test_plan_inside_the_gap(tmp_path, cli, gapped, now):
    history = tmp_path / "history.parquet"
    gapped.to_parquet(history)
    code, out, err = cli([
        "plan", "--history", str(history), "--config", str(REPO / "idlegpu.yaml"),
        "--jobs", str(SAMPLE / "jobs.yaml"), "--runs", str(SAMPLE / "runs.csv"),
        "--now", now, "--out", str(tmp_path / "plan"),
    ])
    assert code == 0, err
    assert "Traceback" not in err and "Jobs that start" in out
    plan = pd.read_csv(tmp_path / "plan" / "plan.csv")
    starting = plan[plan["outcome"] != "waits"]  # the waiting units are listed without a start
    assert plan.loc[plan["outcome"] == "waits", "start"].isna().all()
    if len(starting):
        assert (pd.to_datetime(starting["start"], utc=True) >= pd.Timestamp(now)).all()


# ----------------------------------------------------------------------------- daemon


@pytest.fixture
def daemon(tmp_path, gapped, settings):
    """A controller on the replayed gapped history: its signals and its forecast provider."""
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    request = validate_request(REQUEST)
    store.submit(request.name, request.team, request.kind, REQUEST, expand_units(request),
                 (GAP_START - pd.Timedelta(hours=3)).to_pydatetime())
    cluster = MemoryCluster()
    provider = ForecastProvider(settings, gapped)
    controller = Controller(store, cluster, HistorySignals(gapped, settings), provider,
                            lambda spec: spec.runtime_estimate_s * 1.3,
                            policy_settings(settings.admission, settings.pool.headroom_gpus))
    yield store, cluster, provider, controller
    store.close()


def at(ts: pd.Timestamp, minutes: float = 0):
    return (ts + pd.Timedelta(minutes=minutes)).to_pydatetime()


def test_a_daemon_pass_stops_every_job_in_the_gap_and_admits_nothing_blind(daemon):
    store, cluster, provider, controller = daemon
    provider.refresh(at(kst("2025-10-20 17:00")))
    report = controller.reconcile_once(at(GAP_START, -60))  # Monday 22:00: idle night
    assert len(report.created) == 2
    for name in cluster.created:
        cluster.set_phase(name, JobPhase.RUNNING, at(GAP_START, -59))
    controller.reconcile_once(at(GAP_START, -55))
    controller.reconcile_once(at(GAP_START, -5))  # the last good reading
    report = controller.reconcile_once(at(GAP_START, 5))
    assert report.signals.observed_at is None and not report.stopped  # missing 10 min
    report = controller.reconcile_once(at(GAP_START, 20))
    assert len(report.stopped) == 2  # missing for more than 15 min: every job stops
    assert all(d.action is Action.PREEMPT for d in report.plan.decisions)

    provider.refresh(at(REFIT))  # the evening refit, inside the gap: no crash
    for minutes in (0, 1, 180):
        report = controller.reconcile_once(at(REFIT, minutes))
        assert not report.created and not report.plan.of(Action.ADMIT)
        assert all("not admitting blind" in d.reason for d in report.plan.of(Action.DEFER))
    assert [row.state.value for row in store.queue()] == ["queued", "queued"]  # released
    # the signals are back after the gap: admission resumes on the refit's forecast
    report = controller.reconcile_once(at(GAP_END, 10))
    assert report.signals.observed_at is not None
    assert not any("blind" in d.reason for d in report.plan.decisions)


# ----------------------------------------------------------------------------- holes

LONG_START = kst("2025-10-18 05:00")
LONG_END = kst("2025-10-20 17:00")  # 60 h: chat last seen 60 h before the refit


@pytest.fixture(scope="module")
def holey(sample):
    return cut(sample, LONG_START, LONG_END)


def test_a_gap_longer_than_the_forecast_can_bridge_leaves_holes(holey, settings):
    profile = forecast_profile(holey, settings, LONG_END.to_pydatetime())
    hole = np.flatnonzero(np.isnan(profile.free))
    assert hole.size and not np.isnan(profile.free[: hole[0]]).any()
    # chat is forecast from its last sample for 48 h + 26 h (no forecast is trusted older)
    assert profile.time_at(int(hole[0])) == (LONG_START + pd.Timedelta(hours=74)).to_pydatetime()


def test_decide_admits_nothing_into_a_hole_and_stops_nothing_for_it(holey, settings):
    profile = forecast_profile(holey, settings, LONG_END.to_pydatetime())
    hole_at = profile.time_at(int(np.flatnonzero(np.isnan(profile.free))[0]))
    config = policy_settings(settings.admission, settings.pool.headroom_gpus)
    estimator = RuntimeEstimator.from_config(load_runs(SAMPLE / "runs.csv"), settings.admission)
    entries = [e for e in load_trace(SAMPLE / "jobs.yaml", settings.admission)
               if e.submit_at <= LONG_END]
    queue = [u.as_waiting() for u in trace_jobs(entries, lambda u: estimator.estimate(u).seconds)
             if not u.depends_on]
    signals = HistorySignals(holey, settings)
    for now in pd.date_range(LONG_END, hole_at + pd.Timedelta(hours=1), freq="20min"):
        now = now.to_pydatetime()
        live = signals.read(now)
        plan = decide(now, profile, [], queue, live, {}, config)
        for d in plan.of(Action.ADMIT):
            job = next(j for j in queue if j.id == d.job_id)
            ends = d.stop_by or now + timedelta(seconds=job.runtime_s)
            assert ends + timedelta(seconds=config.grace_s) <= hole_at, (now, d)
    # a running job right before the hole: nothing stops it for the hole (it is no demand)
    from idlegpu.scheduler.types import RunningJob

    running = RunningJob("r", "t", 8, 0, at(LONG_END), True, 6 * 3600,
                         last_checkpoint_at=at(LONG_END))
    before = hole_at - timedelta(minutes=5)
    calm = ServingSignals(observed_at=before, idle_gpus=80)
    plan = decide(before, profile, [running], [], calm, {}, config)
    free_before = profile.free[profile.index_at(before)]
    if free_before >= 8:
        assert not plan.of(Action.PREEMPT)


def test_simulate_with_holes_in_its_forecasts(holey, settings):
    estimator = RuntimeEstimator.from_config(load_runs(SAMPLE / "runs.csv"), settings.admission)
    jobs = trace_jobs(load_trace(SAMPLE / "jobs.yaml", settings.admission),
                      lambda unit: estimator.estimate(unit).seconds)
    index = pd.date_range(SIM_START, SIM_END, freq="5min", inclusive="left")
    profiles = forecast_profiles_for(holey, settings, index, 17, pd.Timedelta(hours=48))
    assert any(np.isnan(p.free).any() for p in profiles.values())
    result = simulate(holey, settings, jobs, "forecast", start=SIM_START.to_pydatetime(),
                      end=SIM_END.to_pydatetime(), forecast_profiles=profiles)
    start = pd.to_datetime(result.runs["start"], utc=True)
    assert not ((start >= LONG_START) & (start < LONG_END)).any()
    assert result.metrics["unobserved_hours"] == pytest.approx(60.0)


def test_a_daemon_pass_on_a_forecast_with_holes(tmp_path, holey, settings):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    request = validate_request(REQUEST)
    store.submit(request.name, request.team, request.kind, REQUEST, expand_units(request),
                 at(LONG_END, -60))
    cluster = MemoryCluster()
    provider = ForecastProvider(settings, holey)
    config = policy_settings(settings.admission, settings.pool.headroom_gpus)
    controller = Controller(store, cluster, HistorySignals(holey, settings), provider,
                            lambda spec: spec.runtime_estimate_s * 1.3, config)
    provider.refresh(at(LONG_END))
    hole_at = provider.profile.time_at(int(np.flatnonzero(np.isnan(provider.profile.free))[0]))
    first = pd.Timestamp(hole_at) - pd.Timedelta(hours=3)
    report = controller.reconcile_once(first.to_pydatetime())
    for d in report.plan.of(Action.ADMIT):  # 2.6 h + grace: ends before the hole, or waits
        ends = d.stop_by or first.to_pydatetime() + timedelta(seconds=2 * 3600 * 1.3)
        assert ends + timedelta(seconds=config.grace_s) <= hole_at
    for name in cluster.created:
        cluster.set_phase(name, JobPhase.RUNNING, first.to_pydatetime())
    for minutes in (-10, -5, 0, 30):  # up to the hole and into it: no crash, no admission in it
        report = controller.reconcile_once(hole_at + timedelta(minutes=minutes))
        if minutes >= 0:
            assert not report.plan.of(Action.ADMIT)
    store.close()

