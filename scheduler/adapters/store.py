"""The job store: job requests, their runnable units, every attempt to run them and the
accounting log, in one SQL database (SQLAlchemy 2.0 Core).

A SQLite file by default (``sqlite:///idlegpu.db``: WAL journal, foreign keys on, a busy
timeout, write transactions taken with ``BEGIN IMMEDIATE`` so concurrent writers queue up
instead of failing), PostgreSQL by URL (``postgresql+psycopg://user@host/db``) with the same
queries: nothing below the schema-migration lock is dialect-specific SQL.

**Schema** (version ``SCHEMA_VERSION``; ``schema_version`` holds one row per applied migration):

- ``requests``: one job request as submitted (``id``, ``name``, ``team``, ``kind``,
  ``submitted_at``, optional unique ``idempotency_key``, the ``raw`` request as JSON);
- ``units``: its runnable units, ``id = f"{request_id}-{step_index}-{member}"``, with the
  serialised ``UnitSpec`` (``spec`` JSON, datetimes ISO 8601), the ``state`` (a ``JobState``),
  a ``version`` bumped by every transition, ``attempts``, ``preemptions``, checkpointed
  progress ``work_done_s`` and ``last_checkpoint_at``, the ``current_attempt`` while it holds
  GPUs, its ``stop_by``, ``cancel_requested_at`` and the ``reason`` of a failure or cancel;
  ``shrink_to`` and ``shrink_stop_by`` (version 3): while an elastic unit is told to shrink,
  the GPUs its next attempt runs on and when that one must stop (NULL: it runs on);
- ``unit_deps``: ``(unit_id, depends_on)`` edges inside a request (from ``UnitSpec.depends_on``);
- ``attempts``: one row per admission, ``id = f"{unit_id}/{number}"``: ``admitted_at``,
  ``started_at``, ``ended_at``, ``outcome``, ``gpus``, ``gpu_seconds``, ``lost_gpu_seconds``,
  the admission window's ``window_label`` and ``stop_by``, ``work_done_at_start_s``;
- ``events``: the append-only accounting log (``id`` ascending = order of commit; ``at``,
  ``kind`` an ``EventKind``, ``unit_id``, ``request_id``, ``team``, ``gpus``, ``gpu_seconds``,
  ``detail`` JSON);
- ``api_tokens``, ``api_submissions``, ``audit_log`` (version 4, the job API): tokens by
  their SHA-256 with team, role, expiry and revocation; which caller (``principal``) submitted
  each request through the API, with the caller's idempotency key and the body's hash; every
  change made through the API or ``idlegpu token`` (who, role, team, action, target, when,
  from which address);
- ``admission_control``, ``daemon_status``, ``ended_sessions`` (version 5, the operators'
  controls): one row saying whether admission is paused for the pool (since when, by whom,
  why); per daemon replica what its last passes did and when (written after every pass);
  console sessions logged out before their expiry (so a logout ends the session on every
  ``idlegpu serve`` replica).
- ``workload_reports`` (version 7, cooperative checkpoints): per attempt, the checkpoint
  notice of a planned stop (sent, deadline, reason, delivered to the pods, the shrink it
  precedes, its outcome) with its acknowledgement, and the step, path and time of the
  checkpoints and progress the workload reported through the job API.

**Transitions** are one transaction each and compare-and-set: the unit row is read, the
expected state checked, then ``UPDATE units ... WHERE id = ? AND state = ? AND version = ?``;
if another process moved the unit in between, nothing is written and ``StaleStateError`` says
so. A retried or duplicated call therefore never admits a unit twice nor opens a second attempt;
a crash before the commit leaves the unit as it was, a crash after leaves the whole transition.

=========================  ============================  ============================
call                       from                          to
=========================  ============================  ============================
``admit``                  QUEUED (dependencies done)    ADMITTED (+ attempt opened)
``started``                ADMITTED                      RUNNING
``checkpointed``           RUNNING                       RUNNING (progress saved)
``preempted``              ADMITTED, RUNNING             QUEUED (CANCELLED if a cancel
                                                         was requested)
``requeue_admitted``       ADMITTED                      QUEUED (idem), not a preemption
``shrinking``              ADMITTED, RUNNING             unchanged, ``shrink_to`` set
``shrunk``                 ADMITTED, RUNNING             ADMITTED (attempt closed
                                                         ``shrunk``, the next opened on
                                                         ``shrink_to`` GPUs), not a
                                                         preemption
``finished``               ADMITTED, RUNNING             SUCCEEDED
``failed``                 QUEUED, ADMITTED, RUNNING     FAILED; dependants CANCELLED
``cancel``                 QUEUED                        CANCELLED; dependants too
``cancel``                 ADMITTED, RUNNING             unchanged, marked: stop it,
                                                         then ``preempted`` cancels it
=========================  ============================  ============================

**Accounting**: an attempt holds ``gpus`` GPUs from ``admitted_at`` to ``ended_at`` whatever
happens in between (the GPUs were the team's and nobody else's), so its ``gpu_seconds`` is
``gpus * (ended_at - admitted_at)``; ``lost_gpu_seconds`` is the part of it whose work was
thrown away (since the last checkpoint of the attempt, or since admission). An elastic unit's
attempt may hold fewer GPUs than the unit asks for (``admit(gpus=)``, ``shrunk``): the
attempt's ``gpus`` is what it held; ``work_done_s`` counts seconds of work at the unit's full
size (an attempt on ``n`` of ``gpus`` GPUs does ``n / gpus`` of it per second).

Times are passed in (``now``), never read from a clock here; they must be timezone-aware and
are stored as UTC.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import secrets
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from idlegpu.forecast.errors import PermanentError, TemporaryError
from idlegpu.forecast.redact import redact
from idlegpu.scheduler.types import (
    EventKind,
    JobState,
    NoticeOutcome,
    Overruns,
    RunningJob,
    UnitSpec,
    WaitingJob,
)

# --------------------------------------------------------------------------- errors


class StoreError(PermanentError):
    """The job store refused a call or cannot be used as it is (bad URL, newer schema, ...)."""


class SchemaVersionError(StoreError):
    """The database was written by a newer idlegpu than this one."""


class UnknownJobError(StoreError):
    """No request or unit has the id given."""


class InvalidRequestError(StoreError):
    """A submission is inconsistent (no units, duplicate units, unknown or cyclic dependencies)."""


class TransitionRefusedError(StoreError):
    """A transition does not apply to the unit as it is now."""


class QuotaExceededError(StoreError):
    """A submission past its caller's ``SubmitQuota``: ``quota`` (its name), ``limit``,
    ``used`` (before this one), ``asked`` (what this one adds) and ``retry_after_s`` (when it
    frees, if the store can tell: requests per hour; None: as units end)."""

    def __init__(self, message: str, *, quota: str, limit: int, used: int, asked: int,
                 retry_after_s: float | None) -> None:
        super().__init__(message)
        self.quota, self.limit, self.used, self.asked = quota, limit, used, asked
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class SubmitQuota:
    """What one API caller may hold (``api.teams.<team>.quota`` / ``api.users``): checked in
    the submission's own transaction, so two submissions at once cannot both pass it."""

    live_units: int
    requests_per_hour: int
    stored_bytes: int
    setting: str = "api.teams.<team>.quota"


class StaleStateError(TransitionRefusedError):
    """The unit is not in the state the caller expected: another process (or an earlier try of
    the same call) moved it first. Nothing was written; reload the unit and decide again."""

    def __init__(
        self, unit_id: str, action: str, expected: Sequence[JobState], actual: JobState | None
    ) -> None:
        wanted = " or ".join(s.value for s in expected)
        now = actual.value if actual is not None else "gone"
        super().__init__(
            f"cannot {action} unit {unit_id}: it is {now}, not {wanted} "
            "(another process changed it first; reload it and retry)"
        )
        self.unit_id = unit_id
        self.action = action
        self.expected = tuple(expected)
        self.actual = actual


class StoreUnavailableError(TemporaryError):
    """The database could not be reached or stayed locked past the busy timeout."""


