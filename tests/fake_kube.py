"""A small stateful fake of the Kubernetes API server's ``batch/v1`` Jobs, over real HTTP.

    with FakeKube() as kube:
        client = kube.api_client()          # kubernetes.client.ApiClient pointed at it
        ... KubernetesCluster(client, namespace="research", ...) ...
        kube.set_status("idlegpu-x-a1", {"active": 1, "ready": 1})
        kube.fail_next(2, 503)              # the next 2 requests answer 503
        kube.forbid("create")               # create answers 403 from now on
        kube.on_next("POST", kill_client)   # a crash of the client mid-request (see on_next)
        kube.requests                       # every request: Request(method, path, query, body)

Serves an always empty pod list (``/api/v1/namespaces/{ns}/pods``) and
``/apis/batch/v1/namespaces/{ns}/jobs`` (GET list with ``labelSelector`` equality,
inequality and existence terms, POST create with 409 on an existing name and 422 on missing
required fields) and ``/apis/batch/v1/namespaces/{ns}/jobs/{name}`` (GET, PATCH with JSON merge
patch, DELETE), filling ``metadata.uid``, ``resourceVersion`` (one counter, bumped by every
write) and ``creationTimestamp``. Errors are ``Status`` objects shaped like the real ones.

There is no Job controller, except one step: setting ``spec.suspend`` to true marks the Job
``Suspended`` with no active pods, as the controller does once the pods are gone. Everything else
in ``status`` comes from ``set_status``.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import kubernetes

_JOBS = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?$")
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str | None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif " in " in term or " notin " in term:
            raise ValueError(f"set-based selector not supported by the fake: {term}")
        elif term not in labels:
            return False
    return True


class FakeKube:
    """The fake API server; a context manager that starts and stops it on a free port."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[Request] = []
        self._lock = threading.RLock()
        self._rv = itertools.count(1000)
        self._failures: list[int | str] = []
        self._forbidden: set[str] = set()
        self._hooks: dict[str, tuple[Callable[[Request], None], bool]] = {}
        self.timeout_s = 2.0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- life -----------------------------------------------------------------------------

    def start(self) -> Self:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

            def do_PATCH(self) -> None:
                fake._handle(self, "PATCH")

            def do_DELETE(self) -> None:
                fake._handle(self, "DELETE")

            def do_PUT(self) -> None:
                fake._handle(self, "PUT")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def write_kubeconfig(self, path: Any, namespace: str = "default") -> Any:
        """A kubeconfig file pointing at the fake (context ``fake``, a token user)."""
        path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {{server: "{self.url}"}}
users:
- name: me
  user: {{token: "t0ken"}}
contexts:
- name: fake
  context: {{cluster: fake, user: me, namespace: {namespace}}}
