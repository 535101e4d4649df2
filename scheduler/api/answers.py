"""What the job API's routers share: the context they are built with (``ApiContext``), the
JSON shapes of a unit and of times, and the reading of a cancel or pause body."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

from fastapi import Request

from idlegpu.scheduler.adapters.store import JobStore, UnitRow
from idlegpu.scheduler.api.auth import ApiError
from idlegpu.scheduler.api.reads import Reads
from idlegpu.scheduler.clock import Clock
from idlegpu.scheduler.config import Settings
from idlegpu.scheduler.limits import SURROGATE_PROBLEM, has_surrogate
from idlegpu.scheduler.service import submissions
from idlegpu.scheduler.service.identity import Identity

API_VERSION = "v1"


@dataclass(frozen=True)
class ApiContext:
    """What every router of the job API reads: the settings, the store, the plan and forecast
    reads, the clock, the pool's zone (every time in an answer carries its offset) and the
    dependency that says who calls."""

    settings: Settings
    store: JobStore
    reads: Reads
    clock: Clock
    tz: tzinfo
    caller: Callable[[Request], Identity]


def iso(value: datetime | None, tz: tzinfo) -> str | None:
    """A time in an answer: ISO 8601 with the offset of the pool's zone ``tz``, as the plan
    routes and the CSV files give theirs (one rule for every time a user reads)."""
    return None if value is None else value.astimezone(tz).isoformat()


def unit_json(row: UnitRow, tz: tzinfo) -> dict[str, Any]:
    return {
        "id": row.id, "request_id": row.request_id, "request_name": row.request_name,
        "team": row.team, "kind": row.kind, "step": row.step, "step_index": row.step_index,
        "member": row.member, "gpus": row.gpus, "priority": row.priority,
        "checkpointable": row.checkpointable, "state": row.state.value,
        "attempts": row.attempts, "preemptions": row.preemptions,
        "work_done_s": row.work_done_s, "submitted_at": iso(row.submitted_at, tz),
        "updated_at": iso(row.updated_at, tz), "admitted_at": iso(row.admitted_at, tz),
        "started_at": iso(row.started_at, tz), "stop_by": iso(row.stop_by, tz),
        "cancel_requested_at": iso(row.cancel_requested_at, tz), "reason": row.reason,
        "depends_on": list(row.depends_on), "image": row.spec.image,
    }


def reason_of(data: Any) -> str | None:
    """The ``reason`` of a cancel or pause body (parsed JSON), checked."""
    reason = data.get("reason") if isinstance(data, dict) else None
    if reason is not None and not isinstance(reason, str):
        raise ApiError(422, "reason: use a string", field="reason")
    if reason is not None and has_surrogate(reason):
        raise ApiError(422, f"reason: {SURROGATE_PROBLEM}", field="reason")
    return reason


async def read_body(request: Request) -> tuple[str, bytes]:
    """A request body's media type and bytes (bounded by ``web.bodies.BoundedBodies``)."""
    kind = submissions.content_kind(request.headers.get("content-type"))
    return kind, await request.body()


async def cancel_reason(request: Request) -> str | None:
    body = await request.body()  # bounded by BoundedBodies
    if not body.strip():
        return None
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ApiError(400, "the cancel body must be JSON, e.g. {\"reason\": \"...\"}"
                       ) from None
    return reason_of(data)


def cancel_json(ctx: ApiContext, who: Identity, target: str, kind: str,
                reason: str | None) -> dict[str, Any]:
    result = submissions.cancel(ctx.store, who, target, ctx.clock.now(), reason, kind=kind)
    return {"target": target, "cancelled": list(result.cancelled),
            "to_stop": list(result.to_stop), "unchanged": list(result.unchanged)}


def external_json(unit: Any, tz: Any) -> dict[str, Any]:
    """A unit outside the store (a Kueue Workload, a user's Job) as the queue shows it."""
    return {"id": unit.id, "origin": "kueue-workload" if unit.origin == "kueue" else "job",
            "namespace": unit.namespace, "name": unit.name, "team": unit.team,
            "gpus": unit.gpus, "state": unit.state, "reason": unit.reason,
            "estimated_start": iso(unit.start_at, tz), "stop_by": iso(unit.stop_by, tz),
            "since": iso(unit.since, tz)}
