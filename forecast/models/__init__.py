"""Forecasters of every series of a history, behind one protocol.

``make_model(name, ...)`` builds one by name: ``auto`` (ours, the default: a choice per series
among simple candidates by backtest), ``curve`` (the day-type curve, one of them),
``seasonal_naive``, ``prophet``, ``statsmodels`` (MSTL) and ``gbm`` (scikit-learn quantile
gradient boosting).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

import pandas as pd

from idlegpu.forecast.calendar import HolidayCalendar
from idlegpu.forecast.config import Settings
from idlegpu.forecast.models.base import (
    DEFAULT_QUANTILES,
    MODEL,
    SERVED_BY,
    SKILL,
    Forecaster,
    parse_horizon,
    quantile_column,
    quantile_columns,
    validate_quantiles,
)
from idlegpu.forecast.schema import DS, REPLICAS, UNIQUE_ID, series_id

# name -> (module, class); heavy libraries load only when their model is used
MODELS = {
    "auto": ("idlegpu.forecast.models.auto", "AutoForecaster"),
    "curve": ("idlegpu.forecast.models.curve", "CurveForecaster"),
    "seasonal_naive": ("idlegpu.forecast.models.naive", "SeasonalNaiveForecaster"),
    "prophet": ("idlegpu.forecast.models.prophet_model", "ProphetForecaster"),
    "statsmodels": ("idlegpu.forecast.models.mstl_model", "MSTLForecaster"),
    "gbm": ("idlegpu.forecast.models.gbm_model", "GBMForecaster"),
}
MODEL_NAMES = tuple(MODELS)
# the models whose refits on growing prefixes of one history share a cache (the simulator's
# and the reports' nightly refits)
CACHED_MODELS = ("auto", "curve")


def make_model(
    name: str,
    *,
    timezone: str = "UTC",
    holiday_country: HolidayCalendar | str | None = None,
    bounds: dict[str, tuple[float, float]] | None = None,
    **options: Any,
) -> Forecaster:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    module, cls = MODELS[name]
    factory = getattr(import_module(module), cls)
    return factory(timezone=timezone, holiday_country=holiday_country, bounds=bounds, **options)


def served_summary(forecast: pd.DataFrame) -> pd.DataFrame:
    """Per series of a forecast: what served it (``auto``'s choices in the order of lead time,
    "median_7d+now -> curve") and the mean backtest skill of those choices against the better
    seasonal naive over its steps; empty when the forecast does not say (other models)."""
    columns = [UNIQUE_ID, SERVED_BY, SKILL]
    if SERVED_BY not in forecast.columns or forecast.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for uid, group in forecast.sort_values(DS).groupby(UNIQUE_ID, sort=True, observed=True):
        labels = list(dict.fromkeys(str(v) for v in group[SERVED_BY]))
        rows.append({UNIQUE_ID: str(uid), SERVED_BY: " -> ".join(labels),
                     SKILL: float(group[SKILL].mean()) if SKILL in group else float("nan")})
    return pd.DataFrame(rows, columns=columns)


def replica_bounds(settings: Settings) -> dict[str, tuple[float, float]]:
    """The autoscaler's min/max replicas per replica series."""
    return {
        series_id(s.name, REPLICAS): (float(s.min_replicas), float(s.max_replicas))
        for s in settings.services
    }


def model_for(name: str, settings: Settings | None, **options: Any) -> Forecaster:
    """A model set up with the pool's time zone, holiday calendar (public holidays of
    ``holiday_country``/``holiday_subdivision`` plus ``custom_holidays``) and replica bounds."""
    if settings is None:
        return make_model(name, **options)
    return make_model(
        name,
        timezone=settings.pool.timezone,
        holiday_country=settings.pool.calendar,
        bounds=replica_bounds(settings),
        **options,
    )


__all__ = [
    "CACHED_MODELS",
    "DEFAULT_QUANTILES",
    "MODEL",
    "MODELS",
    "MODEL_NAMES",
    "SERVED_BY",
    "SKILL",
    "Forecaster",
    "make_model",
    "model_for",
    "parse_horizon",
    "quantile_column",
    "quantile_columns",
    "replica_bounds",
    "served_summary",
    "validate_quantiles",
]
