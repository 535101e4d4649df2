"""The simulated job units: what a trace gives (``SimJob``), the state of each as it runs
(``_Job``), and what the policy sees of it; stops, notices and evictions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import numpy as np

from idlegpu.scheduler.simulate.results import _Run
from idlegpu.scheduler.types import Overruns, RunningJob, WaitingJob, reload_s


@dataclass(frozen=True)
class SimJob:
    """One job unit of a trace, with the truth the policy does not know (``work_s``)."""

    id: str
    team: str
    kind: str
    gpus: int
    submit_at: datetime
    work_s: float
    """Seconds of work it really needs."""
    estimate_s: float
    """What the admitter plans with (runtime estimate at the configured quantile)."""
    checkpointable: bool
    checkpoint_interval_s: float = 1800.0
    priority: int = 0
    deadline: datetime | None = None
    max_preemptions: int | None = None
    depends_on: tuple[str, ...] = ()
    min_gpus: int | None = None
    """Elastic: the fewest GPUs it can run on (None: ``gpus`` only); on fewer GPUs its work
    goes proportionally slower."""
    gpus_step: int = 1
    """Elastic: below ``gpus`` it runs on multiples of this many GPUs (whole replicas)."""
    nodes: int = 1
    """Pods of a multi-node (gang) unit, one per whole node (set by a simulation on nodes)."""
    saves_on_stop: bool = False
    """It saves all it did when told to stop (``checkpoint.saves_on_stop``): a planned stop
    loses it nothing."""

    def as_waiting(self, *, runtime_s: float | None = None, preemptions: int = 0,
                   reload_s: float = 0.0) -> WaitingJob:
        """What the policy sees of it in the queue (by default: never started)."""
        return WaitingJob(
            id=self.id, team=self.team, gpus=self.gpus,
            runtime_s=self.estimate_s if runtime_s is None else runtime_s,
            checkpointable=self.checkpointable, priority=self.priority,
            submitted_at=self.submit_at, deadline=self.deadline, preemptions=preemptions,
            max_preemptions=self.max_preemptions, kind=self.kind, min_gpus=self.min_gpus,
            gpus_step=self.gpus_step,
            checkpoint_interval_s=self.checkpoint_interval_s if self.checkpointable else None,
            reload_s=reload_s, **({"nodes": self.nodes} if self.nodes != 1 else {}),
        )


@dataclass
class _Job:
    spec: SimJob
    saved_s: float = 0.0
    progress_s: float = 0.0  # work since the last checkpoint of the current attempt
    # (work is counted in seconds at the full size: on n of g GPUs, n / g per second)
    gpus: int = 0  # what the current (or last) attempt holds
    resume_gpus: int | None = None  # a shrink under way: restarts on these after its grace
    resume_stop_by: datetime | None = None  # ... and must stop by then (None: runs on)
    running: bool = False
    releasing_until: datetime | None = None
    started_at: datetime | None = None
    last_checkpoint_at: datetime | None = None
    """Its last checkpoint; for an attempt that resumes, the end of its reload (it works, and
    its checkpoint clock runs, from then on)."""
    reloaded_at: datetime | None = None
    """An attempt that resumes from a checkpoint first reloads it (the restart cost): until
    then it holds its GPUs and does no work (None: a fresh start, whose load is part of its
    runtime)."""
    stop_by: datetime | None = None
    first_start: datetime | None = None
    finished_at: datetime | None = None
    preemptions: int = 0
    lost_s: float = 0.0
    where: dict[int, int] = field(default_factory=dict)
    """On nodes: the GPUs the current (or last) attempt holds on each node (by index)."""
    notice_until: datetime | None = None
    """A planned stop with notice under way: it works on until then (its answer, or the
    deadline when it never answers), then leaves (``_end_notice``)."""
    notice_answers: bool = False
    notice_close: tuple[str, bool] | None = None  # the stop's (cause, overran), closed later
    queued_view: tuple[tuple[float, int, int], WaitingJob] | None = None
    """The last ``as_waiting`` of it, with the (saved work, preemptions) it was made for: the
    replay asks every step, and it changes only when those do."""


def trace_jobs(entries, estimate: Callable[[object], float]) -> list[SimJob]:
    """Simulation jobs from a job trace (``specs.TraceEntry``): one per unit, ids
    ``<entry>-<name>-<step>-<member>``, ``estimate(unit)`` the seconds the admitter plans with."""
    jobs = []
    for n, entry in enumerate(entries):
        request = entry.request
        prefix = f"{n:04d}-{request.name}"
        for unit in entry.units():
            jobs.append(
                SimJob(
                    id=f"{prefix}-{unit.step_index}-{unit.member}",
                    team=request.team,
                    kind=unit.kind,
                    gpus=unit.gpus,
                    submit_at=entry.submit_at,
                    work_s=entry.actual_runtime_s(unit.step, unit.member),
                    estimate_s=float(estimate(unit)),
                    checkpointable=unit.checkpointable,
                    checkpoint_interval_s=unit.checkpoint_interval_s or 1800.0,
                    priority=unit.priority,
                    deadline=unit.deadline,
                    max_preemptions=unit.max_preemptions,
                    depends_on=tuple(f"{prefix}-{s}-{m}" for s, m in unit.depends_on),
                    min_gpus=unit.min_gpus,
                    gpus_step=unit.gpus_step,
                    saves_on_stop=unit.checkpointable and unit.saves_on_stop,
                )
            )
    return jobs


def shifted_jobs(jobs: Sequence[SimJob], by: timedelta) -> list[SimJob]:
    """The same jobs submitted ``by`` later (earlier when negative), their deadlines with them:
    one trace met by another stretch of the same traffic. A policy's figures on one stretch
    are one trajectory (which unit meets which ramp); over several shifts they say which
    differences are the policy's."""
    return [replace(j, submit_at=j.submit_at + by,
                    deadline=None if j.deadline is None else j.deadline + by) for j in jobs]


