"""The actual pool a simulation follows step by step, and what it bounds: the physical limit
of the work, the steps until the night policy's morning."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
import pandas as pd

from idlegpu.forecast.calendar import wall_clock
from idlegpu.forecast.capacity import FREE, IN_USE, pool_usage
from idlegpu.scheduler.config import Settings
from idlegpu.forecast.schema import DS, KV_CACHE_USAGE, UNIQUE_ID, Y
from idlegpu.scheduler.replay import WAITING_PER_REPLICA, serving_pressure
from idlegpu.scheduler.simulate.jobs import SimJob
from idlegpu.scheduler.types import NIGHT_HOURS, PolicySettings


def _span_steps(steps: pd.DatetimeIndex, start: datetime, end: datetime) -> pd.DatetimeIndex:
    """The steps of the pool's usage a simulation of ``[start, end)`` runs."""
    return steps[(steps >= start) & (steps < end)]


def simulated_steps(history: pd.DataFrame, settings: Settings, start: datetime,
                    end: datetime) -> pd.DatetimeIndex:
    """The steps a simulation of ``[start, end)`` on ``history`` runs (its timeline's)."""
    return _span_steps(pool_usage(history, settings).index, start, end)


class _PoolTimeline:
    """The actual pool, step by step: service GPUs, free GPUs and live signals."""

    def __init__(self, history: pd.DataFrame, settings: Settings, start: datetime, end: datetime):
        usage = pool_usage(history, settings)  # NaN wherever a service's replicas are unknown
        self.step = usage.index[1] - usage.index[0]
        self.index = _span_steps(usage.index, start, end)
        if len(self.index) < 2:
            raise ValueError("the simulation period is not covered by the history")
        here = usage.loc[self.index]
        self.observed = here[IN_USE].notna().to_numpy()
        # the cluster itself goes on through a gap: the service as it was last seen
        self.service_gpus = usage[IN_USE].ffill().bfill().loc[self.index].to_numpy()
        self.free_now = here[FREE].to_numpy()  # NaN in a gap
        self.free_all = usage[FREE].to_numpy()  # for the oracle: the actual future, with holes
        self.offset = int(usage.index.get_loc(self.index[0]))
        wide = history.pivot(index=DS, columns=UNIQUE_ID, values=Y).reindex(usage.index).ffill()
        pressure = serving_pressure(wide, settings).loc[self.index]
        self.kv = pressure[KV_CACHE_USAGE].to_numpy()
        self.waiting = pressure[WAITING_PER_REPLICA].to_numpy()
        self.step_s = int(self.step.total_seconds())
        self.free_gpu_hours = float(np.nansum(self.free_now) * self.step_s / 3600)
        self.unobserved_hours = float((~self.observed).sum() * self.step_s / 3600)
        self.lendable = float(settings.pool.lendable_gpus)
        # the replicas each service runs (as last seen through a gap), for placing them
        self.replicas = np.column_stack([
            (usage[s.name] / s.gpus_per_replica).ffill().bfill().loc[self.index].to_numpy()
            for s in settings.services
        ]).round().astype(np.int64)


def _physical_limit(pool: _PoolTimeline, jobs: Sequence[SimJob], config: PolicySettings) -> float:
    """GPU-hours the job trace could use at all: each step's idle GPUs (the lendable GPUs the
    service leaves) filled from the work submitted by then and not yet done, ignoring GPU
    counts, dependencies, windows and restarts, so no policy harvests more. Of a gap, only
    what jobs may still hold before the missing signals stop them (the first
    ``missing_signals_preempt_after`` plus the grace period) counts."""
    step_s = pool.step_s
    usable = np.nan_to_num(pool.free_now, nan=0.0)
    after = config.missing_signals_preempt_after_s
    reach = float("inf") if after is None else after + config.grace_s + step_s
    seen = None
    for k in range(len(usable)):
        if pool.observed[k]:
            seen = k
        elif seen is not None and (k - seen) * step_s <= reach:
            usable[k] = max(0.0, pool.lendable - pool.service_gpus[k])
    arrivals = np.zeros(len(usable))
    for job in jobs:
        at = int(pool.index.searchsorted(pd.Timestamp(job.submit_at)))
        if at < len(usable):
            arrivals[at] += job.gpus * job.work_s / 3600
    backlog = used = 0.0
    hours = step_s / 3600
    for k in range(len(usable)):
        backlog += arrivals[k]
        take = min(usable[k] * hours, backlog)
        backlog -= take
        used += take
    return used


def _steps_until_morning(index: pd.DatetimeIndex, tz: str, step_s: int) -> np.ndarray:
    """Per step of ``index``: whole steps left until the night ends (0 by day)."""
    local = index.tz_convert(tz)
    start_h, end_h = NIGHT_HOURS
    evening = local.hour >= start_h
    wall = wall_clock(index, tz)
    morning = (wall.normalize() + pd.Timedelta(hours=end_h)
               + pd.to_timedelta(evening.astype(int), unit="D"))
    # by the wall clock, then back to real time: the night of a DST change is an hour shorter
    # or longer (end_h is never a time the change skips or repeats)
    morning = morning.tz_localize(tz, ambiguous=np.zeros(len(morning), dtype=bool),
                                  nonexistent="shift_forward")
    steps = ((morning - local).total_seconds() // step_s).astype(int)
    return np.where(evening | (local.hour < end_h), steps, 0)
