"""Kueue's Workloads as idlegpu's policy sees them, and its decisions as admission-check states.

Pure: no I/O, no clock. The daemon's Kueue adapter lists the Workloads (``kueue.x-k8s.io/v1beta1``)
of the ClusterQueues that list one of idlegpu's AdmissionChecks; here each one that carries such
a check (``status.admissionChecks[].name``) becomes a unit for ``decide()``: a ``WaitingJob``
while the check is ``Pending`` with the quota reserved (Kueue keeps what it owns: quota, fair
share, cohorts, its own preemption; idlegpu only adds the time), a ``RunningJob`` once it is
admitted with the check ``Ready``. A Workload without one of our checks is never a unit: it is
not ours to touch. Back the other way, a decision becomes the check's state and message:

* ``ADMIT``: ``Ready``, with when the window closes when it does ("fits the forecast: 8 GPUs
  free for its 2.0 h; stops by Thu 07:40");
* ``DEFER``: ``Pending``, with the wait's reason and the estimated start when there is one;
* ``PREEMPT`` of an admitted one: ``Retry`` (Kueue evicts it and requeues it; its check is
  reset to ``Pending``);
* a Workload bigger than the whole pool: ``Rejected`` (it can never fit).

A state is written only when it or its message changes, so a pass over 2,000 pending
Workloads writes what moved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
from idlegpu.scheduler.specs.quantities import parse_duration
from idlegpu.scheduler.types import Action, Decision, RunningJob, UnitSpec, WaitingJob

CHECK_CONTROLLER = "idlegpu.io/forecast"
MAX_EXEC_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"

PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
CHECK_STATES = (PENDING, READY, RETRY, REJECTED)
MAX_MESSAGE = 1024  # ours: a line a user reads in `kubectl get workload` (the CRD allows 32 Ki)
STOP_BY_ANNOTATION = "idlegpu.io/stop-by"
"""What ``podSetUpdates`` put on an admitted Workload's pods: when its window closes."""


class WorkloadError(ValueError):
    """A Workload that cannot be a unit: the field at fault, and why."""


@dataclass(frozen=True)
class CheckedWorkload:
    """A Workload that carries one of idlegpu's checks, as far as the policy needs it."""

    namespace: str
    name: str
    check: str
    """The name of the AdmissionCheck of ours it carries."""
    state: str
    message: str
    cluster_queue: str | None
    gpus: int
    pods: int
    priority: int
    created_at: datetime
    quota_reserved: bool
    admitted: bool
    admitted_at: datetime | None
    finished: bool
    max_exec_s: float | None
    """``spec.maximumExecutionTimeSeconds`` (from the Job's ``kueue.x-k8s.io/max-exec-time-
    seconds`` label): the runtime it asks to be planned with, when given."""
    image: str = ""
    """The first container's image of the first pod set (the runtime family's image)."""
    step: str = "main"
    """The runtime family's step: the pod template's ``idlegpu.io/step`` label, else the pod
    set's name."""
    runtime_estimate_s: float | None = None
    """The pod template's ``idlegpu.io/runtime-estimate`` annotation, in seconds."""
    pod_sets: tuple[str, ...] = ()
    """The pod sets' names (what ``podSetUpdates`` name)."""
    state_since: str = ""
    """The entry's ``lastTransitionTime`` as Kueue holds it (kept when only the message moves)."""
    checkpointable: bool = False
    """The pod template's ``idlegpu.io/checkpointable: "true"``."""

    @property
    def id(self) -> str:
        """The unit id: ``kueue/<namespace>/<name>`` (Workload names are unique per namespace)."""
        return f"kueue/{self.namespace}/{self.name}"


def _time(text: Any, field: str) -> datetime:
    return rfc3339(text, field, WorkloadError)


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def _true(status: Mapping[str, Any], kind: str) -> bool:
    cond = _condition(status, kind)
    return cond is not None and cond.get("status") == "True"


def _whole(value: Any, field: str) -> int:
    return whole(value, field, WorkloadError)


def _pod_gpus(template: Mapping[str, Any], where: str) -> int:
    spec = template.get("spec") or {}
    gpus = 0
    for n, container in enumerate(spec.get("containers") or ()):
        resources = container.get("resources") or {}
        asked = (resources.get("requests") or {}).get(GPU_RESOURCE,
                                                     (resources.get("limits") or {}).get(
                                                         GPU_RESOURCE, 0))
        gpus += _whole(asked, f"{where}.spec.containers[{n}].resources {GPU_RESOURCE}")
    return gpus


