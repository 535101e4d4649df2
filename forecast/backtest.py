"""Rolling-origin backtests: refit at each cutoff on the past only, score against what happened.

A cutoff sees the history up to and including its own timestamp and nothing after it; the
forecast starts one step later. Metrics per model (and horizon):

* ``mae``: mean absolute error of the median (q0.5, when forecast);
* ``pinball_q``: pinball (quantile) loss of each quantile;
* ``coverage_q``: share of actuals at or below the q-quantile (should be about q);
* ``strict_coverage_q``: share of actuals strictly below it. For continuous series the two are
  equal. For integer series such as replica counts, exact ties are common (a quiet night sits
  at min replicas, and even a perfect forecast is met exactly), so a calibrated integer
  quantile has ``strict_coverage <= q <= coverage`` rather than coverage equal to q;
* per series (``series_calibration``), the verdict on each quantile: ``calibrated`` when
  ``strict_coverage <= q <= coverage`` (within ``tolerance``), else ``over-covers`` (GPUs
  held back that were free) or ``under-covers`` (GPUs promised that were not);
* window quality in GPU-hours, from the pool's free GPUs at a confidence: ``precision`` (of the
  GPU-hours promised free, the share that really were free) and ``recall`` (of the GPU-hours
  really free, the share that were promised).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import local_hour
from idlegpu.forecast.capacity import FREE, forecast_pool_usage, pool_usage, step_hours
from idlegpu.forecast.config import Settings
from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.models.base import MODEL, Forecaster, quantile_column, validate_quantiles
from idlegpu.forecast.schema import DS, UNIQUE_ID, Y

CUTOFF = "cutoff"
HORIZON = "horizon"


def daily_cutoffs(
    history: pd.DataFrame,
    *,
    timezone: str,
    hour: int = 18,
    days: int = 28,
    horizon: pd.Timedelta = pd.Timedelta(hours=24),
) -> list[pd.Timestamp]:
    """Each day at ``hour`` local time over the last ``days`` days whose horizon is observed."""
    first, last = history[DS].min(), history[DS].max()
    local_last = (last - horizon).tz_convert(timezone)
    day = local_last.date()
    if local_hour(day, hour, timezone) > local_last:
        day -= timedelta(days=1)
    cutoffs = [pd.Timestamp(local_hour(day - timedelta(days=k), hour, timezone)).tz_convert("UTC")
               for k in range(days)]
    cutoffs = sorted(c for c in cutoffs if c > first)
    if not cutoffs:
        raise HistoryError(
            f"the history ({first} to {last}) is too short for a {horizon} backtest"
        )
    return cutoffs


@dataclass(frozen=True)
class BacktestRun:
    forecasts: pd.DataFrame  # unique_id, ds, model, q..., cutoff, horizon, y
    seconds: dict[str, float]  # fit+predict seconds per model, summed over cutoffs


def backtest(
    history: pd.DataFrame,
    models: dict[str, Callable[[], Forecaster]],
    *,
    cutoffs: Sequence[pd.Timestamp],
    horizon: pd.Timedelta,
    quantiles: Sequence[float],
    on_step: Callable[[str, pd.Timestamp], None] | None = None,
) -> BacktestRun:
    """Fit a fresh model per cutoff on ``history[ds <= cutoff]``, forecast ``horizon``."""
    qs = validate_quantiles(quantiles)
    frames, seconds = [], {name: 0.0 for name in models}
    actual = history[[UNIQUE_ID, DS, Y]]
    for name, factory in models.items():
        for cutoff in cutoffs:
            past = history[history[DS] <= cutoff]
            started = time.perf_counter()
            forecast = factory().fit(past).predict(horizon, qs)
            seconds[name] += time.perf_counter() - started
            forecast[MODEL] = name  # two set-ups of one forecaster stay apart
            forecast[CUTOFF] = cutoff
            forecast[HORIZON] = horizon
            frames.append(forecast)
            if on_step:
                on_step(name, cutoff)
    forecasts = pd.concat(frames, ignore_index=True)
    forecasts[MODEL] = forecasts[MODEL].astype(str)
    forecasts = forecasts.merge(actual, on=[UNIQUE_ID, DS], how="left")
    return BacktestRun(forecasts, seconds)


def pinball(y: np.ndarray, pred: np.ndarray, q: float) -> float:
    diff = y - pred
    return float(np.mean(np.maximum(q * diff, (q - 1) * diff)))


def score(forecasts: pd.DataFrame, quantiles: Iterable[float]) -> pd.DataFrame:
    """Point and quantile metrics per model (rows) over every forecast with an actual."""
    rows = []
    scored = forecasts.dropna(subset=[Y])
    for model, group in scored.groupby(MODEL, sort=False):
        y = group[Y].to_numpy()
        row: dict[str, float | str | int] = {MODEL: model, "points": len(y)}
        if quantile_column(0.5) in group:
            row["mae"] = float(np.mean(np.abs(y - group[quantile_column(0.5)].to_numpy())))
        for q in quantiles:
            pred = group[quantile_column(q)].to_numpy()
            row[f"pinball_{q:g}"] = pinball(y, pred, q)
            row[f"coverage_{q:g}"] = float(np.mean(y <= pred + 1e-9))
            row[f"strict_coverage_{q:g}"] = float(np.mean(y < pred - 1e-9))
        rows.append(row)
    return pd.DataFrame(rows).set_index(MODEL)


CALIBRATED, OVER, UNDER = "calibrated", "over-covers", "under-covers"


def verdict(coverage: float, strict_coverage: float, q: float, tolerance: float = 0.02) -> str:
    """``calibrated`` when ``strict_coverage <= q <= coverage`` up to ``tolerance`` (sampling
    noise; on a continuous series the two coverages are equal), ``over-covers`` when even the
    strict coverage is above ``q``, ``under-covers`` when the coverage is below it."""
    if strict_coverage > q + tolerance:
        return OVER
    if coverage < q - tolerance:
        return UNDER
    return CALIBRATED


def series_calibration(
    forecasts: pd.DataFrame, quantiles: Iterable[float], *, tolerance: float = 0.02
) -> pd.DataFrame:
    """Per model and series: points, and per quantile the coverage, strict coverage and
    verdict (``verdict``), over every forecast with an actual."""
    rows = []
    scored = forecasts.dropna(subset=[Y])
    for (model, uid), group in scored.groupby([MODEL, UNIQUE_ID], sort=True, observed=True):
        y = group[Y].to_numpy()
        row: dict[str, float | str | int] = {MODEL: model, UNIQUE_ID: uid, "points": len(y)}
        for q in quantiles:
            pred = group[quantile_column(q)].to_numpy()
            plain = float(np.mean(y <= pred + 1e-9))
            strict = float(np.mean(y < pred - 1e-9))
            row[f"coverage_{q:g}"] = plain
            row[f"strict_coverage_{q:g}"] = strict
            row[f"verdict_{q:g}"] = verdict(plain, strict, q, tolerance)
        rows.append(row)
    return pd.DataFrame(rows)


def window_quality(
    forecasts: pd.DataFrame, history: pd.DataFrame, settings: Settings, confidence: float
) -> pd.DataFrame:
    """Per model: GPU-hours promised free at ``confidence``, really free, precision, recall."""
    actual_free = pool_usage(history, settings)[FREE]
    step_h = step_hours(actual_free)
    rows = []
    for model, group in forecasts.groupby(MODEL, sort=False):
        promised = kept = available = 0.0
        for _, one in group.groupby(CUTOFF):
            free = forecast_pool_usage(one, settings, confidence)[FREE]
            real = actual_free.reindex(free.index)
            seen = real.notna() & free.notna()
            promised += float(free[seen].sum() * step_h)
            kept += float(np.minimum(free[seen], real[seen]).sum() * step_h)
            available += float(real[seen].sum() * step_h)
        rows.append(
            {
                MODEL: model,
                "promised_gpu_hours": promised,
                "kept_gpu_hours": kept,
                "free_gpu_hours": available,
                "precision": kept / promised if promised else float("nan"),
                "recall": kept / available if available else float("nan"),
            }
        )
    return pd.DataFrame(rows).set_index(MODEL)
