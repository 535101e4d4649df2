"""The Kubernetes objects of a unit's attempt, built without a client or any I/O: the
``batch/v1`` Job (``job_manifest``; a gang's an Indexed Job), its pod's container, volumes,
environment and placement, the checkpoint-notice volumes, the safety-net
``activeDeadlineSeconds`` and a gang's headless Service (``service_manifest``). Same inputs,
same dicts; every Job is checked against the pod security rules before it is returned.
``KubernetesCluster`` (``client``) sends what this builds."""

from __future__ import annotations

import copy
import math
from datetime import datetime
from typing import Any, Protocol

from idlegpu.scheduler.adapters.kubernetes.errors import UnsafeManifestError
from idlegpu.scheduler.adapters.kubernetes.names import (
    _MAX_NAME,
    ANN_CHECKPOINT_REQUEST,
    ANN_CREATED_AT,
    ANN_STEP,
    ANN_STOP_BY,
    ANN_TEAM,
    ANN_UNIT_ID,
    API_URL_ENV,
    ATTEMPT_ENV,
    CONTAINER_NAME,
    GPU_RESOURCE,
    INDEX_ANNOTATION,
    JOB_NAME_LABEL,
    LABEL_ATTEMPT,
    LABEL_INSTANCE,
    LABEL_TEAM,
    LABEL_UNIT,
    MANAGED_BY,
    MANAGER,
    NOTICE_DIR,
    NOTICE_FILE,
    NOTICE_FILE_ENV,
    NOTICE_VOLUME,
    OUTPUT_ENV,
    RENDEZVOUS_PORT,
    RESUME_ENV,
    TOKEN_DIR,
    TOKEN_FILE_ENV,
    TOKEN_VOLUME,
    UNIT_ENV,
    _iso,
    job_name,
    label_value,
)
from idlegpu.scheduler.adapters.kubernetes.security import check_pod_security
from idlegpu.scheduler.ports import JobRejectedError
from idlegpu.scheduler.specs import memory_per_node
from idlegpu.scheduler.types import EnvFromSource, EnvKeyRef, UnitSpec, UnitVolume


class JobSettings(Protocol):
    """What the manifests take of the adapter's configuration, read at each call
    (``KubernetesCluster`` has every one of these attributes)."""

    @property
    def namespace(self) -> str: ...
    @property
    def instance(self) -> str | None: ...
    @property
    def node_selector(self) -> dict[str, str]: ...
    @property
    def tolerations(self) -> list[dict[str, Any]]: ...
    @property
    def affinity(self) -> dict[str, Any] | None: ...
    @property
    def priority_class(self) -> str | None: ...
    @property
    def grace_seconds(self) -> int: ...
    @property
    def non_checkpoint_grace_seconds(self) -> int: ...
    @property
    def active_deadline_seconds(self) -> int | None: ...
    @property
    def backoff_limit(self) -> int: ...
    @property
    def service_account(self) -> str | None: ...
    @property
    def run_as_user(self) -> int | None: ...
    @property
    def ttl_seconds_after_finished(self) -> int | None: ...
    @property
    def job_api_url(self) -> str | None: ...
    @property
    def token_audience(self) -> str: ...
    @property
    def token_expiration_seconds(self) -> int: ...


# --- quantities, volumes and references ------------------------------------------------------


def _quantity_cpu(cpu: float) -> str:
    if cpu <= 0:
        raise ValueError(f"cpu must be positive, not {cpu}")
    if float(cpu).is_integer():
        return str(int(cpu))
    return f"{max(1, round(cpu * 1000))}m"


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


# --- the Job -------------------------------------------------------------------------------


