"""The job API's routes (FastAPI), under ``/v1``; OpenAPI at ``/docs`` and ``/openapi.json``.

Every answer is JSON. Errors are ``{"error": {"message": "...", "field": "steps.0.gpus"}}``
with the one-line message the CLI prints for the same problem (``field`` is null when the
problem is not about one field); bad input is a 4xx, never a traceback. The caller's identity,
team and role come from ``idlegpu.scheduler.api.auth``; ``submitted_at`` is this server's clock.
"""


import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from idlegpu.forecast.config import Settings
from idlegpu.scheduler.adapters.store import (
    InvalidRequestError,
    JobStore,
    QuotaExceededError,
    StoreError,
    StoreUnavailableError,
    TransitionRefusedError,
    UnitRow,
    UnknownJobError,
    spec_to_json,
)
from idlegpu.scheduler.api.auth import OPERATOR, ApiError, Authenticator, Identity, Reviewer
from idlegpu.scheduler.api.checkpoints import PodDirectory, add_checkpoint_routes
from idlegpu.scheduler.api.forecasts import Forecasts
from idlegpu.scheduler.api.reads import Reads, add_read_routes
from idlegpu.scheduler.api.schema import REQUEST_BODY, RequestId, UnitId, reason_body
from idlegpu.scheduler.clock import Clock, as_clock
from idlegpu.scheduler.limits import SURROGATE_PROBLEM, has_surrogate
from idlegpu.scheduler.service import operations, submissions
from idlegpu.scheduler.service.errors import ForecastUnavailable, ServiceError, failure
from idlegpu.scheduler.specs import SpecError
from idlegpu.scheduler.types import EventKind, JobState

log = logging.getLogger("idlegpu.api")

API_VERSION = "v1"
_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")
LIVE = tuple(s for s in JobState if not s.is_terminal())
MAX_OFFSET = 10**9  # what a store's integers hold (SQLite's and PostgreSQL's OFFSET are int64)


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


@dataclass(frozen=True)
class Api:
    """What the job API's routes were built with, for what sits beside them (the console)."""

    authenticator: Authenticator
    reads: Reads
    clock: Clock


