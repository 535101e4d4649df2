"""The free-GPU profiles the ``forecast`` policy plans on: the daemon's evening refresh replayed
over the simulated span, each refit seeing only the history before it."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from idlegpu.scheduler.config import Settings
from idlegpu.forecast.models import CACHED_MODELS
from idlegpu.forecast.schema import REPLICAS, metric_rows
from idlegpu.scheduler.refresh import Refresher, same_forecasts
from idlegpu.scheduler.replay import MadeForecasts
from idlegpu.scheduler.simulate.fits import fit_plan, made_in_workers, per_series
from idlegpu.scheduler.types import FreeProfile


def _latest(profiles: dict[datetime, FreeProfile] | None, now: datetime,
            made: Sequence[datetime] | None = None) -> FreeProfile | None:
    """The newest of ``profiles`` made by ``now``. ``made``: their times in order, where the
    caller keeps them (a simulation asks every step: a bisection, not a scan of them all)."""
    if not profiles:
        return None
    made = sorted(profiles) if made is None else made
    newest = bisect_right(made, now)
    return profiles[made[newest - 1]] if newest else None


FORECAST_MODEL = "auto"  # the model the forecast policy's refreshes fit, as the daemon's
HORIZON = timedelta(hours=48)  # how far they forecast
REFRESH_HOUR = 17  # the local hour of the evening refresh


def forecast_profiles_for(history: pd.DataFrame, settings: Settings, index: pd.DatetimeIndex,
                          refresh_hour: int, horizon: timedelta, **options
                          ) -> dict[datetime, FreeProfile]:
    """The free-GPU profiles the ``forecast`` policy sees: one per evening (and one at the
    start), each fitted only on the history before it, by the daemon's refresh
    (``idlegpu.scheduler.refresh``: a service whose forecasts in use covered less than promised over
    the last week is planned with a wider quantile). ``options``: ``model``, ``on_refresh``,
    ``cache``, ``forecasts`` and ``workers``, as ``pool_profiles_for`` takes them."""
    return pool_profiles_for(history, settings, (), index, refresh_hour, horizon,
                             **options)[0]


def refresh_moments(index: pd.DatetimeIndex, settings: Settings, refresh_hour: int
                    ) -> list[datetime]:
    """The forecast policy's refreshes over the simulated steps ``index``: at its start and
    each evening at ``refresh_hour`` (the pool's local time)."""
    local = index.tz_convert(settings.pool.timezone)
    at = sorted({index[0], *index[(local.hour == refresh_hour) & (local.minute == 0)]})
    return [moment.to_pydatetime() for moment in at]


def pool_profiles_for(
    history: pd.DataFrame,
    settings: Settings,
    pools: Sequence[Settings],
    index: pd.DatetimeIndex,
    refresh_hour: int,
    horizon: timedelta,
    *,
    model: str = FORECAST_MODEL,
    on_refresh: Callable[[int, int], None] | None = None,
    cache: dict | None = None,
    forecasts: MadeForecasts | None = None,
    workers: int = 1,
) -> list[dict[datetime, FreeProfile]]:
    """``forecast_profiles_for`` of ``settings``, then of each of ``pools`` (the same pool
    but for its size and headroom, ``refresh.same_forecasts``) from the same refits: a what-if
    on the pool's size costs the pool arithmetic of each evening, not a refit.

    ``workers``: the refits are made ahead in that many processes, a group of services each
    (``idlegpu.scheduler.simulate.fits``: the same profiles), unless a ``cache`` of earlier
    refits is given to reuse; ``forecasts``: refits already made so (the refreshes then read
    them instead of fitting)."""
    for n, pool in enumerate(pools):
        if not same_forecasts(settings, pool):
            raise ValueError(f"pools[{n}] changes more than the pool's size and headroom; "
                             "forecast it with forecast_profiles_for")
    # the nightly refits only read replicas: filter the history once, not at every refit
    replicas = metric_rows(history, REPLICAS)
    refresh = refresh_moments(index, settings, refresh_hour)
    ahead = 0
    if forecasts is None and cache is None and workers > 1 and per_series(model):
        probe = Refresher(settings, horizon=horizon, model=model, refresh_hour=refresh_hour)
        plan = fit_plan(replicas, settings, probe, refresh)
        ahead = len(plan)

        def fitted(done: int, total: int) -> None:
            if on_refresh:
                on_refresh(done, ahead + len(refresh))

        forecasts = made_in_workers(replicas, settings, plan, model, workers, on_fit=fitted)
    # the refits see growing prefixes of one history: reuse their work
    cache = {} if cache is None else cache
    options: dict[str, Any] = {"cache": cache} if model in CACHED_MODELS else {}
    refresher = Refresher(settings, horizon=horizon, model=model, refresh_hour=refresh_hour,
                          forecasts=forecasts, **options)
    profiles: list[dict[datetime, FreeProfile]] = [{} for _ in range(1 + len(pools))]
    for n, at in enumerate(refresh):
        made = refresher.refresh(replicas, at)
        theirs = refresher.profiles_for(made, replicas, pools) if pools else []
        for mine, profile in zip(profiles, [made.profile, *theirs], strict=True):
            mine[at] = profile
        if on_refresh:
            on_refresh(ahead + n + 1, ahead + len(refresh))
    return profiles
