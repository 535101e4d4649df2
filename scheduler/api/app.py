"""The job API's routes (FastAPI), under ``/v1``; OpenAPI at ``/docs`` and ``/openapi.json``.

Every answer is JSON. Errors are ``{"error": {"message": "...", "field": "steps.0.gpus"}}``
with the one-line message the CLI prints for the same problem (``field`` is null when the
problem is not about one field); bad input is a 4xx, never a traceback. The caller's identity,
team and role come from ``idlegpu.scheduler.api.auth``; ``submitted_at`` is this server's clock.
"""


import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from idlegpu.forecast.config import Settings
from idlegpu.scheduler.adapters.store import (
    MAX_PAUSE_REASON,
    AuditEntry,
    InvalidRequestError,
    JobStore,
    QuotaExceededError,
    StoreError,
    StoreUnavailableError,
    SubmitQuota,
    TransitionRefusedError,
    UnitRow,
    UnknownJobError,
    spec_to_json,
)
from idlegpu.scheduler.api.auth import MEMBER, OPERATOR, ApiError, Authenticator, Identity, Reviewer
from idlegpu.scheduler.api.bodies import BoundedBodies
from idlegpu.scheduler.api.checkpoints import PodDirectory, add_checkpoint_routes
from idlegpu.scheduler.api.docs import add_docs
from idlegpu.scheduler.api.forecasts import RETRY_AFTER_S, Forecasts, ForecastUnavailable
from idlegpu.scheduler.api.headers import SecurityHeaders
from idlegpu.scheduler.api.reads import Reads, add_read_routes, paused_reason
from idlegpu.scheduler.api.schema import (
    ERROR_RESPONSES,
    REQUEST_BODY,
    RequestId,
    UnitId,
    install_openapi,
    reason_body,
)
from idlegpu.scheduler.clock import Clock, as_clock
from idlegpu.scheduler.limits import SURROGATE_PROBLEM, has_surrogate
from idlegpu.scheduler.specs import SpecError, load_request_text, validate_request
from idlegpu.scheduler.types import EventKind, JobState

log = logging.getLogger("idlegpu.api")

API_VERSION = "v1"
SOURCE = "request"
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
JSON_TYPES = ("application/json",)
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): ")
_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")
LIVE = tuple(s for s in JobState if not s.is_terminal())
MAX_OFFSET = 10**9  # what a store's integers hold (SQLite's and PostgreSQL's OFFSET are int64)


def spec_error_field(message: str, source: str = SOURCE) -> str | None:
    """The field path a ``SpecError`` message names first (``steps.0.gpus``), if any."""
    rest = message.removeprefix(f"{source}: ")
    found = _FIELD.match(rest)
    return found.group(1) if found else None


def _iso(value: datetime | None, tz) -> str | None:
    """A time in an answer: ISO 8601 with the offset of the pool's zone ``tz``, as the plan
    routes and the CSV files give theirs (one rule for every time a user reads)."""
    return None if value is None else value.astimezone(tz).isoformat()


def unit_json(row: UnitRow, tz) -> dict[str, Any]:
    return {
        "id": row.id, "request_id": row.request_id, "request_name": row.request_name,
        "team": row.team, "kind": row.kind, "step": row.step, "step_index": row.step_index,
        "member": row.member, "gpus": row.gpus, "priority": row.priority,
        "checkpointable": row.checkpointable, "state": row.state.value,
        "attempts": row.attempts, "preemptions": row.preemptions,
        "work_done_s": row.work_done_s, "submitted_at": _iso(row.submitted_at, tz),
        "updated_at": _iso(row.updated_at, tz), "admitted_at": _iso(row.admitted_at, tz),
        "started_at": _iso(row.started_at, tz), "stop_by": _iso(row.stop_by, tz),
        "cancel_requested_at": _iso(row.cancel_requested_at, tz), "reason": row.reason,
        "depends_on": list(row.depends_on), "image": row.spec.image,
    }


