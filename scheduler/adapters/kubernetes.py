"""The ``Cluster`` port over the Kubernetes API: one ``batch/v1`` Job per attempt of a unit.

    cluster = KubernetesCluster.from_config(namespace="research", node_selector={...},
                                            tolerations=[...])
    name = cluster.apply(unit_id, attempt, spec, team="nlp", stop_by=..., now=...)
    cluster.stop(name, reason="window closes", kind=StopKind.PLANNED, now=...)
                                                    # spec.suspend=true: SIGTERM + grace period
    jobs = cluster.observe()                        # this instance's Jobs, with their pods
    view = cluster.nodes()                          # the pool's nodes and what runs on them
    cluster.delete(name)                            # a suspended attempt, once it is recorded

Jobs are named deterministically from ``(unit_id, attempt)``, so a create that is retried after
a lost response, or repeated after a restart, adopts the Job already there (409 Conflict)
instead of running it twice. Stopping suspends the Job and writes the stop's kind, reason and
time on it in the same patch. The Job controller then deletes the pods through the API, which
gives them no ``DisruptionTarget`` condition, and judges a pod it sees terminal (exit 143)
against the ``podFailurePolicy`` although it dropped the pod's tracking finalizer: its FailJob
rule would fail the Job (1.36). So the stop first gives the Job's live pods ``DisruptionTarget``
itself (``mark_disrupted``, a ``pods/status`` patch), and the Ignore rule applies. A Job that
ends Failed after our stop (no ``pods/status`` grant) is still read as our stop. A suspended
Job whose pods still terminate is ``STOPPING``: they hold their GPUs. A suspended Job is not
finished, so ``ttlSecondsAfterFinished`` never removes it: the controller deletes it (with
``propagationPolicy=Background``, since a Job deleted through the API otherwise orphans its
pods) once the store has recorded the attempt's end. Finished Jobs are left to
``ttlSecondsAfterFinished`` (the ``ttl_seconds_after_finished`` option) or the cluster's policy.

A multi-node (gang) unit (``spec.nodes`` = N > 1) is one *Indexed* Job (``completionMode:
Indexed``, ``parallelism = completions = N``, ``backoffLimitPerIndex``, the same
``podFailurePolicy``: any rank failing fails the whole Job) and a headless Service of the Job's
name (``clusterIP: None``, ``publishNotReadyAddresses``, owned by the Job so the garbage
collector removes it with the Job; ``delete`` removes it too). Each pod has ``subdomain`` set
to the Service, so pod 0 is ``<job>-0.<job>.<namespace>.svc``, and the rendezvous environment
launchers read: ``MASTER_ADDR`` (pod 0), ``MASTER_PORT``, ``NNODES``, ``NODE_RANK`` (the
completion index, from the pod's ``batch.kubernetes.io/job-completion-index`` annotation;
Kubernetes also sets ``JOB_COMPLETION_INDEX``), ``WORLD_SIZE`` (all processes: N x GPUs per
node), ``IDLEGPU_GPUS`` per node, and torchrun's ``PET_*`` twins. With the nodes the admission
counted on (``apply(..., nodes=)``) the pods are pinned to exactly that set (node affinity on
``metadata.name``) and kept apart (pod anti-affinity on the Job's name per hostname), so each
lands on its own chosen node or waits. The Job is RUNNING only once all N pods are ready;
before that it is PENDING with how many pods are bound (``ClusterJob.pods_bound``), which the
controller's gang timeout reads. JobSet (``jobset.x-k8s.io``) is detected through discovery
and logged, but not used: gangs are always Indexed Jobs. A one-pod unit's Job is pinned the same
way to the node admission counted on, when given: a node kept for a waiting gang (a
reservation) is not taken by the kube-scheduler's own choice.

Errors: HTTP 5xx, 429, timeouts and connection failures are retried with exponential backoff,
then raise ``ClusterUnavailableError`` (a ``TemporaryError``); 403 raises
``ClusterPermissionError`` naming the verb and resource the service account lacks; 422 and other
4xx raise ``ClusterRejectedError`` naming the fields the API server objected to. Every message is
one line.

With ``scheduler/adapters/lease.py`` (leader election), the only module allowed to import
``kubernetes`` (see the import-linter contracts).
"""

from __future__ import annotations

import copy
import email.utils
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from idlegpu.forecast.errors import PermanentError, TemporaryError
from idlegpu.scheduler.ports import ClusterJob, JobPhase, JobRejectedError, StopKind
from idlegpu.scheduler.types import (
    EnvFromSource,
    EnvKeyRef,
    NodeState,
    NodeView,
    UnitSpec,
    UnitVolume,
)

