"""``seasonal_naive``: the same time one week earlier, the reference every forecast must beat.

Quantiles come from the empirical distribution of the series' own week-over-week changes
(``y(t) - y(t - 7 days)`` over the history), added to the point forecast.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

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
        point = np.full(m, np.nan)
        for k in range(1, m // lag + 3):
            # future step j sits at position n + j; k seasons back is n + j - k * lag
            src = np.arange(n, n + m) - k * lag
            usable = (src >= 0) & (src < n) & np.isnan(point)
            got = np.full(m, np.nan)
            got[usable] = arr[src[usable]]
            point = np.where(np.isnan(point), got, point)
        if np.isnan(point).any():
            point = pd.Series(point).ffill().bfill().fillna(np.nanmean(arr)).to_numpy()
        changes = arr[lag:] - arr[:-lag]
        changes = changes[np.isfinite(changes)]
        offsets = np.quantile(changes, qs) if changes.size else np.zeros(len(qs))
        return series, index, point[:, None] + offsets[None, :]
