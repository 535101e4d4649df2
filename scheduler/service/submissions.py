"""Submissions: parse a request body, submit, validate (a dry run), cancel. One rule for every
front door: the caller's team is the request's (the CLI's local operator acts for any team), a
team's priority cap and its members' quotas bound what the job API's callers submit, an
idempotency key is the caller's own (a second submission with it returns the first request,
or is refused when its body differs), and every change is stored with its audit entry in one
transaction."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from idlegpu.scheduler.adapters.store import CancelResult, JobStore, SubmitQuota, UnknownJobError
from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.limits import SURROGATE_PROBLEM, has_surrogate
from idlegpu.scheduler.service.errors import SOURCE, ServiceError
from idlegpu.scheduler.service.identity import Identity, audit_entry
from idlegpu.scheduler.specs import JobRequest, expand_units, load_request_text, validate_request
from idlegpu.scheduler.types import UnitSpec

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
JSON_TYPES = ("application/json",)
MAX_CANCEL_REASON = 500


def content_kind(header: str | None) -> str:
    """The media type of a ``Content-Type`` header (JSON when there is none), or a 415."""
    kind = (header or "application/json").split(";")[0].strip().lower()
    if kind not in (*JSON_TYPES, *YAML_TYPES):
        raise ServiceError(415, f"Content-Type {kind!r} is not accepted; send the request as "
                                "application/json or application/yaml")
    return kind


def parse_body(kind: str, body: bytes, settings: Settings) -> JobRequest:
    """A request from a body of media type ``kind`` (YAML or JSON), validated against the
    admission rules of ``settings``, under the same bounds as a request file."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ServiceError(400, f"{SOURCE}: the body is not UTF-8 text") from None
    if kind in YAML_TYPES:
        return load_request_text(text, settings.admission, source=SOURCE,
                                 nodes=settings.pool.nodes)
    limit = settings.admission.limits.max_request_bytes
    if len(body) > limit:  # the same bound as a request file's (YAML bodies check it too)
        raise ServiceError(413, f"{SOURCE}: the request is {len(body)} bytes, over the limit "
                                f"of {limit} (admission.limits.max_request_bytes)")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, or an int too long
        where = (f" at line {exc.lineno}, column {exc.colno}"
                 if isinstance(exc, json.JSONDecodeError) else "")
        problem = (exc.msg if isinstance(exc, json.JSONDecodeError) else
                   "too deeply nested" if isinstance(exc, RecursionError) else
                   "a number too long to read")
        raise ServiceError(400, f"{SOURCE}: invalid JSON{where}: {problem}") from None
    return validate_request(data, settings.admission, source=SOURCE, nodes=settings.pool.nodes)


def require_change(who: Identity, what: str) -> None:
    if not who.may_change():
        raise ServiceError(403, f"role {who.role} may not {what}: viewers read only")


def checked_units(job: JobRequest, who: Identity, settings: Settings | None,
                  refusal: str = "") -> list[UnitSpec]:
    """``job``'s units, once the caller may submit it: its team is the caller's (``refusal``
    ends that message) and its priorities are within the team's cap. ``settings``: the
    server's (None only for the CLI's local operator without a config)."""
    require_change(who, "submit requests")
    if not who.local and job.team != who.team:
        raise ServiceError(403, f"{SOURCE}: team: you act for team {who.team!r}; a request "
                                f"for team {job.team!r} is refused{refusal}", field="team")
    units = expand_units(job)
    if not who.local:
        assert settings is not None  # the job API and the console always have theirs
        _check_priority(job, units, who.team, settings)
    return units


def _check_priority(job: JobRequest, units: Sequence[UnitSpec], team: str,
                    settings: Settings) -> None:
    cap = settings.api.team(team).max_priority
    if cap is None:
        return
    for unit in units:
        if unit.priority > cap:
            step = job.steps[unit.step_index] if job.steps else None
            field = (f"steps.{unit.step_index}.priority"
                     if step is not None and step.priority is not None else "priority")
            setting = f"api.teams.{team if team in settings.api.teams else '*'}.max_priority"
            raise ServiceError(422, f"{SOURCE}: {field}: priority {unit.priority} is above "
                                    f"team {team}'s cap of {cap} ({setting}); use {cap} or "
                                    "less", field=field)


