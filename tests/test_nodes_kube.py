"""Node-aware admission on the REAL control plane (kube-apiserver, controller-manager and
kube-scheduler 1.36) with simulated 8-GPU nodes (tests/node_sim.py): the adapter's node view
and the daemon's pass (tests/kube_harness.py).

Stand-ins for the inference replicas are plain pods in their own namespace, bound to a node
each and requesting ``nvidia.com/gpu``: with 6 of 8 GPUs taken on every node, the pool has 16
GPUs free and no node has more than 2, so an 8-GPU unit is not admitted (the pool-wide count
would have started a pod that no node can place, requeued every 15 minutes).
"""

from __future__ import annotations

import statistics
import time

import kube_harness
import kubernetes
from kube_harness import request, submit

from idlegpu.scheduler.types import Action, JobState

pool, priority_classes = kube_harness.pool, kube_harness.priority_classes
inference = kube_harness.inference

NODES, GPUS = 8, 8
SHAPE = {"cpu": "96", "memory": "1Ti"}  # an ordinary 8-GPU node


def _fragmented(pool, inference):
    daemon, sim = pool(NODES, GPUS, start_delay=0.2, **SHAPE)
    replicas = {node: inference.place(node, GPUS - 2) for node in sim.node_names}
    for name in replicas.values():
        sim.wait_pod(inference.ns, name, "running")
    return daemon, sim, replicas


def test_fragmented_free_gpus_are_not_offered_and_a_freed_node_is(pool, inference,
                                                                  kube_control_plane) -> None:
    daemon, sim, replicas = _fragmented(pool, inference)
    unit = submit(daemon.store, request("pretrain", gpus=8, cpu=64, memory="512Gi",
                                        runtime_estimate="1h"))
    for _ in range(2):  # refused pass after pass, never started into the fragments
        report = daemon.reconcile()
        (decision,) = report.plan.decisions
        assert decision.action is Action.DEFER
        assert decision.reason == (
            "needs 8 GPUs on one node; 16 GPUs free but at most 2 on any node (8 nodes)")
        assert report.created == [] and not report.errors
        assert daemon.store.unit(unit).state is JobState.QUEUED
        view = report.nodes
        assert [n.free_gpus for n in view.nodes] == [2] * NODES
        assert {n.name for n in view.nodes} == set(sim.node_names)
        assert all(n.cpu == 96 and n.memory == 2**40 and n.cpu_requested == 8
                   and n.memory_requested == 64 * 2**30 for n in view.nodes)
    # the service scales in on one node: its replica goes, the node is whole again
    freed = sim.node_names[3]
    inference.remove(replicas[freed])
    deadline = time.monotonic() + 30
    while not inference.gone(replicas[freed]):
        assert time.monotonic() < deadline, "the stand-in replica did not go"
        time.sleep(0.2)
    report = daemon.reconcile()
    (decision,) = report.plan.decisions
    assert decision.action is Action.ADMIT and decision.node == freed, decision
    (name,) = report.created
    daemon.until(lambda r: unit in r.started, what="the unit's pod running")
    (pod,) = [p for p in sim.running_pods() if p.namespace == daemon.namespace]
    assert pod.node == freed  # the kube-scheduler put it where admission counted on
    # ... because the Job, as the API server holds it, is pinned there (a one-pod Job too)
    batch = kubernetes.client.BatchV1Api(kube_control_plane.api_client())
    job = batch.read_namespaced_job(name, daemon.namespace).to_dict()
    terms = job["spec"]["template"]["spec"]["affinity"]["node_affinity"][
        "required_during_scheduling_ignored_during_execution"]["node_selector_terms"]
    assert [f["values"] for t in terms for f in t["match_fields"]] == [[freed]]
    # the view now sees it bound there: nothing free on that node
    view = daemon.cluster.nodes()
    by_name = {n.name: n for n in view.nodes}
    assert by_name[freed].free_gpus == 0 and by_name[freed].gpus_requested == 8
    assert by_name[freed].cpu_requested == 64 and name in view.bound_jobs


