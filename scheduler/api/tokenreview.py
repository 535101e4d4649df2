"""Kubernetes TokenReview for the job API: the API server says whose a bearer token is.

The only module of ``idlegpu.scheduler.api`` that imports ``kubernetes``. The credentials it
runs with need ``create`` on ``tokenreviews.authentication.k8s.io`` (deploy/: the ClusterRole
``idlegpu-api-tokenreview``). Answers are kept ``cache_seconds`` per token (by its SHA-256),
so a client's burst of calls costs the API server one review; forged tokens are cached too.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

from idlegpu.forecast.config import TokenReviewConfig
from idlegpu.scheduler.api.auth import ApiError

log = logging.getLogger("idlegpu.api")

_MAX_CACHED = 10_000


class TokenReviewer:
    """``review(token) -> (authenticated, username, groups)`` against a real API server."""

    def __init__(self, api_client: Any, *, audiences: list[str] | None = None,
                 cache_seconds: float = 10.0, timeout_seconds: float = 5.0) -> None:
        from kubernetes import client

        self._api = client.AuthenticationV1Api(api_client)
        self._audiences = list(audiences or [])
        self._ttl = float(cache_seconds)
        self._timeout = float(timeout_seconds)
        self._cache: dict[str, tuple[float, tuple[bool, str, tuple[str, ...]]]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: TokenReviewConfig) -> TokenReviewer:
        import kubernetes

        from idlegpu.scheduler.adapters.kubernetes import load_client_configuration

        configuration = load_client_configuration(config.kubeconfig, config.context,
                                                  config.in_cluster)
        return cls(kubernetes.client.ApiClient(configuration), audiences=config.audiences,
                   cache_seconds=config.cache_seconds, timeout_seconds=config.timeout_seconds)

    def review(self, token: str) -> tuple[bool, str, tuple[str, ...]]:
        key = hashlib.sha256(token.encode("utf-8")).hexdigest()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        answer = self._ask(token)
        if self._ttl > 0:
            with self._lock:
                if len(self._cache) >= _MAX_CACHED:
                    self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                    if len(self._cache) >= _MAX_CACHED:
                        self._cache.clear()
                self._cache[key] = (now + self._ttl, answer)
        return answer

    def _ask(self, token: str) -> tuple[bool, str, tuple[str, ...]]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        spec: dict[str, Any] = {"token": token}
        if self._audiences:
            spec["audiences"] = self._audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        try:
            review = self._api.create_token_review(body, _request_timeout=self._timeout)
        except ApiException as exc:
            log.error("TokenReview refused: %s %s", exc.status, exc.reason)
            hint = " (the API's credentials need create on tokenreviews)" if exc.status == 403 \
                else ""
            raise ApiError(503, f"cannot check the token with the Kubernetes API server: "
                                f"{exc.status} {exc.reason}{hint}",
                           headers={"Retry-After": "5"}) from None
        except (HTTPError, OSError) as exc:
            log.error("TokenReview failed: %s", exc)
            raise ApiError(503, "cannot reach the Kubernetes API server to check the token; "
                                "retry later", headers={"Retry-After": "5"}) from None
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return (False, "", ())
        if self._audiences and not set(self._audiences) & set(status.audiences or []):
            return (False, "", ())
        return (True, status.user.username or "", tuple(status.user.groups or ()))
