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
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from kube_harness import pool, priority_classes  # noqa: F401 (fixtures)
from kueue_manager import KueueManager
from polling import wait_for

CHECK_CONTROLLER = "idlegpu.io/forecast"
pytestmark = pytest.mark.slow  # a real Kueue beside the control plane: ~10 s to start


def _wait(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    return wait_for(what, probe, timeout)


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
                                 "json", "--show-managed-fields").stdout
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


# ------------------------------------------------------------------ the daemon's check controller


def _kueue_job(kueue: KueueManager, namespace: str, name: str, queue: str, gpus: int,
               runtime_s: int) -> None:
    """A suspended Job of a LocalQueue that asks to be planned with ``runtime_s``."""
    kueue.apply({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kueue.x-k8s.io/queue-name": queue,
                                "kueue.x-k8s.io/max-exec-time-seconds": str(runtime_s)}},
        "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.example.com/research/eval:1",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi",
                                                       "nvidia.com/gpu": str(gpus)},
                                          "limits": {"nvidia.com/gpu": str(gpus)}}}]}}}})


def _entry(workload: dict[str, Any] | None, check: str) -> dict[str, Any]:
    for entry in (workload or {}).get("status", {}).get("admissionChecks", []):
        if entry["name"] == check:
            return entry
    return {}


def _managers(workload: dict[str, Any]) -> set[str]:
    return {f.get("manager") for f in workload["metadata"].get("managedFields", [])}


