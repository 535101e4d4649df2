"""The real control plane (tests/kube_control_plane.py) with simulated GPU nodes
(tests/node_sim.py): what the Job controller, the scheduler and RBAC really do.

Facts these tests pin down on Kubernetes 1.36, for the Jobs idlegpu submits (restartPolicy
Never, podFailurePolicy: Ignore on DisruptionTarget, then FailJob on any non-zero exit code):

* suspending a running Job makes the Job controller delete its pod through the API (with the
  pod's terminationGracePeriodSeconds) and drop the pod's tracking finalizer at once: the pod
  gets NO DisruptionTarget condition and the workload exits 143 on SIGTERM (phase Failed). The
  Job is ``Suspended`` (reason JobSuspended) with ``status.startTime`` cleared, and yet, once the
  Job controller sees the pod terminal (the kubelet writes the phase before its final delete),
  it judges it against the pod failure policy: ``FailureTarget`` from the FailJob rule, then
  ``Failed``. An earlier stand-in deleted the pod in the same instant, and the Job controller
  never saw it terminal. See ``test_suspending_a_running_job_ends_it_by_sigterm``; how idlegpu
  keeps its stops from failing Jobs is in tests/test_kube_stops.py;
* a node that stops heartbeating leaves a deleted pod Terminating (no kubelet to finish it);
  after ``--node-monitor-grace-period`` (20 s here) the node turns Ready=Unknown
  (NodeStatusUnknown), gets the unreachable NoSchedule and NoExecute taints, and its pods turn
  Ready=False while their phase stays Running (no DisruptionTarget within the default 300 s
  toleration).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from job_watch import JobWatcher
from kube_control_plane import ControlPlane, KubeBinariesMissingError, find_binaries
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from node_sim import EXIT_CODE, GPU, RUN_SECONDS, SHUTDOWN_SECONDS, NodeSimulator

CONTAINER = "workload"


def wait_until(fetch: Callable[[], Any], *, timeout: float = 30, what: str = "") -> Any:
    """Poll ``fetch`` every 0.1 s until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def gpu_job(
    name: str,
    gpus: int,
    *,
    annotations: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
    grace_seconds: int = 10,
) -> dict[str, Any]:
    """A Job shaped like idlegpu's (scheduler/adapters/kubernetes.py): one pod, never restarted,
    a preemption is ignored and any other failure fails the Job."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 2,
            "completions": 1,
            "parallelism": 1,
            "podFailurePolicy": {"rules": [
                {"action": "Ignore",
                 "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob",
                 "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn",
                                 "values": [0]}},
            ]},
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": grace_seconds,
                    "containers": [{
                        "name": CONTAINER,
                        "image": "registry.example/research/train:1",
                        "command": ["python", "train.py"],
                        "env": env or [],
                        "resources": {
                            "requests": {GPU: str(gpus), "cpu": "1", "memory": "1Gi"},
                            "limits": {GPU: str(gpus)},
                        },
                        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                    }],
                    "volumes": [{"name": "scratch", "emptyDir": {}}],
                },
            },
        },
    }


@pytest.fixture
def api(kube_control_plane: ControlPlane) -> Any:
    with kube_control_plane.api_client() as api_client:
        yield api_client


def as_dict(api: Any, obj: Any) -> dict[str, Any]:
    """A client model as the server's JSON (camelCase keys)."""
    return api.sanitize_for_serialization(obj)


def job_pods(api: Any, ns: str, job: str) -> list[dict[str, Any]]:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        ns, label_selector=f"batch.kubernetes.io/job-name={job}"
    )
    return [as_dict(api, p) for p in pods.items]


