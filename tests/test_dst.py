"""Pools in a zone with daylight saving time: days of 23 and 25 hours. Every daily pattern,
cutoff, refresh and night is counted by the wall clock (the sample pool's Asia/Seoul has no
such days, so nothing else would notice)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from forecast_data import daily_pattern

from idlegpu.forecast.backtest import daily_cutoffs
from idlegpu.forecast.models import make_model

NEW_YORK = "America/New_York"  # summer time ends on 2 Nov 2025 (01:00-02:00 twice)
QS = [0.1, 0.5, 0.9]


def wall_clock_history(end_local: str, days: int = 28, step: str = "15min",
                       tz: str = NEW_YORK) -> pd.DataFrame:
    """Replicas that follow the wall clock of ``tz`` (busy 09-18 on weekdays), in UTC."""
    end = pd.Timestamp(end_local, tz=tz).tz_convert("UTC")
    ds = pd.date_range(end=end, periods=int(pd.Timedelta(days=days) / pd.Timedelta(step)),
                       freq=step)
    y = daily_pattern(ds.tz_convert(tz))
    return pd.DataFrame({"unique_id": "svc/replicas", "ds": ds, "y": y})


@pytest.mark.parametrize("name", ["auto", "seasonal_naive", "gbm", "statsmodels"])
@pytest.mark.parametrize("end_local", ["2025-10-31 18:00", "2026-03-06 18:00"])
def test_forecasts_follow_the_wall_clock_across_a_change_of_summer_time(name, end_local):
    history = wall_clock_history(end_local)
    model = make_model(name, timezone=NEW_YORK, holiday_country=None).fit(history)
    forecast = model.predict("7d", QS)  # over the change: a 25-hour or a 23-hour day
    truth = daily_pattern(pd.DatetimeIndex(forecast["ds"]).tz_convert(NEW_YORK))
    wrong = forecast.loc[np.abs(forecast["q0.5"] - truth) > 0.51, "ds"]
    assert wrong.empty, (f"{len(wrong)} steps off the pattern, from "
                         f"{wrong.min().tz_convert(NEW_YORK)} to "
                         f"{wrong.max().tz_convert(NEW_YORK)}")


def test_prophet_misses_the_pattern_by_no_more_across_the_change_than_without_one():
    """Prophet is not exact on this pattern anywhere; across the change it does as well as in
    a zone without summer time (Bogota, the same hours of the year)."""
    errors = {}
    for tz in (NEW_YORK, "America/Bogota"):
        history = wall_clock_history("2025-10-31 18:00", tz=tz)
        forecast = make_model("prophet", timezone=tz, holiday_country=None).fit(
            history).predict("7d", QS)
        local = pd.DatetimeIndex(forecast["ds"]).tz_convert(tz)
        after = local >= pd.Timestamp("2025-11-02 12:00", tz=tz)
        errors[tz] = float(np.abs(forecast["q0.5"] - daily_pattern(local))[after].mean())
    assert errors[NEW_YORK] <= errors["America/Bogota"] * 1.1, errors


def test_backtest_cutoffs_keep_their_local_hour_across_the_change():
    history = wall_clock_history("2025-11-10 00:00", days=21)
    cutoffs = daily_cutoffs(history, timezone=NEW_YORK, hour=18, days=14)
    local = [c.tz_convert(NEW_YORK) for c in cutoffs]
    assert [t.hour for t in local] == [18] * 14
    assert [t.date() for t in local] == [date(2025, 10, 26) + pd.Timedelta(days=k)
                                         for k in range(14)]


def test_the_simulators_night_ends_at_its_local_hour_on_the_night_of_the_change():
    from idlegpu.scheduler.simulate import NIGHT_HOURS, _steps_until_morning

    start_h, end_h = NIGHT_HOURS
    evenings = pd.DatetimeIndex([pd.Timestamp(f"{day} {start_h}:00", tz=NEW_YORK)
                                 for day in ("2025-11-01", "2025-11-05", "2026-03-07")])
    steps = _steps_until_morning(evenings.tz_convert("UTC"), NEW_YORK, 3600)
    night = 24 - start_h + end_h
    # an hour longer when the clocks go back, an hour shorter when they go forward
    assert list(steps) == [night + 1, night, night - 1]


def test_the_consoles_accuracy_window_ends_with_the_last_evening_whose_day_is_over():
    from idlegpu.scheduler.config import load_config
    from idlegpu.scheduler.console.report_pages import AccuracyChecks

    settings = load_config(Path(__file__).resolve().parents[1] / "idlegpu.yaml")
    settings = settings.model_copy(update={"pool": settings.pool.model_copy(
        update={"timezone": NEW_YORK})})
    checks = AccuracyChecks(settings, history=lambda first, last: None, now=lambda: None)
    hour = settings.daemon.forecast_refresh_hour
    # the evening of 7 March (17:00 EST) has had its 24 hours at 18:00 EDT on 8 March, the
    # 23-hour day: 24 hours of real time, not of the wall clock (which would say 17:00)
    over = pd.Timestamp(f"2026-03-08 {hour + 1}:00", tz=NEW_YORK).to_pydatetime()
    assert checks.window(3, over) == (date(2026, 3, 5), date(2026, 3, 7))
    before = (pd.Timestamp(over) - pd.Timedelta(minutes=1)).to_pydatetime()
    assert checks.window(3, before) == (date(2026, 3, 4), date(2026, 3, 6))
