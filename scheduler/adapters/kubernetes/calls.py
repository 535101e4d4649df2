"""One call to the API server, the way every adapter of this package makes it: retried on 5xx,
429, timeouts and lost connections with exponential backoff, its JSON body returned as a dict,
its errors mapped to ``ClusterUnavailableError`` (after the retries), ``ClusterPermissionError``
(401, 403: naming the verb, the resource and the grant that is missing) and
``ClusterRejectedError`` (other 4xx, naming the fields the server objected to); 404 and a
create's 409 are the package's private ``_NotFound``/``_Conflict``. Every message is one line.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from idlegpu.scheduler.adapters.kubernetes.errors import (
    ClusterPermissionError,
    ClusterRejectedError,
    ClusterUnavailableError,
    _Conflict,
    _NotFound,
)

_RETRYABLE_STATUS = {429, 500, 502, 503, 504}


def _server_time(date_header: str | None) -> datetime:
    """The server's time from an answer's ``Date`` header (else this machine's real time), for
    a field the server's controllers compare with their own clocks (a pod condition's
    ``lastTransitionTime``), never the daemon's (possibly replayed) ``now``."""
    if date_header:
        try:
            return email.utils.parsedate_to_datetime(date_header).astimezone(UTC)
        except (TypeError, ValueError):
            pass
    return datetime.now(UTC).replace(microsecond=0)


class ApiCaller:
    """The retrying call and the error mapping (module docstring). Subclasses set the
    attributes below and ``grants``: what a 403 tells the operator to grant."""

    namespace: str | None = None
    """The namespace the calls go to, for messages (None: cluster-wide calls)."""
    retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    request_timeout_s: float = 30.0
    grants: str = ("the Role of deploy/role.yaml there (jobs.batch: get, list, create, patch, "
                   "delete; pods: get, list; pods/status: patch; services: create, delete)")
    _server_date: str | None = None  # the Date header of the last answer
    _sleep: Callable[[float], None] = staticmethod(time.sleep)

    def _where(self) -> str:
        return f"in namespace {self.namespace}" if self.namespace else "cluster-wide"

    def _call(self, verb: str, fn: Callable[..., Any], resource: str = "jobs.batch") -> Any:
        """Run one API call with retries; return its JSON body as a dict."""
        attempts = self.retries + 1
        last = ""
        for i in range(attempts):
            if i:
                self._sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (i - 1)))
            try:
                response = fn(_preload_content=False, _request_timeout=self.request_timeout_s)
                self._server_date = (getattr(response, "headers", None) or {}).get("Date")
                data = response.data
                return json.loads(data) if data else {}
            except ApiException as exc:
                if exc.status in _RETRYABLE_STATUS:
                    last = f"HTTP {exc.status} {_status_message(exc) or exc.reason or ''}".strip()
                    continue
                raise self._error(verb, exc, resource) from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                last = " ".join(f"{type(exc).__name__}: {exc}".split())
                continue
        raise ClusterUnavailableError(
            f"Kubernetes API unavailable: {verb} {resource} {self._where()} failed "
            f"after {attempts} attempt(s): {last[:300]}")

    def _list_all(self, fn: Callable[..., Any], resource: str, *, page: int = 500,
                  most: int | None = None, too_many: str = "") -> list[dict[str, Any]]:
        """Every item of a list, ``page`` a page (each call retried as ``_call``); beyond
        ``most`` items, ``ClusterUnavailableError`` saying ``too_many`` (a flood of someone
        else's objects is refused, not read into memory)."""
        return self._list_versioned(fn, resource, page=page, most=most, too_many=too_many)[0]

    def _list_versioned(self, fn: Callable[..., Any], resource: str, *, page: int = 500,
                        most: int | None = None, too_many: str = ""
                        ) -> tuple[list[dict[str, Any]], str]:
        """``_list_all``, and the list's ``resourceVersion`` (its first page's: the pages are
        one snapshot), where a watch of it starts."""
        items: list[dict[str, Any]] = []
        token = None
        version = ""
        while True:
            more: dict[str, Any] = {"_continue": token} if token else {}
            body = self._call("list", lambda more=more, **kw: fn(limit=page, **more, **kw),
                              resource)
            items.extend(i for i in body.get("items") or () if isinstance(i, dict))
            if most is not None and len(items) > most:
                raise ClusterUnavailableError(too_many or f"more than {most:,} {resource}")
            meta = body.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            if not token:
                return items, version

    def _error(self, verb: str, exc: ApiException, resource: str) -> Exception:
        message = _status_message(exc)
        if exc.status == 404:
            return _NotFound(message)
        if exc.status == 409 and verb == "create":
            return _Conflict(message)
        if exc.status == 401:
            return ClusterPermissionError(
                f"Kubernetes rejected the credentials for '{verb}' on {resource} "
                f"{self._where()} (HTTP 401): {message or exc.reason}; check the kubeconfig "
                f"user or the service account token")
        if exc.status == 403:
            return ClusterPermissionError(
                f"Kubernetes denied '{verb}' on {resource} {self._where()} "
                f"(HTTP {exc.status}): {message or exc.reason}; grant the idlegpu service "
                f"account {self.grants}")
        fields = _status_fields(exc)
        what = f" (fields: {', '.join(fields)})" if fields else ""
        return ClusterRejectedError(
            f"Kubernetes rejected '{verb}' on {resource} {self._where()} "
            f"(HTTP {exc.status}){what}: {message or exc.reason}",
            status=exc.status or 0, fields=fields)


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (ValueError, TypeError):
        return {}
    return body if isinstance(body, dict) else {}


def _status_message(exc: ApiException) -> str:
    body = _status_body(exc)
    text = body.get("message") or (exc.body.decode(errors="replace") if isinstance(
        exc.body, bytes) else str(exc.body or ""))
    return " ".join(str(text).split())[:500]


def _status_fields(exc: ApiException) -> tuple[str, ...]:
    causes = (_status_body(exc).get("details") or {}).get("causes") or []
    fields = [c.get("field") for c in causes if isinstance(c, dict) and c.get("field")]
    if not fields:  # "Job.batch "x" is invalid: spec.foo: Required value"
        fields = re.findall(r"(?:^|: |, )((?:metadata|spec)\.[\w.\[\]\"/-]+):",
                            _status_message(exc))
    return tuple(dict.fromkeys(fields))