def read_job(api: Any, ns: str, name: str) -> dict[str, Any]:
    return as_dict(api, client.BatchV1Api(api).read_namespaced_job(name, ns))


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def test_find_binaries_names_the_missing_parts(tmp_path: Path) -> None:
    # an envtest asset directory: kube-apiserver, etcd, kubectl only
    for name in ("kube-apiserver", "etcd", "kubectl"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    with pytest.raises(KubeBinariesMissingError) as err:
        find_binaries(tmp_path)
    message = str(err.value)
    assert "kube-controller-manager, kube-scheduler" in message
    assert "install.sh" in message


def test_gpu_job_runs_on_a_simulated_node_and_completes(
    kube_control_plane: ControlPlane, kube_namespace: str,
    node_sim: Callable[..., NodeSimulator], api: Any,
) -> None:
    sim = node_sim(nodes=1, gpus=4)
    ns, node = kube_namespace, sim.node_names[0]
    job = gpu_job("one-gpu", 1, annotations={RUN_SECONDS: "2"},
                  env=[{"name": "IDLEGPU_UNIT", "value": "u-1"}])
    client.BatchV1Api(api).create_namespaced_job(ns, job)

    record = sim.wait_for(
        lambda pods: next((p for p in pods if p.namespace == ns and p.state == "running"), None),
        timeout=30, what="the Job's pod running",
    )
    pod = as_dict(api, client.CoreV1Api(api).read_namespaced_pod(record.name, ns))
    assert pod["spec"]["nodeName"] == node  # bound by the real scheduler
    conds = conditions(pod)
    assert conds["PodScheduled"]["status"] == "True"
    assert conds["Ready"]["status"] == "True"
    assert "message" not in conds["Ready"]  # none left over from Pending
    assert pod["status"]["phase"] == "Running"
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] is True and status["state"]["running"]["startedAt"]
    # what reached the "kubelet": our env and volume, plus the ServiceAccount token volume
    assert record.env[CONTAINER] == {"IDLEGPU_UNIT": "u-1"}
    volumes = {v["name"]: v for v in record.volumes}
    assert volumes["scratch"] == {"name": "scratch", "emptyDir": {}}
    assert any(name.startswith("kube-api-access-") for name in volumes)
    assert record.volume_mounts[CONTAINER][0]["mountPath"] == "/scratch"

    done = wait_until(
        lambda: (j := read_job(api, ns, "one-gpu")) and "Complete" in conditions(j) and j,
        timeout=30, what="Job Complete",
    )
    assert conditions(done)["Complete"]["status"] == "True"
    assert done["status"]["succeeded"] == 1 and not done["status"].get("failed")
    ended = sim.pod(ns, record.name)
    assert ended is not None and (ended.exit_code, ended.phase) == (0, "Succeeded")
    assert ended.reason == "Completed"
    (pod,) = job_pods(api, ns, "one-gpu")  # a finished pod stays, as a kubelet leaves it
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_a_failing_exit_code_fails_the_job_through_its_pod_failure_policy(
    kube_namespace: str, node_sim: Callable[..., NodeSimulator], api: Any,
) -> None:
    sim = node_sim(nodes=1, gpus=4, start_delay=0)
    ns = kube_namespace
    client.BatchV1Api(api).create_namespaced_job(
        ns, gpu_job("crashes", 1, annotations={RUN_SECONDS: "0.5", EXIT_CODE: "3"})
    )
    failed = wait_until(
        lambda: (j := read_job(api, ns, "crashes")) and "Failed" in conditions(j) and j,
        timeout=30, what="Job Failed",
    )
    assert conditions(failed)["Failed"]["reason"] == "PodFailurePolicy"
    assert "exit code 3" in conditions(failed)["Failed"]["message"]
    assert failed["status"]["failed"] == 1  # FailJob: no retry although backoffLimit is 2
    assert [p.exit_code for p in sim.pods() if p.namespace == ns] == [3]


def test_more_gpus_than_any_node_has_stays_unschedulable(
    kube_namespace: str, node_sim: Callable[..., NodeSimulator], api: Any,
) -> None:
    sim = node_sim(nodes=2, gpus=4)
    ns = kube_namespace
    client.BatchV1Api(api).create_namespaced_job(ns, gpu_job("eight-gpus", 8))

    def unschedulable() -> dict[str, Any] | None:
        pods = job_pods(api, ns, "eight-gpus")
        cond = conditions(pods[0]).get("PodScheduled") if pods else None
        return cond if cond and cond["status"] == "False" else None

    cond = wait_until(unschedulable, timeout=30, what="PodScheduled False")
    assert cond["reason"] == "Unschedulable"
    assert f"Insufficient {GPU}" in cond["message"]
    (pod,) = job_pods(api, ns, "eight-gpus")
    assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    assert not [p for p in sim.pods() if p.namespace == ns]


