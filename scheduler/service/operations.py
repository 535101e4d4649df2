"""The operators' controls: pausing and resuming admission for the pool (audited, idempotent),
whether it is paused, and the daemon replicas' status. Times are ISO 8601 in the pool zone's
offset, as in every answer a user reads."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

import pandas as pd

from idlegpu.scheduler.adapters.store import MAX_PAUSE_REASON, AdmissionState, JobStore
from idlegpu.scheduler.limits import SURROGATE_PROBLEM, has_surrogate
from idlegpu.scheduler.service.errors import ServiceError
from idlegpu.scheduler.service.identity import MEMBER, OPERATOR, Identity, audit_entry


def iso(when: datetime | pd.Timestamp | None, tz: tzinfo) -> str | None:
    if when is None or (isinstance(when, float) and math.isnan(when)):
        return None
    return str(pd.Timestamp(when).tz_convert(tz).isoformat())


def paused_reason(state: AdmissionState, tz: tzinfo) -> str | None:
    """Why nothing starts while an operator has paused admission (``JobStore.admission()``),
    as the plan, the console and the CLI say it; None while admission is open."""
    if not state.paused:
        return None
    since = pd.Timestamp(state.since).tz_convert(tz).strftime("%a %d %b %H:%M %Z")
    return f"admission is paused by {state.by} since {since}: {state.reason}"


def admission_view(state: AdmissionState, tz: tzinfo) -> dict[str, Any]:
    return {"paused": state.paused, "since": iso(state.since, tz), "by": state.by,
            "reason": state.reason, "changed_at": iso(state.changed_at, tz),
            "changed_by": state.changed_by,
            "text": paused_reason(state, tz) or "admission is open"}


def require_operator(who: Identity, what: str) -> None:
    if who.role != OPERATOR:
        raise ServiceError(403, f"role {who.role} may not {what}: operators only")


def pause_reason(reason: str | None) -> str:
    """A pause's reason on one line (it is shown in logs and pages), or why it is refused."""
    if reason is not None and has_surrogate(reason):
        raise ServiceError(422, f"reason: {SURROGATE_PROBLEM}", field="reason")
    text = " ".join((reason or "").split())
    if not text:
        raise ServiceError(422, "reason: a pause needs a reason (who reads the queue sees it)"
                                ", e.g. 'node upgrade'", field="reason")
    if len(text) > MAX_PAUSE_REASON:
        raise ServiceError(422, f"reason: {len(text)} characters, over the limit of "
                                f"{MAX_PAUSE_REASON}; shorten it", field="reason")
    return text


@dataclass(frozen=True)
class AdmissionChange:
    state: AdmissionState
    changed: bool
    message: str


def pause(store: JobStore, who: Identity, reason: str | None, now: datetime,
          tz: tzinfo) -> AdmissionChange:
    """Pause admission for the pool: the daemon admits nothing until resumed (stops and the
    backstop go on). Pausing a paused pool changes nothing (resume first to give another
    reason)."""
    require_operator(who, "pause admission")
    why = pause_reason(reason)
    change = store.pause_admission(now, why, audit_entry(who, "admission.pause", "pool", now))
    state = change.state
    message = ("admission paused" if change.changed else
               f"admission was already paused by {state.by} since {iso(state.since, tz)}; "
               "nothing changed (resume first to pause again with another reason)")
    return AdmissionChange(state, change.changed, message)


def resume(store: JobStore, who: Identity, now: datetime) -> AdmissionChange:
    require_operator(who, "resume admission")
    change = store.resume_admission(now, audit_entry(who, "admission.resume", "pool", now))
    message = "admission resumed" if change.changed else "admission was not paused; nothing changed"
    return AdmissionChange(change.state, change.changed, message)


def daemon_status(store: JobStore, who: Identity, now: datetime, tz: tzinfo) -> dict[str, Any]:
    """The daemon replicas' status (operators, members): each one's last passes and their
    age, whether it is healthy (a pass within three of its periods, what the daemon's
    /healthz allows), which one leads, the store (where it is: operators only) and
    admission."""
    if who.role not in (OPERATOR, MEMBER):
        raise ServiceError(403, f"role {who.role} may not read the daemon's status: "
                                "operators and members only")
    started = time.perf_counter()
    version = store.schema_version()
    answered_ms = (time.perf_counter() - started) * 1000

    def age(when: datetime | None) -> float | None:
        return None if when is None else round((now - when).total_seconds(), 1)

    replicas = []
    for r in store.daemon_statuses():
        limit = 3 * r.reconcile_seconds  # what the daemon's /healthz allows
        passed = max((t for t in (r.last_reconcile_at, r.last_backstop_at) if t), default=None)
        newest = r.updated_at if r.role == "standby" else passed
        replicas.append({
            "identity": r.identity, "host": r.host, "pid": r.pid, "role": r.role,
            "updated_at": iso(r.updated_at, tz), "updated_age_s": age(r.updated_at),
            "reconcile_seconds": r.reconcile_seconds, "stale_after_s": limit,
            "last_reconcile_at": iso(r.last_reconcile_at, tz),
            "last_reconcile_age_s": age(r.last_reconcile_at),
            "last_backstop_at": iso(r.last_backstop_at, tz),
            "last_backstop_age_s": age(r.last_backstop_at),
            "last_pass": r.last_pass, "admitted": r.admitted, "stopped": r.stopped,
            "errors": r.errors, "forecast_made_at": iso(r.forecast_made_at, tz),
            "forecast_age_s": age(r.forecast_made_at), "signals_age_s": r.signals_age_s,
            "healthy": newest is not None and (now - newest).total_seconds() <= limit})
    leader = next((r for r in replicas if r["role"] in ("leader", "single")), None)
    return {"now": iso(now, tz), "replicas": replicas,
            "leader": leader["identity"] if leader else None,
            "healthy": bool(leader and leader["healthy"]),
            # where the store is: operators only (even redacted, it names a host)
            "store": {"location": store.location if who.role == OPERATOR else None,
                      "schema_version": version, "answers": True,
                      "answered_ms": round(answered_ms, 1)},
            "admission": admission_view(store.admission(), tz)}
