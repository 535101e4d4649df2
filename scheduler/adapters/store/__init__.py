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
- ``external_units``, ``external_holds`` (version 8, Kubernetes-native submission): the Kueue
  Workloads and users' own Jobs the daemon admits, as its last pass saw them (origin, team,
  GPUs, state, why it waits and its estimated start), and one row per time each held GPUs.

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

**Layout** (one module per table group; ``JobStore`` is their mixins together, SQL only):
``schema`` (tables, schema version, migrations), ``base`` (engine, transactions), ``units``
(submitting and reading requests, units, attempts, events), ``transitions`` (the units'
state changes), ``notices`` (checkpoint notices, workload reports), ``identities`` (API
tokens, API submissions and quotas, the audit log), ``operators`` (admission pause, daemon
status, console sessions), ``rows`` and ``errors`` (what the store returns and raises),
``codec`` (times, JSON, specs). The policy's inputs (``WaitingJob``, ``RunningJob``,
``Overruns``) are built from the rows by the pure ``idlegpu.scheduler.queue_view``;
``waiting``, ``running`` and ``overruns`` here are thin wrappers over it.
"""

from __future__ import annotations

from idlegpu.forecast.redact import redact
from idlegpu.scheduler.adapters.store.base import _make_engine
from idlegpu.scheduler.adapters.store.codec import (
    DROPPED_SPEC_FIELDS,
    spec_from_json,
    spec_to_json,
    unit_id_for,
)
from idlegpu.scheduler.adapters.store.errors import (
    InvalidRequestError,
    QuotaExceededError,
    SchemaVersionError,
    StaleStateError,
    StoreError,
    StoreUnavailableError,
    TransitionRefusedError,
    UnknownJobError,
)
from idlegpu.scheduler.adapters.store.external import ExternalMixin
from idlegpu.scheduler.adapters.store.identities import AUDIT_LOGGER, IdentitiesMixin
from idlegpu.scheduler.adapters.store.notices import REPORT_EVERY_S, NoticesMixin
from idlegpu.scheduler.adapters.store.operators import (
    DAEMON_STATUS_KEEP,
    MAX_PAUSE_REASON,
    OperatorsMixin,
)
from idlegpu.scheduler.adapters.store.rows import (
    AdmissionChange,
    AdmissionState,
    ApiSubmission,
    ApiTokenRow,
    AttemptOutcome,
    AttemptRow,
    AuditEntry,
    CancelResult,
    DaemonStatus,
    EventRow,
    NoticeRow,
    RequestRow,
    SubmitQuota,
    UnitRow,
    WorkloadReport,
)
from idlegpu.scheduler.adapters.store.schema import (
    ADMISSION_CONTROL,
    API_SUBMISSIONS,
    API_TOKENS,
    ATTEMPTS,
    AUDIT_LOG,
    DAEMON_STATUS,
    ENDED_SESSIONS,
    EVENTS,
    METADATA,
    MIGRATIONS,
    REQUESTS,
    SCHEMA_VERSION,
    SCHEMA_VERSION_TABLE,
    STORE_META,
    UNIT_DEPS,
    UNITS,
    WORKLOAD_REPORTS,
    Migration,
    UTCDateTime,
    apply_migrations,
)
from idlegpu.scheduler.types import NoticeOutcome

__all__ = [
    "ADMISSION_CONTROL",
    "API_SUBMISSIONS",
    "API_TOKENS",
    "ATTEMPTS",
    "AUDIT_LOG",
    "AUDIT_LOGGER",
    "DAEMON_STATUS",
    "DAEMON_STATUS_KEEP",
    "DROPPED_SPEC_FIELDS",
    "ENDED_SESSIONS",
    "EVENTS",
    "MAX_PAUSE_REASON",
    "METADATA",
    "MIGRATIONS",
    "REPORT_EVERY_S",
    "REQUESTS",
    "SCHEMA_VERSION",
    "SCHEMA_VERSION_TABLE",
    "STORE_META",
    "UNITS",
    "UNIT_DEPS",
    "WORKLOAD_REPORTS",
    "AdmissionChange",
    "AdmissionState",
    "ApiSubmission",
    "ApiTokenRow",
    "AttemptOutcome",
    "AttemptRow",
    "AuditEntry",
    "CancelResult",
    "DaemonStatus",
    "EventRow",
    "InvalidRequestError",
    "JobStore",
    "Migration",
    "NoticeOutcome",
    "NoticeRow",
    "QuotaExceededError",
    "RequestRow",
    "SchemaVersionError",
    "StaleStateError",
    "StoreError",
    "StoreUnavailableError",
    "SubmitQuota",
    "TransitionRefusedError",
    "UTCDateTime",
    "UnitRow",
    "UnknownJobError",
    "WorkloadReport",
    "spec_from_json",
    "spec_to_json",
    "unit_id_for",
]


class JobStore(IdentitiesMixin, OperatorsMixin, NoticesMixin, ExternalMixin):
    """Job requests, units, attempts and events in a SQL database (see the package doc).

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

    def __repr__(self) -> str:
        return f"JobStore({self._where!r})"

    def _migrate(self) -> None:
        # this package's MIGRATIONS as it is at open (a test replaces it here to make an older
        # store, or a newer one)
        with self._tx(write=True) as conn:
            apply_migrations(conn, self._where, MIGRATIONS)