def test_suspending_a_running_job_ends_it_by_sigterm(
    kube_namespace: str, node_sim: Callable[..., NodeSimulator], api: Any,
) -> None:
    sim = node_sim(nodes=1, gpus=4, delete_delay=2.0)  # the final delete 2 s after the phase
    ns, batch = kube_namespace, client.BatchV1Api(api)
    watch = JobWatcher(api, ns).__enter__()
    batch.create_namespaced_job(
        ns, gpu_job("preempted", 1, annotations={SHUTDOWN_SECONDS: "1"}, grace_seconds=10)
    )
    running = sim.wait_for(
        lambda pods: next((p for p in pods if p.namespace == ns and p.state == "running"), None),
        timeout=30, what="the Job's pod running",
    )
    wait_until(lambda: read_job(api, ns, "preempted")["status"].get("ready") == 1,
               what="Job status.ready 1")

    suspended_at = time.monotonic()
    batch.patch_namespaced_job("preempted", ns, {"spec": {"suspend": True}},
                               _content_type="application/merge-patch+json")
    deleted = wait_until(
        lambda: next((p for p in job_pods(api, ns, "preempted")
                      if p["metadata"].get("deletionTimestamp")), None),
        timeout=10, what="the Job controller to delete the pod",
    )
    running_finalizers = deleted["metadata"].get("finalizers") or []
    ended = sim.wait_pod(ns, running.name, "exited", timeout=20)
    exited_after = time.monotonic() - suspended_at
    gone = sim.wait_pod(ns, running.name, "gone", timeout=20)
    gone_after = time.monotonic() - suspended_at

    # the Job controller deleted the pod with the pod's own grace period: SIGTERM, then the
    # workload's 1 s shutdown, exit 143
    assert ended.grace_seconds == 10
    assert (ended.exit_code, ended.reason, ended.phase) == (143, "Error", "Failed")
    assert gone.deleted  # by the simulator, gracePeriodSeconds=0, as a kubelet does
    last = gone.last_object  # the pod as the DELETED event carried it
    pod_conditions = conditions(last)
    assert "DisruptionTarget" not in pod_conditions  # deleted through the API
    assert last["status"]["phase"] == "Failed"

    def settled() -> dict[str, Any] | None:
        job = read_job(api, ns, "preempted")
        status = job.get("status") or {}
        return job if not status.get("active") and not status.get("terminating") else None

    wait_until(settled, timeout=20, what="the suspended Job to count no terminating pod")
    settled_after = time.monotonic() - suspended_at
    time.sleep(1.5)  # time for anything else the Job controller would do
    job = read_job(api, ns, "preempted")
    status = job["status"]
    observed = {
        "job_conditions": {t: (c["status"], c.get("reason")) for t, c in conditions(job).items()},
        "job_status": {k: status.get(k) for k in ("active", "ready", "failed", "succeeded",
                                                  "terminating", "startTime")},
        "pod_conditions": {t: c["status"] for t, c in pod_conditions.items()},
        "pod_finalizers_when_deleted": running_finalizers,
        "pod_exit": ended.exit_code,
        "seconds_to_exit": round(exited_after, 1),
        "seconds_to_pod_gone": round(gone_after, 1),
        "seconds_to_job_terminating_0": round(settled_after, 1),
    }
    print("suspend facts:", json.dumps(observed, indent=1))

    # what 1.36 really does: the Job controller removes the pod's tracking finalizer as it
    # deletes it, and still holds the pod's exit 143 (Failed, no DisruptionTarget) against the
    # Job once it sees the pod terminal: FailureTarget from the FailJob rule
    watch.__exit__(None, None, None)
    conds = conditions(job)
    assert job["spec"]["suspend"] is True
    assert (conds["Suspended"]["status"], conds["Suspended"]["reason"]) == ("True",
                                                                          "JobSuspended")
    target = next(e.conditions["FailureTarget"] for e in watch.of("preempted")
                  if "FailureTarget" in e.conditions)
    assert target.startswith("PodFailurePolicy: ") and "exit code 143" in target
    assert "FailJob rule at index 1" in target
    assert not status.get("succeeded")
    assert not status.get("active") and not status.get("ready")
    assert status.get("startTime") is None  # cleared on suspend
    assert running_finalizers == []
    assert 1.0 <= exited_after < 5  # the workload's shutdown time, not the 10 s grace period
    assert len([p for p in sim.pods() if p.namespace == ns]) == 1  # never replaced


def test_a_dead_node_leaves_a_deleted_pod_terminating(
    kube_namespace: str, node_sim: Callable[..., NodeSimulator], api: Any,
) -> None:
    sim = node_sim(nodes=1, gpus=4)
    ns, node, core = kube_namespace, sim.node_names[0], client.CoreV1Api(api)
    core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stranded"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": CONTAINER, "image": "registry.example/x:1",
                            "resources": {"limits": {GPU: "1"}}}],
        },
    })
    sim.wait_pod(ns, "stranded", "running")
    sim.kill_node(node)
    core.delete_namespaced_pod("stranded", ns)  # grace period 1 s
    time.sleep(3.5)  # well past the grace period and a heartbeat

    pod = as_dict(api, core.read_namespaced_pod("stranded", ns))
    assert pod["metadata"]["deletionTimestamp"]
    assert pod["status"]["phase"] == "Running"  # nobody ended its containers
    record = sim.pod(ns, "stranded")
    assert record is not None and record.state == "running" and record.deletion_seen_at is None
    lease = client.CoordinationV1Api(api).read_namespaced_lease(node, "kube-node-lease")
    assert (time.time() - lease.spec.renew_time.timestamp()) > 3  # the heartbeat stopped


