"""``simulate.fits``: the forecast policy's evening refits made ahead, a group of services per
worker process (real forkserver workers), give exactly the profiles of refitting in place."""

from datetime import timedelta
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.models import model_for
from idlegpu.forecast.schema import REPLICAS, metric_rows
from idlegpu.forecast.sources import read_history
from idlegpu.scheduler.config import load_config
from idlegpu.scheduler.refresh import Refresher
from idlegpu.scheduler.simulate import (
    FRONTIER_METRICS,
    SimJob,
    forecast_profiles_for,
    simulate,
    simulate_policies,
    sweep,
)
from idlegpu.scheduler.simulate.fits import (
    BACKFILL,
    REFRESH,
    MadeForecasts,
    fit_group,
    fit_plan,
    groups_of,
)
from idlegpu.scheduler.simulate.profiles import refresh_moments

REPO = Path(__file__).resolve().parents[1]
START = pd.Timestamp("2025-10-15T00:00:00+09:00").tz_convert("UTC")


def sample(days: int = 4, **admission):
    settings = load_config(REPO / "idlegpu.yaml")
    if admission:
        settings = settings.model_copy(update={
            "admission": settings.admission.model_copy(update=admission)})
    history = read_history(REPO / "data" / "sample" / "history.parquet")
    index = pd.date_range(START, START + pd.Timedelta(days=days), freq="5min", inclusive="left")
    return settings, history, index


def small_pool():
    """Two services of 4-GPU replicas in a 40-GPU pool, 14 days: one busy by day, one in the
    evening (a group each); the simulated window, 3 days from its day 9; two units."""
    settings = load_config(data={
        "pool": {"total_gpus": 40, "headroom_gpus": 0, "timezone": "UTC"},
        "query_templates": {"replicas": "r"},
        "services": [{"name": n, "gpus_per_replica": 4, "min_replicas": 1,
                      "max_replicas": 6} for n in ("day", "evening")],
        "admission": {"grace_seconds": 900}})
    steps = pd.date_range("2025-03-03", periods=14 * 96, freq="15min", tz="UTC")
    hour = steps.hour.to_numpy()
    shapes = {"day": np.where((hour >= 8) & (hour < 20), 5.0, 1.0),
              "evening": np.where((hour >= 16) & (hour < 23), 4.0, 1.0)}
    history = pd.concat([pd.DataFrame({"unique_id": f"{n}/replicas", "ds": steps, "y": y})
                         for n, y in shapes.items()], ignore_index=True)
    start = steps[0] + pd.Timedelta(days=9)
    jobs = [SimJob(id=name, team="t", kind="x", gpus=gpus, work_s=hours * 3600,
                   estimate_s=hours * 3600, submit_at=start.to_pydatetime(),
                   checkpointable=ckpt, checkpoint_interval_s=3600)
            for name, gpus, hours, ckpt in (("train", 16, 20, True), ("eval", 8, 3, False))]
    index = pd.date_range(start, start + pd.Timedelta(days=3), freq="15min", inclusive="left")
    return settings, history, index, jobs


@lru_cache(maxsize=4)
def own_profiles():
    """The small pool's profiles refitted in this process (shared by the tests that compare)."""
    settings, history, index, _ = small_pool()
    return forecast_profiles_for(history, settings, index, 17, timedelta(hours=48))


def same_profiles(a, b) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k].free, b[k].free, equal_nan=True)
        and np.array_equal(a[k].likely, b[k].likely, equal_nan=True)
        and a[k].start == b[k].start for k in a)


def test_refits_in_two_worker_processes_give_the_profiles_of_one_and_report_progress():
    settings, history, index = sample()
    assert len(settings.services) == 4  # two groups of two services
    serial = forecast_profiles_for(history, settings, index, 17, timedelta(hours=48))
    seen: list[tuple[int, int]] = []
    parallel = forecast_profiles_for(history, settings, index, 17, timedelta(hours=48),
                                     workers=2, on_refresh=lambda k, n: seen.append((k, n)))
    assert len(serial) == 5 and same_profiles(serial, parallel)
    # the refits (the backfill's week and each refresh), then each evening's pool arithmetic
    assert seen[-1][0] == seen[-1][1] == 2 * (7 + 5) - 7
    assert [k for k, _ in seen] == sorted(k for k, _ in seen)


