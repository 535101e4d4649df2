"""``prophet``: Meta's Prophet as a reference model, the way its users know it.

Per series, one fresh ``Prophet`` per fit (a Prophet object cannot be refitted): additive trend +
daily + weekly seasonality (yearly off; weekly only with at least two weeks of history, Prophet's
own rule), plus one holiday effect on the days of the pool's holiday calendar (public holidays
of ``holiday_country`` and its subdivision, plus the configured custom dates: the calendar the
other models use) when it has any. One effect for every holiday rather than one per holiday
name: Prophet fits a coefficient per name, so a holiday whose name never occurred in the
training window (8 weeks: nearly every holiday, and every custom date) would have no effect.

Time zone: Prophet knows no time zones, so it is fitted on LOCAL naive timestamps (``ds``
converted to ``timezone``, then the zone dropped). The daily curve and the holidays are thus in
local time, as the service's users live. Missing steps (gaps) are simply left out.

Only the last ``max_days`` days are used (default 56, like the other reference models: it bounds
the fit time, about 3 s for 8 weeks at 5 minutes here; ``None`` uses everything).

Quantiles: Prophet gives ``yhat`` and an 80 % interval (``interval_width=0.8``: the 0.1 and 0.9
quantiles of its predictive samples). Any quantile ``q`` is read from a normal predictive
distribution through them: ``sigma = (yhat_upper - yhat_lower) / (2 * z(0.9))`` and
``q -> yhat + z(q) * sigma``. The sampling of the interval is seeded (``random_state``) without
disturbing NumPy's global random state, so forecasts are reproducible. Quantiles are sorted and
clipped to the series' bounds, and stay continuous (no rounding).

Minimum history: one day per series (else ``HistoryError``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from idlegpu.forecast.errors import PermanentError
from idlegpu.forecast.models.base import (
    DAY,
    Series,
    SeriesForecaster,
    require_span,
)

Z80 = 1.2815515655446004  # z(0.9): half-width of the 80 % interval in standard deviations
WEEKLY_MIN_SPAN = pd.Timedelta(days=14)


@dataclass
class _Fitted:
    series: Series
    model: Any  # prophet.Prophet


def _import_prophet() -> Any:
    """``prophet.Prophet``, imported lazily and quietly (no cmdstanpy/plotly chatter)."""
    # prophet.plot logs an ERROR at import when plotly is missing; plots are not used here.
    logging.getLogger("prophet.plot").setLevel(logging.CRITICAL)
    try:
        from prophet import Prophet
    except ImportError as exc:
        raise PermanentError(
            "the prophet model needs the 'prophet' package (an extra of the reference "
            "forecasters): pip install 'idlegpu[models]' "
            f"(import failed: {exc})"
        ) from exc
    logging.getLogger("prophet").setLevel(logging.WARNING)
    try:  # cmdstanpy sets its own logger to DEBUG on first use unless it has a handler
        from cmdstanpy.utils import get_logger

        get_logger().setLevel(logging.WARNING)
    except Exception:  # pragma: no cover - other cmdstanpy versions
        logging.getLogger("cmdstanpy").setLevel(logging.WARNING)
    return Prophet


@contextmanager
def _quiet_prophet() -> Iterator[None]:
    """Hide Prophet's own deprecation warnings (pandas ``inplace=``): nothing a user can act on."""
    with warnings.catch_warnings():
        for category in (DeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", category=category, module=r"prophet(\.|$)")
        yield


def _local_naive(index: pd.DatetimeIndex, timezone: str) -> pd.DatetimeIndex:
    return index.tz_convert(timezone).tz_localize(None)


class ProphetForecaster(SeriesForecaster):
    name = "prophet"

    def __init__(
        self,
        *,
        timezone: str = "UTC",
        holiday_country: str | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
        max_days: float | None = 56,
        uncertainty_samples: int = 200,
        changepoint_prior_scale: float = 0.05,
        seasonality_mode: str = "additive",
        daily_fourier_order: int = 4,
        weekly_fourier_order: int = 3,
        random_state: int = 0,
    ) -> None:
        if uncertainty_samples < 10:
            raise ValueError("uncertainty_samples must be at least 10 to estimate the interval")
        super().__init__(timezone=timezone, holiday_country=holiday_country, bounds=bounds)
        self.max_days = max_days
        self.uncertainty_samples = uncertainty_samples
        self.changepoint_prior_scale = changepoint_prior_scale
        self.seasonality_mode = seasonality_mode
        self.daily_fourier_order = daily_fourier_order
        self.weekly_fourier_order = weekly_fourier_order
        self.random_state = random_state

    # ---------------------------------------------------------------- fit
    def _setup(self) -> None:
        self._prophet_cls = _import_prophet()

    def _fit_one(self, series: Series) -> _Fitted:
        prophet_cls = self._prophet_cls
        values = series.values.dropna()
        if self.max_days is not None:
            values = values[values.index > series.last - pd.Timedelta(days=self.max_days)]
        span = require_span(series, values, DAY, self.name)
        frame = pd.DataFrame(
            {"ds": _local_naive(values.index, self.timezone), "y": values.to_numpy()}
        )
        model = prophet_cls(
            holidays=self._holiday_frame(values.index),
            growth="linear",
            daily_seasonality=self.daily_fourier_order,
            weekly_seasonality=self.weekly_fourier_order if span >= WEEKLY_MIN_SPAN else False,
            yearly_seasonality=False,
            seasonality_mode=self.seasonality_mode,
            changepoint_prior_scale=self.changepoint_prior_scale,
            interval_width=0.8,
            uncertainty_samples=self.uncertainty_samples,
        )
        with _quiet_prophet():
            model.fit(frame)
        return _Fitted(series, model)

    def _holiday_frame(self, index: pd.DatetimeIndex) -> pd.DataFrame | None:
        """The calendar's holidays from the first local day of ``index`` to the end of the
        next year (the forecast's days too), as Prophet's ``holidays`` frame; None when none."""
        if self.calendar.empty:
            return None
        local = index.tz_convert(self.timezone)
        first, last = local[0].date(), local[-1].date()
        days = self.calendar.between(first, last.replace(year=last.year + 1, month=12, day=31))
        if not days:
            return None
        return pd.DataFrame({"holiday": "holiday", "ds": pd.to_datetime(sorted(days))})

    # ---------------------------------------------------------------- predict
    def _predict_one(
        self, f: _Fitted, horizon: pd.Timedelta, qs: tuple[float, ...]
    ) -> tuple[Series, pd.DatetimeIndex, np.ndarray]:
        z = np.array([NormalDist().inv_cdf(q) for q in qs])
        index = f.series.future_index(horizon)
        naive = _local_naive(index, self.timezone)
        # Prophet sorts its input by ds; local time can step back at a DST change, so sort
        # ourselves (stable) and put the rows back in UTC order afterwards.
        order = np.argsort(naive.to_numpy(), kind="stable")
        saved = np.random.get_state()  # Prophet samples its interval from NumPy's global RNG
        try:
            np.random.seed(self.random_state)
            with _quiet_prophet():
                out = f.model.predict(pd.DataFrame({"ds": naive[order]}))
        finally:
            np.random.set_state(saved)
        yhat, lower, upper = (np.empty(len(index)) for _ in range(3))
        yhat[order] = out["yhat"].to_numpy()
        lower[order] = out["yhat_lower"].to_numpy()
        upper[order] = out["yhat_upper"].to_numpy()
        sigma = np.clip((upper - lower) / (2 * Z80), 0.0, None)
        return f.series, index, yhat[:, None] + z[None, :] * sigma[:, None]
