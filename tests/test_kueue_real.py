"""What idlegpu's admission check will rely on, checked on the real Kueue controller manager
(``../shared/kueue``) and the real control plane: a ClusterQueue that lists an AdmissionCheck is
inactive until the check's controller marks it Active; a Workload waits Pending with its quota
reserved; ``Ready`` written by server-side apply under the check's own field manager admits
it (the Job unsuspends and its pod runs); ``Retry`` evicts it back to the queue; a second
check's entry keeps its own state; and Kueue's own quota still bounds admission."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kueue_manager import KueueManager

CHECK_CONTROLLER = "idlegpu.io/forecast"
pytestmark = pytest.mark.slow  # a real Kueue beside the control plane: ~10 s to start


def _wait(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind),
                None)


def _queues(kueue: KueueManager, namespace: str, name: str, checks: list[str],
            gpus: int) -> None:
    for check in checks:
        kueue.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
                     "metadata": {"name": check},
                     "spec": {"controllerName": CHECK_CONTROLLER if check.startswith("idlegpu")
                              else "example.com/other"}})
    kueue.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
                 "metadata": {"name": "gpu-nodes"}})
    kueue.apply({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": "gpu-nodes", "resources": [
                    {"name": "cpu", "nominalQuota": "64"},
                    {"name": "memory", "nominalQuota": "256Gi"},
                    {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}]}],
            "admissionChecks": checks,
        }})
    kueue.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                 "metadata": {"name": name, "namespace": namespace},
                 "spec": {"clusterQueue": name}})


def _activate(kueue: KueueManager, check: str) -> None:
    kueue.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
                 "metadata": {"name": check},
                 "status": {"conditions": [{
                     "type": "Active", "status": "True", "reason": "Active",
                     "message": "the forecast is fresh", "observedGeneration": 1,
                     "lastTransitionTime": "2026-12-06T00:00:00Z"}]}},
                manager=CHECK_CONTROLLER, subresource="status")


def _job(kueue: KueueManager, namespace: str, name: str, queue: str, gpus: int) -> None:
    kueue.apply({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.example.com/research/eval:1",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi",
                                                       "nvidia.com/gpu": str(gpus)},
                                          "limits": {"nvidia.com/gpu": str(gpus)}}}]}}}})


def _workload(kueue: KueueManager, namespace: str, job: str) -> dict[str, Any] | None:
    listed = kueue.plane.kubectl("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o",
                                 "json").stdout
    for item in json.loads(listed)["items"]:
        owners = item["metadata"].get("ownerReferences", [])
        if any(o["kind"] == "Job" and o["name"] == job for o in owners):
            return item
    return None


def _check_state(workload: dict[str, Any] | None, check: str) -> str | None:
    if workload is None:
        return None
    for entry in workload.get("status", {}).get("admissionChecks", []):
        if entry["name"] == check:
            return entry["state"]
    return None


def _set_state(kueue: KueueManager, workload: dict[str, Any], check: str, state: str,
               message: str) -> None:
    """The check's entry only, by server-side apply under the check's own field manager: the
    list is a map keyed by name, so other checks' entries are not this manager's to touch.
    Kueue wrote the entry's first Pending itself, so its fields are taken over (forced)."""
    meta = workload["metadata"]
    kueue.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                 "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                 "status": {"admissionChecks": [{
                     "name": check, "state": state, "message": message,
                     "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]}},
                manager=CHECK_CONTROLLER, subresource="status", force=True)


def test_an_admission_check_holds_admits_and_evicts_a_job_on_the_real_kueue(
        kueue: KueueManager, kube_namespace: str, node_sim) -> None:
    node_sim(nodes=1, gpus=8)
    queue, check, other = "research", "idlegpu-forecast", "other-check"
    _queues(kueue, kube_namespace, queue, [check, other], gpus=8)
    # the ClusterQueue stays inactive while its checks are not Active
    inactive = _wait("the ClusterQueue's Active condition", lambda: _condition(
        kueue.get("clusterqueue", queue), "Active"))
    assert inactive["status"] == "False" and "AdmissionCheck" in inactive["message"], inactive
    _activate(kueue, check)
    _activate(kueue, other)
    _wait("the ClusterQueue active", lambda: (_condition(kueue.get("clusterqueue", queue),
                                                         "Active") or {}).get("status") == "True")

    _job(kueue, kube_namespace, "eval-a", queue, gpus=4)
    # quota reserved, both checks Pending (Kueue writes the entries and the condition in turn)
    waiting = _wait("eval-a's Workload with its quota reserved and its checks Pending",
                    lambda: (w := _workload(kueue, kube_namespace, "eval-a"))
                    and _check_state(w, check) == "Pending"
                    and _check_state(w, other) == "Pending"
                    and (_condition(w, "QuotaReserved") or {}).get("status") == "True" and w)
    assert kueue.get("job", "eval-a", kube_namespace)["spec"]["suspend"] is True

    # our check Ready, the other still Pending: not admitted, and the other's entry untouched
    _set_state(kueue, waiting, check, "Ready", "fits tonight's window: stops Thu 07:40")
    time.sleep(2)
    seen = _workload(kueue, kube_namespace, "eval-a")
    assert _check_state(seen, check) == "Ready" and _check_state(seen, other) == "Pending"
    assert kueue.get("job", "eval-a", kube_namespace)["spec"]["suspend"] is True
    # the other check's controller says Ready too: Kueue admits, the Job unsuspends
    meta = seen["metadata"]
    kueue.apply({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                 "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                 "status": {"admissionChecks": [{
                     "name": other, "state": "Ready", "message": "",
                     "lastTransitionTime": "2026-12-06T00:00:00Z"}]}},
                manager="example.com/other", subresource="status", force=True)
    _wait("eval-a unsuspended", lambda: kueue.get("job", "eval-a", kube_namespace)["spec"][
        "suspend"] is False)
    admitted = _workload(kueue, kube_namespace, "eval-a")
    assert _condition(admitted, "Admitted")["status"] == "True"
    entries = {e["name"]: e for e in admitted["status"]["admissionChecks"]}
    assert entries[check]["message"] == "fits tonight's window: stops Thu 07:40"

    # Kueue's own quota bounds admission: 4 more GPUs fit the 8, a third 4 does not
    _job(kueue, kube_namespace, "eval-b", queue, gpus=4)
    _job(kueue, kube_namespace, "eval-c", queue, gpus=4)
    _wait("eval-b's quota reserved", lambda: _check_state(
        _workload(kueue, kube_namespace, "eval-b"), check) == "Pending")
    time.sleep(2)
    third = _workload(kueue, kube_namespace, "eval-c")
    assert third is not None and (_condition(third, "QuotaReserved") or {}).get(
        "status") != "True", third.get("status")

    # Retry on the admitted Workload evicts it: the Job suspends again, the check resets
    _set_state(kueue, admitted, check, "Retry", "the morning ramp needs its GPUs")
    _wait("eval-a suspended again", lambda: kueue.get("job", "eval-a", kube_namespace)[
        "spec"]["suspend"] is True)
    requeued = _wait("eval-a requeued, its check reset to Pending", lambda: (
        w := _workload(kueue, kube_namespace, "eval-a")) and _check_state(w, check) == "Pending"
        and (_condition(w, "Admitted") or {}).get("status") == "False" and w)
    assert (_condition(requeued, "Evicted") or {}).get("status") == "True" or (
        _condition(requeued, "Requeued") or {}).get("status") == "True", requeued["status"]