def test_the_daemon_admits_holds_and_evicts_kueue_workloads_through_a_night(
        kueue: KueueManager, pool) -> None:  # noqa: F811 (the fixture)
    """The daemon's check controller on the real Kueue: a Workload that fits tonight's window
    is Ready and its pod runs; one that does not waits Pending with the estimated start; the
    morning's live need evicts the running one (Retry), Kueue requeues it, and the next night
    admits it again; a Workload of a ClusterQueue without the check is never touched; a
    second check on a ClusterQueue keeps its own state; Kueue's quota still bounds it all."""
    from kube_harness import REPLAY_START

    from idlegpu.scheduler.adapters.kubernetes.kueue import KueueChecks
    from idlegpu.scheduler.admission_checks import planned_runtime_s
    from idlegpu.scheduler.controller.kueue import KueueAdmission

    daemon, _sim = pool(nodes=1, gpus=16)
    namespace = daemon.namespace
    tag = namespace[-6:]
    night, shared, plain = f"night-{tag}", f"shared-{tag}", f"plain-{tag}"
    check, other = f"idlegpu-forecast-{tag}", f"other-check-{tag}"
    _queues(kueue, namespace, night, [check], gpus=8)
    _queues(kueue, namespace, shared, [check, other], gpus=4)
    _queues(kueue, namespace, plain, [], gpus=4)
    _activate(kueue, other)  # the other check's controller, played by the test
    daemon.controller.external = [KueueAdmission(
        KueueChecks(kueue.plane.api_client(), checks=[check],
                    node_selector=daemon.cluster.node_selector, backoff_s=0.2),
        lambda w: planned_runtime_s(w, lambda spec: 3600.0),
        pool_gpus=16, tz=ZoneInfo("Asia/Seoul"))]
    # tonight: 8 GPUs free for 3 h, none for 17 h (the day), 8 again the next night
    daemon.free = np.concatenate([np.full(36, 8.0), np.zeros(204), np.full(336, 8.0)])

    # the first pass marks the check Active: the ClusterQueue activates
    daemon.reconcile()
    assert _condition(kueue.get("admissioncheck", check), "Active")["status"] == "True"
    _wait("the night ClusterQueue active", lambda: (_condition(
        kueue.get("clusterqueue", night), "Active") or {}).get("status") == "True")

    _kueue_job(kueue, namespace, "fits", night, gpus=4, runtime_s=2 * 3600)
    _kueue_job(kueue, namespace, "too-long", night, gpus=4, runtime_s=9 * 3600)
    _wait("both Workloads with their quota reserved", lambda: all(
        (_condition(_workload(kueue, namespace, job) or {}, "QuotaReserved") or {}).get(
            "status") == "True" for job in ("fits", "too-long")))
    daemon.until(lambda r: kueue.get("job", "fits", namespace)["spec"]["suspend"] is False,
                 what="the Job that fits tonight unsuspended")
    fits = _workload(kueue, namespace, "fits")
    assert _entry(fits, check)["state"] == "Ready"
    assert "fits the forecast" in _entry(fits, check)["message"]
    assert CHECK_CONTROLLER in _managers(fits)
    # podSetUpdates: the pool's nodeSelector on the admitted pods
    assert kueue.get("job", "fits", namespace)["spec"]["template"]["spec"][
        "nodeSelector"] == daemon.cluster.node_selector
    _wait("its pod running", lambda: any(
        p["status"].get("phase") == "Running" for p in json.loads(kueue.plane.kubectl(
            "get", "pods", "-n", namespace, "-l", "job-name=fits", "-o", "json").stdout)[
            "items"]))
    waits = _entry(_workload(kueue, namespace, "too-long"), check)
    assert waits["state"] == "Pending" and waits["message"].startswith("waits: "), waits
    assert "first fits" in waits["message"], waits  # the estimated start, the next night
    assert kueue.get("job", "too-long", namespace)["spec"]["suspend"] is True

    # Kueue's quota: the night queue's 8 GPUs are reserved, a third Workload gets none, and
    # idlegpu never admits it although the forecast would have room
    _kueue_job(kueue, namespace, "over-quota", night, gpus=4, runtime_s=1800)
    time.sleep(2)
    daemon.reconcile()
    over = _workload(kueue, namespace, "over-quota")
    assert (_condition(over, "QuotaReserved") or {}).get("status") != "True"
    assert _entry(over, check).get("state") != "Ready"
    assert kueue.get("job", "over-quota", namespace)["spec"]["suspend"] is True
    # (gone again: Kueue requeues an evicted Workload behind those that waited for its quota)
    kueue.plane.kubectl("delete", "job", "over-quota", "-n", namespace, "--wait=false")

    # a second check on the same ClusterQueue keeps its own state: ours Ready, theirs Pending
    _kueue_job(kueue, namespace, "shared", shared, gpus=2, runtime_s=1800)
    daemon.until(lambda r: _entry(_workload(kueue, namespace, "shared"), check).get(
        "state") == "Ready", what="our check Ready on the shared ClusterQueue")
    seen = _workload(kueue, namespace, "shared")
    assert _entry(seen, other)["state"] == "Pending"
    assert kueue.get("job", "shared", namespace)["spec"]["suspend"] is True

    # a ClusterQueue without our check: Kueue admits its Workload alone, idlegpu never writes it
    _kueue_job(kueue, namespace, "plain", plain, gpus=2, runtime_s=1800)
    _wait("the plain Job admitted by Kueue alone", lambda: kueue.get(
        "job", "plain", namespace)["spec"]["suspend"] is False)
    daemon.reconcile()
    untouched = _workload(kueue, namespace, "plain")
    assert CHECK_CONTROLLER not in _managers(untouched)
    assert untouched["status"].get("admissionChecks") in (None, [])

    # the morning: the service needs GPUs now (the live backstop): Retry evicts the running one
    daemon.signals.gpus_short = 4
    daemon.free = np.zeros(576)
    report = daemon.controller.backstop_once(daemon.now())
    assert ("kueue/" + namespace + "/" + fits["metadata"]["name"], "Retry") in \
        report.checks_written, report
    _wait("the evicted Job suspended", lambda: kueue.get("job", "fits", namespace)["spec"][
        "suspend"] is True)
    _wait("its Workload requeued, our check reset to Pending", lambda: _entry(
        _workload(kueue, namespace, "fits"), check).get("state") == "Pending"
        and (_condition(_workload(kueue, namespace, "fits"), "Admitted") or {}).get(
        "status") != "True")
    daemon.signals.gpus_short = 0
    daemon.reconcile()
    assert kueue.get("job", "fits", namespace)["spec"]["suspend"] is True  # still the day

    # the next night (3 h of 8 GPUs): admitted again. Only it fits: Kueue requeues an evicted
    # Workload behind those waiting for its quota, so too-long may hold the quota first, and
    # a night long enough for it too would let it take the GPUs whenever it does
    daemon.free = np.concatenate([np.full(36, 8.0), np.zeros(540)])
    daemon.until(lambda r: kueue.get("job", "fits", namespace)["spec"]["suspend"] is False,
                 what="the evicted Job admitted again the next night")
    assert _entry(_workload(kueue, namespace, "fits"), check)["state"] == "Ready"
    assert daemon.now() > REPLAY_START
    # another team's flood of Workloads is not read into memory: the listing is bounded
    from idlegpu.scheduler.adapters.kubernetes import ClusterUnavailableError

    with pytest.raises(ClusterUnavailableError,
                       match=r"more than 2 (workloads|admissionchecks)\.kueue\.x-k8s\.io"):
        KueueChecks(kueue.plane.api_client(), checks=[check], max_objects=2, page=1).read()