log = logging.getLogger(__name__)

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "idlegpu"
SELECTOR = f"{MANAGED_BY}={MANAGER}"
LABEL_UNIT = "idlegpu.io/unit"
LABEL_TEAM = "idlegpu.io/team"
LABEL_ATTEMPT = "idlegpu.io/attempt"
ANN_UNIT_ID = "idlegpu.io/unit-id"
ANN_TEAM = "idlegpu.io/team"
ANN_STOP_BY = "idlegpu.io/stop-by"
ANN_CREATED_AT = "idlegpu.io/created-at"
ANN_STOP_REASON = "idlegpu.io/stop-reason"
ANN_STOP_KIND = "idlegpu.io/stop-kind"
ANN_STOPPED_AT = "idlegpu.io/stopped-at"
LABEL_INSTANCE = "idlegpu.io/instance"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")  # set on pods by the Job controller
ANN_STEP = "idlegpu.io/step"
ANN_CHECKPOINT_REQUEST = "idlegpu.io/checkpoint-request"  # the notice's deadline, RFC 3339
ANN_CHECKPOINT_REASON = "idlegpu.io/checkpoint-reason"
NOTICE_DIR = "/etc/idlegpu"
NOTICE_FILE = "checkpoint-request"  # the kubelet projects the annotation here
TOKEN_DIR = "/var/run/secrets/idlegpu"
NOTICE_VOLUME = "idlegpu-notice"
TOKEN_VOLUME = "idlegpu-token"
NOTICE_FILE_ENV = "IDLEGPU_CHECKPOINT_REQUEST_FILE"
TOKEN_FILE_ENV = "IDLEGPU_TOKEN_FILE"
API_URL_ENV = "IDLEGPU_API_URL"
GPU_RESOURCE = "nvidia.com/gpu"
RESUME_ENV = "IDLEGPU_RESUME"
ATTEMPT_ENV = "IDLEGPU_ATTEMPT"
UNIT_ENV = "IDLEGPU_UNIT"
OUTPUT_ENV = "IDLEGPU_OUTPUT"
CONTAINER_NAME = "job"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # set on an Indexed Job's pods
JOB_NAME_LABEL = JOB_NAME_LABELS[0]
RENDEZVOUS_PORT = 29500  # torch.distributed's default
JOBSET_GROUP = "jobset.x-k8s.io"

_MAX_NAME = 63
_MAX_LABEL = 63
_RETRYABLE_STATUS = {429, 500, 502, 503, 504}
_MERGE_PATCH = "application/merge-patch+json"
_STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
DISRUPTION_REASON = "StoppedByIdlegpu"  # the DisruptionTarget reason of the pods we stop


class ClusterUnavailableError(TemporaryError):
    """The Kubernetes API could not be reached, timed out or kept answering 5xx/429."""


class ClusterPermissionError(PermanentError):
    """The API server answered 403: the service account lacks an RBAC permission."""


class ClusterRejectedError(JobRejectedError):
    """The API server rejected a request (422 Invalid, 400, ...); ``fields`` names the culprits."""

    def __init__(self, message: str, *, status: int, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.fields = fields


class JobConflictError(JobRejectedError):
    """A Job with the attempt's name exists but belongs to another unit or to someone else."""


class UnsafeManifestError(JobRejectedError):
    """A manifest breaks the pod security rules (privileged, host namespaces, hostPath...)."""


# --- names and labels --------------------------------------------------------------------


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _dns_part(text: str) -> str:
    """Lower-case ``text`` into DNS-1123 label characters, runs of others to one ``-``."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def job_name(unit_id: str, attempt: int) -> str:
    """``idlegpu-{unit}-a{attempt}``, a DNS-1123 label of at most 63 characters.

    When the unit id is not already DNS-safe (upper case, ``_``, ``/``...) or the name would be
    too long, an 8-hex hash of the exact unit id is added, so distinct ids never share a name.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, not {attempt}")
    part = _dns_part(unit_id)
    suffix = f"-a{attempt}"
    name = f"idlegpu-{part}{suffix}"
    if part == unit_id and len(name) <= _MAX_NAME:
        return name
    tail = f"-{_digest(unit_id)}{suffix}"
    room = _MAX_NAME - len("idlegpu-") - len(tail)
    part = part[:room].rstrip("-")
    return f"idlegpu-{part}{tail}" if part else f"idlegpu{tail}"


def label_value(text: str) -> str:
    """``text`` as a valid label value (<= 63 chars of ``[A-Za-z0-9._-]``, alphanumeric ends);
    lossy values get an 8-hex hash of the original so they stay distinct."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", text)
    if clean == text and len(text) <= _MAX_LABEL and re.fullmatch(r"([A-Za-z0-9].*)?", text) \
            and (not text or text[-1].isalnum()):
        return text
    tail = f"-{_digest(text)}"
    head = clean[: _MAX_LABEL - len(tail)].strip("-_.")
    return f"{head}{tail}" if head else _digest(text)


def _quantity_cpu(cpu: float) -> str:
    if cpu <= 0:
        raise ValueError(f"cpu must be positive, not {cpu}")
    if float(cpu).is_integer():
        return str(int(cpu))
    return f"{max(1, round(cpu * 1000))}m"


def _iso(when: datetime) -> str:
    """A time in an object we write, as Kubernetes writes its own (``creationTimestamp``):
    RFC 3339 in UTC, ``Z``, whatever zone the daemon's clock (a replay's ``--now``) is in."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


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


def _parse_time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


# --- volumes and references --------------------------------------------------------------


_VOLUME_SOURCES = ("persistentVolumeClaim", "emptyDir", "configMap", "secret")
"""The only volume sources a research pod may have."""


def _volume(volume: UnitVolume, job: str) -> dict[str, Any]:
    """The pod ``volumes`` entry of a unit's volume; hostPath and anything unknown refused."""
    if volume.kind == "persistent_volume_claim":
        claim: dict[str, Any] = {"claimName": volume.source}
        if volume.read_only:
            claim["readOnly"] = True
        return {"name": volume.name, "persistentVolumeClaim": claim}
    if volume.kind == "empty_dir":
        empty: dict[str, Any] = {}
        if volume.medium:
            empty["medium"] = volume.medium
        if volume.size_limit is not None:
            empty["sizeLimit"] = str(volume.size_limit)
        return {"name": volume.name, "emptyDir": empty}
    if volume.kind == "config_map":
        return {"name": volume.name, "configMap": {"name": volume.source}}
    if volume.kind == "secret":
        return {"name": volume.name, "secret": {"secretName": volume.source}}
    raise UnsafeManifestError(
        f"Job {job} breaks the pod security rules: volume {volume.name!r} of kind "
        f"{volume.kind!r} (only persistent_volume_claim, empty_dir, config_map and secret)")


