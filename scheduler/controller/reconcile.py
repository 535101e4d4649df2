"""Step 1 of a pass (``idlegpu.scheduler.controller``): bring the store in line with the cluster.

The cluster is the truth about Jobs, the store the truth about the queue: each unit holding GPUs
moves on from what the cluster reports of its attempt's Job (started, finished, failed, stopped:
back to the queue, its progress kept; shrunk: the next attempt created on fewer GPUs), an
ADMITTED unit whose Job is missing gets it created again under the same name, an attempt whose
pods never land is stopped and requeued (a gang all or none), and Jobs whose attempt the store
has closed are deleted. Also the actions on the cluster every step of a pass shares: create a
Job (after the daemon's own rules), stop one, delete one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from idlegpu.forecast.errors import IdlegpuError
from idlegpu.scheduler.controller.report import PassReport
from idlegpu.scheduler.ports import (
    Cluster,
    ClusterJob,
    JobPhase,
    JobRejectedError,
    JobStore,
    StopKind,
)
from idlegpu.scheduler.specs import memory_per_node, quantity_bytes
from idlegpu.scheduler.types import JobState


def _rate(row) -> float:
    """Seconds of work per second of the unit's current attempt: an elastic unit on fewer
    GPUs than it asks for does proportionally less (``work_done_s`` is at full size)."""
    return row.gpus / row.spec.gpus if 0 < row.gpus < row.spec.gpus else 1.0


def _kept_by_stop(row, stopped: datetime) -> tuple[float, float]:
    """``(work_done_s, lost GPU-seconds)`` of a checkpointable unit's attempt stopped as
    planned at ``stopped``. A workload that saves when told to stop (``saves_on_stop``) keeps
    everything; any other keeps what its periodic checkpoints saved: one every checkpoint
    interval from its last known checkpoint of this attempt, else the attempt's start (the
    simulator's and ``decide()``'s model), and loses the rest."""
    began = row.started_at
    ran = max(0.0, (stopped - began).total_seconds())
    if getattr(row.spec, "saves_on_stop", False):
        return row.work_done_s + ran * _rate(row), 0.0
    since = row.last_checkpoint_at
    if since is None or since < began:
        since = began  # from an earlier attempt: already in work_done_s
    since = min(since, max(stopped, began))
    interval = getattr(row.spec, "checkpoint_interval_s", None) or 0.0
    after = max(0.0, (stopped - since).total_seconds())
    saved_s = interval * (after // interval) if interval > 0 else 0.0
    # ``work_done_s`` is what was saved by ``since``; the periodic checkpoints add whole
    # intervals after it
    return row.work_done_s + saved_s * _rate(row), row.gpus * (after - saved_s)


def unit_pods(spec) -> int:
    """Pods of a unit: one, or a multi-node unit's nodes."""
    return max(1, int(getattr(spec, "nodes", 1) or 1))


def pod_requests(spec) -> tuple[float | None, int | None]:
    """CPU cores and memory bytes one pod of a unit requests (None: not readable; a
    multi-node unit shares its totals evenly over its pods)."""
    pods = unit_pods(spec)
    try:
        memory = int(quantity_bytes(spec.memory)) // pods
    except (ValueError, TypeError, AttributeError):
        memory = None
    cpu = getattr(spec, "cpu", None)
    return (float(cpu) / pods if cpu is not None else None), memory