def test_run_once_serves_the_checks_and_the_jobs_its_config_names(
        kueue: KueueManager, kube_namespace: str, node_sim, cli, tmp_path) -> None:
    """``idlegpu run --once`` with ``cluster.kueue`` and ``cluster.native_jobs`` in the config,
    replaying an evening of the sample pool against the real Kueue: the check goes Active,
    the Workload that fits is Ready, and a user's suspended Job is unsuspended."""
    import yaml

    repo = Path(__file__).resolve().parents[1]
    node_sim(nodes=1, gpus=8)
    tag = kube_namespace[-6:]
    queue, check = f"once-{tag}", f"idlegpu-once-{tag}"
    _queues(kueue, kube_namespace, queue, [check], gpus=8)
    _kueue_job(kueue, kube_namespace, "fits", queue, gpus=4, runtime_s=3600)
    settings = yaml.safe_load((repo / "idlegpu.yaml").read_text())
    settings["cluster"].update(
        kubeconfig=kueue.plane.kubeconfig, namespace=kube_namespace,
        kueue={"admission_checks": [check]},
        native_jobs={"namespaces": [kube_namespace]})
    config = tmp_path / "idlegpu.yaml"
    config.write_text(yaml.safe_dump(settings))
    kueue.apply({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "own", "namespace": kube_namespace,
                     "labels": {"idlegpu.io/queue": settings["pool"]["name"]},
                     "annotations": {"idlegpu.io/runtime-estimate": "1h"}},
        "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "securityContext": {"runAsNonRoot": True,
                                                          "runAsUser": 1000},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.example.com/research/eval:1",
                            "securityContext": {"allowPrivilegeEscalation": False,
                                                "capabilities": {"drop": ["ALL"]}},
                            "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}})
    once = ["run", "--once", "--config", str(config),
            "--store", f"sqlite:///{tmp_path / 'jobs.db'}", "--now", "2026-01-28T20:00:00+09:00",
            "--history", str(repo / "data/sample/history.parquet")]
    code, out, err = cli(once)  # the check goes Active: Kueue starts reserving quota
    assert code == 0, err
    assert _condition(kueue.get("admissioncheck", check), "Active")["status"] == "True"
    _wait("its quota reserved", lambda: (_condition(_workload(kueue, kube_namespace, "fits")
                                                    or {}, "QuotaReserved") or {}).get(
        "status") == "True", timeout=60)
    code, out, err = cli(once)
    assert code == 0, err
    assert _entry(_workload(kueue, kube_namespace, "fits"), check)["state"] == "Ready", out
    assert kueue.get("job", "own", kube_namespace)["spec"]["suspend"] is False, out
    flat = " ".join(out.split())
    assert f"kueue/{kube_namespace}/job-fits-" in flat  # ids whole, never cut
    assert "1 Kueue admission-check entry written" in flat


