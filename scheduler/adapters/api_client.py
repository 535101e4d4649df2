"""The job API's client: what `idlegpu submit/queue/cancel --server URL` speak to `idlegpu serve`.

The caller's identity is a bearer token, found in this order: ``IDLEGPU_TOKEN``, a token file
(``--token-file`` or ``IDLEGPU_TOKEN_FILE``), else the current kubeconfig context's bearer
token (the server checks it with a Kubernetes TokenReview). Nothing about who the caller is
goes into the request: the server decides the team, the role and the time.

A submission always carries an ``Idempotency-Key`` (the caller's, or a fresh one), so a lost
answer is retried with the same key and can never queue the request twice. Reads and cancels
are retried too (a cancel of something already cancelled changes nothing). A 4xx answer is the
server's one-line message (``ApiRefused``); a server that stays unreachable or answers 5xx is
``ApiUnavailable``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from idlegpu.forecast.errors import PermanentError, TemporaryError

API_VERSION = "v1"
TOKEN_ENV = "IDLEGPU_TOKEN"
TOKEN_FILE_ENV = "IDLEGPU_TOKEN_FILE"
SERVER_ENV = "IDLEGPU_SERVER"
MAX_REQUEST_FILE_BYTES = 1 << 20  # the server has its own, lower limit; this spares the upload


class ApiRefused(PermanentError):
    """The server refused the call (4xx): its message, the field it names, the status."""

    def __init__(self, message: str, *, status: int, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


class ApiUnavailable(TemporaryError):
    """The server could not be reached, or failed (5xx), after the retries."""


@dataclass(frozen=True)
class Credential:
    token: str
    source: str  # where it came from, for messages (never the token itself)


def find_credential(token_file: Path | None = None, *,
                    environ: Mapping[str, str] | None = None,
                    kubeconfig: Callable[[], str | None] | None = None) -> Credential:
    """The caller's bearer token (see the module docstring); a clear error when there is none."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        return Credential(token, TOKEN_ENV)
    path = token_file or (Path(env[TOKEN_FILE_ENV]) if env.get(TOKEN_FILE_ENV) else None)
    if path is not None:
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise PermanentError(f"cannot read the token file {path}: {exc.__class__.__name__}; "
                                 "check the path and its permissions") from None
        if not token:
            raise PermanentError(f"the token file {path} is empty; put the token from "
                                 "`idlegpu token create` in it")
        return Credential(token, f"token file {path}")
    bearer = (kubeconfig or kubeconfig_bearer_token)()
    if bearer:
        return Credential(bearer, "the current kubeconfig context")
    raise PermanentError(
        f"no credentials for the job API: set {TOKEN_ENV}, pass --token-file (or set "
        f"{TOKEN_FILE_ENV}), or use a kubeconfig context with a bearer token")


def kubeconfig_bearer_token() -> str | None:
    """The bearer token of the current kubeconfig context, if it has one (a token, or an exec
    plugin that yields one); None when there is no kubeconfig or it holds client certificates."""
    from idlegpu.scheduler.adapters.kubernetes import load_client_configuration

    try:
        # $KUBECONFIG as it is now (the client library reads it once, when first imported)
        configuration = load_client_configuration(os.environ.get("KUBECONFIG") or None)
    except PermanentError:
        return None
    hook = getattr(configuration, "refresh_api_key_hook", None)
    if callable(hook):  # an exec plugin or an expiring token: the current one
        hook(configuration)
    # the client library keeps it as api_key["BearerToken"] (older releases: "authorization")
    for key in ("BearerToken", "authorization"):
        scheme, _, token = str((configuration.api_key or {}).get(key, "")).partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


