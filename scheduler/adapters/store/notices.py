"""Checkpoint notices and what workloads report (the cooperative checkpoint, schema version
7): a notice per attempt before a planned stop, its delivery, answer and outcome; the
checkpoints and progress a unit's own workload reports through the job API."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from idlegpu.scheduler.adapters.store.codec import _aware, _aware_opt, _iso, spec_from_json
from idlegpu.scheduler.adapters.store.errors import TransitionRefusedError
from idlegpu.scheduler.adapters.store.rows import NoticeRow, WorkloadReport
from idlegpu.scheduler.adapters.store.schema import _HOLDING, ATTEMPTS, WORKLOAD_REPORTS
from idlegpu.scheduler.adapters.store.transitions import TransitionsMixin
from idlegpu.scheduler.queue_view import work_rate
from idlegpu.scheduler.types import EventKind, JobState, NoticeOutcome

REPORT_EVERY_S = 5.0
"""The shortest interval between two recorded progress reports, or two checkpoint reports,
of one attempt: a workload that reports every batch costs one write per interval."""


class NoticesMixin(TransitionsMixin):
    """``JobStore``'s checkpoint notices and workload reports."""

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
            rate = work_rate(att.gpus, spec.gpus)
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
