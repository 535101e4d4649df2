"""``KubernetesCluster``: the ``Cluster`` port's calls to the API server (see the package
docstring): create and adopt an attempt's Job (and a gang's Service), checkpoint notices,
stops (suspend, with the pods marked ``DisruptionTarget`` first), deletes, ``observe`` and the
node view; every call retried on 5xx, 429, timeouts and lost connections, its errors mapped to
``ClusterUnavailableError``, ``ClusterPermissionError`` and ``ClusterRejectedError``. What it
sends is built by ``manifests``; what it reads is parsed by ``status`` and ``nodes``."""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import kubernetes

from idlegpu.forecast.errors import PermanentError
from idlegpu.scheduler.adapters.kubernetes.calls import ApiCaller, _server_time
from idlegpu.scheduler.adapters.kubernetes.credentials import load_client_configuration
from idlegpu.scheduler.adapters.kubernetes.errors import (
    ClusterPermissionError,
    ClusterRejectedError,
    ClusterUnavailableError,
    JobConflictError,
    _Conflict,
    _NotFound,
)
from idlegpu.scheduler.adapters.kubernetes.manifests import (
    deadline_seconds,
    job_manifest,
    notice_volumes,
    service_manifest,
)
from idlegpu.scheduler.adapters.kubernetes.names import (
    ANN_CHECKPOINT_REASON,
    ANN_CHECKPOINT_REQUEST,
    ANN_STOP_BY,
    ANN_STOP_KIND,
    ANN_STOP_REASON,
    ANN_STOPPED_AT,
    ANN_UNIT_ID,
    DISRUPTION_REASON,
    JOB_NAME_LABEL,
    JOBSET_GROUP,
    LABEL_ATTEMPT,
    LABEL_INSTANCE,
    LABEL_UNIT,
    MANAGED_BY,
    MANAGER,
    SELECTOR,
    _iso,
    job_name,
    label_value,
)
from idlegpu.scheduler.adapters.kubernetes.nodes import _job_of, _node_view, _pool_nodes
from idlegpu.scheduler.adapters.kubernetes.status import _finished_condition, _to_cluster_job
from idlegpu.scheduler.ports import ClusterJob, StopKind
from idlegpu.scheduler.types import NodeView, UnitSpec

# the package's name, as before the split: what log configurations and tests select
log = logging.getLogger("idlegpu.scheduler.adapters.kubernetes")

_MERGE_PATCH = "application/merge-patch+json"
_STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
RENEW_ATTEMPTS = 3  # reads and writes of one renewal, each after a conflict