def job_manifest(settings: JobSettings, unit_id: str, attempt: int, spec: UnitSpec, team: str,
                 stop_by: datetime | None, now: datetime,
                 nodes: tuple[str, ...] | list[str] | None = None) -> dict[str, Any]:
    """The attempt's ``batch/v1`` Job (pure: same inputs, same dict), security-checked; a
    multi-node unit's is an Indexed Job; its pods pinned to ``nodes`` when given."""
    name = job_name(unit_id, attempt)
    gang = spec.nodes > 1
    if gang and len(f"{name}-{spec.nodes - 1}") > _MAX_NAME:
        raise JobRejectedError(
            f"Job {name}: its pods' host names {name}-<index> would be longer than "
            f"{_MAX_NAME} characters; use a shorter job or step name")
    labels, annotations = _job_metadata(settings, unit_id, attempt, spec, team, stop_by, now)
    notice = spec.checkpointable and getattr(spec, "answers_notice", False)
    env = _container_env(settings, name, unit_id, attempt, spec, notice)
    container = _container(spec, env, gang)
    volumes = notice_volumes(settings) if notice else []
    if volumes:
        container.setdefault("volumeMounts", []).extend(
            {"name": v["name"], "mountPath": NOTICE_DIR if v["name"] == NOTICE_VOLUME
             else TOKEN_DIR, "readOnly": True} for v in volumes)
    pod_spec = _pod_spec(settings, name, spec, container, volumes, nodes)
    job_spec = _job_spec(settings, unit_id, spec, labels, pod_spec, stop_by, now)
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": job_spec,
    }
    check_pod_security(manifest)
    return manifest


def _job_metadata(settings: JobSettings, unit_id: str, attempt: int, spec: UnitSpec, team: str,
                  stop_by: datetime | None,
                  now: datetime) -> tuple[dict[str, str], dict[str, str]]:
    """The Job's labels (what selectors match: ours, the unit, team, attempt, instance) and
    annotations (the exact unit id and team, the step, when created, the planned stop)."""
    labels = {
        MANAGED_BY: MANAGER,
        LABEL_UNIT: label_value(unit_id),
        LABEL_TEAM: label_value(team),
        LABEL_ATTEMPT: str(attempt),
    }
    if settings.instance:
        labels[LABEL_INSTANCE] = label_value(settings.instance)
    annotations = {
        ANN_UNIT_ID: unit_id,
        ANN_TEAM: team,
        ANN_STEP: spec.step,
        ANN_CREATED_AT: _iso(now),
    }
    if stop_by is not None:
        annotations[ANN_STOP_BY] = _iso(stop_by)
    return labels, annotations


def _container_env(settings: JobSettings, name: str, unit_id: str, attempt: int,
                   spec: UnitSpec, notice: bool) -> list[dict[str, Any]]:
    """The container's environment: the unit's own variables and references, then ours (unit,
    attempt, output, resume arguments, the notice file and job API), then a gang's rendezvous
    variables; a name the unit set itself is never set again."""
    env = [{"name": k, "value": v} for k, v in spec.env]
    env += [_env_ref(ref) for ref in spec.env_refs]
    ours = {UNIT_ENV: unit_id, ATTEMPT_ENV: str(attempt)}
    if spec.output:
        ours[OUTPUT_ENV] = spec.output
    if spec.checkpointable and attempt > 1 and spec.resume_args:
        ours[RESUME_ENV] = " ".join(spec.resume_args)
    if notice:
        ours[NOTICE_FILE_ENV] = f"{NOTICE_DIR}/{NOTICE_FILE}"
        if settings.job_api_url:
            ours[API_URL_ENV] = settings.job_api_url
            ours[TOKEN_FILE_ENV] = f"{TOKEN_DIR}/token"
    taken = {e["name"] for e in env}
    env += [{"name": k, "value": v} for k, v in ours.items() if k not in taken]
    if spec.nodes > 1:
        env += [var for var in _rendezvous_env(name, settings.namespace, spec)
                if var["name"] not in taken]
    return env


def _resources(spec: UnitSpec, gang: bool) -> tuple[dict[str, str], dict[str, str]]:
    """The container's ``limits`` and ``requests``: a gang's per node; GPUs and ephemeral
    storage when the unit asks for them."""
    if gang:
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
    return limits, requests


def _container(spec: UnitSpec, env: list[dict[str, Any]], gang: bool) -> dict[str, Any]:
    """The Job's one container (image, command, resources, environment, the unit's mounts),
    unprivileged."""
    limits, requests = _resources(spec, gang)
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
    return container