def _stop(job: _Job, now: datetime, grace: timedelta, *, planned: bool, runs: _Run,
          cause: str, shrink_to: int | None = None, at_will: bool = False,
          notice: tuple[float, bool] | None = None) -> None:
    """Start the grace period of a running job. A checkpointing job keeps what its periodic
    checkpoints saved and loses what it did since the last one: a stop's SIGTERM is no
    checkpoint (``SimJob.saves_on_stop``: workloads that save when told to stop, in the grace
    period, lose nothing at a planned stop). ``shrink_to``: a shrink, not a stop: after its
    grace period the job runs on with these GPUs (not a preemption either way). ``cause``:
    what stopped it (the run table's). ``at_will``: the clairvoyant's stop: any unit saves all
    it has done in its grace period. ``notice``: a planned stop told ahead, (seconds the unit
    works on, whether it answers): it saves and leaves at its answer, losing nothing, or is
    stopped blind when it never answers (``_end_notice`` closes it)."""
    overran = job.saved_s + job.progress_s > job.spec.estimate_s > 0
    if notice is not None and planned and job.spec.checkpointable and not at_will:
        works_s, answers = notice
        job.notice_until = now + timedelta(seconds=works_s)
        job.notice_answers = answers
        # an answer means it has saved: its pods exit at the SIGTERM that follows at once;
        # one that never answers is stopped at the deadline and gets its grace period
        job.releasing_until = job.notice_until + (timedelta(0) if answers else grace)
        job.notice_close = (cause, overran)
        job.stop_by = None
        job.resume_gpus = shrink_to
        return
    if at_will or (planned and job.spec.checkpointable and job.spec.saves_on_stop):
        job.saved_s += job.progress_s
        lost = 0.0
    else:
        lost = job.progress_s if job.spec.checkpointable else job.saved_s + job.progress_s
        if not job.spec.checkpointable:
            job.saved_s = 0.0
        job.preemptions += not planned and shrink_to is None
    job.lost_s += lost
    job.progress_s = 0.0
    # only a checkpointing job uses the grace period; the others are stopped at once
    job.releasing_until = now + (grace if job.spec.checkpointable or at_will
                                 else timedelta(0))
    job.stop_by = None
    job.resume_gpus = shrink_to
    outcome = "stopped" if planned or shrink_to is not None else "preempted"
    runs.close(job, job.releasing_until, outcome, lost, cause=cause, overran=overran)


def _end_notice(job: _Job, runs: _Run, *, cut: bool = False) -> None:
    """A planned stop's notice is over: answered, the unit has saved all it did; otherwise
    (no answer by the deadline, or the service cut it short: ``cut``) only its periodic
    checkpoints count, as at a blind stop."""
    outcome = "cut" if cut else "answered" if job.notice_answers else "missed"
    saved = job.progress_s if job.notice_answers else 0.0
    lost = 0.0 if job.notice_answers else job.progress_s
    job.saved_s += 0.0 if lost else job.progress_s
    job.lost_s += lost
    job.progress_s = 0.0
    cause, overran = job.notice_close or ("", False)
    job.notice_until = job.notice_close = None
    # a notice under way always has its release set with it (``_stop``, a cut)
    assert job.releasing_until is not None
    runs.close(job, job.releasing_until, "stopped", lost, cause=cause, overran=overran,
               notice=outcome, notice_saved_s=saved)


def _ends_by(job: _Job, now: datetime, when: datetime, step_s: int) -> bool:
    """Whether a running job finishes its true work by ``when`` (what the clairvoyant knows)."""
    left_s = (job.spec.work_s - job.saved_s - job.progress_s) / _rate(job)
    return now + timedelta(seconds=step_s * np.ceil(left_s / step_s)) <= when


def _evict(jobs, need: float) -> list[_Job]:
    """What the kube-scheduler evicts for the service: lowest priority, newest first."""
    if need <= 0:
        return []
    candidates = sorted(
        (j for j in jobs if j.running and j.releasing_until is None),
        key=lambda j: (j.spec.priority, -(j.started_at.timestamp()), j.spec.id),
    )
    chosen, freed = [], 0
    for job in candidates:
        if freed >= need:
            break
        chosen.append(job)
        freed += job.gpus
    return chosen


