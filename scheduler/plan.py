"""Tonight's plan: a dry run of ``decide()`` over the forecast, as a person reads it.

Pure: the caller passes the free-GPU profile, the queue, what runs now and the moment ``now``;
the plan steps through the profile, admitting and stopping as the policy would if the forecast
came true and every job took its estimated time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

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
    waiting: tuple[tuple[WaitingJob, str], ...]  # jobs that do not start, with the last reason


def plan_ahead(
    now: datetime,
    profile: FreeProfile,
    queue: Sequence[WaitingJob],
    settings: PolicySettings,
    *,
    running: Sequence[RunningJob] = (),
    team_usage: Mapping[str, float] | None = None,
    horizon: timedelta = timedelta(hours=24),
) -> NightPlan:
    step = timedelta(seconds=profile.step_s)
    waiting = {j.id: j for j in queue}
    active: dict[str, tuple[RunningJob, PlannedRun]] = {}
    for job in running:
        end = now + timedelta(seconds=job.remaining_s)
        active[job.id] = (job, PlannedRun(job.id, job.team, job.kind, job.gpus, job.started_at,
                                          end, "runs on", "already running"))
    runs: list[PlannedRun] = []
    last_reason: dict[str, str] = {}
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
        t += step
    for job, row in active.values():
        runs.append(replace(row, outcome="runs on" if row.end > t else row.outcome))
    runs.sort(key=lambda r: (r.start, r.job_id))
    return NightPlan(
        tuple(runs),
        tuple((job, last_reason.get(job.id, "")) for job in waiting.values()),
    )
