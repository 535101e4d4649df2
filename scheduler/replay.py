"""Replaying recorded history as if it were live: signals and forecasts as of a past moment.

``idlegpu run --once --now T --history H`` uses these to run one real controller pass against
the pool as it was at ``T`` (audits, demos on the sample data, tests).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from forecast.capacity import FREE, forecast_pool_usage
from forecast.config import Settings
from forecast.schema import DS, KV_CACHE_USAGE, REPLICAS, REQUESTS_WAITING, UNIQUE_ID, Y
from scheduler.types import FreeProfile, ServingSignals


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
        self.wide = history.pivot(index=DS, columns=UNIQUE_ID, values=Y).sort_index()
        steps = self.wide.index.to_series().diff().dropna()
        self.step = steps.median() if len(steps) else pd.Timedelta(0)

    def read(self, now: datetime, *, job_gpus: int = 0) -> ServingSignals:
        upto = self.wide[self.wide.index <= pd.Timestamp(now)]
        if upto.empty:
            return ServingSignals(observed_at=None)
        at = upto.index[-1]
        if pd.Timestamp(now) - at > self.max_age:
            return ServingSignals(observed_at=None)
        observed = now if pd.Timestamp(now) - at < self.step else at.to_pydatetime()
        row = upto.iloc[-1]
        kv = waiting = 0.0
        held = 0.0
        for service in self.settings.services:
            replicas = row.get(f"{service.name}/{REPLICAS}")
            if replicas is None or pd.isna(replicas):
                return ServingSignals(observed_at=None)  # never read a gap as "no load"
            held += replicas * service.gpus_per_replica
            if replicas < service.max_replicas:
                kv = max(kv, float(row.get(f"{service.name}/{KV_CACHE_USAGE}", 0.0) or 0.0))
                w = row.get(f"{service.name}/{REQUESTS_WAITING}", 0.0) or 0.0
                waiting = max(waiting, float(w) / max(1.0, float(replicas)))
        idle = int(max(0.0, self.settings.pool.total_gpus - held - job_gpus))
        return ServingSignals(observed_at=observed, requests_waiting_per_replica=waiting,
                              kv_cache_usage=kv, idle_gpus=idle)


def forecast_profile(history: pd.DataFrame, settings: Settings, now: datetime, *,
                     horizon: timedelta = timedelta(hours=48), model: str = "auto",
                     **options) -> FreeProfile:
    """The free-GPU profile at the configured confidence, fitted on the history before ``now``
    (``options`` go to the model, e.g. the ``auto`` cache shared by nightly refits)."""
    from forecast.models import model_for

    replicas = history[history[UNIQUE_ID].str.endswith("/" + REPLICAS)]
    past = replicas[replicas[DS] < pd.Timestamp(now)]
    confidence = settings.admission.confidence
    forecast = model_for(model, settings, **options).fit(past).predict(
        pd.Timedelta(horizon), sorted({0.5, confidence})
    )
    free = forecast_pool_usage(forecast, settings, confidence)[FREE]
    return FreeProfile(free.index[0].to_pydatetime(),
                       int((free.index[1] - free.index[0]).total_seconds()),
                       free.to_numpy(dtype=float), confidence, pd.Timestamp(now).to_pydatetime())


__all__ = ["HistorySignals", "forecast_profile"]
