"""The job API's requests: submit (JSON or YAML), validate without storing, read one, cancel
one; what they do is ``idlegpu.scheduler.service.submissions``'."""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations at run time,
# and `Caller` is local to the router's factory

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from idlegpu.scheduler.api.answers import (
    API_VERSION,
    ApiContext,
    cancel_json,
    cancel_reason,
    iso,
    read_body,
    unit_json,
)
from idlegpu.scheduler.api.auth import ApiError
from idlegpu.scheduler.api.schema import REQUEST_BODY, RequestId, reason_body
from idlegpu.scheduler.service import submissions
from idlegpu.scheduler.service.identity import Identity

_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")


def request_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    store, settings, reads, tz, now = ctx.store, ctx.settings, ctx.reads, ctx.tz, ctx.clock
    Caller = Annotated[Identity, Depends(ctx.caller)]

    @router.post(f"/{API_VERSION}/requests", status_code=201,
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

    @router.post(f"/{API_VERSION}/requests/validate", openapi_extra=REQUEST_BODY,
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
                "submitted_at": iso(row.submitted_at, tz),
                "submitted_by": store.submitted_by(request_id),
                "units": [unit_json(u, tz) for u in units], "unit_ids": [u.id for u in units]}

    @router.get(f"/{API_VERSION}/requests/{{request_id}}", summary="One request and its units")
    def get_request(request_id: RequestId, who: Caller) -> dict[str, Any]:
        return request_json(request_id)

    @router.post(f"/{API_VERSION}/requests/{{request_id}}/cancel",
              summary="Cancel every unit of a request", openapi_extra=reason_body(False))
    async def cancel_request(request_id: RequestId, request: Request,
                             who: Caller) -> dict[str, Any]:
        reason = await cancel_reason(request)
        return await run_in_threadpool(cancel_json, ctx, who, request_id, "request", reason)

    return router
