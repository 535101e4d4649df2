"""The job API's routes (FastAPI), under ``/v1``; OpenAPI at ``/docs`` and ``/openapi.json``.

Every answer is JSON. Errors are ``{"error": {"message": "...", "field": "steps.0.gpus"}}``
with the one-line message the CLI prints for the same problem (``field`` is null when the
problem is not about one field); bad input is a 4xx, never a traceback. The caller's identity,
team and role come from ``idlegpu.scheduler.api.auth``; ``submitted_at`` is this server's clock.
"""


import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from idlegpu.scheduler.adapters.store import (
    InvalidRequestError,
    JobStore,
    QuotaExceededError,
    StoreError,
    StoreUnavailableError,
    TransitionRefusedError,
    UnknownJobError,
)
from idlegpu.scheduler.api.answers import API_VERSION, ApiContext
from idlegpu.scheduler.api.auth import Authenticator, Identity, Reviewer
from idlegpu.scheduler.api.checkpoints import PodDirectory, add_checkpoint_routes
from idlegpu.scheduler.api.forecasts import Forecasts
from idlegpu.scheduler.api.operators import operator_routes
from idlegpu.scheduler.api.reads import Reads, add_read_routes
from idlegpu.scheduler.api.requests import request_routes
from idlegpu.scheduler.api.tokenreview import PodUnits, TokenReviewer
from idlegpu.scheduler.api.units import unit_routes
from idlegpu.scheduler.clock import Clock, as_clock
from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.service.errors import ForecastUnavailable, ServiceError, failure
from idlegpu.scheduler.specs import SpecError

log = logging.getLogger("idlegpu.api")


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
        reviewer = TokenReviewer.from_config(api.token_review)
    if api.token_review.enabled and pods is None:
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

    ctx = ApiContext(settings, store, reads, now, tz, caller)
    app.include_router(request_routes(ctx))
    app.include_router(unit_routes(ctx))
    add_checkpoint_routes(app, store, authenticator, pods, now.now, f"/{API_VERSION}")

    app.include_router(operator_routes(ctx))
    add_read_routes(app, reads, caller, f"/{API_VERSION}")
    return Api(authenticator, reads, now)