def _body_sha256(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _reason_of(data: Any) -> str | None:
    """The ``reason`` of a cancel or pause body (parsed JSON), checked."""
    reason = data.get("reason") if isinstance(data, dict) else None
    if reason is not None and not isinstance(reason, str):
        raise ApiError(422, "reason: use a string", field="reason")
    if reason is not None and has_surrogate(reason):
        raise ApiError(422, f"reason: {SURROGATE_PROBLEM}", field="reason")
    return reason


def _error(status: int, message: str, field: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "field": field}}, status_code=status,
                        headers=headers)


def create_app(settings: Settings, store: JobStore, *,
               clock: Clock | Callable[[], datetime] | None = None,
               reviewer: Reviewer | None = None,
               forecasts: Forecasts | None = None,
               pods: PodDirectory | None = None) -> FastAPI:
    """The job API over ``store``, validating with ``settings`` (its ``admission`` rules and
    ``api`` section). ``clock`` stamps ``submitted_at`` and judges token expiry (default: the
    wall clock); ``reviewer`` answers Kubernetes TokenReviews (default, when
    ``api.token_review.enabled``: one built from ``api.token_review``); ``forecasts``: the
    forecast the plan, windows and forecast routes read (default: the daemon's, from
    Prometheus through the config, made at the first call that needs it); ``pods`` says
    which unit a research pod runs (default, with TokenReview on: the API server's pods)."""
    api = settings.api
    now = as_clock(clock)
    tz = settings.pool.tz  # every time in an answer carries the pool zone's offset
    if api.token_review.enabled and reviewer is None:
        from idlegpu.scheduler.api.tokenreview import TokenReviewer

        reviewer = TokenReviewer.from_config(api.token_review)
    if api.token_review.enabled and pods is None:
        from idlegpu.scheduler.api.tokenreview import PodUnits

        pods = PodUnits.lazily(api.token_review)
    authenticator = Authenticator(api, store, reviewer,
                                  workload_namespace=settings.cluster.namespace)

    app = FastAPI(
        title="idlegpu job API", version=API_VERSION,
        description="Submit, list and cancel research jobs on the idle GPUs of the pool.",
        docs_url=None, redoc_url=None,  # our own pages and assets (scheduler/api/docs.py)
        responses=ERROR_RESPONSES,  # every error in the one shape (scheduler/api/schema.py)
    )
    install_openapi(app)
    add_docs(app, title="idlegpu job API", enabled=api.docs)
    # every body, on every route, read under its route's limit (scheduler/api/bodies.py)
    app.add_middleware(BoundedBodies, max_body_bytes=api.max_body_bytes)
    # nosniff everywhere, a CSP on every HTML answer (scheduler/api/headers.py)
    app.add_middleware(SecurityHeaders)
    app.state.store = store
    app.state.settings = settings
    reads = Reads(settings, store, now.now, forecasts)
    app.state.reads = reads

    # -- errors: one JSON shape, one line each --------------------------------------------

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.field, exc.headers)

    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return _error(422, str(exc), spec_error_field(str(exc)))

    @app.exception_handler(UnknownJobError)
    async def _unknown(_: Request, exc: UnknownJobError) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(InvalidRequestError)
    async def _invalid(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return _error(422, str(exc))

    @app.exception_handler(QuotaExceededError)
    async def _quota(_: Request, exc: QuotaExceededError) -> JSONResponse:
        headers = ({"Retry-After": str(int(exc.retry_after_s + 0.999))}
                   if exc.retry_after_s is not None else None)
        return JSONResponse({"error": {
            "message": str(exc), "field": None,
            "quota": {"name": exc.quota, "limit": exc.limit, "used": exc.used,
                      "asked": exc.asked, "retry_after_s": exc.retry_after_s}}},
            status_code=429, headers=headers)

    @app.exception_handler(TransitionRefusedError)
    async def _refused(_: Request, exc: TransitionRefusedError) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(StoreUnavailableError)
    async def _unavailable(_: Request, exc: StoreUnavailableError) -> JSONResponse:
        return _error(503, str(exc), headers={"Retry-After": "5"})

    @app.exception_handler(ForecastUnavailable)
    async def _no_forecast(_: Request, exc: ForecastUnavailable) -> JSONResponse:
        return _error(503, str(exc), headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        log.error("job store error: %s", exc)
        return _error(500, f"job store error: {exc}")

    @app.exception_handler(RequestValidationError)
    async def _bad_parameters(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("query", "path", "header",
                                                                  "body")]
        field = ".".join(loc) or None
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return _error(422, f"{field}: {msg}" if field else msg, field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "error"
        return _error(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return _error(500, "internal error (the server logged it)")

    # -- identity ---------------------------------------------------------------------------

    app.state.console_caller = None  # set by idlegpu.scheduler.console: its session cookie

    def caller(request: Request) -> Identity:
        address = request.client.host if request.client else None
        console = app.state.console_caller
        who = console(request) if console is not None else None
        return who or authenticator.authenticate(request.headers, address, now.now())

    Caller = Annotated[Identity, Depends(caller)]

    def audit(who: Identity, action: str, target: str, at: datetime,
              **detail: Any) -> AuditEntry:
        return AuditEntry(at=at, actor=who.user, auth=who.auth, role=who.role,
                          team=who.team, action=action, target=target, address=who.address,
                          detail=detail)

    def require_change(who: Identity, what: str) -> None:
        if not who.may_change():
            raise ApiError(403, f"role {who.role} may not {what}: viewers read only")

    # -- routes -----------------------------------------------------------------------------

    @app.get("/healthz", summary="200 when the job store answers (no authentication)")
    def healthz() -> JSONResponse:
        try:
            version = store.schema_version()
        except (StoreError, StoreUnavailableError) as exc:
            log.error("health check: %s", exc)
            return _error(503, "the job store does not answer", headers={"Retry-After": "5"})
        return JSONResponse({"status": "ok", "schema_version": version})

    @app.get(f"/{API_VERSION}/whoami", summary="Who the server takes the caller for")
    def whoami(who: Caller) -> dict[str, Any]:
        return {"user": who.user, "auth": who.auth, "team": who.team, "role": who.role,
                "groups": list(who.groups), "principal": who.principal,
                "address": who.address}

    async def read_body(request: Request) -> tuple[str, bytes]:
        kind = request.headers.get("content-type", "application/json").split(";")[0]
        kind = kind.strip().lower()
        if kind not in (*JSON_TYPES, *YAML_TYPES):
            raise ApiError(415, f"Content-Type {kind!r} is not accepted; send the request as "
                                "application/json or application/yaml")
        return kind, await request.body()  # bounded by BoundedBodies

    def parse_request(kind: str, body: bytes) -> Any:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, f"{SOURCE}: the body is not UTF-8 text") from None
        if kind in YAML_TYPES:
            return load_request_text(text, settings.admission, source=SOURCE,
                                     nodes=settings.pool.nodes)
        limit = settings.admission.limits.max_request_bytes
        if len(body) > limit:  # the same bound as a request file's (YAML bodies check it too)
            raise ApiError(413, f"{SOURCE}: the request is {len(body)} bytes, over the limit "
                                f"of {limit} (admission.limits.max_request_bytes)")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, or an int too long
            where = (f" at line {exc.lineno}, column {exc.colno}"
                     if isinstance(exc, json.JSONDecodeError) else "")
            problem = (exc.msg if isinstance(exc, json.JSONDecodeError) else
                       "too deeply nested" if isinstance(exc, RecursionError) else
                       "a number too long to read")
            raise ApiError(400, f"{SOURCE}: invalid JSON{where}: {problem}") from None
        return validate_request(data, settings.admission, source=SOURCE,
                                nodes=settings.pool.nodes)

    def check_priority(request: Any, units: Sequence[Any], team: str) -> None:
        cap = api.team(team).max_priority
        if cap is None:
            return
        for unit in units:
            if unit.priority > cap:
                step = request.steps[unit.step_index] if request.steps else None
                field = (f"steps.{unit.step_index}.priority"
                         if step is not None and step.priority is not None else "priority")
                setting = f"api.teams.{team if team in api.teams else '*'}.max_priority"
                raise ApiError(422, f"{SOURCE}: {field}: priority {unit.priority} is above "
                                    f"team {team}'s cap of {cap} ({setting}); use {cap} or "
                                    "less", field=field)

    @app.post(f"/{API_VERSION}/requests", status_code=201,
              summary="Submit a job request (JSON, or YAML with Content-Type: application/yaml)",
              openapi_extra=REQUEST_BODY, responses={200: {
                  "description": "submitted before with this Idempotency-Key: that request"}})
    async def submit(request: Request, who: Caller,
                     idempotency_key: Annotated[str | None, Header()] = None) -> JSONResponse:
        require_change(who, "submit requests")
        if idempotency_key is not None and not _KEY.fullmatch(idempotency_key):
            raise ApiError(422, "Idempotency-Key: use 1 to 200 printable ASCII characters",
                           field="Idempotency-Key")
        kind, body = await read_body(request)

        def work() -> tuple[int, dict[str, Any]]:
            from idlegpu.scheduler.specs import expand_units

            job = parse_request(kind, body)
            if job.team != who.team:
                raise ApiError(403, f"{SOURCE}: team: you act for team {who.team!r}; a "
                                    f"request for team {job.team!r} is refused (the team of a "
                                    "request is the caller's)", field="team")
            units = expand_units(job)
            check_priority(job, units, who.team)
            raw = job.model_dump(mode="json")
            digest = _body_sha256(raw)
            when = now.now()
            quota, setting = api.quota(who.team, who.user)
            outcome = store.submit_from_api(
                principal=who.principal, idempotency_key=idempotency_key, body_sha256=digest,
                request_name=job.name, team=who.team, kind=job.kind, raw=raw, units=units,
                now=when, audit=audit(who, "submit", "", when, request=job.name,
                                           units=len(units),
                                           idempotency_key=idempotency_key),
                address=who.address, quota=SubmitQuota(
                    quota.live_units, quota.requests_per_hour, quota.stored_bytes, setting))
            if not outcome.created and outcome.body_sha256 != digest:
                raise ApiError(409, f"Idempotency-Key {idempotency_key!r} was used for "
                                    f"request {outcome.request_id} with a different body; "
                                    "use a new key for a new request",
                               field="Idempotency-Key")
            return (201 if outcome.created else 200), request_json(outcome.request_id)

        status, payload = await run_in_threadpool(work)
        return JSONResponse(payload, status_code=status)

    @app.post(f"/{API_VERSION}/requests/validate", openapi_extra=REQUEST_BODY,
              summary="Validate a request without storing it: the units it expands to, each "
                      "with its runtime estimate and, from tonight's plan with them queued "
                      "now, its estimated start or the reason it would wait; or the error "
                      "with its field (the same checks as submitting)")
    async def validate(request: Request, who: Caller) -> dict[str, Any]:
        require_change(who, "submit requests")
        kind, body = await read_body(request)

        def work() -> dict[str, Any]:
            from idlegpu.scheduler.specs import expand_units

            job = parse_request(kind, body)
            if job.team != who.team:
                raise ApiError(403, f"{SOURCE}: team: you act for team {who.team!r}; a "
                                    f"request for team {job.team!r} is refused", field="team")
            units = expand_units(job)
            check_priority(job, units, who.team)
            planned = reads.preview(units, who.team)  # a dry run: nothing is stored
            return {"name": job.name, "team": job.team, "kind": job.kind,
                    "plan_made_at": planned["made_at"],
                    "forecast_age_s": planned["forecast_age_s"], "units": [{
                        "step": u.step, "step_index": u.step_index, "member": u.member,
                        "gpus": u.gpus, "image": u.image, "priority": u.priority,
                        "runtime_estimate_s": u.runtime_estimate_s,
                        "checkpointable": u.checkpointable, **p}
                        for u, p in zip(units, planned["units"], strict=True)]}

        return await run_in_threadpool(work)

    def request_json(request_id: str) -> dict[str, Any]:
        row = store.request(request_id)
        units = store.request_units(request_id)
        return {"id": row.id, "name": row.name, "team": row.team, "kind": row.kind,
                "submitted_at": _iso(row.submitted_at, tz),
                "submitted_by": store.submitted_by(request_id),
                "units": [unit_json(u, tz) for u in units], "unit_ids": [u.id for u in units]}

    @app.get(f"/{API_VERSION}/requests/{{request_id}}", summary="One request and its units")
    def get_request(request_id: RequestId, who: Caller) -> dict[str, Any]:
        return request_json(request_id)

    @app.get(f"/{API_VERSION}/units", summary="The queue: units, filtered")
    def list_units(
        who: Caller,
        scope: Annotated[str, Query(pattern="^(mine|team|all)$",
                                    description="mine, team (default) or all")] = "team",
        state: Annotated[list[str] | None, Query(
            description="states to show (repeat or comma-separate); default: the live ones "
                        "(queued, admitted, running); 'all' for every state")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        wanted: tuple[JobState, ...] | None = LIVE
        if state:
            names = [s.strip() for part in state for s in part.split(",") if s.strip()]
            if "all" in names:
                wanted = None
            else:
                known = {s.value: s for s in JobState}
                unknown = [n for n in names if n not in known]
                if unknown:
                    raise ApiError(422, f"state: unknown state {unknown[0]!r}; use "
                                        f"{', '.join(known)} or all", field="state")
                wanted = tuple(known[n] for n in names)
        rows = store.find_units(
            states=wanted, team=who.team if scope == "team" else None,
            principal=who.principal if scope == "mine" else None, limit=limit)
        return {"scope": scope, "count": len(rows), "units": [unit_json(r, tz) for r in rows]}

    @app.get(f"/{API_VERSION}/units/{{unit_id}}",
             summary="One unit with its attempts, preemptions and checkpoints")
    def get_unit(unit_id: UnitId, who: Caller) -> dict[str, Any]:
        row = store.unit(unit_id)
        events = store.events(unit_id=unit_id)
        attempts = [{
            "number": a.number, "admitted_at": _iso(a.admitted_at, tz),
            "started_at": _iso(a.started_at, tz), "ended_at": _iso(a.ended_at, tz),
            "outcome": a.outcome.value if a.outcome else None, "gpus": a.gpus,
            "gpu_seconds": a.gpu_seconds, "lost_gpu_seconds": a.lost_gpu_seconds,
            "window": a.window_label, "stop_by": _iso(a.stop_by, tz),
        } for a in store.attempts(unit_id)]

        def of(kind: EventKind) -> list[dict[str, Any]]:
            return [{"at": _iso(e.at, tz), "gpus": e.gpus, "gpu_seconds": e.gpu_seconds,
                     **e.detail} for e in events if e.kind is kind]

        plan = None if row.state.is_terminal() else reads.unit_plan(row.id)
        return {**unit_json(row, tz), "spec": spec_to_json(row.spec), "attempt_history": attempts,
                "preemption_history": of(EventKind.PREEMPTED),
                "checkpoints": of(EventKind.CHECKPOINTED), "notices": of(EventKind.NOTICE),
                "workload_reports": store.workload_reports(unit_id), "plan": plan}

    def cancel(who: Identity, target: str, team: str, reason: str | None) -> dict[str, Any]:
        require_change(who, "cancel")
        if not who.may_cancel(team):
            raise ApiError(403, f"{target} belongs to team {team!r}; a {who.role} of team "
                                f"{who.team!r} may cancel only its own team's work")
        why = (reason or f"cancelled by {who.user}").strip()[:500]
        when = now.now()
        result = store.cancel_audited(target, when, audit(who, "cancel", target, when),
                                      reason=why)
        return {"target": target, "cancelled": list(result.cancelled),
                "to_stop": list(result.to_stop), "unchanged": list(result.unchanged)}

    async def cancel_reason(request: Request) -> str | None:
        body = await request.body()  # bounded by BoundedBodies
        if not body.strip():
            return None
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise ApiError(400, "the cancel body must be JSON, e.g. {\"reason\": \"...\"}"
                           ) from None
        return _reason_of(data)

    @app.post(f"/{API_VERSION}/requests/{{request_id}}/cancel",
              summary="Cancel every unit of a request", openapi_extra=reason_body(False))
    async def cancel_request(request_id: RequestId, request: Request,
                             who: Caller) -> dict[str, Any]:
        reason = await cancel_reason(request)
        team = (await run_in_threadpool(store.request, request_id)).team
        return await run_in_threadpool(cancel, who, request_id, team, reason)

    @app.post(f"/{API_VERSION}/units/{{unit_id}}/cancel",
              summary="Cancel a unit and the units depending on it",
              openapi_extra=reason_body(False))
    async def cancel_unit(unit_id: UnitId, request: Request, who: Caller) -> dict[str, Any]:
        reason = await cancel_reason(request)
        team = (await run_in_threadpool(store.unit, unit_id)).team
        return await run_in_threadpool(cancel, who, unit_id, team, reason)

    add_checkpoint_routes(app, store, authenticator, pods, now.now, f"/{API_VERSION}")

    @app.get(f"/{API_VERSION}/audit", summary="The audit log (operators)")
    def get_audit(
        who: Caller,
        since: datetime | None = None,
        team: str | None = None,
        action: str | None = None,
        actor: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET,
                                     description="skip this many of the newest")] = 0,
    ) -> dict[str, Any]:
        if who.role != OPERATOR:
            raise ApiError(403, f"role {who.role} may not read the audit log: operators only")
        if since is not None and since.tzinfo is None:
            raise ApiError(422, "since: the time has no time zone; add its offset",
                           field="since")
        entries = store.audit_log(since, limit=limit, team=team, action=action, actor=actor,
                                  offset=offset)
        return {"entries": [{
            "id": e.id, "at": _iso(e.at, tz), "actor": e.actor, "auth": e.auth, "role": e.role,
            "team": e.team, "action": e.action, "target": e.target, "address": e.address,
            "detail": dict(e.detail)} for e in entries]}

    # -- the operators' controls: pausing admission, the daemon's status -------------------

    def admission_json(state: Any) -> dict[str, Any]:
        return {"paused": state.paused, "since": reads.iso(state.since), "by": state.by,
                "reason": state.reason, "changed_at": reads.iso(state.changed_at),
                "changed_by": state.changed_by,
                "text": paused_reason(state, settings.pool.tz) or "admission is open"}

    def require_operator(who: Identity, what: str) -> None:
        if who.role != OPERATOR:
            raise ApiError(403, f"role {who.role} may not {what}: operators only")

    async def pause_reason(request: Request) -> str:
        body = await request.body()  # bounded by BoundedBodies
        try:
            data = json.loads(body) if body.strip() else {}
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise ApiError(400, "the pause body must be JSON, e.g. {\"reason\": \"node "
                                "upgrade\"}") from None
        reason = " ".join((_reason_of(data) or "").split())  # one line: it is shown in logs and pages
        if not reason:
            raise ApiError(422, "reason: a pause needs a reason (who reads the queue sees it)"
                                ", e.g. {\"reason\": \"node upgrade\"}", field="reason")
        if len(reason) > MAX_PAUSE_REASON:
            raise ApiError(422, f"reason: {len(reason)} characters, over the limit of "
                                f"{MAX_PAUSE_REASON}; shorten it", field="reason")
        return reason

    @app.get(f"/{API_VERSION}/admission", summary="Whether admission is paused for the pool")
    def get_admission(who: Caller) -> dict[str, Any]:
        return admission_json(store.admission())

    @app.post(f"/{API_VERSION}/admission/pause",
              summary="Pause admission for the pool (operators): the daemon admits nothing "
                      "until resumed; stops and the backstop go on",
              openapi_extra=reason_body(True))
    async def pause_admission(request: Request, who: Caller) -> dict[str, Any]:
        require_operator(who, "pause admission")
        reason = await pause_reason(request)
        when = now.now()
        change = await run_in_threadpool(
            store.pause_admission, when, reason,
            audit(who, "admission.pause", "pool", when))
        state = change.state
        message = ("admission paused" if change.changed else
                   f"admission was already paused by {state.by} since "
                   f"{reads.iso(state.since)}; nothing changed (resume first to pause again "
                   "with another reason)")
        return {**admission_json(state), "changed": change.changed, "message": message}

    @app.post(f"/{API_VERSION}/admission/resume",
              summary="Resume admission for the pool (operators)")
    def resume_admission(who: Caller) -> dict[str, Any]:
        require_operator(who, "resume admission")
        when = now.now()
        change = store.resume_admission(when, audit(who, "admission.resume", "pool", when))
        message = ("admission resumed" if change.changed else
                   "admission was not paused; nothing changed")
        return {**admission_json(change.state), "changed": change.changed,
                "message": message}

    @app.get(f"/{API_VERSION}/daemon",
             summary="The daemon replicas' status (operators, members): last passes and their "
                     "age, which one leads, the store")
    def get_daemon(who: Caller) -> dict[str, Any]:
        if who.role not in (OPERATOR, MEMBER):
            raise ApiError(403, f"role {who.role} may not read the daemon's status: "
                                "operators and members only")
        started = time.perf_counter()
        version = store.schema_version()
        answered_ms = (time.perf_counter() - started) * 1000
        at = now.now()

        def age(when: datetime | None) -> float | None:
            return None if when is None else round((at - when).total_seconds(), 1)

        replicas = []
        for r in store.daemon_statuses():
            limit = 3 * r.reconcile_seconds  # what the daemon's /healthz allows
            passed = max((t for t in (r.last_reconcile_at, r.last_backstop_at) if t),
                         default=None)
            newest = r.updated_at if r.role == "standby" else passed
            replicas.append({
                "identity": r.identity, "host": r.host, "pid": r.pid, "role": r.role,
                "updated_at": reads.iso(r.updated_at), "updated_age_s": age(r.updated_at),
                "reconcile_seconds": r.reconcile_seconds, "stale_after_s": limit,
                "last_reconcile_at": reads.iso(r.last_reconcile_at),
                "last_reconcile_age_s": age(r.last_reconcile_at),
                "last_backstop_at": reads.iso(r.last_backstop_at),
                "last_backstop_age_s": age(r.last_backstop_at),
                "last_pass": r.last_pass, "admitted": r.admitted, "stopped": r.stopped,
                "errors": r.errors, "forecast_made_at": reads.iso(r.forecast_made_at),
                "forecast_age_s": age(r.forecast_made_at), "signals_age_s": r.signals_age_s,
                "healthy": newest is not None and (at - newest).total_seconds() <= limit})
        leader = next((r for r in replicas if r["role"] in ("leader", "single")), None)
        return {"now": reads.iso(at), "replicas": replicas,
                "leader": leader["identity"] if leader else None,
                "healthy": bool(leader and leader["healthy"]),
                # where the store is: operators only (even redacted, it names a host)
                "store": {"location": store.location if who.role == OPERATOR else None,
                          "schema_version": version, "answers": True,
                          "answered_ms": round(answered_ms, 1)},
                "admission": admission_json(store.admission())}

    add_read_routes(app, reads, caller, f"/{API_VERSION}")
    from idlegpu.scheduler.console import add_console

    add_console(app, settings, store, authenticator, reads, now.now)
    return app
