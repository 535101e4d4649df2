"""``seasonal_naive``: the same time one week earlier, the reference every forecast must beat.

Quantiles come from the empirical distribution of the series' own week-over-week changes
(``y(t) - y(t - 7 days)`` over the history), added to the point forecast.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import wall_clock_lag
from idlegpu.forecast.models.base import (
    WEEK,
    Series,
    SeriesForecaster,
    require_span,
)


class SeasonalNaiveForecaster(SeriesForecaster):
    name = "seasonal_naive"

    def __init__(
        self,
        *,
        timezone: str = "UTC",
        holiday_country: str | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
        season: pd.Timedelta = WEEK,
    ) -> None:
        super().__init__(timezone=timezone, holiday_country=holiday_country, bounds=bounds)
        self.season = season

    def _fit_one(self, series: Series) -> Series:
        require_span(series, series.values, self.season, self.name)
        return series

    def _predict_one(
        self, series: Series, horizon: pd.Timedelta, qs: tuple[float, ...]
    ) -> tuple[Series, pd.DatetimeIndex, np.ndarray]:
        values = series.values
        lag = int(self.season / series.step)
        index = series.future_index(horizon)
        n, m = len(values), len(index)
        arr = values.to_numpy()
        origin = values.index[0]
        point = np.full(m, np.nan)
        for k in range(1, m // lag + 3):
            # the same wall-clock time k seasons back (an hour more or less across a change of
            # summer time)
            src = wall_clock_lag(index, self.timezone, k * self.season, origin, series.step)
            usable = (src >= 0) & (src < n) & np.isnan(point)
            got = np.full(m, np.nan)
            got[usable] = arr[src[usable]]
            point = np.where(np.isnan(point), got, point)
        if np.isnan(point).any():
            point = pd.Series(point).ffill().bfill().fillna(np.nanmean(arr)).to_numpy()
        before = wall_clock_lag(values.index, self.timezone, self.season, origin, series.step)
        seen = before >= 0
        changes = arr[seen] - arr[before[seen]]
        changes = changes[np.isfinite(changes)]
        offsets = np.quantile(changes, qs) if changes.size else np.zeros(len(qs))
        return series, index, point[:, None] + offsets[None, :]