# --------------------------------------------------------------------------- rows


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
        fewer GPUs: CPU, memory and ``IDLEGPU_GPUS`` scaled, see ``specs.resize_unit``)."""
        if self.gpus == self.spec.gpus or not self.state.holds_gpus():
            return self.spec
        from idlegpu.scheduler.specs import resize_unit
        return resize_unit(self.spec, self.gpus)

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


AUDIT_LOGGER = "idlegpu.audit"


# --------------------------------------------------------------------------- schema


class UTCDateTime(sa.types.TypeDecorator):
    """A timezone-aware datetime stored as naive UTC (portable across SQLite and PostgreSQL)."""

    impl = sa.DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()}: the store needs aware times")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


_ID = sa.String(160)
_BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # rowid alias on SQLite


def _define_tables(md: sa.MetaData, version: int = 6) -> dict[str, sa.Table]:
    """The tables as of schema ``version`` (1: what ``_v1_initial`` creates; the live
    definition is the newest).

    Never change what a released migration creates: a later migration that alters a table
    adds its change here under ``version >=`` its number (3: ``units.shrink_to``; 6: the
    indexes a caller's quota is read by, without reading the rows' JSON).
    """
    later: list[Any] = ([sa.Column("shrink_to", sa.Integer),
                         sa.Column("shrink_stop_by", UTCDateTime)] if version >= 3 else [])
    if version >= 6:
        later.append(sa.Index("ix_units_request_state", "request_id", "state"))
    requests = sa.Table(
        "requests", md,
        sa.Column("id", _ID, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("submitted_at", UTCDateTime, nullable=False),
        sa.Column("idempotency_key", sa.String(200), unique=True),
        sa.Column("raw", sa.JSON, nullable=False),
        *([sa.Index("ix_requests_submitted_at", "submitted_at")] if version >= 6 else []),
    )
    units = sa.Table(
        "units", md,
        sa.Column("id", _ID, primary_key=True),
        sa.Column("request_id", _ID, sa.ForeignKey("requests.id"), nullable=False),
        sa.Column("step", sa.Text, nullable=False),
        sa.Column("step_index", sa.Integer, nullable=False),
        sa.Column("member", sa.Integer, nullable=False),
        sa.Column("team", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("checkpointable", sa.Boolean, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("preemptions", sa.Integer, nullable=False),
        sa.Column("work_done_s", sa.Float, nullable=False),
        sa.Column("last_checkpoint_at", UTCDateTime),
        sa.Column("current_attempt", _ID),
        sa.Column("stop_by", UTCDateTime),
        sa.Column("cancel_requested_at", UTCDateTime),
        sa.Column("reason", sa.Text),
        sa.Column("submitted_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        *later,
        sa.UniqueConstraint("request_id", "step_index", "member", name="uq_units_step_member"),
        sa.Index("ix_units_state", "state"),
    )
    unit_deps = sa.Table(
        "unit_deps", md,
        sa.Column("unit_id", _ID, sa.ForeignKey("units.id"), primary_key=True),
        sa.Column("depends_on", _ID, sa.ForeignKey("units.id"), primary_key=True),
        sa.Index("ix_unit_deps_depends_on", "depends_on"),
    )
    attempts = sa.Table(
        "attempts", md,
        sa.Column("id", _ID, primary_key=True),
        sa.Column("unit_id", _ID, sa.ForeignKey("units.id"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("admitted_at", UTCDateTime, nullable=False),
        sa.Column("started_at", UTCDateTime),
        sa.Column("ended_at", UTCDateTime),
        sa.Column("outcome", sa.String(16)),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("gpu_seconds", sa.Float),
        sa.Column("lost_gpu_seconds", sa.Float),
        sa.Column("window_label", sa.Text),
        sa.Column("stop_by", UTCDateTime),
        sa.Column("work_done_at_start_s", sa.Float, nullable=False),
        sa.UniqueConstraint("unit_id", "number", name="uq_attempts_unit_number"),
        sa.Index("ix_attempts_admitted_at", "admitted_at"),
    )
    events = sa.Table(
        "events", md,
        sa.Column("id", _BIGINT_PK, primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("unit_id", _ID),
        sa.Column("request_id", _ID),
        sa.Column("team", sa.String(128)),
        sa.Column("gpus", sa.Integer),
        sa.Column("gpu_seconds", sa.Float),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.Index("ix_events_at", "at"),
        sqlite_autoincrement=True,  # ids never reused: the log's order is the commit order
    )
    return {t.name: t for t in (requests, units, unit_deps, attempts, events)}


METADATA = sa.MetaData()
_T = _define_tables(METADATA)
REQUESTS, UNITS, UNIT_DEPS, ATTEMPTS, EVENTS = (
    _T["requests"], _T["units"], _T["unit_deps"], _T["attempts"], _T["events"]
)

_VERSION_MD = sa.MetaData()
SCHEMA_VERSION_TABLE = sa.Table(
    "schema_version", _VERSION_MD,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.Text, nullable=False),
)


def _v1_initial(conn: Connection) -> None:
    md = sa.MetaData()
    _define_tables(md, version=1)
    md.create_all(conn)


_META_MD = sa.MetaData()
STORE_META = sa.Table(
    "store_meta", _META_MD,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)


def _v2_store_id(conn: Connection) -> None:
    # a random identity per store: two daemons with different stores in one namespace must
    # tell their Jobs apart (the default instance id is the pool name plus this)
    STORE_META.create(conn)
    conn.execute(sa.insert(STORE_META).values(key="store_id", value=secrets.token_hex(4)))


def _v3_shrink_to(conn: Connection) -> None:
    conn.execute(sa.text("ALTER TABLE units ADD COLUMN shrink_to INTEGER"))
    kind = UTCDateTime().impl_instance.compile(dialect=conn.dialect)  # TIMESTAMP / DATETIME
    conn.execute(sa.text(f"ALTER TABLE units ADD COLUMN shrink_stop_by {kind}"))


_API_MD = sa.MetaData()
API_TOKENS = sa.Table(
    "api_tokens", _API_MD,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("team", sa.String(128), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("expires_at", UTCDateTime),
    sa.Column("revoked_at", UTCDateTime),
    sa.Column("created_by", sa.Text, nullable=False),
)
API_SUBMISSIONS = sa.Table(
    "api_submissions", _API_MD,
    sa.Column("request_id", _ID, primary_key=True),
    sa.Column("principal", sa.String(300), nullable=False),
    sa.Column("idempotency_key", sa.String(200)),
    sa.Column("body_sha256", sa.String(64), nullable=False),
    sa.Column("address", sa.Text),
    # schema v6: bytes of the request's stored JSON (its body and its units' specs), for quotas
    sa.Column("stored_bytes", sa.BigInteger),
    sa.UniqueConstraint("principal", "idempotency_key", name="uq_api_submissions_key"),
    sa.Index("ix_api_submissions_principal", "principal"),
)
AUDIT_LOG = sa.Table(
    "audit_log", _API_MD,
    sa.Column("id", _BIGINT_PK, primary_key=True, autoincrement=True),
    sa.Column("at", UTCDateTime, nullable=False),
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("auth", sa.String(16), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("team", sa.String(128)),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("address", sa.Text),
    sa.Column("detail", sa.JSON, nullable=False),
    sa.Index("ix_audit_log_at", "at"),
    sqlite_autoincrement=True,
)


def _v4_api(conn: Connection) -> None:
    # new tables only (the job API's tokens, who submitted what, the audit log); the tables
    # of versions 1-3 are untouched. api_submissions as version 4 created it (v6 adds a column)
    API_TOKENS.create(conn)
    AUDIT_LOG.create(conn)
    md = sa.MetaData()
    sa.Table(
        "api_submissions", md,
        sa.Column("request_id", _ID, primary_key=True),
        sa.Column("principal", sa.String(300), nullable=False),
        sa.Column("idempotency_key", sa.String(200)),
        sa.Column("body_sha256", sa.String(64), nullable=False),
        sa.Column("address", sa.Text),
        sa.UniqueConstraint("principal", "idempotency_key", name="uq_api_submissions_key"),
        sa.Index("ix_api_submissions_principal", "principal"),
    ).create(conn)


def _v6_stored_bytes(conn: Connection) -> None:
    # the quota of stored bytes reads one number per request instead of every unit's JSON;
    # the requests stored before are measured once, here
    kind = sa.BigInteger().compile(dialect=conn.dialect)
    conn.execute(sa.text(f"ALTER TABLE api_submissions ADD COLUMN stored_bytes {kind}"))
    conn.execute(sa.text("CREATE INDEX ix_units_request_state ON units (request_id, state)"))
    conn.execute(sa.text("CREATE INDEX ix_requests_submitted_at ON requests (submitted_at)"))
    conn.execute(sa.text(
        "UPDATE api_submissions SET stored_bytes = "
        "COALESCE((SELECT SUM(LENGTH(CAST(u.spec AS TEXT))) FROM units u "
        "WHERE u.request_id = api_submissions.request_id), 0) + "
        "COALESCE((SELECT LENGTH(CAST(r.raw AS TEXT)) FROM requests r "
        "WHERE r.id = api_submissions.request_id), 0)"))


_V5_MD = sa.MetaData()
ADMISSION_CONTROL = sa.Table(
    "admission_control", _V5_MD,
    sa.Column("pool", sa.String(16), primary_key=True),  # one row, "pool"
    sa.Column("paused", sa.Boolean, nullable=False),
    sa.Column("since", UTCDateTime),
    sa.Column("paused_by", sa.Text),
    sa.Column("reason", sa.Text),
    sa.Column("changed_at", UTCDateTime),
    sa.Column("changed_by", sa.Text),
)
DAEMON_STATUS = sa.Table(
    "daemon_status", _V5_MD,
    sa.Column("identity", sa.String(253), primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("reconcile_seconds", sa.Integer, nullable=False),
    sa.Column("last_reconcile_at", UTCDateTime),
    sa.Column("last_backstop_at", UTCDateTime),
    sa.Column("last_pass", sa.String(16)),
    sa.Column("admitted", sa.Integer, nullable=False),
    sa.Column("stopped", sa.Integer, nullable=False),
    sa.Column("errors", sa.Integer, nullable=False),
    sa.Column("forecast_made_at", UTCDateTime),
    sa.Column("signals_age_s", sa.Float),
    sa.Column("updated_at", UTCDateTime, nullable=False),
)
ENDED_SESSIONS = sa.Table(
    "ended_sessions", _V5_MD,
    sa.Column("session_id", sa.String(64), primary_key=True),
    sa.Column("expires_at", UTCDateTime, nullable=False),
    sa.Column("ended_at", UTCDateTime, nullable=False),
    sa.Index("ix_ended_sessions_expires_at", "expires_at"),
)
_POOL = "pool"
MAX_PAUSE_REASON = 500
"""The longest reason a pause may give (characters, after joining it into one line)."""
DAEMON_STATUS_KEEP = timedelta(days=1)
"""A replica that has not reported for this long is forgotten (a restart is a new pid)."""


def _v5_operators(conn: Connection) -> None:
    # new tables only (pausing admission, the daemon replicas' status, ended console
    # sessions); the tables of versions 1-4 are untouched
    _V5_MD.create_all(conn)
    conn.execute(sa.insert(ADMISSION_CONTROL).values(pool=_POOL, paused=False))


_V7_MD = sa.MetaData()
WORKLOAD_REPORTS = sa.Table(
    "workload_reports", _V7_MD,
    sa.Column("attempt_id", _ID, primary_key=True),
    sa.Column("unit_id", _ID, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    # the checkpoint notice of a planned stop (NULL: none sent)
    sa.Column("notice_sent_at", UTCDateTime),
    sa.Column("notice_deadline", UTCDateTime),
    sa.Column("notice_reason", sa.Text),
    sa.Column("notice_delivered_at", UTCDateTime),
    sa.Column("shrink_to", sa.Integer),
    sa.Column("shrink_stop_by", UTCDateTime),
    sa.Column("notice_outcome", sa.String(16)),
    sa.Column("notice_closed_at", UTCDateTime),
    # the acknowledgement of that notice
    sa.Column("acked_at", UTCDateTime),
    sa.Column("ack_step", sa.BigInteger),
    sa.Column("ack_path", sa.Text),
    sa.Column("ack_saved_gpu_seconds", sa.Float),
    # what the workload reported last (periodic checkpoints and progress)
    sa.Column("checkpoint_step", sa.BigInteger),
    sa.Column("checkpoint_path", sa.Text),
    sa.Column("checkpoint_at", UTCDateTime),
    sa.Column("checkpoint_reported_at", UTCDateTime),
    sa.Column("progress_step", sa.BigInteger),
    sa.Column("progress_at", UTCDateTime),
    sa.Column("reports", sa.Integer, nullable=False),
    sa.Column("late_reports", sa.Integer, nullable=False),
    sa.Index("ix_workload_reports_open_notice", "notice_outcome", "notice_sent_at"),
)


def _v7_workload_reports(conn: Connection) -> None:
    # a new table only (checkpoint notices and what workloads report through the job API)
    _V7_MD.create_all(conn)


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


REPORT_EVERY_S = 5.0
"""The shortest interval between two recorded progress reports, or two checkpoint reports,
of one attempt: a workload that reports every batch costs one write per interval."""


Migration = tuple[str, Callable[[Connection], None]]
MIGRATIONS: list[Migration] = [
    ("initial schema: requests, units, unit_deps, attempts, events", _v1_initial),
    ("store_meta with the store's random id", _v2_store_id),
    ("units.shrink_to, shrink_stop_by: an elastic unit's next, smaller attempt",
     _v3_shrink_to),
    ("api_tokens, api_submissions, audit_log: the job API's identities and audit trail",
     _v4_api),
    ("admission_control, daemon_status, ended_sessions: the operators' controls",
     _v5_operators),
    ("api_submissions.stored_bytes and ix_units_request_state: the callers' quotas",
     _v6_stored_bytes),
    ("workload_reports: checkpoint notices, their acknowledgements, workloads' progress",
     _v7_workload_reports),
]
"""Applied in order at open, all pending ones in one transaction; version N = MIGRATIONS[N-1].
Append only."""
SCHEMA_VERSION = len(MIGRATIONS)

_PG_MIGRATION_LOCK = 0x1D1E_690  # pg_advisory_xact_lock key: one migrator at a time
_TERMINAL = tuple(s.value for s in JobState if s.is_terminal())
_HOLDING = (JobState.ADMITTED, JobState.RUNNING)

# --------------------------------------------------------------------------- helpers


def _aware(value: datetime, name: str = "now") -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} ({value.isoformat()}) must be timezone-aware")
    return value


def _aware_opt(value: datetime | None, name: str) -> datetime | None:
    return None if value is None else _aware(value, name)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, StrEnum):
        return value.value
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


DROPPED_SPEC_FIELDS = ("command", "args", "env", "parameters", "resume_args")
"""What retention (``JobStore.drop_ended_specs``) empties in an ended unit's spec: the bulk a
request may carry, never what reports or runtime estimates read."""


def spec_to_json(spec: UnitSpec) -> dict[str, Any]:
    """A ``UnitSpec`` as plain JSON (tuples as lists, datetimes as ISO 8601, volumes and
    Secret/ConfigMap references as objects of their fields)."""
    def plain(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if hasattr(type(value), "__dataclass_fields__"):
            return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
        return value

    return {f.name: _jsonable(plain(getattr(spec, f.name))) for f in fields(UnitSpec)}


def spec_from_json(data: Mapping[str, Any]) -> UnitSpec:
    """Inverse of ``spec_to_json``; unknown keys (from a newer writer) are ignored, and keys an
    older writer did not know (volumes, env_from, env_refs, ephemeral storage) take their
    defaults."""
    from idlegpu.scheduler.types import EnvFromSource, EnvKeyRef, UnitVolume

    def records(kind: type, items: Any) -> tuple[Any, ...]:
        names = {f.name for f in fields(kind)}
        out = []
        for item in items or ():
            if not isinstance(item, Mapping):
                raise StoreError(f"stored unit spec cannot be read: {kind.__name__} {item!r} is "
                                 "not an object")
            try:
                out.append(kind(**{k: v for k, v in item.items() if k in names}))
            except TypeError as exc:
                raise StoreError(f"stored unit spec cannot be read: {exc}") from exc
        return tuple(out)

    known = {f.name for f in fields(UnitSpec)}
    values = {k: v for k, v in data.items() if k in known}
    for name, kind in (("volumes", UnitVolume), ("env_from", EnvFromSource),
                       ("env_refs", EnvKeyRef)):
        if name in values:
            values[name] = records(kind, values[name])
    for name in ("command", "args", "resume_args"):
        if name in values:
            values[name] = tuple(values[name] or ())
    for name in ("env", "parameters"):
        if name in values:
            values[name] = tuple((str(k), str(v)) for k, v in values[name] or ())
    if "depends_on" in values:
        values["depends_on"] = tuple((int(s), int(m)) for s, m in values["depends_on"] or ())
    if values.get("deadline") is not None:
        values["deadline"] = datetime.fromisoformat(values["deadline"])
    try:
        return UnitSpec(**values)
    except TypeError as exc:
        raise StoreError(f"stored unit spec cannot be read: {exc}") from exc


def _rate(gpus: int | None, full: int) -> float:
    """Seconds of work per second of an attempt on ``gpus`` of a unit's ``full`` GPUs."""
    return gpus / full if gpus and full and gpus < full else 1.0


def _interval(row: UnitRow) -> float | None:
    """Seconds between a checkpointable unit's periodic checkpoints (its spec's), else None."""
    interval = getattr(row.spec, "checkpoint_interval_s", None)
    return float(interval) if row.checkpointable and interval else None


