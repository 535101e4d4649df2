"""The operators' controls (schema version 5): pausing admission for the pool, every daemon
replica's status after its passes, and the console sessions logged out before their
expiry."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from idlegpu.scheduler.adapters.store.codec import _aware, _iso
from idlegpu.scheduler.adapters.store.errors import InvalidRequestError
from idlegpu.scheduler.adapters.store.identities import AuditMixin
from idlegpu.scheduler.adapters.store.rows import (
    AdmissionChange,
    AdmissionState,
    AuditEntry,
    DaemonStatus,
)
from idlegpu.scheduler.adapters.store.schema import (
    _POOL,
    ADMISSION_CONTROL,
    DAEMON_STATUS,
    ENDED_SESSIONS,
)

MAX_PAUSE_REASON = 500
"""The longest reason a pause may give (characters, after joining it into one line)."""
DAEMON_STATUS_KEEP = timedelta(days=1)
"""A replica that has not reported for this long is forgotten (a restart is a new pid)."""


class OperatorsMixin(AuditMixin):
    """``JobStore``'s operators' controls: admission pause, daemon status, ended sessions."""

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