def test_the_daemons_watch_keeps_the_workloads_and_its_passes_list_none(
        kueue: KueueManager, kube_namespace: str) -> None:
    """``KueueChecks(watch=True)`` (the daemon's): after one listing the Workloads come from
    the API server's watch: a new Workload, a state written and a Workload deleted all show
    in the next reads without another listing of Workloads; a flood beyond ``max_objects``
    drops the copy, and the pass's own listing says why."""
    from idlegpu.scheduler.adapters.kubernetes import ClusterUnavailableError
    from idlegpu.scheduler.adapters.kubernetes.kueue import KueueChecks
    from idlegpu.scheduler.admission_checks import CheckUpdate

    tag = kube_namespace[-6:]
    queue, check = f"watch-{tag}", f"idlegpu-watch-{tag}"
    _queues(kueue, kube_namespace, queue, [check], gpus=8)
    _activate(kueue, check)
    checks = KueueChecks(kueue.plane.api_client(), checks=[check], backoff_s=0.2, watch=True)
    listings: list[bool] = []  # one per call of the Workloads' list: watch or not
    real_list = checks.api.list_cluster_custom_object

    def counted(group: str, version: str, plural: str, **kw: Any) -> Any:
        if plural == "workloads":
            listings.append(bool(kw.get("watch")))
        return real_list(group, version, plural, **kw)

    checks.api.list_cluster_custom_object = counted  # type: ignore[method-assign]
    try:
        checks.read()  # the first read lists, and starts the watch
        assert checks.workloads is not None and checks.workloads.wait_synced(20), (
            checks.workloads.problem)
        listed = listings.count(False)

        def mine() -> list[Any]:
            return [w for w in checks.read().workloads if w.namespace == kube_namespace]

        _kueue_job(kueue, kube_namespace, "watched", queue, gpus=2, runtime_s=3600)
        (workload,) = _wait("the new Workload in the watch's copy", lambda: mine() or None)
        assert workload.state == "Pending"
        checks.write(CheckUpdate(kube_namespace, workload.name, check, "Ready",
                                 "fits the forecast", pod_sets=workload.pod_sets))
        _wait("the written state in the copy",
              lambda: [w.state for w in mine()] == ["Ready"])
        kueue.plane.kubectl("delete", "job", "watched", "-n", kube_namespace,
                            "--cascade=foreground", "--wait=false")
        _wait("the deleted Workload gone from the copy", lambda: mine() == [], timeout=60)
        assert listings.count(False) == listed, "a pass listed the Workloads"
        assert listings.count(True) >= 1 and checks.workloads.lists == 1
    finally:
        checks.close()
    assert checks.workloads.items() is None  # closed: no copy left to trust

    # beyond max_objects the copy is dropped, and the pass's own listing refuses the flood
    for name in ("flood-a", "flood-b"):
        _kueue_job(kueue, kube_namespace, name, queue, gpus=1, runtime_s=600)
    _wait("two Workloads", lambda: all(_workload(kueue, kube_namespace, n)
                                       for n in ("flood-a", "flood-b")))
    bounded = KueueChecks(kueue.plane.api_client(), checks=[check], backoff_s=0.2, watch=True,
                          max_objects=1, page=1)
    flood = r"more than 1 (workloads|admissionchecks)\.kueue"  # (other tests' checks too)
    try:
        assert bounded.workloads is not None
        bounded.workloads.start()
        _wait("the watch's refusal", lambda: "more than 1 workloads" in bounded.workloads.problem)
        assert bounded.workloads.items() is None
        with pytest.raises(ClusterUnavailableError, match=flood):
            bounded.read()
    finally:
        bounded.close()