def unit_id_for(request_id: str, step_index: int, member: int) -> str:
    return f"{request_id}-{step_index}-{member}"


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40].strip("-")
    return slug or "job"


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _check_units(units: Sequence[UnitSpec]) -> None:
    if not units:
        raise InvalidRequestError("a request needs at least one unit")
    keys = [(u.step_index, u.member) for u in units]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise InvalidRequestError(
            "units repeat (step_index, member): " + ", ".join(f"{s}-{m}" for s, m in dupes)
        )
    known = set(keys)
    for u in units:
        if u.gpus < 1:
            raise InvalidRequestError(f"unit {u.step}[{u.member}] asks for {u.gpus} GPUs")
        for dep in u.depends_on:
            if tuple(dep) not in known:
                raise InvalidRequestError(
                    f"unit {u.step_index}-{u.member} depends on {dep[0]}-{dep[1]}, "
                    "which the request does not have"
                )
    # Kahn's algorithm: every unit must be reachable without a cycle.
    pending = {(u.step_index, u.member): {tuple(d) for d in u.depends_on} for u in units}
    while pending:
        ready = [k for k, deps in pending.items() if not deps & pending.keys()]
        if not ready:
            cycle = ", ".join(f"{s}-{m}" for s, m in sorted(pending))
            raise InvalidRequestError(f"dependencies form a cycle among units {cycle}")
        for k in ready:
            del pending[k]


# --------------------------------------------------------------------------- engine


def _make_engine(url: str, busy_timeout_s: float) -> Engine:
    try:
        parsed = sa.engine.make_url(url)
    except sa_exc.ArgumentError as exc:
        raise StoreError(f"invalid store URL {url!r}: {exc}") from None
    backend = parsed.get_backend_name()
    try:
        if backend == "sqlite":
            db = parsed.database
            if db and db != ":memory:" and not db.startswith("file:"):
                parent = Path(db).expanduser().resolve().parent
                if not parent.is_dir():
                    raise StoreError(
                        f"store directory {parent} does not exist; create it or set store.url"
                    )
            engine = sa.create_engine(parsed, connect_args={"timeout": busy_timeout_s})
            _configure_sqlite(engine, busy_timeout_s)
        else:
            engine = sa.create_engine(parsed, pool_pre_ping=True)
    except (ImportError, sa_exc.NoSuchModuleError) as exc:
        raise StoreError(
            f"cannot load the database driver for {parsed.drivername}: {exc}; install it "
            "(for PostgreSQL: pip install 'psycopg[binary]' and use postgresql+psycopg://...)"
        ) from None
    return engine


