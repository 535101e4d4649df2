"""Our own forecaster and the seasonal-naive reference: patterns, quantiles, calibration, bad input."""

import numpy as np
import pandas as pd
import pytest
from forecast_data import TZ, continuous_history, daily_pattern, replica_history

from idlegpu.forecast.config import load_config
from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.models import make_model, model_for, quantile_columns
from idlegpu.forecast.models.auto import AutoForecaster

QS = [0.1, 0.5, 0.9]


def future_truth(forecast):
    return daily_pattern(pd.DatetimeIndex(forecast["ds"]).tz_convert(TZ))


@pytest.mark.parametrize("name", ["auto", "seasonal_naive"])
def test_recovers_a_known_daily_and_weekly_pattern(name):
    history = replica_history(days=28)
    model = make_model(name, timezone=TZ, holiday_country="KR").fit(history)
    forecast = model.predict("7d", QS)
    served = ["served_by", "skill"] if name == "auto" else []  # auto names its choice
    assert list(forecast.columns) == ["unique_id", "ds", "model", "q0.1", "q0.5", "q0.9", *served]
    assert (forecast["model"] == name).all()
    step = pd.Timedelta("15min")
    assert forecast["ds"].iloc[0] == history["ds"].max() + step
    assert len(forecast) == 7 * 96
    assert (forecast["ds"].diff().dropna() == step).all()
    np.testing.assert_allclose(forecast["q0.5"], future_truth(forecast), atol=0.51)


def test_auto_follows_holidays():
    # 2025-12-25 (Thursday) is a Korean holiday: it should look like a Sunday, not a Thursday
    history = replica_history(days=38, start="2025-11-17")  # ends Wed 2025-12-24 24:00
    forecast = make_model("auto", timezone=TZ, holiday_country="KR").fit(history).predict("1d", QS)
    local = pd.DatetimeIndex(forecast["ds"]).tz_convert(TZ)
    assert (local.date == pd.Timestamp("2025-12-25").date()).all()
    noon = forecast[local.hour == 12]
    assert (noon["q0.5"] == 4).all()  # weekend peak, not the weekday's 8
    without = make_model("auto", timezone=TZ, holiday_country=None).fit(history).predict("1d", QS)
    assert (without[local.hour == 12]["q0.5"] == 8).all()


def test_quantiles_are_monotone_integer_and_bounded():
    history = replica_history(days=28, noise=0.8)
    model = AutoForecaster(timezone=TZ, bounds={"svc/replicas": (2, 9)}).fit(history)
    forecast = model.predict("3d", [0.05, 0.5, 0.9, 0.99])
    values = forecast[quantile_columns([0.05, 0.5, 0.9, 0.99])].to_numpy()
    assert (np.diff(values, axis=1) >= 0).all()
    assert values.min() >= 2 and values.max() <= 9
    assert (values == np.round(values)).all()
    assert (values[:, 3] > values[:, 1]).any()  # a real band, not a line


def test_level_correction_follows_a_new_level():
    history = replica_history(days=21)
    shifted = history.copy()
    recent = shifted["ds"] > shifted["ds"].max() - pd.Timedelta("2h")
    shifted.loc[recent, "y"] += 3  # a surge going on right now
    base = AutoForecaster(timezone=TZ).fit(history).predict("12h", [0.5])
    surge = AutoForecaster(timezone=TZ).fit(shifted).predict("12h", [0.5])
    assert surge["q0.5"].iloc[0] >= base["q0.5"].iloc[0] + 2  # the next step sees the surge
    assert abs(surge["q0.5"].iloc[-1] - base["q0.5"].iloc[-1]) <= 1  # and it fades


def test_auto_quantiles_are_calibrated_on_a_long_history():
    history = continuous_history(days=84)
    cut = history["ds"].max() - pd.Timedelta(days=28)
    hits = {q: [] for q in (0.5, 0.9)}
    for day in range(0, 28, 2):
        origin = cut + pd.Timedelta(days=day)
        past = history[history["ds"] <= origin]
        future = history[(history["ds"] > origin) & (history["ds"] <= origin + pd.Timedelta(days=1))]
        forecast = AutoForecaster(timezone=TZ).fit(past).predict("1d", [0.5, 0.9])
        joined = forecast.merge(future, on=["unique_id", "ds"])
        for q in hits:
            hits[q].extend(joined["y"] <= joined[f"q{q:g}"])
    assert abs(np.mean(hits[0.9]) - 0.9) < 0.05
    assert abs(np.mean(hits[0.5]) - 0.5) < 0.08


def test_short_history_falls_back_to_one_daily_curve():
    history = replica_history(days=3, start="2025-11-04")  # Tue-Thu: no weekend seen
    forecast = AutoForecaster(timezone=TZ).fit(history).predict("1d", [0.5])
    np.testing.assert_allclose(forecast["q0.5"], future_truth(forecast), atol=0.51)


def test_too_little_history_is_refused_clearly():
    history = replica_history(days=3)
    with pytest.raises(HistoryError, match=r"series svc/replicas covers 2 days [0-9:]+; the "
                       r"auto model needs at least 3 days of history"):
        AutoForecaster(timezone=TZ).fit(history.iloc[:-1])
    with pytest.raises(HistoryError, match="the curve model needs at least 1 day "):
        make_model("curve", timezone=TZ).fit(history.iloc[:50])
    with pytest.raises(HistoryError, match="the seasonal_naive model needs at least 7 days"):
        make_model("seasonal_naive").fit(replica_history(days=5))


def test_gaps_constant_and_zero_series():
    history = replica_history(days=14)
    gap = (history["ds"] > history["ds"].iloc[500]) & (history["ds"] < history["ds"].iloc[540])
    holey = history[~gap]
    forecast = AutoForecaster(timezone=TZ).fit(holey).predict("1d", [0.5, 0.9])
    assert forecast[["q0.5", "q0.9"]].notna().all().all()
    np.testing.assert_allclose(forecast["q0.5"], future_truth(forecast), atol=0.51)

    for value in (0.0, 5.0):
        flat = history.assign(y=value, unique_id=f"flat{value:g}/replicas")
        for name in ("auto", "seasonal_naive"):
            out = make_model(name).fit(flat).predict("1d", QS)
            assert (out[["q0.1", "q0.5", "q0.9"]] == value).all().all()


def test_irregular_steps_are_refused():
    history = replica_history(days=8)
    jittered = history.copy()
    jittered.loc[10, "ds"] += pd.Timedelta("4min")
    with pytest.raises(HistoryError, match="irregular"):
        AutoForecaster().fit(jittered)
    coarse = replica_history(days=30, step="2h")
    with pytest.raises(HistoryError, match="1 minute to 1 hour"):
        AutoForecaster().fit(coarse)


def test_any_step_from_a_minute_to_an_hour():
    for step in ("1min", "1h"):
        history = replica_history(days=8, step=step)
        forecast = AutoForecaster(timezone=TZ).fit(history).predict("1d", [0.5])
        assert len(forecast) == pd.Timedelta(days=1) / pd.Timedelta(step)
        np.testing.assert_allclose(forecast["q0.5"], future_truth(forecast), atol=0.51)


def test_model_for_uses_the_pool_config():
    settings = load_config("idlegpu.yaml")
    model = model_for("auto", settings)
    assert model.timezone == "Asia/Seoul" and model.holiday_country == "KR"
    assert model.bounds["chat/replicas"] == (4.0, 12.0)
    with pytest.raises(ValueError, match="unknown model 'arima'"):
        make_model("arima")