def test_an_admission_claims_its_node_until_its_pod_is_bound(pool, inference) -> None:
    """Two passes in a row, the second before the first unit's pod is bound: the second unit
    does not count on the GPUs the first one was admitted onto."""
    daemon, sim, replicas = _fragmented(pool, inference)
    freed = sim.node_names[0]
    inference.remove(replicas[freed])
    deadline = time.monotonic() + 30
    while not inference.gone(replicas[freed]):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    first = submit(daemon.store, request("first", gpus=8, cpu=64, memory="512Gi",
                                         runtime_estimate="1h"))
    daemon.free[:] = 32.0  # the forecast has room for both: only the nodes refuse
    report = daemon.reconcile()
    assert [d.action for d in report.plan.decisions] == [Action.ADMIT]
    second = submit(daemon.store, request("second", gpus=8, cpu=64, memory="512Gi",
                                          runtime_estimate="1h"))
    report = daemon.reconcile()  # at once: the first pod may not be bound yet
    decisions = {d.job_id: d for d in report.plan.decisions}
    assert decisions[second].action is Action.DEFER
    assert "on one node" in decisions[second].reason
    daemon.until(lambda r: first in r.started, what="the first unit running")
    assert daemon.store.unit(second).state is JobState.QUEUED


def test_the_cost_of_reading_the_node_view(pool, inference) -> None:
    """What one read of the node view costs on the real server (8 nodes, 8 replicas and the
    control plane's own pods): printed for the README (run with -s)."""
    daemon, _, _ = _fragmented(pool, inference)
    cluster = daemon.cluster
    cluster.nodes()  # warm the connection
    times = []
    for _ in range(30):
        started = time.perf_counter()
        view = cluster.nodes()
        times.append(time.perf_counter() - started)
    assert len(view.nodes) == NODES
    median, worst = statistics.median(times), max(times)
    print(f"\nnode view: {NODES} nodes, median {median * 1000:.1f} ms, max {worst * 1000:.1f} ms")
    assert median < 0.5


def test_a_tainted_or_cordoned_node_is_not_offered(pool, kube_control_plane) -> None:
    daemon, sim = pool(2, GPUS, taints=[{"key": "maintenance", "value": "true",
                                         "effect": "NoSchedule"}], **SHAPE)
    view = daemon.cluster.nodes()
    assert [n.schedulable for n in view.nodes] == [False, False] and view.free_gpus == 0
    core = kubernetes.client.CoreV1Api(kube_control_plane.api_client())
    node = sim.node_names[1]
    core.patch_node(node, {"spec": {"taints": [], "unschedulable": True}})
    by_name = {n.name: n for n in daemon.cluster.nodes().nodes}
    assert not by_name[node].schedulable  # cordoned
    # the node-lifecycle controller answers a cordon with its node.kubernetes.io/unschedulable
    # taint and lifts it a moment after the uncordon; an uncordon it has not yet seen the cordon
    # of can be followed by the taint (seen: the node free but still refused). Let it act first.
    deadline = time.monotonic() + 15
    while not any(t.key == "node.kubernetes.io/unschedulable"
                  for t in core.read_node(node).spec.taints or ()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    core.patch_node(node, {"spec": {"unschedulable": False}})
    deadline = time.monotonic() + 15
    while True:
        by_name = {n.name: n for n in daemon.cluster.nodes().nodes}
        if (by_name[node].schedulable and by_name[node].free_gpus == GPUS) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert by_name[node].schedulable
    assert by_name[sim.node_names[1]].free_gpus == GPUS
    unit = submit(daemon.store, request("fits", gpus=8, cpu=64, memory="512Gi"))
    report = daemon.reconcile()
    (decision,) = report.plan.decisions
    assert decision.action is Action.ADMIT and decision.node == sim.node_names[1]
    daemon.until(lambda r: unit in r.started, what="the pod running")
