"""``idlegpu analyze``: the idle-GPU picture of a pool history, as tables and charts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pandas as pd

from idlegpu.forecast.calendar import hourly_by_day_kind
from idlegpu.forecast.capacity import (
    FREE,
    daily_idle_gpu_hours,
    hourly_idle_profile,
    idle_depth_summary,
    nightly_idle,
    pool_usage,
    step_hours,
    typical_night,
)
from idlegpu.forecast.config import Settings
from idlegpu.forecast.nodes import MULTI_NODE, NodeIdle, node_idle
from idlegpu.forecast.planning import night_mask
from idlegpu.forecast.tables import write_csv

DAY_HOURS = (10, 17)  # local weekday office hours, for its "day mean"


@dataclass(frozen=True)
class PoolAnalysis:
    settings: Settings
    usage: pd.DataFrame
    daily: pd.DataFrame
    profile: pd.DataFrame
    typical_day: pd.DataFrame
    nights: pd.DataFrame
    depth: pd.DataFrame
    services: pd.DataFrame
    holidays: dict[date, str]
    min_hours: float
    nodes: NodeIdle | None = None
    """The idle GPUs on the nodes of ``pool.nodes`` (services placed by ``pool.placement``)
    and what jobs of each size can use of them; None without node shapes."""

    @property
    def step(self) -> pd.Timedelta:
        return pd.Timedelta(hours=step_hours(self.usage))

    @property
    def first_day(self) -> date:
        return self.daily.index.min().date()

    @property
    def last_day(self) -> date:
        return self.daily.index.max().date()

    @property
    def total_idle_gpu_hours(self) -> float:
        return float(self.daily["idle_gpu_hours"].sum())

    @property
    def typical_night_gpus(self) -> int:
        return typical_night(self.depth, self.min_hours)

    def write(self, out: Path) -> list[Path]:
        """Charts (PNG) and tables (CSV) into ``out``; returns the files written."""
        from idlegpu.forecast import plots  # matplotlib: loaded for a chart

        out.mkdir(parents=True, exist_ok=True)
        pool = self.settings.pool
        capacity = pool.lendable_gpus
        files = [
            plots.idle_heatmap(
                self.profile, out / "idle_heatmap.png", capacity=capacity,
                title=f"{pool.name}: mean free GPUs by weekday and hour ({pool.timezone})",
            ),
            plots.daily_idle_chart(
                self.daily, out / "daily_idle_gpu_hours.png", holidays=self.holidays,
                title=f"{pool.name}: idle GPU-hours per day (after {pool.headroom_gpus} GPUs "
                "headroom)",
            ),
            plots.pool_week_chart(
                self.usage, self.settings.service_names, out / "pool_last_week.png",
                tz=pool.timezone, capacity=capacity,
                title=f"{pool.name}: GPUs per service and free, last 7 days",
            ),
            plots.idle_depth_chart(
                self.depth, out / "idle_depth.png", min_hours=self.min_hours,
                title=f"{pool.name}: how long N GPUs stay idle per night",
            ),
        ]
        tables = {
            "daily_idle.csv": self.daily,
            "hourly_idle_profile.csv": self.profile,
            "nightly_idle.csv": self.nights,
            "idle_depth.csv": self.depth,
        }
        if self.nodes is not None:
            tables["idle_by_job_size.csv"] = self.nodes.by_size
        for name, table in tables.items():
            write_csv(table, out / name, index=name != "nightly_idle.csv", decimals=4)
            files.append(out / name)
        return files


def analyze_pool(history: pd.DataFrame, settings: Settings, *, min_hours: float = 8.0) -> PoolAnalysis:
    tz = settings.pool.timezone
    usage = pool_usage(history, settings)
    daily = daily_idle_gpu_hours(usage, tz)
    holidays = settings.pool.calendar.names(d.date() for d in daily.index)
    nights = nightly_idle(usage, tz)
    return PoolAnalysis(
        settings=settings,
        usage=usage,
        daily=daily,
        profile=hourly_idle_profile(usage, tz),
        typical_day=typical_day(usage, tz, holidays),
        nights=nights,
        depth=idle_depth_summary(nights, min_hours),
        services=service_summary(usage, settings),
        holidays=holidays,
        min_hours=min_hours,
        nodes=node_idle(usage, settings),
    )


def typical_day(usage: pd.DataFrame, tz: str, holidays: dict[date, str]) -> pd.DataFrame:
    """Mean free GPUs by local hour on working days, weekends and public holidays."""
    return hourly_by_day_kind(usage[FREE].tz_convert(tz), holidays)


def service_summary(usage: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    local = usage.tz_convert(settings.pool.timezone)
    hour = local.index.hour
    night = night_mask(usage.index, settings.pool.timezone)  # the service table's "night mean"
    day = (hour >= DAY_HOURS[0]) & (hour < DAY_HOURS[1]) & (local.index.day_of_week < 5)
    rows = []
    for service in settings.services:
        replicas = local[service.name] / service.gpus_per_replica
        rows.append(
            {
                "service": service.name,
                "gpus_per_replica": service.gpus_per_replica,
                "min": replicas.min(),
                "max": replicas.max(),
                "mean": replicas.mean(),
                "night_mean": replicas[night].mean(),
                "day_mean": replicas[day].mean(),
            }
        )
    return pd.DataFrame(rows)


def job_size_label(size: object, node_gpus: int) -> str:
    """``1 GPU``, ``4 GPUs``, ``multi-node (2+ whole 8-GPU nodes)`` for ``NodeIdle.by_size``."""
    if size == MULTI_NODE:
        return f"multi-node (2+ whole {node_gpus}-GPU nodes)"
    return f"{size} GPU" + ("s" if size != 1 else "")


def job_size_summary(nodes: NodeIdle) -> str:
    """One line: where the pool view overstates what big jobs can use."""
    by = nodes.by_size
    sizes = [s for s in by.index if s != MULTI_NODE]
    biggest = sizes[-1] if sizes else MULTI_NODE
    share = by.loc[biggest, "share"]
    count = len(nodes.node_gpus)
    what = (f"{biggest}-GPU jobs" if biggest != MULTI_NODE else "multi-node jobs")
    return (f"On {count} nodes with the services placed {nodes.strategy}, "
            f"{by.loc[biggest, 'on_nodes_gpu_hours']:,.0f} of the "
            f"{by.loc[biggest, 'pool_view_gpu_hours']:,.0f} idle GPU-hours the pool view counts "
            f"for {what} are really usable by them ({share:.0%}); "
            f"{nodes.whole_nodes.mean():.1f} whole nodes free on average")
