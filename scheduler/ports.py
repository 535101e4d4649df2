"""The ports the controller drives: a cluster that runs Jobs, live serving signals, the job
store that holds the queue, and Kueue's Workloads that wait on idlegpu's admission check.

Adapters implement them (``scheduler/adapters/kubernetes/``, ``scheduler/adapters/vllm.py``);
tests and the simulator use in-memory fakes. Times are passed in, never read inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from idlegpu.forecast.errors import PermanentError
from idlegpu.scheduler.admission_checks import CheckUpdate, KueueReading
from idlegpu.scheduler.types import (
    ExternalUnit,
    JobState,
    NodeView,
    NoticeOutcome,
    ServingSignals,
    UnitSpec,
)

if TYPE_CHECKING:  # the rows the store returns (annotations only: no SQLAlchemy here)
    from idlegpu.scheduler.adapters.store.rows import (
        AdmissionState,
        AttemptRow,
        DaemonStatus,
        NoticeRow,
        UnitRow,
    )


class JobRejectedError(PermanentError):
    """The cluster refuses this Job itself (invalid, unsafe, or its name taken by someone
    else's Job): retrying cannot help, so the unit fails with the cluster's reason."""


class JobPhase(StrEnum):
    """What the cluster says about one Job of ours."""

    PENDING = "pending"  # created, no pod running yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPING = "stopping"  # told to stop; its pods still terminate and hold their GPUs
    SUSPENDED = "suspended"  # stopped by us (checkpoint-and-stop or preemption), pods gone
    DISRUPTED = "disrupted"  # evicted by the cluster (DisruptionTarget), not a failure

    def is_over(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.SUSPENDED,
                        JobPhase.DISRUPTED)


class StopKind(StrEnum):
    """Why we stopped a Job. Written on the Job with the stop itself, so whoever sees the
    Job end (this process after a restart, the other replica) knows what the stop meant."""

    PLANNED = "planned"  # checkpoint-and-stop before the forecast ramp: no work is lost
    PREEMPT = "preempt"  # the live backstop took the GPUs back: work since the checkpoint lost
    REQUEUE = "requeue"  # its pod was evicted or lost and waits again: back to the queue
    UNSCHEDULED = "unscheduled"  # no node placed its pod in time: back to the queue
    CANCEL = "cancel"  # a user cancelled it


@dataclass(frozen=True)
class ClusterJob:
    """One Job of ours as the cluster reports it. Times are on the daemon's clock (the
    adapter maps the server's clock onto it); ``started_at`` is when the workload really
    started (its container), not when the Job was created or its pod was scheduled."""

    name: str
    unit_id: str
    attempt: int
    phase: JobPhase
    gpus: int
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    message: str = ""
    stop_kind: StopKind | None = None
    """Set once we stopped it (the first stop's kind stands)."""
    stopped_at: datetime | None = None
    """When we told it to stop (daemon clock)."""
    pods: int = 1
    """Pods the Job runs at once (a multi-node gang: its nodes)."""
    pods_bound: int = 0
    """Of its pods not ended, those bound to a node (a gang waits for all of them)."""


class Cluster(Protocol):
    def job_name(self, unit_id: str, attempt: int) -> str:
        """The deterministic name of a unit's attempt (same inputs, same name)."""

    def apply(self, unit_id: str, attempt: int, spec: UnitSpec, *, team: str,
              stop_by: datetime | None, now: datetime, nodes: tuple[str, ...] | None = None
              ) -> str:
        """Create the attempt's Job, or adopt it when it already exists; returns its name.
        ``nodes``: the nodes its pods are pinned to (one each), the ones admission counted
        on; None: where the kube-scheduler binds them.
        Raises ``JobRejectedError`` when the Job itself is refused, another ``IdlegpuError``
        when the cluster cannot take it now."""

    def stop(self, name: str, *, reason: str, kind: StopKind, now: datetime) -> None:
        """Stop a Job so it checkpoints (SIGTERM, grace period) and frees its GPUs, recording
        ``kind`` and ``now`` on the Job in the same write (a Job stopped before keeps its
        first kind and time); a Job that is already gone is fine."""

    def renew(self, name: str, *, stop_by: datetime | None) -> bool:
        """A renewed window: the Job's planned stop (and the cluster's safety-net deadline
        with it) moves to ``stop_by`` (None: none). False: the Job is gone, or changed
        meanwhile (the caller tries again next pass). Idempotent."""

    def request_checkpoint(self, name: str, *, deadline: datetime, reason: str,
                           now: datetime) -> int:
        """The checkpoint notice of a planned stop: tell the Job's pods to checkpoint by
        ``deadline`` (the annotation ``idlegpu.io/checkpoint-request``, which their notice
        file shows); returns how many pods carry it (0: none yet, call again). Idempotent."""

    def delete(self, name: str) -> None:
        """Remove a stopped Job of ours and its pods (a suspended Job is never cleaned up by
        the cluster: ``ttlSecondsAfterFinished`` only applies to finished ones); a Job that
        is already gone is fine."""

    def observe(self) -> list[ClusterJob]:
        """Every Job this instance of the daemon owns, with its phase (never another
        instance's, even in the same namespace)."""


class NodeSource(Protocol):
    """The optional part of a cluster: the nodes' free resources (a cluster without it is
    counted as one bin)."""

    def nodes(self, now: datetime | None = None) -> NodeView | None:
        """The node view; None: the cluster has none to offer."""


class SignalSource(Protocol):
    def read(self, now: datetime, *, job_gpus: int = 0) -> ServingSignals:
        """The services' live signals; ``observed_at`` is None or old when they are missing.
        ``job_gpus``: GPUs research jobs hold now, so ``idle_gpus`` counts only GPUs that
        neither the services nor the jobs hold."""


class JobStore(Protocol):
    """What the controller and the daemon ask of the job store
    (``idlegpu.scheduler.adapters.store.JobStore``): its rows and the units' transitions, each
    one transaction. The policy's inputs are built from the rows by ``queue_view``."""

    # -- reading
    def unit(self, unit_id: str) -> UnitRow:
        """One unit (``UnknownJobError`` when there is none)."""

    def holding(self) -> list[UnitRow]:
        """Units holding GPUs (ADMITTED or RUNNING), in submission order."""

    def ready_units(self, now: datetime) -> list[UnitRow]:
        """QUEUED units submitted by ``now`` whose dependencies all SUCCEEDED."""

    def to_stop(self) -> list[UnitRow]:
        """Units holding GPUs whose cancel was requested."""

    def finished_runs(self, limit: int = 500) -> list[tuple[UnitRow, float]]:
        """The ``limit`` units that SUCCEEDED last, each with the seconds of work it took."""

    def attempts(self, unit_id: str) -> list[AttemptRow]:
        """The unit's attempts, oldest first."""

    def team_gpu_hours(self, now: datetime, window_s: float) -> dict[str, float]:
        """GPU-hours each team's attempts held within ``[now - window_s, now]``."""

    def ended_attempt_seconds(self) -> list[tuple[str, float, float | None]]:
        """``(outcome, gpu_seconds, lost_gpu_seconds)`` of every ended attempt."""

    def admission(self) -> AdmissionState:
        """Whether admission is paused for the pool."""

    # -- transitions
    def admit(self, unit_id: str, now: datetime, stop_by: datetime | None = None,
              attempt_label: str | None = None, gpus: int | None = None) -> int:
        """QUEUED -> ADMITTED; returns the new attempt's number."""

    def started(self, unit_id: str, now: datetime) -> None:
        """ADMITTED -> RUNNING."""

    def checkpointed(self, unit_id: str, now: datetime, work_done_s: float) -> None:
        """A RUNNING checkpointable unit saved its progress."""

    def renew(self, unit_id: str, now: datetime, stop_by: datetime | None) -> None:
        """A unit holding GPUs runs on into a renewed window ending at ``stop_by``."""

    def shrinking(self, unit_id: str, now: datetime, gpus: int,
                  stop_by: datetime | None = None) -> None:
        """An elastic unit holding GPUs is told to shrink to ``gpus``."""

    def shrunk(self, unit_id: str, now: datetime, work_done_s: float | None = None,
               lost_gpu_seconds: float | None = None, reason: str | None = None) -> int | None:
        """A shrinking unit's Job stopped: its next attempt opens on fewer GPUs."""

    def preempted(self, unit_id: str, now: datetime, lost_gpu_seconds: float | None = None,
                  reason: str | None = None) -> JobState:
        """ADMITTED/RUNNING -> QUEUED (CANCELLED when a cancel was requested)."""

    def requeue_admitted(self, unit_id: str, now: datetime,
                         reason: str = "admitted but never started") -> JobState:
        """An ADMITTED unit whose Job never ran goes back to the queue."""

    def finished(self, unit_id: str, now: datetime) -> float:
        """ADMITTED/RUNNING -> SUCCEEDED; returns the attempt's GPU-seconds."""

    def failed(self, unit_id: str, now: datetime, reason: str) -> tuple[str, ...]:
        """-> FAILED; returns the dependants cancelled with it."""

    # -- checkpoint notices
    def send_notice(self, unit_id: str, now: datetime, deadline: datetime, reason: str, *,
                    shrink_to: int | None = None,
                    shrink_stop_by: datetime | None = None) -> NoticeRow:
        """Record a checkpoint notice for the unit's current attempt (idempotent)."""

    def notice_delivered(self, attempt_id: str, now: datetime) -> None:
        """The notice's annotation is on the attempt's pods."""

    def open_notices(self) -> list[NoticeRow]:
        """Notices sent and not closed yet, oldest first."""

    def close_notice(self, attempt_id: str, now: datetime, outcome: NoticeOutcome) -> bool:
        """The notice ended with ``outcome``; False: already closed."""

    def notice_counts(self, since: datetime | None = None) -> dict[str, int]:
        """Notices sent by outcome."""

    # -- the daemon's upkeep
    def record_daemon_status(self, status: DaemonStatus) -> None:
        """Write one daemon replica's status."""

    def record_external(self, units: Sequence[ExternalUnit], now: datetime,
                        origins: Sequence[str]) -> int:
        """What a pass saw of the units outside the store (Kueue Workloads, users' Jobs)."""

    def drop_ended_specs(self, before: datetime, now: datetime, *, batch: int = 500,
                         max_batches: int = 20) -> int:
        """Retention: drop the bulk of ended units' specs; returns how many."""


class AdmissionCheckSource(Protocol):
    """Kueue's Workloads that carry idlegpu's AdmissionChecks, and their check entries
    (``scheduler/adapters/kubernetes/kueue.py``)."""

    def read(self) -> KueueReading:
        """Our AdmissionChecks' ``Active`` conditions and the Workloads carrying them."""

    def set_active(self, check: str, active: tuple[bool, str, str]) -> None:
        """Write an AdmissionCheck's ``Active`` condition: (active, reason, message)."""

    def write(self, update: CheckUpdate) -> None:
        """Write one Workload's entry of our check (never another check's)."""