def body_sha256(data: Any) -> str:
    """The hash an idempotency key's body is compared by: of the validated request, so that
    the same request in YAML or JSON, or with other spacing, is the same body."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Submitted:
    request_id: str
    created: bool
    """False: the caller's idempotency key named an earlier submission of the same body."""
    units: list[UnitSpec]


def submit(store: JobStore, settings: Settings | None, who: Identity, job: JobRequest,
           now: datetime, *, idempotency_key: str | None = None) -> Submitted:
    """Store ``job`` for ``who`` at ``now``, with its audit entry (and, for the job API's
    callers, within their quota)."""
    units = checked_units(job, who, settings, " (the team of a request is the caller's)")
    raw = job.model_dump(mode="json")
    digest = body_sha256(raw)
    quota = None
    if not who.local:
        assert settings is not None  # the job API and the console always have theirs
        limits, setting = settings.api.quota(who.team, who.user)
        quota = SubmitQuota(limits.live_units, limits.requests_per_hour, limits.stored_bytes,
                            setting)
    outcome = store.submit_from_api(
        principal=who.principal, idempotency_key=idempotency_key, body_sha256=digest,
        request_name=job.name, team=job.team if who.local else who.team, kind=job.kind,
        raw=raw, units=units, now=now,
        audit=audit_entry(who, "submit", "", now, request=job.name, units=len(units),
                          idempotency_key=idempotency_key),
        address=who.address, quota=quota)
    if not outcome.created and outcome.body_sha256 != digest:
        raise ServiceError(409, f"Idempotency-Key {idempotency_key!r} was used for request "
                                f"{outcome.request_id} with a different body; use a new key "
                                "for a new request", field="Idempotency-Key")
    return Submitted(outcome.request_id, outcome.created, units)


def validate(settings: Settings, who: Identity, job: JobRequest,
             preview: Callable[[Sequence[UnitSpec], str], dict[str, Any]]) -> dict[str, Any]:
    """What submitting ``job`` would queue, nothing stored: its units, each with its runtime
    estimate and, from ``preview`` (tonight's plan with them queued now), its estimated start
    or the reason it would wait."""
    units = checked_units(job, who, settings)
    planned = preview(units, who.team)  # a dry run: nothing is stored
    return {"name": job.name, "team": job.team, "kind": job.kind,
            "plan_made_at": planned["made_at"], "forecast_age_s": planned["forecast_age_s"],
            "units": [{"step": u.step, "step_index": u.step_index, "member": u.member,
                       "gpus": u.gpus, "image": u.image, "priority": u.priority,
                       "runtime_estimate_s": u.runtime_estimate_s,
                       "checkpointable": u.checkpointable, **p}
                      for u, p in zip(units, planned["units"], strict=True)]}


def cancel(store: JobStore, who: Identity, target: str, now: datetime,
           reason: str | None = None, *, kind: str | None = None) -> CancelResult:
    """Cancel a request or a unit (and what depends on it) for ``who``: members their team's,
    operators anyone's; queued units at once, running ones marked for the daemon to stop.
    ``kind``: ``request`` or ``unit`` when the caller named which (None: either)."""
    require_change(who, "cancel")
    if reason is not None and has_surrogate(reason):
        raise ServiceError(422, f"reason: {SURROGATE_PROBLEM}", field="reason")
    team = _team_of(store, target, kind)
    if not who.may_cancel(team):
        raise ServiceError(403, f"{target} belongs to team {team!r}; a {who.role} of team "
                                f"{who.team!r} may cancel only its own team's work")
    why = (reason or f"cancelled by {who.user}").strip()[:MAX_CANCEL_REASON]
    return store.cancel_audited(target, now, audit_entry(who, "cancel", target, now),
                                reason=why)


def _team_of(store: JobStore, target: str, kind: str | None) -> str:
    if kind == "unit":
        return store.unit(target).team
    if kind == "request":
        return store.request(target).team
    try:
        return store.unit(target).team
    except UnknownJobError:
        pass
    try:
        return store.request(target).team
    except UnknownJobError:
        raise UnknownJobError(f"no job request or unit {target!r}; `idlegpu queue` lists them"
                              ) from None
