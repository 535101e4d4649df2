"""What every forecaster shares: the protocol, the output format, series preparation.

A forecaster is fitted on a tidy history (every series in it) and predicts, for each series,
the next ``horizon`` of steps after the series' last timestamp as quantiles. Output is tidy:
``unique_id, ds, model, q0.5, q0.9, ...`` (one column per quantile, monotone in q).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self, runtime_checkable

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import HolidayCalendar
from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.schema import DS, UNIQUE_ID, Y

MODEL = "model"
SERVED_BY, SKILL = "served_by", "skill"  # what auto chose for a step, and its backtest skill
DEFAULT_QUANTILES = (0.5, 0.9, 0.95)
DAY = pd.Timedelta(days=1)
WEEK = pd.Timedelta(days=7)


def quantile_column(q: float) -> str:
    return f"q{q:g}"


def quantile_columns(quantiles: Iterable[float]) -> list[str]:
    return [quantile_column(q) for q in quantiles]


def validate_quantiles(quantiles: Sequence[float]) -> tuple[float, ...]:
    qs = tuple(sorted({float(q) for q in quantiles}))
    if not qs:
        raise ValueError("give at least one quantile, e.g. 0.5,0.9")
    bad = [q for q in qs if not 0.0 < q < 1.0]
    if bad:
        raise ValueError(f"quantiles must lie strictly between 0 and 1 (got {bad})")
    return qs


_HORIZON = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(min|m|h|d|w)\s*$")


def parse_horizon(text: str | pd.Timedelta) -> pd.Timedelta:
    """``"24h"``, ``"7d"``, ``"90min"``, ``"2w"`` -> Timedelta."""
    if isinstance(text, pd.Timedelta):
        return text
    match = _HORIZON.match(str(text))
    if not match:
        raise ValueError(f"horizon {text!r} not understood; use e.g. 90min, 24h, 7d or 2w")
    value, unit = float(match[1]), match[2]
    unit = {"m": "min", "w": "W", "d": "D"}.get(unit, unit)
    return pd.Timedelta(value, unit=unit)


@dataclass(frozen=True)
class Series:
    """One series on a regular grid; missing steps are NaN."""

    uid: str
    values: pd.Series  # indexed by UTC ds, regular step
    step: pd.Timedelta
    is_integer: bool
    lower: float
    upper: float

    @property
    def last(self) -> pd.Timestamp:
        return self.values.index[-1]

    def future_index(self, horizon: pd.Timedelta) -> pd.DatetimeIndex:
        steps = int(horizon / self.step)
        if steps < 1:
            raise ValueError(f"horizon {horizon} is shorter than the step {self.step}")
        return pd.date_range(self.last + self.step, periods=steps, freq=self.step)


def prepare_series(
    history: pd.DataFrame, bounds: dict[str, tuple[float, float]] | None = None
) -> list[Series]:
    """Split a validated history into regular series; refuse irregular steps clearly."""
    if history.empty:
        raise HistoryError("the history is empty")
    out = []
    for uid, group in history.groupby(UNIQUE_ID, sort=True, observed=True):
        values = group.set_index(DS)[Y].sort_index()
        if len(values) < 2:
            raise HistoryError(f"series {uid} has fewer than two samples; nothing to learn from")
        diffs = values.index.to_series().diff().dropna()
        step = diffs.min()
        if step < pd.Timedelta(minutes=1) or step > pd.Timedelta(hours=1):
            raise HistoryError(
                f"series {uid} has a step of {step}; forecasting supports 1 minute to 1 hour"
            )
        off_grid = ((diffs / step) % 1 != 0).sum()
        if off_grid or DAY % step != pd.Timedelta(0):
            raise HistoryError(
                f"series {uid} is irregular (step {step}, {int(off_grid)} samples off the grid); "
                "resample it to a regular step that divides a day, e.g. 5 min"
            )
        grid = pd.date_range(values.index[0], values.index[-1], freq=step)
        regular = values.reindex(grid)
        observed = values.to_numpy()
        is_integer = bool(np.all(observed == np.round(observed)))
        lo, hi = (bounds or {}).get(str(uid), (float(observed.min()), float(observed.max())))
        out.append(Series(str(uid), regular, step, is_integer, float(lo), float(hi)))
    return out


def finish_quantiles(
    point_quantiles: np.ndarray, series: Series, quantiles: Sequence[float], *, integer: bool
) -> np.ndarray:
    """Sort across quantiles (no crossing), respect bounds, and round integer series.

    Integer series (replica counts) get the largest integer at or below each quantile: for an
    integer quantity ``y <= x`` exactly when ``y <= floor(x)``, so rounding down keeps the
    coverage the quantile was calibrated for, where rounding up would only add GPUs held back.
    """
    arr = np.sort(point_quantiles, axis=1)
    if integer and series.is_integer:
        arr = np.floor(arr + 1e-6)
    return np.clip(arr, series.lower, series.upper)


def to_frame(
    uid: str, index: pd.DatetimeIndex, model: str, arr: np.ndarray, quantiles: Sequence[float]
) -> pd.DataFrame:
    frame = pd.DataFrame(arr, columns=quantile_columns(quantiles))
    frame.insert(0, MODEL, model)
    frame.insert(0, DS, index)
    frame.insert(0, UNIQUE_ID, uid)
    return frame


def require_span(
    series: Series, values: pd.Series, minimum: pd.Timedelta, model: str
) -> pd.Timedelta:
    """The span ``values`` (the used part of the series' history) covers; refuse the series
    when it is shorter than ``minimum``."""
    span = values.index[-1] - values.index[0] + series.step if len(values) else pd.Timedelta(0)
    if span < minimum:
        days = minimum / DAY
        need = f"{days:g} day{'s' if days != 1 else ''}" if days >= 1 else str(minimum)
        raise HistoryError(
            f"series {series.uid} covers {span}; the {model} model needs at least {need} "
            "of history"
        )
    return span


class SeriesForecaster:
    """Base of idlegpu's forecasters: every series is fitted and predicted on its own.

    Subclasses set ``name`` and implement ``_fit_one(series) -> state`` and
    ``_predict_one(state, horizon, quantiles) -> (series, future index, raw quantiles)``, the
    raw quantiles an array of steps x quantiles; ``predict`` finishes them (``finish_quantiles``:
    sorted, clipped to the bounds, rounded down on integer series when the class sets
    ``integer_quantiles``) and builds the tidy frame. ``_setup()`` may import their library
    once per fit, after the history is split into series and before any series is fitted, so a
    missing package fails before any model is computed.
    """

    name = "base"
    integer_quantiles = False  # round the quantiles of integer series (see finish_quantiles)

    def __init__(
        self,
        *,
        timezone: str = "UTC",
        holiday_country: HolidayCalendar | str | None = None,
        bounds: dict[str, tuple[float, float]] | None = None,
    ) -> None:
        self.timezone = timezone
        # a country code ("KR", "US-CA"), the pool's whole calendar, or None (no holidays)
        self.calendar = HolidayCalendar.of(holiday_country)
        self.holiday_country = self.calendar.country
        self.bounds = bounds

    def _setup(self) -> None:
        """Import heavy libraries lazily; called once per fit."""

    def _fit_one(self, series: Series) -> Any:
        raise NotImplementedError

    def _predict_one(
        self, state: Any, horizon: pd.Timedelta, qs: tuple[float, ...]
    ) -> tuple[Series, pd.DatetimeIndex, np.ndarray]:
        raise NotImplementedError

    def fit(self, history: pd.DataFrame) -> Self:
        series = prepare_series(history, self.bounds)
        self._setup()
        self.fitted_ = [self._fit_one(s) for s in series]
        return self

    def predict(self, horizon: pd.Timedelta | str, quantiles: Sequence[float]) -> pd.DataFrame:
        span = parse_horizon(horizon)
        qs = validate_quantiles(quantiles)
        frames = []
        for state in self.fitted_:
            series, index, arr = self._predict_one(state, span, qs)
            arr = finish_quantiles(arr, series, qs, integer=self.integer_quantiles)
            frames.append(to_frame(series.uid, index, self.name, arr, qs))
        return pd.concat(frames, ignore_index=True)


@runtime_checkable
class Forecaster(Protocol):
    """``fit(history) -> self``; ``predict(horizon, quantiles) -> tidy frame``."""

    name: str

    def fit(self, history: pd.DataFrame) -> Forecaster: ...

    def predict(self, horizon: pd.Timedelta | str, quantiles: Sequence[float]) -> pd.DataFrame: ...
