"""Elastic units on a REAL control plane (kube-apiserver, controller-manager, scheduler 1.36) with
simulated GPU nodes: a shrink is a planned checkpoint-and-stop of the Job, then a new Job for
the next attempt on fewer GPUs (tests/kube_harness.py)."""

from __future__ import annotations

import time

import kube_harness
import kubernetes
import numpy as np
from kube_harness import request, submit
from kubernetes.client.exceptions import ApiException

from idlegpu.scheduler.adapters.store import AttemptOutcome
from idlegpu.scheduler.types import Action, JobState

pool, priority_classes = kube_harness.pool, kube_harness.priority_classes


def gpus_of(pod) -> tuple[str, str]:
    resources = pod.last_object["spec"]["containers"][0]["resources"]
    return resources["requests"]["nvidia.com/gpu"], resources["limits"]["nvidia.com/gpu"]


def test_an_elastic_unit_on_8_gpus_is_shrunk_to_4_and_runs_again_on_4(pool) -> None:
    daemon, sim = pool(gpus=8, shutdown_seconds=1.0, start_delay=0.5)
    unit = submit(daemon.store, request("elastic", gpus=8, min_gpus=4, cpu=8, memory="16Gi"))
    (first,) = daemon.reconcile().created
    daemon.until(lambda r: unit in r.started, what="the first pod running")
    (pod,) = sim.running_pods()
    assert gpus_of(pod) == ("8", "8")
    time.sleep(2)
    daemon.free = np.full(12 * 24, 4.0)  # the forecast needs 4 of its GPUs back
    report = daemon.reconcile()
    (d,) = report.plan.decisions
    assert (d.action, d.gpus, d.planned) == (Action.SHRINK, 4, True)
    assert d.reason.startswith("shrink ") and "from 8 to 4 GPUs" in d.reason
    assert report.stopped == [first] and daemon.store.unit(unit).shrink_to == 4
    stopped_at = daemon.now()
    # the old pod checkpoints and exits before the next attempt's Job exists
    report = daemon.until(lambda r: unit in r.shrunk, what="the restart on 4 GPUs")
    exited = sim.wait_pod(daemon.namespace, pod.name, "exited")
    assert exited.exit_code == 143
    second = daemon.cluster.job_name(unit, 2)
    assert report.created == [second]
    daemon.until(lambda r: unit in r.started, what="the second pod running")
    running = sim.running_pods()
    assert [p.name for p in running] != [pod.name] and len(running) == 1
    (again,) = running
    assert gpus_of(again) == ("4", "4")
    resources = again.last_object["spec"]["containers"][0]["resources"]["requests"]
    assert (resources["cpu"], resources["memory"]) == ("4", "8Gi")
    env = again.env["job"]
    assert env["IDLEGPU_GPUS"] == "4" and env["IDLEGPU_ATTEMPT"] == "2"
    assert env["IDLEGPU_RESUME"] == "--resume"  # it resumes from the same checkpoint
    assert env["IDLEGPU_OUTPUT"] == pod.env["job"]["IDLEGPU_OUTPUT"]  # the same output
    # in the store: two attempts, nothing lost, no preemption, the GPUs each one held
    row = daemon.store.unit(unit)
    assert (row.state, row.gpus, row.preemptions, row.shrink_to) == (JobState.RUNNING, 4, 0,
                                                                       None)
    one, two = daemon.store.attempts(unit)
    assert (one.gpus, one.outcome, one.lost_gpu_seconds) == (8, AttemptOutcome.SHRUNK, 0.0)
    assert (two.gpus, two.outcome) == (4, None)
    worked = (stopped_at - one.started_at).total_seconds()
    assert 1.5 <= row.work_done_s <= worked + 1.0
    assert one.gpu_seconds == 8 * (one.ended_at - one.admitted_at).total_seconds()
    # never two pods of the unit at once, and the stopped attempt's Job is cleaned up
    pods = sorted(sim.pods(), key=lambda p: p.seen_at)
    assert len(pods) == 2 and pods[0].finished_at <= pods[1].seen_at
    daemon.until(lambda r: daemon.job(first) is None, what="the first Job's deletion")
    # nothing more to do: the plan keeps it on its 4 GPUs
    assert daemon.reconcile().plan.decisions == ()


