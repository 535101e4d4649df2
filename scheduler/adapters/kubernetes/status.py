"""Reading a Job and its pods as the API server reports them into the project's types: the
Job's phase for the controller (``_phase``: a suspended Job whose pods still terminate is
``STOPPING``, a gang is ``RUNNING`` once every rank runs, a stop that ended Failed is still our
stop) and its ``ClusterJob`` (``_to_cluster_job``), with server times mapped onto the daemon's
clock. Pure: no client, no I/O."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from idlegpu.scheduler.adapters.kubernetes.names import (
    ANN_CREATED_AT,
    ANN_STOP_BY,
    ANN_STOP_KIND,
    ANN_STOP_REASON,
    ANN_STOPPED_AT,
    ANN_UNIT_ID,
    CONTAINER_NAME,
    GPU_RESOURCE,
    LABEL_ATTEMPT,
    LABEL_UNIT,
    _parse_time,
)
from idlegpu.scheduler.ports import ClusterJob, JobPhase, StopKind


def _conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {}
    for cond in (job.get("status") or {}).get("conditions") or []:
        if str(cond.get("status")) == "True":
            found[cond.get("type")] = cond
    return found


def _finished_condition(job: dict[str, Any]) -> dict[str, Any] | None:
    conds = _conditions(job)
    return conds.get("Complete") or conds.get("Failed")


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
