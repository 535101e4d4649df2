"""Tonight's plan: a dry run of ``decide()`` over the forecast, as a person reads it.

``plan_ahead`` is pure: the caller passes the free-GPU profile, the queue, what runs now and
the moment ``now``; the plan steps through the profile, admitting and stopping as the policy
would if the forecast came true and every job took its estimated time. A job that never starts
gets a reason for the whole horizon (``wait_reason``), not only for its last moment.

``tonight`` is the one computation ``idlegpu plan`` and the job API (``GET /v1/plan``) share:
from a forecast refresh (``idlegpu.scheduler.refresh``) and the queue it gives the plan, the
free-GPU profile and the idle windows; ``store_queue`` reads that queue from a job store.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

import numpy as np

from idlegpu.forecast.capacity import idle_windows, windows_frame
from idlegpu.scheduler.policy import MAX_RESERVATION_ATTEMPTS, decide, policy_settings
from idlegpu.scheduler.policy.steps import _min_segment_s
from idlegpu.scheduler.queue_view import overruns_of, running_jobs, waiting_jobs
from idlegpu.scheduler.runtime import RuntimeEstimator
from idlegpu.scheduler.types import (
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


HEAD = 64
"""Units of the queue's head ``plan_ahead`` hands ``decide()`` at each step (more when one of
the rest might start then)."""


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
    head: int | None = HEAD,
) -> NightPlan:
    """``tz``: the zone the reasons of the jobs that wait give their times in (default UTC).

    ``head``: at each step ``decide()`` sees the first ``head`` units of the queue (in its
    order), not all 10,000: the plan is the same as long as none of the rest could start at
    that step and the head spends the pass's reservation attempts (``_Queue.cannot_start``),
    else the head grows until that holds. None: the whole queue at every step."""
    step = timedelta(seconds=profile.step_s)
    usage = team_usage or {}
    waiting = _Queue(queue, usage, settings, profile.step_s)
    # per running job: as the policy sees it, its planned run, and when its work would end
    active: dict[str, tuple[RunningJob, PlannedRun, datetime]] = {}
    for job in running:
        end = now + timedelta(seconds=job.remaining_s)
        active[job.id] = (job, PlannedRun(job.id, job.team, job.kind, job.gpus, job.started_at,
                                          end, "runs on", "already running"), end)
    runs: list[PlannedRun] = []
    said: dict[str, dict[int, str]] = {}  # per job, the policy's reason at the steps it saw it
    gates: list[str] = []  # per step, a gate of the policy (every unit's reason then), or ""
    reserved: list[tuple[str, datetime] | None] = []  # per step, the unit reserved for and when
    left: list[float] = []  # per step, the GPUs the planned jobs leave free
    pools: list[float] = []  # per step, the GPUs free before any research job
    times: list[datetime] = []
    t = now
    while t < now + horizon and t < profile.end:
        for job_id, (job, row, work_end) in list(active.items()):
            if t >= work_end:  # finished as estimated
                runs.append(replace(row, outcome="finishes"))
                del active[job_id]
        signals = ServingSignals(observed_at=t)
        current = [
            replace(job, remaining_s=max(0.0, (work_end - t).total_seconds()))
            for job, _, work_end in active.values()
        ]
        i = len(times)
        gate = _gated(t, profile, settings)
        size = len(waiting) if head is None or gate else head
        while True:
            seen = waiting.first(1 if gate else size)
            decisions = decide(t, profile, current, seen, signals, usage, settings).decisions
            if gate or len(seen) == len(waiting) or waiting.cannot_start(
                    t, profile, current, decisions, len(seen)):
                break
            size *= 4
        gates.append(decisions[-1].reason if gate and seen else "")
        reserved.append(None)
        stopping = 0  # GPUs of the jobs told to stop now: the policy counts them held till then
        for d in decisions:
            if d.action is Action.ADMIT:
                unit = waiting.take(d.job_id)
                work_end = t + timedelta(seconds=unit.runtime_s)
                outcome = "checkpoints and stops" if d.stop_by else "finishes"
                run = RunningJob(unit.id, unit.team, unit.gpus, unit.priority, t,
                                 unit.checkpointable, unit.runtime_s, None, d.stop_by, unit.kind)
                active[unit.id] = (run, PlannedRun(unit.id, unit.team, unit.kind, unit.gpus, t,
                                                   d.stop_by or work_end, outcome, d.reason),
                                   work_end)
                said.pop(unit.id, None)
            elif d.action is Action.RENEW and d.job_id in active:
                job, row, work_end = active[d.job_id]
                active[d.job_id] = (replace(job, stop_by=d.stop_by), replace(
                    row, end=min(work_end, d.stop_by or work_end),
                    outcome="checkpoints and stops" if d.stop_by else "finishes",
                    reason=f"{row.reason}; {d.reason}"), work_end)
            elif d.action is Action.PREEMPT and d.job_id in active:
                job, row, _ = active.pop(d.job_id)
                runs.append(replace(row, end=t, outcome="checkpoints and stops"))
                stopping += job.gpus
            elif d.action is Action.DEFER and not gate:
                said.setdefault(d.job_id, {})[i] = d.reason
                if d.start_at is not None and reserved[i] is None:
                    reserved[i] = (d.job_id, d.start_at)
        i_profile = profile.index_at(t)
        pool = (float(profile.free[i_profile]) if 0 <= i_profile < len(profile.free)
                else math.nan)
        pools.append(pool)
        left.append(pool - stopping - sum(job.gpus for job, _, _ in active.values()))
        times.append(t)
        t += step
    for job, row, _ in active.values():
        runs.append(replace(row, outcome="runs on" if row.end > t else row.outcome))
    runs.sort(key=lambda r: (r.start, r.job_id))
    steps = _Steps(times, np.array(left, float), np.array(pools, float), step, tz or UTC,
                   tuple(gates), tuple(reserved))
    still = waiting.ids()
    alike: dict[tuple, str] = {}  # units the policy never looked at wait for the same reason

    def why(job: WaitingJob) -> str:
        if job.id in said:
            return wait_reason(job, steps, said[job.id], settings)
        shape = (job.gpus, job.min_gpus, job.runtime_s, job.checkpointable, job.preemptions,
                 job.max_preemptions, job.deadline)
        if shape not in alike:
            alike[shape] = wait_reason(job, steps, {}, settings)
        return alike[shape]

    return NightPlan(tuple(runs), tuple((job, why(job)) for job in queue if job.id in still))


def _gated(t: datetime, profile: FreeProfile, settings: PolicySettings) -> bool:
    """Whether ``decide()`` admits nothing at ``t`` of a plan whatever the queue: the gates
    that can hold with the plan's fresh, calm signals (the forecast too old, not covering
    ``t``, or a hole in it at ``t``); every unit is then told the gate."""
    i = profile.index_at(t)
    return ((t - profile.made_at).total_seconds() > settings.max_forecast_age_s
            or not 0 <= i < len(profile.free) or math.isnan(profile.free[i]))


class _Queue:
    """The units still waiting in a plan, in ``decide()``'s order (priority, then fair share,
    then age, then the id; tests/test_plan_reasons.py checks a plan over the head against one
    over all of it), with what tells whether one could start at a step."""

    def __init__(self, queue: Sequence[WaitingJob], usage: Mapping[str, float],
                 settings: PolicySettings, step_s: int) -> None:
        self.jobs = sorted(queue, key=lambda j: (-j.priority, usage.get(j.team, 0.0),
                                                 j.submitted_at, j.id))
        self.index = {job.id: k for k, job in enumerate(self.jobs)}
        self.alive = np.ones(len(self.jobs), bool)
        self.gpus = np.array([j.gpus for j in self.jobs], float)
        self.min_gpus = np.array([j.min_gpus for j in self.jobs], float)
        whole = [not j.checkpointable or (j.max_preemptions is not None
                                          and j.preemptions >= j.max_preemptions)
                 for j in self.jobs]
        # the fewest steps its GPUs must stay free to start: its runtime, or a segment
        self.min_steps = np.array([
            max(1, math.ceil(((j.runtime_s if w
                               else min(j.runtime_s, _min_segment_s(j, settings, j.reload_s)))
                              + settings.grace_s) / step_s))
            for j, w in zip(self.jobs, whole, strict=True)], float)
        self.deadline = np.array([j.deadline.timestamp() if j.deadline else math.inf
                                  for j in self.jobs])
        self.waiting = len(self.jobs)

    def __len__(self) -> int:
        return self.waiting

    def first(self, count: int) -> list[WaitingJob]:
        return [self.jobs[k] for k in np.flatnonzero(self.alive)[:count]]

    def take(self, job_id: str) -> WaitingJob:
        k = self.index[job_id]
        self.alive[k] = False
        self.waiting -= 1
        return self.jobs[k]

    def ids(self) -> set[str]:
        return {self.jobs[k].id for k in np.flatnonzero(self.alive)}

    def cannot_start(self, t: datetime, profile: FreeProfile, current: Sequence[RunningJob],
                     decisions: Sequence[Any], seen: int) -> bool:
        """Whether ``decide()`` over the whole queue would have decided as over its first
        ``seen`` units (``decisions``), the others deferred: the head spent the pass's
        reservation attempts (or reserved), and none of the others could start on what is
        free now after the head's admissions, for its runtime (or a segment) from now, its
        deadline not passed (counted generously: the GPUs of the jobs stopping in this pass
        as free at once, no reservation)."""
        by_id = {d.job_id: d for d in decisions if d.action in (Action.ADMIT, Action.DEFER)}
        attempts, spent, taken = 0, False, 0.0
        for unit in self.first(seen):
            d = by_id[unit.id]
            if d.action is Action.ADMIT:
                taken += d.gpus
            elif not spent:
                attempts += 1
                spent = d.start_at is not None or attempts >= MAX_RESERVATION_ATTEMPTS
        if not spent:
            return False
        stopping = {d.job_id for d in decisions if d.action in (Action.PREEMPT, Action.SHRINK)}
        i0 = max(0, profile.index_at(t))
        free = np.nan_to_num(np.asarray(profile.free, float), nan=0.0)
        for job in current:
            if job.id in stopping:
                continue
            end = t + timedelta(seconds=max(0.0, job.remaining_s))
            if job.stop_by is not None:
                end = min(end, job.stop_by)
            last = min(len(free), max(i0 + 1, math.ceil(
                (end - profile.start).total_seconds() / profile.step_s)))
            free[i0:last] -= job.gpus
        rest = np.flatnonzero(self.alive)[seen:]
        could = rest[(self.min_gpus[rest] <= free[i0] - taken)
                     & (self.deadline[rest] > t.timestamp())]
        if not could.size:
            return True
        elastic = self.min_gpus[could] < self.gpus[could]
        if elastic.any():
            return False
        ahead = free[i0:]
        for gpus in np.unique(self.gpus[could]):
            short = np.flatnonzero(ahead < gpus)
            run = int(short[0]) if short.size else len(ahead)
            of_size = could[self.gpus[could] == gpus]
            if (self.min_steps[of_size] <= run).any():
                return False
        return True


@dataclass(frozen=True)
class _Steps:
    """What the plan saw at each of its steps, for the reasons of the units that wait."""

    times: list[datetime]
    left: np.ndarray  # GPUs left free by the planned jobs at each step (NaN: no forecast)
    pool: np.ndarray  # GPUs free before any research job at each step
    step: timedelta
    tz: tzinfo
    gates: Sequence[str] = ()  # what the policy told the units it did not see ("": too big)
    reserved: Sequence[tuple[str, datetime] | None] = ()  # the unit reserved for, and when

    def at(self, i: int) -> str:
        return self.when(self.times[i])

    def when(self, moment: datetime, *, dated: bool = False) -> str:
        """A moment as the plan says it: weekday and time, which within its horizon is
        unambiguous; ``dated`` adds the date (a moment in the past: "Fri 09:00" on a
        Wednesday reads as the coming Friday)."""
        return moment.astimezone(self.tz).strftime("%a %Y-%m-%d %H:%M %Z" if dated
                                                   else "%a %H:%M %Z")

    def said(self, reasons: Mapping[int, str], i: int) -> str:
        """The policy's reason for a unit at step ``i`` ("" when it was too big to look at)."""
        if i in reasons:
            return reasons[i]
        return self.gates[i] if i < len(self.gates) else ""


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _runs(ok: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) index ranges where ``ok`` holds."""
    edges = np.diff(np.concatenate(([0], ok.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))


_NOW = re.compile(r"\bnow\b")


def wait_reason(job: WaitingJob, steps: _Steps, reasons: Mapping[int, str],
                settings: PolicySettings) -> str:
    """Why ``job`` does not start anywhere in the plan's horizon, once, in words: its deadline
    has passed; no window of its size opens; the jobs planned ahead of it hold the GPUs; no
    window is long enough for it (its runtime without a stop, or a worthwhile segment); or
    the first window long enough opens at a time, and what keeps it out there (the unit the
    GPUs are reserved for, its deadline, a policy gate). ``reasons``: the policy's reason for
    it at the steps where it was looked at (``plan_ahead``)."""
    if not steps.times:
        return "the plan's horizon is empty"
    if job.deadline is not None and job.deadline <= steps.times[0]:
        return f"its deadline has passed ({steps.when(job.deadline, dated=True)})"
    need = job.min_gpus
    assert need is not None  # WaitingJob.__post_init__ always sets it
    what = f"needs {need} GPUs" if need == job.gpus else f"needs at least {need} GPUs"
    span = f"{(len(steps.times) * steps.step).total_seconds() / 3600:g} h"
    left = np.nan_to_num(steps.left, nan=-1.0)
    pool = np.nan_to_num(steps.pool, nan=-1.0)
    now = max(0, int(left[0]))
    if not (pool >= need).any():
        most = int(np.argmax(pool))
        return (f"{what}; {now} free now and at most {max(0, int(pool[most]))} in the next "
                f"{span} (at {steps.at(most)}): no {need}-GPU window opens")
    if not (left >= need).any():
        opens_at = int(np.argmax(pool >= need))
        most = int(np.argmax(left))
        return (f"{what}; the pool has {need} free from {steps.at(opens_at)}, but the jobs "
                f"running or planned ahead of it hold them: at most {max(0, int(left[most]))} "
                f"left in the next {span}")
    whole = not job.checkpointable or (
        job.max_preemptions is not None and job.preemptions >= job.max_preemptions)
    runtime_s = job.runtime_s * job.gpus / need
    need_s = ((runtime_s if whole else min(runtime_s, _min_segment_s(job, settings, job.reload_s)))
              + settings.grace_s)
    step_s = steps.step.total_seconds()
    for_what = (f"for {_hours(runtime_s)} + grace without a stop" if whole else
                f"for a worthwhile segment ({_hours(need_s - settings.grace_s)} + grace)")
    long_left = [r for r in _runs(left >= need) if (r[1] - r[0]) * step_s >= need_s]
    if not long_left:
        longest = max(_runs(left >= need), key=lambda r: r[1] - r[0])
        longest_s = (longest[1] - longest[0]) * step_s
        pool_long = [r for r in _runs(pool >= need) if (r[1] - r[0]) * step_s >= need_s]
        if pool_long:
            taken = pool_long[0]
            return (f"{what} {for_what}; the jobs running or planned ahead of it take the "
                    f"{need}-GPU window of {steps.at(taken[0])} – {_end(steps, taken[1])}, "
                    f"leaving at most {_hours(longest_s)} (from {steps.at(longest[0])})")
        return (f"{what} {for_what}; the longest {need}-GPU window in the next {span} is "
                f"{_hours(longest_s)} (from {steps.at(longest[0])})")
    first = int(long_left[0][0])
    opens = "is open now" if first == 0 else f"opens at {steps.at(first)}"
    window = f"the first {need}-GPU window long enough {opens}"
    if job.deadline is not None and job.deadline <= steps.times[first]:
        return (f"{what}; its deadline ({steps.when(job.deadline)}) passes before {window}"
                .replace(" is open now", ""))
    said = steps.said(reasons, first)
    held = steps.reserved[first] if first < len(steps.reserved) else None
    if held is not None and held[0] != job.id and "reserved job" in said:
        return (f"{what}; {window}, but starting there would delay {held[0]}, which has the "
                f"GPUs reserved from {steps.when(held[1])}")
    if not said:
        return f"{what}; {window}, but the jobs ahead of it in the queue come first"
    if not said.startswith(("needs", f"{job.gpus} GPUs", "does not fit", "its ")):
        return f"{what}; {window}, but the policy admits nothing then: {said}"
    return f"{what}; {window}, but there: " + _NOW.sub(
        "then" if first else "now", said.split(" reserved for it from ")[0])


def _end(steps: _Steps, stop: int) -> str:
    """The time a run of steps ending before index ``stop`` ends, in the steps' zone."""
    if stop < len(steps.times):
        return steps.at(stop)
    return steps.when(steps.times[-1] + steps.step)


