"""The job API's operators' routes: the audit log, pausing and resuming admission for the
pool, the daemon replicas' status; what they do is ``idlegpu.scheduler.service.operations``'."""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations at run time,
# and `Caller` is local to the router's factory

import json
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from idlegpu.scheduler.api.answers import API_VERSION, ApiContext, iso, reason_of
from idlegpu.scheduler.api.auth import ApiError
from idlegpu.scheduler.api.schema import reason_body
from idlegpu.scheduler.service import operations
from idlegpu.scheduler.service.identity import OPERATOR, Identity

MAX_OFFSET = 10**9  # what a store's integers hold (SQLite's and PostgreSQL's OFFSET are int64)


def operator_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    store, settings, reads, tz, now = ctx.store, ctx.settings, ctx.reads, ctx.tz, ctx.clock
    Caller = Annotated[Identity, Depends(ctx.caller)]

    @router.get(f"/{API_VERSION}/audit", summary="The audit log (operators)")
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
            "id": e.id, "at": iso(e.at, tz), "actor": e.actor, "auth": e.auth, "role": e.role,
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
        return reason_of(data)

    def change_json(change: operations.AdmissionChange) -> dict[str, Any]:
        return {**operations.admission_view(change.state, tz), "changed": change.changed,
                "message": change.message}

    @router.get(f"/{API_VERSION}/admission", summary="Whether admission is paused for the pool")
    def get_admission(who: Caller) -> dict[str, Any]:
        return operations.admission_view(store.admission(), tz)

    @router.post(f"/{API_VERSION}/admission/pause",
              summary="Pause admission for the pool (operators): the daemon admits nothing "
                      "until resumed; stops and the backstop go on",
              openapi_extra=reason_body(True))
    async def pause_admission(request: Request, who: Caller) -> dict[str, Any]:
        operations.require_operator(who, "pause admission")
        reason = await pause_reason(request)
        change = await run_in_threadpool(operations.pause, store, who, reason, now.now(), tz)
        return change_json(change)

    @router.post(f"/{API_VERSION}/admission/resume",
              summary="Resume admission for the pool (operators)")
    def resume_admission(who: Caller) -> dict[str, Any]:
        return change_json(operations.resume(store, who, now.now()))

    @router.get(f"/{API_VERSION}/daemon",
             summary="The daemon replicas' status (operators, members): last passes and their "
                     "age, which one leads, the store")
    def get_daemon(who: Caller) -> dict[str, Any]:
        return operations.daemon_status(store, who, now.now(), tz)

    return router
