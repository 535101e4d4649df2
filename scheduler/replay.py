"""Replaying recorded history as if it were live: signals and forecasts as of a past moment.

``idlegpu run --once --now T --history H`` uses these to run one real controller pass against
the pool as it was at ``T`` (audits, demos on the sample data, tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from idlegpu.forecast.capacity import FREE
from idlegpu.forecast.models import model_for
from idlegpu.forecast.scenarios import FREE_MEDIAN, forecast_levels, pool_forecast_usage
from idlegpu.forecast.schema import (
    DS,
    KV_CACHE_USAGE,
    REPLICAS,
    REQUESTS_WAITING,
    UNIQUE_ID,
    Y,
    metric_rows,
    series_id,
)
from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.types import FreeProfile, ServingSignals

SERVICE_GPUS = "service_gpus"
WAITING_PER_REPLICA = "requests_waiting_per_replica"


def serving_pressure(wide: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    """Per row of ``wide`` (the history pivoted to one column per series id): the services'
    ``kv_cache_usage`` and ``requests_waiting_per_replica`` as the live adapter aggregates
    them, and the GPUs they hold (``service_gpus``, NaN where a replica count is unknown).

    Pressure only counts for services that can still scale up (below their max replicas):
    more GPUs do nothing for a service at its maximum. Each is the worst over those services
    (0 when none has a sample)."""
    kv, waiting, gpus = [], [], []
    for service in settings.services:
        replicas = wide.get(series_id(service.name, REPLICAS))
        if replicas is None:
            gpus.append(pd.Series(np.nan, index=wide.index))
            continue
        gpus.append(replicas * service.gpus_per_replica)
        can_grow = replicas < service.max_replicas
        kv_id = series_id(service.name, KV_CACHE_USAGE)
        if kv_id in wide:
            kv.append(wide[kv_id].where(can_grow, 0.0))
        waiting_id = series_id(service.name, REQUESTS_WAITING)
        if waiting_id in wide:
            waiting.append((wide[waiting_id] / replicas.clip(lower=1)).where(can_grow, 0.0))

    def worst(parts: list[pd.Series]) -> pd.Series:
        if not parts:
            return pd.Series(0.0, index=wide.index)
        return pd.concat(parts, axis=1).max(axis=1).fillna(0.0)

    return pd.DataFrame({
        KV_CACHE_USAGE: worst(kv),
        WAITING_PER_REPLICA: worst(waiting),
        SERVICE_GPUS: pd.concat(gpus, axis=1).sum(axis=1, min_count=len(gpus)),
    }, index=wide.index)


class HistorySignals:
    """The SignalSource of a recorded history: the newest samples at or before ``now``.

    Like the live adapter, pressure only counts for services that can still scale up (below
    their max replicas), and samples older than ``max_age`` make the signals missing. A sample
    stands for its whole recording step: read within one step of it, the signals count as
    read ``now`` (a 5-minute recording is as fresh as it can be); later they show their age.
    """

    def __init__(self, history: pd.DataFrame, settings: Settings, *,
                 max_age: timedelta = timedelta(minutes=10)) -> None:
        self.settings = settings
        self.max_age = max_age
        wide = history.pivot(index=DS, columns=UNIQUE_ID, values=Y).sort_index()
        self.pressure = serving_pressure(wide, settings)
        steps = wide.index.to_series().diff().dropna()
        self.step = steps.median() if len(steps) else pd.Timedelta(0)

    def read(self, now: datetime, *, job_gpus: int = 0) -> ServingSignals:
        upto = self.pressure[self.pressure.index <= pd.Timestamp(now)]
        if upto.empty:
            return ServingSignals(observed_at=None)
        at = upto.index[-1]
        if pd.Timestamp(now) - at > self.max_age:
            return ServingSignals(observed_at=None)
        row = upto.iloc[-1]
        if pd.isna(row[SERVICE_GPUS]):
            return ServingSignals(observed_at=None)  # never read a gap as "no load"
        observed = now if pd.Timestamp(now) - at < self.step else at.to_pydatetime()
        idle = int(max(0.0, self.settings.pool.total_gpus - row[SERVICE_GPUS] - job_gpus))
        return ServingSignals(observed_at=observed,
                              requests_waiting_per_replica=float(row[WAITING_PER_REPLICA]),
                              kv_cache_usage=float(row[KV_CACHE_USAGE]), idle_gpus=idle,
                              service_gpus=int(round(row[SERVICE_GPUS])))


MadeForecasts = Callable[[pd.DataFrame, datetime, pd.Timedelta, list[float]], pd.DataFrame]
"""A replica forecast made ahead: ``(past, now, horizon, levels) -> tidy forecast``, the same
frame ``model_for(...).fit(past).predict(horizon, levels)`` gives."""


def free_forecast(history: pd.DataFrame, settings: Settings, now: datetime, *,
                  horizon: timedelta = timedelta(hours=48), model: str = "auto",
                  **options) -> pd.Series:
    """Free GPUs per step at the configured confidence, forecast from the history before
    ``now`` (``options`` go to the model, e.g. the ``auto`` cache shared by nightly refits;
    see ``forecast_free``)."""
    return forecast_free(history, settings, now, horizon=horizon, model=model, **options)[0]


def forecast_free(history: pd.DataFrame, settings: Settings, now: datetime, *,
                  horizon: timedelta = timedelta(hours=48), model: str = "auto",
                  quantiles: Mapping[str, float] | None = None,
                  forecasts: MadeForecasts | None = None,
                  **options) -> tuple[pd.Series, pd.DataFrame]:
    """Free GPUs per step and the replica forecast they come from (``forecast_pool_free``
    without the median)."""
    free, _, forecast = forecast_pool_free(history, settings, now, horizon=horizon,
                                           model=model, quantiles=quantiles,
                                           forecasts=forecasts, **options)
    return free, forecast


def forecast_pool_free(history: pd.DataFrame, settings: Settings, now: datetime, *,
                       horizon: timedelta = timedelta(hours=48), model: str = "auto",
                       quantiles: Mapping[str, float] | None = None,
                       forecasts: MadeForecasts | None = None,
                       **options) -> tuple[pd.Series, pd.Series, pd.DataFrame]:
    """Free GPUs per step (promised), the pool's median free GPUs per step (likely, never
    below the promise) and the replica forecast they come from, fitted on the replicas
    before ``now``: every service at the configured confidence, those in ``quantiles`` at
    their own (a service planned wider, ``idlegpu.scheduler.refresh``).

    Each series is forecast from its own newest sample. A service whose replicas stopped
    being recorded earlier than the others (a metrics gap) is forecast that much further, so
    it still covers the horizon, but by no more than ``max_forecast_age`` (no forecast is
    trusted older than that): beyond, the pool's free GPUs are NaN, a hole the policy admits
    nothing into.

    ``forecasts``: where the replica forecast was made ahead (the simulator's refits in
    worker processes): asked for the forecast of ``past`` at ``now`` over the horizon (the
    lag included) at the levels, in place of fitting ``model`` here."""
    replicas = metric_rows(history, REPLICAS)
    past = replicas[replicas[DS] < pd.Timestamp(now)]
    lag, _ = _forecast_lag(past, settings)
    levels = forecast_levels(settings, settings.admission.confidence,
                             list((quantiles or {}).values()))
    if forecasts is not None:
        forecast = forecasts(past, now, pd.Timedelta(horizon) + lag, levels)
    else:
        forecast = model_for(model, settings, **options).fit(past).predict(
            pd.Timedelta(horizon) + lag, levels)
    free, likely = pool_free(forecast, past, settings, horizon=horizon, quantiles=quantiles)
    return free, likely, forecast


def pool_free(forecast: pd.DataFrame, past: pd.DataFrame, settings: Settings, *,
              horizon: timedelta = timedelta(hours=48),
              quantiles: Mapping[str, float] | None = None) -> tuple[pd.Series, pd.Series]:
    """The pool's promised and median free GPUs per step (``forecast_pool_free``) from a
    replica forecast already made on the replicas ``past``: the same forecast serves pools
    that differ only in their size and headroom (a what-if), without a refit."""
    pool = pool_forecast_usage(forecast, settings, settings.admission.confidence, past,
                               quantiles)
    lag, newest = _forecast_lag(past, settings)
    if lag > pd.Timedelta(0):
        pool = pool[pool.index <= newest + pd.Timedelta(horizon)]  # the freshest series'
    return pool[FREE], pool[FREE_MEDIAN]


def _forecast_lag(past: pd.DataFrame, settings: Settings) -> tuple[pd.Timedelta, object]:
    """How much further than the horizon to forecast (a service whose replicas stopped being
    recorded before the others', up to ``max_forecast_age``), and the newest sample."""
    if past.empty:
        return pd.Timedelta(0), None
    ends = past.groupby(UNIQUE_ID, observed=True)[DS].max()
    newest = ends.max()
    return min(newest - ends.min(),
               pd.Timedelta(seconds=settings.admission.max_forecast_age_seconds)), newest


def profile_of(free: pd.Series, confidence: float, made_at: datetime,
               likely: pd.Series | None = None) -> FreeProfile:
    """The policy's view of a free-GPU forecast (a Series on a regular UTC index).

    A forecast starts one step after the newest sample, which can be after ``made_at`` (a
    sample at 17:00 read at 17:00:14 gives a forecast from 17:05): the step holding
    ``made_at`` then takes the first forecast step's value, so a pass right after a refresh
    is not left without a forecast for up to a step (new jobs are capped by the live signals
    for their first hour anyway).

    A forecast can also start before ``made_at``: a service whose replicas stopped being
    recorded (a metrics gap) is forecast from its last sample, and the pool's free GPUs are
    NaN wherever a service is not forecast. Steps before the one holding ``made_at`` are the
    past and are dropped; NaN left in the profile are holes the policy admits nothing into.
    ``likely``: the median free GPUs on the same index (``forecast_pool_free``), aligned
    alike."""
    step = free.index[1] - free.index[0]
    start = free.index[0]
    made = pd.Timestamp(made_at)
    rows = [free.to_numpy(dtype=float)]
    if likely is not None:
        rows.append(likely.reindex(free.index).to_numpy(dtype=float))
    if start > made:
        missing = int(-(-(start - made) // step))  # steps from the one holding made_at
        rows = [np.concatenate([np.full(missing, v[0]), v]) for v in rows]
        start -= missing * step
    elif made - start >= step:
        past = int((made - start) // step)  # steps wholly before the one holding made_at
        rows = [v[past:] if past < len(v) else np.full(1, np.nan) for v in rows]
        start += past * step
    return FreeProfile(start.to_pydatetime(), int(step.total_seconds()), rows[0], confidence,
                       made.to_pydatetime(), likely=rows[1] if len(rows) > 1 else None)


def forecast_profile(history: pd.DataFrame, settings: Settings, now: datetime, *,
                     horizon: timedelta = timedelta(hours=48), model: str = "auto",
                     **options) -> FreeProfile:
    """The free-GPU profile at the configured confidence, fitted on the history before
    ``now`` (see ``free_forecast``)."""
    free = free_forecast(history, settings, now, horizon=horizon, model=model, **options)
    return profile_of(free, settings.admission.confidence, now)


__all__ = ["HistorySignals", "MadeForecasts", "forecast_free", "forecast_profile",
           "free_forecast", "profile_of", "serving_pressure"]