def test_an_elastic_unit_admitted_on_4_of_8_gpus_grows_back_to_8(pool) -> None:
    """A unit admitted on the 4 GPUs the forecast promised is stopped as planned once all 8
    stay free (policy.growth: it saves on stop), its pod exits, and its next attempt's Job
    asks for 8; on a replayed clock at 60x (a growth waits a profile step after the start)."""
    daemon, sim = pool(gpus=8, shutdown_seconds=1.0, start_delay=0.5,
                       harness={"speed": 60.0})
    daemon.free = np.full(12 * 24, 4.0)
    unit = submit(daemon.store, request("grows", gpus=8, min_gpus=4, cpu=8, memory="16Gi",
                                        runtime_estimate="8h"))
    (first,) = daemon.reconcile().created
    daemon.until(lambda r: unit in r.started, what="the first pod running")
    (pod,) = sim.running_pods()
    assert gpus_of(pod) == ("4", "4")
    daemon.free = np.full(12 * 24, 8.0)  # 4 more free, for the whole forecast
    report = daemon.until(lambda r: r.stopped, what="the stop to grow")
    (d,) = report.plan.decisions
    assert (d.action, d.cause, d.planned) == (Action.PREEMPT, "grow", True)
    assert "restart on 8 of its 8 GPUs" in d.reason and report.stopped == [first]
    exited = sim.wait_pod(daemon.namespace, pod.name, "exited")
    assert exited.exit_code == 143
    second = daemon.cluster.job_name(unit, 2)
    daemon.until(lambda r: second in r.created, what="the restart on 8 GPUs")
    daemon.until(lambda r: unit in r.started, what="the second pod running")
    (again,) = sim.running_pods()
    assert again.name != pod.name and gpus_of(again) == ("8", "8")
    env = again.env["job"]
    assert env["IDLEGPU_GPUS"] == "8" and env["IDLEGPU_ATTEMPT"] == "2"
    assert env["IDLEGPU_RESUME"] == "--resume"  # it resumes from its own checkpoint
    # in the store: the first attempt kept its work (it saves on stop) and lost none
    row = daemon.store.unit(unit)
    assert (row.state, row.gpus) == (JobState.RUNNING, 8) and row.work_done_s > 0
    one, two = daemon.store.attempts(unit)
    assert (one.gpus, one.outcome, one.lost_gpu_seconds) == (4, AttemptOutcome.PREEMPTED, 0.0)
    assert (two.gpus, two.outcome) == (8, None)
    # never two pods of the unit at once; nothing more to do on 8 of its 8 GPUs
    pods = sorted(sim.pods(), key=lambda p: p.seen_at)
    assert len(pods) == 2 and pods[0].finished_at <= pods[1].seen_at
    assert daemon.reconcile().plan.decisions == ()


def test_the_server_lets_a_suspended_job_change_its_gpus(pool, kube_control_plane) -> None:
    """Finding on this 1.36 server: the pod template's resources of a suspended Job whose pods
    are gone may be changed (mutable pod resources for suspended Jobs are on by default), and
    of a running Job may not. idlegpu still creates a new Job per attempt (each attempt keeps
    its own name, GPUs and stop record, and a server without the feature works the same)."""
    daemon, sim = pool(gpus=8, shutdown_seconds=0.5, start_delay=0.2)
    batch = kubernetes.client.BatchV1Api(kube_control_plane.api_client())
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "resize-probe"},
           "spec": {"template": {"spec": {
               "restartPolicy": "Never", "nodeSelector": daemon.cluster.node_selector,
               "terminationGracePeriodSeconds": 1,
               "containers": [{"name": "job", "image": "registry.example.com/x:1",
                               "resources": {"limits": {"nvidia.com/gpu": "8"},
                                             "requests": {"nvidia.com/gpu": "8"}}}]}}}}
    batch.create_namespaced_job(daemon.namespace, job)
    sim.wait_for(lambda pods: [p for p in pods if p.state == "running"], what="the pod")
    four = {"spec": {"template": {"spec": {"containers": [{"name": "job", "resources": {
        "limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}}}]}}}}
    try:
        batch.patch_namespaced_job("resize-probe", daemon.namespace, four)
        raise AssertionError("a running Job's resources changed")
    except ApiException as exc:
        assert exc.status == 422 and "spec.template" in exc.body
    batch.patch_namespaced_job("resize-probe", daemon.namespace, {"spec": {"suspend": True}})
    sim.wait_for(lambda pods: all(p.state == "exited" for p in pods), what="the pod's exit")
    deadline = time.monotonic() + 30
    while (batch.read_namespaced_job("resize-probe", daemon.namespace).status.active
           and time.monotonic() < deadline):
        time.sleep(0.2)
    out = batch.patch_namespaced_job("resize-probe", daemon.namespace, four)
    assert out.spec.template.spec.containers[0].resources.requests == {"nvidia.com/gpu": "4"}
    batch.patch_namespaced_job("resize-probe", daemon.namespace, {"spec": {"suspend": False}})
    pod = sim.wait_for(lambda pods: [p for p in pods if p.state == "running"],
                       what="the resized pod")[0]
    assert gpus_of(pod) == ("4", "4")
