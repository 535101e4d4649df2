"""The reference forecasters (prophet, statsmodels MSTL, scikit-learn GBM) on synthetic series.

Four weeks at 15 minutes in Asia/Seoul: a daily curve (local time) plus a weekly wave plus noise,
rounded to integer replica counts. Each model is fitted once per module on several series at
once (a clean one, one with a gap that also ends earlier, one with bounds, a constant one and an
all-zeros one) and predicted two days ahead.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from idlegpu.forecast.errors import HistoryError, PermanentError
from idlegpu.forecast.models.gbm_model import GBMForecaster
from idlegpu.forecast.models.mstl_model import MSTLForecaster
from idlegpu.forecast.models.prophet_model import ProphetForecaster
from idlegpu.forecast.schema import validate_history

TZ = "Asia/Seoul"
STEP = pd.Timedelta(minutes=15)
DAYS = 28
HORIZON = pd.Timedelta(hours=48)
QS = (0.1, 0.5, 0.9)
BOUNDS = {
    "bounded/replicas": (3.0, 8.0),
    "flat/replicas": (0.0, 10.0),
    "zero/replicas": (0.0, 10.0),
}
MODELS = {"prophet": ProphetForecaster, "statsmodels": MSTLForecaster, "gbm": GBMForecaster}


def pattern(index: pd.DatetimeIndex) -> np.ndarray:
    """The noise-free curve: 1 to 11 replicas, peak in the local afternoon, midweek high."""
    local = index.tz_convert(TZ)
    hour = np.asarray(local.hour + local.minute / 60, dtype=float)
    week = (np.asarray(local.day_of_week) * 24 + hour) / 168
    daily = 3 * np.sin(2 * np.pi * (hour - 8) / 24) + np.cos(4 * np.pi * hour / 24)
    return 6 + daily + np.cos(2 * np.pi * (week - 3 / 7))


def grid(days: float, end_offset_steps: int = 0) -> pd.DatetimeIndex:
    start = pd.Timestamp("2025-03-03", tz=TZ).tz_convert("UTC")  # a local Monday midnight
    return pd.date_range(start, periods=int(days * 96) - end_offset_steps, freq=STEP)


def noisy(index: pd.DatetimeIndex, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(pattern(index) + rng.normal(0.0, 0.3, len(index)))


def frame(uid: str, index: pd.DatetimeIndex, y: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"unique_id": uid, "ds": index, "y": y})


def make_history() -> pd.DataFrame:
    full = grid(DAYS)
    gappy = grid(DAYS, end_offset_steps=2)  # ends 30 minutes before the others
    gappy_y = noisy(gappy, 2)
    gap = (gappy >= gappy[0] + pd.Timedelta(days=20, hours=3)) & (
        gappy < gappy[0] + pd.Timedelta(days=20, hours=8)
    )
    parts = [
        frame("svc/replicas", full, noisy(full, 1)),
        frame("gappy/replicas", gappy[~gap], gappy_y[~gap]),  # a 5-hour hole: missing rows
        frame("bounded/replicas", full, noisy(full, 3)),
        frame("flat/replicas", full, np.full(len(full), 3.0)),
        frame("zero/replicas", full, np.zeros(len(full))),
    ]
    return validate_history(pd.concat(parts, ignore_index=True))


HISTORY = make_history()
LAST = HISTORY.groupby("unique_id").ds.max()


@pytest.fixture(scope="module", params=list(MODELS))
def fitted(request):
    cls = MODELS[request.param]
    model = cls(timezone=TZ, holiday_country="KR", bounds=BOUNDS).fit(HISTORY)
    return model, model.predict(HORIZON, QS)


def rows(pred: pd.DataFrame, uid: str) -> pd.DataFrame:
    return pred[pred.unique_id == uid].reset_index(drop=True)


def test_recovers_the_pattern(fitted):
    _, pred = fitted
    for uid in ("svc/replicas", "gappy/replicas"):
        part = rows(pred, uid)
        truth = pattern(pd.DatetimeIndex(part.ds))
        mae = np.abs(part["q0.5"].to_numpy() - truth).mean()
        # the pattern swings over 10 replicas (amplitude 5); noise + rounding alone is ~0.35
        assert mae < 0.5, f"{uid}: MAE {mae:.3f}"


def test_quantiles_are_monotone_and_within_bounds(fitted):
    _, pred = fitted
    q = pred[["q0.1", "q0.5", "q0.9"]].to_numpy()
    assert np.isfinite(q).all()
    assert (np.diff(q, axis=1) >= 0).all()
    bounded = rows(pred, "bounded/replicas")[["q0.1", "q0.5", "q0.9"]].to_numpy()
    assert bounded.min() >= 3.0 and bounded.max() <= 8.0
    assert bounded.min() == 3.0 and bounded.max() == 8.0  # the pattern does cross both
    svc = rows(pred, "svc/replicas")
    seen = HISTORY[HISTORY.unique_id == "svc/replicas"].y  # default bounds: the range seen
    assert svc["q0.1"].min() >= seen.min() and svc["q0.9"].max() <= seen.max()
    assert (svc["q0.9"] - svc["q0.1"]).mean() > 0.1  # a real interval, not a point


def test_columns_and_timestamps(fitted):
    model, pred = fitted
    assert list(pred.columns) == ["unique_id", "ds", "model", "q0.1", "q0.5", "q0.9"]
    assert (pred.model == model.name).all()
    assert str(pred.ds.dtype) == "datetime64[ns, UTC]"
    assert sorted(pred.unique_id.unique()) == sorted(LAST.index)
    for uid, last in LAST.items():
        expected = pd.date_range(last + STEP, periods=int(HORIZON / STEP), freq=STEP)
        assert pd.DatetimeIndex(rows(pred, uid).ds).equals(expected), uid


def test_constant_and_zero_series(fitted):
    _, pred = fitted
    # bounds of (0, 10) leave room: the constancy comes from the model, not from clipping
    flat = rows(pred, "flat/replicas")[["q0.1", "q0.5", "q0.9"]].to_numpy()
    assert np.abs(flat - 3.0).max() < 0.5
    zero = rows(pred, "zero/replicas")[["q0.1", "q0.5", "q0.9"]].to_numpy()
    assert zero.min() >= 0.0 and zero.max() < 0.5


def test_predictions_are_reproducible_and_reach_past_a_week(fitted):
    model, pred = fitted
    pd.testing.assert_frame_equal(model.predict(HORIZON, QS), pred)
    long = model.predict(pd.Timedelta(days=10), (0.9, 0.5))  # unsorted: sorted in output
    assert list(long.columns[-2:]) == ["q0.5", "q0.9"]
    svc = rows(long, "svc/replicas")
    assert len(svc) == 10 * 96 and (svc["q0.9"] >= svc["q0.5"]).all()
    late = svc[svc.ds > LAST["svc/replicas"] + pd.Timedelta(days=7)]
    mae = np.abs(late["q0.5"].to_numpy() - pattern(pd.DatetimeIndex(late.ds))).mean()
    assert mae < 0.6, f"days 8-10: MAE {mae:.3f}"


@pytest.mark.parametrize(
    ("name", "too_short", "message"),
    [("prophet", 0.75, "1 day "), ("statsmodels", 1.5, "two days"), ("gbm", 0.75, "1 day ")],
)
def test_too_short_history_is_refused(name, too_short, message):
    index = grid(too_short)
    history = validate_history(frame("svc/replicas", index, noisy(index, 1)))
    with pytest.raises(HistoryError, match=message):
        MODELS[name](timezone=TZ).fit(history)


@pytest.mark.parametrize("name", list(MODELS))
def test_short_history_still_forecasts(name):
    index = grid(3)  # above every minimum, below two weeks: MSTL uses the daily period only
    history = validate_history(frame("svc/replicas", index, noisy(index, 1)))
    model = MODELS[name](timezone=TZ).fit(history)
    pred = model.predict(pd.Timedelta(hours=24), QS)
    assert len(pred) == 96 and np.isfinite(pred[["q0.1", "q0.5", "q0.9"]].to_numpy()).all()
    mae = np.abs(pred["q0.5"].to_numpy() - pattern(pd.DatetimeIndex(pred.ds))).mean()
    assert mae < 1.5, f"MAE {mae:.3f}"  # the weekly wave is not learnable from 3 days
    if name == "statsmodels":
        assert model.fitted_[0].periods == (96,)


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("prophet", "prophet"),
        ("statsmodels", "statsmodels.tsa.seasonal"),
        ("gbm", "sklearn.ensemble"),
    ],
)
def test_missing_package_gives_an_install_hint(name, module, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail
    index = grid(3)
    history = validate_history(frame("svc/replicas", index, noisy(index, 1)))
    with pytest.raises(PermanentError, match="pip install"):
        MODELS[name](timezone=TZ).fit(history)