def test_the_plan_foresees_every_refit_the_refreshes_ask_for():
    # ``sum``: the wider quantile is a level of its own, so each refresh is forecast twice
    settings, history, _ = sample(pool_uncertainty="sum")
    replicas = metric_rows(history, REPLICAS)
    moments = refresh_moments(
        pd.date_range(START, START + pd.Timedelta(days=3), freq="5min", inclusive="left"),
        settings, 17)
    plan = fit_plan(replicas, settings, Refresher(settings, refresh_hour=17), moments)
    assert [r.chain for r in plan] == [BACKFILL] * 7 + [REFRESH] * len(moments)
    assert all(len(r.levels) == 2 for r in plan if r.chain == REFRESH)
    assert plan[-1].levels[1] == (0.5, settings.admission.confidence, 0.98)
    made = MadeForecasts(plan, [fit_group(g, settings, "auto", plan)
                                for g in groups_of(replicas, 3)], "auto", settings)
    refresher = Refresher(settings, refresh_hour=17, forecasts=made)
    for moment in moments:
        refresher.refresh(replicas, moment)
    assert made.unforeseen == 0
    # the first refit (a cache still empty): either set of levels is what a fit here gives
    first = plan[0]
    past = replicas[replicas["ds"] < pd.Timestamp(first.moment)]
    for levels in first.levels:
        alone = model_for("auto", settings).fit(past).predict(first.horizon, list(levels))
        pd.testing.assert_frame_equal(made(past, first.moment, first.horizon, list(levels)),
                                      alone)
    # one the plan did not foresee is fitted here
    unforeseen = made(past, first.moment, first.horizon, [0.5, 0.75])
    assert made.unforeseen == 1 and "q0.75" in unforeseen.columns


def two_services(samples_a: int, samples_b: int):
    settings = load_config(data={
        "pool": {"total_gpus": 40, "headroom_gpus": 0, "timezone": "UTC"},
        "query_templates": {"replicas": "r"},
        "services": [{"name": n, "gpus_per_replica": 4, "min_replicas": 1,
                      "max_replicas": 9} for n in ("a", "b")]})
    days = pd.date_range("2025-01-01", periods=6 * 96, freq="15min", tz="UTC")
    rows = [pd.DataFrame({"unique_id": f"{n}/replicas", "ds": days[-count:] if count else
                          days[:0], "y": 3.0}) for n, count in (("a", samples_a),
                                                                ("b", samples_b))]
    return settings, pd.concat(rows, ignore_index=True), days[-1] + pd.Timedelta(minutes=15)


@pytest.mark.parametrize("samples_a,samples_b,names", [(1, 1, "a"), (500, 1, "b"),
                                                       (1, 500, "a")])
def test_a_refit_that_fails_raises_what_refitting_them_all_in_place_raises(samples_a,
                                                                           samples_b, names):
    settings, replicas, now = two_services(samples_a, samples_b)
    plan = fit_plan(replicas, settings, Refresher(settings, refresh_hour=17),
                    [now.to_pydatetime()])[-1:]
    with pytest.raises(HistoryError) as in_place:
        model_for("auto", settings).fit(replicas)
    made = MadeForecasts(plan, [fit_group(g, settings, "auto", plan)
                                for g in groups_of(replicas, 2)], "auto", settings)
    with pytest.raises(HistoryError) as ahead:
        made(replicas, plan[0].moment, plan[0].horizon, list(plan[0].levels[0]))
    assert str(ahead.value) == str(in_place.value)
    assert f"series {names}/replicas has fewer than two samples" in str(ahead.value)


def test_a_group_without_samples_yet_adds_nothing():
    settings, replicas, now = two_services(500, 0)
    plan = fit_plan(replicas, settings, Refresher(settings, refresh_hour=17),
                    [now.to_pydatetime()])[-1:]
    groups = [replicas[replicas["unique_id"] == "a/replicas"], replicas.iloc[:0]]
    made = MadeForecasts(plan, [fit_group(g, settings, "auto", plan) for g in groups], "auto",
                         settings)
    levels = list(plan[0].levels[0])
    pd.testing.assert_frame_equal(
        made(replicas, plan[0].moment, plan[0].horizon, levels),
        model_for("auto", settings).fit(replicas).predict(plan[0].horizon, levels))
    assert made.unforeseen == 0


