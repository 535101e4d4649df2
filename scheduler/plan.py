"""Tonight's plan: a dry run of ``decide()`` over the forecast, as a person reads it.

``plan_ahead`` is pure: the caller passes the free-GPU profile, the queue, what runs now and
the moment ``now``; the plan steps through the profile, admitting and stopping as the policy
would if the forecast came true and every job took its estimated time. A job that never starts
gets a reason for the whole horizon (``wait_reason``), not only for its last moment.

``tonight`` is the one computation ``idlegpu plan`` and the job API (``GET /v1/plan``) share:
from a forecast refresh (``scheduler.refresh``) and the queue it gives the plan, the free-GPU
profile and the idle windows; ``store_queue`` reads that queue from a job store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

import numpy as np

from scheduler.policy import decide
from scheduler.types import (
    Action,
    FreeProfile,
    PolicySettings,
    RunningJob,
    ServingSignals,
    WaitingJob,
)


@dataclass(frozen=True)
class PlannedRun:
    job_id: str
    team: str
    kind: str
    gpus: int
    start: datetime
    end: datetime
    outcome: str  # "finishes" | "checkpoints and stops" | "runs on"
    reason: str


@dataclass(frozen=True)
class NightPlan:
    runs: tuple[PlannedRun, ...]
    waiting: tuple[tuple[WaitingJob, str], ...]  # jobs that do not start, and why (the horizon)


def plan_ahead(
    now: datetime,
    profile: FreeProfile,
    queue: Sequence[WaitingJob],
    settings: PolicySettings,
    *,
    running: Sequence[RunningJob] = (),
    team_usage: Mapping[str, float] | None = None,
    horizon: timedelta = timedelta(hours=24),
    tz: tzinfo | None = None,
) -> NightPlan:
    """``tz``: the zone the reasons of the jobs that wait give their times in (default UTC)."""
    step = timedelta(seconds=profile.step_s)
    waiting = {j.id: j for j in queue}
    active: dict[str, tuple[RunningJob, PlannedRun]] = {}
    for job in running:
        end = now + timedelta(seconds=job.remaining_s)
        active[job.id] = (job, PlannedRun(job.id, job.team, job.kind, job.gpus, job.started_at,
                                          end, "runs on", "already running"))
    runs: list[PlannedRun] = []
    last_reason: dict[str, str] = {}
    reasons: dict[str, list[str]] = {}  # per job, the policy's reason at each step
    left: list[float] = []  # per step, the GPUs the planned jobs leave free
    pools: list[float] = []  # per step, the GPUs free before any research job
    times: list[datetime] = []
    t = now
    while t < now + horizon and t < profile.end:
        for job_id, (job, row) in list(active.items()):
            if t >= row.end:  # finished as estimated
                runs.append(replace(row, outcome="finishes"))
                del active[job_id]
        signals = ServingSignals(observed_at=t)
        current = [
            replace(job, remaining_s=max(0.0, (row.end - t).total_seconds()))
            for job, row in active.values()
        ]
        result = decide(t, profile, current, list(waiting.values()), signals,
                        team_usage or {}, settings)
        for d in result.decisions:
            if d.action is Action.ADMIT:
                job = waiting.pop(d.job_id)
                end = d.stop_by or t + timedelta(seconds=job.runtime_s)
                outcome = "checkpoints and stops" if d.stop_by else "finishes"
                run = RunningJob(job.id, job.team, job.gpus, job.priority, t, job.checkpointable,
                                 job.runtime_s, None, d.stop_by, job.kind)
                active[job.id] = (run, PlannedRun(job.id, job.team, job.kind, job.gpus, t, end,
                                                  outcome, d.reason))
            elif d.action is Action.PREEMPT and d.job_id in active:
                job, row = active.pop(d.job_id)
                runs.append(replace(row, end=t, outcome="checkpoints and stops"))
            elif d.action is Action.DEFER:
                last_reason[d.job_id] = d.reason
        for job_id in waiting:
            reasons.setdefault(job_id, []).append(last_reason.get(job_id, ""))
        i = profile.index_at(t)
        pool = float(profile.free[i]) if 0 <= i < len(profile.free) else math.nan
        pools.append(pool)
        left.append(pool - sum(job.gpus for job, _ in active.values()))
        times.append(t)
        t += step
    for job, row in active.values():
        runs.append(replace(row, outcome="runs on" if row.end > t else row.outcome))
    runs.sort(key=lambda r: (r.start, r.job_id))
    steps = _Steps(times, np.array(left, float), np.array(pools, float), step, tz or UTC)
    return NightPlan(
        tuple(runs),
        tuple((job, wait_reason(job, steps, reasons.get(job.id, []), settings.grace_s))
              for job in waiting.values()),
    )


@dataclass(frozen=True)
class _Steps:
    times: list[datetime]
    left: np.ndarray  # GPUs left free by the planned jobs at each step (NaN: no forecast)
    pool: np.ndarray  # GPUs free before any research job at each step
    step: timedelta
    tz: tzinfo

    def at(self, i: int) -> str:
        return self.times[i].astimezone(self.tz).strftime("%a %H:%M")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _runs(ok: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) index ranges where ``ok`` holds."""
    edges = np.diff(np.concatenate(([0], ok.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))


def wait_reason(job: WaitingJob, steps: _Steps, reasons: Sequence[str], grace_s: float) -> str:
    """Why ``job`` does not start anywhere in the plan's horizon, in words: no window of its
    size at all, none long enough, or the first one that opens and what the policy said then.
    ``reasons``: the policy's reason at each step."""
    if not steps.times:
        return reasons[-1] if reasons else "the plan's horizon is empty"
    need = job.min_gpus
    what = f"needs {need} GPUs" if need == job.gpus else f"needs at least {need} GPUs"
    span = (len(steps.times) * steps.step).total_seconds() / 3600
    left = np.nan_to_num(steps.left, nan=-1.0)
    pool = np.nan_to_num(steps.pool, nan=-1.0)
    now = max(0, int(left[0]))
    ok = left >= need
    if not (pool >= need).any():
        most = int(np.argmax(pool))
        return (f"{what}; {now} free now and at most {max(0, int(pool[most]))} in the next "
                f"{span:g} h (at {steps.at(most)}): no {need}-GPU window opens")
    if not ok.any():
        opens = int(np.argmax(pool >= need))
        most = int(np.argmax(left))
        return (f"{what}; the pool has {need} free from {steps.at(opens)}, but the jobs "
                f"planned ahead of it hold them: at most {max(0, int(left[most]))} left in the "
                f"next {span:g} h")
    stretches = _runs(ok)
    whole = not job.checkpointable or (
        job.max_preemptions is not None and job.preemptions >= job.max_preemptions)
    need_s = job.runtime_s * (job.gpus / need) + grace_s
    longest = max(stretches, key=lambda r: r[1] - r[0])
    longest_s = (longest[1] - longest[0]) * steps.step.total_seconds()
    first = stretches[0][0]
    if whole and longest_s < need_s:
        return (f"{what} for {_hours(need_s - grace_s)} + grace without a stop; the longest "
                f"{need}-GPU window left in the next {span:g} h is {_hours(longest_s)} (from "
                f"{steps.at(longest[0])})")
    said = reasons[first] if first < len(reasons) and reasons[first] else ""
    if said and not said.startswith("needs") and reasons and reasons[0] == said:
        return said  # not a matter of GPUs, and already so now (its deadline has passed)
    opens = "is open now" if first == 0 else f"opens at {steps.at(first)}"
    return f"{what}; the first {need}-GPU window left {opens}" + (f", but then: {said}" if said
                                                              else "")


# --------------------------------------------------------------------------------- tonight


if TYPE_CHECKING:
    import pandas as pd

    from scheduler.refresh import Refresh


@dataclass(frozen=True)
class Tonight:
    """The plan from ``start`` over ``horizon``, and what it was made from."""

    start: datetime
    horizon: timedelta
    refresh: Refresh  # the forecast refresh (``made_at``, the free GPUs, the widened services)
    free: pd.Series  # free GPUs at the confidence, start .. start + horizon
    plan: NightPlan
    windows: pd.DataFrame  # forecast.capacity.windows_frame: start, end, gpus, hours, ...
    blocked: tuple[Any, ...] = field(default=())  # units waiting for a previous pipeline step
    confidence: float = 0.9


def planning_estimate(settings, runs=None) -> Callable[[Any], float]:
    """Seconds the admitter plans a unit with: the runtime estimator (past runs of the same
    family at the configured quantile, a model on parameters, the user's estimate times the
    safety factor, else a 4-hour guess); ``runs``: a table of past runs (``load_runs``)."""
    from scheduler.runtime import RuntimeEstimator

    estimator = RuntimeEstimator.from_config(runs, settings.admission)
    return lambda unit: estimator.estimate(unit).seconds


def store_queue(job_store, settings, estimate: Callable[[Any], float], start: datetime):
    """The queue, what already runs (it holds its GPUs) and each team's recent GPU-hours (fair
    share) from a job store, at ``start``: ``(queue, running, usage)``."""
    overruns = job_store.overruns(lambda row: estimate(row.spec),
                                  settings.admission.runtime_quantile)
    queue = job_store.waiting(start, lambda row: estimate(row.spec), overruns)
    running = job_store.running(start, lambda row: estimate(row.spec), overruns)
    usage = job_store.team_gpu_hours(start, settings.admission.fair_share_days * 86400)
    return queue, running, usage


def tonight(settings, refreshed: Refresh, queue: Sequence[WaitingJob], *,
            running: Sequence[RunningJob] = (), team_usage: Mapping[str, float] | None = None,
            horizon: timedelta = timedelta(hours=24), start: datetime | None = None,
            profile: FreeProfile | None = None, blocked: Sequence[Any] = (),
            granularity: int = 4, min_hours: float = 1.0) -> Tonight:
    """Tonight's plan from a forecast refresh, as ``idlegpu plan`` prints it and the job API
    serves it: ``plan_ahead`` from ``start`` (default: the forecast's start) over ``horizon``
    with the admission policy of ``settings``, the free GPUs at the confidence and the idle
    windows of that stretch. ``profile``: the one to plan on, when not the refresh's own (the
    daemon's night-only profile)."""
    import pandas as pd

    from forecast.capacity import idle_windows, windows_frame
    from scheduler.policy import policy_settings

    profile = profile or refreshed.profile
    start = start or profile.start
    confidence = settings.admission.confidence
    tz = settings.pool.tz
    result = plan_ahead(start, profile, queue,
                        policy_settings(settings.admission, settings.pool.headroom_gpus,
                                        settings.pool.total_gpus),
                        horizon=horizon, running=running, team_usage=team_usage, tz=tz)
    free = refreshed.free
    origin = pd.Timestamp(start).floor(f"{profile.step_s}s")
    free = free[(free.index >= origin) & (free.index < pd.Timestamp(start) + horizon)]
    found = idle_windows(free, confidence=confidence, granularity=granularity,
                         min_hours=min_hours) if len(free) >= 2 else []
    return Tonight(start, horizon, refreshed, free, result, windows_frame(found, tz),
                   tuple(blocked), confidence)