def add_api(app: FastAPI, settings: Settings, store: JobStore, *,
            clock: Clock | Callable[[], datetime] | None = None,
            reviewer: Reviewer | None = None,
            forecasts: Forecasts | None = None,
            pods: PodDirectory | None = None) -> Api:
    """The job API's routes on ``app`` (``idlegpu.scheduler.server`` makes it), over
    ``store``, validating with ``settings`` (its ``admission`` rules and ``api`` section),
    with its error answers and the identity of its callers. ``clock`` stamps ``submitted_at`` and judges token expiry (default: the
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

    app.state.store = store
    app.state.settings = settings
    reads = Reads(settings, store, now.now, forecasts)
    app.state.reads = reads

    # -- errors: one JSON shape, one line each --------------------------------------------

    async def _refusal(_: Request, exc: Exception) -> JSONResponse:
        said = failure(exc)
        if said is None:  # not a refusal: an internal error
            raise exc
        body: dict[str, Any] = {"message": said.message, "field": said.field, **said.extra}
        return JSONResponse({"error": body}, status_code=said.status,
                            headers=said.headers or None)

    for refusal in (ServiceError, SpecError, UnknownJobError, InvalidRequestError,
                    QuotaExceededError, TransitionRefusedError, StoreUnavailableError,
                    ForecastUnavailable, StoreError):
        app.add_exception_handler(refusal, _refusal)

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
        kind = submissions.content_kind(request.headers.get("content-type"))
        return kind, await request.body()  # bounded by BoundedBodies

    @app.post(f"/{API_VERSION}/requests", status_code=201,
              summary="Submit a job request (JSON, or YAML with Content-Type: application/yaml)",
              openapi_extra=REQUEST_BODY, responses={200: {
                  "description": "submitted before with this Idempotency-Key: that request"}})
    async def submit(request: Request, who: Caller,
                     idempotency_key: Annotated[str | None, Header()] = None) -> JSONResponse:
        submissions.require_change(who, "submit requests")
        if idempotency_key is not None and not _KEY.fullmatch(idempotency_key):
            raise ApiError(422, "Idempotency-Key: use 1 to 200 printable ASCII characters",
                           field="Idempotency-Key")
        kind, body = await read_body(request)

        def work() -> tuple[int, dict[str, Any]]:
            job = submissions.parse_body(kind, body, settings)
            done = submissions.submit(store, settings, who, job, now.now(),
                                   idempotency_key=idempotency_key)
            return (201 if done.created else 200), request_json(done.request_id)

        status, payload = await run_in_threadpool(work)
        return JSONResponse(payload, status_code=status)

    @app.post(f"/{API_VERSION}/requests/validate", openapi_extra=REQUEST_BODY,
              summary="Validate a request without storing it: the units it expands to, each "
                      "with its runtime estimate and, from tonight's plan with them queued "
                      "now, its estimated start or the reason it would wait; or the error "
                      "with its field (the same checks as submitting)")
    async def validate(request: Request, who: Caller) -> dict[str, Any]:
        submissions.require_change(who, "submit requests")
        kind, body = await read_body(request)

        def work() -> dict[str, Any]:
            job = submissions.parse_body(kind, body, settings)
            return submissions.validate(settings, who, job, reads.preview)

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

    def cancel(who: Identity, target: str, kind: str, reason: str | None) -> dict[str, Any]:
        result = submissions.cancel(store, who, target, now.now(), reason, kind=kind)
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
        return await run_in_threadpool(cancel, who, request_id, "request", reason)

    @app.post(f"/{API_VERSION}/units/{{unit_id}}/cancel",
              summary="Cancel a unit and the units depending on it",
              openapi_extra=reason_body(False))
    async def cancel_unit(unit_id: UnitId, request: Request, who: Caller) -> dict[str, Any]:
        reason = await cancel_reason(request)
        return await run_in_threadpool(cancel, who, unit_id, "unit", reason)

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

    async def pause_reason(request: Request) -> str | None:
        body = await request.body()  # bounded by BoundedBodies
        try:
            data = json.loads(body) if body.strip() else {}
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise ApiError(400, "the pause body must be JSON, e.g. {\"reason\": \"node "
                                "upgrade\"}") from None
        return _reason_of(data)

    def change_json(change: operations.AdmissionChange) -> dict[str, Any]:
        return {**operations.admission_view(change.state, tz), "changed": change.changed,
                "message": change.message}

    @app.get(f"/{API_VERSION}/admission", summary="Whether admission is paused for the pool")
    def get_admission(who: Caller) -> dict[str, Any]:
        return operations.admission_view(store.admission(), tz)

    @app.post(f"/{API_VERSION}/admission/pause",
              summary="Pause admission for the pool (operators): the daemon admits nothing "
                      "until resumed; stops and the backstop go on",
              openapi_extra=reason_body(True))
    async def pause_admission(request: Request, who: Caller) -> dict[str, Any]:
        operations.require_operator(who, "pause admission")
        reason = await pause_reason(request)
        change = await run_in_threadpool(operations.pause, store, who, reason, now.now(), tz)
        return change_json(change)

    @app.post(f"/{API_VERSION}/admission/resume",
              summary="Resume admission for the pool (operators)")
    def resume_admission(who: Caller) -> dict[str, Any]:
        return change_json(operations.resume(store, who, now.now()))

    @app.get(f"/{API_VERSION}/daemon",
             summary="The daemon replicas' status (operators, members): last passes and their "
                     "age, which one leads, the store")
    def get_daemon(who: Caller) -> dict[str, Any]:
        return operations.daemon_status(store, who, now.now(), tz)

    add_read_routes(app, reads, caller, f"/{API_VERSION}")
    return Api(authenticator, reads, now)
