"""Requests, their units, attempts and the accounting log: submitting, reading (the queue,
what holds GPUs, what finished, the events, the teams' GPU-hours) and retention. The state
changes of units are ``transitions``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from idlegpu.scheduler.adapters.store.base import StoreBase
from idlegpu.scheduler.adapters.store.codec import (
    DROPPED_SPEC_FIELDS,
    _aware,
    _check_units,
    _jsonable,
    _short,
    _slug,
    spec_from_json,
    spec_to_json,
    unit_id_for,
)
from idlegpu.scheduler.adapters.store.errors import InvalidRequestError, StoreError, UnknownJobError
from idlegpu.scheduler.adapters.store.rows import (
    AttemptOutcome,
    AttemptRow,
    EventRow,
    RequestRow,
    UnitRow,
)
from idlegpu.scheduler.adapters.store.schema import (
    _HOLDING,
    _TERMINAL,
    API_SUBMISSIONS,
    ATTEMPTS,
    EVENTS,
    REQUESTS,
    UNIT_DEPS,
    UNITS,
)
from idlegpu.scheduler.queue_view import overruns_of, running_jobs, waiting_jobs, work_rate
from idlegpu.scheduler.types import EventKind, JobState, Overruns, RunningJob, UnitSpec, WaitingJob


class UnitsMixin(StoreBase):
    """``JobStore``'s requests, units, attempts and events (reads and submissions)."""

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
                "step_index": u.step_index, "member": u.member, "team": team, "kind": u.kind,
                "gpus": u.gpus, "priority": u.priority, "checkpointable": u.checkpointable,
                "spec": spec_to_json(u), "state": JobState.QUEUED.value, "version": 0,
                "attempts": 0, "preemptions": 0, "work_done_s": 0.0, "last_checkpoint_at": None,
                "current_attempt": None, "stop_by": None, "cancel_requested_at": None,
                "reason": None, "submitted_at": now, "updated_at": now,
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
             "unit_id": unit_id_for(rid, u.step_index, u.member), "request_id": rid,
             "team": team, "gpus": u.gpus, "gpu_seconds": None,
             "detail": {"request": name, "kind": kind}}
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

    def ready_units(self, now: datetime) -> list[UnitRow]:
        """QUEUED units submitted by ``now`` whose dependencies all SUCCEEDED, in submission
        order: what admission may start (``queue_view.waiting_jobs`` makes the policy's
        ``WaitingJob`` of them)."""
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
            return self._units(conn, where)

    def waiting(self, now: datetime, estimate: Callable[[UnitRow], float],
                overruns: Overruns | None = None) -> list[WaitingJob]:
        """``queue_view.waiting_jobs`` of ``ready_units(now)`` with ``estimate(row)`` of each:
        QUEUED units submitted by ``now`` whose dependencies all SUCCEEDED, for the policy.

        ``runtime_s`` is what ``overruns.remaining_s`` leaves of ``estimate(row)`` after the
        checkpointed progress of a checkpointable unit (the estimate less that progress; past
        the estimate, from the overruns of finished units; default: no overruns known)."""
        rows = self.ready_units(now)
        return waiting_jobs(rows, {row.id: estimate(row) for row in rows}, overruns)

    def running(self, now: datetime, estimate: Callable[[UnitRow], float],
                overruns: Overruns | None = None, *,
                notice_s: float = 0.0) -> list[RunningJob]:
        """``queue_view.running_jobs`` of ``holding()`` with ``estimate(row)`` of each: units
        holding GPUs (ADMITTED or RUNNING), including those marked for a cancel; those that
        answer checkpoint notices get ``notice_s`` of notice.

        ``started_at`` is the attempt's start (its admission until it started);
        ``remaining_s = overruns.remaining_s(estimate(row), work_done_s + (now - since))``
        where ``since`` is the attempt's last checkpoint, else its start: the estimate less
        the work done, and past the estimate what finished units' overruns say (default: no
        overruns known, so as long again as the overrun so far, at least a quarter of the
        estimate), never "it ends now"."""
        _aware(now)
        rows = self.holding()
        return running_jobs(rows, now, {row.id: estimate(row) for row in rows}, overruns,
                            notice_s=notice_s)

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
            ran *= work_rate(r.gpus, row.spec.gpus)
            out.append((row, float(r.work_done_at_start_s or 0.0) + ran))
        return out

    def overruns(self, estimate: Callable[[UnitRow], float], quantile: float = 0.9,
                 limit: int = 500) -> Overruns:
        """How the last ``limit`` finished units ran against ``estimate``: the ratios
        ``runtime / estimate(row)`` that ``running`` and ``waiting`` plan a unit past its own
        estimate with (``queue_view.overruns_of`` of ``finished_runs``)."""
        return overruns_of(((work_s, estimate(row)) for row, work_s in self.finished_runs(limit)),
                           quantile)

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

    # -- retention and filtered reads

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
