"""Capacity-planning helpers: what-if settings, autoscaler behaviour and night right-sizing.

Pure functions over the tidy history and the configuration: no I/O, no clock.

**Night right-sizing.** At night the autoscalers of an inference pool usually sit on their
``min_replicas`` floor, so the observed replica counts only say "the floor", not how many
replicas the night's traffic needs. The demand is read from the KV-cache usage instead:
``replicas x kv_cache_usage`` is the work the service carries, in replicas at 100 % KV-cache
usage (``kv_cache_usage`` is the mean over the service's replicas), and dividing it by the
autoscaler's target utilisation (70 % by default, the HPA target of the sample pool) gives the
replicas it would run at that target. A high quantile (0.99 by default) of that over every
observed night step, rounded up and never below ``floor`` (1: a service stays up), is the
replicas the night needs; the suggested night minimum is that, capped at the current
``min_replicas`` (right-sizing only lowers floors), and the GPUs freed are the difference times
the GPUs per replica. A service without a KV-cache series falls back to the same quantile of
its observed night replicas (which cannot suggest less than what it ran), flagged in ``basis``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import hourly_by_day_kind
from idlegpu.forecast.capacity import step_hours
from idlegpu.forecast.config import Settings
from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.schema import DS, KV_CACHE_USAGE, REPLICAS, UNIQUE_ID, Y, series_id
from idlegpu.forecast.settings_base import load_settings

NIGHT_HOURS = (22, 6)  # local [start, end) hours of the night
TARGET_UTILIZATION = 0.7  # the autoscaler's KV-cache target (HPA averageUtilization)
RIGHTSIZING_COLUMNS = (
    "service", "gpus_per_replica", "min_replicas", "night_p50_replicas", "night_share_at_min",
    "needed_replicas", "suggested_night_min", "gpus_freed", "basis",
)


SettingsT = TypeVar("SettingsT", bound=Settings)


def what_if(
    settings: SettingsT,
    *,
    pool: Mapping[str, Any] | None = None,
    admission: Mapping[str, Any] | None = None,
    min_replicas: Mapping[str, int] | None = None,
) -> SettingsT:
    """A copy of ``settings`` with some fields changed, validated like ``idlegpu.yaml`` (as the
    model ``settings`` is: the scheduler's whole configuration stays whole).

    ``pool`` and ``admission`` map field names to new values (e.g. ``pool={"total_gpus": 96}``,
    ``admission={"confidence": 0.8}``); ``min_replicas`` maps service names to new minimums.
    Invalid combinations are refused with the field named (a ``ConfigError``), exactly as the
    config file would be.
    """
    data = settings.model_dump()
    for section, changes in (("pool", pool), ("admission", admission)):
        unknown = sorted(set(changes or {}) - set(data[section]))
        if unknown:
            raise ConfigError(f"what-if: unknown {section} field(s) {', '.join(unknown)}")
        data[section].update(changes or {})
    names = [s["name"] for s in data["services"]]
    unknown = sorted(set(min_replicas or {}) - set(names))
    if unknown:
        raise ConfigError(
            f"what-if: unknown service(s) {', '.join(unknown)}; the config defines "
            f"{', '.join(names)}"
        )
    floors = min_replicas or {}
    for service in data["services"]:
        if service["name"] in floors:
            service["min_replicas"] = int(floors[service["name"]])
    return load_settings(type(settings), data=data)


def service_replica_profile(
    usage: pd.DataFrame, settings: Settings, holidays: Mapping[Any, str] | None = None
) -> pd.DataFrame:
    """Mean replicas of every service by local hour of day (rows 0..23), on working days,
    weekends and public holidays (``holidays``: local dates, e.g. ``PoolAnalysis.holidays``).

    ``usage`` is ``pool_usage``'s frame; columns are ``(service, day kind)``.
    """
    local = usage.tz_convert(settings.pool.timezone)
    frames = {
        service.name: hourly_by_day_kind(local[service.name] / service.gpus_per_replica,
                                         holidays)
        for service in settings.services
    }
    out = pd.concat(frames, axis=1, names=["service", "day"])
    out.index.name = "hour"
    return out


def autoscaling_summary(usage: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    """Per service: how its autoscaler behaves over the history.

    Columns: ``min_replicas`` and ``max_replicas`` (configured), ``share_at_min`` and
    ``share_at_max`` (of the observed steps), ``scale_ups_per_day`` and ``scale_downs_per_day``
    (replica-count changes between consecutive observed steps, per observed day),
    ``gpu_hours_per_day`` (mean GPUs held x 24).
    """
    rows = []
    step_h = step_hours(usage) if len(usage) > 1 else 0
    for service in settings.services:
        replicas = (usage[service.name] / service.gpus_per_replica).dropna()
        change = replicas.diff()
        # a change across a gap is not a scaling step of the autoscaler
        gap = replicas.index.to_series().diff() > pd.Timedelta(hours=step_h) * 1.5
        change[gap.to_numpy()] = np.nan
        days = len(replicas) * step_h / 24 if len(replicas) else np.nan
        rows.append(
            {
                "service": service.name,
                "min_replicas": service.min_replicas,
                "max_replicas": service.max_replicas,
                "share_at_min": float((replicas <= service.min_replicas).mean()),
                "share_at_max": float((replicas >= service.max_replicas).mean()),
                "scale_ups_per_day": float((change > 0).sum() / days) if days else np.nan,
                "scale_downs_per_day": float((change < 0).sum() / days) if days else np.nan,
                "gpu_hours_per_day": float(usage[service.name].mean() * 24),
            }
        )
    return pd.DataFrame(rows).set_index("service")


def night_mask(times: pd.DatetimeIndex, tz: str,
               night_hours: tuple[int, int] = NIGHT_HOURS) -> np.ndarray:
    """True where ``times`` (UTC) fall in ``night_hours``, local ``[start, end)`` hours."""
    start, end = night_hours
    if not (0 <= start < 24 and 0 <= end < 24) or start == end:
        raise ValueError(f"night_hours must be two different hours in 0..23, got {night_hours}")
    hour = times.tz_convert(tz).hour
    mask = (hour >= start) | (hour < end) if start > end else (hour >= start) & (hour < end)
    return np.asarray(mask)


def _wide(history: pd.DataFrame, uids: list[str]) -> pd.DataFrame:
    rows = history[history[UNIQUE_ID].isin(uids)]
    return rows.pivot(index=DS, columns=UNIQUE_ID, values=Y)


def night_demand(
    history: pd.DataFrame,
    settings: Settings,
    *,
    night_hours: tuple[int, int] = NIGHT_HOURS,
    target_utilization: float = TARGET_UTILIZATION,
) -> pd.DataFrame:
    """Per night step (UTC ``ds``) and service: the replicas its load needs at the target
    utilisation, ``replicas x kv_cache_usage / target`` (NaN where a sample is missing or the
    service has no KV-cache series). Steps outside ``night_hours`` (local) are left out."""
    return _demand(_night_wide(history, settings, night_hours), settings, target_utilization)


def _night_wide(history: pd.DataFrame, settings: Settings,
                night_hours: tuple[int, int]) -> pd.DataFrame:
    """The services' replicas and KV-cache usage, one column each, at night steps only."""
    uids = [series_id(s.name, m) for s in settings.services for m in (REPLICAS, KV_CACHE_USAGE)]
    wide = _wide(history, uids)
    if wide.empty:
        return wide
    return wide[night_mask(pd.DatetimeIndex(wide.index), settings.pool.timezone, night_hours)]


def _demand(wide: pd.DataFrame, settings: Settings, target_utilization: float) -> pd.DataFrame:
    if not 0 < target_utilization <= 1:
        raise ValueError(f"target_utilization must be in (0, 1], got {target_utilization}")
    if wide.empty:
        return pd.DataFrame(columns=settings.service_names, dtype=float)
    out = pd.DataFrame(index=wide.index)
    for service in settings.services:
        rep, kv = series_id(service.name, REPLICAS), series_id(service.name, KV_CACHE_USAGE)
        if rep in wide and kv in wide:
            out[service.name] = wide[rep] * wide[kv] / target_utilization
        else:
            out[service.name] = np.nan
    return out


def night_rightsizing(
    history: pd.DataFrame,
    settings: Settings,
    *,
    night_hours: tuple[int, int] = NIGHT_HOURS,
    quantile: float = 0.99,
    target_utilization: float = TARGET_UTILIZATION,
    floor: int = 1,
) -> pd.DataFrame:
    """Per service: how many replicas the night needs and the GPUs a tighter night
    ``min_replicas`` would free (see the module docstring for the method).

    Columns: ``service``, ``gpus_per_replica``, ``min_replicas`` (configured),
    ``night_p50_replicas`` (median observed night replicas), ``night_share_at_min`` (share of
    night steps on the floor: near 1 means the floor, not traffic, sets the night),
    ``needed_replicas``, ``suggested_night_min``, ``gpus_freed``, ``basis`` (``kv_cache_usage``
    or ``replicas``). A service with no night sample at all gets NaN and frees nothing.
    """
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    if floor < 0:
        raise ValueError(f"floor must be at least 0, got {floor}")
    replicas = _night_wide(history, settings, night_hours)
    demand = _demand(replicas, settings, target_utilization)
    rows = []
    for service in settings.services:
        rep = series_id(service.name, REPLICAS)
        observed = replicas[rep].dropna() if rep in replicas else pd.Series(dtype=float)
        need = demand[service.name].dropna() if service.name in demand else pd.Series(dtype=float)
        basis = KV_CACHE_USAGE
        if need.empty:
            need, basis = observed, REPLICAS
        if need.empty:
            needed = suggested = freed = np.nan
        else:
            needed = max(floor, math.ceil(float(need.quantile(quantile)) - 1e-9))
            suggested = min(service.min_replicas, needed)
            freed = (service.min_replicas - suggested) * service.gpus_per_replica
        rows.append(
            {
                "service": service.name,
                "gpus_per_replica": service.gpus_per_replica,
                "min_replicas": service.min_replicas,
                "night_p50_replicas": float(observed.median()) if len(observed) else np.nan,
                "night_share_at_min": (
                    float((observed <= service.min_replicas).mean()) if len(observed) else np.nan
                ),
                "needed_replicas": needed,
                "suggested_night_min": suggested,
                "gpus_freed": freed,
                "basis": basis,
            }
        )
    return pd.DataFrame(rows, columns=list(RIGHTSIZING_COLUMNS))


def rightsized_history(
    history: pd.DataFrame,
    settings: Settings,
    night_min: Mapping[str, int],
    *,
    night_hours: tuple[int, int] = NIGHT_HOURS,
    target_utilization: float = TARGET_UTILIZATION,
) -> pd.DataFrame:
    """The history as it would have been with night minimums ``night_min`` (service -> replicas).

    During ``night_hours`` (local) each listed service's replica count becomes
    ``max(night_min, ceil(replicas x kv_cache_usage / target))``, never above what it really ran
    (a lower floor only lets the autoscaler shrink further; it never adds replicas). Other
    series, other hours and other services are unchanged; gaps stay gaps. Feed the result to
    ``pool_usage`` or ``analyze_pool`` to see the night the new floors would give.
    """
    unknown = sorted(set(night_min) - set(settings.service_names))
    if unknown:
        raise ConfigError(
            f"unknown service(s) {', '.join(unknown)}; the config defines "
            f"{', '.join(settings.service_names)}"
        )
    demand = night_demand(history, settings, night_hours=night_hours,
                          target_utilization=target_utilization)
    out = history.copy()
    if night_min:
        night = night_mask(pd.DatetimeIndex(out[DS]), settings.pool.timezone, night_hours)
    for name, minimum in night_min.items():
        if minimum < 0:
            raise ValueError(f"night minimum of {name} must be at least 0, got {minimum}")
        rows = (out[UNIQUE_ID] == series_id(name, REPLICAS)).to_numpy() & night
        need = demand[name].reindex(out.loc[rows, DS]).to_numpy()
        current = out.loc[rows, Y].to_numpy()
        # no KV-cache sample: keep what ran (no evidence the service could shrink)
        needed = np.where(np.isnan(need), current, np.ceil(need - 1e-9))
        out.loc[rows, Y] = np.minimum(current, np.maximum(float(minimum), needed))
    return out


__all__ = [
    "NIGHT_HOURS",
    "RIGHTSIZING_COLUMNS",
    "TARGET_UTILIZATION",
    "autoscaling_summary",
    "night_demand",
    "night_mask",
    "night_rightsizing",
    "rightsized_history",
    "service_replica_profile",
    "what_if",
]
