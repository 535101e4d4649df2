"""Users' own suspended ``batch/v1`` Jobs as idlegpu's policy sees them, without Kueue.

Pure: no I/O, no clock. A researcher creates a Job with ``spec.suspend: true`` and the label
``idlegpu.io/queue: <pool>`` in a namespace the operator allows (``cluster.native_jobs``);
Kubernetes RBAC is the boundary: whoever may create Jobs there may queue them. The daemon's
adapter lists those Jobs; here each becomes a unit for ``decide()``:

* a suspended Job that never ran, or that idlegpu stopped, waits (``WaitingJob``);
* a Job idlegpu unsuspended (the annotation ``idlegpu.io/admitted-at``) holds its GPUs
  (``RunningJob``) until it ends or idlegpu suspends it again;
* a Job that ended (``Complete``/``Failed``) is nobody's concern any more;
* a Job refused once (``idlegpu.io/refused``) stays refused until its owner changes it (the
  annotation is removed with the fix, or the Job is created anew).

A Job unsuspended by somebody else is not idlegpu's: it is left alone and not counted (the
live signals still see its GPUs). Back the other way, an admission unsuspends the Job and a
stop suspends it (the pods get SIGTERM and their grace period, as for idlegpu's own Jobs).

The runtime it is planned with: ``idlegpu.io/runtime-estimate`` on the Job ("2h"), else
``spec.activeDeadlineSeconds``, else the runtime model of its image and step. An Indexed Job
of N pods at once is a gang (one pod a node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from idlegpu.scheduler.kube_objects import (
    CHECKPOINTABLE_ANNOTATION,
    GPU_RESOURCE,
    RUNTIME_ANNOTATION,
    STEP_LABEL,
    family_unit_spec,
    rfc3339,
    whole,
)
from idlegpu.scheduler.specs.checks import check_image
from idlegpu.scheduler.specs.quantities import parse_duration
from idlegpu.scheduler.types import RunningJob, UnitSpec, WaitingJob

QUEUE_LABEL = "idlegpu.io/queue"
ADMITTED_ANNOTATION = "idlegpu.io/admitted-at"
"""Set by idlegpu when it unsuspends the Job (RFC 3339); removed when it suspends it."""
REFUSED_ANNOTATION = "idlegpu.io/refused"
"""Set by idlegpu on a Job it will not run: the field at fault and the fix."""


class NativeJobError(ValueError):
    """A Job that cannot be a unit: the field at fault, and why."""


@dataclass(frozen=True)
class NativeJob:
    """A user's Job queued on idlegpu, as far as the policy needs it."""

    namespace: str
    name: str
    uid: str
    gpus: int
    pods: int
    suspended: bool
    active: int
    """Pods not ended yet (``status.active``): a suspended Job's pods still terminating."""
    finished: bool
    created_at: datetime
    admitted_at: datetime | None
    refused: str
    image: str
    step: str
    runtime_s: float | None
    """Its own runtime: the ``idlegpu.io/runtime-estimate`` annotation, else
    ``spec.activeDeadlineSeconds``; None: the runtime model's."""
    checkpointable: bool
    priority: int = 0

    @property
    def id(self) -> str:
        """The unit id: ``job/<namespace>/<name>``."""
        return f"job/{self.namespace}/{self.name}"

    @property
    def ours(self) -> bool:
        """Unsuspended by idlegpu (holding its GPUs on our account)."""
        return self.admitted_at is not None


def _time(text: Any, field: str) -> datetime:
    return rfc3339(text, field, NativeJobError)


def _count(value: Any, field: str) -> int:
    return whole(value, field, NativeJobError)


def _container_gpus(pod: Mapping[str, Any]) -> int:
    gpus = 0
    for n, container in enumerate(pod.get("containers") or ()):
        resources = (container.get("resources") or {}) if isinstance(container, Mapping) else {}
        asked = ((resources.get("limits") or {}).get(GPU_RESOURCE)
                 or (resources.get("requests") or {}).get(GPU_RESOURCE) or 0)
        gpus += _count(asked, f"spec.template.spec.containers[{n}].resources.limits"
                              f"[{GPU_RESOURCE}]")
    return gpus


def _finished(status: Mapping[str, Any]) -> bool:
    return any(isinstance(c, Mapping) and c.get("type") in ("Complete", "Failed")
               and c.get("status") == "True" for c in status.get("conditions") or ())