def _volume_mount(volume: UnitVolume) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": volume.name, "mountPath": volume.mount_path}
    if volume.read_only or volume.kind in ("secret", "config_map"):
        mount["readOnly"] = True
    if volume.sub_path:
        mount["subPath"] = volume.sub_path
    return mount


def _env_from(source: EnvFromSource) -> dict[str, Any]:
    ref_key = "secretRef" if source.kind == "secret" else "configMapRef"
    ref: dict[str, Any] = {"name": source.name}
    if source.optional:
        ref["optional"] = True
    entry: dict[str, Any] = {ref_key: ref}
    if source.prefix:
        entry["prefix"] = source.prefix
    return entry


def _env_ref(ref: EnvKeyRef) -> dict[str, Any]:
    ref_key = "secretKeyRef" if ref.kind == "secret" else "configMapKeyRef"
    selector: dict[str, Any] = {"name": ref.source, "key": ref.key}
    if ref.optional:
        selector["optional"] = True
    return {"name": ref.name, "valueFrom": {ref_key: selector}}


# --- multi-node units ---------------------------------------------------------------------


def _rendezvous_env(name: str, namespace: str, spec: UnitSpec) -> list[dict[str, Any]]:
    """The environment torchrun and other launchers read for a gang of ``spec.nodes`` pods:
    pod 0's address through the headless Service, the port, the node count, this pod's rank
    (its completion index) and the world size (one process per GPU)."""
    master = f"{name}-0.{name}.{namespace}.svc"
    rank: dict[str, Any] = {"valueFrom": {"fieldRef": {
        "fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}}
    plain = {
        "MASTER_ADDR": master, "MASTER_PORT": str(RENDEZVOUS_PORT), "NNODES": str(spec.nodes),
        "WORLD_SIZE": str(spec.gpus), "IDLEGPU_NODES": str(spec.nodes),
        "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(RENDEZVOUS_PORT),
        "PET_NNODES": str(spec.nodes), "PET_NPROC_PER_NODE": str(spec.gpus_per_node),
    }
    env = [{"name": k, "value": v} for k, v in plain.items()]
    env += [{"name": "NODE_RANK", **copy.deepcopy(rank)},
            {"name": "PET_NODE_RANK", **copy.deepcopy(rank)}]
    return env


def _gang_affinity(affinity: dict[str, Any] | None, name: str,
                   nodes: tuple[str, ...] | list[str] | None) -> dict[str, Any]:
    """``affinity`` (the cluster's, or none) with a gang's own rules: no two pods of the Job on
    one node, and, with ``nodes``, only those nodes (``_pinned_affinity``)."""
    out = copy.deepcopy(affinity) if affinity else {}
    anti = out.setdefault("podAntiAffinity", {})
    anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append({
        "labelSelector": {"matchExpressions": [
            {"key": JOB_NAME_LABEL, "operator": "In", "values": [name]}]},
        "topologyKey": "kubernetes.io/hostname"})
    return _pinned_affinity(out, nodes)


def _pinned_affinity(affinity: dict[str, Any] | None,
                     nodes: tuple[str, ...] | list[str] | None) -> dict[str, Any]:
    """``affinity`` with, for ``nodes``, only those nodes: a ``metadata.name`` field added to
    every node-selector term, so it narrows the cluster's rule rather than offering an
    alternative (one term per node, a node field selector holding one value). The pods then
    land on the nodes admission counted on, never on ones it keeps for another unit."""
    out = copy.deepcopy(affinity) if affinity else {}
    if nodes:
        # a node field selector takes one value: one term per node (terms are ORed), each
        # also holding what the cluster's own term asks
        required = out.setdefault("nodeAffinity", {}).setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.get("nodeSelectorTerms") or [{}]
        pinned = []
        for term in terms:
            for node in sorted(set(nodes)):
                one = copy.deepcopy(term)
                one.setdefault("matchFields", []).append(
                    {"key": "metadata.name", "operator": "In", "values": [node]})
                pinned.append(one)
        required["nodeSelectorTerms"] = pinned
    return out


# --- pod security ------------------------------------------------------------------------


def _own_notice_volume(volume: dict[str, Any]) -> bool:
    """The notice volume as the adapter builds it: the pod's own notice annotation only."""
    items = (volume.get("downwardAPI") or {}).get("items") or []
    return len(items) == 1 and items[0].get("fieldRef", {}).get("fieldPath") == (
        f"metadata.annotations['{ANN_CHECKPOINT_REQUEST}']")


def _own_token_volume(volume: dict[str, Any]) -> bool:
    """The token volume as the adapter builds it: one service-account token, no Secret or
    ConfigMap smuggled in beside it."""
    sources = (volume.get("projected") or {}).get("sources") or []
    return len(sources) == 1 and set(sources[0]) == {"serviceAccountToken"}


def check_pod_security(manifest: dict[str, Any]) -> None:
    """Raise ``UnsafeManifestError`` when a Job manifest asks for anything privileged: host
    namespaces, volumes other than persistentVolumeClaim, emptyDir, configMap and secret
    (hostPath above all), privileged containers, privilege escalation, added capabilities,
    running as root, ``NVIDIA_*`` environment variables (or an envFrom prefix making them) and
    bidirectional mount propagation. Applied to every manifest before it is sent."""
    name = manifest.get("metadata", {}).get("name", "?")
    pod = manifest.get("spec", {}).get("template", {}).get("spec", {}) or {}
    problems: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(f"spec.template.spec.{key}")
    for i, volume in enumerate(pod.get("volumes") or []):
        # only claims, scratch space, ConfigMaps and Secrets: never hostPath, nor any other
        # source that reaches the node or storage outside the namespace's control
        allowed = set(_VOLUME_SOURCES)
        if volume.get("name") == NOTICE_VOLUME and _own_notice_volume(volume):
            allowed.add("downwardAPI")
        if volume.get("name") == TOKEN_VOLUME and _own_token_volume(volume):
            allowed.add("projected")
        for key in sorted(set(volume) - {"name", *allowed}):
            problems.append(f"spec.template.spec.volumes[{i}].{key}")
    pod_ctx = pod.get("securityContext") or {}
    if pod_ctx.get("runAsNonRoot") is not True:
        problems.append("spec.template.spec.securityContext.runAsNonRoot must be true")
    if pod_ctx.get("runAsUser") == 0:
        problems.append("spec.template.spec.securityContext.runAsUser=0")
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(pod.get(kind) or []):
            where = f"spec.template.spec.{kind}[{i}].securityContext"
            ctx = container.get("securityContext") or {}
            if ctx.get("privileged"):
                problems.append(f"{where}.privileged")
            if ctx.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}.allowPrivilegeEscalation must be false")
            if ctx.get("runAsUser") == 0:
                problems.append(f"{where}.runAsUser=0")
            caps = ctx.get("capabilities") or {}
            if caps.get("add"):
                problems.append(f"{where}.capabilities.add")
            if "ALL" not in (caps.get("drop") or []):
                problems.append(f"{where}.capabilities.drop must include ALL")
            for port in container.get("ports") or []:
                if port.get("hostPort"):
                    problems.append(f"spec.template.spec.{kind}[{i}].ports.hostPort")
            # NVIDIA_VISIBLE_DEVICES=all (or any NVIDIA_* knob) would let the container runtime
            # hand the pod GPUs it was never allocated
            for j, var in enumerate(container.get("env") or []):
                if str(var.get("name", "")).upper().startswith("NVIDIA_"):
                    problems.append(f"spec.template.spec.{kind}[{i}].env[{j}].name="
                                    f"{var.get('name')}")
            for j, source in enumerate(container.get("envFrom") or []):
                if str(source.get("prefix", "")).upper().startswith("NVIDIA_"):
                    problems.append(f"spec.template.spec.{kind}[{i}].envFrom[{j}].prefix")
            for j, mount in enumerate(container.get("volumeMounts") or []):
                if mount.get("mountPropagation") == "Bidirectional":
                    problems.append(f"spec.template.spec.{kind}[{i}].volumeMounts[{j}]"
                                    ".mountPropagation=Bidirectional")
    if problems:
        raise UnsafeManifestError(
            f"Job {name} breaks the pod security rules: {', '.join(problems)}")


# --- credentials -------------------------------------------------------------------------


def load_client_configuration(kubeconfig: str | None = None, context: str | None = None,
                              in_cluster: bool = False) -> kubernetes.client.Configuration:
    """The API client's configuration from a kubeconfig file (default ``~/.kube/config`` or
    ``$KUBECONFIG``) and context, or from the pod's service account when ``in_cluster`` (also
    when neither is named, none is found and the process runs in a pod). A failure is one
    ``PermanentError`` line saying where it looked."""
    from kubernetes import config as kube_config

    configuration = kubernetes.client.Configuration()
    try:
        if in_cluster:
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            try:
                kube_config.load_kube_config(config_file=kubeconfig, context=context,
                                             client_configuration=configuration)
            except (kube_config.ConfigException, OSError, TypeError):
                # no kubeconfig named and none found: inside a pod, its service account
                if kubeconfig is not None or context is not None or not os.environ.get(
                        "KUBERNETES_SERVICE_HOST"):
                    raise
                kube_config.load_incluster_config(client_configuration=configuration)
                in_cluster = True
    except (kube_config.ConfigException, OSError, TypeError) as exc:
        where = "in-cluster service account" if in_cluster else (
            f"kubeconfig {kubeconfig or '(default)'}" + (f" context {context}" if context
                                                         else ""))
        msg = " ".join(str(exc).split())
        raise PermanentError(f"cannot load Kubernetes config from {where}: {msg}") from None
    return configuration


# --- the adapter -------------------------------------------------------------------------


class KubernetesCluster:
    """``Cluster`` over ``batch/v1`` Jobs in one namespace (see the module docstring)."""

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
        multi-node unit's is an Indexed Job; its pods pinned to ``nodes`` when given."""
        name = self.job_name(unit_id, attempt)
        gang = spec.nodes > 1
        if gang and len(f"{name}-{spec.nodes - 1}") > _MAX_NAME:
            raise JobRejectedError(
                f"Job {name}: its pods' host names {name}-<index> would be longer than "
                f"{_MAX_NAME} characters; use a shorter job or step name")
        labels = {
            MANAGED_BY: MANAGER,
            LABEL_UNIT: label_value(unit_id),
            LABEL_TEAM: label_value(team),
            LABEL_ATTEMPT: str(attempt),
        }
        if self.instance:
            labels[LABEL_INSTANCE] = label_value(self.instance)
        annotations = {
            ANN_UNIT_ID: unit_id,
            ANN_TEAM: team,
            ANN_STEP: spec.step,
            ANN_CREATED_AT: _iso(now),
        }
        if stop_by is not None:
            annotations[ANN_STOP_BY] = _iso(stop_by)

        env = [{"name": k, "value": v} for k, v in spec.env]
        env += [_env_ref(ref) for ref in spec.env_refs]
        ours = {UNIT_ENV: unit_id, ATTEMPT_ENV: str(attempt)}
        if spec.output:
            ours[OUTPUT_ENV] = spec.output
        if spec.checkpointable and attempt > 1 and spec.resume_args:
            ours[RESUME_ENV] = " ".join(spec.resume_args)
        notice = spec.checkpointable and getattr(spec, "answers_notice", False)
        if notice:
            ours[NOTICE_FILE_ENV] = f"{NOTICE_DIR}/{NOTICE_FILE}"
            if self.job_api_url:
                ours[API_URL_ENV] = self.job_api_url
                ours[TOKEN_FILE_ENV] = f"{TOKEN_DIR}/token"
        taken = {e["name"] for e in env}
        env += [{"name": k, "value": v} for k, v in ours.items() if k not in taken]
        if gang:
            env += [var for var in _rendezvous_env(name, self.namespace, spec)
                    if var["name"] not in taken]

        if gang:
            from idlegpu.scheduler.specs import memory_per_node

            resources = {"cpu": _quantity_cpu(spec.cpu_per_node),
                         "memory": memory_per_node(spec)}
        else:
            resources = {"cpu": _quantity_cpu(spec.cpu), "memory": str(spec.memory)}
        if spec.gpus > 0:
            resources[GPU_RESOURCE] = str(int(spec.gpus_per_node))
        limits, requests = dict(resources), dict(resources)
        if spec.ephemeral_storage_limit is not None:
            limits["ephemeral-storage"] = str(spec.ephemeral_storage_limit)
            requests["ephemeral-storage"] = str(spec.ephemeral_storage_request
                                              or spec.ephemeral_storage_limit)
        container: dict[str, Any] = {
            "name": CONTAINER_NAME,
            "image": spec.image,
            "resources": {"limits": limits, "requests": requests},
            "env": env,
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "runAsNonRoot": True,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
        if spec.command:
            container["command"] = list(spec.command)
        if spec.args:
            container["args"] = list(spec.args)
        if spec.env_from:
            container["envFrom"] = [_env_from(source) for source in spec.env_from]
        if spec.volumes:
            container["volumeMounts"] = [_volume_mount(v) for v in spec.volumes]
        notice_volumes = self._notice_volumes() if notice else []
        if notice_volumes:
            container.setdefault("volumeMounts", []).extend(
                {"name": v["name"], "mountPath": NOTICE_DIR if v["name"] == NOTICE_VOLUME
                 else TOKEN_DIR, "readOnly": True} for v in notice_volumes)
        grace = self.grace_seconds if spec.checkpointable else self.non_checkpoint_grace_seconds
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
        }
        if spec.volumes or notice_volumes:
            pod_spec["volumes"] = [_volume(v, name) for v in spec.volumes] + notice_volumes
        if self.priority_class:
            pod_spec["priorityClassName"] = self.priority_class
        if self.node_selector:
            pod_spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            pod_spec["tolerations"] = copy.deepcopy(self.tolerations)
        if self.affinity:
            pod_spec["affinity"] = copy.deepcopy(self.affinity)
        if gang:
            pod_spec["subdomain"] = name
            pod_spec["affinity"] = _gang_affinity(pod_spec.get("affinity"), name, nodes)
        elif nodes:
            pod_spec["affinity"] = _pinned_affinity(pod_spec.get("affinity"), nodes)
        if self.service_account:
            pod_spec["serviceAccountName"] = self.service_account
        if self.run_as_user is not None:  # for images whose USER is root or unset
            pod_spec["securityContext"]["runAsUser"] = int(self.run_as_user)
        job_spec: dict[str, Any] = {
            "backoffLimit": self.backoff_limit,
            "completions": spec.nodes if gang else 1,
            "parallelism": spec.nodes if gang else 1,
            "podFailurePolicy": {"rules": [
                # the kube-scheduler's preemption, the Eviction API, taint eviction and our own
                # stops (stop() marks the pods before the suspend) are not failures of the job
                {"action": "Ignore",
                 "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                # any other failure of the container fails the Job at once, retries or not
                {"action": "FailJob",
                 "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "NotIn",
                                 "values": [0]}},
            ]},
            "template": {
                "metadata": {"labels": dict(labels), "annotations": {ANN_UNIT_ID: unit_id}},
                "spec": pod_spec,
            },
        }
        if gang:
            # a retry of one rank alone would only wait for the others: the attempt fails
            # whole (the FailJob rule), and the admitter's next attempt restarts the gang
            job_spec["completionMode"] = "Indexed"
            job_spec["backoffLimitPerIndex"] = self.backoff_limit
            job_spec["maxFailedIndexes"] = 0
            del job_spec["backoffLimit"]
        deadline = self.deadline_seconds(spec, stop_by, now)
        if deadline is not None:
            job_spec["activeDeadlineSeconds"] = deadline
        if self.ttl_seconds_after_finished is not None:
            job_spec["ttlSecondsAfterFinished"] = int(self.ttl_seconds_after_finished)
        manifest = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": job_spec,
        }
        check_pod_security(manifest)
        return manifest

    def _notice_volumes(self) -> list[dict[str, Any]]:
        """The volumes of a pod that answers checkpoint notices: its own annotation
        ``idlegpu.io/checkpoint-request`` as a file (the downward API; the kubelet rewrites it
        when the annotation changes, empty while there is none) and, when pods can reach the
        job API, a short-lived token bound to the pod for it (audience ``token_audience``):
        the only credential the pod has, good for acknowledging its own unit."""
        volumes: list[dict[str, Any]] = [{"name": NOTICE_VOLUME, "downwardAPI": {"items": [
            {"path": NOTICE_FILE,
             "fieldRef": {"fieldPath": f"metadata.annotations['{ANN_CHECKPOINT_REQUEST}']"}},
        ]}}]
        if self.job_api_url:
            volumes.append({"name": TOKEN_VOLUME, "projected": {"sources": [
                {"serviceAccountToken": {"audience": self.token_audience,
                                         "expirationSeconds": self.token_expiration_seconds,
                                         "path": "token"}}]}})
        return volumes

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

    def deadline_seconds(self, spec: UnitSpec, stop_by: datetime | None,
                         now: datetime) -> int | None:
        """``activeDeadlineSeconds``: the safety net if the daemon is not there to stop the Job.
        A Job with a planned stop is stopped by the daemon one grace period before ``stop_by``;
        the cluster ends it one grace period after (SIGTERM, then the pod's own grace period),
        so it never runs far into the service's ramp. Capped by ``active_deadline_seconds``."""
        deadline = self.active_deadline_seconds
        if stop_by is not None:
            grace = self.grace_seconds if spec.checkpointable else self.non_checkpoint_grace_seconds
            planned = max(60, math.ceil((stop_by - now).total_seconds()) + grace)
            deadline = planned if deadline is None else min(int(deadline), planned)
        return None if deadline is None else int(deadline)

    def service_manifest(self, job: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
        """The headless Service of a gang's Indexed Job ``job`` (its name, labels and pods),
        owned by the Job (``uid``: the Job's, when created) so it goes with it."""
        meta = job["metadata"]
        service: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": meta["name"], "namespace": self.namespace,
                         "labels": dict(meta["labels"]),
                         "annotations": {ANN_UNIT_ID: meta["annotations"][ANN_UNIT_ID]}},
            "spec": {
                "clusterIP": "None",
                "selector": {JOB_NAME_LABEL: meta["name"]},
                # the ranks must find each other before any of them is ready
                "publishNotReadyAddresses": True,
                "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT,
                           "targetPort": RENDEZVOUS_PORT, "protocol": "TCP"}],
            },
        }
        if uid:
            service["metadata"]["ownerReferences"] = [{
                "apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": uid,
                "blockOwnerDeletion": False}]
        return service

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
            labels = (pod.get("metadata") or {}).get("labels") or {}
            owner = next((labels[k] for k in JOB_NAME_LABELS if labels.get(k)), None)
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
        ``NoExecute`` without a toleration of our Jobs. Needs a ClusterRole with nodes list and pods list (deploy/role.yaml).
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
        wanted = {}
        for item in nodes:
            labels = (item.get("metadata") or {}).get("labels") or {}
            if all(labels.get(k) == v for k, v in self.node_selector.items()):
                wanted[item["metadata"]["name"]] = item
        pods = self._list_all(lambda **kw: self._core_api.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
            **kw), "pods")
        used: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in wanted}
        bound: set[str] = set()
        bound_at: set[tuple[str, str]] = set()
        for pod in pods:
            spec = pod.get("spec") or {}
            on = spec.get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if on not in used or phase in ("Succeeded", "Failed"):
                continue
            asks = _pod_requests(spec)
            for i, key in enumerate((GPU_RESOURCE, "cpu", "memory")):
                used[on][i] += asks.get(key, 0.0)
            labels = (pod.get("metadata") or {}).get("labels") or {}
            owner = next((labels[k] for k in JOB_NAME_LABELS if labels.get(k)), None)
            if owner:
                bound.add(owner)
                bound_at.add((owner, on))
        states = []
        for name, item in sorted(wanted.items()):
            status = item.get("status") or {}
            alloc = status.get("allocatable") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in status.get("conditions") or [])
            gpus, cpu, memory = used[name]
            labels = (item.get("metadata") or {}).get("labels") or {}
            states.append(NodeState(
                name=name, gpus=int(_quantity(alloc.get(GPU_RESOURCE, "0"))),
                cpu=_quantity(alloc.get("cpu", "0")), memory=int(_quantity(alloc.get(
                    "memory", "0"))),
                gpus_requested=math.ceil(gpus), cpu_requested=cpu, memory_requested=int(memory),
                labels=tuple(sorted(labels.items())),
                schedulable=not (item.get("spec") or {}).get("unschedulable", False)
                and all(_tolerated(taint, self.tolerations)
                        for taint in (item.get("spec") or {}).get("taints") or []),
                ready=ready))
        return NodeView(tuple(states), observed_at=now, bound_jobs=frozenset(bound),
                        bound_at=frozenset(bound_at))

    def _list_all(self, fn: Callable[..., Any], resource: str) -> list[dict[str, Any]]:
        """Every item of a (cluster-wide) list, 500 a page."""
        items: list[dict[str, Any]] = []
        token = None
        while True:
            more: dict[str, Any] = {"_continue": token} if token else {}
            body = self._call("list", lambda more=more, **kw: fn(limit=500, **more, **kw),
                              resource)
            items.extend(body.get("items") or [])
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return items

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
            f"Kubernetes API unavailable: {verb} {resource} in namespace {self.namespace} failed "
            f"after {attempts} attempt(s): {last[:300]}")

    def _error(self, verb: str, exc: ApiException, resource: str) -> Exception:
        message = _status_message(exc)
        if exc.status == 404:
            return _NotFound(message)
        if exc.status == 409 and verb == "create":
            return _Conflict(message)
        if exc.status == 401:
            return ClusterPermissionError(
                f"Kubernetes rejected the credentials for '{verb}' on {resource} in namespace "
                f"{self.namespace} (HTTP 401): {message or exc.reason}; check the kubeconfig "
                f"user or the service account token")
        if exc.status == 403:
            return ClusterPermissionError(
                f"Kubernetes denied '{verb}' on {resource} in namespace {self.namespace} "
                f"(HTTP {exc.status}): {message or exc.reason}; grant the idlegpu service "
                f"account the Role of deploy/role.yaml there (jobs.batch: get, list, create, "
                f"patch, delete; pods: get, list; pods/status: patch; services: create, "
                f"delete)")
        fields = _status_fields(exc)
        what = f" (fields: {', '.join(fields)})" if fields else ""
        return ClusterRejectedError(
            f"Kubernetes rejected '{verb}' on {resource} in namespace {self.namespace} "
            f"(HTTP {exc.status}){what}: {message or exc.reason}",
            status=exc.status or 0, fields=fields)


