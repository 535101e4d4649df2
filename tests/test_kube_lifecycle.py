"""The job lifecycle on a REAL control plane (kube-apiserver, controller-manager, scheduler 1.36)
with simulated GPU nodes playing the kubelet (tests/node_sim.py): the controller, the Kubernetes
adapter and a SQLite store, driven pass by pass.

The daemon's clock here is a replay: it starts at 2026-01-28 20:00 (Seoul) while the server's
clock says today, so every time the cluster reports must come back on the daemon's clock
(progress from the container's real start, never from the server's ``status.startTime``).
"""

from __future__ import annotations

import time
from dataclasses import replace

import kube_harness
import kubernetes
import numpy as np
import pytest
from kube_harness import REPLAY_START, request, submit

from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import JobState

# the daemon on simulated GPU nodes of each test (fixtures of tests/kube_harness.py)
pool, priority_classes = kube_harness.pool, kube_harness.priority_classes


def conditions(job: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (job["status"].get("conditions") or [])}


# --------------------------------------------------------------------------- planned stops


def test_a_planned_stop_checkpoints_never_fails_and_keeps_the_work(pool) -> None:
    daemon, sim = pool(shutdown_seconds=1.0, start_delay=1.0)
    unit = submit(daemon.store, request("ckpt"))
    report = daemon.reconcile()
    (name,) = report.created
    report = daemon.until(lambda r: unit in r.started, what="the pod running")
    pod = sim.wait_pod(daemon.namespace, sim.running_pods()[0].name)
    row = daemon.store.unit(unit)
    # the start is the container's, on the daemon's (replayed) clock: after the admission,
    # never the server's "today"
    assert row.admitted_at <= row.started_at <= daemon.now()
    assert row.started_at.year == 2026 and row.started_at.month == 1
    time.sleep(3)
    daemon.free = np.zeros(12 * 24)  # the forecast now needs every GPU: stop as planned
    report = daemon.reconcile()
    assert report.stopped == [name]
    stopped_at = daemon.now()
    # while the pod checkpoints and exits, the unit still holds its GPUs
    report = daemon.until(lambda r: unit in r.released, what="the release")
    exited = sim.wait_pod(daemon.namespace, pod.name, "exited")
    assert exited.exit_code == 143 and exited.reason != "ContainerStatusUnknown"
    row = daemon.store.unit(unit)
    assert row.state is JobState.QUEUED and row.preemptions == 1
    worked = (stopped_at - daemon.store.attempts(unit)[0].started_at).total_seconds()
    assert 2.5 <= row.work_done_s <= worked + 1.0  # from the container start to the stop
    (attempt,) = daemon.store.attempts(unit)
    assert attempt.lost_gpu_seconds == 0.0
    job = daemon.job(name)
    assert job is None or "Failed" not in conditions(job) and "FailureTarget" not in conditions(
        job)
    daemon.until(lambda r: name in r.deleted or daemon.job(name) is None, what="deletion")


def test_a_planned_stop_of_a_workload_that_does_not_save_on_stop_counts_the_unsaved_work_lost(
        pool) -> None:
    """The same stop of a workload whose only saves are its periodic checkpoints (every 10
    minutes; it ran seconds): nothing is kept, the GPU-seconds since its start are lost."""
    daemon, sim = pool(shutdown_seconds=1.0, start_delay=0.5)
    blind = {"enabled": True, "interval": "10m", "resume_args": ["--resume"]}
    unit = submit(daemon.store, request("blind", checkpoint=blind))
    (name,) = daemon.reconcile().created
    daemon.until(lambda r: unit in r.started, what="the pod running")
    time.sleep(2)
    daemon.free = np.zeros(12 * 24)
    assert daemon.reconcile().stopped == [name]
    stopped_at = daemon.now()
    daemon.until(lambda r: unit in r.released, what="the release")
    row = daemon.store.unit(unit)
    assert row.state is JobState.QUEUED and row.preemptions == 1 and row.work_done_s == 0.0
    (attempt,) = daemon.store.attempts(unit)
    ran = (stopped_at - attempt.started_at).total_seconds()
    assert ran >= 1.5
    assert attempt.lost_gpu_seconds == pytest.approx(2 * ran, abs=2 * 1.0)


def test_a_planned_stop_released_by_a_restarted_daemon_stays_planned(pool) -> None:
    daemon, _ = pool(shutdown_seconds=2.0, start_delay=0.5)
    unit = submit(daemon.store, request("restart"))
    daemon.reconcile()
    daemon.until(lambda r: unit in r.started, what="the pod running")
    time.sleep(2)
    daemon.free = np.zeros(12 * 24)
    (name,) = daemon.reconcile().stopped
    # the daemon dies right after its stop; a new process finds the Job stopping, then gone
    restarted = daemon.restarted()
    report = restarted.reconcile()
    assert unit not in report.released  # its pod still checkpoints
    restarted.until(lambda r: unit in r.released, what="the release")
    (attempt,) = daemon.store.attempts(unit)
    assert attempt.lost_gpu_seconds == 0.0 and daemon.store.unit(unit).work_done_s > 1.5
    annotations = daemon.job(name)["metadata"]["annotations"] if daemon.job(name) else {}
    assert annotations.get("idlegpu.io/stop-kind", "planned") == "planned"