class ApiClient:
    """Calls of the job API's ``/v1`` routes; answers are the decoded JSON bodies."""

    def __init__(self, server: str, credential: Credential, *, timeout_s: float = 30.0,
                 attempts: int = 3, backoff_s: float = 1.0,
                 session: requests.Session | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        server = server.strip().rstrip("/")
        if not server.startswith(("http://", "https://")):
            raise PermanentError(f"--server {server!r}: use an http:// or https:// URL, e.g. "
                                 "http://idlegpu-api.idlegpu:8080")
        self.server = server
        self.credential = credential
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.session = session or requests.Session()
        self.sleep = sleep

    # ------------------------------------------------------------------------------ routes

    def whoami(self) -> dict[str, Any]:
        return self._call("GET", "whoami")

    def submit(self, text: str, *, idempotency_key: str | None = None) -> tuple[bool, dict]:
        """Submit a request file's text; returns (created, the request with its units). Without
        a key of the caller's a fresh one is used, so a retried submission queues once."""
        key = idempotency_key or f"cli-{uuid.uuid4()}"
        answer, status = self._call("POST", "requests", data=text.encode("utf-8"),
                                    headers={"Content-Type": "application/yaml",
                                             "Idempotency-Key": key}, with_status=True)
        return status == 201, answer

    def units(self, *, scope: str = "team", states: list[str] | None = None,
              limit: int = 10_000) -> dict[str, Any]:
        params: dict[str, Any] = {"scope": scope, "limit": limit}
        if states:
            params["state"] = ",".join(states)
        return self._call("GET", "units", params=params)

    def cancel(self, target: str, *, reason: str | None = None) -> dict[str, Any]:
        """Cancel a request, or else a unit, of that id."""
        body = {"reason": reason} if reason else {}
        try:
            return self._call("POST", f"requests/{_segment(target)}/cancel", json=body)
        except ApiRefused as exc:
            if exc.status != 404:
                raise
        try:
            return self._call("POST", f"units/{_segment(target)}/cancel", json=body)
        except ApiRefused as exc:
            if exc.status != 404:
                raise
            raise ApiRefused(f"{target}: no request or unit has this id; `idlegpu queue "
                             "--server ...` lists them", status=404) from None

    def plan(self, *, hours: float = 24.0) -> dict[str, Any]:
        """Tonight's plan as the server makes it (``GET /v1/plan``)."""
        return self._call("GET", "plan", params={"hours": f"{hours:g}"})

    def windows(self, *, hours: float = 48.0, min_hours: float = 1.0,
                granularity: int = 4) -> dict[str, Any]:
        return self._call("GET", "windows", params={
            "hours": f"{hours:g}", "min_hours": f"{min_hours:g}", "granularity": granularity})

    def forecast(self, *, hours: float = 48.0) -> dict[str, Any]:
        return self._call("GET", "forecast", params={"hours": f"{hours:g}"})

    def reports(self) -> dict[str, Any]:
        return self._call("GET", "reports")

    def admission(self) -> dict[str, Any]:
        """Whether admission is paused (``GET /v1/admission``)."""
        return self._call("GET", "admission")

    def pause_admission(self, reason: str) -> dict[str, Any]:
        """Pause admission (operators); retried like a cancel: pausing twice changes nothing."""
        return self._call("POST", "admission/pause", json={"reason": reason})

    def resume_admission(self) -> dict[str, Any]:
        return self._call("POST", "admission/resume", json={})

    def daemon(self) -> dict[str, Any]:
        """The daemon replicas' status and the store (``GET /v1/daemon``)."""
        return self._call("GET", "daemon")

    # ------------------------------------------------------------------------------ plumbing

    def _call(self, method: str, route: str, *, with_status: bool = False, **kwargs: Any):
        url = f"{self.server}/{API_VERSION}/{route}"
        headers = {"Authorization": f"Bearer {self.credential.token}",
                   "Accept": "application/json", **kwargs.pop("headers", {})}
        problem = ""
        for attempt in range(self.attempts):
            if attempt:
                self.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self.session.request(method, url, headers=headers,
                                                timeout=self.timeout_s, **kwargs)
            except requests.RequestException as exc:
                problem = f"{exc.__class__.__name__}"
                continue
            if response.status_code >= 500:
                problem = f"HTTP {response.status_code}: {_message(response)}"
                continue
            if response.status_code >= 400:
                raise self._refused(response)
            try:
                answer = response.json()
            except ValueError:
                raise ApiUnavailable(f"the job API at {self.server} answered {url} with "
                                     "something that is not JSON; is --server the API's URL?"
                                     ) from None
            return (answer, response.status_code) if with_status else answer
        raise ApiUnavailable(f"the job API at {self.server} did not answer {method} /{API_VERSION}"
                             f"/{route} after {self.attempts} tries ({problem}); check the URL "
                             "and that `idlegpu serve` runs there")

    def _refused(self, response: requests.Response) -> ApiRefused:
        message, field = _message(response), None
        try:
            error = response.json().get("error") or {}
            field = error.get("field")
        except (ValueError, AttributeError):
            pass
        if response.status_code == 401:
            message += f" (credentials from {self.credential.source})"
        return ApiRefused(message, status=response.status_code, field=field)


def _message(response: requests.Response) -> str:
    try:
        error = response.json().get("error") or {}
        text = str(error.get("message") or "").strip()
    except (ValueError, AttributeError):
        text = ""
    return " ".join((text or response.reason or f"HTTP {response.status_code}").split())


def _segment(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


def read_request_text(path: Path) -> str:
    """A request file's text for the server, refused here when it is not a file or too big."""
    if not path.is_file():
        raise PermanentError(f"{path}: file not found; check the path (examples in examples/jobs/)")
    size = path.stat().st_size
    if size > MAX_REQUEST_FILE_BYTES:
        raise PermanentError(f"{path}: {size} bytes is too big for a job request (at most "
                             f"{MAX_REQUEST_FILE_BYTES}); a request is a short YAML file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PermanentError(f"{path}: not UTF-8 text; save it as UTF-8") from None


__all__ = [
    "SERVER_ENV",
    "ApiClient",
    "ApiRefused",
    "ApiUnavailable",
    "Credential",
    "find_credential",
    "kubeconfig_bearer_token",
    "read_request_text",
]
