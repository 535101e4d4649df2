"""``statsmodels``: an MSTL decomposition (statsmodels) extended into the future.

Per series, on the last ``max_days`` days (default 56):

1. Gaps are filled by linear interpolation, for the decomposition only.
2. ``MSTL`` splits the series into trend + a daily seasonal component + a weekly one +
   remainder. The weekly period is used only with at least two weeks of history (two full
   periods); with less, only the daily one. Less than two days is refused (``HistoryError``).
   STL's LOESS smoothers are evaluated every ``steps_per_day / 10`` points for the trend and
   low-pass filters (``trend_jump``, ``low_pass_jump``) with one inner iteration: 8 weeks at
   5 minutes decompose in about 0.3 s (statsmodels' defaults took 55 s for 90 days on the same
   kind of machine); on the sample pool the remainder's spread is within 1 % of that of two
   inner iterations.
3. Forecast at lead ``h``: the last trend value (flat trend), plus each seasonal component
   repeated from its last full period (the daily one: same time of day on the last day; the
   weekly one: same weekday and time one week earlier), plus the last remainder decayed as an
   AR(1) (``phi ** h``, ``phi`` the lag-1 autocorrelation of the remainder, in [0, 0.99]).
4. Quantiles: the point forecast plus empirical quantiles of the h-step errors of exactly this
   forecast rule replayed in-sample: from an origin every hour, the rule predicts the observed
   (not interpolated) values up to seven days ahead from the decomposition's components at the
   origin. The errors thus contain the trend's drift over the lead, the change of the seasonal
   pattern from one period to the next and the remainder, not the remainder alone. They are
   pooled by lead time (< 1 h, 1-6 h, 6-24 h, 1-3 days, >= 3 days; an empty bucket borrows
   the nearest shorter one). The components are two-sided smooths, so these errors are
   somewhat optimistic (intervals a little narrow); no bucket by hour of day.

The decomposition runs on the regular grid of the pool's wall clock (``timezone``): a day of
23 or 25 hours is a day of the daily period too. ``holiday_country`` is accepted for the
common interface but unused: holidays look like ordinary days to it.

Quantiles are sorted, clipped to the series' bounds and stay continuous (no rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import wall_clock
from idlegpu.forecast.errors import HistoryError, PermanentError
from idlegpu.forecast.models.base import (
    DAY,
    WEEK,
    Series,
    SeriesForecaster,
)

LEAD_EDGES_H = (1.0, 6.0, 24.0, 72.0)
MIN_BUCKET = 40  # fewer errors than this in a lead bucket: borrow a shorter bucket's
CALIBRATION_LEAD = pd.Timedelta(days=7)
GRID = np.linspace(0.0, 1.0, 1001)  # error quantiles kept per bucket, interpolated at predict


@dataclass
class _Fitted:
    series: Series
    periods: tuple[int, ...]
    trend: float
    seasonal: list[np.ndarray]  # the last full period of each seasonal component
    last_resid: float
    phi: float
    error_table: dict[int, np.ndarray]  # lead bucket -> error quantiles on GRID
    origin: pd.Timestamp  # the wall-clock time of the last step decomposed (naive, local)


def _import_mstl() -> Any:
    try:
        from statsmodels.tsa.seasonal import MSTL
    except ImportError as exc:
        raise PermanentError(
            "the statsmodels model needs the 'statsmodels' package (an extra of the reference "
            "forecasters): pip install 'idlegpu[models]' "
            f"(import failed: {exc})"
        ) from exc
    return MSTL


def _seasonal_index(origin: np.ndarray | int, leads: np.ndarray, period: int) -> np.ndarray:
    """Position of the same phase in the last full period before ``origin`` (inclusive)."""
    return origin + leads - period * np.ceil(leads / period).astype(int)


class MSTLForecaster(SeriesForecaster):
    name = "statsmodels"

    def __init__(
        self,
        *,
        timezone: str = "UTC",
        holiday_country: str | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
        max_days: float = 56,
        iterate: int = 2,
    ) -> None:
        # holidays are unused (see the module docstring)
        super().__init__(timezone=timezone, holiday_country=holiday_country, bounds=bounds)
        self.max_days = max_days
        self.iterate = iterate

    # ---------------------------------------------------------------- fit
    def _setup(self) -> None:
        self._mstl = _import_mstl()

    def _fit_one(self, series: Series) -> _Fitted:
        mstl = self._mstl
        values = series.values
        values = values[values.index > series.last - pd.Timedelta(days=self.max_days)]
        values = self._on_wall_clock(values, series.step)
        n = len(values)
        per_day = int(DAY / series.step)
        per_week = int(WEEK / series.step)
        if n < 2 * per_day:
            raise HistoryError(
                f"series {series.uid} covers {n * series.step}; the statsmodels (MSTL) model "
                "needs at least two days of history (two daily periods)"
            )
        periods = (per_day, per_week) if n >= 2 * per_week else (per_day,)
        observed = values.notna().to_numpy()
        y = values.interpolate(method="linear", limit_direction="both").to_numpy()
        jump = max(1, per_day // 10)
        stl_kwargs = {  # a fresh dict per fit: MSTL pops keys from it
            "trend_jump": jump,
            "low_pass_jump": jump,
            "seasonal_jump": 1,
            "inner_iter": 1,
        }
        result = mstl(y, periods=periods, iterate=self.iterate, stl_kwargs=stl_kwargs).fit()
        trend = np.asarray(result.trend, dtype=float)
        seasonal = np.asarray(result.seasonal, dtype=float).reshape(n, -1)
        resid = np.asarray(result.resid, dtype=float)
        phi = _ar1(resid, observed)
        table = self._error_table(y, observed, trend, seasonal, resid, phi, periods, series)
        tails = [seasonal[n - p :, k] for k, p in enumerate(periods)]
        return _Fitted(series, periods, float(trend[-1]), tails, float(resid[-1]), phi, table,
                       values.index[-1])

    def _on_wall_clock(self, values: pd.Series, step: pd.Timedelta) -> pd.Series:
        """``values`` on the regular grid of the pool's wall clock, so that a period of a day
        is a day of the wall clock across a change of summer time: of the hour the change
        repeats the first pass is kept, the hour it skips is a gap (interpolated like any)."""
        wall = pd.Series(values.to_numpy(), index=wall_clock(values.index, self.timezone))
        wall = wall[~wall.index.duplicated(keep="first")]
        return wall.reindex(pd.date_range(wall.index[0], wall.index.max(), freq=step))

    def _error_table(self, y: np.ndarray, observed: np.ndarray, trend: np.ndarray,
                     seasonal: np.ndarray, resid: np.ndarray, phi: float,
                     periods: tuple[int, ...], series: Series) -> dict[int, np.ndarray]:
        """h-step errors of the forecast rule replayed from an origin every hour."""
        n = len(y)
        per_hour = max(1, round(pd.Timedelta(hours=1) / series.step))
        per_day = int(DAY / series.step)
        max_lead = int(CALIBRATION_LEAD / series.step)
        # every lead up to a day, then one per hour: bounds the work and the memory
        leads = np.unique(
            np.concatenate([np.arange(1, per_day + 1), np.arange(per_day, max_lead + 1, per_hour)])
        )
        origins = np.arange(max(periods) - 1, n - 1, per_hour)
        if origins.size == 0:
            return {}
        o = origins[:, None]
        h = leads[None, :]
        target = o + h
        valid = target < n
        target = np.where(valid, target, n - 1)
        point = trend[o] + resid[o] * phi ** h.astype(float)
        for k, p in enumerate(periods):
            point = point + seasonal[_seasonal_index(o, h, p), k]
        valid &= observed[target]
        errors = (y[target] - point)[valid]
        hours = np.broadcast_to(h * (series.step / pd.Timedelta(hours=1)), valid.shape)[valid]
        buckets = np.digitize(hours, LEAD_EDGES_H)
        table = {}
        for b in range(len(LEAD_EDGES_H) + 1):
            chunk = errors[buckets == b]
            if chunk.size >= MIN_BUCKET:
                table[b] = np.quantile(chunk, GRID)
        if not table and errors.size:
            table[0] = np.quantile(errors, GRID)
        return table

    # ---------------------------------------------------------------- predict
    def _predict_one(self, f: _Fitted, horizon: pd.Timedelta, qs: tuple[float, ...]
                     ) -> tuple[Series, pd.DatetimeIndex, np.ndarray]:
        index = f.series.future_index(horizon)
        # steps ahead on the wall clock: the repeated hour's two passes share a lead, the
        # skipped hour has none
        wall = wall_clock(index, self.timezone)
        leads = np.maximum(1, np.round(np.asarray((wall - f.origin) / f.series.step)).astype(int))
        point = f.trend + f.last_resid * f.phi ** leads.astype(float)
        for tail, p in zip(f.seasonal, f.periods):
            # position within the last period: 0 is its first step, p - 1 the origin
            point = point + tail[_seasonal_index(p - 1, leads, p)]
        hours = leads * (f.series.step / pd.Timedelta(hours=1))
        buckets = np.digitize(hours, LEAD_EDGES_H)
        offsets = np.zeros((len(index), len(qs)))
        for b in np.unique(buckets):
            table = _bucket_table(f.error_table, int(b))
            if table is not None:
                offsets[buckets == b] = np.interp(qs, GRID, table)
        return f.series, index, point[:, None] + offsets


def _bucket_table(tables: dict[int, np.ndarray], bucket: int) -> np.ndarray | None:
    """The bucket's error quantiles, else the nearest shorter bucket's, else any longer one."""
    if not tables:
        return None
    shorter = [b for b in tables if b <= bucket]
    return tables[max(shorter)] if shorter else tables[min(tables)]


def _ar1(resid: np.ndarray, observed: np.ndarray) -> float:
    """Lag-1 autocorrelation of the remainder over pairs of observed steps, in [0, 0.99]."""
    a, b = resid[:-1], resid[1:]
    ok = observed[:-1] & observed[1:]
    if ok.sum() < 10:
        return 0.0
    a, b = a[ok], b[ok]
    if np.std(a) < 1e-12 or np.std(b) < 1e-12:
        return 0.0
    return float(np.clip(np.corrcoef(a, b)[0, 1], 0.0, 0.99))
