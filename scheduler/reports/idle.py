"""The pool's idle capacity in a report: idle GPU-hours per day and month from a history, and
by job size on the pool's nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from idlegpu.forecast.capacity import daily_idle_gpu_hours, pool_usage
from idlegpu.forecast.nodes import node_idle
from idlegpu.scheduler.reports.months import Month


def idle_by_day(history: pd.DataFrame, settings: Any) -> pd.Series:
    """Idle GPU-hours per local day of the pool (``pool_usage`` FREE summed)."""
    daily = daily_idle_gpu_hours(pool_usage(history, settings), settings.pool.timezone)
    return daily["idle_gpu_hours"]


@dataclass(frozen=True)
class JobSizeIdle:
    """Idle capacity of the report month by job size on the pool's nodes (``job_size_idle``)."""

    by_size: pd.DataFrame | None
    """``idlegpu.forecast.nodes.NodeIdle.between`` of the month; None: the pool has no node
    shapes."""
    note: str
    """How it was counted (or why it was not)."""


def job_size_idle(history: pd.DataFrame, settings: Any, month: str | Month) -> JobSizeIdle:
    """The idle GPU-hours of ``month`` usable by 1-, 4-, 8-GPU and multi-node jobs on
    ``pool.nodes`` with the services placed by ``pool.placement`` (the placement replayed over
    the whole history, so the month starts where the replicas really sat)."""
    month = Month.parse(month) if isinstance(month, str) else month
    nodes = node_idle(pool_usage(history, settings), settings)
    if nodes is None:
        return JobSizeIdle(None, "The pool has no node shapes (pool.nodes): idle GPUs are "
                                 "counted for the pool as one bin, whatever the jobs' sizes.")
    tz = settings.pool.timezone
    count, largest = len(nodes.node_gpus), max(nodes.node_gpus)
    return JobSizeIdle(
        nodes.between(month.start(tz), month.end(tz)),
        f"On the {count} nodes of pool.nodes with the services' replicas placed "
        f"{nodes.strategy} (pool.placement; the kube-scheduler's "
        f"{'LeastAllocated' if nodes.strategy == 'spread' else 'MostAllocated'} scoring): a "
        f"job's GPUs must be free on one node, a multi-node job takes 2 or more whole "
        f"{largest}-GPU nodes; the pool view counts every free GPU as one bin.",
    )


def idle_by_month(idle_daily: pd.Series) -> pd.Series:
    """Idle GPU-hours per month label (``YYYY-MM``) from ``idle_by_day``."""
    if idle_daily.empty:
        return pd.Series(dtype=float)
    labels = pd.DatetimeIndex(idle_daily.index).strftime("%Y-%m")
    return idle_daily.groupby(labels).sum()