class _NotFound(Exception):
    pass


class _Conflict(Exception):
    pass


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


def _conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {}
    for cond in (job.get("status") or {}).get("conditions") or []:
        if str(cond.get("status")) == "True":
            found[cond.get("type")] = cond
    return found


def _finished_condition(job: dict[str, Any]) -> dict[str, Any] | None:
    conds = _conditions(job)
    return conds.get("Complete") or conds.get("Failed")


_SUFFIXES = {
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "P": 1e15, "E": 1e18, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
    "Pi": 2.0**50, "Ei": 2.0**60,
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]*)$")


def _quantity(value: Any) -> float:
    """A Kubernetes quantity as the API server returns it (``"96"``, ``"500m"``,
    ``"1056276Ki"``, ``"1e3"``) as a number; unreadable: 0."""
    match = _QUANTITY.fullmatch(str(value).strip())
    if not match or match.group(2) not in _SUFFIXES:
        return 0.0
    return float(match.group(1)) * _SUFFIXES[match.group(2)]


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    """Whether our Jobs' pods may be scheduled on a node with ``taint``: a ``PreferNoSchedule``
    taint never keeps them off; ``NoSchedule`` and ``NoExecute`` ones only with a matching
    toleration (same key, or none with ``Exists``; ``Equal`` also compares the value; no
    effect tolerates every effect)."""
    effect = taint.get("effect")
    if effect == "PreferNoSchedule":
        return True
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != effect:
            continue
        key = tol.get("key")
        if (tol.get("operator") or "Equal") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _pod_requests(spec: dict[str, Any]) -> dict[str, float]:
    """What a pod requests of a node, as the kube-scheduler counts it: the sum over its
    containers (a request not set: its limit, as for extended resources), at least the
    largest init container's, plus the pod's overhead."""
    def asks(container: dict[str, Any]) -> dict[str, float]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: _quantity(v) for k, v in merged.items()}

    total: dict[str, float] = {}
    for container in spec.get("containers") or []:
        for key, value in asks(container).items():
            total[key] = total.get(key, 0.0) + value
    for container in spec.get("initContainers") or []:
        for key, value in asks(container).items():
            total[key] = max(total.get(key, 0.0), value)
    for key, value in (spec.get("overhead") or {}).items():
        total[key] = total.get(key, 0.0) + _quantity(value)
    return total


