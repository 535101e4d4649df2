"""One forecast refresh, shared by the daemon, the simulator and ``idlegpu plan``.

A refresh scores what the forecasts in use promised over the last week against the replicas
that really ran (``idlegpu.scheduler.coverage``), plans every service whose forecasts covered less
than promised by more than chance with a wider quantile (q0.98) until it recovers, forecasts
the pool from the history before ``now`` and keeps what this forecast promises for the next
refreshes to score. A ``Refresher`` remembers the promises of its refreshes; one without any
(a daemon just started, a one-off ``plan``) first makes the forecasts the refreshes of the last
week would have made, from the history before each, so it judges from its first refresh on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd

from idlegpu.forecast.calendar import local_hour
from idlegpu.forecast.errors import HistoryError
from idlegpu.forecast.models import CACHED_MODELS
from idlegpu.forecast.schema import DS, REPLICAS, metric_rows
from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.coverage import (
    WIDENED,
    WINDOW,
    Promise,
    ServiceCoverage,
    planned_quantiles,
    promise_of,
    score,
)
from idlegpu.scheduler.replay import (
    MadeForecasts,
    forecast_free,
    forecast_pool_free,
    pool_free,
    profile_of,
)
from idlegpu.scheduler.types import FreeProfile


@dataclass(frozen=True)
class Refresh:
    made_at: datetime
    free: pd.Series  # free GPUs per step at the planned quantiles
    profile: FreeProfile
    promise: Promise  # what this forecast promises, at the confidence, per service
    coverage: Mapping[str, ServiceCoverage]  # how the forecasts in use fared, per service
    forecast: pd.DataFrame  # the replica forecast: unique_id, ds, model, q0.5, q0.9, ...
    likely: pd.Series | None = None  # the pool's median free GPUs per step (two curves)

    @property
    def widened(self) -> dict[str, float]:
        """The services planned with a wider quantile, and that quantile."""
        return planned_quantiles(self.coverage)

    def warnings(self) -> list[str]:
        """One line per widened service."""
        return [c.describe() for c in self.coverage.values() if c.widened]


class Refresher:
    """Forecast refreshes that remember what they promised (see the module).

    ``refresh_hour``: the local hour of the nightly refresh, where the backfill places the
    refreshes of the last week; ``widened``: the quantile a service that under-covers is
    planned with; ``options`` go to the model (the ``auto`` cache of the simulator);
    ``forecasts``: the replica forecasts made ahead, elsewhere (the simulator's refits in
    worker processes, ``idlegpu.scheduler.simulate.fits``), instead of fitting here."""

    def __init__(self, settings: Settings, *, horizon: timedelta = timedelta(hours=48),
                 model: str = "auto", refresh_hour: int | None = None,
                 widened: float = WIDENED, window: timedelta = WINDOW,
                 forecasts: MadeForecasts | None = None, **options) -> None:
        self.settings = settings
        self.forecasts = forecasts
        self.horizon = horizon
        self.model = model
        self.refresh_hour = (settings.daemon.forecast_refresh_hour if refresh_hour is None
                             else refresh_hour)
        self.widened = widened
        self.window = window
        self.options = options
        self.promises: list[Promise] = []

    def refresh(self, history: pd.DataFrame, now: datetime) -> Refresh:
        """Score the promises in use, then forecast from the history before ``now``."""
        replicas = metric_rows(history, REPLICAS)
        if not self.promises:
            # the backfill's fits share a cache of their own: reused replays keep the decay
            # rate of the fit that made them, so the forecast in use stays what it would be
            own = {**self.options, "cache": {}} if self.model in CACHED_MODELS else self.options
            self.backfill(replicas, now, **own)
        confidence = self.settings.admission.confidence
        services = self.settings.service_names
        coverage = score(self.promises, replicas, now, services, target=confidence,
                         widened=self.widened, window=self.window)
        quantiles = planned_quantiles(coverage)
        free, likely, forecast = forecast_pool_free(
            replicas, self.settings, now, horizon=self.horizon, model=self.model,
            quantiles=quantiles, forecasts=self.forecasts, **self.options)
        promise = promise_of(forecast, now, services, confidence)
        self._keep(promise, now)
        return Refresh(now, free, profile_of(free, confidence, now, likely), promise, coverage,
                       forecast, likely)

    def profiles_for(self, refresh: Refresh, history: pd.DataFrame,
                     pools: Sequence[Settings]) -> list[FreeProfile]:
        """``refresh``'s profile for each of ``pools``, the same pool but for its size or
        headroom (``same_forecasts``): the replica forecast is reused, the pool's free GPUs
        recomputed, with the same widened services."""
        if not all(same_forecasts(self.settings, pool) for pool in pools):
            raise ValueError("a pool variant may change the pool's size and headroom only (its "
                             "services, admission and time zone forecast and score alike)")
        replicas = metric_rows(history, REPLICAS)
        past = replicas[replicas[DS] < pd.Timestamp(refresh.made_at)]
        quantiles = planned_quantiles(refresh.coverage)
        profiles = []
        for pool in pools:
            free, likely = pool_free(refresh.forecast, past, pool, horizon=self.horizon,
                                     quantiles=quantiles)
            profiles.append(profile_of(free, pool.admission.confidence, refresh.made_at,
                                       likely))
        return profiles

    def backfill(self, replicas: pd.DataFrame, now: datetime, **options) -> None:
        """Make the forecasts of the nightly refreshes over the last ``window`` (each from
        the history before it, ``options`` to the model) and keep their promises."""
        confidence = self.settings.admission.confidence
        for moment in self.backfill_moments(replicas, now):
            try:
                _, forecast = forecast_free(replicas, self.settings, moment,
                                            horizon=self.horizon, model=self.model,
                                            forecasts=self.forecasts, **options)
            except HistoryError:  # too little history then: that evening has no promise
                continue
            self._keep(promise_of(forecast, moment, self.settings.service_names, confidence),
                       now)

    def backfill_moments(self, replicas: pd.DataFrame, now: datetime) -> list[datetime]:
        """The nightly refreshes over the last ``window`` before ``now`` that ``backfill``
        makes the forecasts of, in time order (those a day into the history on)."""
        tz = self.settings.pool.timezone
        local = pd.Timestamp(now).tz_convert(tz)
        day = local.date()
        if local_hour(day, self.refresh_hour, tz) >= local:
            day -= timedelta(days=1)
        at = pd.Timestamp(local_hour(day, self.refresh_hour, tz))
        first = replicas[DS].min() if len(replicas) else None
        moments = []
        while first is not None and at >= local - self.window and at - pd.Timedelta(days=1) > first:
            moments.append(at.tz_convert("UTC").to_pydatetime())
            day -= timedelta(days=1)
            at = pd.Timestamp(local_hour(day, self.refresh_hour, tz))
        return sorted(moments)

    def _keep(self, promise: Promise, now: datetime) -> None:
        self.promises.append(promise)
        oldest = pd.Timestamp(now) - pd.Timedelta(self.window) - pd.Timedelta(self.horizon)
        self.promises = [p for p in self.promises if pd.Timestamp(p.made_at) >= oldest]


def same_forecasts(settings: Settings, other: Settings) -> bool:
    """Whether ``other`` forecasts, scores and widens exactly as ``settings`` does: the same
    services, admission and forecast settings and time zone and calendar (the pool's size
    and headroom may differ)."""
    keep = ("total_gpus", "headroom_gpus", "nodes")
    mine, theirs = (s.pool.model_dump(exclude=set(keep)) for s in (settings, other))
    rest = [name for name in type(settings).model_fields if name != "pool"]
    return mine == theirs and all(getattr(settings, n) == getattr(other, n) for n in rest)


__all__ = ["Refresh", "Refresher", "same_forecasts"]