class KubernetesCluster(ApiCaller):
    """``Cluster`` over ``batch/v1`` Jobs in one namespace (see the package docstring)."""

    namespace: str

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient | None,
        *,
        namespace: str,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict[str, Any]] | None = None,
        affinity: dict[str, Any] | None = None,
        priority_class: str | None = "idlegpu-best-effort",
        grace_seconds: int = 600,
        non_checkpoint_grace_seconds: int = 30,
        active_deadline_seconds: int | None = None,
        backoff_limit: int = 0,
        retries: int = 3,
        dry_run: bool = False,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        request_timeout_s: float = 30.0,
        service_account: str | None = None,
        run_as_user: int | None = None,
        ttl_seconds_after_finished: int | None = None,
        instance: str | None = None,
        job_api_url: str | None = None,
        token_audience: str = "idlegpu",
        token_expiration_seconds: int = 600,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``instance``: the identity of the daemon instance that owns these Jobs (a label on
        each); ``observe`` and adoption see only this instance's Jobs, so two daemons (two
        pools, or two stores) can share a namespace. None: every idlegpu Job (one daemon)."""
        if api_client is None and not dry_run:
            raise ValueError("an api_client is needed unless dry_run=True")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.api_client = api_client
        self.batch = kubernetes.client.BatchV1Api(api_client) if api_client else None
        self.core = kubernetes.client.CoreV1Api(api_client) if api_client else None
        self.instance = instance
        self.selector = SELECTOR + (f",{LABEL_INSTANCE}={label_value(instance)}"
                                    if instance else "")
        self._pods_readable = True
        self._pods_markable = True
        self._server_date: str | None = None  # the Date header of the last answer
        self.namespace = namespace
        self.node_selector = dict(node_selector or {})
        self.tolerations = [dict(t) for t in (tolerations or [])]
        self.affinity = copy.deepcopy(affinity) if affinity else None
        self.priority_class = priority_class
        self.grace_seconds = int(grace_seconds)
        self.non_checkpoint_grace_seconds = int(non_checkpoint_grace_seconds)
        self.active_deadline_seconds = active_deadline_seconds
        self.backoff_limit = int(backoff_limit)
        self.retries = int(retries)
        self.dry_run = dry_run
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.request_timeout_s = request_timeout_s
        self.service_account = service_account
        self.run_as_user = run_as_user
        self.ttl_seconds_after_finished = ttl_seconds_after_finished
        self.job_api_url = job_api_url
        self.token_audience = token_audience
        self.token_expiration_seconds = int(token_expiration_seconds)
        self._sleep = sleep
        self.last_manifests: list[dict[str, Any]] = []
        """Manifests ``apply`` built, newest last (the last 1000): Jobs, each gang's headless
        Service right after its Job (what ``kubectl apply`` needs for a dry run's)."""
        self.dry_run_stops: list[tuple[str, str]] = []
        """``(name, reason)`` of every ``stop`` skipped in dry-run mode."""
        self._gangs: set[str] = set()  # names of our Indexed Jobs seen (their Service to delete)
        self._jobset: bool | None = None  # the JobSet API is served (None: not asked yet)

    @classmethod
    def from_config(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        **kw: Any,
    ) -> KubernetesCluster:
        """Build from a kubeconfig file (default ``~/.kube/config`` or ``$KUBECONFIG``) and
        context, or from the pod's service account when ``in_cluster`` (also when neither is
        named, none is found and the process runs in a pod)."""
        return cls(kubernetes.client.ApiClient(
            load_client_configuration(kubeconfig, context, in_cluster)), **kw)

    # --- Cluster protocol ----------------------------------------------------------------

    def job_name(self, unit_id: str, attempt: int) -> str:
        return job_name(unit_id, attempt)

    def manifest(self, unit_id: str, attempt: int, spec: UnitSpec, team: str,
                 stop_by: datetime | None, now: datetime,
                 nodes: tuple[str, ...] | list[str] | None = None) -> dict[str, Any]:
        """The attempt's ``batch/v1`` Job (pure: same inputs, same dict), security-checked; a
        multi-node unit's is an Indexed Job; its pods pinned to ``nodes`` when given
        (``manifests.job_manifest``)."""
        return job_manifest(self, unit_id, attempt, spec, team, stop_by, now, nodes)

    def _notice_volumes(self) -> list[dict[str, Any]]:
        """The volumes of a pod that answers checkpoint notices (``manifests.notice_volumes``)."""
        return notice_volumes(self)

    def request_checkpoint(self, name: str, *, deadline: datetime, reason: str,
                           now: datetime) -> int:
        """The checkpoint notice: annotate every live pod of Job ``name`` (and the Job, for
        ``kubectl``) ``idlegpu.io/checkpoint-request: <deadline>``, which the kubelet
        projects into the pods' notice file. Returns how many pods carry it (0: none yet, e.g.
        its pod not created: call again). Idempotent."""
        stamp = _iso(deadline)
        annotations = {ANN_CHECKPOINT_REQUEST: stamp, ANN_CHECKPOINT_REASON: reason[:1024]}
        if self.dry_run:
            log.info("dry run: would give Job %s/%s's pods a checkpoint notice until %s",
                     self.namespace, name, stamp)
            return 1
        try:
            self._call("patch", lambda **kw: self._batch_api.patch_namespaced_job(
                name, self.namespace, {"metadata": {"annotations": annotations}},
                _content_type=_MERGE_PATCH, **kw))
        except _NotFound:
            return 0
        body = self._call("list", lambda **kw: self._core_api.list_namespaced_pod(
            self.namespace, label_selector=f"{JOB_NAME_LABEL}={name}", **kw),
            resource="pods")
        noticed = 0
        for pod in body.get("items") or []:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed") or meta.get("deletionTimestamp"):
                continue
            if (meta.get("annotations") or {}).get(ANN_CHECKPOINT_REQUEST) == stamp:
                noticed += 1
                continue
            patch = {"metadata": {"uid": meta.get("uid"), "annotations": annotations}}
            pod_name = meta.get("name")
            try:
                self._call("patch", lambda body=patch, pod=pod_name, **kw:
                           self._core_api.patch_namespaced_pod(
                               pod, self.namespace, body, _content_type=_MERGE_PATCH, **kw),
                           resource="pods")
                noticed += 1
            except _NotFound:
                continue
            except ClusterRejectedError as exc:
                if exc.status == 409:  # a new pod of that name: the next call sees it
                    continue
                raise
        return noticed

    def renew(self, name: str, *, stop_by: datetime | None) -> bool:
        """A renewed window: the Job's planned stop moves to ``stop_by`` (None: none), its
        ``activeDeadlineSeconds`` (the safety net, counted from the Job's start) by as much
        as the stop it was given (``idlegpu.io/stop-by``), capped as at its creation; both in
        one write on the version read, so a retry changes nothing more. The Job controller
        writes a new Job's status meanwhile (a conflict): read again, a few times. False:
        the Job is gone, or kept changing (the next pass renews it again)."""
        for _ in range(RENEW_ATTEMPTS):
            job = self._get(name)
            if job is None:
                return False
            patch = self._renewal(job, stop_by)
            if self.dry_run:
                log.info("dry run: would renew Job %s/%s until %s", self.namespace, name,
                         _iso(stop_by) if stop_by else "its end")
                return True
            try:
                self._call("patch", lambda body=patch, **kw: self._batch_api.patch_namespaced_job(
                    name, self.namespace, body, _content_type=_MERGE_PATCH, **kw))
            except _NotFound:
                return False
            except ClusterRejectedError as exc:
                if exc.status == 409:
                    continue
                raise
            log.info("renewed Job %s/%s until %s", self.namespace, name,
                     _iso(stop_by) if stop_by else "its end")
            return True
        return False

    def _renewal(self, job: dict[str, Any], stop_by: datetime | None) -> dict[str, Any]:
        """The merge patch of ``renew`` for ``job`` as read."""
        meta, spec = job.get("metadata") or {}, job.get("spec") or {}
        given = (meta.get("annotations") or {}).get(ANN_STOP_BY)
        deadline = spec.get("activeDeadlineSeconds")
        cap = self.active_deadline_seconds
        if stop_by is None:
            deadline = cap
        elif given and deadline is not None:
            moved = stop_by - datetime.fromisoformat(given)
            deadline = max(60, int(deadline) + math.ceil(moved.total_seconds()))
            deadline = deadline if cap is None else min(int(cap), deadline)
        return {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                             "annotations": {ANN_STOP_BY: _iso(stop_by) if stop_by else None}},
                "spec": {"activeDeadlineSeconds": deadline}}

    def deadline_seconds(self, spec: UnitSpec, stop_by: datetime | None,
                         now: datetime) -> int | None:
        """``activeDeadlineSeconds``: the safety net if the daemon is not there to stop the Job
        (``manifests.deadline_seconds``)."""
        return deadline_seconds(self, spec, stop_by, now)

    def service_manifest(self, job: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
        """The headless Service of a gang's Indexed Job ``job``, owned by the Job (``uid``: the
        Job's, when created) so it goes with it (``manifests.service_manifest``)."""
        return service_manifest(self.namespace, job, uid)

    def apply(self, unit_id: str, attempt: int, spec: UnitSpec, *, team: str,
              stop_by: datetime | None, now: datetime,
              nodes: tuple[str, ...] | list[str] | None = None) -> str:
        """Create the attempt's Job (see ``Cluster.apply``); a gang's with its headless
        Service, its pods pinned to ``nodes`` (the admission's, one per pod) when given."""
        manifest = self.manifest(unit_id, attempt, spec, team, stop_by, now, nodes)
        name = manifest["metadata"]["name"]
        self.last_manifests.append(manifest)
        del self.last_manifests[:-1000]
        gang = spec.nodes > 1
        if gang:
            self._say_which_gang_api()
        if self.dry_run:
            log.info("dry run: would create Job %s/%s: %s", self.namespace, name,
                     json.dumps(manifest, sort_keys=True))
            if gang:
                service = self.service_manifest(manifest)
                self.last_manifests.append(service)
                del self.last_manifests[:-1000]
                log.info("dry run: would create Service %s/%s: %s", self.namespace, name,
                         json.dumps(service, sort_keys=True))
            return name
        uid = None
        try:
            body = self._call("create", lambda **kw: self._batch_api.create_namespaced_job(
                self.namespace,
                manifest,  # type: ignore[arg-type]  # validate_call takes the plain dict too
                _content_type="application/json", **kw))
            uid = (body.get("metadata") or {}).get("uid")
            log.info("created Job %s/%s for unit %s attempt %d", self.namespace, name, unit_id,
                     attempt)
        except _Conflict:
            uid = self._adopt(name, unit_id, attempt)
        if gang:
            self._gangs.add(name)
            try:
                self._create_service(self.service_manifest(manifest, uid))
            except (ClusterUnavailableError, ClusterPermissionError, ClusterRejectedError):
                # no gang without its Service (its ranks would never meet): the Job goes
                # too, and the unit, still admitted, gets both created again next pass
                self.delete(name)
                raise
        return name

    def _create_service(self, service: dict[str, Any]) -> None:
        """Create a gang's Service (one already there, e.g. from a create retried after a lost
        response, is fine: same name, same Job)."""
        self.last_manifests.append(service)
        del self.last_manifests[:-1000]
        try:
            self._call("create", lambda **kw: self._core_api.create_namespaced_service(
                self.namespace,
                service,  # type: ignore[arg-type]  # validate_call takes the plain dict too
                _content_type="application/json", **kw),
                resource="services")
            log.info("created headless Service %s/%s", self.namespace,
                     service["metadata"]["name"])
        except _Conflict:
            pass

    def jobset_available(self) -> bool:
        """Whether the API server serves the JobSet API (``jobset.x-k8s.io``), by discovery."""
        if self.api_client is None:
            return False
        try:
            body = self._call("get", lambda **kw: kubernetes.client.ApisApi(
                self.api_client).get_api_versions(**kw), resource="apis (discovery)")
        except (_NotFound, ClusterPermissionError, ClusterRejectedError):
            return False
        return any(group.get("name") == JOBSET_GROUP for group in body.get("groups") or ())

    def _say_which_gang_api(self) -> None:
        if self._jobset is not None:
            return
        try:
            self._jobset = self.jobset_available()
        except ClusterUnavailableError:
            return  # asked again with the next gang
        if self._jobset:
            log.info("the JobSet API (%s) is installed, but multi-node units run as Indexed "
                     "Jobs with a headless Service (idlegpu does not create JobSets)",
                     JOBSET_GROUP)
        else:
            log.info("multi-node units run as Indexed Jobs with a headless Service (no JobSet "
                     "API, %s, on this cluster)", JOBSET_GROUP)

    def stop(self, name: str, *, reason: str, kind: StopKind, now: datetime) -> None:
        """Suspend the Job, writing why (``kind``, ``reason``) and when (``now``, the daemon's
        clock) in the same patch, so a restart or the other replica reads the stop back. A Job
        stopped before keeps its first kind and time: the patch is conditional on the
        ``resourceVersion`` read, and a lost race is read again."""
        if self.dry_run:
            self.dry_run_stops.append((name, reason))
            log.info("dry run: would suspend Job %s/%s (%s: %s)", self.namespace, name,
                     kind.value, reason)
            return
        for _ in range(3):
            job = self._get(name)
            if job is None:
                log.info("Job %s/%s is already gone", self.namespace, name)
                return
            if _finished_condition(job) is not None:
                return  # it ended already and holds no GPUs
            meta = job.get("metadata") or {}
            stop_kind = (meta.get("annotations") or {}).get(ANN_STOP_KIND) or kind.value
            if (meta.get("annotations") or {}).get(ANN_STOP_KIND):
                if (job.get("spec") or {}).get("suspend"):
                    # stopped before: the first stop stands (its pods, marked then, are marked
                    # again if one was missed)
                    self.mark_disrupted(name, f"stopped by idlegpu ({stop_kind})")
                    return
                patch: dict[str, Any] = {"spec": {"suspend": True}}
            else:
                patch = {"metadata": {"annotations": {
                    ANN_STOP_REASON: reason[:1024], ANN_STOP_KIND: kind.value,
                    ANN_STOPPED_AT: _iso(now)}}, "spec": {"suspend": True}}
            patch.setdefault("metadata", {})["resourceVersion"] = meta.get("resourceVersion")
            message = f"stopped by idlegpu ({stop_kind}): {reason}"
            # before the suspend: the Job controller must never see one of these pods terminal
            # without the mark, whatever the order of the kubelet's status write and delete
            self.mark_disrupted(name, message)
            try:
                self._call("patch", lambda body=patch, **kw: self._batch_api.patch_namespaced_job(
                    name, self.namespace, body, _content_type=_MERGE_PATCH, **kw))
                # a pod the Job controller created between the list above and the suspend
                self.mark_disrupted(name, message)
                return
            except _NotFound:
                log.info("Job %s/%s is already gone", self.namespace, name)
                return
            except ClusterRejectedError as exc:
                if exc.status == 409:  # changed since we read it (it may have just ended)
                    continue
                raise
        raise ClusterUnavailableError(
            f"Job {self.namespace}/{name} kept changing while being stopped; retry", delay=1.0)

    def mark_disrupted(self, name: str, message: str) -> int:
        """Give every live pod of Job ``name`` the ``DisruptionTarget`` condition (a
        ``pods/status`` patch), as the kube-scheduler's preemption and the Eviction API do, so
        the Job's ``podFailurePolicy`` Ignore rule applies to whatever the workload exits with
        (143 on SIGTERM, 137 past its grace period, its own code). Without it, a suspended Job
        whose pod the Job controller sees terminal before its final delete gets
        ``FailureTarget`` from the FailJob rule, and then ``Failed`` (1.36). Returns how many
        pods it marked. Without the ``pods/status`` patch grant the stop still goes ahead (the
        service needs the GPUs), with one warning naming the grant."""
        if self.core is None or not self._pods_markable:
            return 0
        try:
            body = self._call("list", lambda **kw: self._core_api.list_namespaced_pod(
                self.namespace, label_selector=f"{JOB_NAME_LABEL}={name}", **kw),
                resource="pods")
        except ClusterPermissionError as exc:
            log.warning("cannot list the pods of Job %s/%s to mark them stopped (%s)",
                        self.namespace, name, exc)
            return 0
        # the server's time: the disruption controller resets a DisruptionTarget whose
        # lastTransitionTime is over 2 minutes old on a pod not yet deleted, by its own clock
        condition = {"type": "DisruptionTarget", "status": "True", "reason": DISRUPTION_REASON,
                     "message": message[:1024],
                     "lastTransitionTime": _iso(_server_time(self._server_date))}
        marked = 0
        for pod in body.get("items") or []:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                continue  # judged already
            if any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                   for c in status.get("conditions") or []):
                continue
            # a strategic merge keyed by condition type: the kubelet's conditions stay, and the
            # kubelet keeps ours in its own status writes (conditions it does not own)
            patch = {"metadata": {"uid": meta.get("uid")}, "status": {"conditions": [condition]}}
            pod_name = meta.get("name")
            try:
                self._call("patch", lambda body=patch, pod=pod_name, **kw:
                           self._core_api.patch_namespaced_pod_status(
                               pod, self.namespace, body,
                               _content_type=_STRATEGIC_MERGE_PATCH, **kw),
                           resource="pods/status")
                marked += 1
            except _NotFound:
                continue  # gone already
            except ClusterRejectedError as exc:
                if exc.status == 409:  # a new pod of that name (uid precondition): not ours
                    continue
                raise
            except ClusterPermissionError as exc:
                self._pods_markable = False
                log.warning("cannot mark stopped pods (%s): a planned stop may now fail its Job "
                            "through the Job's podFailurePolicy (the daemon still reads it as "
                            "its stop); grant pods/status: patch (deploy/role.yaml)", exc)
                return marked
        return marked

    def delete(self, name: str) -> None:
        if self.dry_run:
            log.info("dry run: would delete Job %s/%s", self.namespace, name)
            return
        try:
            self._call("delete", lambda **kw: self._batch_api.delete_namespaced_job(
                name, self.namespace, propagation_policy="Background", **kw))
            log.info("deleted stopped Job %s/%s", self.namespace, name)
        except _NotFound:
            pass
        if name in self._gangs:
            # the garbage collector removes it with the Job too; a cluster without one must not
            # keep a Service for every rolled-back attempt
            try:
                self._call("delete", lambda **kw: self._core_api.delete_namespaced_service(
                    name, self.namespace, **kw), resource="services")
            except _NotFound:
                pass
            self._gangs.discard(name)

    def observe(self) -> list[ClusterJob]:
        """This instance's Jobs with their phase, and with their pods' real start (container
        start) and whether pods still terminate; server times mapped onto the daemon's clock
        through each Job's creation (see ``_clock_offset``)."""
        if self.batch is None:
            return []
        body = self._call("list", lambda **kw: self._batch_api.list_namespaced_job(
            self.namespace, label_selector=self.selector, **kw))
        pods = self._pods_by_job()
        jobs = []
        for item in body.get("items") or []:
            labels = item.get("metadata", {}).get("labels") or {}
            if labels.get(MANAGED_BY) != MANAGER:  # a server that ignores labelSelector
                continue
            if self.instance and labels.get(LABEL_INSTANCE) != label_value(self.instance):
                continue
            job = _to_cluster_job(item, None if pods is None else
                                  pods.get(item["metadata"].get("name"), []))
            if job is not None:
                jobs.append(job)
                if job.pods > 1:
                    self._gangs.add(job.name)
        return sorted(jobs, key=lambda j: j.name)

    def _pods_by_job(self) -> dict[str, list[dict[str, Any]]] | None:
        """Our pods by their Job's name; None when pods cannot be read (an older Role without
        pods get/list: the Job status alone is used, with a warning once)."""
        if self.core is None or not self._pods_readable:
            return None
        try:
            body = self._call("list", lambda **kw: self._core_api.list_namespaced_pod(
                self.namespace, label_selector=self.selector, **kw), resource="pods")
        except ClusterPermissionError as exc:
            self._pods_readable = False
            log.warning("cannot read pods (%s): work is timed from when the daemon sees a Job "
                        "running, and stopping Jobs from their status alone; grant pods get, "
                        "list (deploy/role.yaml)", exc)
            return None
        found: dict[str, list[dict[str, Any]]] = {}
        for pod in body.get("items") or []:
            owner = _job_of(pod)
            if owner:
                found.setdefault(owner, []).append(pod)
        return found

    def nodes(self, now: datetime | None = None) -> NodeView | None:
        """The pool's nodes (those matching ``node_selector``) with their allocatable GPUs,
        CPU and memory and what the pods bound to them request now, whoever runs them
        (service replicas, our Jobs, daemons): two list calls, nodes by label and every pod
        bound to a node that has not ended (``spec.nodeName!=,status.phase!=Succeeded,
        status.phase!=Failed``, cluster-wide: the replicas live in other namespaces), paged
        by 500. A node is schedulable for us unless cordoned or tainted ``NoSchedule`` /
        ``NoExecute`` without a toleration of our Jobs. Needs a ClusterRole with nodes list
        and pods list (deploy/role.yaml).
        ``NodeView.bound_jobs``: the Jobs (of any owner) whose pods are bound to these nodes.
        ``now``: stamped as ``observed_at`` (the daemon's clock). None without an API client
        (a dry run): no node view, the pool counts as one bin."""
        if self.core is None:  # a dry run without a cluster: no node view
            return None
        try:
            return self._nodes(now)
        except _NotFound as exc:  # a server (or a fake) that serves no nodes or pods
            raise PermanentError(f"the Kubernetes API serves no node view (HTTP 404: {exc}); "
                                 f"admission counts the pool as one bin") from None

    def _nodes(self, now: datetime | None) -> NodeView:
        selector = ",".join(f"{k}={v}" for k, v in sorted(self.node_selector.items()))
        by_label: dict[str, Any] = {"label_selector": selector} if selector else {}
        nodes = self._list_all(lambda **kw: self._core_api.list_node(**by_label, **kw), "nodes")
        wanted = _pool_nodes(nodes, self.node_selector)
        pods = self._list_all(lambda **kw: self._core_api.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
            **kw), "pods")
        return _node_view(wanted, pods, self.tolerations, now)

    # --- internals -----------------------------------------------------------------------

    @property
    def _batch_api(self) -> kubernetes.client.BatchV1Api:
        # read only past a dry run's early return or a check for None: without a dry run the
        # constructor demands an api_client
        assert self.batch is not None
        return self.batch

    @property
    def _core_api(self) -> kubernetes.client.CoreV1Api:
        assert self.core is not None  # as _batch_api
        return self.core

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call("get", lambda **kw: self._batch_api.read_namespaced_job(
                name, self.namespace, **kw))
        except _NotFound:
            return None

    def _adopt(self, name: str, unit_id: str, attempt: int) -> str | None:
        job = self._get(name)
        if job is None:  # deleted between our create and get: create it next cycle
            raise ClusterUnavailableError(
                f"Job {self.namespace}/{name} conflicted on create but is gone now; retry",
                delay=1.0)
        meta = job.get("metadata") or {}
        labels = meta.get("labels") or {}
        owner = (meta.get("annotations") or {}).get(ANN_UNIT_ID)
        if (labels.get(MANAGED_BY) != MANAGER or labels.get(LABEL_UNIT) != label_value(unit_id)
                or (owner is not None and owner != unit_id)
                or labels.get(LABEL_ATTEMPT) != str(attempt)
                or (self.instance and labels.get(LABEL_INSTANCE) != label_value(self.instance))):
            raise JobConflictError(
                f"Job {self.namespace}/{name} already exists and is not unit {unit_id} attempt "
                f"{attempt} of this idlegpu instance ({self.instance or 'any'}; labels {labels}); "
                f"delete or rename it")
        log.info("adopted existing Job %s/%s for unit %s", self.namespace, name, unit_id)
        return meta.get("uid")
