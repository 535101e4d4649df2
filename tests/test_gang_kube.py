"""Multi-node (gang) units on the REAL control plane (kube-apiserver, controller-manager and
kube-scheduler 1.36) with simulated 8-GPU nodes (tests/node_sim.py): an Indexed Job and its
headless Service, the rendezvous environment each pod really gets, all-or-none placement, the
rollback of a partial one, and a planned stop and resume of the whole gang.

Stand-ins for the inference replicas are plain pods in a namespace of their own, bound to a
node each (``spec.nodeName``) and requesting ``nvidia.com/gpu``.
"""

from __future__ import annotations

import time

import kube_harness
import kubernetes
import numpy as np
from kube_harness import request, submit
from kubernetes.client.exceptions import ApiException
from test_end_to_end import daemon_credentials

from idlegpu.scheduler.types import Action, EventKind, JobState

pool, priority_classes = kube_harness.pool, kube_harness.priority_classes
inference = kube_harness.inference
__all__ = ["daemon_credentials"]  # the deployed RBAC's credentials (deploy/role.yaml)

GPUS = 8
SHAPE = {"cpu": "96", "memory": "1Ti"}  # an ordinary 8-GPU node
GANG = {"nodes": 4, "gpus_per_node": 8, "gpus": 32, "cpu": 64, "memory": "512Gi", "runtime_estimate": "2h"}


def _roomy(daemon) -> None:
    """The forecast and the live signals have room for any gang here: only the nodes decide."""
    daemon.free[:] = 64.0
    daemon.signals.idle_gpus = 64


def _pods_of(sim, daemon, name: str, state: str = "running"):
    return [p for p in sim.pods() if p.namespace == daemon.namespace
            and p.name.startswith(f"{name}-") and p.state == state and not p.gone]