# --------------------------------------------------------------------------------- tonight


if TYPE_CHECKING:
    import pandas as pd

    from idlegpu.scheduler.refresh import Refresh


@dataclass(frozen=True)
class Tonight:
    """The plan from ``start`` over ``horizon``, and what it was made from."""

    start: datetime
    horizon: timedelta
    refresh: Refresh  # the forecast refresh (``made_at``, the free GPUs, the widened services)
    free: pd.Series  # free GPUs at the confidence, start .. start + horizon
    plan: NightPlan
    windows: pd.DataFrame  # idlegpu.forecast.capacity.windows_frame: start, end, gpus, hours, ...
    blocked: tuple[Any, ...] = field(default=())  # units waiting for a previous pipeline step
    confidence: float = 0.9
    median_windows: pd.DataFrame | None = None  # the same of the median free GPUs, if known


def planning_estimate(settings, runs=None) -> Callable[[Any], float]:
    """Seconds the admitter plans a unit with: the runtime estimator (past runs of the same
    family at the configured quantile, a model on parameters, the user's estimate times the
    safety factor, else a 4-hour guess); ``runs``: a table of past runs (``load_runs``)."""
    return RuntimeEstimator.from_config(runs, settings.admission).seconds


def store_queue(job_store, settings, estimate: Callable[[Any], float], start: datetime):
    """The queue, what already runs (it holds its GPUs) and each team's recent GPU-hours (fair
    share) from a job store, at ``start``: ``(queue, running, usage)``."""
    overruns = overruns_of(((work_s, estimate(row.spec)) for row, work_s
                            in job_store.finished_runs()), settings.admission.runtime_quantile)
    ready = job_store.ready_units(start)
    restart_s = float(settings.admission.restart_cost_seconds)
    queue = waiting_jobs(ready, {row.id: estimate(row.spec) for row in ready}, overruns,
                         restart_cost_s=restart_s)
    holding = job_store.holding()
    running = running_jobs(holding, start, {row.id: estimate(row.spec) for row in holding},
                           overruns, restart_cost_s=restart_s)
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

    profile = profile or refreshed.profile
    start = start or profile.start
    confidence = settings.admission.confidence
    tz = settings.pool.tz
    result = plan_ahead(start, profile, queue,
                        policy_settings(settings.admission, settings.pool.headroom_gpus,
                                        settings.pool.total_gpus),
                        horizon=horizon, running=running, team_usage=team_usage, tz=tz)
    origin = pd.Timestamp(start).floor(f"{profile.step_s}s")

    def stretch(series: pd.Series) -> pd.Series:
        return series[(series.index >= origin) & (series.index < pd.Timestamp(start) + horizon)]

    def windows(series: pd.Series, at: float) -> pd.DataFrame:
        found = idle_windows(series, confidence=at, granularity=granularity,
                             min_hours=min_hours) if len(series) >= 2 else []
        return windows_frame(found, tz)

    free = stretch(refreshed.free)
    median = None if refreshed.likely is None else windows(stretch(refreshed.likely), 0.5)
    return Tonight(start, horizon, refreshed, free, result, windows(free, confidence),
                   tuple(blocked), confidence, median)
