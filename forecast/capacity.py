"""The pool view of a history: GPUs in use, GPUs free, and where and when they sit idle.

Pure functions over the tidy history and the configuration: no I/O, no clock.

Conventions: a timestamp at which any service's replica count is unknown (a metric gap) has an
unknown pool usage, so its free GPUs are NaN and never counted as idle: gaps are not free
capacity. Free GPUs are what is left after the service's GPUs and the headroom; a service above
the pool's capacity leaves zero free, never a negative number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import wall_clock
from idlegpu.forecast.config import Settings
from idlegpu.forecast.errors import ConfigError, HistoryError
from idlegpu.forecast.models.base import quantile_column
from idlegpu.forecast.schema import (
    DS,
    REPLICAS,
    UNIQUE_ID,
    Y,
    infer_step,
    series_id,
    split_series_id,
)

IN_USE = "in_use"
FREE = "free"
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True)
class ServiceCoverage:
    """Which series of a history the configuration describes (``service_coverage``)."""

    matched: tuple[str, ...]
    """Configured services with at least one series in the history (config order)."""
    unknown: tuple[str, ...]
    """Series ids whose service is none of ``services`` (the pool view ignores them)."""
    history_services: tuple[str, ...]
    """Every service the history's series ids name, sorted."""


def service_coverage(history: pd.DataFrame, settings: Settings) -> ServiceCoverage:
    """Match the history's series ids (``<service>/<metric>``) against ``services``."""
    ids = sorted(str(uid) for uid in history[UNIQUE_ID].unique())
    services = {uid: split_series_id(uid)[0] for uid in ids}
    configured = set(settings.service_names)
    present = set(services.values())
    return ServiceCoverage(
        matched=tuple(n for n in settings.service_names if n in present),
        unknown=tuple(uid for uid in ids if services[uid] not in configured),
        history_services=tuple(sorted(present)),
    )


def require_configured_services(history: pd.DataFrame, settings: Settings, *,
                                config: str = "the config") -> ServiceCoverage:
    """``service_coverage``, refusing a history none of whose series belongs to a configured
    service (the config describes another pool: every pool view would be empty or wrong), or
    one without the replicas series of a configured service (the pool view needs them all)."""
    coverage = service_coverage(history, settings)
    if not coverage.matched:
        found = ", ".join(coverage.history_services[:8]) + (
            f" and {len(coverage.history_services) - 8} more"
            if len(coverage.history_services) > 8 else "")
        raise ConfigError(
            f"none of the history's services ({found or 'none'}) is a service of {config} "
            f"({', '.join(settings.service_names)}): pass --config with this pool's "
            "configuration, or name its services[] after the history's series ids "
            "(<service>/<metric>)"
        )
    _require_replica_series(history, settings)
    return coverage


def _require_replica_series(history: pd.DataFrame, settings: Settings) -> None:
    """Every configured service needs its replicas series in the history."""
    present = set(history[UNIQUE_ID].unique())
    missing = [uid for uid in (series_id(s.name, REPLICAS) for s in settings.services)
               if uid not in present]
    if missing:
        services = sorted({uid.rpartition("/")[0] for uid in present})
        raise ConfigError(
            f"the history has no series {', '.join(missing)} for the configured service(s); "
            f"services in the history: {', '.join(services) or 'none'} (check services[].name)"
        )