def _service(kube_control_plane, namespace: str, name: str) -> dict | None:
    core = kubernetes.client.CoreV1Api(kube_control_plane.api_client())
    try:
        return core.read_namespaced_service(name, namespace).to_dict()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_4_node_gang_waits_for_4_whole_nodes_then_starts_on_4_with_the_rendezvous(
        pool, inference, kube_control_plane) -> None:
    daemon, sim = pool(8, GPUS, start_delay=0.2, **SHAPE)
    _roomy(daemon)
    replicas = {node: inference.place(node, GPUS - 2) for node in sim.node_names}
    for name in replicas.values():
        sim.wait_pod(inference.ns, name, "running")
    gang = submit(daemon.store, request("pretrain", **GANG))
    single = submit(daemon.store, request("eight", gpus=8, cpu=64, memory="512Gi",
                                          priority=-1))
    # 2 free GPUs on each of 8 nodes: neither the gang nor an 8-GPU unit is offered them
    report = daemon.reconcile()
    got = {d.job_id: d for d in report.plan.decisions}
    assert got[gang].action is Action.DEFER and got[single].action is Action.DEFER
    assert got[gang].reason == (
        "needs 4 whole 8-GPU nodes; 0 free now (2 free GPUs on each of 8 others)")
    assert got[single].reason == (
        "needs 8 GPUs on one node; 16 GPUs free but at most 2 on any node (8 nodes)")
    assert report.created == [] and not report.errors
    # (a one-node unit would take a whole node the gang cannot use yet: no reservation is
    # made from the pool-wide forecast for what the nodes refuse, policy.py section 5)
    daemon.store.cancel(single, daemon.now())
    # the service scales in on 3 nodes: 3 whole nodes are not 4
    for node in sim.node_names[:3]:
        inference.remove_and_wait(replicas[node])
    report = daemon.reconcile()
    got = {d.job_id: d for d in report.plan.decisions}
    assert got[gang].action is Action.DEFER and got[gang].start_at is None
    assert got[gang].reason == (
        "needs 4 whole 8-GPU nodes; 3 free now (2 free GPUs on each of 5 others)")
    assert daemon.store.unit(gang).state is JobState.QUEUED and report.created == []
    # a fourth node: the gang starts, on exactly those 4, one pod each
    inference.remove_and_wait(replicas[sim.node_names[3]])
    report = daemon.reconcile()
    got = {d.job_id: d for d in report.plan.decisions}
    assert got[gang].action is Action.ADMIT and got[gang].gpus == 32
    assert set(got[gang].nodes) == set(sim.node_names[:4])
    assert not report.errors, report.errors
    (name,) = report.created
    daemon.until(lambda r: gang in r.started, what="the gang running")
    pods = _pods_of(sim, daemon, name)
    assert len(pods) == 4 and {p.node for p in pods} == set(got[gang].nodes)
    service = _service(kube_control_plane, daemon.namespace, name)
    master = f"{name}-0.{name}.{daemon.namespace}.svc"
    ranks = set()
    for pod in pods:
        env = pod.values["job"]
        index = env["JOB_COMPLETION_INDEX"]  # set by the Job controller of the real server
        ranks.add(index)
        assert env["NODE_RANK"] == env["PET_NODE_RANK"] == index
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == master
        assert (env["MASTER_PORT"], env["NNODES"], env["WORLD_SIZE"]) == ("29500", "4", "32")
        assert (env["IDLEGPU_GPUS"], env["PET_NPROC_PER_NODE"], env["IDLEGPU_NODES"]) == (
            "8", "8", "4")
        spec = pod.last_object["spec"]
        assert spec["hostname"] == f"{name}-{index}" and spec["subdomain"] == name
        limits = spec["containers"][0]["resources"]["limits"]
        assert (limits["nvidia.com/gpu"], limits["cpu"], limits["memory"]) == (
            "8", "64", "512Gi")
    assert ranks == {"0", "1", "2", "3"}
    job = daemon.job(name)
    assert job["spec"]["completion_mode"] == "Indexed"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 4
    assert job["spec"]["backoff_limit_per_index"] == 0
    assert service["spec"]["cluster_ip"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
    (owner,) = service["metadata"]["owner_references"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", name, job["metadata"]["uid"])
    # the node view sees the gang bound: no claim is left, the 4 nodes are full
    view = daemon.cluster.nodes()
    assert {n.name for n in view.nodes if n.free_gpus == 0} == set(sim.node_names[:4])
    assert {(name, node) for node in sim.node_names[:4]} <= view.bound_at


def test_a_partial_placement_is_rolled_back_and_requeued_without_a_lost_unit(
        pool, inference, kube_control_plane, daemon_credentials) -> None:
    """With the deployed RBAC only: the gang's Service is created and deleted with it."""
    daemon, sim = pool(4, GPUS, start_delay=0.2, **SHAPE, harness={
        "gang_timeout_s": 6.0, "api_client": daemon_credentials})
    _roomy(daemon)
    gang = submit(daemon.store, request("pretrain", **GANG))
    taken = sim.node_names[2]
    read = daemon.cluster.nodes
    replica = []

    def view_then_a_node_is_taken(now=None):
        view = read(now)
        if not replica:  # the service takes one node right after admission counted on it
            replica.append(inference.place(taken, GPUS))
            sim.wait_pod(inference.ns, replica[0], "running")
        return view

    daemon.cluster.nodes = view_then_a_node_is_taken
    report = daemon.reconcile()
    (decision,) = report.plan.decisions
    assert decision.action is Action.ADMIT and taken in decision.nodes
    (name,) = report.created
    assert not report.errors and _service(kube_control_plane, daemon.namespace, name)
    daemon.cluster.nodes = read
    # three pods are bound and run, the fourth can go nowhere: never RUNNING, rolled back
    sim.wait_for(lambda pods: len([p for p in pods if p.name.startswith(f"{name}-")
                                   and p.state == "running"]) == 3, what="3 pods running")
    report = daemon.until(lambda r: name in r.stopped, what="the rollback")
    assert daemon.store.unit(gang).state is JobState.ADMITTED  # it never started
    report = daemon.until(lambda r: gang in r.released, what="the release")
    row = daemon.store.unit(gang)
    assert row.state is JobState.QUEUED and row.preemptions == 0 and row.work_done_s == 0
    assert "gang not placed whole: 3 of 4 pods on a node" in row.reason
    (attempt,) = daemon.store.attempts(gang)
    assert attempt.outcome == "requeued" and attempt.started_at is None
    # what the attempt held while it waited counts as idle GPU time, never more
    held_s = (attempt.ended_at - attempt.admitted_at).total_seconds()
    assert attempt.lost_gpu_seconds <= 32 * held_s + 1e-6
    events = daemon.store.events(unit_id=gang)
    assert EventKind.STARTED not in [e.kind for e in events]
    (release,) = [e for e in events if e.kind is EventKind.PREEMPTED]
    assert release.detail["requeued"] is True  # the store's record of a requeue, no preemption
    assert "gang not placed whole" in release.detail["reason"]
    # every pod is gone (their GPUs back), the Job and its Service are deleted
    sim.wait_for(lambda pods: all(p.gone for p in pods if p.name.startswith(f"{name}-")),
                 what="the gang's pods gone")
    daemon.until(lambda r: daemon.job(name) is None, what="the Job deleted")
    deadline = time.monotonic() + 30
    while _service(kube_control_plane, daemon.namespace, name) is not None:
        assert time.monotonic() < deadline, "the Service stayed"
        time.sleep(0.3)
    # the node frees up: the unit is admitted again, whole
    inference.remove_and_wait(replica[0])
    report = daemon.reconcile()
    (decision,) = report.plan.decisions
    assert decision.action is Action.ADMIT and len(decision.nodes) == 4
    daemon.until(lambda r: gang in r.started, what="the second attempt running")
    assert daemon.store.unit(gang).attempts == 2


def test_a_planned_stop_stops_the_whole_gang_and_the_resume_restarts_it_from_the_checkpoint(
        pool) -> None:
    # its containers take 4 s to start, longer than the gang timeout: all bound is placed
    daemon, sim = pool(4, GPUS, start_delay=4.0, shutdown_seconds=1.0, **SHAPE,
                       harness={"gang_timeout_s": 2.0})
    _roomy(daemon)
    gang = submit(daemon.store, request("pretrain", **GANG))
    report = daemon.reconcile()
    (name,) = report.created
    daemon.until(lambda r: gang in r.started, what="the gang running")
    assert not any(r.stopped for r in daemon.reports)  # never rolled back
    first = _pods_of(sim, daemon, name)
    assert len(first) == 4
    time.sleep(2)
    daemon.free = np.zeros(12 * 24)  # the forecast needs every GPU: stop as planned
    report = daemon.reconcile()
    assert report.stopped == [name]
    report = daemon.until(lambda r: gang in r.released, what="the release")
    for pod in first:  # every rank got SIGTERM and checkpointed (exit 143 within the grace)
        exited = sim.wait_pod(daemon.namespace, pod.name, "exited")
        assert exited.deletion_seen_at is not None and exited.exit_code == 143
    row = daemon.store.unit(gang)
    assert row.state is JobState.QUEUED and row.preemptions == 1 and row.work_done_s >= 1.5
    (attempt,) = daemon.store.attempts(gang)
    assert attempt.lost_gpu_seconds == 0.0
    # room again: the next attempt is a new gang that resumes from the checkpoint
    _roomy(daemon)
    daemon.free = np.full(12 * 24, 64.0)
    report = daemon.until(lambda r: gang in r.started, what="the resumed gang running")
    second = daemon.cluster.job_name(gang, 2)
    pods = _pods_of(sim, daemon, second)
    assert len(pods) == 4 and len({p.node for p in pods}) == 4
    for pod in pods:
        env = pod.values["job"]
        assert env["IDLEGPU_ATTEMPT"] == "2" and env["IDLEGPU_RESUME"] == "--resume"
        assert env["MASTER_ADDR"] == f"{second}-0.{second}.{daemon.namespace}.svc"
    assert daemon.store.unit(gang).state is JobState.RUNNING


def test_jobset_is_detected_through_discovery_and_the_log_says_indexed_jobs_are_used(
        kube_control_plane, caplog) -> None:
    from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster

    client = kube_control_plane.api_client()
    cluster = KubernetesCluster(client, namespace="default")
    assert cluster.jobset_available() is False  # a bare 1.36 control plane serves none
    with caplog.at_level("INFO", logger="idlegpu.scheduler.adapters.kubernetes"):
        cluster._say_which_gang_api()
    assert "multi-node units run as Indexed Jobs with a headless Service (no JobSet API" in (
        caplog.text)
    # the JobSet API installed (its CRD): detected, and still not used
    ext = kubernetes.client.ApiextensionsV1Api(client)
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "jobsets.jobset.x-k8s.io"},
           "spec": {"group": "jobset.x-k8s.io", "scope": "Namespaced",
                    "names": {"plural": "jobsets", "singular": "jobset", "kind": "JobSet"},
                    "versions": [{"name": "v1alpha2", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {
                                      "type": "object",
                                      "x-kubernetes-preserve-unknown-fields": True}}}]}}
    ext.create_custom_resource_definition(crd)
    try:
        deadline = time.monotonic() + 20
        while not cluster.jobset_available():
            assert time.monotonic() < deadline, "the JobSet group never showed in discovery"
            time.sleep(0.3)
        fresh = KubernetesCluster(client, namespace="default")
        caplog.clear()
        with caplog.at_level("INFO", logger="idlegpu.scheduler.adapters.kubernetes"):
            fresh._say_which_gang_api()
        assert "the JobSet API (jobset.x-k8s.io) is installed, but multi-node units run as " \
               "Indexed Jobs" in caplog.text
    finally:
        ext.delete_custom_resource_definition("jobsets.jobset.x-k8s.io")


def test_a_gang_succeeds_when_every_rank_does_and_fails_when_one_rank_fails(pool) -> None:
    done, sim = pool(4, GPUS, start_delay=0.2, run_seconds=3.0, **SHAPE)
    _roomy(done)
    gang = submit(done.store, request("pretrain", **GANG))
    report = done.reconcile()
    (name,) = report.created
    done.until(lambda r: gang in r.finished, what="the gang finished")
    assert done.store.unit(gang).state is JobState.SUCCEEDED
    assert len([p for p in sim.pods() if p.name.startswith(f"{name}-")
                and p.exit_code == 0]) == 4
    # a rank exiting 1 fails the attempt (any rank: the others would wait for it for ever)
    failing, sim = pool(4, GPUS, start_delay=0.2, run_seconds=3.0, exit_code=1, **SHAPE)
    _roomy(failing)
    gang = submit(failing.store, request("pretrain", **GANG))
    failing.reconcile()
    failing.until(lambda r: gang in r.failed, what="the gang failed")
    row = failing.store.unit(gang)
    assert row.state is JobState.FAILED and "PodFailurePolicy" in row.reason, row.reason