# --------------------------------------------------------------------------- the cluster's doing


def test_a_serving_pod_evicting_ours_sends_the_unit_back_to_the_queue(pool, kube_control_plane
                                                                      ) -> None:
    daemon, sim = pool(gpus=4, shutdown_seconds=0.5, start_delay=0.5)
    unit = submit(daemon.store, request("evicted", gpus=4))
    (name,) = daemon.reconcile().created
    daemon.until(lambda r: unit in r.started, what="the pod running")
    (ours,) = sim.running_pods()
    core = kubernetes.client.CoreV1Api(kube_control_plane.api_client())
    node = sim.node_names[0]
    daemon.signals.idle_gpus = 0  # what Prometheus shows once the service scales up
    core.create_namespaced_pod(daemon.namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm-0"},
        "spec": {"priorityClassName": "serving", "nodeSelector": daemon.cluster.node_selector,
                 "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
                                 "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}})
    evicted = sim.wait_pod(daemon.namespace, ours.name, "exited", timeout=60)
    # the kube-scheduler's preemption marks the pod, unlike our own stops
    assert "DisruptionTarget" in {c["type"] for c in evicted.last_object["status"]["conditions"]}
    report = daemon.until(lambda r: unit in r.released, what="the requeue")
    row = daemon.store.unit(unit)
    assert row.state is JobState.QUEUED and row.preemptions == 1
    annotations = (daemon.job(name) or {"metadata": {"annotations": {}}})["metadata"][
        "annotations"] or {}
    assert annotations.get("idlegpu.io/stop-kind", "requeue") == "requeue"
    assert sim.wait_pod(daemon.namespace, "vllm-0", "running").node == node
    del report


def test_a_unit_no_node_can_place_is_requeued_then_fails_with_the_reason(pool) -> None:
    # the node view sees room (a free 8-GPU node), but the Jobs' affinity asks for a label no
    # node has, which the view does not model: the kube-scheduler leaves the pod pending. (A
    # unit bigger than any node is no longer admitted at all: test_nodes_kube.py.)
    daemon, sim = pool(nodes=2, gpus=8, cpu="128", memory="1024Gi", harness={
        "pending_timeout_s": 2.0, "max_unscheduled_attempts": 2})
    daemon.cluster.affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "idlegpu.test/never", "operator": "In", "values": ["true"]}]}]}}}
    unit = submit(daemon.store, request("unplaceable", gpus=8))
    daemon.until(lambda r: unit in r.failed, timeout=90, what="the unit failing")
    row = daemon.store.unit(unit)
    assert row.state is JobState.FAILED and "no node could place its pod in 2 attempts" in \
        row.reason
    attempts = daemon.store.attempts(unit)
    assert len(attempts) == 2 and all(a.started_at is None for a in attempts)
    assert not any(e.kind == "started" for e in daemon.store.events(unit_id=unit))
    assert not sim.pods()  # no pod ever reached a node


def test_a_stop_on_a_dead_node_does_not_leave_the_unit_stuck(pool) -> None:
    daemon, sim = pool(shutdown_seconds=1.0, start_delay=0.5, harness={"stop_timeout_s": 8.0})
    unit = submit(daemon.store, request("dead-node"))
    (name,) = daemon.reconcile().created
    daemon.until(lambda r: unit in r.started, what="the pod running")
    sim.kill_node(sim.node_names[0])
    daemon.free = np.zeros(12 * 24)
    assert daemon.reconcile().stopped == [name]
    time.sleep(3)
    report = daemon.reconcile()  # the pod never confirms its end: it still holds the GPUs
    assert unit not in report.released and daemon.store.unit(unit).state is JobState.RUNNING
    observed = {j.name: j for j in daemon.cluster.observe()}
    assert observed[name].phase.value == "stopping"
    report = daemon.until(lambda r: unit in r.released, timeout=30, what="the release")
    assert name in report.deleted
    assert daemon.store.unit(unit).state is JobState.QUEUED


# --------------------------------------------------------------------------- bad input


