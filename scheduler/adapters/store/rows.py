"""The rows the job store returns (frozen dataclasses, no SQL): units, requests, attempts,
events, API tokens and submissions, the audit log's entries, the operators' controls and the
checkpoint notices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from idlegpu.scheduler.queue_view import attempt_spec
from idlegpu.scheduler.types import EventKind, JobState, NoticeOutcome, UnitSpec


class AttemptOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    """Returned to the queue by a reconciler: admitted but never started."""
    CANCELLED = "cancelled"
    SHRUNK = "shrunk"
    """An elastic unit checkpointed and went on in the next attempt on fewer GPUs."""


@dataclass(frozen=True)
class UnitRow:
    """One job unit as stored: everything a queue table or the admitter needs."""

    id: str
    request_id: str
    request_name: str
    team: str
    kind: str
    step: str
    step_index: int
    member: int
    gpus: int
    """GPUs the current attempt holds while it holds GPUs (an elastic unit may hold fewer than
    it asks for), else what the unit asks for (``spec.gpus``)."""
    priority: int
    checkpointable: bool
    state: JobState
    attempts: int
    """Admissions so far (the number of the current or last attempt)."""
    preemptions: int
    work_done_s: float
    """Checkpointed progress, in seconds of work (0 for a unit that cannot checkpoint)."""
    last_checkpoint_at: datetime | None
    submitted_at: datetime
    updated_at: datetime
    current_attempt: str | None
    """Id of the open attempt while the unit holds GPUs (ADMITTED or RUNNING)."""
    admitted_at: datetime | None
    """Admission of the current attempt."""
    started_at: datetime | None
    """Start of the current attempt (None until ``started``)."""
    stop_by: datetime | None
    cancel_requested_at: datetime | None
    """Set when a cancel found the unit holding GPUs: stop it, then call ``preempted``."""
    reason: str | None
    """Why it failed or was cancelled."""
    depends_on: tuple[str, ...]
    """Unit ids that must succeed first."""
    spec: UnitSpec
    shrink_to: int | None = None
    """Set while the unit is told to shrink: the GPUs of its next attempt."""

    @property
    def attempt_spec(self) -> UnitSpec:
        """What the current attempt runs: the spec on the attempt's GPUs (an elastic unit on
        fewer GPUs: CPU, memory and ``IDLEGPU_GPUS`` scaled, see ``queue_view.attempt_spec``)."""
        return attempt_spec(self)

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def image(self) -> str:
        return self.spec.image


@dataclass(frozen=True)
class RequestRow:
    id: str
    name: str
    team: str
    kind: str
    submitted_at: datetime
    idempotency_key: str | None
    raw: dict[str, Any]


@dataclass(frozen=True)
class AttemptRow:
    id: str
    unit_id: str
    number: int
    admitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    outcome: AttemptOutcome | None
    gpus: int
    gpu_seconds: float | None
    lost_gpu_seconds: float | None
    window_label: str | None
    stop_by: datetime | None
    work_done_at_start_s: float

    @property
    def open(self) -> bool:
        return self.ended_at is None


@dataclass(frozen=True)
class EventRow:
    id: int
    at: datetime
    kind: EventKind
    unit_id: str | None
    request_id: str | None
    team: str | None
    gpus: int | None
    gpu_seconds: float | None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CancelResult:
    """What ``cancel`` did: units now CANCELLED, units holding GPUs that the caller must stop
    (then report with ``preempted``), and units left alone because they already ended."""

    cancelled: tuple[str, ...]
    to_stop: tuple[str, ...]
    unchanged: tuple[str, ...]


@dataclass(frozen=True)
class ApiTokenRow:
    """A token of the job API as stored: never the token itself, only its SHA-256."""

    name: str
    team: str
    role: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    created_by: str

    def valid_at(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True)
class AuditEntry:
    """One change made through the job API (or ``idlegpu token``): who (``actor``, how they
    authenticated, their role and team), what (``action`` on ``target``), when and from
    where."""

    at: datetime
    actor: str
    auth: str
    role: str
    team: str | None
    action: str
    target: str
    address: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    id: int | None = None


@dataclass(frozen=True)
class ApiSubmission:
    """What ``submit_from_api`` did: the request's id, whether this call stored it (False: the
    caller's idempotency key named an earlier one), and that one's body hash."""

    request_id: str
    created: bool
    body_sha256: str


@dataclass(frozen=True)
class AdmissionState:
    """Pool-wide admission control (schema version 5): while ``paused`` the daemon admits
    nothing (stops, the backstop, reconciling and planned stops go on). ``since``, ``by`` and
    ``reason`` describe the pause in force; ``changed_at`` and ``changed_by`` the last change,
    a resume included."""

    paused: bool
    since: datetime | None = None
    by: str | None = None
    reason: str | None = None
    changed_at: datetime | None = None
    changed_by: str | None = None


@dataclass(frozen=True)
class AdmissionChange:
    """What ``pause_admission`` / ``resume_admission`` did: the state now, and whether this
    call changed it (False: it already was so; a second pause keeps the first's since, by
    and reason)."""

    state: AdmissionState
    changed: bool


@dataclass(frozen=True)
class DaemonStatus:
    """One daemon replica as it reported itself after its last pass (schema version 5).

    ``identity``: the replica (its leader-election identity, else ``<host>-<pid>``); ``role``:
    ``single`` (no leader election), ``leader`` or ``standby``; the times are the daemon's
    clock; ``admitted``, ``stopped``, ``errors``: the counts of its last pass;
    ``signals_age_s``: the live signals' age at that pass (None: never read)."""

    identity: str
    host: str
    pid: int
    role: str
    updated_at: datetime
    reconcile_seconds: int = 60
    last_reconcile_at: datetime | None = None
    last_backstop_at: datetime | None = None
    last_pass: str | None = None
    admitted: int = 0
    stopped: int = 0
    errors: int = 0
    forecast_made_at: datetime | None = None
    signals_age_s: float | None = None


@dataclass(frozen=True)
class SubmitQuota:
    """What one API caller may hold (``api.teams.<team>.quota`` / ``api.users``): checked in
    the submission's own transaction, so two submissions at once cannot both pass it."""

    live_units: int
    requests_per_hour: int
    stored_bytes: int
    setting: str = "api.teams.<team>.quota"


@dataclass(frozen=True)
class NoticeRow:
    """A checkpoint notice sent to an attempt (``JobStore.send_notice``)."""

    attempt_id: str
    unit_id: str
    attempt: int
    sent_at: datetime
    deadline: datetime
    reason: str
    delivered_at: datetime | None
    shrink_to: int | None
    shrink_stop_by: datetime | None
    acked_at: datetime | None
    ack_step: int | None
    ack_path: str | None
    outcome: NoticeOutcome | None
    closed_at: datetime | None

    @property
    def open(self) -> bool:
        return self.outcome is None


@dataclass(frozen=True)
class WorkloadReport:
    """What ``JobStore.workload_report`` did with a report: ``recorded`` (it counts),
    ``late`` (for an attempt that ended or a notice already closed: kept, changes nothing),
    the attempt it was for, and the open notice it answered, if any."""

    recorded: bool
    late: bool
    attempt: int | None
    answered_notice: bool = False
    work_done_s: float | None = None
    retry_after_s: float | None = None
    """Set when the report came sooner after the last one than ``REPORT_EVERY_S`` allows:
    nothing was recorded (the answer to an open notice is never held back)."""
