"""``NativeJobs``: users' own suspended Jobs (``idlegpu.io/queue: <pool>``) over the API server.

    jobs = NativeJobs(api_client, namespaces=["nlp", "vision"], queue="seoul-a1", ...)
    reading = jobs.read()                    # the queued Jobs, and those to refuse
    jobs.refuse(job, "spec.template...: why; the fix")
    jobs.resume(job, stop_by=..., now=...)   # admitted: spec.suspend=false
    jobs.suspend(job, reason=..., kind=StopKind.PREEMPT, now=...)

Only the namespaces the operator allows (``cluster.native_jobs.namespaces``) are listed, with
the queue label's selector: a Job elsewhere is never read, whoever labels it. Each new
suspended Job is checked by the rules a request is held to (``native_jobs.job_problems``: an
allowed registry and a pinned tag, the GPU limits) and the pod security rules of idlegpu's own
Jobs (``check_pod_security``: no privilege, no root, no host namespaces or paths); a refusal
is written on the Job (``idlegpu.io/refused``, naming the field and the fix) and as a Warning
Event, so ``kubectl describe job`` says it, and the Job is never run until its owner fixes it.

An admission unsuspends the Job (a merge patch, conditional on the ``resourceVersion`` read:
a Job its owner changed meanwhile waits for the next pass) and records ``idlegpu.io/admitted-at``
and the window's end; the first admission also puts the pool's nodeSelector and tolerations on
its pod template (a suspended Job that never ran may still change them). A stop suspends it the
way idlegpu's own Jobs are stopped (``KubernetesCluster.stop``: the pods marked
``DisruptionTarget``, SIGTERM and the grace period), with the stop's kind and reason on it.

With ``watch`` (the daemon) each namespace's queued Jobs come from a watch-fed copy
(``mirror.WatchedList``, the same label selector), listed where there is no copy to trust.

The grants (deploy/optional/native-jobs-rbac.yaml), in each allowed namespace: Jobs get, list,
watch, patch; pods list, pods/status patch (the stop's marks); events create.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kubernetes

from idlegpu.scheduler.adapters.kubernetes.calls import ApiCaller, _server_time
from idlegpu.scheduler.adapters.kubernetes.client import KubernetesCluster
from idlegpu.scheduler.adapters.kubernetes.credentials import load_client_configuration
from idlegpu.scheduler.adapters.kubernetes.errors import (
    ClusterRejectedError,
    UnsafeManifestError,
    _NotFound,
)
from idlegpu.scheduler.adapters.kubernetes.mirror import WatchedList
from idlegpu.scheduler.adapters.kubernetes.names import (
    ANN_STOP_BY,
    ANN_STOP_KIND,
    ANN_STOP_REASON,
    ANN_STOPPED_AT,
    _iso,
    label_value,
)
from idlegpu.scheduler.adapters.kubernetes.security import check_pod_security
from idlegpu.scheduler.native_jobs import (
    ADMITTED_ANNOTATION,
    QUEUE_LABEL,
    REFUSED_ANNOTATION,
    NativeJob,
    NativeJobError,
    job_problems,
    native_job,
)
from idlegpu.scheduler.ports import StopKind

log = logging.getLogger("idlegpu.scheduler.adapters.kubernetes.native")

_MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class NativeReading:
    """The queued Jobs of the allowed namespaces, and the new ones to refuse (with why)."""

    jobs: Sequence[NativeJob]
    to_refuse: Sequence[tuple[NativeJob, str]] = ()
    unreadable: Sequence[tuple[str, str]] = field(default_factory=tuple)
    """(namespace/name, why) of Jobs whose fields make no unit (refused too, when they can be
    named)."""


class NativeJobs(ApiCaller):
    """Users' suspended Jobs queued on idlegpu (module docstring)."""

    grants = ("the Role of deploy/optional/native-jobs-rbac.yaml in that namespace (jobs.batch: "
              "get, list, watch, patch; pods: list; pods/status: patch; events: create)")

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        *,
        namespaces: Sequence[str],
        queue: str,
        allowed_registries: Sequence[str],
        max_gpus: int,
        pool_gpus: int,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
        grace_seconds: int = 600,
        retries: int = 3,
        backoff_s: float = 0.5,
        request_timeout_s: float = 30.0,
        max_jobs: int = 10_000,
        watch: bool = False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``max_jobs``: the most queued Jobs one namespace may hold; beyond it that pass reads
        none (reported), so one namespace's flood cannot exhaust the daemon. ``watch``: keep
        each namespace's queued Jobs in a watch-fed copy (``mirror.WatchedList``, started by
        the first ``read``) rather than list them every pass; a namespace without a copy to
        trust is listed."""
        if not namespaces:
            raise ValueError("name at least one namespace whose Jobs may queue")
        self.api_client = api_client
        self.batch = kubernetes.client.BatchV1Api(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.namespaces = tuple(dict.fromkeys(namespaces))
        self.queue = queue
        self.selector = f"{QUEUE_LABEL}={label_value(queue)}"
        self.allowed_registries = tuple(allowed_registries)
        self.max_gpus = int(max_gpus)
        self.pool_gpus = int(pool_gpus)
        self.node_selector = dict(node_selector or {})
        self.tolerations = [dict(t) for t in (tolerations or [])]
        self.retries = int(retries)
        self.backoff_s = backoff_s
        self.request_timeout_s = request_timeout_s
        self.max_jobs = int(max_jobs)
        self._sleep = sleep
        self._stoppers = {ns: KubernetesCluster(
            api_client, namespace=ns, grace_seconds=grace_seconds, retries=retries,
            backoff_s=backoff_s, request_timeout_s=request_timeout_s, sleep=sleep)
            for ns in self.namespaces}
        self._objects: dict[str, dict[str, Any]] = {}  # unit id -> the Job as last read
        self.watched = {ns: WatchedList(
            self._caller(ns), self._lister(ns), f"jobs.batch in namespace {ns}",
            most=self.max_jobs, too_many=self._too_many(ns)) for ns in self.namespaces
        } if watch else {}

    def close(self) -> None:
        """Stop the watches (if any)."""
        for watched in self.watched.values():
            watched.stop()

    def _caller(self, namespace: str) -> ApiCaller:
        """A caller of this namespace's own (a watch's thread must not share the messages'
        namespace with the passes)."""
        caller = ApiCaller()
        caller.namespace, caller.grants = namespace, self.grants
        caller.retries, caller.backoff_s = self.retries, self.backoff_s
        caller.request_timeout_s, caller._sleep = self.request_timeout_s, self._sleep
        return caller

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None,
                    in_cluster: bool = False, **kw: Any) -> NativeJobs:
        return cls(kubernetes.client.ApiClient(
            load_client_configuration(kubeconfig, context, in_cluster)), **kw)

    # --- reading -------------------------------------------------------------------------

    def read(self) -> NativeReading:
        jobs: list[NativeJob] = []
        to_refuse: list[tuple[NativeJob, str]] = []
        unreadable: list[tuple[str, str]] = []
        objects: dict[str, dict[str, Any]] = {}
        for namespace in self.namespaces:
            for obj in self._queued_in(namespace):
                meta = obj.get("metadata") or {}
                where = f"{meta.get('namespace')}/{meta.get('name')}"[:300]
                try:
                    job = native_job(obj)
                except NativeJobError as exc:
                    unreadable.append((where, str(exc)[:500]))
                    continue
                jobs.append(job)
                objects[job.id] = obj
                if job.refused or job.ours or not job.suspended or job.finished:
                    continue
                problems = self.problems(job, obj)
                if problems:
                    to_refuse.append((job, "; ".join(problems)[:1024]))
        self.namespace = None
        self._objects = objects
        return NativeReading(jobs=jobs, to_refuse=to_refuse, unreadable=unreadable)

    def _queued_in(self, namespace: str) -> list[dict[str, Any]]:
        """A namespace's queued Jobs: the watch's copy where there is one to trust, else a
        listing."""
        watched = self.watched.get(namespace)
        if watched is not None:
            watched.start()
            copy = watched.items()
            if copy is not None:
                return copy
        return self._jobs_of(namespace)

    def _jobs_of(self, namespace: str) -> list[dict[str, Any]]:
        """The queued Jobs of one namespace, 500 a page, at most ``max_jobs``."""
        self.namespace = namespace
        return self._list_all(self._lister(namespace), "jobs.batch", most=self.max_jobs,
                              too_many=self._too_many(namespace))

    def _lister(self, namespace: str) -> Callable[..., Any]:
        def list_them(**kw: Any) -> Any:
            return self.batch.list_namespaced_job(namespace, label_selector=self.selector, **kw)
        return list_them

    def _too_many(self, namespace: str) -> str:
        return (f"more than {self.max_jobs:,} Jobs queued in namespace {namespace}: not read "
                f"(each namespace may queue at most {self.max_jobs:,})")

    def problems(self, job: NativeJob, obj: dict[str, Any]) -> list[str]:
        """Why the Job may not run here (empty: it may queue)."""
        problems = job_problems(job, allowed_registries=self.allowed_registries,
                                max_gpus=self.max_gpus, pool_gpus=self.pool_gpus)
        try:
            check_pod_security(obj)
        except UnsafeManifestError as exc:
            problems.append(str(exc).split(": ", 1)[-1] + "; remove them (pods of research "
                            "Jobs run unprivileged, as non-root)")
        return problems

    # --- writing -------------------------------------------------------------------------

    def refuse(self, job: NativeJob, reason: str) -> None:
        """Write the refusal on the Job and as a Warning Event."""
        self.namespace = job.namespace
        patch = {"metadata": {"annotations": {REFUSED_ANNOTATION: reason[:1024]}}}
        try:
            self._call("patch", lambda **kw: self.batch.patch_namespaced_job(
                job.name, job.namespace, patch, _content_type=_MERGE_PATCH, **kw))
        except _NotFound:
            return
        stamp = _iso(_server_time(self._server_date))
        event: Any = {  # (the client takes the object as JSON, as the Jobs of client.py)
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{job.name[:200]}.", "namespace": job.namespace},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": job.name,
                               "namespace": job.namespace, "uid": job.uid},
            "reason": "IdlegpuRefused", "message": reason[:1024], "type": "Warning",
            "source": {"component": "idlegpu"}, "firstTimestamp": stamp,
            "lastTimestamp": stamp, "count": 1}
        self._call("create", lambda **kw: self.core.create_namespaced_event(
            job.namespace, event, **kw), "events")
        log.warning("refused Job %s/%s: %s", job.namespace, job.name, reason)

    def resume(self, job: NativeJob, *, stop_by: datetime | None, now: datetime) -> bool:
        """Unsuspend the Job (module docstring); False: it changed since it was read (or is
        gone), so this pass leaves it."""
        self.namespace = job.namespace
        obj = self._objects.get(job.id) or {}
        meta = obj.get("metadata") or {}
        annotations: dict[str, Any] = {ADMITTED_ANNOTATION: _iso(now), ANN_STOP_KIND: None,
                                       ANN_STOP_REASON: None, ANN_STOPPED_AT: None,
                                       ANN_STOP_BY: _iso(stop_by) if stop_by else None}
        spec: dict[str, Any] = {"suspend": False}
        if not (obj.get("status") or {}).get("startTime"):  # never ran: may still move
            pod = copy.deepcopy(((obj.get("spec") or {}).get("template") or {}).get("spec") or {})
            if self.node_selector:
                spec["template"] = {"spec": {"nodeSelector": {
                    **(pod.get("nodeSelector") or {}), **self.node_selector}}}
            if self.tolerations:
                spec.setdefault("template", {"spec": {}})["spec"]["tolerations"] = [
                    *(pod.get("tolerations") or []),
                    *(t for t in self.tolerations if t not in (pod.get("tolerations") or []))]
        patch = {"metadata": {"annotations": annotations,
                              "resourceVersion": meta.get("resourceVersion")}, "spec": spec}
        try:
            self._call("patch", lambda **kw: self.batch.patch_namespaced_job(
                job.name, job.namespace, patch, _content_type=_MERGE_PATCH, **kw))
        except _NotFound:
            return False
        except ClusterRejectedError as exc:
            if exc.status == 409:
                return False
            raise
        log.info("admitted Job %s/%s", job.namespace, job.name)
        return True

    def suspend(self, job: NativeJob, *, reason: str, kind: StopKind, now: datetime) -> None:
        """Suspend the Job as idlegpu's own are stopped; it waits again once its pods end."""
        stopper = self._stoppers[job.namespace]
        stopper.stop(job.name, reason=reason, kind=kind, now=now)
        self.namespace = job.namespace
        patch = {"metadata": {"annotations": {ADMITTED_ANNOTATION: None}}}
        try:
            self._call("patch", lambda **kw: self.batch.patch_namespaced_job(
                job.name, job.namespace, patch, _content_type=_MERGE_PATCH, **kw))
        except _NotFound:
            pass
        log.info("stopped Job %s/%s (%s): %s", job.namespace, job.name, kind.value, reason)