def checked_workload(obj: Mapping[str, Any], checks: Sequence[str]) -> CheckedWorkload | None:
    """``obj`` (a Workload as the API returns it) as a unit, if it carries one of ``checks``
    (the names of our AdmissionChecks); None if it carries none: it is not ours. A Workload
    whose fields make no unit raises ``WorkloadError`` naming the field."""
    if not isinstance(obj, Mapping):
        raise WorkloadError("the Workload is not an object")
    status = obj.get("status") or {}
    entry = next((e for e in status.get("admissionChecks") or ()
                  if isinstance(e, Mapping) and e.get("name") in checks), None)
    if entry is None:
        return None
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        raise WorkloadError("metadata.name and metadata.namespace: both are needed")
    state = entry.get("state")
    if state not in CHECK_STATES:
        raise WorkloadError(f"status.admissionChecks[{entry.get('name')}].state: {state!r} is "
                            f"none of {', '.join(CHECK_STATES)}")
    gpus = pods = 0
    for n, pod_set in enumerate(spec.get("podSets") or ()):
        count = _whole(pod_set.get("count", 1), f"spec.podSets[{n}].count")
        gpus += count * _pod_gpus(pod_set.get("template") or {}, f"spec.podSets[{n}].template")
        pods += count
    image, step, estimate_s, pod_sets, checkpointable = _family(spec.get("podSets") or ())
    max_exec = spec.get("maximumExecutionTimeSeconds")
    if max_exec is not None and (not isinstance(max_exec, int) or max_exec <= 0):
        raise WorkloadError(f"spec.maximumExecutionTimeSeconds: expected a positive whole "
                            f"number of seconds, got {str(max_exec)[:40]!r}")
    admitted = _true(status, "Admitted")
    admitted_cond = _condition(status, "Admitted")
    priority = spec.get("priority", 0)
    return CheckedWorkload(
        namespace=namespace, name=name, check=str(entry["name"]), state=state,
        message=str(entry.get("message") or ""),
        cluster_queue=(status.get("admission") or {}).get("clusterQueue"),
        gpus=gpus, pods=pods, priority=priority if isinstance(priority, int) else 0,
        created_at=_time(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        quota_reserved=_true(status, "QuotaReserved"), admitted=admitted,
        admitted_at=(_time(admitted_cond.get("lastTransitionTime"),
                           "status.conditions[Admitted].lastTransitionTime")
                     if admitted and admitted_cond is not None else None),
        finished=_true(status, "Finished"),
        max_exec_s=float(max_exec) if max_exec is not None else None,
        image=image, step=step, runtime_estimate_s=estimate_s, pod_sets=pod_sets,
        state_since=str(entry.get("lastTransitionTime") or ""),
        checkpointable=checkpointable,
    )


def _family(pod_sets: Sequence[Any]
            ) -> tuple[str, str, float | None, tuple[str, ...], bool]:
    """The first pod set's image, step, runtime annotation and whether it checkpoints, and
    every pod set's name."""
    names: list[str] = []
    image, step, estimate_s, checkpointable = "", "main", None, False
    for n, pod_set in enumerate(pod_sets):
        name = pod_set.get("name") if isinstance(pod_set, Mapping) else None
        if not isinstance(name, str) or not name:
            raise WorkloadError(f"spec.podSets[{n}].name: every pod set has a name")
        names.append(name)
        if n:
            continue
        template = pod_set.get("template") or {}
        meta = template.get("metadata") or {}
        containers = (template.get("spec") or {}).get("containers") or ()
        first = containers[0] if containers and isinstance(containers[0], Mapping) else {}
        image = str(first.get("image") or "")[:512]
        step = str((meta.get("labels") or {}).get(STEP_LABEL) or name)[:63]
        annotations = meta.get("annotations") or {}
        checkpointable = str(annotations.get(CHECKPOINTABLE_ANNOTATION, "")).lower() == "true"
        text = annotations.get(RUNTIME_ANNOTATION)
        if text is not None:
            try:
                estimate_s = parse_duration(str(text)[:40])
            except ValueError as exc:
                raise WorkloadError(f"spec.podSets[0].template.metadata.annotations"
                                    f"[{RUNTIME_ANNOTATION}]: {exc}") from None
    return image, step, estimate_s, tuple(names), checkpointable


def _since(text: str) -> datetime | None:
    try:
        return _time(text, "lastTransitionTime") if text else None
    except WorkloadError:
        return None


def policy_units(workloads: Sequence[CheckedWorkload], now: datetime,
                 runtime_s: Mapping[str, float], team_of: Mapping[str, str] | None = None,
                 ) -> tuple[list[WaitingJob], list[RunningJob]]:
    """The queue and the running units ``decide()`` reads: a Workload waits while its check is
    ``Pending`` with its quota reserved (Kueue's quota first), and holds its GPUs from the
    moment its check is ``Ready`` (admitted or about to be). ``runtime_s`` maps a unit id to the seconds it is planned with (its
    ``max_exec_s``, an idlegpu annotation of its Job, or the runtime model: the caller's
    choice); a unit without one is left out (it cannot be planned). A Workload is planned
    whole unless its pod template says it checkpoints (``idlegpu.io/checkpointable``): idlegpu
    cannot see its checkpoints, so a stopped one restarts its remaining time in full.
    ``team_of`` maps a namespace to its team (default: the namespace)."""
    teams = team_of or {}
    queue: list[WaitingJob] = []
    running: list[RunningJob] = []
    for w in sorted(workloads, key=lambda w: w.id):
        seconds = runtime_s.get(w.id)
        if w.finished or seconds is None or not seconds > 0:
            continue
        team = teams.get(w.namespace, w.namespace)
        # a Workload of several pods is placed as a gang, one pod a node: a safe reading of
        # its pod sets (it never counts on a node holding two of its pods)
        nodes = w.pods if w.pods > 1 and w.gpus % w.pods == 0 else 1
        if w.state == READY:
            # Ready and not admitted yet (Kueue is about to, or another check is Pending):
            # its GPUs are promised, so they are held from the moment we said Ready
            started = w.admitted_at or _since(w.state_since) or now
            running.append(RunningJob(
                id=w.id, team=team, gpus=w.gpus, priority=w.priority, started_at=started,
                checkpointable=w.checkpointable, kind="kueue",
                remaining_s=max(0.0, seconds - (now - started).total_seconds())))
        elif w.state == PENDING and w.quota_reserved and not w.admitted:
            queue.append(WaitingJob(
                id=w.id, team=team, gpus=w.gpus, runtime_s=seconds,
                checkpointable=w.checkpointable,
                priority=w.priority, submitted_at=w.created_at, kind="kueue", nodes=nodes))
    return queue, running


def workload_unit_spec(w: CheckedWorkload) -> UnitSpec:
    """The Workload as a unit for the runtime model (``kube_objects.family_unit_spec``)."""
    return family_unit_spec(step=w.step, image=w.image, gpus=w.gpus,
                            runtime_estimate_s=w.runtime_estimate_s,
                            checkpointable=w.checkpointable, priority=w.priority, kind="kueue")


def planned_runtime_s(w: CheckedWorkload, estimate: Callable[[UnitSpec], float]) -> float:
    """What a Workload is planned with: its ``maximumExecutionTimeSeconds`` when it has one
    (Kueue ends it there anyway), else the runtime model's estimate (``estimate``) of its
    family, which starts from its ``idlegpu.io/runtime-estimate``."""
    if w.max_exec_s is not None:
        return w.max_exec_s
    return float(estimate(workload_unit_spec(w)))


@dataclass(frozen=True)
class KueueReading:
    """One pass's reading of Kueue: our AdmissionChecks' ``Active`` conditions as they stand
    (name -> (active, reason, message); absent: the check has none yet), the Workloads that
    carry one of them, those that cannot be units (id, why: never admitted by us), and the
    configured checks the cluster does not have or that name another controller (each with
    why)."""

    active: Mapping[str, tuple[bool, str, str]]
    workloads: Sequence[CheckedWorkload]
    refused: Sequence[tuple[str, str]] = ()
    missing: Sequence[str] = ()
    served: Sequence[str] = ()
    """The configured checks the cluster has, naming our controller: the ones we serve."""


@dataclass(frozen=True)
class CheckUpdate:
    """One check entry to write (server-side apply of that entry, under ``CHECK_CONTROLLER``)."""

    namespace: str
    name: str
    check: str
    state: str
    message: str
    stop_by: datetime | None = None
    """A ``Ready`` entry's window end (what ``podSetUpdates`` tell its pods)."""
    since: str = ""
    """The entry's ``lastTransitionTime`` to keep: set when only its message moves."""
    pod_sets: tuple[str, ...] = ()
    """The Workload's pod sets (what a ``Ready`` entry's ``podSetUpdates`` name)."""


def entry_apply(update: CheckUpdate, since: str,
                pod_set_updates: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The server-side apply body of one check entry (``workloads/status``): only our entry,
    so the list (a map keyed by name) keeps every other check's. ``since``: its
    ``lastTransitionTime`` (RFC 3339). ``pod_set_updates``: what Kueue puts on the pods when
    it admits the Workload (a ``Ready`` entry only)."""
    entry: dict[str, Any] = {"name": update.check, "state": update.state,
                             "message": update.message, "lastTransitionTime": since}
    if pod_set_updates and update.state == READY:
        entry["podSetUpdates"] = [dict(u) for u in pod_set_updates]
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": update.name, "namespace": update.namespace},
            "status": {"admissionChecks": [entry]}}


def active_apply(check: str, active: tuple[bool, str, str], since: str) -> dict[str, Any]:
    """The server-side apply body of an AdmissionCheck's ``Active`` condition
    (``admissionchecks/status``): ``active`` as ``check_active`` returns it."""
    status, reason, message = active
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "status": {"conditions": [{
                "type": "Active", "status": "True" if status else "False", "reason": reason,
                "message": _bounded(message), "lastTransitionTime": since}]}}


def _when(at: datetime, tz: Any) -> str:
    return at.astimezone(tz).strftime("%a %H:%M")


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def check_updates(workloads: Sequence[CheckedWorkload], decisions: Sequence[Decision],
                  pool_gpus: int, tz: Any) -> list[CheckUpdate]:
    """The check entries a pass changes: each Workload's state and message from its decision
    (module docstring), those bigger than the pool ``Rejected``; an entry already in that
    state with that message is left alone. ``tz``: the pool's time zone, for the messages."""
    by_id = {d.job_id: d for d in decisions}
    out: list[CheckUpdate] = []
    for w in sorted(workloads, key=lambda w: w.id):
        if w.finished or w.state in (REJECTED, RETRY):
            continue
        state, message, stop_by = w.state, w.message, None
        if pool_gpus and w.gpus > pool_gpus and not w.admitted:
            state = REJECTED
            message = (f"needs {w.gpus} GPUs; the pool has {pool_gpus} in all: it can never "
                       "fit")
        elif (d := by_id.get(w.id)) is not None:
            if d.action is Action.ADMIT and not w.admitted:
                state = READY
                message = "fits the forecast: " + d.reason
                if d.stop_by is not None:
                    message += f"; stops by {_when(d.stop_by, tz)}"
                    stop_by = d.stop_by
            elif d.action is Action.DEFER and not w.admitted:
                state = PENDING
                message = "waits: " + d.reason
                if d.start_at is not None:
                    message += f"; first fits {_when(d.start_at, tz)}"
            elif d.action is Action.PREEMPT and w.admitted:
                state, message = RETRY, "stopped: " + d.reason
            elif d.action is Action.PREEMPT and w.state == READY:  # promised, not started
                state, message = PENDING, "waits: " + d.reason
        message = _bounded(message)
        if (state, message) != (w.state, w.message):
            out.append(CheckUpdate(w.namespace, w.name, w.check, state, message, stop_by,
                                   w.state_since if state == w.state else "", w.pod_sets))
    return out


def check_active(*, forecast_age_s: float | None, max_forecast_age_s: float,
                 signals_age_s: float | None, max_signal_age_s: float,
                 paused_reason: str = "") -> tuple[bool, str, str]:
    """Whether our AdmissionChecks are ``Active`` (status, reason, message): not while idlegpu
    cannot decide (no forecast or one too old, live signals stale or missing, admission
    paused by an operator), and then Kueue keeps the ClusterQueues that list them inactive."""
    if paused_reason:
        return False, "AdmissionPaused", _bounded(f"admission is paused: {paused_reason}")
    if forecast_age_s is None:
        return False, "NoForecast", "no forecast of the pool yet"
    if forecast_age_s > max_forecast_age_s:
        return False, "ForecastStale", (f"the forecast is {forecast_age_s / 3600:.1f} h old "
                                        f"(limit {max_forecast_age_s / 3600:.1f} h)")
    if signals_age_s is None:
        return False, "SignalsMissing", "the live vLLM signals were never read"
    if signals_age_s > max_signal_age_s:
        return False, "SignalsStale", (f"the live signals are {signals_age_s:.0f} s old "
                                       f"(limit {max_signal_age_s:.0f} s)")
    return True, "Active", "the forecast and the live signals are fresh"


__all__ = ["CHECKPOINTABLE_ANNOTATION", "CHECK_CONTROLLER", "CHECK_STATES", "RUNTIME_ANNOTATION",
           "STEP_LABEL", "STOP_BY_ANNOTATION", "CheckUpdate", "CheckedWorkload", "KueueReading",
           "WorkloadError", "active_apply", "check_active", "check_updates", "checked_workload",
           "entry_apply", "planned_runtime_s", "policy_units", "workload_unit_spec"]