def native_job(obj: Mapping[str, Any]) -> NativeJob:
    """``obj`` (a Job as the API returns it, listed by its queue label) as a unit; a Job
    whose fields make no unit raises ``NativeJobError`` naming the field."""
    if not isinstance(obj, Mapping):
        raise NativeJobError("the Job is not an object")
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        raise NativeJobError("metadata.name and metadata.namespace: both are needed")
    annotations = meta.get("annotations") or {}
    template = spec.get("template") or {}
    pod = template.get("spec") or {}
    pods = _count(spec.get("parallelism", 1), "spec.parallelism")
    if pods < 1:
        raise NativeJobError("spec.parallelism: at least 1 pod runs at once")
    if pods > 1 and spec.get("completionMode") != "Indexed":
        raise NativeJobError("spec.parallelism: several pods at once only in an Indexed Job "
                             "(completionMode: Indexed), which idlegpu runs as a gang")
    gpus = pods * _container_gpus(pod)
    runtime_s: float | None = None
    text = annotations.get(RUNTIME_ANNOTATION)
    if text is not None:
        try:
            runtime_s = parse_duration(str(text)[:40])
        except ValueError as exc:
            raise NativeJobError(f"metadata.annotations[{RUNTIME_ANNOTATION}]: {exc}") from None
    elif spec.get("activeDeadlineSeconds") is not None:
        runtime_s = float(_count(spec["activeDeadlineSeconds"], "spec.activeDeadlineSeconds"))
    containers = pod.get("containers") or ()
    first = containers[0] if containers and isinstance(containers[0], Mapping) else {}
    admitted = annotations.get(ADMITTED_ANNOTATION)
    return NativeJob(
        namespace=namespace, name=name, uid=str(meta.get("uid") or ""), gpus=gpus, pods=pods,
        suspended=spec.get("suspend") is True,
        active=_count(status.get("active", 0), "status.active"),
        finished=_finished(status),
        created_at=_time(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        admitted_at=(_time(admitted, f"metadata.annotations[{ADMITTED_ANNOTATION}]")
                     if admitted else None),
        refused=str(annotations.get(REFUSED_ANNOTATION) or "")[:1024],
        image=str(first.get("image") or "")[:512],
        step=str((meta.get("labels") or {}).get(STEP_LABEL) or first.get("name") or "main")[:63],
        runtime_s=runtime_s,
        checkpointable=str(annotations.get(CHECKPOINTABLE_ANNOTATION, "")).lower() == "true",
    )


def job_problems(job: NativeJob, *, allowed_registries: Sequence[str], max_gpus: int,
                 pool_gpus: int) -> list[str]:
    """Why the Job cannot run as a research unit (each naming the field and the fix), by the
    rules a request is held to; empty: it may queue. The pod security rules are the
    adapter's (``check_pod_security``, on the whole manifest)."""
    problems: list[str] = []
    try:
        check_image(job.image, allowed_registries)
    except ValueError as exc:
        problems.append(f"spec.template.spec.containers[0].image: {exc}")
    if job.gpus < 1:
        problems.append(f"spec.template.spec.containers[].resources.limits[{GPU_RESOURCE}]: a "
                        "research Job asks for at least 1 GPU")
    limit = min(max_gpus, pool_gpus) if pool_gpus else max_gpus
    if job.gpus > limit:
        problems.append(f"spec.template.spec.containers[].resources.limits[{GPU_RESOURCE}]: "
                        f"{job.gpus} GPUs; at most {limit} a job here")
    if job.pods > 1 and job.gpus % job.pods:
        problems.append("spec.parallelism: every pod of a gang asks for the same GPUs")
    return problems


def native_unit_spec(job: NativeJob) -> UnitSpec:
    """The Job as a unit for the runtime model (``kube_objects.family_unit_spec``)."""
    return family_unit_spec(step=job.step, image=job.image, gpus=job.gpus,
                            runtime_estimate_s=job.runtime_s,
                            checkpointable=job.checkpointable, priority=job.priority, kind="job")


def native_units(jobs: Sequence[NativeJob], now: datetime, runtime_s: Mapping[str, float],
                 team_of: Mapping[str, str] | None = None,
                 ) -> tuple[list[WaitingJob], list[RunningJob]]:
    """The queue and the running units ``decide()`` reads (module docstring). ``runtime_s``:
    each unit's planned seconds; one without is left out."""
    teams = team_of or {}
    queue: list[WaitingJob] = []
    running: list[RunningJob] = []
    for job in sorted(jobs, key=lambda j: j.id):
        seconds = runtime_s.get(job.id)
        if job.finished or job.refused or seconds is None or not seconds > 0:
            continue
        team = teams.get(job.namespace, job.namespace)
        nodes = max(1, job.pods)
        if job.ours and not job.suspended:
            started = job.admitted_at or now
            running.append(RunningJob(
                id=job.id, team=team, gpus=job.gpus, priority=job.priority, started_at=started,
                checkpointable=job.checkpointable, kind="job",
                remaining_s=max(0.0, seconds - (now - started).total_seconds())))
        elif job.suspended and job.active == 0:
            queue.append(WaitingJob(
                id=job.id, team=team, gpus=job.gpus, runtime_s=seconds,
                checkpointable=job.checkpointable, priority=job.priority,
                submitted_at=job.created_at, kind="job", nodes=nodes))
    return queue, running


__all__ = ["ADMITTED_ANNOTATION", "CHECKPOINTABLE_ANNOTATION", "QUEUE_LABEL",
           "REFUSED_ANNOTATION", "RUNTIME_ANNOTATION", "NativeJob", "NativeJobError",
           "job_problems", "native_job", "native_unit_spec", "native_units"]
