"""The units' transitions, each one compare-and-set transaction (see the package doc's
table): admission, start, checkpoint, shrink, release (preemption, requeue), finish, failure
and cancel, with their attempts and accounting events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from idlegpu.scheduler.adapters.store.base import StoreBase
from idlegpu.scheduler.adapters.store.codec import (
    _aware,
    _aware_opt,
    _iso,
    _jsonable,
    spec_from_json,
)
from idlegpu.scheduler.adapters.store.errors import (
    StaleStateError,
    StoreError,
    TransitionRefusedError,
    UnknownJobError,
)
from idlegpu.scheduler.adapters.store.rows import AttemptOutcome, CancelResult
from idlegpu.scheduler.adapters.store.schema import _HOLDING, ATTEMPTS, EVENTS, UNIT_DEPS, UNITS
from idlegpu.scheduler.types import EventKind, JobState, smaller_sizes


class TransitionsMixin(StoreBase):
    """``JobStore``'s transitions of units (and the row-level steps they are made of)."""

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
        TransitionsMixin._expect(row, action, allowed)
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
        spec = spec_from_json(row.spec)
        least = spec.min_gpus or row.gpus
        if int(gpus) not in smaller_sizes(row.gpus, least, spec.gpus_step):
            steps = f" in steps of {spec.gpus_step}" if spec.gpus_step > 1 else ""
            raise TransitionRefusedError(
                f"unit {row.id} runs on {least} to {row.gpus} GPUs{steps}, not {gpus}")
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

    def renew(self, unit_id: str, now: datetime, stop_by: datetime | None) -> None:
        """A unit holding GPUs runs on into a renewed window: its attempt's ``stop_by`` is
        now ``stop_by`` (None: it may run to its end)."""
        _aware(now)
        _aware_opt(stop_by, "stop_by")
        with self._tx(write=True) as conn:
            row = self._load(conn, unit_id)
            if row.stop_by == stop_by:
                return
            self._cas(conn, row, "renew", _HOLDING, stop_by=stop_by, updated_at=now)
            conn.execute(sa.update(ATTEMPTS).where(ATTEMPTS.c.id == row.current_attempt)
                         .values(stop_by=stop_by))

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
