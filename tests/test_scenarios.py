"""The pool's joint uncertainty (``forecast.scenarios``): the pool's free GPUs at a confidence
from scenarios that keep the services' co-movement, against the sum of per-service quantiles."""

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from idlegpu.forecast.capacity import FREE, IN_USE, forecast_pool_usage
from idlegpu.forecast.scenarios import (
    joint_pool_usage,
    marginal_levels,
    service_correlation,
)
from idlegpu.scheduler.config import load_config

MU, SD, GPUS = 5.0, 2.0, 4


def settings(services=4, total=200):
    return load_config(data={
        "pool": {"total_gpus": total, "headroom_gpus": 0, "timezone": "UTC"},
        "query_templates": {"replicas": "r"},
        "services": [{"name": f"s{i}", "gpus_per_replica": GPUS, "min_replicas": 0,
                      "max_replicas": 40} for i in range(services)]})


def normal_forecast(services=4, steps=24, confidence=0.9, sd=SD):
    """Every service's replicas N(MU, sd) at every step, as forecast quantile columns."""
    ds = pd.date_range("2026-01-01", periods=steps, freq="1h", tz="UTC")
    levels = marginal_levels(confidence)
    return pd.DataFrame([{"unique_id": f"s{i}/replicas", "ds": t,
                          **{f"q{q:g}": MU + sd * norm.ppf(q) for q in levels}}
                         for i in range(services) for t in ds])


@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95])
def test_independent_services_are_promised_more_than_the_sum_and_it_is_calibrated(confidence):
    config = settings()
    forecast = normal_forecast(confidence=confidence)
    joint = joint_pool_usage(forecast, config, confidence, np.eye(4))[FREE]
    summed = forecast_pool_usage(forecast, config, confidence)[FREE]
    assert (joint >= summed).all()
    assert joint.iloc[0] - summed.iloc[0] > 10  # the sum plans all four at their bad hour
    # the pool the forecast describes: four independent services; the promise holds at the
    # confidence, not far above it (the sum's holds ~always)
    rng = np.random.default_rng(1)
    realised = 200 - GPUS * rng.normal(MU, SD, size=(200_000, 4)).sum(axis=1)
    assert (realised >= joint.iloc[0]).mean() == pytest.approx(confidence, abs=0.012)
    assert (realised >= summed.iloc[0]).mean() > confidence + 0.04


def test_services_in_lockstep_get_the_sum_of_their_quantiles():
    config = settings()
    forecast = normal_forecast()
    lockstep = joint_pool_usage(forecast, config, 0.9, np.ones((4, 4)))
    summed = forecast_pool_usage(forecast, config, 0.9)
    np.testing.assert_allclose(lockstep[IN_USE], summed[IN_USE], atol=0.5)
    assert (lockstep[IN_USE] <= summed[IN_USE] + 1e-9).all()  # never worse than lockstep


def test_correlation_lies_between_independence_and_lockstep():
    config = settings()
    forecast = normal_forecast()
    free = {r: joint_pool_usage(forecast, config, 0.9, np.full((4, 4), r) + (1 - r) * np.eye(4)
                                )[FREE].iloc[0] for r in (0.0, 0.5, 1.0)}
    assert free[0.0] > free[0.5] > free[1.0]


def test_a_step_where_a_service_is_unknown_stays_unknown_and_one_service_is_the_sum():
    config = settings()
    forecast = normal_forecast()
    hole = forecast["ds"] == forecast["ds"].iloc[3]
    forecast = forecast[~(hole & (forecast["unique_id"] == "s2/replicas"))]  # not forecast
    joint = joint_pool_usage(forecast, config, 0.9, np.eye(4))
    assert joint[FREE].isna().sum() == 1 and np.isnan(joint[FREE].iloc[3])
    one = settings(services=1)
    single = normal_forecast(services=1)
    pd.testing.assert_frame_equal(joint_pool_usage(single, one, 0.9, np.eye(1)),
                                  forecast_pool_usage(single, one, 0.9))


def test_a_service_planned_wider_lowers_the_promise():
    config = settings()
    forecast = normal_forecast(confidence=0.9)
    forecast = forecast.assign(**{"q0.99": MU + SD * norm.ppf(0.99)})
    plain = joint_pool_usage(forecast, config, 0.9, np.eye(4))[FREE].iloc[0]
    wider = joint_pool_usage(forecast, config, 0.9, np.eye(4), {"s0": 0.98})[FREE].iloc[0]
    assert wider < plain