def _pod_holds_gpus(pod: dict[str, Any]) -> bool:
    """A pod not yet ended holds its node's GPUs, even once deleted (its grace period, or a
    dead node that never confirms the end)."""
    return ((pod.get("status") or {}).get("phase") or "Pending") not in ("Succeeded", "Failed")


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and str(c.get("status")) == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _container_start(pod: dict[str, Any]) -> datetime | None:
    """When the job's container started (running, or ran and ended), on the server's clock."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != CONTAINER_NAME:
            continue
        state = cs.get("state") or {}
        for key in ("running", "terminated"):
            started = _parse_time((state.get(key) or {}).get("startedAt"))
            if started is not None:
                return started
    return None


def _phase(job: dict[str, Any], pods: list[dict[str, Any]] | None) -> tuple[JobPhase, str]:
    """The Job's phase for the controller. ``pods`` (None: not readable) decides when a
    stopped Job is really stopped: a suspended Job reports ``Suspended`` before its pods are
    gone, and pods still terminating hold their GPUs."""
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    conds = _conditions(job)
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    stopped = annotations.get(ANN_STOP_KIND)
    completions = int(spec.get("completions") or 1)
    if (status.get("succeeded") or 0) >= completions or "Complete" in conds:
        return JobPhase.SUCCEEDED, (conds.get("Complete") or {}).get("message", "")
    if "Failed" in conds:
        cond = conds["Failed"]
        text = f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
        if stopped:
            # our stop ended it: its pods could not be marked (no pods/status grant, or one
            # ended before the mark), and their exit 143 matched the FailJob rule
            return JobPhase.DISRUPTED, f"stopped ({stopped}), then the Job ended: {text}"
        if cond.get("reason") == "DeadlineExceeded" and ANN_STOP_BY in annotations:
            # the safety net of a planned stop fired (the daemon was not there): a stop, not a
            # failure of the job; the work since its last checkpoint may be lost
            return JobPhase.DISRUPTED, (f"stopped by activeDeadlineSeconds at its planned stop "
                                        f"({annotations[ANN_STOP_BY]}): {text}")
        if "DisruptionTarget" in text or cond.get("reason") in ("PreemptionByScheduler",
                                                               "EvictionByEvictionAPI"):
            return JobPhase.DISRUPTED, text
        return JobPhase.FAILED, text
    if spec.get("suspend") or "Suspended" in conds:
        holding = status.get("terminating") or 0
        if pods is not None:
            holding = max(holding, sum(1 for pod in pods if _pod_holds_gpus(pod)))
        else:
            holding = max(holding, status.get("active") or 0)
        if holding:
            return JobPhase.STOPPING, f"stopping: {holding} pod(s) still terminating"
        return JobPhase.SUSPENDED, annotations.get(ANN_STOP_REASON) or (
            conds.get("Suspended") or {}).get("message", "")
    ready = status.get("ready")
    active = status.get("active") or 0
    if completions > 1:  # a gang runs once every pod runs; until then it waits, whole
        live = [pod for pod in pods or () if _pod_holds_gpus(pod)]
        running = max(ready or 0, sum(1 for pod in live if _pod_ready(pod)))
        if running + (status.get("succeeded") or 0) >= completions:  # ranks may end early
            return JobPhase.RUNNING, ""
        bound = sum(1 for pod in live if (pod.get("spec") or {}).get("nodeName"))
        return JobPhase.PENDING, (f"{running} of {completions} pods running, {bound} placed"
                                  if active or live else "")
    if (ready or 0) > 0 or any(_pod_ready(pod) for pod in pods or ()):
        return JobPhase.RUNNING, ""
    if active > 0 and ready is None:  # a server older than status.ready (1.24)
        return JobPhase.RUNNING, ""
    if active > 0:
        return JobPhase.PENDING, "pod not ready yet"
    return JobPhase.PENDING, ""


def _gpus(job: dict[str, Any]) -> int:
    pod = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    total = 0
    for container in pod.get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        try:
            total += int(str(limits.get(GPU_RESOURCE, 0)))
        except ValueError:
            pass
    return total * int((job.get("spec") or {}).get("parallelism") or 1)


def _clock_offset(meta: dict[str, Any]) -> timedelta:
    """Daemon clock minus server clock, from the Job's creation: the daemon wrote its own time
    of creation (``created-at``), the server its ``creationTimestamp``. A replayed daemon
    (``--now``) and a server with a skewed clock both come out on the daemon's clock."""
    ours = _parse_time((meta.get("annotations") or {}).get(ANN_CREATED_AT))
    theirs = _parse_time(meta.get("creationTimestamp"))
    if ours is None or theirs is None:
        return timedelta(0)
    return ours - theirs


