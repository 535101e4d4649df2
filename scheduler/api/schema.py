"""What the OpenAPI document says beyond FastAPI's defaults, so a generated client knows every
answer: the one error shape (``ErrorBody``) for every error status any route may give, request
bodies as the request models' own JSON Schema (``JobRequest``, the cancel and pause reasons),
and the identifiers in paths with their patterns."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Path
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from idlegpu.scheduler.specs import JobRequest

ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,159}$"
"""A request id (``<name slug>-<8 hex>``) or a unit id (``<request id>-<step>-<member>``)."""
MONTH_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])$"

RequestId = Annotated[str, Path(pattern=ID_PATTERN, max_length=160,
                                description="a request id, e.g. sft-a-1f2e3d4c")]
UnitId = Annotated[str, Path(pattern=ID_PATTERN, max_length=160,
                             description="a unit id, e.g. sft-a-1f2e3d4c-1-2")]
Month = Annotated[str, Path(pattern=MONTH_PATTERN, description="YYYY-MM")]


class QuotaDetail(BaseModel):
    name: str = Field(description="live_units, requests_per_hour or stored_bytes")
    limit: int
    used: int = Field(description="what the caller held before this request")
    asked: int = Field(description="what this request would add")
    retry_after_s: float | None = Field(description="when it frees (None: as units end)")


class ErrorDetail(BaseModel):
    message: str = Field(description="one line: what is wrong and what to do")
    field: str | None = Field(description="the field it is about, e.g. steps.0.gpus")
    quota: QuotaDetail | None = Field(default=None, description="429 only")


class ErrorBody(BaseModel):
    """Every error answer of the job API."""

    error: ErrorDetail


_ERRORS = {
    400: "not JSON, not UTF-8, or a malformed header",
    401: "no token, or an unknown, expired or revoked one",
    403: "the caller's role or team may not do this",
    404: "no such request, unit or report",
    409: "an Idempotency-Key reused with another body, or a transition that does not apply",
    413: "a body over its route's limit (the connection is then closed)",
    415: "a body of another content type",
    422: "validation: the field and the fix",
    429: "a quota of the caller's (see error.quota; Retry-After when it frees at a time)",
    500: "an unexpected failure (logged by the server)",
    503: "the store, the forecast or the Kubernetes API unreachable (Retry-After)",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text} for code, text in _ERRORS.items()}
"""Every route may answer these (``FastAPI(responses=...)``)."""


def _reason_schema(required: bool) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": {"reason": {
        "type": "string", "maxLength": 500, "description": "why (shown in the audit log)"}}}
    if required:
        schema["required"] = ["reason"]
    return schema


def reason_body(required: bool) -> dict[str, Any]:
    """``openapi_extra`` of a route whose body is ``{"reason": "..."}`` (JSON)."""
    return {"requestBody": {"required": required, "content": {
        "application/json": {"schema": _reason_schema(required)}}}}


REQUEST_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/JobRequest"}},
    "application/yaml": {"schema": {"type": "string", "description": "the same, as YAML"}}}}}
"""``openapi_extra`` of the submit and validate routes: the request model's JSON Schema."""


def install_openapi(app: FastAPI) -> None:
    """The app's OpenAPI document with ``JobRequest`` (and the models it uses) under
    ``components.schemas``."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version,
                                   description=app.description, routes=app.routes)
            model = JobRequest.model_json_schema(
                ref_template="#/components/schemas/{model}", mode="validation")
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(model.pop("$defs", {}))
            schemas["JobRequest"] = model
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