def _pod_spec(settings: JobSettings, name: str, spec: UnitSpec, container: dict[str, Any],
              notice_volumes: list[dict[str, Any]],
              nodes: tuple[str, ...] | list[str] | None) -> dict[str, Any]:
    """The pod template's spec: never restarted, its grace period, no service-account token
    mounted, non-root, the unit's and the notice's volumes, the cluster's placement (priority
    class, node selector, tolerations, affinity) with a gang's or a pinned pod's own rules."""
    grace = (settings.grace_seconds if spec.checkpointable
             else settings.non_checkpoint_grace_seconds)
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
    if settings.priority_class:
        pod_spec["priorityClassName"] = settings.priority_class
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(settings.tolerations)
    if settings.affinity:
        pod_spec["affinity"] = copy.deepcopy(settings.affinity)
    if spec.nodes > 1:
        pod_spec["subdomain"] = name
        pod_spec["affinity"] = _gang_affinity(pod_spec.get("affinity"), name, nodes)
    elif nodes:
        pod_spec["affinity"] = _pinned_affinity(pod_spec.get("affinity"), nodes)
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.run_as_user is not None:  # for images whose USER is root or unset
        pod_spec["securityContext"]["runAsUser"] = int(settings.run_as_user)
    return pod_spec


def _job_spec(settings: JobSettings, unit_id: str, spec: UnitSpec, labels: dict[str, str],
              pod_spec: dict[str, Any], stop_by: datetime | None,
              now: datetime) -> dict[str, Any]:
    """The Job's spec: one pod (a gang: one per node, Indexed), the ``podFailurePolicy``, the
    pod template, the safety-net deadline and the TTL after it finished."""
    gang = spec.nodes > 1
    job_spec: dict[str, Any] = {
        "backoffLimit": settings.backoff_limit,
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
        job_spec["backoffLimitPerIndex"] = settings.backoff_limit
        job_spec["maxFailedIndexes"] = 0
        del job_spec["backoffLimit"]
    deadline = deadline_seconds(settings, spec, stop_by, now)
    if deadline is not None:
        job_spec["activeDeadlineSeconds"] = deadline
    if settings.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = int(settings.ttl_seconds_after_finished)
    return job_spec


def notice_volumes(settings: JobSettings) -> list[dict[str, Any]]:
    """The volumes of a pod that answers checkpoint notices: its own annotation
    ``idlegpu.io/checkpoint-request`` as a file (the downward API; the kubelet rewrites it
    when the annotation changes, empty while there is none) and, when pods can reach the
    job API, a short-lived token bound to the pod for it (audience ``token_audience``):
    the only credential the pod has, good for acknowledging its own unit."""
    volumes: list[dict[str, Any]] = [{"name": NOTICE_VOLUME, "downwardAPI": {"items": [
        {"path": NOTICE_FILE,
         "fieldRef": {"fieldPath": f"metadata.annotations['{ANN_CHECKPOINT_REQUEST}']"}},
    ]}}]
    if settings.job_api_url:
        volumes.append({"name": TOKEN_VOLUME, "projected": {"sources": [
            {"serviceAccountToken": {"audience": settings.token_audience,
                                     "expirationSeconds": settings.token_expiration_seconds,
                                     "path": "token"}}]}})
    return volumes


def deadline_seconds(settings: JobSettings, spec: UnitSpec, stop_by: datetime | None,
                     now: datetime) -> int | None:
    """``activeDeadlineSeconds``: the safety net if the daemon is not there to stop the Job.
    A Job with a planned stop is stopped by the daemon one grace period before ``stop_by``;
    the cluster ends it one grace period after (SIGTERM, then the pod's own grace period),
    so it never runs far into the service's ramp. Capped by ``active_deadline_seconds``."""
    deadline = settings.active_deadline_seconds
    if stop_by is not None:
        grace = (settings.grace_seconds if spec.checkpointable
                 else settings.non_checkpoint_grace_seconds)
        planned = max(60, math.ceil((stop_by - now).total_seconds()) + grace)
        deadline = planned if deadline is None else min(int(deadline), planned)
    return None if deadline is None else int(deadline)


# --- a gang's Service ---------------------------------------------------------------------


def service_manifest(namespace: str, job: dict[str, Any],
                     uid: str | None = None) -> dict[str, Any]:
    """The headless Service of a gang's Indexed Job ``job`` (its name, labels and pods),
    owned by the Job (``uid``: the Job's, when created) so it goes with it."""
    meta = job["metadata"]
    service: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": meta["name"], "namespace": namespace,
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