def test_the_policies_in_two_processes_with_the_refits_ahead_give_what_one_process_gives():
    settings, history, index, jobs = small_pool()
    window = {"start": index[0].to_pydatetime(), "end": index[-1].to_pydatetime()}
    names = ["reactive", "forecast"]
    serial = simulate_policies(history, settings, jobs, names, workers=1, **window)
    seen: list[tuple] = []
    parallel = simulate_policies(history, settings, jobs, names, workers=2,
                                 on_progress=lambda *a: seen.append(a), **window)
    for name in names:
        assert parallel[name].metrics == serial[name].metrics, name
        pd.testing.assert_frame_equal(parallel[name].runs, serial[name].runs)
    assert serial["forecast"].metrics["useful_gpu_hours"] > 0
    refreshes = [(done, total) for name, what, done, total in seen
                 if (name, what) == ("forecast", "refreshes")]
    assert refreshes[-1][0] == refreshes[-1][1] == 2 * (7 + 4) - 7  # 7 backfilled, 4 refreshes
    assert len(own_profiles()) == 4


def test_the_sweep_makes_the_refits_once_and_gives_the_frontier_of_refitting_at_each_point():
    settings, history, index, jobs = small_pool()
    window = {"start": index[0].to_pydatetime(), "end": index[-1].to_pydatetime()}
    confidences = [0.6, 0.9]  # 0.6: a level of its own, forecast only for its point
    seen: list[tuple[int, int]] = []
    frontier = sweep(history, settings, jobs, confidences, workers=2, references={},
                     on_point=lambda n, total: seen.append((n, total)), **window)
    for row, confidence in zip(frontier.itertuples(), confidences, strict=True):
        admission = settings.admission.model_copy(update={"confidence": confidence})
        alone = simulate(history, settings.model_copy(update={"admission": admission}), jobs,
                         "forecast", **window).metrics
        assert row.confidence == confidence
        assert {k: getattr(row, k) for k in FRONTIER_METRICS} == {
            k: alone[k] for k in FRONTIER_METRICS}
    assert (frontier["useful_gpu_hours"] > 0).all() and len(frontier) == 2
    assert sorted(seen) == [(1, 2), (2, 2)]


def test_a_refit_asked_for_on_other_replica_samples_than_the_plan_s_is_made_here():
    settings, replicas, now = two_services(500, 500)
    plan = fit_plan(replicas, settings, Refresher(settings, refresh_hour=17),
                    [now.to_pydatetime()])[-1:]
    made = MadeForecasts(plan, [fit_group(g, settings, "auto", plan)
                                for g in groups_of(replicas, 2)], "auto", settings)
    other = replicas.assign(y=np.where(replicas["unique_id"] == "a/replicas", 7.0, 3.0)).iloc[1:]
    levels = list(plan[0].levels[0])
    got = made(other, plan[0].moment, plan[0].horizon, levels)
    assert made.unforeseen == 1
    pd.testing.assert_frame_equal(
        got, model_for("auto", settings).fit(other).predict(plan[0].horizon, levels))


@pytest.mark.parametrize("workers", [1, 2])
def test_the_caller_gets_the_profiles_the_forecast_policy_ran_on(workers):
    settings, history, index, _ = small_pool()
    window = {"start": index[0].to_pydatetime(), "end": index[-1].to_pydatetime()}
    got: list[dict] = []
    simulate_policies(history, settings, [], ["night", "forecast"], workers=workers,
                      on_profiles=got.append, **window)
    assert len(got) == 1
    own = own_profiles()
    assert same_profiles(got[0], own)
    given: list[dict] = []
    simulate_policies(history, settings, [], ["forecast"], workers=workers,
                      on_profiles=given.append, forecast_profiles=own, **window)
    assert given == []  # given, not made: nothing to keep
