"""Units outside the store (schema version 8): the Kueue Workloads and users' own Jobs the
daemon admits, as its last pass saw them (``external_units``), and when each held its GPUs
(``external_holds``: one row from admission to the end of the hold), for the queue views and
the monthly report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from idlegpu.scheduler.adapters.store.base import StoreBase
from idlegpu.scheduler.adapters.store.codec import _aware
from idlegpu.scheduler.adapters.store.schema import EXTERNAL_HOLDS, EXTERNAL_UNITS
from idlegpu.scheduler.types import ExternalUnit

_HOLDING_STATES = ("running", "stopping")
_FIELDS = ("origin", "namespace", "name", "team", "gpus", "state", "reason", "start_at",
           "stop_by", "since")


def _row_unit(r: sa.Row) -> ExternalUnit:
    return ExternalUnit(id=r.id, origin=r.origin, namespace=r.namespace, name=r.name,
                        team=r.team, gpus=r.gpus, state=r.state, reason=r.reason,
                        start_at=r.start_at, stop_by=r.stop_by, since=r.since)


def _end_of(unit: ExternalUnit | None) -> str:
    """How a hold ended, from what the pass saw of its unit."""
    if unit is None:
        return "gone"
    return "finished" if unit.state == "ended" else "stopped"


@dataclass(frozen=True)
class ExternalHold:
    """One time a unit outside the store held its GPUs (``ended_at`` None: it still does)."""

    unit_id: str
    origin: str
    team: str
    gpus: int
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None


class ExternalMixin(StoreBase):
    """``JobStore``'s units outside the store."""

    def record_external(self, units: Sequence[ExternalUnit], now: datetime,
                        origins: Sequence[str]) -> int:
        """The daemon's pass saw ``units`` of ``origins`` (the sources it could read): rows
        are written where they changed, those of these origins no longer seen are dropped,
        and holds open when a unit starts holding GPUs and close when it stops; returns the
        rows written. One transaction."""
        _aware(now)
        seen = {u.id: u for u in units if u.origin in origins}
        written = 0
        with self._tx(write=True) as conn:
            stored = {r.id: r for r in conn.execute(sa.select(EXTERNAL_UNITS).where(
                EXTERNAL_UNITS.c.origin.in_(list(origins))))}
            open_holds = {r.unit_id for r in conn.execute(
                sa.select(EXTERNAL_HOLDS.c.unit_id).where(
                    EXTERNAL_HOLDS.c.ended_at.is_(None),
                    EXTERNAL_HOLDS.c.origin.in_(list(origins))))}
            inserts, updates = [], []
            for unit in seen.values():
                values = {f: getattr(unit, f) for f in _FIELDS}
                values["reason"] = values["reason"][:2048]
                old = stored.get(unit.id)
                if old is None:
                    inserts.append({"id": unit.id, **values, "updated_at": now})
                elif any(getattr(old, f) != values[f] for f in _FIELDS):
                    updates.append({"key": unit.id, **values, "updated_at": now})
            if inserts:
                conn.execute(sa.insert(EXTERNAL_UNITS), inserts)
            if updates:
                conn.execute(sa.update(EXTERNAL_UNITS)
                             .where(EXTERNAL_UNITS.c.id == sa.bindparam("key"))
                             .values({f: sa.bindparam(f) for f in (*_FIELDS, "updated_at")}),
                             updates)
            gone = [k for k in stored if k not in seen]
            if gone:
                conn.execute(sa.delete(EXTERNAL_UNITS).where(EXTERNAL_UNITS.c.id.in_(gone)))
            holding = {k for k, u in seen.items() if u.state in _HOLDING_STATES}
            starts = [{"unit_id": k, "origin": seen[k].origin, "team": seen[k].team,
                       "gpus": seen[k].gpus, "started_at": seen[k].since or now}
                      for k in sorted(holding - open_holds)]
            if starts:
                conn.execute(sa.insert(EXTERNAL_HOLDS), starts)
            ends = sorted(open_holds - holding)
            for outcome in ("finished", "stopped", "gone"):
                ids = [k for k in ends if _end_of(seen.get(k)) == outcome]
                if ids:
                    conn.execute(sa.update(EXTERNAL_HOLDS).where(
                        EXTERNAL_HOLDS.c.unit_id.in_(ids), EXTERNAL_HOLDS.c.ended_at.is_(None))
                        .values(ended_at=now, outcome=outcome))
            written = len(inserts) + len(updates) + len(gone) + len(starts) + len(ends)
        return written

    def external_units(self) -> list[ExternalUnit]:
        """The units outside the store as the daemon last saw them, oldest change first."""
        with self._tx(write=False) as conn:
            return [_row_unit(r) for r in conn.execute(
                sa.select(EXTERNAL_UNITS).order_by(EXTERNAL_UNITS.c.updated_at,
                                                   EXTERNAL_UNITS.c.id))]

    def external_holds(self, since: datetime | None = None) -> list[ExternalHold]:
        """Every hold (that had not ended before ``since``), oldest first."""
        query = sa.select(EXTERNAL_HOLDS).order_by(EXTERNAL_HOLDS.c.started_at,
                                                    EXTERNAL_HOLDS.c.id)
        if since is not None:
            query = query.where(sa.or_(EXTERNAL_HOLDS.c.ended_at.is_(None),
                                       EXTERNAL_HOLDS.c.ended_at > _aware(since)))
        with self._tx(write=False) as conn:
            return [ExternalHold(r.unit_id, r.origin, r.team, r.gpus, r.started_at, r.ended_at,
                                 r.outcome) for r in conn.execute(query)]

    def external_gpu_seconds(self, start: datetime, end: datetime
                             ) -> dict[tuple[str, str], float]:
        """GPU-seconds the units outside the store held within ``[start, end)``, by
        ``(origin, team)``; a hold still open counts until ``end``."""
        _aware(start)
        _aware(end)
        out: dict[tuple[str, str], float] = {}
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(EXTERNAL_HOLDS).where(
                EXTERNAL_HOLDS.c.started_at < end,
                sa.or_(EXTERNAL_HOLDS.c.ended_at.is_(None), EXTERNAL_HOLDS.c.ended_at > start)))
            for r in rows:
                began = max(r.started_at, start)
                ended = min(r.ended_at or end, end)
                seconds = max(0.0, (ended - began).total_seconds()) * r.gpus
                key = (r.origin, r.team)
                out[key] = out.get(key, 0.0) + seconds
        return out