def history(days=14, seed=3):
    """Three services at 5-minute steps: s0 and s1 follow one common noise, s2 its own."""
    rng = np.random.default_rng(seed)
    ds = pd.date_range(datetime(2026, 1, 1, tzinfo=UTC), periods=days * 288, freq="5min")
    common = np.cumsum(rng.normal(0, 1, len(ds))) * 0.3
    daily = 3 * np.sin(2 * np.pi * np.arange(len(ds)) / 288)
    series = {"s0": 10 + daily + common + rng.normal(0, 0.3, len(ds)),
              "s1": 8 + daily + common + rng.normal(0, 0.3, len(ds)),
              "s2": 6 + daily + np.cumsum(rng.normal(0, 1, len(ds))) * 0.3}
    return pd.DataFrame([{"unique_id": f"{name}/replicas", "ds": t, "y": round(float(v))}
                         for name, values in series.items() for t, v in zip(ds, values)])


def test_the_correlation_is_of_the_services_surprises_not_of_their_shared_daily_cycle():
    corr = service_correlation(history(), ["s0", "s1", "s2"])
    assert corr.shape == (3, 3) and np.allclose(np.diag(corr), 1.0)
    assert corr[0, 1] > 0.6  # one common surprise
    assert abs(corr[0, 2]) < 0.25 and abs(corr[1, 2]) < 0.25  # the same cycle is no surprise
    assert np.all(np.linalg.eigvalsh(corr) > -1e-9)


def test_too_little_history_is_independence_not_an_error():
    short = history(days=14)
    short = short[short["ds"] < short["ds"].min() + timedelta(minutes=30)]
    np.testing.assert_array_equal(service_correlation(short, ["s0", "s1", "s2"]), np.eye(3))
    flat = history().assign(y=4)
    np.testing.assert_array_equal(service_correlation(flat, ["s0", "s1"]), np.eye(2))
    assert service_correlation(history().iloc[:0], ["s0", "s1"]).shape == (2, 2)


def test_the_sample_pool_forecast_with_joint_uncertainty_never_promises_less():
    from pathlib import Path

    from idlegpu.forecast.sources import read_history
    from idlegpu.scheduler.replay import forecast_free

    repo = Path(__file__).resolve().parents[1]
    config = load_config(repo / "idlegpu.yaml")
    joint = config.model_copy(update={"admission": config.admission.model_copy(
        update={"pool_uncertainty": "joint"})})
    frame = read_history(repo / "data/sample/history.parquet")
    now = datetime(2025, 11, 5, 8, 0, tzinfo=UTC)
    free_sum, _ = forecast_free(frame, config, now, horizon=timedelta(hours=24))
    free_joint, forecast = forecast_free(frame, joint, now, horizon=timedelta(hours=24))
    assert {"q0.02", "q0.98"} <= set(forecast.columns)
    assert (free_joint >= free_sum - 1e-9).all()


def test_the_pools_median_free_gpus_come_beside_the_promise_and_are_calibrated():
    from idlegpu.forecast.scenarios import FREE_MEDIAN, pool_forecast_usage

    config = settings()
    joint = config.model_copy(update={"admission": config.admission.model_copy(
        update={"pool_uncertainty": "joint"})})
    forecast = normal_forecast(confidence=0.9)
    frame = pool_forecast_usage(forecast, joint, 0.9, pd.DataFrame(
        columns=["unique_id", "ds", "y"]))  # no history: the services taken as independent
    assert (frame[FREE_MEDIAN] >= frame[FREE]).all()
    # four independent N(5, 2) services of 4 GPUs: the pool's median use is 4 x 4 x 5 = 80
    assert frame[FREE_MEDIAN].iloc[0] == pytest.approx(200 - 80, abs=1.5)
    assert frame[FREE].iloc[0] < 200 - 80 - 10
    # added up (the sum method): the services' medians, the same 120 here
    by_sum = config.model_copy(update={"admission": config.admission.model_copy(
        update={"pool_uncertainty": "sum"})})
    summed = pool_forecast_usage(forecast, by_sum, 0.9, pd.DataFrame())
    assert summed[FREE_MEDIAN].iloc[0] == pytest.approx(120)
    assert (summed[FREE_MEDIAN] >= summed[FREE]).all()
