"""The ports the controller drives: a cluster that runs Jobs, and live serving signals.

Adapters implement them (``scheduler/adapters/kubernetes.py``, ``scheduler/adapters/vllm.py``);
tests and the simulator use in-memory fakes. Times are passed in, never read inside.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from forecast.errors import PermanentError
from scheduler.types import ServingSignals, UnitSpec


class JobRejectedError(PermanentError):
    """The cluster refuses this Job itself (invalid, unsafe, or its name taken by someone
    else's Job): retrying cannot help, so the unit fails with the cluster's reason."""


class JobPhase(StrEnum):
    """What the cluster says about one Job of ours."""

    PENDING = "pending"  # created, no pod running yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUSPENDED = "suspended"  # stopped by us (checkpoint-and-stop or preemption)
    DISRUPTED = "disrupted"  # evicted by the cluster (DisruptionTarget), not a failure

    def is_over(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.SUSPENDED,
                        JobPhase.DISRUPTED)


@dataclass(frozen=True)
class ClusterJob:
    name: str
    unit_id: str
    attempt: int
    phase: JobPhase
    gpus: int
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    message: str = ""


class Cluster(Protocol):
    def job_name(self, unit_id: str, attempt: int) -> str:
        """The deterministic name of a unit's attempt (same inputs, same name)."""

    def apply(self, unit_id: str, attempt: int, spec: UnitSpec, *, team: str,
              stop_by: datetime | None, now: datetime) -> str:
        """Create the attempt's Job, or adopt it when it already exists; returns its name.
        Raises ``JobRejectedError`` when the Job itself is refused, another ``IdlegpuError``
        when the cluster cannot take it now."""

    def stop(self, name: str, *, reason: str) -> None:
        """Stop a Job so it checkpoints (SIGTERM, grace period) and frees its GPUs; a Job
        that is already gone is fine."""

    def delete(self, name: str) -> None:
        """Remove a stopped Job of ours and its pods (a suspended Job is never cleaned up by
        the cluster: ``ttlSecondsAfterFinished`` only applies to finished ones); a Job that
        is already gone is fine."""

    def observe(self) -> list[ClusterJob]:
        """Every Job this system manages, with its phase."""


class SignalSource(Protocol):
    def read(self, now: datetime, *, job_gpus: int = 0) -> ServingSignals:
        """The services' live signals; ``observed_at`` is None or old when they are missing.
        ``job_gpus``: GPUs research jobs hold now, so ``idle_gpus`` counts only GPUs that
        neither the services nor the jobs hold."""