def pool_usage(history: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    """GPUs per service, GPUs in use and free GPUs at every step of the history.

    Returns a frame indexed by UTC ``ds`` on the history's regular step (missing steps appear
    as rows of NaN), with one column of GPUs per service, ``in_use`` and ``free``.
    """
    replica_ids = {series_id(s.name, REPLICAS): s for s in settings.services}
    _require_replica_series(history, settings)
    replicas = history[history[UNIQUE_ID].isin(list(replica_ids))]
    wide = replicas.pivot(index=DS, columns=UNIQUE_ID, values=Y)
    step = infer_step(replicas)
    grid = pd.date_range(wide.index.min(), wide.index.max(), freq=step)
    if len(grid) != len(wide.index.union(grid)):
        raise HistoryError(
            f"replica samples are off the {step} grid; resample the history to a regular step"
        )
    wide = wide.reindex(grid)
    wide.index.name = DS
    gpus = pd.DataFrame(
        {s.name: wide[uid] * s.gpus_per_replica for uid, s in replica_ids.items()}, index=grid
    )
    gpus.index.name = DS
    return _with_in_use_and_free(gpus, settings)


def _with_in_use_and_free(gpus: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    """Add ``in_use`` (the services' GPUs; NaN where any service is unknown, never a partial
    sum) and ``free`` (the lendable GPUs they leave, never below 0)."""
    gpus[IN_USE] = gpus.sum(axis=1, min_count=len(gpus.columns))
    gpus[FREE] = (settings.pool.lendable_gpus - gpus[IN_USE]).clip(lower=0)
    return gpus


def step_hours(usage: pd.DataFrame) -> float:
    if len(usage.index) < 2:
        raise HistoryError("the history needs at least two time steps")
    return (usage.index[1] - usage.index[0]) / pd.Timedelta(hours=1)


def daily_idle_gpu_hours(usage: pd.DataFrame, tz: str | ZoneInfo) -> pd.DataFrame:
    """Per local day: idle GPU-hours, mean and minimum free GPUs, and the share of steps seen.

    Idle GPU-hours sum the free GPUs over the observed steps; steps in a gap count as zero,
    so ``observed`` tells how complete the day is.
    """
    hours = step_hours(usage)
    local = usage[FREE].tz_convert(tz) if usage.index.tz else usage[FREE]
    day = local.index.date
    grouped = local.groupby(day)
    out = pd.DataFrame(
        {
            "idle_gpu_hours": grouped.sum(min_count=0) * hours,
            "mean_free": grouped.mean(),
            "min_free": grouped.min(),
            "observed": grouped.count() / grouped.size(),
        }
    )
    out.index = pd.DatetimeIndex(out.index, name="date")
    return out


def hourly_idle_profile(usage: pd.DataFrame, tz: str | ZoneInfo) -> pd.DataFrame:
    """Mean free GPUs by local weekday (rows Mon..Sun) and hour of day (columns 0..23).

    A cell is also the average idle GPU-hours that hour of that weekday offers.
    """
    local = usage[FREE].tz_convert(tz)
    table = local.groupby([local.index.day_of_week, local.index.hour]).mean().unstack()
    table = table.reindex(index=range(7), columns=range(24))
    table.index = pd.Index(WEEKDAYS, name="weekday")
    table.columns.name = "hour"
    return table


@dataclass(frozen=True)
class IdleRun:
    start: pd.Timestamp
    end: pd.Timestamp
    hours: float


def _runs(ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) positions of every stretch of True in ``ok``."""
    edges = np.diff(np.concatenate([[0], ok.astype(np.int8), [0]]))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def longest_run(free: pd.Series, level: float, hours_per_step: float) -> IdleRun | None:
    """The longest stretch of consecutive steps with at least ``level`` GPUs free.

    A NaN (gap) breaks a stretch. ``end`` is the end of the last step of the stretch.
    """
    ok = (free >= level).to_numpy()
    if not ok.any():
        return None
    starts, ends = _runs(ok)
    lengths = ends - starts
    best = int(np.argmax(lengths))  # first of the longest: deterministic
    start, end = starts[best], ends[best]
    step = pd.Timedelta(hours=hours_per_step)
    return IdleRun(
        start=free.index[start],
        end=free.index[end - 1] + step,
        hours=float(lengths[best] * hours_per_step),
    )


def nightly_idle(
    usage: pd.DataFrame,
    tz: str | ZoneInfo,
    levels: list[int] | None = None,
    *,
    night_starts_hour: int = 12,
) -> pd.DataFrame:
    """Depth and duration of each night's idle period.

    A night is the 24 hours from ``night_starts_hour`` (local) of its date to the same hour the
    next day, so a window that crosses midnight stays whole. For every night and every level N
    (GPUs, default multiples of 4 up to the pool's free capacity) it gives the longest stretch
    with at least N GPUs free: ``hours``, ``start`` and ``end`` (local time). Nights that are
    not fully inside the history are left out.
    """
    hours = step_hours(usage)
    local = usage[FREE].tz_convert(tz)
    if levels is None:
        top = np.nanmax(local.to_numpy()) if local.notna().any() else 0
        levels = list(range(4, int(top) + 1, 4)) or [1]
    shifted = wall_clock(local.index, tz) - pd.Timedelta(hours=night_starts_hour)
    night = pd.DatetimeIndex(shifted.date)
    steps_per_night = round(24 / hours)
    rows = []
    for day, values in local.groupby(night):
        if len(values) != steps_per_night:
            continue
        for level in levels:
            run = longest_run(values, level, hours)
            rows.append(
                {
                    "night": pd.Timestamp(day),
                    "level": level,
                    "hours": 0.0 if run is None else run.hours,
                    "start": pd.NaT if run is None else run.start,
                    "end": pd.NaT if run is None else run.end,
                }
            )
    return pd.DataFrame(rows, columns=["night", "level", "hours", "start", "end"])


def idle_depth_summary(nights: pd.DataFrame, min_hours: float = 8.0) -> pd.DataFrame:
    """Per level N: median and 10th-percentile hours of N GPUs idle per night, and the share of
    nights on which N GPUs stayed idle for at least ``min_hours`` hours."""
    if nights.empty:
        raise HistoryError("no complete night in the history; it needs at least 24 hours")
    grouped = nights.groupby("level")["hours"]
    summary = pd.DataFrame(
        {
            "median_hours": grouped.median(),
            "p10_hours": grouped.quantile(0.1),
            f"share_nights_ge_{min_hours:g}h": grouped.apply(lambda h: float((h >= min_hours).mean())),
            "nights": grouped.size(),
        }
    )
    summary.index.name = "gpus"
    return summary


def typical_night(summary: pd.DataFrame, min_hours: float = 8.0) -> int:
    """The most GPUs idle for at least ``min_hours`` hours on a median night (0 if none)."""
    ok = summary.index[summary["median_hours"] >= min_hours]
    return int(ok.max()) if len(ok) else 0


# ---------------------------------------------------------------- forecast pool view, windows


def forecast_pool_usage(
    forecast: pd.DataFrame,
    settings: Settings,
    confidence: float,
    quantiles: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """GPUs in use and free GPUs over a forecast, at a confidence level.

    The pool's usage at confidence ``c`` adds up each service's replica quantile ``q=c`` times its
    GPUs per replica. Adding quantiles is exact when services rise and fall together (they do:
    one office day drives them all) and conservative otherwise, so free GPUs are promised with
    at least confidence ``c``. ``quantiles`` plans the services it names with their own, wider,
    quantile instead (a service whose forecasts have lately been covering less than promised).
    """
    for q in {confidence, *(quantiles or {}).values()}:
        column = quantile_column(q)
        if column not in forecast.columns:
            have = [c for c in forecast.columns if c.startswith("q")]
            raise ConfigError(
                f"the forecast has no quantile {q:g} (has {', '.join(have) or 'none'}); "
                f"forecast with --quantiles including {q:g}"
            )
    gpus = {}
    # the columns once, as arrays: a pandas selection per service costs more than the sums
    ids = forecast[UNIQUE_ID].to_numpy()
    when = pd.DatetimeIndex(forecast[DS], name=DS)
    for service in settings.services:
        column = quantile_column((quantiles or {}).get(service.name, confidence))
        mine = ids == series_id(service.name, REPLICAS)
        if not mine.any():
            raise ConfigError(
                f"the forecast has no series {series_id(service.name, REPLICAS)}; forecast every "
                "configured service's replicas"
            )
        gpus[service.name] = pd.Series(
            forecast[column].to_numpy()[mine] * service.gpus_per_replica, index=when[mine])
    usage = pd.DataFrame(gpus).sort_index()
    usage.index.name = DS
    return _with_in_use_and_free(usage, settings)


@dataclass(frozen=True)
class IdleWindow:
    """``gpus`` GPUs free from ``start`` to ``end`` (UTC) with probability ``confidence``.

    ``open_end``: the window reaches the end of the forecast and may last longer.
    """

    start: pd.Timestamp
    end: pd.Timestamp
    gpus: int
    confidence: float
    open_end: bool = False

    @property
    def hours(self) -> float:
        return (self.end - self.start) / pd.Timedelta(hours=1)

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.hours


def idle_windows(
    free: pd.Series,
    *,
    confidence: float,
    granularity: int = 4,
    min_hours: float = 1.0,
) -> list[IdleWindow]:
    """Every maximal stretch with at least N GPUs free, for N in multiples of ``granularity``.

    ``free`` is a regular series of free GPUs (NaN = unknown, which breaks a window); each value
    holds from its timestamp to the next. Windows shorter than ``min_hours`` are left out. Sorted
    by start, then most GPUs first, so the admitter can pack jobs of any size.
    """
    if granularity < 1:
        raise ValueError("granularity must be at least 1 GPU")
    if len(free) < 2:
        raise HistoryError("need at least two steps of free GPUs to find windows")
    step = free.index[1] - free.index[0]
    top = np.nanmax(free.to_numpy()) if free.notna().any() else 0
    values = free.to_numpy()
    windows = []
    for level in range(granularity, int(top) + 1, granularity):
        ok = np.nan_to_num(values, nan=-1) >= level
        for s, e in zip(*_runs(ok), strict=True):
            start, end = free.index[s], free.index[e - 1] + step
            if (end - start) >= pd.Timedelta(hours=min_hours):
                windows.append(IdleWindow(start, end, level, confidence, open_end=e == len(values)))
    return sorted(windows, key=lambda w: (w.start, -w.gpus))


def windows_frame(windows: list[IdleWindow], tz: str | ZoneInfo) -> pd.DataFrame:
    """Windows as a table with local start/end times."""
    return pd.DataFrame(
        {
            "start": [w.start.tz_convert(tz) for w in windows],
            "end": [w.end.tz_convert(tz) for w in windows],
            "gpus": [w.gpus for w in windows],
            "hours": [w.hours for w in windows],
            "gpu_hours": [w.gpu_hours for w in windows],
            "confidence": [w.confidence for w in windows],
            "open_end": [w.open_end for w in windows],
        },
        columns=["start", "end", "gpus", "hours", "gpu_hours", "confidence", "open_end"],
    )
