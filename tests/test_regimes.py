"""The curve model (``auto``'s candidate) and ``auto`` under regime changes: a launch (+40 % step), a surge (+20 %/day for three days),
ordinary and quiet days that must not be mistaken for one. The synthetic pools come from
``idlegpu.forecast.synthetic`` (the sample's four services with room to grow), as in
bench/regime_bench.py; the bounds asserted are the figures measured, with margin."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from forecast_data import TZ, replica_history

from idlegpu.forecast.models import make_model
from idlegpu.forecast.models.curve import CurveForecaster
from idlegpu.forecast.synthetic import SAMPLE_POOL, generate_pool_history

STATIC = {"level_band": None, "aci_gamma": None}  # the curve without its regime handling
SHIFTS = {
    "stable": (),
    "step": (("2025-12-01T09:00", 1.4, 0.0),),  # a launch on Monday morning
    "surge": (("2025-12-01T00:00", 1.2**3, 3.0),),  # +20 %/day Monday to Wednesday
}


def pool(shifts=()):
    services = tuple(dataclasses.replace(s, max_replicas=s.max_replicas * 3)
                     for s in SAMPLE_POOL.services)
    return dataclasses.replace(SAMPLE_POOL, services=services, start="2025-10-20",
                               end="2025-12-05", gaps=(), quiet_days={}, shifts=shifts)


BOUNDS = {f"{s.name}/replicas": (float(s.min_replicas), float(s.max_replicas))
          for s in pool().services}


@pytest.fixture(scope="module")
def histories():
    out = {}
    for name, shifts in SHIFTS.items():
        frame = generate_pool_history(pool(shifts), seed=11)
        out[name] = frame[frame["unique_id"].str.endswith("/replicas")]
    return out


def scores(history, days, model="curve", **options):
    """q0.9 coverage and MAE of the median per 18:00 cutoff, 24 h ahead, four series."""
    out = []
    name = model
    for day in days:
        cutoff = pd.Timestamp(f"{day}T18:00", tz=TZ).tz_convert("UTC")
        model = make_model(name, timezone=TZ, holiday_country="KR", bounds=BOUNDS, **options)
        forecast = model.fit(history[history["ds"] <= cutoff]).predict("24h", [0.5, 0.9])
        joined = forecast.merge(history, on=["unique_id", "ds"])
        assert len(joined) == 4 * 288
        out.append(((joined["y"] <= joined["q0.9"]).mean(),
                    (joined["y"] - joined["q0.5"]).abs().mean()))
    return np.array(out)


AFTER = ("2025-12-02", "2025-12-03", "2025-12-04")  # Tuesday to Thursday evening


def test_a_step_is_followed_within_a_day_with_its_coverage_held(histories):
    stable = scores(histories["stable"], AFTER)
    step = scores(histories["step"], AFTER)
    static = scores(histories["step"], AFTER, **STATIC)
    # measured: coverage 0.96 / 0.95 / 0.97 (stable 0.96-0.98), MAE 2.9x the stable pool's
    assert step[:, 0].min() >= 0.90 and step[:, 0].mean() >= 0.92
    assert step[:, 1].mean() <= 3.5 * stable[:, 1].mean()
    # without the rescaling the same cutoffs under-cover (0.83) and err 5x the stable pool
    assert static[:, 0].mean() < 0.88
    assert step[:, 1].mean() <= 0.7 * static[:, 1].mean()
    # the evening of the launch (9 h after it): 0.83 where the static curve gives 0.62
    first = scores(histories["step"], ["2025-12-01"])[0]
    first_static = scores(histories["step"], ["2025-12-01"], **STATIC)[0]
    assert first[0] >= 0.78 and first[0] >= first_static[0] + 0.1


def test_a_surge_is_followed_with_its_coverage_held(histories):
    surge = scores(histories["surge"], AFTER)
    static = scores(histories["surge"], AFTER, **STATIC)
    # measured: coverage 0.81 / 0.93 / 0.95 (static curve: 0.59 / 0.52 / 0.76), MAE halved
    assert surge[:, 0].min() >= 0.77 and surge[:, 0].mean() >= 0.86
    assert static[:, 0].mean() < 0.75
    assert surge[:, 1].mean() <= 0.6 * static[:, 1].mean()


def test_stable_traffic_forecasts_as_before(histories):
    stable = scores(histories["stable"], AFTER)
    static = scores(histories["stable"], AFTER, **STATIC)
    np.testing.assert_allclose(stable, static)  # nothing leaves the dead band
    assert stable[:, 0].min() >= 0.94


def test_the_adaptive_level_widens_only_while_the_replays_miss(histories):
    def levels(name, day):
        cutoff = pd.Timestamp(f"{day}T18:00", tz=TZ).tz_convert("UTC")
        history = histories[name]
        model = CurveForecaster(timezone=TZ, holiday_country="KR", bounds=BOUNDS)
        model.fit(history[history["ds"] <= cutoff])
        return np.array([model._adapted_levels(f, (0.5, 0.9)) for f in model.fitted_])

    for day in ("2025-12-02", "2025-12-03"):
        assert (levels("stable", day) == [0.5, 0.9]).all()  # ordinary days: as calibrated
    # the surge: q0.9 read higher for every series the next day (0.91-0.95 measured), at the
    # q0.98 cap for most the day after (0.97-0.98); the median never moves
    tuesday, wednesday = levels("surge", "2025-12-02"), levels("surge", "2025-12-03")
    assert (tuesday[:, 0] == 0.5).all() and (wednesday[:, 0] == 0.5).all()
    assert (tuesday[:, 1] > 0.905).all() and (wednesday[:, 1] >= 0.96).all()
    assert (wednesday[:, 1] <= 0.98 + 1e-12).all()


def shifted(history, factor, days, floor):
    """``history`` with the replicas of its last ``days`` days scaled by ``factor`` (as an
    autoscaler would: rounded, never below the ``floor``)."""
    out = history.copy()
    recent = out["ds"] > out["ds"].max() - pd.Timedelta(days=days)
    out.loc[recent, "y"] = np.maximum(floor, np.round(out.loc[recent, "y"] * factor))
    return out


def test_an_ordinary_day_and_a_quiet_day_are_not_new_regimes():
    # 24 days from Monday 2025-11-03: 24 replicas at a weekday peak (09-18), 6 at night
    history = replica_history(days=24, noise=0.3, seed=3)
    history["y"] = np.maximum(6.0, history["y"] * 3)

    def peak(days=0, factor=1.0, **options):
        frame = shifted(history, factor, days, 6.0)
        model = CurveForecaster(timezone=TZ, bounds={"svc/replicas": (6, 60)}, **options)
        return model.fit(frame).predict("1d", [0.5])["q0.5"].max()

    base = peak()
    assert base == 24
    assert peak(1, 1.08) == base  # +8 % for a day: inside the dead band
    assert peak(1, 0.7) == base  # one quiet day (an eve) is not followed
    assert peak(2, 0.7) <= 20  # a drop that lasts is (18 measured)
    assert peak(1, 1.15) >= 27  # +15 %: outside the band (28 measured)
    assert peak(1, 1.4) >= 32  # a rise at once (34 measured)
    assert peak(1, 1.4, **STATIC) <= base + 1  # where the static curve lags


def test_auto_keeps_the_curves_regime_handling(histories):
    """``auto`` chooses among candidates; after a launch or in a surge its choice must follow
    as well as the curve does (bench/regime_bench.py: the same, over five cutoffs)."""
    for name, floor in (("step", 0.92), ("surge", 0.84)):
        auto = scores(histories[name], AFTER, model="auto")
        curve = scores(histories[name], AFTER)
        # measured, Tuesday to Thursday: step coverage 0.96 (the curve 0.96), MAE 0.53 (0.51);
        # surge 0.88 (0.90), MAE 0.71 (0.73)
        assert auto[:, 0].mean() >= floor, (name, auto[:, 0])
        assert auto[:, 1].mean() <= 1.2 * curve[:, 1].mean(), (name, auto[:, 1], curve[:, 1])