def _to_cluster_job(job: dict[str, Any],
                    pods: list[dict[str, Any]] | None = None) -> ClusterJob | None:
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    unit_id = annotations.get(ANN_UNIT_ID) or labels.get(LABEL_UNIT)
    if not unit_id or not meta.get("name"):
        return None
    try:
        attempt = int(labels.get(LABEL_ATTEMPT, "0"))
    except ValueError:
        attempt = 0
    phase, message = _phase(job, pods)
    status = job.get("status") or {}
    finished = _parse_time(status.get("completionTime"))
    if finished is None and phase in (JobPhase.FAILED, JobPhase.DISRUPTED):
        finished = _parse_time((_conditions(job).get("Failed") or {}).get("lastTransitionTime"))
    offset = _clock_offset(meta)
    # the newest pod's container start: when this attempt's work really began
    starts = sorted((p.get("metadata", {}).get("creationTimestamp") or "", start)
                    for p in pods or () if (start := _container_start(p)) is not None)
    started = starts[-1][1] if starts else None
    stop_kind = annotations.get(ANN_STOP_KIND)
    try:
        kind = StopKind(stop_kind) if stop_kind else None
    except ValueError:  # written by a newer idlegpu: a stop all the same
        kind = StopKind.PREEMPT
    return ClusterJob(
        name=meta["name"],
        unit_id=unit_id,
        attempt=attempt,
        phase=phase,
        gpus=_gpus(job),
        created_at=_parse_time(annotations.get(ANN_CREATED_AT)) or _parse_time(
            meta.get("creationTimestamp")),
        started_at=None if started is None else started + offset,
        finished_at=None if finished is None else finished + offset,
        message=" ".join(str(message).split()),
        stop_kind=kind,
        stopped_at=_parse_time(annotations.get(ANN_STOPPED_AT)),
        pods=int((job.get("spec") or {}).get("parallelism") or 1),
        pods_bound=sum(1 for p in pods or () if _pod_holds_gpus(p)
                       and (p.get("spec") or {}).get("nodeName")),
    )