class Reconciler:
    """The reconcile steps of ``Controller`` and the cluster actions it shares with them; the
    state is the controller's (set in its ``__init__``)."""

    store: JobStore
    cluster: Cluster
    recheck: Callable[[object], None] | None
    dry_run: bool
    pending_timeout_s: float | None
    stop_timeout_s: float | None
    max_unscheduled_attempts: int | None
    gang_timeout_s: float | None
    _stopping: dict[str, int]
    _claims: dict[str, tuple[str, tuple[str, ...], int, float, int]]

    def _reconcile(self, now: datetime, report: PassReport) -> bool:
        """Bring the store in line with the cluster; False when the cluster cannot be read."""
        try:
            jobs = {job.name: job for job in self.cluster.observe()}
        except IdlegpuError as exc:
            report.errors.append(f"cluster: {exc}")
            return False
        for row in self.store.holding():
            name = self.cluster.job_name(row.id, row.attempts)
            job = jobs.get(name)
            try:
                if job is None:
                    self._missing_job(row, name, now, report)
                else:
                    self._follow(row, job, now, report)
            except IdlegpuError as exc:
                report.errors.append(f"{row.id}: {exc}")
        for row in self.store.to_stop():  # cancelled while holding GPUs
            name = self.cluster.job_name(row.id, row.attempts)
            if name in jobs and jobs[name].stop_kind is None:
                self._stop(name, "cancelled by user", StopKind.CANCEL, now, report)
        self._delete_released(jobs, report)
        return True

    def _delete_released(self, jobs: dict[str, ClusterJob], report: PassReport) -> None:
        """Delete suspended Jobs whose attempt the store has closed: the cluster never cleans
        them up. Deleting only after the store recorded the end (this pass or an earlier one,
        before a crash) means no attempt is ever forgotten."""
        current = {self.cluster.job_name(row.id, row.attempts) for row in self.store.holding()}
        for job in jobs.values():
            if job.phase in (JobPhase.SUSPENDED, JobPhase.STOPPING) and job.name not in current:
                self._delete(job.name, report)

    def _missing_job(self, row, name: str, now: datetime, report: PassReport) -> None:
        if row.state is JobState.ADMITTED:
            # admitted, then the process died (or the cluster was down) before the Job existed
            try:
                self._recheck(row)
                self.cluster.apply(row.id, row.attempts, row.attempt_spec, team=row.team,
                                   stop_by=row.stop_by, now=now,
                                   **self._pinned(row, name))
            except JobRejectedError as exc:
                self._reject(row.id, now, exc, report)
                return
            report.recreated.append(name)
        else:  # RUNNING but the Job vanished (deleted by hand, namespace wiped)
            self.store.preempted(row.id, now, reason="its Job disappeared from the cluster")
            report.released.append(row.id)

    def _pinned(self, row, name: str) -> dict[str, tuple[str, ...]]:
        """``apply``'s ``nodes`` for the Job ``name``: the nodes its admission counted on (still
        claimed by this process), so its pods do not land on a node kept for another unit;
        none when not known (after a restart: the kube-scheduler places it, a gang's pods
        still kept apart, and the gang timeout rolls back what does not fit)."""
        claim = self._claims.get(row.id)
        if claim is not None and claim[0] == name:
            return {"nodes": claim[1]}
        return {}

    def _gang_overdue(self, row, job: ClusterJob, now: datetime) -> bool:
        """A gang admitted but not all of its pods bound to a node ``gang_timeout_s`` after
        its Job was created (all bound but not yet running, e.g. pulling a large image: the
        pending timeout's business)."""
        if (job.pods <= 1 or self.gang_timeout_s is None or row.state is not JobState.ADMITTED
                or job.pods_bound >= job.pods):
            return False
        since = job.created_at or row.admitted_at
        return since is not None and (now - since).total_seconds() > self.gang_timeout_s

    def _follow(self, row, job: ClusterJob, now: datetime, report: PassReport) -> None:
        if job.phase.is_over():
            self._stopping.pop(row.id, None)
        elif job.stop_kind is not None:  # told to stop (maybe by a process before this one)
            self._stopping.setdefault(row.id, row.gpus - (row.shrink_to or 0)
                                      if job.phase is JobPhase.STOPPING else 0)
        if job.phase is JobPhase.STOPPING:
            # its pods still terminate: never recorded started, never released while they
            # hold GPUs, unless they never end (a dead node never confirms)
            if self._stop_overdue(job, now):
                self._release_stopped(row, job, now, report, overdue=True)
                self._delete(job.name, report)
        elif job.phase is JobPhase.RUNNING and row.state is JobState.ADMITTED:
            self.store.started(row.id, self._on_our_clock(job.started_at, row, now))
            report.started.append(row.id)
        elif (job.phase is JobPhase.PENDING and row.state is JobState.RUNNING
              and job.stop_kind is None):
            # it ran, and now its pod waits again: the kube-scheduler evicted it for a serving
            # pod (our PriorityClass) or its node failed, and the Job made a new pod that waits
            # for GPUs. Stop it; the unit goes back to the queue and resumes from its checkpoint
            # when the policy finds room, rather than squatting on the first GPUs to free up.
            if self._stop(job.name, "its pod was evicted or lost; back to the queue",
                          StopKind.REQUEUE, now, report):
                self._stopping[row.id] = 0  # it holds no GPUs any more
        elif (job.phase is JobPhase.PENDING and job.stop_kind is None
              and self._gang_overdue(row, job, now)):
            # all or none: pods placed without their siblings would hold GPUs for nothing
            waited = self.gang_timeout_s or 0
            if self._stop(job.name, (
                    f"gang not placed whole: {job.pods_bound} of {job.pods} pods on a node "
                    f"within {waited:.0f} s of its Job; rolled back, its GPUs returned, back "
                    "to the queue"), StopKind.UNSCHEDULED, now, report):
                self._stopping[row.id] = 0
                self._claims.pop(row.id, None)
        elif (job.phase is JobPhase.PENDING and row.state is JobState.ADMITTED
              and self._pending_too_long(row, now) and job.stop_kind is None):
            # the pool had the GPUs but no node could place the pod (GPUs spread over nodes, a
            # taint, a quota): give the capacity back to the plan rather than wait all night
            minutes = (self.pending_timeout_s or 0) / 60
            if self._stop(job.name, f"not scheduled within {minutes:.0f} min; back to the "
                          "queue", StopKind.UNSCHEDULED, now, report):
                self._stopping[row.id] = 0
        elif job.phase is JobPhase.SUCCEEDED:
            self.store.finished(row.id, self._on_our_clock(job.finished_at, row, now))
            report.finished.append(row.id)
        elif job.phase is JobPhase.FAILED:
            self.store.failed(row.id, self._on_our_clock(job.finished_at, row, now),
                              job.message or "the Job failed")
            report.failed.append(row.id)
        elif job.phase in (JobPhase.SUSPENDED, JobPhase.DISRUPTED):
            self._release_stopped(row, job, now, report)

    def _release_stopped(self, row, job: ClusterJob, now: datetime, report: PassReport, *,
                         overdue: bool = False) -> None:
        """A stopped Job's unit goes back to the queue. What the stop meant is read back from
        the Job (its stop kind), not remembered, so a restart or the other replica counts a
        planned stop as planned."""
        self._stopping.pop(row.id, None)
        why = job.message or "stopped"
        if row.shrink_to is not None:
            self._restart_smaller(row, job, now, report)
            return
        if overdue:
            assert self.stop_timeout_s is not None  # overdue: only past a stop timeout
            why = (f"its pods did not end within {self.stop_timeout_s / 60:.0f} min of the stop "
                   f"(node lost?); released: {why}")
        if row.state is JobState.ADMITTED:
            # stopped before it ever ran: back to the queue, not a preemption, nothing lost;
            # unless it never ran time after time because no node can place it
            if job.stop_kind is StopKind.UNSCHEDULED and self._unplaceable(row):
                pods = unit_pods(row.spec)
                if pods > 1:
                    text = (f"its {pods} pods were never all placed in "
                            f"{self.max_unscheduled_attempts} attempts in a row (each pod asks "
                            f"{row.spec.gpus_per_node} GPUs, cpu {row.spec.cpu_per_node:g}, "
                            f"memory {memory_per_node(row.spec)}); make the request fit the "
                            "pool's nodes, or ask for fewer nodes")
                else:
                    text = (f"no node could place its pod in {self.max_unscheduled_attempts} "
                            f"attempts of {(self.pending_timeout_s or 0) / 60:.0f} min each "
                            f"(asks {row.gpus} GPUs, cpu {row.spec.cpu:g}, memory "
                            f"{row.spec.memory}); make the request fit one node of the pool")
                self.store.failed(row.id, now, text)
                report.failed.append(row.id)
                return
            self.store.requeue_admitted(row.id, now, reason=why)
            report.released.append(row.id)
            return
        planned = job.stop_kind is StopKind.PLANNED and row.checkpointable
        lost = 0.0 if planned else None
        if planned and row.started_at is not None:
            work, lost = _kept_by_stop(row, min(job.stopped_at or now, now))
            if work > row.work_done_s:
                self.store.checkpointed(row.id, now, work)
        self.store.preempted(row.id, now, lost_gpu_seconds=lost,
                             reason="stopped as planned" if planned else why)
        report.released.append(row.id)

    def _restart_smaller(self, row, job: ClusterJob, now: datetime, report: PassReport) -> None:
        """A shrinking unit's Job stopped: save its progress (a planned stop checkpointed), open
        the attempt on ``shrink_to`` GPUs and create its Job."""
        planned = job.stop_kind is StopKind.PLANNED and row.checkpointable
        work = lost = None
        if planned and row.started_at is not None:
            work, lost = _kept_by_stop(row, min(job.stopped_at or now, now))
        elif planned:
            work = row.work_done_s  # stopped before it ran: nothing new, nothing lost
        attempt = self.store.shrunk(row.id, now, work_done_s=work, lost_gpu_seconds=lost,
                                    reason=f"shrunk from {row.gpus} to {row.shrink_to} GPUs")
        report.released.append(row.id)
        if attempt is None:  # a cancel came first
            return
        report.shrunk.append(row.id)
        row = self.store.unit(row.id)
        self._create(row, attempt, row.stop_by, now, report)

    def _create(self, row, attempt: int, stop_by: datetime | None, now: datetime,
                report: PassReport) -> None:
        """Create the Job of ``row``'s (ADMITTED) attempt; the unit fails if it is refused."""
        try:
            self._recheck(row)
            name = self.cluster.apply(
                row.id, attempt, row.attempt_spec, team=row.team, stop_by=stop_by, now=now,
                **self._pinned(row, self.cluster.job_name(row.id, attempt)))
            report.created.append(name)
        except JobRejectedError as exc:
            self._reject(row.id, now, exc, report)
        except IdlegpuError as exc:
            report.errors.append(f"{row.id}: admitted, Job not created yet ({exc})")

    def _unplaceable(self, row) -> bool:
        """This attempt and the ones before it in a row never ran."""
        if self.max_unscheduled_attempts is None:
            return False
        never_ran = 1
        for attempt in sorted(self.store.attempts(row.id), key=lambda a: -a.number):
            if attempt.open:
                continue
            if attempt.started_at is not None or attempt.outcome != "requeued":
                break
            never_ran += 1
        return never_ran >= self.max_unscheduled_attempts

    def _stop_overdue(self, job: ClusterJob, now: datetime) -> bool:
        if self.stop_timeout_s is None or job.stopped_at is None:
            return False
        return (now - job.stopped_at).total_seconds() > self.stop_timeout_s

    @staticmethod
    def _on_our_clock(when: datetime | None, row, now: datetime) -> datetime:
        """A time the cluster reported, kept within what this unit's attempt can have seen:
        not before its admission, not after this pass (None: this pass)."""
        if when is None:
            return now
        if row.admitted_at is not None and when < row.admitted_at:
            return row.admitted_at
        return min(when, now)

    def _pending_too_long(self, row, now: datetime) -> bool:
        if self.pending_timeout_s is None or row.admitted_at is None:
            return False
        return (now - row.admitted_at).total_seconds() > self.pending_timeout_s

    def _reject(self, unit_id: str, now: datetime, exc: Exception, report: PassReport) -> None:
        """The cluster refuses the Job itself: the unit fails with the reason (and its
        dependants are cancelled) instead of being retried every pass for ever."""
        report.errors.append(f"{unit_id}: the cluster refused its Job ({exc})")
        if not self.dry_run:
            self.store.failed(unit_id, now, f"the cluster refused its Job: {exc}")
            report.failed.append(unit_id)

    def _recheck(self, row) -> None:
        """The daemon's own admission rules on the stored unit: a store written by a
        submitter with other rules (or by hand) never gets past them."""
        if self.recheck is None:
            return
        try:
            self.recheck(row)
        except IdlegpuError as exc:
            raise JobRejectedError(str(exc)) from exc

    def _stop(self, name: str, reason: str, kind: StopKind, now: datetime,
              report: PassReport) -> bool:
        try:
            self.cluster.stop(name, reason=reason, kind=kind, now=now)
            report.stopped.append(name)
            return True
        except IdlegpuError as exc:
            report.errors.append(f"{name}: stop failed ({exc})")
            return False

    def _delete(self, name: str, report: PassReport) -> None:
        try:
            self.cluster.delete(name)
            report.deleted.append(name)
        except IdlegpuError as exc:
            report.errors.append(f"{name}: delete failed ({exc})")
