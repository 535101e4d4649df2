"""The job API's units: the queue (filtered by scope and state), one unit with its attempts,
preemptions, checkpoints and plan, cancelling one (and what depends on it)."""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations at run time,
# and `Caller` is local to the router's factory

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from idlegpu.scheduler.adapters.store import spec_to_json
from idlegpu.scheduler.api.answers import (
    API_VERSION,
    ApiContext,
    cancel_json,
    cancel_reason,
    external_json,
    iso,
    unit_json,
)
from idlegpu.scheduler.api.auth import ApiError
from idlegpu.scheduler.api.schema import UnitId, reason_body
from idlegpu.scheduler.service.identity import Identity
from idlegpu.scheduler.types import EventKind, JobState

LIVE = tuple(s for s in JobState if not s.is_terminal())


def unit_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    store, settings, reads, tz, now = ctx.store, ctx.settings, ctx.reads, ctx.tz, ctx.clock
    Caller = Annotated[Identity, Depends(ctx.caller)]

    @router.get(f"/{API_VERSION}/units", summary="The queue: units, filtered")
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
        # Kueue's Workloads and users' own Jobs: submitted by nobody here ("mine" has none),
        # seen by the team they belong to
        external = [] if scope == "mine" else [
            u for u in store.external_units()
            if (scope == "all" or u.team == who.team)
            and (wanted is None or u.state != "ended")][:limit]
        return {"scope": scope, "count": len(rows), "units": [unit_json(r, tz) for r in rows],
                "external": [external_json(u, tz) for u in external]}

    @router.get(f"/{API_VERSION}/units/{{unit_id}}",
             summary="One unit with its attempts, preemptions and checkpoints")
    def get_unit(unit_id: UnitId, who: Caller) -> dict[str, Any]:
        row = store.unit(unit_id)
        events = store.events(unit_id=unit_id)
        attempts = [{
            "number": a.number, "admitted_at": iso(a.admitted_at, tz),
            "started_at": iso(a.started_at, tz), "ended_at": iso(a.ended_at, tz),
            "outcome": a.outcome.value if a.outcome else None, "gpus": a.gpus,
            "gpu_seconds": a.gpu_seconds, "lost_gpu_seconds": a.lost_gpu_seconds,
            "window": a.window_label, "stop_by": iso(a.stop_by, tz),
        } for a in store.attempts(unit_id)]

        def of(kind: EventKind) -> list[dict[str, Any]]:
            return [{"at": iso(e.at, tz), "gpus": e.gpus, "gpu_seconds": e.gpu_seconds,
                     **e.detail} for e in events if e.kind is kind]

        plan = None if row.state.is_terminal() else reads.unit_plan(row.id)
        return {**unit_json(row, tz), "spec": spec_to_json(row.spec), "attempt_history": attempts,
                "preemption_history": of(EventKind.PREEMPTED),
                "checkpoints": of(EventKind.CHECKPOINTED), "notices": of(EventKind.NOTICE),
                "workload_reports": store.workload_reports(unit_id), "plan": plan}

    @router.post(f"/{API_VERSION}/units/{{unit_id}}/cancel",
              summary="Cancel a unit and the units depending on it",
              openapi_extra=reason_body(False))
    async def cancel_unit(unit_id: UnitId, request: Request, who: Caller) -> dict[str, Any]:
        reason = await cancel_reason(request)
        return await run_in_threadpool(cancel_json, ctx, who, unit_id, "unit", reason)

    return router
