"""``POST /v1/units/{unit_id}/checkpoint``: a research pod tells the daemon what it saved.

The answer to a checkpoint notice (``kind: checkpoint``: the daemon stops the unit within
seconds, losing nothing), a periodic checkpoint report (the unit's saved progress, which the
victim choice and the runtime estimates read) or a progress report (``kind: progress``).

Only the unit's own pod may call it, with its pod-bound service-account token (a projected
token of audience ``cluster.token_audience``; ``api.token_review`` on): TokenReview names the
pod, the API server's own record of the pod names the unit's attempt (``PodUnits``), and a
token of one unit's pod gets 403 for any other unit, as on every other route. A report for an
attempt that has ended, or after its notice closed, is recorded as late and changes nothing.
"""


import json
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal, Protocol

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from idlegpu.scheduler.adapters.store import REPORT_EVERY_S
from idlegpu.scheduler.api.auth import WORKLOAD, ApiError, Authenticator, Identity, PodRef
from idlegpu.scheduler.api.schema import UnitId
from idlegpu.scheduler.limits import SURROGATE_PROBLEM, has_surrogate

MAX_REPORT_BYTES = 4096
MAX_STEP = 2**53
MAX_PATH = 1024


class CheckpointReport(BaseModel):
    """What a workload reports (``idlegpu_checkpoint.acknowledge`` / ``report_progress``)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["checkpoint", "progress"]
    step: int = Field(ge=0, le=MAX_STEP, strict=True,
                      description="the training step saved (checkpoint) or reached (progress)")
    path: str | None = Field(default=None, max_length=MAX_PATH,
                             description="where the checkpoint was saved")
    saved_at: datetime | None = Field(default=None, description="when it was saved (RFC 3339)")
    at: datetime | None = Field(default=None, description="when the step was reached")
    attempt: int | None = Field(default=None, ge=1, le=1_000_000, strict=True,
                                description="the attempt ($IDLEGPU_ATTEMPT) it is about")

    @field_validator("path")
    @classmethod
    def _plain_text(cls, value: str | None) -> str | None:
        if value is not None and (has_surrogate(value) or "\x00" in value):
            raise ValueError(SURROGATE_PROBLEM if has_surrogate(value)
                             else "must not contain NUL characters")
        return value

    @field_validator("saved_at", "at")
    @classmethod
    def _with_zone(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.utcoffset() is None:
            raise ValueError("give the time zone, e.g. 2026-12-03T14:20:00Z")
        return value


class PodDirectory(Protocol):
    def unit_of(self, pod: PodRef) -> tuple[str, int] | None: ...


CHECKPOINT_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": CheckpointReport.model_json_schema()}}}}


def parse_report(body: bytes) -> CheckpointReport:
    """The report in ``body``, or a 4xx naming the field."""
    if len(body) > MAX_REPORT_BYTES:
        raise ApiError(413, f"a checkpoint report is at most {MAX_REPORT_BYTES} bytes")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ApiError(400, 'the body must be JSON, e.g. {"kind": "checkpoint", "step": 1200, '
                            '"path": "/ckpt/step-1200"}') from None
    if not isinstance(data, dict):
        raise ApiError(422, "the body must be a JSON object with kind and step")
    try:
        return CheckpointReport.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or None
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        if first.get("type") == "extra_forbidden":
            message = ("unknown field; a report has kind, step, path, saved_at, at and "
                       "attempt")
        raise ApiError(422, f"{field}: {message}" if field else message,
                       field=field) from None


def add_checkpoint_routes(app: FastAPI, store, authenticator: Authenticator,
                          pods: PodDirectory | None, now: Callable[[], datetime],
                          prefix: str) -> None:
    def workload_caller(request: Request) -> Identity:
        address = request.client.host if request.client else None
        return authenticator.authenticate(request.headers, address, now(), workload=True)

    Workload = Annotated[Identity, Depends(workload_caller)]

    @app.post(f"{prefix}/units/{{unit_id}}/checkpoint",
              summary="The unit's own pod reports a checkpoint (the answer to a checkpoint "
                      "notice) or its progress", openapi_extra=CHECKPOINT_BODY)
    async def report_checkpoint(unit_id: UnitId, request: Request,
                                who: Workload) -> dict[str, Any]:
        if who.role != WORKLOAD or who.pod is None:
            raise ApiError(403, "only the unit's own pod reports its checkpoints, with its "
                                "pod-bound token (the file $IDLEGPU_TOKEN_FILE)")
        if pods is None:
            raise ApiError(503, "this server cannot look up pods (api.token_review is off)")
        found = await run_in_threadpool(pods.unit_of, who.pod)
        if found is None:
            raise ApiError(403, f"pod {who.pod.namespace}/{who.pod.name} is not a research pod "
                                "of idlegpu (or is gone)")
        own, attempt = found
        if own != unit_id:
            raise ApiError(403, f"this token is pod {who.pod.name}'s, of unit {own}; it may "
                                f"report for unit {own} only")
        report = parse_report(await request.body())
        if report.attempt is not None and report.attempt != attempt:
            raise ApiError(422, f"attempt: this pod runs attempt {attempt}, not "
                                f"{report.attempt}", field="attempt")
        when = report.saved_at if report.kind == "checkpoint" else report.at
        result = await run_in_threadpool(
            store.workload_report, unit_id, now(), kind=report.kind, step=report.step,
            attempt=attempt, path=report.path, at=when)
        if result.retry_after_s is not None:
            raise ApiError(429, f"reports of one attempt come at most every "
                                f"{REPORT_EVERY_S:g} s; this one was not recorded",
                           headers={"Retry-After": str(max(1, round(result.retry_after_s)))})
        return {"unit": unit_id, "attempt": attempt, "kind": report.kind,
                "recorded": result.recorded, "late": result.late,
                "stop": "within seconds" if result.answered_notice else None}