@pytest.mark.slow
def test_a_node_that_stops_heartbeating_turns_unknown(
    kube_namespace: str, node_sim: Callable[..., NodeSimulator], api: Any,
) -> None:
    # two nodes, one dies: with every node down the node-lifecycle controller would enter its
    # full-disruption mode, which lifts the NoExecute taints again
    sim = node_sim(nodes=2, gpus=4)
    ns, node, core = kube_namespace, sim.node_names[0], client.CoreV1Api(api)
    core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orphan"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "containers": [{"name": CONTAINER, "image": "registry.example/x:1",
                                 "resources": {"limits": {GPU: "1"}}}]},
    })
    assert sim.wait_pod(ns, "orphan", "running").node == node
    killed = time.monotonic()
    sim.kill_node(node)

    def unknown() -> dict[str, Any] | None:
        ready = conditions(as_dict(api, core.read_node(node)))["Ready"]
        return ready if ready["status"] == "Unknown" else None

    ready = wait_until(unknown, timeout=60, what="node Ready=Unknown")
    took = time.monotonic() - killed

    def unreachable() -> set[tuple[str, str]] | None:
        # the node-lifecycle controller writes the two taints in separate updates, in either
        # order (a CI run read NoExecute alone): wait for both
        taints = {(t.key, t.effect) for t in core.read_node(node).spec.taints or []}
        both = {("node.kubernetes.io/unreachable", e) for e in ("NoExecute", "NoSchedule")}
        return taints if both <= taints else None

    taints = wait_until(unreachable, timeout=20, what="the unreachable NoExecute and "
                                                      "NoSchedule taints")
    tainted = time.monotonic() - killed
    pod = wait_until(  # the controller marks the node's pods not Ready after the node
        lambda: (p := as_dict(api, core.read_namespaced_pod("orphan", ns)))
        and conditions(p)["Ready"]["status"] == "False" and p,
        timeout=15, what="the pod Ready=False",
    )
    print("node lifecycle facts:", json.dumps({
        "seconds_to_unknown": round(took, 1), "seconds_to_noexecute": round(tainted, 1),
        "ready": ready, "taints": sorted(taints),
        "pod_conditions": conditions(pod), "pod_phase": pod["status"]["phase"],
    }, indent=1))
    assert ready["reason"] == "NodeStatusUnknown"
    assert 15 < took < 45  # --node-monitor-grace-period=20s
    assert ("node.kubernetes.io/unreachable", "NoSchedule") in taints
    assert conditions(as_dict(api, core.read_node(sim.node_names[1])))["Ready"]["status"] \
        == "True"  # the other node heartbeats on
    # the node-lifecycle controller marks its pods not Ready; they keep running (phase) and,
    # with the default 300 s toleration of the unreachable taint, are not evicted yet
    pod_conds = conditions(pod)
    assert pod_conds["Ready"]["status"] == "False"
    assert pod["status"]["phase"] == "Running"
    assert "DisruptionTarget" not in pod_conds


def test_simulated_nodes_heartbeat_and_advertise_gpus(
    node_sim: Callable[..., NodeSimulator], api: Any,
) -> None:
    sim = node_sim(nodes=2, gpus=4, heartbeat_seconds=0.5)
    coordination, core = client.CoordinationV1Api(api), client.CoreV1Api(api)
    first = {n: coordination.read_namespaced_lease(n, "kube-node-lease").spec.renew_time
             for n in sim.node_names}
    for name in sim.node_names:
        node = as_dict(api, core.read_node(name))
        assert node["status"]["allocatable"][GPU] == "4"
        assert node["status"]["capacity"]["pods"] == "110"
        assert conditions(node)["Ready"]["status"] == "True"
        assert not [t for t in node["spec"].get("taints") or [] if "not-ready" in t["key"]]
        wait_until(
            lambda n=name: coordination.read_namespaced_lease(n, "kube-node-lease")
            .spec.renew_time > first[n],
            timeout=10, what=f"a renewal of {name}'s Lease",
        )


def test_rbac_forbids_an_unprivileged_user(
    kube_control_plane: ControlPlane, kube_namespace: str,
) -> None:
    denied = kube_control_plane.kubectl("get", "jobs", "-n", kube_namespace, user="nobody",
                                        check=False)
    assert denied.returncode != 0
    assert 'User "nobody" cannot list resource "jobs"' in denied.stderr
    with kube_control_plane.api_client("nobody") as nobody, pytest.raises(ApiException) as err:
        client.BatchV1Api(nobody).list_namespaced_job(kube_namespace)
    assert err.value.status == 403
    allowed = kube_control_plane.kubectl("get", "jobs", "-n", kube_namespace, "-o", "json")
    assert json.loads(allowed.stdout)["items"] == []