def _configure_sqlite(engine: Engine, busy_timeout_s: float) -> None:
    """Real transactions on pysqlite: the driver's own BEGIN handling is off (it would commit
    DDL implicitly and start transactions late); we BEGIN ourselves, IMMEDIATE for writes so a
    read-then-write transaction never fails half-way on a lock upgrade."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("idlegpu_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


# --------------------------------------------------------------------------- the store


class JobStore:
    """Job requests, units, attempts and events in a SQL database (see the module doc).

    ``JobStore("sqlite:///idlegpu.db")`` creates or upgrades the schema at open; use it as a
    context manager or call ``close()``. Every method is one transaction.
    """

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0) -> None:
        self.url = url
        # the one rule for every line and answer: userinfo and credential query keys masked
        # (SQLAlchemy's hide_password leaves a ?password=... as it is)
        self._where = redact(url)
        self._engine = _make_engine(url, busy_timeout_s)
        try:
            self._migrate()
        except BaseException:
            self._engine.dispose()
            raise

    # -- lifecycle

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JobStore({self._where!r})"

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[Connection]:
        try:
            with self._engine.connect() as conn:
                if write:
                    conn.execution_options(idlegpu_write=True)
                with conn.begin():
                    yield conn
        except sa_exc.IntegrityError:
            raise
        except sa_exc.OperationalError as exc:
            raise StoreUnavailableError(
                f"job store {self._where} unavailable: {_short(exc)}", delay=5.0
            ) from exc
        except sa_exc.DBAPIError as exc:
            raise StoreError(f"job store {self._where}: {_short(exc)}") from exc

    def _migrate(self) -> None:
        with self._tx(write=True) as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
            SCHEMA_VERSION_TABLE.create(conn, checkfirst=True)
            current = conn.execute(
                sa.select(sa.func.max(SCHEMA_VERSION_TABLE.c.version))
            ).scalar() or 0
            known = len(MIGRATIONS)
            if current > known:
                raise SchemaVersionError(
                    f"job store {self._where} has schema version {current}, newer than this "
                    f"idlegpu knows ({known}); upgrade idlegpu"
                )
            for version in range(current + 1, known + 1):
                name, migrate = MIGRATIONS[version - 1]
                try:
                    migrate(conn)
                except sa_exc.OperationalError as exc:
                    if "lock" in str(exc).lower() or "busy" in str(exc).lower():
                        raise
                    raise StoreError(
                        f"cannot migrate job store {self._where} to schema version {version} "
                        f"({name}): {_short(exc)}"
                    ) from exc
                except sa_exc.DBAPIError as exc:
                    raise StoreError(
                        f"cannot migrate job store {self._where} to schema version {version} "
                        f"({name}): {_short(exc)}"
                    ) from exc
                conn.execute(
                    sa.insert(SCHEMA_VERSION_TABLE).values(version=version, name=name)
                )

    def store_id(self) -> str:
        """This store's random identity (8 hex digits), made once when it was created."""
        with self._tx(write=False) as conn:
            return conn.execute(
                sa.select(STORE_META.c.value).where(STORE_META.c.key == "store_id")
            ).scalar_one()

    @property
    def location(self) -> str:
        """Where the store is (its URL, without its credentials: ``forecast.redact``)."""
        return self._where

    def schema_version(self) -> int:
        with self._tx(write=False) as conn:
            return conn.execute(
                sa.select(sa.func.max(SCHEMA_VERSION_TABLE.c.version))
            ).scalar() or 0

    # -- submission

    def submit(
        self,
        request_name: str,
        team: str,
        kind: str,
        raw: Mapping[str, Any],
        units: Sequence[UnitSpec],
        now: datetime,
        *,
        idempotency_key: str | None = None,
        request_id: str | None = None,
    ) -> str:
        """Store a request and its units (QUEUED) with one SUBMITTED event per unit; return the
        request id. With ``idempotency_key``, a second submission with the same key returns the
        first one's id and stores nothing. ``request_id`` fixes the id (default: a slug of the
        name plus 8 random hex digits)."""
        _aware(now)
        if not request_name.strip():
            raise InvalidRequestError("a request needs a name")
        if not team.strip():
            raise InvalidRequestError("a request needs a team")
        _check_units(units)
        raw_json = _jsonable(raw)
        for attempt in range(5):
            rid = request_id or f"{_slug(request_name)}-{uuid.uuid4().hex[:8]}"
            try:
                with self._tx(write=True) as conn:
                    if idempotency_key is not None:
                        existing = self._request_for_key(conn, idempotency_key)
                        if existing is not None:
                            return existing
                    self._insert_request(
                        conn, rid, request_name, team, kind, raw_json, units, now,
                        idempotency_key,
                    )
                return rid
            except sa_exc.IntegrityError as exc:
                if idempotency_key is not None:
                    with self._tx(write=False) as conn:
                        existing = self._request_for_key(conn, idempotency_key)
                    if existing is not None:
                        return existing
                if request_id is not None:
                    raise InvalidRequestError(
                        f"request id {request_id} is already taken"
                    ) from exc
                if attempt == 4:
                    raise StoreError(f"cannot store request {request_name}: {_short(exc)}") from exc
        raise AssertionError("unreachable")

    @staticmethod
    def _request_for_key(conn: Connection, key: str) -> str | None:
        return conn.execute(
            sa.select(REQUESTS.c.id).where(REQUESTS.c.idempotency_key == key)
        ).scalar()

    def _insert_request(
        self, conn: Connection, rid: str, name: str, team: str, kind: str, raw: Any,
        units: Sequence[UnitSpec], now: datetime, key: str | None,
    ) -> None:
        conn.execute(sa.insert(REQUESTS).values(
            id=rid, name=name, team=team, kind=kind, submitted_at=now, idempotency_key=key,
            raw=raw,
        ))
        ordered = sorted(units, key=lambda u: (u.step_index, u.member))
        conn.execute(sa.insert(UNITS), [
            {
                "id": unit_id_for(rid, u.step_index, u.member), "request_id": rid, "step": u.step,
                "step_index": u.step_index, "member": u.member, "team": team, "kind": u.kind, "gpus": u.gpus,
                "priority": u.priority, "checkpointable": u.checkpointable, "spec": spec_to_json(u),
                "state": JobState.QUEUED.value, "version": 0, "attempts": 0, "preemptions": 0,
                "work_done_s": 0.0, "last_checkpoint_at": None, "current_attempt": None, "stop_by": None,
                "cancel_requested_at": None, "reason": None, "submitted_at": now, "updated_at": now,
            }
            for u in ordered
        ])
        edges = [
            {"unit_id": unit_id_for(rid, u.step_index, u.member),
                 "depends_on": unit_id_for(rid, int(s), int(m))}
            for u in ordered for s, m in sorted(set(u.depends_on))
        ]
        if edges:
            conn.execute(sa.insert(UNIT_DEPS), edges)
        conn.execute(sa.insert(EVENTS), [
            {"at": now, "kind": EventKind.SUBMITTED.value,
                 "unit_id": unit_id_for(rid, u.step_index, u.member), "request_id": rid, "team": team,
                 "gpus": u.gpus, "gpu_seconds": None, "detail": {"request": name, "kind": kind}}
            for u in ordered
        ])

    # -- reading

    def _unit_query(self, where: Iterable[Any] = ()) -> sa.Select:
        return (
            sa.select(
                UNITS, REQUESTS.c.name.label("request_name"),
                ATTEMPTS.c.admitted_at.label("att_admitted_at"),
                ATTEMPTS.c.started_at.label("att_started_at"),
                ATTEMPTS.c.gpus.label("att_gpus"),
            )
            .join(REQUESTS, REQUESTS.c.id == UNITS.c.request_id)
            .outerjoin(ATTEMPTS, ATTEMPTS.c.id == UNITS.c.current_attempt)
            .where(*where)
            .order_by(UNITS.c.submitted_at, UNITS.c.request_id, UNITS.c.step_index,
                      UNITS.c.member)
        )

    def _units(self, conn: Connection, where: Sequence[Any] = ()) -> list[UnitRow]:
        rows = conn.execute(self._unit_query(where)).all()
        deps: dict[str, list[str]] = {}
        dep_rows = conn.execute(
            sa.select(UNIT_DEPS.c.unit_id, UNIT_DEPS.c.depends_on)
            .join(UNITS, UNITS.c.id == UNIT_DEPS.c.unit_id)
            .where(*where)
            .order_by(UNIT_DEPS.c.unit_id, UNIT_DEPS.c.depends_on)
        )
        for unit_id, dep in dep_rows:
            deps.setdefault(unit_id, []).append(dep)
        return [self._to_row(r, tuple(deps.get(r.id, ()))) for r in rows]

    @staticmethod
    def _to_row(r: Any, depends_on: tuple[str, ...]) -> UnitRow:
        return UnitRow(
            id=r.id, request_id=r.request_id, request_name=r.request_name, team=r.team,
            kind=r.kind, step=r.step, step_index=r.step_index, member=r.member,
            gpus=r.att_gpus if r.att_gpus is not None else r.gpus,
            priority=r.priority, checkpointable=bool(r.checkpointable), state=JobState(r.state),
            attempts=r.attempts, preemptions=r.preemptions, work_done_s=float(r.work_done_s),
            last_checkpoint_at=r.last_checkpoint_at, submitted_at=r.submitted_at,
            updated_at=r.updated_at, current_attempt=r.current_attempt,
            admitted_at=r.att_admitted_at, started_at=r.att_started_at, stop_by=r.stop_by,
            cancel_requested_at=r.cancel_requested_at, reason=r.reason, depends_on=depends_on,
            spec=spec_from_json(r.spec), shrink_to=r.shrink_to,
        )

    def queue(self, include_terminal: bool = False) -> list[UnitRow]:
        """Units in submission order (request, step, member); only live ones by default."""
        where = [] if include_terminal else [UNITS.c.state.not_in(_TERMINAL)]
        with self._tx(write=False) as conn:
            return self._units(conn, where)

    def holding(self) -> list[UnitRow]:
        """Units holding GPUs (ADMITTED or RUNNING), in submission order."""
        with self._tx(write=False) as conn:
            return self._units(conn, [UNITS.c.state.in_([s.value for s in _HOLDING])])

    def unit(self, unit_id: str) -> UnitRow:
        with self._tx(write=False) as conn:
            found = self._units(conn, [UNITS.c.id == unit_id])
        if not found:
            raise UnknownJobError(f"no job unit {unit_id!r}; `idlegpu queue` lists them")
        return found[0]

    def request_for_key(self, key: str) -> str | None:
        """The id of the request submitted with idempotency ``key``, if any."""
        with self._tx(write=False) as conn:
            return self._request_for_key(conn, key)

    def request(self, request_id: str) -> RequestRow:
        with self._tx(write=False) as conn:
            r = conn.execute(
                sa.select(REQUESTS).where(REQUESTS.c.id == request_id)
            ).one_or_none()
        if r is None:
            raise UnknownJobError(f"no job request {request_id!r}; `idlegpu queue` lists them")
        return RequestRow(id=r.id, name=r.name, team=r.team, kind=r.kind,
                          submitted_at=r.submitted_at, idempotency_key=r.idempotency_key,
                          raw=dict(r.raw))

    def request_units(self, request_id: str) -> list[UnitRow]:
        with self._tx(write=False) as conn:
            found = self._units(conn, [UNITS.c.request_id == request_id])
        if not found:
            raise UnknownJobError(f"no job request {request_id!r}; `idlegpu queue` lists them")
        return found

    def attempts(self, unit_id: str) -> list[AttemptRow]:
        with self._tx(write=False) as conn:
            rows = conn.execute(
                sa.select(ATTEMPTS).where(ATTEMPTS.c.unit_id == unit_id)
                .order_by(ATTEMPTS.c.number)
            ).all()
        return [
            AttemptRow(
                id=r.id, unit_id=r.unit_id, number=r.number, admitted_at=r.admitted_at,
                started_at=r.started_at, ended_at=r.ended_at,
                outcome=AttemptOutcome(r.outcome) if r.outcome else None, gpus=r.gpus,
                gpu_seconds=r.gpu_seconds, lost_gpu_seconds=r.lost_gpu_seconds,
                window_label=r.window_label, stop_by=r.stop_by,
                work_done_at_start_s=r.work_done_at_start_s,
            )
            for r in rows
        ]

    def ended_attempt_seconds(self) -> list[tuple[str, float, float | None]]:
        """``(outcome, gpu_seconds, lost_gpu_seconds)`` of every ended attempt, for the
        daemon's harvested and lost totals (counted by ``reports.held_and_lost``)."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                sa.select(ATTEMPTS.c.outcome, ATTEMPTS.c.gpu_seconds,
                          ATTEMPTS.c.lost_gpu_seconds)
                .where(ATTEMPTS.c.ended_at.is_not(None))
            ).all()
        return [(r.outcome, float(r.gpu_seconds or 0.0), r.lost_gpu_seconds) for r in rows]

    def waiting(self, now: datetime, estimate: Callable[[UnitRow], float],
                overruns: Overruns | None = None) -> list[WaitingJob]:
        """QUEUED units submitted by ``now`` whose dependencies all SUCCEEDED, for the policy.

        ``runtime_s`` is what ``overruns.remaining_s`` leaves of ``estimate(row)`` after the
        checkpointed progress of a checkpointable unit (the estimate less that progress; past
        the estimate, from the overruns of finished units; default: no overruns known)."""
        overruns = overruns or Overruns()
        _aware(now)
        dep = UNITS.alias("dep")
        blocked = (
            sa.select(UNIT_DEPS.c.unit_id)
            .join(dep, dep.c.id == UNIT_DEPS.c.depends_on)
            .where(UNIT_DEPS.c.unit_id == UNITS.c.id, dep.c.state != JobState.SUCCEEDED.value)
            .exists()
        )
        where = [UNITS.c.state == JobState.QUEUED.value, UNITS.c.submitted_at <= now, ~blocked]
        with self._tx(write=False) as conn:
            rows = self._units(conn, where)
        jobs = []
        for row in rows:
            total = float(estimate(row))
            runtime = overruns.remaining_s(total, row.work_done_s) if row.checkpointable else total
            jobs.append(WaitingJob(
                id=row.id, team=row.team, gpus=row.gpus, runtime_s=runtime,
                checkpointable=row.checkpointable, priority=row.priority,
                submitted_at=row.submitted_at, deadline=row.spec.deadline,
                preemptions=row.preemptions, max_preemptions=row.spec.max_preemptions,
                kind=row.kind, min_gpus=row.spec.min_gpus,
                checkpoint_interval_s=_interval(row),
            ))
        return jobs

    def running(self, now: datetime, estimate: Callable[[UnitRow], float],
                overruns: Overruns | None = None, *,
                notice_s: float = 0.0) -> list[RunningJob]:
        """Units holding GPUs (ADMITTED or RUNNING), including those marked for a cancel;
        those that answer checkpoint notices get ``notice_s`` of notice.

        ``started_at`` is the attempt's start (its admission until it started);
        ``remaining_s = overruns.remaining_s(estimate(row), work_done_s + (now - since))``
        where ``since`` is the attempt's last checkpoint, else its start: the estimate less
        the work done, and past the estimate what finished units' overruns say (default: no
        overruns known, so as long again as the overrun so far, at least a quarter of the
        estimate), never "it ends now"."""
        _aware(now)
        overruns = overruns or Overruns()
        jobs = []
        for row in self.holding():
            began = row.started_at or row.admitted_at or row.updated_at
            checkpoint = row.last_checkpoint_at
            if checkpoint is not None and checkpoint < began:
                checkpoint = None  # from an earlier attempt: already in work_done_s
            if row.state is JobState.ADMITTED:
                elapsed = 0.0
            else:
                elapsed = max(0.0, (now - (checkpoint or began)).total_seconds())
            rate = _rate(row.gpus, row.spec.gpus)  # an elastic unit on fewer GPUs is slower
            remaining = overruns.remaining_s(float(estimate(row)),
                                             row.work_done_s + elapsed * rate) / rate
            jobs.append(RunningJob(
                id=row.id, team=row.team, gpus=row.gpus, priority=row.priority,
                started_at=began, checkpointable=row.checkpointable, remaining_s=remaining,
                last_checkpoint_at=checkpoint, stop_by=row.stop_by, kind=row.kind,
                min_gpus=row.spec.min_gpus, checkpoint_interval_s=_interval(row),
                saves_on_stop=row.checkpointable and bool(getattr(row.spec, "saves_on_stop",
                                                                  False)),
                notice_s=notice_s if row.checkpointable and getattr(
                    row.spec, "answers_notice", False) else 0.0,
            ))
        return jobs

    def finished_runs(self, limit: int = 500) -> list[tuple[UnitRow, float]]:
        """The ``limit`` units that SUCCEEDED last, each with the seconds of work it took in
        all: the work checkpointed before its last attempt plus that attempt's runtime (from
        its start, else its admission). What overran its estimate, and by how much, is learnt
        from these."""
        with self._tx(write=False) as conn:
            last = conn.execute(
                sa.select(ATTEMPTS.c.unit_id, ATTEMPTS.c.admitted_at, ATTEMPTS.c.started_at,
                          ATTEMPTS.c.ended_at, ATTEMPTS.c.work_done_at_start_s,
                          ATTEMPTS.c.gpus)
                .where(ATTEMPTS.c.outcome == AttemptOutcome.SUCCEEDED.value,
                       ATTEMPTS.c.ended_at.is_not(None))
                .order_by(ATTEMPTS.c.ended_at.desc(), ATTEMPTS.c.unit_id)
                .limit(limit)
            ).all()
            if not last:
                return []
            rows = {row.id: row for row in self._units(conn, [
                UNITS.c.id.in_([r.unit_id for r in last]),
                UNITS.c.state == JobState.SUCCEEDED.value,
            ])}
        out = []
        for r in last:
            row = rows.get(r.unit_id)
            if row is None:
                continue
            ran = max(0.0, (r.ended_at - (r.started_at or r.admitted_at)).total_seconds())
            ran *= _rate(r.gpus, row.spec.gpus)
            out.append((row, float(r.work_done_at_start_s or 0.0) + ran))
        return out

    def overruns(self, estimate: Callable[[UnitRow], float], quantile: float = 0.9,
                 limit: int = 500) -> Overruns:
        """How the last ``limit`` finished units ran against ``estimate``: the ratios
        ``runtime / estimate(row)`` that ``running`` and ``waiting`` plan a unit past its own
        estimate with."""
        ratios = []
        for row, work_s in self.finished_runs(limit):
            planned = float(estimate(row))
            if planned > 0:
                ratios.append(work_s / planned)
        return Overruns.of(ratios, quantile)

    def to_stop(self) -> list[UnitRow]:
        """Units holding GPUs whose cancel was requested: stop them, then call ``preempted``."""
        with self._tx(write=False) as conn:
            return self._units(conn, [
                UNITS.c.state.in_([s.value for s in _HOLDING]),
                UNITS.c.cancel_requested_at.is_not(None),
            ])

    def events(
        self, since: datetime | None = None, until: datetime | None = None, *,
        unit_id: str | None = None,
    ) -> list[EventRow]:
        """The accounting log in commit order, ``since <= at < until``."""
        where = []
        if since is not None:
            where.append(EVENTS.c.at >= _aware(since, "since"))
        if until is not None:
            where.append(EVENTS.c.at < _aware(until, "until"))
        if unit_id is not None:
            where.append(EVENTS.c.unit_id == unit_id)
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(EVENTS).where(*where).order_by(EVENTS.c.id)).all()
        return [
            EventRow(id=r.id, at=r.at, kind=EventKind(r.kind), unit_id=r.unit_id,
                     request_id=r.request_id, team=r.team, gpus=r.gpus,
                     gpu_seconds=r.gpu_seconds, detail=dict(r.detail or {}))
            for r in rows
        ]

    def team_gpu_hours(self, now: datetime, window_s: float) -> dict[str, float]:
        """GPU-hours each team's attempts held within ``[now - window_s, now]`` (attempts
        overlapping the window, clipped to it; open attempts count up to ``now``)."""
        _aware(now)
        start = now - timedelta(seconds=window_s)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                sa.select(UNITS.c.team, ATTEMPTS.c.gpus, ATTEMPTS.c.admitted_at,
                          ATTEMPTS.c.ended_at)
                .join(UNITS, UNITS.c.id == ATTEMPTS.c.unit_id)
                .where(ATTEMPTS.c.admitted_at < now,
                       sa.or_(ATTEMPTS.c.ended_at.is_(None), ATTEMPTS.c.ended_at > start))
            ).all()
        hours: dict[str, float] = {}
        for team, gpus, admitted, ended in rows:
            lo = max(admitted, start)
            hi = min(ended or now, now)
            held = max(0.0, (hi - lo).total_seconds()) * gpus / 3600.0
            hours[team] = hours.get(team, 0.0) + held
        return dict(sorted(hours.items()))

    # -- transitions

    @staticmethod
    def _load(conn: Connection, unit_id: str) -> Any:
        row = conn.execute(sa.select(UNITS).where(UNITS.c.id == unit_id)).one_or_none()
        if row is None:
            raise UnknownJobError(f"no job unit {unit_id!r}; `idlegpu queue` lists them")
        return row

    @staticmethod
    def _expect(row: Any, action: str, allowed: Sequence[JobState]) -> None:
        state = JobState(row.state)
        if state not in allowed:
            raise StaleStateError(row.id, action, allowed, state)

    @staticmethod
    def _cas(
        conn: Connection, row: Any, action: str, allowed: Sequence[JobState], **values: Any
    ) -> None:
        """``UPDATE units SET ... WHERE id = ? AND state = ? AND version = ?``."""
        JobStore._expect(row, action, allowed)
        result = conn.execute(
            sa.update(UNITS)
            .where(UNITS.c.id == row.id, UNITS.c.state == row.state,
                   UNITS.c.version == row.version)
            .values(version=UNITS.c.version + 1, **values)
        )
        if result.rowcount != 1:
            actual = conn.execute(
                sa.select(UNITS.c.state).where(UNITS.c.id == row.id)
            ).scalar()
            raise StaleStateError(row.id, action, allowed, JobState(actual) if actual else None)

    @staticmethod
    def _event(
        conn: Connection, at: datetime, kind: EventKind, row: Any, *,
        gpus: int | None = None, gpu_seconds: float | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        conn.execute(sa.insert(EVENTS).values(
            at=at, kind=kind.value, unit_id=row.id, request_id=row.request_id, team=row.team,
            gpus=gpus, gpu_seconds=gpu_seconds, detail=_jsonable(dict(detail or {})),
        ))

    @staticmethod
    def _close_attempt(
        conn: Connection, row: Any, now: datetime, outcome: AttemptOutcome,
        lost_gpu_seconds: float | None = None, *, default_lost: bool = False,
    ) -> tuple[int, float, float | None]:
        """End the unit's open attempt; ``(number, gpu_seconds, lost_gpu_seconds)``."""
        att = conn.execute(
            sa.select(ATTEMPTS).where(ATTEMPTS.c.id == row.current_attempt)
        ).one_or_none()
        if att is None or att.ended_at is not None:
            raise StoreError(f"unit {row.id} holds GPUs but has no open attempt (corrupt store)")
        end = max(now, att.admitted_at)
        gpu_s = att.gpus * (end - att.admitted_at).total_seconds()
        if lost_gpu_seconds is None and default_lost:
            since = att.admitted_at
            if (row.checkpointable and row.last_checkpoint_at is not None
                    and row.last_checkpoint_at >= att.admitted_at):
                since = min(row.last_checkpoint_at, end)
            lost_gpu_seconds = att.gpus * (end - since).total_seconds()
        result = conn.execute(
            sa.update(ATTEMPTS)
            .where(ATTEMPTS.c.id == att.id, ATTEMPTS.c.ended_at.is_(None))
            .values(ended_at=end, outcome=outcome.value, gpu_seconds=gpu_s,
                    lost_gpu_seconds=lost_gpu_seconds)
        )
        if result.rowcount != 1:
            raise StoreError(f"attempt {att.id} was closed concurrently")
        return att.number, gpu_s, lost_gpu_seconds

    def admit(
        self, unit_id: str, now: datetime, stop_by: datetime | None = None,
        attempt_label: str | None = None, gpus: int | None = None,
    ) -> int:
        """QUEUED -> ADMITTED: open attempt ``attempts + 1`` (returned) and log ADMITTED.

        ``stop_by``: when the job must have checkpointed and stopped (end of its window);
        ``attempt_label``: the window it was admitted into, for reports; ``gpus``: what the
        attempt runs on (default: what the unit asks for; an elastic unit may get as few as
        its ``min_gpus``)."""
        _aware(now)
        _aware_opt(stop_by, "stop_by")
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._expect(row, "admit", (JobState.QUEUED,))
            gpus = self._granted(row, gpus)
            dep = UNITS.alias("dep")
            unmet = conn.execute(
                sa.select(dep.c.id, dep.c.state)
                .join(UNIT_DEPS, UNIT_DEPS.c.depends_on == dep.c.id)
                .where(UNIT_DEPS.c.unit_id == unit_id, dep.c.state != JobState.SUCCEEDED.value)
                .order_by(dep.c.id)
            ).all()
            if unmet:
                waits = ", ".join(f"{d} ({s})" for d, s in unmet)
                raise TransitionRefusedError(f"cannot admit unit {unit_id}: it waits for {waits}")
            number = row.attempts + 1
            attempt_id = f"{unit_id}/{number}"
            self._cas(
                conn, row, "admit", (JobState.QUEUED,), state=JobState.ADMITTED.value,
                attempts=number, current_attempt=attempt_id, stop_by=stop_by, updated_at=now,
            )
            conn.execute(sa.insert(ATTEMPTS).values(
                id=attempt_id, unit_id=unit_id, number=number, admitted_at=now, gpus=gpus,
                window_label=attempt_label, stop_by=stop_by,
                work_done_at_start_s=row.work_done_s,
            ))
            self._event(conn, now, EventKind.ADMITTED, row, gpus=gpus, detail={
                "attempt": number, "stop_by": _iso(stop_by), "window": attempt_label,
            })
        return number

    @staticmethod
    def _granted(row: Any, gpus: int | None) -> int:
        """The GPUs of a new attempt: ``gpus`` checked against the unit's range (None, or
        more than it asks for: what it asks for)."""
        if gpus is None or int(gpus) >= row.gpus:
            return int(row.gpus)
        least = spec_from_json(row.spec).min_gpus or row.gpus
        if not least <= int(gpus) <= row.gpus:
            raise TransitionRefusedError(
                f"unit {row.id} runs on {least} to {row.gpus} GPUs, not {gpus}")
        return int(gpus)

    @staticmethod
    def _held(conn: Connection, row: Any) -> int:
        """GPUs of the unit's open attempt (what it holds), else what it asks for."""
        if row.current_attempt is None:
            return int(row.gpus)
        held = conn.execute(
            sa.select(ATTEMPTS.c.gpus).where(ATTEMPTS.c.id == row.current_attempt)
        ).scalar()
        return int(held if held is not None else row.gpus)

    def shrinking(self, unit_id: str, now: datetime, gpus: int,
                  stop_by: datetime | None = None) -> None:
        """An elastic unit holding GPUs is told to shrink: ``shrink_to = gpus`` (at least its
        ``min_gpus``, below what its attempt holds), so whoever sees its Job stopped restarts
        it on ``gpus`` (``shrunk``) instead of sending it back to the queue; ``stop_by``: when
        that attempt must checkpoint and stop (None: it runs on)."""
        _aware(now)
        _aware_opt(stop_by, "stop_by")
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._expect(row, "shrink", _HOLDING)
            gpus = self._granted(row, gpus)
            held = self._held(conn, row)
            if not gpus < held:
                raise TransitionRefusedError(
                    f"cannot shrink unit {unit_id} to {gpus} GPUs: it holds {held}")
            if row.shrink_to == gpus and row.shrink_stop_by == stop_by:
                return
            self._cas(conn, row, "shrink", _HOLDING, shrink_to=gpus, shrink_stop_by=stop_by,
                      updated_at=now)

    def shrunk(
        self, unit_id: str, now: datetime, work_done_s: float | None = None,
        lost_gpu_seconds: float | None = None, reason: str | None = None,
    ) -> int | None:
        """A shrinking unit's Job stopped: in one transaction its progress is saved
        (``work_done_s``, total seconds of work at full size; None: nothing saved, the work
        since the last checkpoint is lost unless ``lost_gpu_seconds`` says otherwise), its
        attempt closed ``shrunk`` and attempt ``attempts + 1`` opened on ``shrink_to`` GPUs:
        ADMITTED again, not a preemption. Returns the new attempt's number; None when a
        cancel was requested meanwhile (the unit is CANCELLED instead)."""
        _aware(now)
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._expect(row, "finish the shrink of", _HOLDING)
            if row.shrink_to is None:
                raise TransitionRefusedError(f"unit {unit_id} is not shrinking")
        if row.cancel_requested_at is not None:
            if work_done_s is not None and row.state == JobState.RUNNING.value:
                self.checkpointed(unit_id, now, work_done_s)
            self.preempted(unit_id, now, lost_gpu_seconds=lost_gpu_seconds, reason=reason)
            return None
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._expect(row, "finish the shrink of", _HOLDING)
            gpus = self._granted(row, row.shrink_to)
            saved = row.work_done_s
            checkpoint = row.last_checkpoint_at
            if work_done_s is not None and row.checkpointable:
                if not work_done_s >= row.work_done_s:
                    raise TransitionRefusedError(
                        f"unit {unit_id}: checkpointed progress {work_done_s:.0f} s is below "
                        f"the {row.work_done_s:.0f} s already saved")
                saved, checkpoint = float(work_done_s), now
            number = row.attempts + 1
            attempt_id = f"{unit_id}/{number}"
            stop_by = row.shrink_stop_by
            self._cas(
                conn, row, "finish the shrink of", _HOLDING, state=JobState.ADMITTED.value,
                attempts=number, current_attempt=attempt_id, stop_by=stop_by, shrink_to=None,
                shrink_stop_by=None, work_done_s=saved, last_checkpoint_at=checkpoint,
                updated_at=now,
            )
            old, gpu_s, lost = self._close_attempt(
                conn, row, now, AttemptOutcome.SHRUNK,
                0.0 if work_done_s is not None and lost_gpu_seconds is None else lost_gpu_seconds,
                default_lost=True,
            )
            held = conn.execute(sa.select(ATTEMPTS.c.gpus).where(
                ATTEMPTS.c.id == row.current_attempt)).scalar()
            conn.execute(sa.insert(ATTEMPTS).values(
                id=attempt_id, unit_id=unit_id, number=number, admitted_at=now, gpus=gpus,
                window_label=None, stop_by=stop_by, work_done_at_start_s=saved,
            ))
            if work_done_s is not None and row.checkpointable:
                self._event(conn, now, EventKind.CHECKPOINTED, row, gpus=held, detail={
                    "attempt": old, "work_done_s": saved})
            self._event(conn, now, EventKind.PREEMPTED, row, gpus=held, gpu_seconds=gpu_s,
                        detail={"attempt": old, "lost_gpu_seconds": lost, "reason": reason,
                                "shrunk_to": gpus})
            self._event(conn, now, EventKind.ADMITTED, row, gpus=gpus, detail={
                "attempt": number, "stop_by": _iso(stop_by), "window": None,
                "shrunk_from": held})
        return number

    def started(self, unit_id: str, now: datetime) -> None:
        """ADMITTED -> RUNNING (the job's pod is running)."""
        _aware(now)
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._cas(conn, row, "start", (JobState.ADMITTED,), state=JobState.RUNNING.value,
                      updated_at=now)
            conn.execute(
                sa.update(ATTEMPTS)
                .where(ATTEMPTS.c.id == row.current_attempt, ATTEMPTS.c.started_at.is_(None))
                .values(started_at=now)
            )
            self._event(conn, now, EventKind.STARTED, row, gpus=self._held(conn, row),
                        detail={"attempt": row.attempts})

    def checkpointed(self, unit_id: str, now: datetime, work_done_s: float) -> None:
        """A RUNNING checkpointable unit saved its progress: ``work_done_s`` seconds of work in
        total (over all attempts); progress never goes back."""
        _aware(now)
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._expect(row, "checkpoint", (JobState.RUNNING,))
            if not row.checkpointable:
                raise TransitionRefusedError(f"unit {unit_id} is not checkpointable")
            if not work_done_s >= row.work_done_s:
                raise TransitionRefusedError(
                    f"unit {unit_id}: checkpointed progress {work_done_s:.0f} s is below the "
                    f"{row.work_done_s:.0f} s already saved"
                )
            self._cas(conn, row, "checkpoint", (JobState.RUNNING,),
                      work_done_s=float(work_done_s), last_checkpoint_at=now, updated_at=now)
            self._event(conn, now, EventKind.CHECKPOINTED, row, gpus=self._held(conn, row),
                        detail={"attempt": row.attempts, "work_done_s": float(work_done_s)})

    # -- checkpoint notices and workload reports (the cooperative checkpoint)

    @staticmethod
    def _notice_row(r: Any) -> NoticeRow:
        return NoticeRow(
            attempt_id=r.attempt_id, unit_id=r.unit_id, attempt=r.attempt,
            sent_at=r.notice_sent_at, deadline=r.notice_deadline, reason=r.notice_reason or "",
            delivered_at=r.notice_delivered_at, shrink_to=r.shrink_to,
            shrink_stop_by=r.shrink_stop_by, acked_at=r.acked_at, ack_step=r.ack_step,
            ack_path=r.ack_path,
            outcome=NoticeOutcome(r.notice_outcome) if r.notice_outcome else None,
            closed_at=r.notice_closed_at)

    @staticmethod
    def _report_row(conn: Connection, attempt_id: str) -> Any:
        return conn.execute(sa.select(WORKLOAD_REPORTS).where(
            WORKLOAD_REPORTS.c.attempt_id == attempt_id)).one_or_none()

    @staticmethod
    def _upsert_report(conn: Connection, existing: Any, attempt_id: str, unit_id: str,
                       attempt: int, **values: Any) -> None:
        if existing is None:
            values.setdefault("reports", 0)
            values.setdefault("late_reports", 0)
            conn.execute(sa.insert(WORKLOAD_REPORTS).values(
                attempt_id=attempt_id, unit_id=unit_id, attempt=attempt, **values))
        else:
            conn.execute(sa.update(WORKLOAD_REPORTS)
                         .where(WORKLOAD_REPORTS.c.attempt_id == attempt_id).values(**values))

    def send_notice(self, unit_id: str, now: datetime, deadline: datetime, reason: str, *,
                    shrink_to: int | None = None,
                    shrink_stop_by: datetime | None = None) -> NoticeRow:
        """Record a checkpoint notice for the unit's current attempt (before its pods are
        annotated: a crash in between leaves a notice the next pass delivers). Idempotent:
        an attempt has at most one notice, and a second call returns the first."""
        _aware(now)
        _aware(deadline, "deadline")
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._expect(row, "send a checkpoint notice to", _HOLDING)
            existing = self._report_row(conn, row.current_attempt)
            if existing is not None and existing.notice_sent_at is not None:
                return self._notice_row(existing)
            self._upsert_report(
                conn, existing, row.current_attempt, row.id, row.attempts,
                notice_sent_at=now, notice_deadline=max(deadline, now),
                notice_reason=reason[:500], shrink_to=shrink_to,
                shrink_stop_by=_aware_opt(shrink_stop_by, "shrink_stop_by"))
            return self._notice_row(self._report_row(conn, row.current_attempt))

    def notice_delivered(self, attempt_id: str, now: datetime) -> None:
        """The notice's annotation is on the attempt's pods."""
        _aware(now)
        with self._tx(write=True) as conn:
            conn.execute(sa.update(WORKLOAD_REPORTS).where(
                WORKLOAD_REPORTS.c.attempt_id == attempt_id,
                WORKLOAD_REPORTS.c.notice_delivered_at.is_(None),
            ).values(notice_delivered_at=now))

    def open_notices(self) -> list[NoticeRow]:
        """Notices sent and not closed yet, oldest first."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(WORKLOAD_REPORTS).where(
                WORKLOAD_REPORTS.c.notice_sent_at.is_not(None),
                WORKLOAD_REPORTS.c.notice_outcome.is_(None),
            ).order_by(WORKLOAD_REPORTS.c.notice_sent_at)).all()
        return [self._notice_row(r) for r in rows]

    def notice(self, attempt_id: str) -> NoticeRow | None:
        with self._tx(write=False) as conn:
            r = self._report_row(conn, attempt_id)
        return None if r is None or r.notice_sent_at is None else self._notice_row(r)

    def close_notice(self, attempt_id: str, now: datetime, outcome: NoticeOutcome) -> bool:
        """The notice ended (its stop was sent, or the attempt ended first): the outcome is
        recorded and one NOTICE event logged (what reports count). False: already closed."""
        _aware(now)
        with self._tx(write=True) as conn:
            r = self._report_row(conn, attempt_id)
            if r is None or r.notice_sent_at is None or r.notice_outcome is not None:
                return False
            conn.execute(sa.update(WORKLOAD_REPORTS).where(
                WORKLOAD_REPORTS.c.attempt_id == attempt_id,
                WORKLOAD_REPORTS.c.notice_outcome.is_(None),
            ).values(notice_outcome=NoticeOutcome(outcome).value, notice_closed_at=now))
            unit = self._load(conn, r.unit_id)
            att = conn.execute(sa.select(ATTEMPTS.c.gpus).where(
                ATTEMPTS.c.id == attempt_id)).scalar()
            answered = outcome is NoticeOutcome.ANSWERED
            self._event(conn, now, EventKind.NOTICE, unit, gpus=att, detail={
                "attempt": r.attempt, "outcome": NoticeOutcome(outcome).value,
                "sent_at": _iso(r.notice_sent_at), "deadline": _iso(r.notice_deadline),
                "answered_at": _iso(r.acked_at), "step": r.ack_step, "path": r.ack_path,
                "saved_gpu_seconds": float(r.ack_saved_gpu_seconds or 0.0) if answered
                else 0.0,
                "reason": r.notice_reason,
            })
            return True

    def workload_reports(self, unit_id: str) -> list[dict[str, Any]]:
        """Per attempt of the unit, its notice and what its workload reported (newest first)."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(WORKLOAD_REPORTS).where(
                WORKLOAD_REPORTS.c.unit_id == unit_id).order_by(
                WORKLOAD_REPORTS.c.attempt.desc())).all()
        out = []
        for r in rows:
            notice = None
            if r.notice_sent_at is not None:
                notice = {"sent_at": _iso(r.notice_sent_at), "deadline": _iso(r.notice_deadline),
                          "reason": r.notice_reason, "delivered_at": _iso(r.notice_delivered_at),
                          "answered_at": _iso(r.acked_at), "step": r.ack_step,
                          "path": r.ack_path, "outcome": r.notice_outcome,
                          "closed_at": _iso(r.notice_closed_at)}
            out.append({"attempt": r.attempt, "notice": notice,
                        "checkpoint": None if r.checkpoint_at is None else {
                            "step": r.checkpoint_step, "path": r.checkpoint_path,
                            "at": _iso(r.checkpoint_at)},
                        "progress": None if r.progress_at is None else {
                            "step": r.progress_step, "at": _iso(r.progress_at)},
                        "reports": r.reports, "late_reports": r.late_reports})
        return out

    def notice_counts(self, since: datetime | None = None) -> dict[str, int]:
        """Notices sent (since ``since``, by their sending time) by outcome, ``open`` for those
        under way."""
        where: list[sa.ColumnElement[bool]] = [WORKLOAD_REPORTS.c.notice_sent_at.is_not(None)]
        if since is not None:
            where.append(WORKLOAD_REPORTS.c.notice_sent_at >= _aware(since, "since"))
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(WORKLOAD_REPORTS.c.notice_outcome,
                                          sa.func.count()).where(*where).group_by(
                WORKLOAD_REPORTS.c.notice_outcome)).all()
        counts = {o.value: 0 for o in NoticeOutcome} | {"open": 0}
        for outcome, n in rows:
            counts[outcome or "open"] = int(n)
        counts["sent"] = sum(counts.values())
        return counts

    def workload_report(self, unit_id: str, now: datetime, *, kind: str, step: int,
                        attempt: int | None = None, path: str | None = None,
                        at: datetime | None = None) -> WorkloadReport:
        """A report from the unit's own workload (the job API, authenticated as its pod):
        ``kind`` ``checkpoint`` (saved at ``at``, clamped to the attempt's run and ``now``, to
        ``path`` at ``step``: the unit's progress is saved, and an open notice is answered) or
        ``progress``. A report for an attempt other than the current one, or after its notice
        closed, is late: counted, nothing else changes."""
        _aware(now)
        if kind not in ("checkpoint", "progress"):
            raise ValueError(f"kind must be checkpoint or progress, not {kind!r}")
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            holding = JobState(row.state) in _HOLDING
            current = row.attempts if holding else None
            number = attempt if attempt is not None else (current or row.attempts)
            attempt_id = f"{row.id}/{number}"
            existing = self._report_row(conn, attempt_id)
            notice_closed = (existing is not None and existing.notice_sent_at is not None
                             and existing.notice_outcome is not None)
            if number != current or notice_closed or number < 1:
                if number >= 1 and conn.execute(sa.select(ATTEMPTS.c.id).where(
                        ATTEMPTS.c.id == attempt_id)).first() is not None:
                    self._upsert_report(conn, existing, attempt_id, row.id, number,
                                        late_reports=(existing.late_reports + 1
                                                      if existing is not None else 1))
                return WorkloadReport(recorded=False, late=True, attempt=number)
            reports = (existing.reports if existing is not None else 0) + 1
            answering = (existing is not None and existing.notice_sent_at is not None
                         and existing.acked_at is None and kind == "checkpoint")
            last = None if existing is None else (
                existing.progress_at if kind == "progress" else existing.checkpoint_reported_at)
            if last is not None and not answering and (
                    now - last).total_seconds() < REPORT_EVERY_S:
                return WorkloadReport(recorded=False, late=False, attempt=number,
                                      retry_after_s=REPORT_EVERY_S - (now - last).total_seconds())
            if kind == "progress":
                self._upsert_report(conn, existing, attempt_id, row.id, number,
                                    progress_step=int(step), progress_at=now, reports=reports)
                return WorkloadReport(recorded=True, late=False, attempt=number)
            if not row.checkpointable:
                raise TransitionRefusedError(
                    f"unit {unit_id} is not checkpointable (its request has no checkpoint "
                    "section); report progress instead")
            if JobState(row.state) is not JobState.RUNNING:
                raise TransitionRefusedError(
                    f"unit {unit_id} is {row.state}, not running yet; report the checkpoint "
                    "again once its pod runs")
            att = conn.execute(sa.select(ATTEMPTS).where(
                ATTEMPTS.c.id == attempt_id)).one()
            began = att.started_at or att.admitted_at
            saved_at = min(max(at or now, began), now)
            since = row.last_checkpoint_at
            if since is None or since < began:
                since = began  # an earlier attempt's checkpoint: already in work_done_s
            spec = spec_from_json(row.spec)
            rate = _rate(att.gpus, spec.gpus)
            gained = max(0.0, (saved_at - since).total_seconds())
            work = float(row.work_done_s) + gained * rate
            values: dict[str, Any] = {"checkpoint_step": int(step), "checkpoint_path": path,
                                      "checkpoint_at": saved_at, "checkpoint_reported_at": now,
                                      "reports": reports}
            answered = (existing is not None and existing.notice_sent_at is not None
                        and existing.acked_at is None)
            if answered:
                # what a blind stop now would have lost: the work since the last periodic
                # checkpoint the spec's interval promises
                interval = float(getattr(spec, "checkpoint_interval_s", None) or 0.0)
                periodic = since
                if interval > 0 and saved_at > since:
                    periodic = since + timedelta(
                        seconds=interval * ((saved_at - since).total_seconds() // interval))
                values.update(acked_at=now, ack_step=int(step), ack_path=path,
                              ack_saved_gpu_seconds=att.gpus * max(
                                  0.0, (saved_at - periodic).total_seconds()))
            self._upsert_report(conn, existing, attempt_id, row.id, number, **values)
            if saved_at > since:
                self._cas(conn, row, "checkpoint", (JobState.RUNNING,), work_done_s=work,
                          last_checkpoint_at=saved_at, updated_at=now)
                self._event(conn, now, EventKind.CHECKPOINTED, row, gpus=att.gpus, detail={
                    "attempt": number, "work_done_s": work, "step": int(step), "path": path,
                    "by": "workload", "on_notice": answered})
            return WorkloadReport(recorded=True, late=False, attempt=number,
                                  answered_notice=answered, work_done_s=work)

    def _release(
        self, unit_id: str, now: datetime, *, action: str, allowed: Sequence[JobState],
        outcome: AttemptOutcome, lost_gpu_seconds: float | None, reason: str | None,
        count_preemption: bool,
    ) -> JobState:
        """Return a unit holding GPUs to the queue, or cancel it if a cancel was requested."""
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._expect(row, action, allowed)
            cancel = row.cancel_requested_at is not None
            new_state = JobState.CANCELLED if cancel else JobState.QUEUED
            held = self._held(conn, row)
            self._cas(
                conn, row, action, allowed, state=new_state.value, current_attempt=None,
                stop_by=None, shrink_to=None, shrink_stop_by=None,
                preemptions=row.preemptions + (1 if count_preemption and not cancel else 0),
                work_done_s=row.work_done_s if row.checkpointable else 0.0,
                reason=(row.reason or "cancelled") if cancel else reason,
                updated_at=now,
            )
            number, gpu_s, lost = self._close_attempt(
                conn, row, now,
                AttemptOutcome.CANCELLED if cancel else outcome, lost_gpu_seconds,
                default_lost=True,
            )
            detail = {"attempt": number, "lost_gpu_seconds": lost, "reason": reason}
            if cancel:
                detail["cancel_requested_at"] = _iso(row.cancel_requested_at)
                self._event(conn, now, EventKind.CANCELLED, row, gpus=held,
                            gpu_seconds=gpu_s, detail=detail)
            else:
                if outcome is AttemptOutcome.REQUEUED:
                    detail["requeued"] = True
                self._event(conn, now, EventKind.PREEMPTED, row, gpus=held,
                            gpu_seconds=gpu_s, detail=detail)
            return new_state

    def preempted(
        self, unit_id: str, now: datetime, lost_gpu_seconds: float | None = None,
        reason: str | None = None,
    ) -> JobState:
        """ADMITTED/RUNNING -> QUEUED (``preemptions + 1``), or -> CANCELLED when a cancel was
        requested; returns the new state. The attempt's GPU-seconds go to the PREEMPTED (or
        CANCELLED) event; ``lost_gpu_seconds`` defaults to the GPU-time since the attempt's
        last checkpoint (since its admission without one). A unit that cannot checkpoint
        starts over (``work_done_s = 0``)."""
        _aware(now)
        return self._release(
            unit_id, now, action="preempt", allowed=_HOLDING, outcome=AttemptOutcome.PREEMPTED,
            lost_gpu_seconds=lost_gpu_seconds, reason=reason, count_preemption=True,
        )

    def requeue_admitted(
        self, unit_id: str, now: datetime, reason: str = "admitted but never started"
    ) -> JobState:
        """For a reconciler after a crash: an ADMITTED unit whose job never ran goes back to
        QUEUED (not counted as a preemption), or to CANCELLED if a cancel was requested."""
        _aware(now)
        return self._release(
            unit_id, now, action="requeue", allowed=(JobState.ADMITTED,),
            outcome=AttemptOutcome.REQUEUED, lost_gpu_seconds=None, reason=reason,
            count_preemption=False,
        )

    def finished(self, unit_id: str, now: datetime) -> float:
        """ADMITTED/RUNNING -> SUCCEEDED; returns the attempt's GPU-seconds (also logged)."""
        _aware(now)
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._expect(row, "finish", _HOLDING)
            held = self._held(conn, row)
            self._cas(conn, row, "finish", _HOLDING, state=JobState.SUCCEEDED.value,
                      current_attempt=None, stop_by=None, shrink_to=None, shrink_stop_by=None,
                      updated_at=now)
            number, gpu_s, _ = self._close_attempt(conn, row, now, AttemptOutcome.SUCCEEDED)
            self._event(conn, now, EventKind.FINISHED, row, gpus=held, gpu_seconds=gpu_s,
                        detail={"attempt": number})
        return gpu_s

    def failed(self, unit_id: str, now: datetime, reason: str) -> tuple[str, ...]:
        """QUEUED/ADMITTED/RUNNING -> FAILED; every unit depending on it (transitively) is
        CANCELLED. Returns the ids of the units cancelled that way (any of them still holding
        GPUs is only marked: see ``to_stop``)."""
        _aware(now)
        allowed = (JobState.QUEUED, *_HOLDING)
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            self._expect(row, "fail", allowed)
            held = self._held(conn, row)
            self._cas(conn, row, "fail", allowed, state=JobState.FAILED.value,
                      current_attempt=None, stop_by=None, shrink_to=None, shrink_stop_by=None,
                      reason=reason, updated_at=now)
            gpu_s = None
            detail: dict[str, Any] = {"reason": reason}
            if row.current_attempt is not None:
                number, gpu_s, _ = self._close_attempt(conn, row, now, AttemptOutcome.FAILED)
                detail["attempt"] = number
            self._event(conn, now, EventKind.FAILED, row, gpus=held, gpu_seconds=gpu_s,
                        detail=detail)
            result = self._cancel_units(
                conn, self._dependants(conn, [unit_id]), now,
                f"dependency {unit_id} failed: {reason}",
            )
        return result.cancelled + result.to_stop

    def cancel(
        self, id_or_request_id: str, now: datetime, reason: str = "cancelled by user"
    ) -> CancelResult:
        """Cancel a unit (and every unit depending on it) or a whole request.

        Queued units become CANCELLED at once; units holding GPUs are marked
        (``cancel_requested_at``) and listed in ``to_stop``: the caller stops their jobs and
        reports it with ``preempted``, which then cancels them. Ended units are left alone."""
        _aware(now)
        with self._tx(write=True) as conn:
            is_unit = conn.execute(
                sa.select(UNITS.c.id).where(UNITS.c.id == id_or_request_id)
            ).scalar()
            if is_unit is not None:
                targets = [id_or_request_id, *self._dependants(conn, [id_or_request_id])]
            else:
                targets = list(conn.execute(
                    sa.select(UNITS.c.id).where(UNITS.c.request_id == id_or_request_id)
                    .order_by(UNITS.c.step_index, UNITS.c.member)
                ).scalars())
                if not targets:
                    raise UnknownJobError(
                        f"no job request or unit {id_or_request_id!r}; `idlegpu queue` lists them"
                    )
            return self._cancel_units(conn, targets, now, reason)

    @staticmethod
    def _dependants(conn: Connection, unit_ids: Sequence[str]) -> list[str]:
        """Units depending on ``unit_ids``, transitively, in breadth-first order."""
        seen: dict[str, None] = {}
        frontier = list(unit_ids)
        while frontier:
            nxt = conn.execute(
                sa.select(UNIT_DEPS.c.unit_id).where(UNIT_DEPS.c.depends_on.in_(frontier))
                .order_by(UNIT_DEPS.c.unit_id)
            ).scalars().all()
            frontier = [u for u in dict.fromkeys(nxt) if u not in seen and u not in unit_ids]
            seen.update(dict.fromkeys(frontier))
        return list(seen)

    def _cancel_units(
        self, conn: Connection, unit_ids: Sequence[str], now: datetime, reason: str
    ) -> CancelResult:
        cancelled, to_stop, unchanged = [], [], []
        for unit_id in unit_ids:
            row = self._load(conn, unit_id)
            state = JobState(row.state)
            if state.is_terminal():
                unchanged.append(unit_id)
            elif state is JobState.QUEUED:
                self._cas(conn, row, "cancel", (JobState.QUEUED,),
                          state=JobState.CANCELLED.value, reason=reason, updated_at=now)
                self._event(conn, now, EventKind.CANCELLED, row, gpus=row.gpus,
                            detail={"reason": reason})
                cancelled.append(unit_id)
            else:
                if row.cancel_requested_at is None:
                    self._cas(conn, row, "cancel", _HOLDING, cancel_requested_at=now,
                              reason=reason, updated_at=now)
                to_stop.append(unit_id)
        return CancelResult(tuple(cancelled), tuple(to_stop), tuple(unchanged))

    # -- the job API (schema version 4): tokens, who submitted what, the audit log

    @staticmethod
    def _insert_audit(conn: Connection, entry: AuditEntry) -> None:
        _aware(entry.at, "at")
        conn.execute(sa.insert(AUDIT_LOG).values(
            at=entry.at, actor=entry.actor, auth=entry.auth, role=entry.role, team=entry.team,
            action=entry.action, target=entry.target, address=entry.address,
            detail=_jsonable(dict(entry.detail)),
        ))

    @staticmethod
    def _log_audit(entry: AuditEntry) -> None:
        logging.getLogger(AUDIT_LOGGER).info(
            "%s", json.dumps({
                "at": _iso(entry.at), "actor": entry.actor, "auth": entry.auth,
                "role": entry.role, "team": entry.team, "action": entry.action,
                "target": entry.target, "address": entry.address,
                "detail": _jsonable(dict(entry.detail)),
            }, sort_keys=True))

    def record_audit(self, entry: AuditEntry) -> None:
        """Append ``entry`` to the audit log (and the ``idlegpu.audit`` logger)."""
        with self._tx(write=True) as conn:
            self._insert_audit(conn, entry)
        self._log_audit(entry)

    def audit_log(self, since: datetime | None = None, *, limit: int = 1000,
                  team: str | None = None, action: str | None = None,
                  actor: str | None = None, offset: int = 0) -> list[AuditEntry]:
        """The audit log, oldest first (``at >= since``), at most ``limit`` entries (the
        newest ones, after skipping the ``offset`` newest: pages from the newest back)."""
        where = []
        if since is not None:
            where.append(AUDIT_LOG.c.at >= _aware(since, "since"))
        if team is not None:
            where.append(AUDIT_LOG.c.team == team)
        if action is not None:
            where.append(AUDIT_LOG.c.action == action)
        if actor is not None:
            where.append(AUDIT_LOG.c.actor == actor)
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(AUDIT_LOG).where(*where)
                                .order_by(AUDIT_LOG.c.id.desc()).offset(max(0, offset))
                                .limit(limit)).all()
        return [AuditEntry(at=r.at, actor=r.actor, auth=r.auth, role=r.role, team=r.team,
                           action=r.action, target=r.target, address=r.address,
                           detail=dict(r.detail or {}), id=r.id) for r in reversed(rows)]

    @staticmethod
    def _token_row(r: Any) -> ApiTokenRow:
        return ApiTokenRow(name=r.name, team=r.team, role=r.role, created_at=r.created_at,
                           expires_at=r.expires_at, revoked_at=r.revoked_at,
                           created_by=r.created_by)

    def create_api_token(self, name: str, team: str, role: str, token_sha256: str,
                         now: datetime, expires_at: datetime | None,
                         audit: AuditEntry) -> ApiTokenRow:
        """Store a new token of the job API by its SHA-256 (the token itself is never stored),
        with ``audit`` in the same transaction. Names are unique, revoked ones included."""
        _aware(now)
        _aware_opt(expires_at, "expires_at")
        try:
            with self._tx(write=True) as conn:
                if conn.execute(sa.select(API_TOKENS.c.name)
                                .where(API_TOKENS.c.name == name)).scalar() is not None:
                    raise StoreError(f"a token named {name!r} already exists (revoked tokens "
                                     "keep their name); choose another name")
                conn.execute(sa.insert(API_TOKENS).values(
                    name=name, token_sha256=token_sha256, team=team, role=role,
                    created_at=now, expires_at=expires_at, revoked_at=None,
                    created_by=audit.actor))
                self._insert_audit(conn, audit)
        except sa_exc.IntegrityError as exc:
            raise StoreError(f"cannot store token {name!r}: {_short(exc)}") from exc
        self._log_audit(audit)
        return ApiTokenRow(name, team, role, now, expires_at, None, audit.actor)

    def api_token_by_hash(self, token_sha256: str) -> ApiTokenRow | None:
        with self._tx(write=False) as conn:
            r = conn.execute(sa.select(API_TOKENS)
                             .where(API_TOKENS.c.token_sha256 == token_sha256)).one_or_none()
        return None if r is None else self._token_row(r)

    def api_tokens(self) -> list[ApiTokenRow]:
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(API_TOKENS).order_by(API_TOKENS.c.name)).all()
        return [self._token_row(r) for r in rows]

    def revoke_api_token(self, name: str, now: datetime, audit: AuditEntry) -> ApiTokenRow:
        """Revoke the token ``name`` (from now on it authenticates nobody); revoking it again
        changes nothing but is audited too."""
        _aware(now)
        with self._tx(write=True) as conn:
            r = conn.execute(sa.select(API_TOKENS)
                             .where(API_TOKENS.c.name == name)).one_or_none()
            if r is None:
                raise StoreError(f"no token named {name!r}; `idlegpu token list` lists them")
            if r.revoked_at is None:
                conn.execute(sa.update(API_TOKENS).where(API_TOKENS.c.name == name)
                             .values(revoked_at=now))
            self._insert_audit(conn, audit)
            r = conn.execute(sa.select(API_TOKENS).where(API_TOKENS.c.name == name)).one()
        self._log_audit(audit)
        return self._token_row(r)

    def submit_from_api(
        self, *, principal: str, idempotency_key: str | None, body_sha256: str,
        request_name: str, team: str, kind: str, raw: Mapping[str, Any],
        units: Sequence[UnitSpec], now: datetime, audit: AuditEntry,
        address: str | None = None, quota: SubmitQuota | None = None,
    ) -> ApiSubmission:
        """``submit`` for a caller of the job API, in one transaction with who submitted it
        and its audit entry. An ``idempotency_key`` is the caller's own (``principal``): when
        the caller used it before, nothing is stored and the earlier request is returned
        (``created=False``, with its body hash for the caller to compare). With ``quota``, a
        submission past it raises ``QuotaExceededError`` and stores nothing."""
        _aware(now)
        if not request_name.strip():
            raise InvalidRequestError("a request needs a name")
        _check_units(units)
        raw_json = _jsonable(raw)
        asked_bytes = (len(json.dumps(raw_json, separators=(",", ":")))
                       + sum(len(json.dumps(spec_to_json(u), separators=(",", ":")))
                             for u in units))

        def earlier(conn: Connection) -> ApiSubmission | None:
            if idempotency_key is None:
                return None
            r = conn.execute(sa.select(API_SUBMISSIONS.c.request_id,
                                       API_SUBMISSIONS.c.body_sha256).where(
                API_SUBMISSIONS.c.principal == principal,
                API_SUBMISSIONS.c.idempotency_key == idempotency_key)).one_or_none()
            return None if r is None else ApiSubmission(r.request_id, False, r.body_sha256)

        for attempt in range(5):
            rid = f"{_slug(request_name)}-{uuid.uuid4().hex[:8]}"
            entry = dataclasses.replace(audit, target=rid)
            try:
                with self._tx(write=True) as conn:
                    found = earlier(conn)
                    if found is not None:
                        return found
                    if quota is not None:
                        self._check_quota(conn, principal, quota, len(units), asked_bytes, now)
                    self._insert_request(conn, rid, request_name, team, kind, raw_json, units,
                                         now, None)
                    conn.execute(sa.insert(API_SUBMISSIONS).values(
                        request_id=rid, principal=principal, idempotency_key=idempotency_key,
                        body_sha256=body_sha256, address=address, stored_bytes=asked_bytes))
                    self._insert_audit(conn, entry)
                self._log_audit(entry)
                return ApiSubmission(rid, True, body_sha256)
            except sa_exc.IntegrityError as exc:
                with self._tx(write=False) as conn:
                    found = earlier(conn)
                if found is not None:
                    return found
                if attempt == 4:
                    raise StoreError(f"cannot store request {request_name}: {_short(exc)}"
                                     ) from exc
        raise AssertionError("unreachable")

    def quota_use(self, principal: str, now: datetime) -> dict[str, Any]:
        """What ``principal`` holds against its quota: live units, bytes of their stored specs
        (and their requests'), requests in the hour before ``now`` and the oldest of them."""
        _aware(now)
        with self._tx(write=False) as conn:
            return self._quota_use(conn, principal, now)

    def _quota_use(self, conn: Connection, principal: str, now: datetime) -> dict[str, Any]:
        sub = API_SUBMISSIONS
        mine = sa.select(sub.c.request_id).where(sub.c.principal == principal)
        live = UNITS.c.state.notin_(_TERMINAL)
        units = conn.execute(sa.select(sa.func.count()).select_from(UNITS).join(
            sub, sub.c.request_id == UNITS.c.request_id).where(
            sub.c.principal == principal, live)).scalar_one()
        stored = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(sub.c.stored_bytes), 0))
                              .where(sub.c.principal == principal, sa.exists().where(
                                  UNITS.c.request_id == sub.c.request_id, live))).scalar_one()
        recent, oldest = conn.execute(sa.select(
            sa.func.count(), sa.func.min(REQUESTS.c.submitted_at)).where(
            REQUESTS.c.id.in_(mine), REQUESTS.c.submitted_at > now - timedelta(hours=1))).one()
        if isinstance(oldest, datetime) and oldest.tzinfo is None:  # func.min drops the type
            oldest = oldest.replace(tzinfo=UTC)
        elif isinstance(oldest, str):
            oldest = datetime.fromisoformat(oldest).replace(tzinfo=UTC)
        return {"live_units": int(units), "stored_bytes": int(stored),
                "requests_last_hour": int(recent), "oldest_in_hour": oldest}

    def _check_quota(self, conn: Connection, principal: str, quota: SubmitQuota, units: int,
                     asked_bytes: int, now: datetime) -> None:
        if conn.dialect.name == "postgresql":
            # one submission of a caller at a time until its transaction ends, so two cannot
            # both pass the check (SQLite's write transactions are one at a time already)
            key = int.from_bytes(hashlib.sha256(b"idlegpu-quota:" + principal.encode())
                                 .digest()[:8], "big", signed=True)
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))
        use = self._quota_use(conn, principal, now)
        where = f"({quota.setting})"
        if use["requests_last_hour"] + 1 > quota.requests_per_hour:
            frees = use["oldest_in_hour"] + timedelta(hours=1)
            wait = max(1.0, (frees - now).total_seconds())
            raise QuotaExceededError(
                f"quota requests_per_hour {where}: {use['requests_last_hour']} requests in the "
                f"last hour, the limit is {quota.requests_per_hour}; the next one frees at "
                f"{frees.isoformat(timespec='seconds')} (in {wait:.0f} s)",
                quota="requests_per_hour", limit=quota.requests_per_hour,
                used=use["requests_last_hour"], asked=1, retry_after_s=wait)
        if use["live_units"] + units > quota.live_units:
            raise QuotaExceededError(
                f"quota live_units {where}: you hold {use['live_units']} live units and this "
                f"request adds {units}, over the limit of {quota.live_units}; it frees as your "
                "units end or as you cancel some (or ask an operator to raise it)",
                quota="live_units", limit=quota.live_units, used=use["live_units"],
                asked=units, retry_after_s=None)
        if use["stored_bytes"] + asked_bytes > quota.stored_bytes:
            raise QuotaExceededError(
                f"quota stored_bytes {where}: your live units' specs hold "
                f"{use['stored_bytes']:,} bytes and this request adds {asked_bytes:,}, over the "
                f"limit of {quota.stored_bytes:,}; pass large values once (a file in storage) "
                "instead of templating them into every unit; it frees as your units end",
                quota="stored_bytes", limit=quota.stored_bytes, used=use["stored_bytes"],
                asked=asked_bytes, retry_after_s=None)

    def drop_ended_specs(self, before: datetime, now: datetime, *, batch: int = 500,
                         max_batches: int = 20) -> int:
        """Retention: drop the bulk of the spec (``DROPPED_SPEC_FIELDS``) of every ended or
        cancelled unit last changed before ``before``, and the body of each request whose
        units are all ended and dropped; ``batch`` units a transaction, at most
        ``max_batches`` (the rest next time). What reports read is kept: the units' team,
        kind, GPUs and state, their attempts and events. The spec stays readable
        (``spec_from_json``), marked ``dropped_at``. Returns how many units it dropped."""
        _aware(before)
        _aware(now)
        stamp = now.isoformat()
        dropped = 0
        not_yet = UNITS.c.spec["dropped_at"].as_string().is_(None)
        for _ in range(max_batches):
            with self._tx(write=True) as conn:
                rows = conn.execute(sa.select(UNITS.c.id, UNITS.c.request_id, UNITS.c.spec).where(
                    UNITS.c.state.in_(_TERMINAL), UNITS.c.updated_at < before, not_yet,
                ).order_by(UNITS.c.updated_at).limit(batch)).all()
                for row in rows:
                    spec = dict(row.spec)
                    for name in DROPPED_SPEC_FIELDS:
                        if name in spec:
                            spec[name] = []
                    spec["dropped_at"] = stamp
                    conn.execute(sa.update(UNITS).where(UNITS.c.id == row.id).values(spec=spec))
                requests = sorted({row.request_id for row in rows})
                if requests:
                    kept = set(conn.execute(sa.select(UNITS.c.request_id).where(
                        UNITS.c.request_id.in_(requests),
                        UNITS.c.state.notin_(_TERMINAL) | not_yet).distinct()).scalars())
                    for rid in requests:
                        if rid not in kept:
                            req_name = conn.execute(sa.select(REQUESTS.c.name).where(
                                REQUESTS.c.id == rid)).scalar()
                            conn.execute(sa.update(REQUESTS).where(REQUESTS.c.id == rid).values(
                                raw={"name": req_name, "dropped_at": stamp}))
            dropped += len(rows)
            if len(rows) < batch:
                break
        return dropped

    def submitted_by(self, request_id: str) -> str | None:
        """The job API caller (principal) who submitted ``request_id`` (None: not through the
        API)."""
        with self._tx(write=False) as conn:
            return conn.execute(sa.select(API_SUBMISSIONS.c.principal).where(
                API_SUBMISSIONS.c.request_id == request_id)).scalar()

    def find_units(self, *, states: Sequence[JobState] | None = None, team: str | None = None,
                   principal: str | None = None, limit: int | None = None) -> list[UnitRow]:
        """Units in submission order, filtered: in ``states`` (None: every state), of
        ``team``, of requests the API caller ``principal`` submitted; the first ``limit``."""
        where: list[Any] = []
        if states is not None:
            where.append(UNITS.c.state.in_([JobState(s).value for s in states]))
        if team is not None:
            where.append(UNITS.c.team == team)
        if principal is not None:
            where.append(UNITS.c.request_id.in_(
                sa.select(API_SUBMISSIONS.c.request_id)
                .where(API_SUBMISSIONS.c.principal == principal)))
        with self._tx(write=False) as conn:
            if limit is None:
                return self._units(conn, where)
            ids = conn.execute(self._unit_query(where).with_only_columns(UNITS.c.id)
                               .limit(limit)).scalars().all()
            return self._units(conn, [UNITS.c.id.in_(ids)]) if ids else []

    def cancel_audited(self, id_or_request_id: str, now: datetime, audit: AuditEntry,
                       reason: str = "cancelled by user") -> CancelResult:
        """``cancel`` with its audit entry in the same transaction."""
        _aware(now)
        with self._tx(write=True) as conn:
            is_unit = conn.execute(
                sa.select(UNITS.c.id).where(UNITS.c.id == id_or_request_id)).scalar()
            if is_unit is not None:
                targets = [id_or_request_id, *self._dependants(conn, [id_or_request_id])]
            else:
                targets = list(conn.execute(
                    sa.select(UNITS.c.id).where(UNITS.c.request_id == id_or_request_id)
                    .order_by(UNITS.c.step_index, UNITS.c.member)).scalars())
                if not targets:
                    raise UnknownJobError(
                        f"no job request or unit {id_or_request_id!r}; `idlegpu queue` lists them")
            result = self._cancel_units(conn, targets, now, reason)
            entry = dataclasses.replace(audit, detail={
                **dict(audit.detail), "reason": reason, "cancelled": list(result.cancelled),
                "to_stop": list(result.to_stop)})
            self._insert_audit(conn, entry)
        self._log_audit(entry)
        return result

    # -- the operators' controls (schema version 5): pausing admission, the daemon's status,
    # -- ended console sessions

    @staticmethod
    def _admission_row(conn: Connection) -> AdmissionState:
        r = conn.execute(sa.select(ADMISSION_CONTROL)
                         .where(ADMISSION_CONTROL.c.pool == _POOL)).one_or_none()
        if r is None:
            return AdmissionState(paused=False)
        return AdmissionState(paused=bool(r.paused), since=r.since, by=r.paused_by,
                              reason=r.reason, changed_at=r.changed_at,
                              changed_by=r.changed_by)

    def admission(self) -> AdmissionState:
        """Whether admission is paused for the pool (one primary-key read: the daemon reads
        it every reconcile pass)."""
        with self._tx(write=False) as conn:
            return self._admission_row(conn)

    def _set_admission(self, pause: bool, now: datetime, reason: str | None,
                       audit: AuditEntry) -> AdmissionChange:
        _aware(now)
        with self._tx(write=True) as conn:
            before = self._admission_row(conn)
            changed = before.paused != pause
            if changed:
                values: dict[str, Any] = (
                    {"paused": True, "since": now, "paused_by": audit.actor, "reason": reason}
                    if pause else
                    {"paused": False, "since": None, "paused_by": None, "reason": None})
                values.update(changed_at=now, changed_by=audit.actor)
                done = conn.execute(sa.update(ADMISSION_CONTROL)
                                    .where(ADMISSION_CONTROL.c.pool == _POOL).values(**values))
                if done.rowcount == 0:
                    conn.execute(sa.insert(ADMISSION_CONTROL).values(pool=_POOL, **values))
            state = self._admission_row(conn)
            entry = dataclasses.replace(audit, detail={
                **dict(audit.detail), "changed": changed,
                **({"reason": reason} if pause else {}),
                **({} if changed or not before.paused else {
                    "paused_since": _iso(before.since), "paused_by": before.by})})
            self._insert_audit(conn, entry)
        self._log_audit(entry)
        return AdmissionChange(state, changed)

    def pause_admission(self, now: datetime, reason: str, audit: AuditEntry) -> AdmissionChange:
        """Pause admission for the pool, with ``audit`` in the same transaction. Pausing what
        is paused changes nothing (the first pause's since, by and reason stand) but is
        audited too."""
        reason = " ".join((reason or "").split())  # one line: logs and pages show it
        if not reason:
            raise InvalidRequestError("reason: a pause needs a reason (who reads the queue "
                                      "sees it), e.g. 'node upgrade'")
        if len(reason) > MAX_PAUSE_REASON:
            raise InvalidRequestError(f"reason: {len(reason)} characters, over the limit of "
                                      f"{MAX_PAUSE_REASON}; shorten it")
        return self._set_admission(True, now, reason, audit)

    def resume_admission(self, now: datetime, audit: AuditEntry) -> AdmissionChange:
        """Resume admission, with ``audit`` in the same transaction (idempotent like
        ``pause_admission``)."""
        return self._set_admission(False, now, None, audit)

    def record_daemon_status(self, status: DaemonStatus) -> None:
        """Write one replica's status (an update, else an insert: only that replica writes
        its row) and forget replicas silent for ``DAEMON_STATUS_KEEP``."""
        _aware(status.updated_at, "updated_at")
        values = {f.name: getattr(status, f.name) for f in fields(status)}
        with self._tx(write=True) as conn:
            done = conn.execute(sa.update(DAEMON_STATUS)
                                .where(DAEMON_STATUS.c.identity == status.identity)
                                .values(**values))
            if done.rowcount == 0:
                conn.execute(sa.insert(DAEMON_STATUS).values(**values))
            conn.execute(sa.delete(DAEMON_STATUS).where(
                DAEMON_STATUS.c.updated_at < status.updated_at - DAEMON_STATUS_KEEP))

    def daemon_statuses(self) -> list[DaemonStatus]:
        """Every replica's last report, the most recent first."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(DAEMON_STATUS)
                                .order_by(DAEMON_STATUS.c.updated_at.desc(),
                                          DAEMON_STATUS.c.identity)).all()
        return [DaemonStatus(**{f.name: getattr(r, f.name) for f in fields(DaemonStatus)})
                for r in rows]

    def end_session(self, session_id: str, expires_at: datetime, now: datetime) -> None:
        """Remember a console session as logged out until it would have expired (every
        ``idlegpu serve`` on this store refuses it from now on); forgets expired ones."""
        _aware(expires_at, "expires_at")
        _aware(now)
        with self._tx(write=True) as conn:
            conn.execute(sa.delete(ENDED_SESSIONS).where(ENDED_SESSIONS.c.expires_at <= now))
            if conn.execute(sa.select(ENDED_SESSIONS.c.session_id).where(
                    ENDED_SESSIONS.c.session_id == session_id)).scalar() is None:
                conn.execute(sa.insert(ENDED_SESSIONS).values(
                    session_id=session_id, expires_at=expires_at, ended_at=now))

    def session_ended(self, session_id: str) -> bool:
        """True when the console session ``session_id`` was logged out (one primary-key read)."""
        with self._tx(write=False) as conn:
            return conn.execute(sa.select(ENDED_SESSIONS.c.session_id).where(
                ENDED_SESSIONS.c.session_id == session_id)).scalar() is not None