def _waiting(live: list[_Job], state: dict[str, _Job], step_s: int, overruns: Overruns, *,
             oracle: bool = False, at_will: bool = False,
             restart_cost_s: float = 0.0) -> list[WaitingJob]:
    """What the policy sees of the queue (``at_will``: every unit as one that checkpoints,
    without a preemption limit: the clairvoyant's); a unit that will resume from a checkpoint
    needs its reload (``restart_cost_s``) on top of the work it has left."""
    out = []
    for job in live:
        spec = job.spec
        if job.running:
            continue
        if any(state[d].finished_at is None for d in spec.depends_on if d in state):
            continue
        # past its estimate, what it has left depends on what the others overran
        learnt = len(overruns.ratios) if job.saved_s >= spec.estimate_s and not oracle else 0
        key = (job.saved_s, job.preemptions, learnt)
        if job.queued_view is None or job.queued_view[0] != key:
            left = (spec.work_s - job.saved_s if oracle
                    else overruns.remaining_s(spec.estimate_s, job.saved_s))
            reload = reload_s(spec.checkpointable, job.saved_s, restart_cost_s)
            view = spec.as_waiting(runtime_s=max(step_s, left + reload),
                                   preemptions=job.preemptions, reload_s=reload)
            if at_will:
                # (it saves at will: no interval bounds its segments)
                view = replace(view, checkpointable=True, max_preemptions=None,
                               checkpoint_interval_s=None)
            job.queued_view = (key, view)
        out.append(job.queued_view[1])
    return out


def _begin_attempt(job: _Job, now: datetime, gpus: int, stop_by: datetime | None,
                   restart_cost_s: float) -> None:
    """Start an attempt on ``gpus`` at ``now``. One that resumes from a checkpoint reloads it
    first, for ``restart_cost_s``; a fresh start's load is part of the unit's runtime, and a
    unit that does not checkpoint always starts afresh."""
    reload = reload_s(job.spec.checkpointable, job.saved_s, restart_cost_s)
    job.gpus, job.running, job.started_at = gpus, True, now
    job.reloaded_at = now + timedelta(seconds=reload) if reload > 0 else None
    job.last_checkpoint_at = job.reloaded_at or now
    job.stop_by, job.progress_s = stop_by, 0.0


def _working_s(job: _Job, since: datetime, until: datetime) -> float:
    """Seconds of ``[since, until)`` that ``job`` worked: not those it spent reloading."""
    if job.reloaded_at is not None and job.reloaded_at > since:
        since = job.reloaded_at
    return max(0.0, (until - since).total_seconds())


def _checkpoint(job: _Job, since: datetime, until: datetime) -> None:
    """The periodic checkpoints of a step's work, ``[since, until)``: each comes a whole
    interval after the last (or after its reload), at its own time within the step; the work
    after the latest stays unsaved."""
    interval = job.spec.checkpoint_interval_s
    last = job.last_checkpoint_at
    if last is None or interval <= 0 or (until - last).total_seconds() < interval:
        return
    at = last + timedelta(seconds=interval * ((until - last).total_seconds() // interval))
    after = min(job.progress_s, _working_s(job, max(at, since), until) * _rate(job))
    job.saved_s += job.progress_s - after
    job.progress_s = after
    job.last_checkpoint_at = at


def _reloading_s(job: _Job, now: datetime) -> float:
    """Seconds of its reload still ahead of ``job`` at ``now``."""
    if job.reloaded_at is None or job.reloaded_at <= now:
        return 0.0
    return (job.reloaded_at - now).total_seconds()


def _rate(job: _Job) -> float:
    """Seconds of (full-size) work per second at its current size: linear scaling."""
    return job.gpus / job.spec.gpus if job.spec.gpus and job.gpus else 1.0


def _running(job: _Job, now: datetime, step_s: int, overruns: Overruns, *,
             oracle: bool = False, at_will: bool = False, notice_s: float = 0.0) -> RunningJob:
    spec = job.spec
    done = job.saved_s + job.progress_s
    left = spec.work_s - done if oracle else overruns.remaining_s(spec.estimate_s, done)
    left /= _rate(job)  # on fewer GPUs the work left takes longer
    left += _reloading_s(job, now)
    assert job.started_at is not None  # only running jobs are asked (set when admitted)
    return RunningJob(
        id=spec.id, team=spec.team, gpus=job.gpus, priority=spec.priority,
        started_at=job.started_at, checkpointable=spec.checkpointable or at_will,
        remaining_s=max(step_s, left),
        last_checkpoint_at=job.last_checkpoint_at, stop_by=job.stop_by, kind=spec.kind,
        min_gpus=spec.min_gpus, gpus_step=spec.gpus_step, max_gpus=spec.gpus,
        deadline=spec.deadline, preemptions=job.preemptions,
        max_preemptions=spec.max_preemptions,
        nodes=tuple(f"node-{i}" for i in sorted(job.where)),
        checkpoint_interval_s=(spec.checkpoint_interval_s
                               if spec.checkpointable and not at_will else None),
        saves_on_stop=spec.checkpointable and spec.saves_on_stop,
        notice_s=(notice_s if spec.checkpointable and not spec.saves_on_stop and not at_will
                  else 0.0),
    )
