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

The package: ``names`` (labels, annotations, Job names), ``errors``, ``manifests`` (the Job,
its pods and a gang's Service, built without a client), ``security`` (the pod security rules),
``status`` (a Job and its pods read into a ``ClusterJob``), ``nodes`` (the ``NodeView``),
``credentials`` (the client's configuration) and ``client`` (``KubernetesCluster``, the calls
to the API server). Only ``client`` and ``credentials`` import ``kubernetes``; with
``scheduler/adapters/lease.py`` (leader election) and the job API's TokenReview they are the
only modules allowed to (see the import-linter contracts). Everything is imported from here.
"""

from __future__ import annotations

from idlegpu.scheduler.adapters.kubernetes.client import KubernetesCluster
from idlegpu.scheduler.adapters.kubernetes.credentials import load_client_configuration
from idlegpu.scheduler.adapters.kubernetes.errors import (
    ClusterPermissionError,
    ClusterRejectedError,
    ClusterUnavailableError,
    JobConflictError,
    UnsafeManifestError,
)
from idlegpu.scheduler.adapters.kubernetes.names import (
    ANN_CHECKPOINT_REASON,
    ANN_CHECKPOINT_REQUEST,
    ANN_CREATED_AT,
    ANN_STEP,
    ANN_STOP_BY,
    ANN_STOP_KIND,
    ANN_STOP_REASON,
    ANN_STOPPED_AT,
    ANN_TEAM,
    ANN_UNIT_ID,
    API_URL_ENV,
    ATTEMPT_ENV,
    CONTAINER_NAME,
    DISRUPTION_REASON,
    GPU_RESOURCE,
    INDEX_ANNOTATION,
    JOB_NAME_LABEL,
    JOB_NAME_LABELS,
    JOBSET_GROUP,
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
    SELECTOR,
    TOKEN_DIR,
    TOKEN_FILE_ENV,
    TOKEN_VOLUME,
    UNIT_ENV,
    job_name,
    label_value,
)
from idlegpu.scheduler.adapters.kubernetes.nodes import _pod_requests, _quantity, _tolerated
from idlegpu.scheduler.adapters.kubernetes.security import check_pod_security

__all__ = [
    "ANN_CHECKPOINT_REASON",
    "ANN_CHECKPOINT_REQUEST",
    "ANN_CREATED_AT",
    "ANN_STEP",
    "ANN_STOPPED_AT",
    "ANN_STOP_BY",
    "ANN_STOP_KIND",
    "ANN_STOP_REASON",
    "ANN_TEAM",
    "ANN_UNIT_ID",
    "API_URL_ENV",
    "ATTEMPT_ENV",
    "CONTAINER_NAME",
    "DISRUPTION_REASON",
    "GPU_RESOURCE",
    "INDEX_ANNOTATION",
    "JOBSET_GROUP",
    "JOB_NAME_LABEL",
    "JOB_NAME_LABELS",
    "LABEL_ATTEMPT",
    "LABEL_INSTANCE",
    "LABEL_TEAM",
    "LABEL_UNIT",
    "MANAGED_BY",
    "MANAGER",
    "NOTICE_DIR",
    "NOTICE_FILE",
    "NOTICE_FILE_ENV",
    "NOTICE_VOLUME",
    "OUTPUT_ENV",
    "RENDEZVOUS_PORT",
    "RESUME_ENV",
    "SELECTOR",
    "TOKEN_DIR",
    "TOKEN_FILE_ENV",
    "TOKEN_VOLUME",
    "UNIT_ENV",
    "ClusterPermissionError",
    "ClusterRejectedError",
    "ClusterUnavailableError",
    "JobConflictError",
    "KubernetesCluster",
    "UnsafeManifestError",
    "_pod_requests",
    "_quantity",
    "_tolerated",
    "check_pod_security",
    "job_name",
    "label_value",
    "load_client_configuration",
]
