"""Reading the pool's nodes and the pods bound to them into a ``NodeView``: allocatable and
requested GPUs, CPU and memory (Kubernetes quantities read as numbers, a pod's requests
counted as the kube-scheduler counts them), readiness, and whether our Jobs may be scheduled
there (cordons, taints and our tolerations). Pure: no client, no I/O (``KubernetesCluster``
lists the nodes and pods)."""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from idlegpu.scheduler.adapters.kubernetes.names import GPU_RESOURCE, JOB_NAME_LABELS
from idlegpu.scheduler.types import NodeState, NodeView

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


def _job_of(pod: dict[str, Any]) -> str | None:
    """The name of the Job a pod belongs to (the Job controller's label), if any."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return next((labels[k] for k in JOB_NAME_LABELS if labels.get(k)), None)


def _pool_nodes(items: list[dict[str, Any]],
                node_selector: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The listed nodes that match ``node_selector`` (a server may ignore the label
    selector), by name."""
    wanted = {}
    for item in items:
        labels = (item.get("metadata") or {}).get("labels") or {}
        if all(labels.get(k) == v for k, v in node_selector.items()):
            wanted[item["metadata"]["name"]] = item
    return wanted


def _node_view(wanted: dict[str, dict[str, Any]], pods: list[dict[str, Any]],
               tolerations: list[dict[str, Any]], now: datetime | None) -> NodeView:
    """The ``NodeView`` of the pool's nodes ``wanted`` (``_pool_nodes``) and the pods bound to
    nodes: what each node offers, what its pods not yet ended request, whether our Jobs may
    go there, and which Jobs have pods on which of them."""
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
        owner = _job_of(pod)
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
            and all(_tolerated(taint, tolerations)
                    for taint in (item.get("spec") or {}).get("taints") or []),
            ready=ready))
    return NodeView(tuple(states), observed_at=now, bound_jobs=frozenset(bound),
                    bound_at=frozenset(bound_at))
