"""Backtests: cutoffs, metrics by hand, and no look-ahead."""

import numpy as np
import pandas as pd
import pytest
from forecast_data import TZ, replica_history

from idlegpu.forecast.backtest import (
    CALIBRATED,
    OVER,
    UNDER,
    backtest,
    daily_cutoffs,
    pinball,
    score,
    series_calibration,
    verdict,
    window_quality,
)
from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.models import make_model


def test_daily_cutoffs_are_local_evenings_with_an_observed_horizon():
    history = replica_history(days=20)
    cutoffs = daily_cutoffs(history, timezone=TZ, hour=18, days=5, horizon=pd.Timedelta("24h"))
    assert len(cutoffs) == 5
    assert all(c.tz_convert(TZ).hour == 18 for c in cutoffs)
    assert cutoffs[-1] + pd.Timedelta("24h") <= history["ds"].max()
    assert all(b - a == pd.Timedelta(days=1) for a, b in zip(cutoffs, cutoffs[1:]))
    with pytest.raises(HistoryError, match="too short"):
        daily_cutoffs(replica_history(days=1), timezone=TZ, horizon=pd.Timedelta(days=7))


def test_pinball_and_scores_by_hand():
    assert pinball(np.array([10.0]), np.array([8.0]), 0.9) == pytest.approx(1.8)
    assert pinball(np.array([8.0]), np.array([10.0]), 0.9) == pytest.approx(0.2)
    forecasts = pd.DataFrame(
        {"model": "m", "y": [1.0, 2.0, 3.0, 4.0], "q0.5": [1.0, 3.0, 3.0, 3.0],
         "q0.9": [2.0, 3.0, 3.0, 5.0]}
    )
    table = score(forecasts, [0.5, 0.9])
    assert table.loc["m", "mae"] == pytest.approx(0.5)
    assert table.loc["m", "coverage_0.9"] == 1.0
    assert table.loc["m", "strict_coverage_0.9"] == 0.75  # y == q at the third row
    assert table.loc["m", "coverage_0.5"] == 0.75
    assert table.loc["m", "pinball_0.5"] == pytest.approx((0 + 0.5 + 0 + 0.5) / 4)


def test_per_series_verdicts_on_integer_ties():
    # a: ties at q (strict 0.5 <= 0.9 <= plain 1.0): calibrated; b: always strictly below
    # (strict 1.0 > 0.9): over-covers; c: above q half the time: under-covers
    n = 10
    forecasts = pd.DataFrame({
        "model": "m", "unique_id": np.repeat(["a", "b", "c"], n),
        "y": np.r_[np.tile([3.0, 2.0], n // 2), np.full(n, 1.0), np.tile([5.0, 1.0], n // 2)],
        "q0.9": np.r_[np.full(n, 3.0), np.full(n, 4.0), np.full(n, 3.0)],
    })
    table = series_calibration(forecasts, [0.9]).set_index("unique_id")
    assert table["verdict_0.9"].to_dict() == {"a": CALIBRATED, "b": OVER, "c": UNDER}
    assert table.loc["a", "strict_coverage_0.9"] == 0.5 and table.loc["a", "coverage_0.9"] == 1
    assert table.loc["c", "coverage_0.9"] == 0.5 and (table["points"] == n).all()
    assert verdict(0.89, 0.89, 0.9) == CALIBRATED  # within the tolerance of a continuous one
    assert verdict(0.85, 0.85, 0.9) == UNDER and verdict(0.95, 0.95, 0.9) == OVER


class Spy:
    """A forecaster that records the newest timestamp it was shown."""

    name = "spy"
    seen: list = []

    def fit(self, history):
        Spy.seen.append(history["ds"].max())
        self.model = make_model("seasonal_naive").fit(history)
        return self

    def predict(self, horizon, quantiles):
        return self.model.predict(horizon, quantiles).assign(model=self.name)


def test_a_cutoff_never_sees_its_future():
    history = replica_history(days=21)
    cutoffs = daily_cutoffs(history, timezone=TZ, days=4)
    Spy.seen = []
    run = backtest(history, {"spy": Spy}, cutoffs=cutoffs, horizon=pd.Timedelta("24h"),
                   quantiles=[0.5])
    assert Spy.seen == cutoffs  # exactly the past, up to and including the cutoff
    first = run.forecasts.groupby("cutoff")["ds"].min()
    assert (first.index + pd.Timedelta("15min") == first.to_numpy()).all()


@pytest.mark.parametrize("name", ["auto", "seasonal_naive"])
def test_changing_the_future_does_not_change_a_forecast(name):
    history = replica_history(days=21, noise=0.5)
    cutoffs = daily_cutoffs(history, timezone=TZ, days=2)
    poisoned = history.copy()
    after = poisoned["ds"] > cutoffs[0]
    poisoned.loc[after, "y"] = 50.0  # a leak would drag the first cutoff's forecast up
    factory = {name: lambda: make_model(name, timezone=TZ)}
    clean = backtest(history, factory, cutoffs=cutoffs[:1], horizon=pd.Timedelta("1D"), quantiles=[0.5, 0.9])
    dirty = backtest(poisoned, factory, cutoffs=cutoffs[:1], horizon=pd.Timedelta("1D"), quantiles=[0.5, 0.9])
    pd.testing.assert_frame_equal(
        clean.forecasts.drop(columns="y"), dirty.forecasts.drop(columns="y")
    )
    assert (dirty.forecasts["y"] == 50).all()


def test_window_quality_in_gpu_hours():
    from idlegpu.forecast.config import load_config

    settings = load_config(
        data={
            "pool": {"total_gpus": 12, "headroom_gpus": 0},
            "query_templates": {"replicas": "r"},
            "services": [{"name": "a", "gpus_per_replica": 4, "min_replicas": 0,
                          "max_replicas": 3}],
        }
    )
    ds = pd.date_range("2026-01-01", periods=4, freq="1h", tz="UTC")
    history = pd.DataFrame({"unique_id": "a/replicas", "ds": ds, "y": [1.0, 1.0, 2.0, 3.0]})
    forecasts = pd.DataFrame(
        {"unique_id": "a/replicas", "ds": ds[1:], "model": "m", "cutoff": ds[0],
         "q0.9": [2.0, 1.0, 3.0]}
    )
    table = window_quality(forecasts, history, settings, 0.9)
    # free promised 4, 8, 0; really free 8, 4, 0 -> kept 4 + 4; promised 12; available 12
    assert table.loc["m", "promised_gpu_hours"] == 12
    assert table.loc["m", "kept_gpu_hours"] == 8
    assert table.loc["m", "precision"] == pytest.approx(8 / 12)
    assert table.loc["m", "recall"] == pytest.approx(8 / 12)
