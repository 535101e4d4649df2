"""``seasonal_naive``: the same time one week earlier, the reference every forecast must beat.

Quantiles come from the empirical distribution of the series' own week-over-week changes
(``y(t) - y(t - 7 days)`` over the history), added to the point forecast.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from forecast.errors import HistoryError
from forecast.models.base import (
    WEEK,
    Series,
    finish_quantiles,
    parse_horizon,
    prepare_series,
    to_frame,
    validate_quantiles,
)


class SeasonalNaiveForecaster:
    name = "seasonal_naive"

    def __init__(
        self,
        *,
        timezone: str = "UTC",
        holiday_country: str | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
        season: pd.Timedelta = WEEK,
    ) -> None:
        self.timezone = timezone
        self.holiday_country = holiday_country
        self.bounds = bounds
        self.season = season

    def fit(self, history: pd.DataFrame) -> SeasonalNaiveForecaster:
        self.series_ = prepare_series(history, self.bounds)
        for series in self.series_:
            span = series.values.index[-1] - series.values.index[0] + series.step
            if span < self.season:
                raise HistoryError(
                    f"series {series.uid} covers {span}; seasonal_naive needs at least "
                    f"{self.season} of history"
                )
        return self

    def predict(self, horizon: pd.Timedelta | str, quantiles: Sequence[float]) -> pd.DataFrame:
        horizon = parse_horizon(horizon)
        qs = validate_quantiles(quantiles)
        return pd.concat([self._one(s, horizon, qs) for s in self.series_], ignore_index=True)

    def _one(self, series: Series, horizon: pd.Timedelta, qs: tuple[float, ...]) -> pd.DataFrame:
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
        out = finish_quantiles(point[:, None] + offsets[None, :], series, qs, integer=False)
        return to_frame(series.uid, index, self.name, out, qs)