current-context: fake
""")
        return path

    def api_client(self, *, retries: int | bool = False) -> kubernetes.client.ApiClient:
        """A client pointed at the fake. urllib3's own retries are off by default, so every
        attempt the adapter makes is one request here."""
        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        configuration.retries = retries
        return kubernetes.client.ApiClient(configuration)

    # --- test hooks -----------------------------------------------------------------------

    def set_status(self, name: str, status: dict[str, Any], *,
                   namespace: str | None = None) -> None:
        """Replace a Job's ``status`` (what the Job controller would write)."""
        with self._lock:
            key = self._find(name, namespace)
            self.jobs[key]["status"] = copy.deepcopy(status)
            self.jobs[key]["metadata"]["resourceVersion"] = str(next(self._rv))

    def add_job(self, manifest: dict[str, Any], *, namespace: str = "default") -> dict:
        """Store a Job directly (someone else's, say), skipping validation and the hooks."""
        with self._lock:
            job = copy.deepcopy(manifest)
            ns = job.setdefault("metadata", {}).setdefault("namespace", namespace)
            self._fill(job)
            self.jobs[(ns, job["metadata"]["name"])] = job
            return copy.deepcopy(job)

    def fail_next(self, n: int, code: int | str = 503) -> None:
        """The next ``n`` requests fail: an HTTP status code, ``"timeout"`` (no answer for
        ``timeout_s``, then the connection closes), ``"drop"`` (connection closed before the
        request is served) or ``"lost"`` (served, then closed before the answer)."""
        with self._lock:
            self._failures.extend([code] * n)

    def on_next(self, method: str, callback: Callable[[Request], None], *,
                served: bool = True) -> None:
        """At the next ``method`` request, once, call ``callback(request)`` and never answer:
        after the request is served (``served=True``: the change is made, the client never
        hears of it) or instead of serving it (the request is lost). With a callback that
        kills the client process, this is a crash at that exact point."""
        with self._lock:
            self._hooks[method] = (callback, served)

    def forbid(self, verb: str) -> None:
        """Answer 403 to ``verb`` (get, list, create, patch, delete) from now on."""
        self._forbidden.add(verb)

    def allow(self, verb: str) -> None:
        self._forbidden.discard(verb)

    def job(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.jobs[self._find(name, namespace)])

    def count(self, method: str | None = None) -> int:
        return sum(1 for r in self.requests if method is None or r.method == method)

    def _find(self, name: str, namespace: str | None) -> tuple[str, str]:
        keys = [k for k in self.jobs if k[1] == name and namespace in (None, k[0])]
        if len(keys) != 1:
            raise KeyError(f"no single Job {name!r} in {namespace or 'any namespace'}")
        return keys[0]

    def _fill(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._rv))
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        job.setdefault("status", {})

    # --- serving --------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        content_type = h.headers.get("Content-Type")
        request = Request(method, parts.path, query, body, content_type)
        with self._lock:
            self.requests.append(request)
            failure = self._failures.pop(0) if self._failures else None
            hook = self._hooks.pop(method, None)
        if hook is not None:
            callback, served = hook
            if served:
                self._serve(method, parts.path, query, body, content_type)
            callback(request)
            h.close_connection = True
            return
        if failure == "timeout":
            time.sleep(self.timeout_s)
            h.close_connection = True
            return
        if failure == "drop":
            h.close_connection = True
            return
        if isinstance(failure, int):
            self._send(h, failure, _status(failure, "InternalError" if failure >= 500 else
                                           "Injected", f"injected failure {failure}"))
            return
        code, answer = self._serve(method, parts.path, query, body, content_type)
        if failure == "lost":
            h.close_connection = True
            return
        self._send(h, code, answer)

    def _send(self, h: BaseHTTPRequestHandler, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _serve(self, method: str, path: str, query: dict[str, str], body: Any,
               content_type: str | None) -> tuple[int, Any]:
        if path == "/version":
            return 200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0-fake"}
        if path == "/apis":
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": "batch", "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
                 "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"}}]}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/apis/batch/v1":
            return 200, {"kind": "APIResourceList", "groupVersion": "batch/v1", "resources": [
                {"name": "jobs", "singularName": "job", "namespaced": True, "kind": "Job",
                 "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]}
        if _PODS.match(path) and method == "GET":
            # no pods here (no Job controller): the daemon times work from the Job status
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}
        match = _JOBS.match(path)
        if not match:
            return 404, _status(404, "NotFound", "the server could not find the requested "
                                "resource")
        ns, name = match.groups()
        verb = {("GET", False): "list", ("GET", True): "get", ("POST", False): "create",
                ("PATCH", True): "patch", ("DELETE", True): "delete",
                ("PUT", True): "update"}.get((method, name is not None))
        if verb is None:
            return 405, _status(405, "MethodNotAllowed", f"{method} is not supported here")
        if verb in self._forbidden:
            target = f' "{name}"' if name else ""
            return 403, _status(403, "Forbidden", (
                f'jobs.batch{target} is forbidden: User "system:serviceaccount:{ns}:idlegpu" '
                f'cannot {verb} resource "jobs" in API group "batch" in the namespace "{ns}"'),
                {"name": name or "", "group": "batch", "kind": "jobs"})
        with self._lock:
            if verb == "list":
                return self._list(ns, query)
            if verb == "create":
                return self._create(ns, body)
            job = self.jobs.get((ns, name))
            if job is None:
                return 404, _status(404, "NotFound", f'jobs.batch "{name}" not found',
                                    {"name": name, "group": "batch", "kind": "jobs"})
            if verb == "get":
                return 200, copy.deepcopy(job)
            if verb == "delete":
                del self.jobs[(ns, name)]
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "details": {"name": name, "group": "batch", "kind": "jobs",
                                         "uid": job["metadata"]["uid"]}}
            if verb == "patch":
                return self._patch(ns, name, job, body, content_type)
            return 405, _status(405, "MethodNotAllowed", "update is not supported by the fake")

    def _list(self, ns: str, query: dict[str, str]) -> tuple[int, Any]:
        selector = query.get("labelSelector", "")
        try:
            items = [copy.deepcopy(job) for (job_ns, _), job in sorted(self.jobs.items())
                     if job_ns == ns and _matches(job["metadata"].get("labels") or {},
                                                  selector)]
        except ValueError as exc:
            return 400, _status(400, "BadRequest", str(exc))
        return 200, {"kind": "JobList", "apiVersion": "batch/v1",
                     "metadata": {"resourceVersion": str(next(self._rv))}, "items": items}

    def _invalid(self, name: str, causes: list[tuple[str, str]]) -> tuple[int, Any]:
        text = ", ".join(f"{field}: {message}" for field, message in causes)
        return 422, _status(422, "Invalid", f'Job.batch "{name}" is invalid: {text}', {
            "name": name, "group": "batch", "kind": "Job",
            "causes": [{"reason": "FieldValueInvalid" if "Required" not in m else
                        "FieldValueRequired", "message": m, "field": f} for f, m in causes]})

    def _create(self, ns: str, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return 400, _status(400, "BadRequest", "the body of the request was not a Job")
        meta = body.get("metadata") or {}
        name = meta.get("name") or ""
        if meta.get("namespace") not in (None, ns):
            return 400, _status(400, "BadRequest", "the namespace of the provided object does "
                                "not match the namespace sent on the request")
        causes: list[tuple[str, str]] = []
        if not name:
            causes.append(("metadata.name", "Required value: name or generateName is required"))
        elif len(name) > 63 or not _DNS_LABEL.match(name):
            text = f'Invalid value: "{name}": a lowercase RFC 1123 label of at most 63 chars'
            causes.append(("metadata.name", text))
        if body.get("kind") not in (None, "Job") or body.get("apiVersion") not in (
                None, "batch/v1"):
            return 400, _status(400, "BadRequest", "kind/apiVersion do not match batch/v1 Job")
        template = (body.get("spec") or {}).get("template")
        if not template:
            causes.append(("spec.template", "Required value"))
        else:
            pod = template.get("spec") or {}
            containers = pod.get("containers") or []
            if not containers:
                causes.append(("spec.template.spec.containers", "Required value"))
            for i, container in enumerate(containers):
                for key in ("name", "image"):
                    if not container.get(key):
                        causes.append((f"spec.template.spec.containers[{i}].{key}",
                                       "Required value"))
            if pod.get("restartPolicy") not in ("Never", "OnFailure"):
                policy = pod.get("restartPolicy")
                text = f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"'
                causes.append(("spec.template.spec.restartPolicy", text))
        if causes:
            return self._invalid(name, causes)
        if (ns, name) in self.jobs:
            return 409, _status(409, "AlreadyExists", f'jobs.batch "{name}" already exists',
                                {"name": name, "group": "batch", "kind": "jobs"})
        job = copy.deepcopy(body)
        job["apiVersion"], job["kind"] = "batch/v1", "Job"
        job["metadata"]["namespace"] = ns
        self._fill(job)
        job["spec"].setdefault("suspend", False)
        self.jobs[(ns, name)] = job
        return 201, copy.deepcopy(job)

    def _patch(self, ns: str, name: str, job: dict[str, Any], body: Any,
               content_type: str | None) -> tuple[int, Any]:
        kind = (content_type or "").split(";")[0].strip()
        if kind not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return 415, _status(415, "UnsupportedMediaType",
                                f"the fake supports merge patches only, not {kind!r}")
        if not isinstance(body, dict):
            return 400, _status(400, "BadRequest", "a merge patch must be an object")
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != job["metadata"]["resourceVersion"]:
            # a precondition, as on a real server: the object changed since it was read
            return 409, _status(409, "Conflict", (
                f'Operation cannot be fulfilled on jobs.batch "{name}": the object has been '
                f'modified; please apply your changes to the latest version and try again'))
        patched = merge_patch(job, body)
        if patched.get("spec", {}).get("template") != job.get("spec", {}).get("template"):
            return self._invalid(name, [("spec.template", "Invalid value: field is immutable")])
        for key in ("name", "namespace", "uid"):
            if patched["metadata"].get(key) != job["metadata"].get(key):
                return self._invalid(name, [(f"metadata.{key}", "field is immutable")])
        suspend = patched.get("spec", {}).get("suspend")
        if not isinstance(suspend, (bool, type(None))):
            return self._invalid(name, [("spec.suspend", "Invalid value: must be a boolean")])
        if suspend and not job["spec"].get("suspend"):
            # the one bit of Job controller we play: pods gone, Suspended condition set
            status = patched.setdefault("status", {})
            status.update({"active": 0, "ready": 0})
            status["conditions"] = [c for c in status.get("conditions") or []
                                    if c.get("type") != "Suspended"] + [
                {"type": "Suspended", "status": "True", "reason": "JobSuspended",
                 "message": "Job suspended", "lastTransitionTime": _now()}]
        if patched.get("spec") != job.get("spec"):
            patched["metadata"]["generation"] = job["metadata"].get("generation", 1) + 1
        patched["metadata"]["resourceVersion"] = str(next(self._rv))
        self.jobs[(ns, name)] = patched
        return 200, copy.deepcopy(patched)
