"""What a refusal says, the same through every front door: ``failure(exc)`` turns any error a
service raises into a ``Failure`` (a status in HTTP's terms, which the job API answers with,
a one-line message, the field it is about, headers such as ``Retry-After``); the console
renders it on its page, the CLI prints its message."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
from typing import Any

from idlegpu.forecast.errors import PermanentError
from idlegpu.scheduler.adapters.store import (
    InvalidRequestError,
    QuotaExceededError,
    StoreError,
    StoreUnavailableError,
    TransitionRefusedError,
    UnknownJobError,
)
from idlegpu.scheduler.specs import SpecError

log = logging.getLogger("idlegpu.api")

SOURCE = "request"  # how a request's problems are prefixed ("request: steps.0.gpus: ...")
FORECAST_RETRY_AFTER_S = 30  # also how long a failed forecast is remembered before a retry
_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*): ")


class ServiceError(PermanentError):
    """A refusal: ``status`` (in HTTP's terms), one-line ``message``, the ``field`` it is
    about (if any), extra ``headers``. The CLI prints its message as any user error's."""

    def __init__(self, status: int, message: str, *, field: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


class ForecastUnavailable(Exception):
    """No fresh forecast can be made now (the history is unreadable or stale)."""


@dataclass(frozen=True)
class Failure:
    status: int
    message: str
    field: str | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """More of the error, e.g. ``quota``: the quota's name, limit, use and when it frees."""


def spec_error_field(message: str, source: str = SOURCE) -> str | None:
    """The field a spec error names (``request: steps.0.gpus: ...`` -> ``steps.0.gpus``)."""
    rest = message.removeprefix(f"{source}: ")
    match = _FIELD.match(rest)
    return match.group(1) if match else None


def failure(exc: BaseException) -> Failure | None:
    """What ``exc`` says to the caller; None for an error no caller caused (a bug: the front
    door logs it and answers an internal error)."""
    if isinstance(exc, ServiceError):
        return Failure(exc.status, exc.message, exc.field, exc.headers)
    if isinstance(exc, SpecError):
        return Failure(422, str(exc), spec_error_field(str(exc)))
    if isinstance(exc, UnknownJobError):
        return Failure(404, str(exc))
    if isinstance(exc, InvalidRequestError):
        return Failure(422, str(exc))
    if isinstance(exc, QuotaExceededError):
        headers = ({"Retry-After": str(int(exc.retry_after_s + 0.999))}
                   if exc.retry_after_s is not None else {})
        return Failure(429, str(exc), None, headers, {"quota": {
            "name": exc.quota, "limit": exc.limit, "used": exc.used, "asked": exc.asked,
            "retry_after_s": exc.retry_after_s}})
    if isinstance(exc, TransitionRefusedError):
        return Failure(409, str(exc))
    if isinstance(exc, StoreUnavailableError):
        return Failure(503, str(exc), headers={"Retry-After": "5"})
    if isinstance(exc, ForecastUnavailable):
        return Failure(503, str(exc), headers={"Retry-After": str(FORECAST_RETRY_AFTER_S)})
    if isinstance(exc, StoreError):
        log.error("job store error: %s", exc)
        return Failure(500, f"job store error: {exc}")
    return None
