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
from typing import Any, Self

from idlegpu.scheduler.adapters.kubernetes import (
    ANN_UNIT_ID,
    JOB_NAME_LABEL,
    LABEL_ATTEMPT,
    MANAGED_BY,
    MANAGER,
    job_name,
    load_client_configuration,
)
from idlegpu.scheduler.api.auth import SERVICE_ACCOUNT_PREFIX, ApiError, PodRef
from idlegpu.scheduler.config import TokenReviewConfig

log = logging.getLogger("idlegpu.api")

_MAX_CACHED = 10_000
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


class Review(tuple):
    """``(authenticated, username, groups)`` and ``pod``: the pod a bound service-account
    token belongs to (its namespace from the username), else None."""

    pod: PodRef | None

    def __new__(cls, authenticated: bool, user: str, groups: tuple[str, ...],
                pod: PodRef | None = None) -> Self:
        answer = super().__new__(cls, (authenticated, user, groups))
        answer.pod = pod
        return answer


def _pod_of(user: str, extra: dict[str, Any] | None) -> PodRef | None:
    def one(key: str) -> str | None:
        values = (extra or {}).get(key) or []
        return values[0] if len(values) == 1 and isinstance(values[0], str) else None

    name, uid = one(POD_NAME_EXTRA), one(POD_UID_EXTRA)
    parts = user.removeprefix(SERVICE_ACCOUNT_PREFIX).split(":") if user.startswith(
        SERVICE_ACCOUNT_PREFIX) else []
    if not name or not uid or len(parts) != 2 or not parts[0]:
        return None
    return PodRef(namespace=parts[0], name=name, uid=uid)


class TokenReviewer:
    """``review(token) -> (authenticated, username, groups)`` against a real API server."""

    def __init__(self, api_client: Any, *, audiences: list[str] | None = None,
                 cache_seconds: float = 10.0, timeout_seconds: float = 5.0) -> None:
        from kubernetes import client

        self._api = client.AuthenticationV1Api(api_client)
        self._audiences = list(audiences or [])
        self._ttl = float(cache_seconds)
        self._timeout = float(timeout_seconds)
        self._cache: dict[str, tuple[float, Review]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: TokenReviewConfig) -> TokenReviewer:
        import kubernetes

        configuration = load_client_configuration(config.kubeconfig, config.context,
                                                  config.in_cluster)
        return cls(kubernetes.client.ApiClient(configuration), audiences=config.audiences,
                   cache_seconds=config.cache_seconds, timeout_seconds=config.timeout_seconds)

    def review(self, token: str) -> Review:
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

    def _ask(self, token: str) -> Review:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        spec: dict[str, Any] = {"token": token}
        if self._audiences:
            spec["audiences"] = self._audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        try:
            review = self._api.create_token_review(
                body,  # type: ignore[arg-type]  # validate_call takes the plain dict too
                _request_timeout=self._timeout)
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
            return Review(False, "", ())
        if self._audiences and not set(self._audiences) & set(status.audiences or []):
            return Review(False, "", ())
        user = status.user.username or ""
        return Review(True, user, tuple(status.user.groups or ()),
                      _pod_of(user, status.user.extra))


class PodUnits:
    """Which unit's attempt a research pod runs, read from the API server (``get`` on pods
    in the jobs' namespace): the pod must still be the one the token is bound to (its uid),
    be one of idlegpu's (its labels), and belong to the Job that the unit's attempt is named
    by, so a pod cannot speak for another unit whatever its annotations say. Answers are
    kept ``cache_seconds`` per pod uid."""

    def __init__(self, api_client: Any, *, cache_seconds: float = 30.0,
                 timeout_seconds: float = 5.0) -> None:
        from kubernetes import client

        self._api = client.CoreV1Api(api_client)
        self._ttl = float(cache_seconds)
        self._timeout = float(timeout_seconds)
        self._cache: dict[str, tuple[float, tuple[str, int] | None]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: TokenReviewConfig) -> PodUnits:
        import kubernetes

        configuration = load_client_configuration(config.kubeconfig, config.context,
                                                  config.in_cluster)
        return cls(kubernetes.client.ApiClient(configuration),
                   timeout_seconds=config.timeout_seconds)

    @classmethod
    def lazily(cls, config: TokenReviewConfig) -> _LazyPodUnits:
        """``from_config`` at the first look-up (a server that never gets a pod's report
        needs no credentials to read pods)."""
        return _LazyPodUnits(config)

    def unit_of(self, pod: PodRef) -> tuple[str, int] | None:
        """``(unit id, attempt)`` of the pod, or None when it is not a research pod of ours
        (or no longer exists)."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(pod.uid)
            if hit is not None and hit[0] > now:
                return hit[1]
        answer = self._look_up(pod)
        with self._lock:
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
            self._cache[pod.uid] = (now + self._ttl, answer)
        return answer

    def _look_up(self, pod: PodRef) -> tuple[str, int] | None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            found = self._api.read_namespaced_pod(pod.name, pod.namespace,
                                                  _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            log.error("cannot read pod %s/%s: %s %s", pod.namespace, pod.name, exc.status,
                      exc.reason)
            hint = " (the API's credentials need get on pods in the jobs' namespace)" \
                if exc.status == 403 else ""
            raise ApiError(503, f"cannot read the caller's pod from the Kubernetes API server: "
                                f"{exc.status} {exc.reason}{hint}",
                           headers={"Retry-After": "5"}) from None
        except (HTTPError, OSError) as exc:
            log.error("reading pod %s/%s failed: %s", pod.namespace, pod.name, exc)
            raise ApiError(503, "cannot reach the Kubernetes API server to read the caller's "
                                "pod; retry later", headers={"Retry-After": "5"}) from None
        meta = found.metadata
        assert meta is not None  # the API server sends every object with its metadata
        labels, annotations = meta.labels or {}, meta.annotations or {}
        if meta.uid != pod.uid or labels.get(MANAGED_BY) != MANAGER:
            return None
        unit_id = annotations.get(ANN_UNIT_ID)
        try:
            attempt = int(labels.get(LABEL_ATTEMPT, ""))
        except ValueError:
            return None
        if not unit_id or labels.get(JOB_NAME_LABEL) != job_name(unit_id, attempt):
            return None
        return unit_id, attempt


class _LazyPodUnits:
    def __init__(self, config: TokenReviewConfig) -> None:
        self._config = config
        self._pods: PodUnits | None = None
        self._lock = threading.Lock()

    def unit_of(self, pod: PodRef) -> tuple[str, int] | None:
        with self._lock:
            if self._pods is None:
                self._pods = PodUnits.from_config(self._config)
        return self._pods.unit_of(pod)