def test_a_job_the_server_rejects_fails_its_unit_with_the_servers_reason(pool) -> None:
    daemon, _ = pool()
    unit = submit(daemon.store, request("refused"))
    # the stored unit's Job with a value our own checks let through and the server's
    # validation refuses (422 naming the field)
    broken = Controller(daemon.store, _BadImageCluster(daemon.cluster), daemon.signals,
                        daemon.forecast, lambda spec: spec.runtime_estimate_s,
                        daemon.controller.settings)
    report = broken.reconcile_once(daemon.now())
    assert unit in report.failed, (report.plan.decisions, report.errors)
    reason = daemon.store.unit(unit).reason
    assert "the cluster refused its Job" in reason and "HTTP 422" in reason
    assert "spec.template.spec.containers[0].env[0].name" in reason
    assert daemon.store.unit(unit).state is JobState.FAILED
    assert daemon.job(daemon.cluster.job_name(unit, 1)) is None  # nothing half-created
    assert broken.reconcile_once(daemon.now()).created == []  # never retried


class _BadImageCluster:
    """The real adapter, sending an environment name the server's validation refuses."""

    def __init__(self, cluster: KubernetesCluster) -> None:
        self._cluster = cluster

    def __getattr__(self, name: str):
        return getattr(self._cluster, name)

    def apply(self, unit_id, attempt, spec, **kw):
        return self._cluster.apply(unit_id, attempt, replace(spec, env=(("1=x", "v"),)), **kw)


def test_a_name_taken_by_someone_elses_job_fails_the_unit(pool) -> None:
    daemon, _ = pool()
    unit = submit(daemon.store, request("squatted"))
    name = daemon.cluster.job_name(unit, 1)
    daemon.batch.create_namespaced_job(daemon.namespace, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"suspend": True, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "etl", "image": "busybox", "command": ["true"]}]}}}})
    report = daemon.reconcile()
    assert unit in report.failed
    assert "already exists and is not unit" in daemon.store.unit(unit).reason
    assert daemon.job(name)["spec"]["template"]["spec"]["containers"][0]["name"] == "etl"


# --------------------------------------------------------------------------- ownership


def test_two_daemons_in_one_namespace_never_touch_each_others_jobs(pool) -> None:
    first, _ = pool(gpus=8, shutdown_seconds=0.5, start_delay=0.5,
                    harness={"instance": "pool-a-1111"})
    second, _ = pool(gpus=8, shutdown_seconds=0.5, start_delay=0.5,
                     harness={"instance": "pool-b-2222"})
    second.cluster.node_selector = first.cluster.node_selector  # the same nodes, too
    mine = submit(first.store, request("mine"))
    theirs = submit(second.store, request("theirs"))
    (mine_job,) = first.reconcile().created
    (their_job,) = second.reconcile().created
    first.until(lambda r: mine in r.started, what="mine running")
    second.until(lambda r: theirs in r.started, what="theirs running")
    assert [j.name for j in first.cluster.observe()] == [mine_job]
    assert [j.name for j in second.cluster.observe()] == [their_job]
    # the second stops its Job; the first, passing all along, sees a stopped Job that is not
    # in its store: it is not the first's to delete, nor to release or adopt
    second.free = np.zeros(12 * 24)
    assert second.reconcile().stopped == [their_job]
    first.until(lambda r: not second.job(their_job)["status"].get("active")
                and not second.job(their_job)["status"].get("terminating"), what="their pod gone")
    for report in [*first.reports, first.reconcile()]:
        assert their_job not in report.deleted + report.stopped + report.created
    assert first.job(their_job) is not None
    assert first.store.unit(mine).state is JobState.RUNNING
    second.until(lambda r: theirs in r.released, what="their release")
    assert second.store.unit(theirs).state is JobState.QUEUED


def test_a_pvc_off_the_teams_allow_list_is_refused_at_submit_and_by_the_daemon(pool) -> None:
    from idlegpu.scheduler.config import AdmissionConfig
    from idlegpu.scheduler.specs import SpecError, recheck_unit

    daemon, sim = pool()
    data = request("mounts", volumes=[{"name": "data", "mount_path": "/data",
                                       "persistent_volume_claim": "shared-weights"}])
    strict = AdmissionConfig(allowed_registries=["registry.example.com/"])
    with pytest.raises(SpecError, match="persistent_volume_claim"):
        validate_request(data, strict)
    # a submitter running with looser rules of its own gets it into the store...
    loose = AdmissionConfig(allowed_registries=["registry.example.com/"], team_volumes={
        "nlp": {"persistent_volume_claims": ["shared-weights"]}})
    req = validate_request(data, loose)
    daemon.store.submit(req.name, req.team, req.kind, data, expand_units(req), REPLAY_START)
    (unit,) = [row.id for row in daemon.store.queue()]
    # ...and the daemon, with its own rules, refuses to create its Job
    daemon.controller.recheck = lambda row: recheck_unit(row.spec, row.team, strict)
    report = daemon.reconcile()
    assert unit in report.failed and not report.created
    reason = daemon.store.unit(unit).reason
    assert "the daemon's admission rules refuse it" in reason and "shared-weights" in reason
    assert daemon.job(daemon.cluster.job_name(unit, 1)) is None and not sim.pods()
