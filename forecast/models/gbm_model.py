"""``gbm``: gradient-boosted quantile regression (scikit-learn) on calendar and weekly lags.

A direct model: the value at a target time ``t`` is regressed on what is known about ``t``
itself, never on the last observations before the forecast origin, so one model serves every
lead time. Features (local calendar of ``timezone``):

- slot of day: minutes since local midnight;
- day of week (0 = Monday);
- day type: working day / Saturday / Sunday or public holiday of ``holiday_country``
  (``idlegpu.forecast.calendar.day_types``);
- ``y(t - 7 days)`` and ``y(t - 14 days)`` on the regular grid (NaN where missing: scikit-learn's
  HistGradientBoosting learns where missing values go).

One ``HistGradientBoostingRegressor(loss="quantile")`` per quantile and series, trained on the
last ``max_days`` days (default 56; rows with a missing target dropped), deterministic
(``random_state``, no early stopping; the targets get a deterministic jitter of a millionth
of their scale to break ties, without which a series sitting at its minimum most of the time
gets a constant median). ``fit`` only stores the training data; each quantile's
model is trained on first use in ``predict`` and cached, so predicting other quantiles later
costs only the new ones. Training runs with ``threads`` OpenMP threads (default 1: on small
shared machines oversubscription slows it down tens of times; ``None`` leaves the limit alone).

Horizons beyond seven days: the future is filled week by week. For targets in the first week
after the origin both lags are observed; for later weeks a lag that falls after the origin takes
the model's own median (q0.5) forecast made for that time, so week 2 uses week 1's medians as
its ``t - 7 days`` lag, and so on (recursive by whole weeks). The median model is trained for
this even when 0.5 is not requested.

Quantiles are sorted, clipped to the series' bounds and stay continuous (no rounding). Separate
quantile models can under-cover (the 0.9 model is fitted on its training data only). Minimum
history: one day per series (``HistoryError`` below); a lag never observed in training (less
than one or two weeks of history) is left out and the model leans on the calendar. A series
constant over the training window is forecast as that constant, without training.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import day_types, wall_clock, wall_clock_lag
from idlegpu.forecast.errors import PermanentError
from idlegpu.forecast.models.base import (
    DAY,
    WEEK,
    Series,
    SeriesForecaster,
    require_span,
)

LAG_WEEKS = (1, 2)
FEATURES = ("slot_minutes", "day_of_week", "day_type", "lag_7d", "lag_14d")  # column order


@dataclass
class _Fitted:
    series: Series
    y: np.ndarray  # the stored tail of the series on its grid (NaN = missing)
    columns: np.ndarray  # the features used: lags never observed in training are left out
    x_train: np.ndarray
    y_train: np.ndarray
    constant: float | None  # a constant training target is predicted as is, without models
    models: dict[float, Any] = field(default_factory=dict)


def _import_hgb() -> Any:
    try:
        from sklearn.ensemble import HistGradientBoostingRegressor
    except ImportError as exc:
        raise PermanentError(
            "the gbm model needs the 'scikit-learn' package (an extra of the reference "
            "forecasters): pip install 'idlegpu[models]' "
            f"(import failed: {exc})"
        ) from exc
    return HistGradientBoostingRegressor


class GBMForecaster(SeriesForecaster):
    name = "gbm"

    def __init__(
        self,
        *,
        timezone: str = "UTC",
        holiday_country: str | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
        max_days: float = 56,
        max_iter: int = 150,
        learning_rate: float = 0.1,
        max_leaf_nodes: int = 31,
        min_samples_leaf: int = 20,
        random_state: int = 0,
        threads: int | None = 1,
    ) -> None:
        super().__init__(timezone=timezone, holiday_country=holiday_country, bounds=bounds)
        self.max_days = max_days
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state
        self.threads = threads

    # ---------------------------------------------------------------- fit
    def _setup(self) -> None:
        _import_hgb()  # fail early, before any series is fitted, when scikit-learn is missing

    def _fit_one(self, series: Series) -> _Fitted:
        window = pd.Timedelta(days=self.max_days)
        values = series.values
        train = values[values.index > series.last - window]
        require_span(series, train, DAY, self.name)
        # keep what the lags of the training rows need, and no more
        keep = values[values.index > series.last - window - max(LAG_WEEKS) * WEEK]
        y = keep.to_numpy(dtype=float)
        positions = np.arange(len(keep) - len(train), len(keep))
        x = self._features(keep.index[positions], y, positions, series.step)
        target = y[positions]
        ok = ~np.isnan(target)
        x, target = x[ok], target[ok]
        # a lag that is missing on every training row (less than a week of history) carries
        # nothing, and scikit-learn's binning fails on an all-NaN column: leave it out
        columns = np.flatnonzero(~np.isnan(x).all(axis=0))
        constant = float(target[0]) if np.ptp(target) == 0 else None
        # Break ties: with a plateau of equal values (replicas at their minimum most of the
        # day), scikit-learn's pinball gradient counts ties as "above", so a median equal to
        # the minimum gets identical gradients everywhere and no tree ever splits: the q0.5
        # model stays constant. A deterministic jitter a millionth of the scale unsticks it.
        scale = max(1.0, float(np.max(np.abs(target)))) if target.size else 1.0
        rng = np.random.default_rng(self.random_state)
        target = target + rng.uniform(-1e-6, 1e-6, target.size) * scale
        return _Fitted(series, y, columns, x[:, columns], target, constant)

    def _features(
        self, index: pd.DatetimeIndex, y: np.ndarray, positions: np.ndarray, step: pd.Timedelta
    ) -> np.ndarray:
        local = index.tz_convert(self.timezone)
        wall = wall_clock(index, self.timezone)
        slot = (wall - wall.normalize()) / pd.Timedelta(minutes=1)
        columns = [
            np.asarray(slot, dtype=float),
            np.asarray(local.day_of_week, dtype=float),
            np.asarray(day_types(index, self.timezone, self.calendar), dtype=float),
        ]
        origin = index[0] - int(positions[0]) * step  # the time of position 0
        for weeks in LAG_WEEKS:
            # the same wall-clock time ``weeks`` back (an hour more or less across a change
            # of summer time)
            source = wall_clock_lag(index, self.timezone, weeks * WEEK, origin, step)
            lag = np.full(len(positions), np.nan)
            inside = (source >= 0) & (source < len(y))
            lag[inside] = y[source[inside]]
            columns.append(lag)
        return np.column_stack(columns)

    def _model(self, f: _Fitted, q: float) -> Any:
        if q not in f.models:
            hgb = _import_hgb()
            model = hgb(
                loss="quantile",
                quantile=q,
                max_iter=self.max_iter,
                learning_rate=self.learning_rate,
                max_leaf_nodes=self.max_leaf_nodes,
                min_samples_leaf=self.min_samples_leaf,
                early_stopping=False,
                random_state=self.random_state,
            )
            with self._thread_limit():
                model.fit(f.x_train, f.y_train)
            f.models[q] = model
        return f.models[q]

    def _thread_limit(self) -> AbstractContextManager[object]:
        if self.threads is None:
            return nullcontext()
        from threadpoolctl import threadpool_limits  # a scikit-learn dependency

        return threadpool_limits(limits=self.threads)

    # ---------------------------------------------------------------- predict
    def _predict_one(self, f: _Fitted, horizon: pd.Timedelta, qs: tuple[float, ...]
                     ) -> tuple[Series, pd.DatetimeIndex, np.ndarray]:
        index = f.series.future_index(horizon)
        if f.constant is not None:
            return f.series, index, np.full((len(index), len(qs)), f.constant)
        n, steps = len(f.y), len(index)
        per_week = int(WEEK / f.series.step)
        y = np.concatenate([f.y, np.full(steps, np.nan)])
        median = self._model(f, 0.5)
        blocks = []
        with self._thread_limit():
            for start in range(0, steps, per_week):
                positions = np.arange(n + start, n + min(steps, start + per_week))
                x = self._features(index[positions - n], y, positions, f.series.step)
                x = x[:, f.columns]
                y[positions] = median.predict(x)  # the lags of the following weeks
                blocks.append(x)
            x_all = np.vstack(blocks)
            columns = [
                y[n:] if q == 0.5 else self._model(f, q).predict(x_all) for q in qs
            ]
        return f.series, index, np.column_stack(columns)
