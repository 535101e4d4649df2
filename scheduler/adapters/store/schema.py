"""The job store's schema: its tables (the live definition, the newest), the schema version
and the migrations that bring an older store to it (see the package doc for what each table
holds)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from idlegpu.scheduler.adapters.store.codec import _short
from idlegpu.scheduler.adapters.store.errors import SchemaVersionError, StoreError
from idlegpu.scheduler.types import JobState


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


_V8_MD = sa.MetaData()
EXTERNAL_UNITS = sa.Table(
    "external_units", _V8_MD,
    sa.Column("id", sa.String(320), primary_key=True),  # kueue/<ns>/<name>, job/<ns>/<name>
    sa.Column("origin", sa.String(16), nullable=False),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("name", sa.String(253), nullable=False),
    sa.Column("team", sa.String(63), nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("start_at", UTCDateTime),
    sa.Column("stop_by", UTCDateTime),
    sa.Column("since", UTCDateTime),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.Index("ix_external_units_origin", "origin"),
)
EXTERNAL_HOLDS = sa.Table(
    "external_holds", _V8_MD,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("unit_id", sa.String(320), nullable=False),
    sa.Column("origin", sa.String(16), nullable=False),
    sa.Column("team", sa.String(63), nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("started_at", UTCDateTime, nullable=False),
    sa.Column("ended_at", UTCDateTime),  # NULL: holds its GPUs still
    # finished (seen ended), stopped (seen waiting again: stopped by idlegpu or Kueue), gone
    # (no longer listed: deleted, or finished and removed between two passes)
    sa.Column("outcome", sa.String(16)),
    sa.Index("ix_external_holds_open", "unit_id", "ended_at"),
    sa.Index("ix_external_holds_started_at", "started_at"),
)


def _v8_external(conn: Connection) -> None:
    # new tables only (units outside the store: Kueue Workloads, users' own Jobs)
    _V8_MD.create_all(conn)


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
    ("external_units, external_holds: Kueue Workloads and users' Jobs, and their GPU time",
     _v8_external),
]
"""Applied in order at open, all pending ones in one transaction; version N = MIGRATIONS[N-1].
Append only."""
SCHEMA_VERSION = len(MIGRATIONS)

_PG_MIGRATION_LOCK = 0x1D1E_690  # pg_advisory_xact_lock key: one migrator at a time
_TERMINAL = tuple(s.value for s in JobState if s.is_terminal())
_HOLDING = (JobState.ADMITTED, JobState.RUNNING)


def apply_migrations(conn: Connection, where: str, migrations: Sequence[Migration]) -> None:
    """Bring the store on ``conn`` (``where``: its redacted URL, for errors) to the newest of
    ``migrations``, in the caller's transaction: every pending one in order, each recorded in
    ``schema_version``; a store newer than ``migrations`` raises ``SchemaVersionError``."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
    SCHEMA_VERSION_TABLE.create(conn, checkfirst=True)
    current = conn.execute(
        sa.select(sa.func.max(SCHEMA_VERSION_TABLE.c.version))
    ).scalar() or 0
    known = len(migrations)
    if current > known:
        raise SchemaVersionError(
            f"job store {where} has schema version {current}, newer than this "
            f"idlegpu knows ({known}); upgrade idlegpu"
        )
    for version in range(current + 1, known + 1):
        name, migrate = migrations[version - 1]
        try:
            migrate(conn)
        except sa_exc.OperationalError as exc:
            if "lock" in str(exc).lower() or "busy" in str(exc).lower():
                raise
            raise StoreError(
                f"cannot migrate job store {where} to schema version {version} "
                f"({name}): {_short(exc)}"
            ) from exc
        except sa_exc.DBAPIError as exc:
            raise StoreError(
                f"cannot migrate job store {where} to schema version {version} "
                f"({name}): {_short(exc)}"
            ) from exc
        conn.execute(
            sa.insert(SCHEMA_VERSION_TABLE).values(version=version, name=name)
        )
