"""decide() with a node view: a unit is admitted now only where one real node holds it
(per-node free GPUs, CPU, memory), best fit, taken node by node within the pass."""

from datetime import UTC, datetime, timedelta

import numpy as np
from test_controller import REQUEST, MemoryCluster, Signals

from idlegpu.forecast.errors import PermanentError, TemporaryError
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.policy import decide
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import (
    Action,
    FreeProfile,
    NodeState,
    NodeView,
    PolicySettings,
    ServingSignals,
    WaitingJob,
)

T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)
H = 3600
GI = 2**30
SETTINGS = PolicySettings(grace_s=600, min_segment_s=1800)
FRESH = ServingSignals(observed_at=T0, kv_cache_usage=0.3)


def profile(gpus: float, hours: float = 12) -> FreeProfile:
    return FreeProfile(T0, 300, np.full(int(hours * 12), float(gpus)), 0.9, T0)


def job(id, gpus=8, hours=2.0, priority=0, age_h=0.0, **kw) -> WaitingJob:
    return WaitingJob(id=id, team="a", gpus=gpus, runtime_s=hours * H, checkpointable=False,
                      priority=priority, submitted_at=T0 - timedelta(hours=age_h + 1), **kw)


def node(name, free, gpus=8, cpu=96.0, memory=1024 * GI, cpu_used=0.0, mem_used=0, **kw):
    return NodeState(name=name, gpus=gpus, cpu=cpu, memory=memory,
                     gpus_requested=gpus - free, cpu_requested=cpu_used,
                     memory_requested=mem_used, **kw)


def plan(queue, nodes, free=64):
    return decide(T0, profile(free), [], list(queue), FRESH, {}, SETTINGS, nodes)


def by_id(result):
    return {d.job_id: d for d in result.decisions}


FRAGMENTED = NodeView(tuple(node(f"n{i}", 2) for i in range(8)))


def test_fragmented_free_gpus_are_not_offered_to_an_8_gpu_unit():
    got = by_id(plan([job("big", 8)], FRAGMENTED, free=16))
    assert got["big"].action is Action.DEFER
    assert got["big"].reason == (
        "needs 8 GPUs on one node; 16 GPUs free but at most 2 on any node (8 nodes)")
    assert got["big"].start_at is None  # no reservation from a pool-wide forecast


def test_a_2_gpu_unit_fits_a_fragment():
    got = by_id(plan([job("big", 8, priority=1), job("small", 2)], FRAGMENTED, free=16))
    assert got["big"].action is Action.DEFER
    assert got["small"].action is Action.ADMIT and got["small"].node == "n0"


def test_best_fit_keeps_whole_nodes_free():
    view = NodeView((node("a-whole", 8), node("b-six", 6), node("c-four", 4), node("d-one", 1)))
    got = by_id(plan([job("four", 4)], view))
    assert got["four"].action is Action.ADMIT and got["four"].node == "c-four"
    got = by_id(plan([job("eight", 8)], view))
    assert got["eight"].node == "a-whole"


def test_two_units_in_one_pass_do_not_share_a_nodes_gpus():
    view = NodeView((node("a", 4), node("b", 6)))
    got = by_id(plan([job("x", 4, age_h=2), job("y", 4, age_h=1), job("z", 4)], view))
    assert got["x"].node == "a" and got["y"].node == "b"
    assert got["z"].action is Action.DEFER
    # x gives node a back after its 2 h and the grace period: z's reservation
    assert got["z"].reason == (
        "needs 4 GPUs on one node; 2 GPUs free but at most 2 on any node (2 nodes); node a "
        "reserved for it from 2026-01-28 13:10 UTC")
    assert got["z"].start_at == T0 + timedelta(hours=2, minutes=10)


def test_cpu_and_memory_must_fit_beside_the_gpus():
    view = NodeView((node("busy", 8, cpu_used=80), node("tight", 8, mem_used=900 * GI)))
    hungry = job("hungry", 4, cpu=32.0, memory=256 * GI)
    got = by_id(plan([hungry], view))
    assert got["hungry"].action is Action.DEFER
    assert got["hungry"].reason == (
        "needs 4 GPUs, 32 CPUs, 256Gi memory on one node; 2 of 2 nodes have 4 GPUs free, none "
        "with 32 CPUs and 256Gi memory beside them (most free: 96 CPUs, 1024Gi memory)")
    got = by_id(plan([job("fits", 4, cpu=16.0, memory=100 * GI)], view))
    assert got["fits"].action is Action.ADMIT and got["fits"].node == "busy"
    # unknown requests are not checked
    assert by_id(plan([job("blind", 4)], view))["blind"].action is Action.ADMIT


def test_cpu_and_memory_are_taken_within_the_pass():
    view = NodeView((node("a", 8),))
    got = by_id(plan([job("x", 2, cpu=60.0, age_h=1), job("y", 2, cpu=60.0)], view))
    assert got["x"].action is Action.ADMIT
    assert got["y"].action is Action.DEFER and "CPUs" in got["y"].reason


def test_cordoned_and_not_ready_nodes_hold_nothing():
    view = NodeView((node("cordoned", 8, schedulable=False), node("down", 8, ready=False),
                     node("ok", 2)))
    got = by_id(plan([job("big", 8)], view))
    assert got["big"].reason == ("needs 8 GPUs on one node; 2 GPUs free but at most 2 on any "
                                 "node (1 node, 2 more not ready or cordoned)")


def test_the_forecast_still_decides_for_how_long():
    view = NodeView((node("a", 8),))
    # the node is free now, but the pool's forecast holds 8 GPUs for 1 h only
    result = decide(T0, profile(8, hours=1), [], [job("long", 8, hours=2.0)], FRESH, {},
                    SETTINGS, view)
    got = by_id(result)
    assert got["long"].action is Action.DEFER and "on one node" not in got["long"].reason


def test_an_elastic_unit_starts_on_what_one_node_holds():
    view = NodeView((node("a", 4), node("b", 4)))
    elastic = WaitingJob(id="elastic", team="a", gpus=8, runtime_s=2 * H, checkpointable=True,
                         priority=0, submitted_at=T0 - timedelta(hours=1), min_gpus=2)
    got = by_id(plan([elastic], view))
    assert got["elastic"].action is Action.ADMIT and got["elastic"].gpus == 4


def test_no_node_view_is_the_pool_as_one_bin():
    queue = [job("big", 8), job("small", 2)]
    old = decide(T0, profile(16), [], queue, FRESH, {}, SETTINGS)
    same = decide(T0, profile(16), [], queue, FRESH, {}, SETTINGS, None)
    assert old == same
    assert {d.job_id: d.action for d in old.decisions} == {"big": Action.ADMIT,
                                                            "small": Action.ADMIT}
    assert all(d.node is None for d in old.decisions)


def test_pool_nodes_describe_the_node_shapes():
    import pytest
    from pydantic import ValidationError

    from idlegpu.forecast.config import PoolConfig

    pool = PoolConfig(total_gpus=40, nodes=[
        {"gpus": 8, "cpu": 96, "memory": "1Ti", "labels": {"gpu": "h100"}, "count": 4},
        {"gpus": 4, "count": 2}])
    view = NodeView.of_shapes(pool.nodes)
    assert [n.gpus for n in view.nodes] == [8, 8, 8, 8, 4, 4]
    assert view.nodes[0].memory == 2**40 and view.nodes[0].cpu == 96
    assert view.nodes[0].labels == (("gpu", "h100"),) and view.free_gpus == 40
    assert view.nodes[5].cpu == 0 and view.nodes[5].memory == 0  # not described: not checked
    got = by_id(plan([job("x", 8, cpu=64.0, memory=512 * GI)], view))
    assert got["x"].node == "node-0"
    assert PoolConfig(total_gpus=8).nodes == []
    with pytest.raises(ValidationError, match=r"pool.nodes hold 2 x 8 = 16 GPUs, but "
                                              r"total_gpus is 24"):
        PoolConfig(total_gpus=24, nodes=[{"gpus": 8, "count": 2}])
    with pytest.raises(ValidationError, match="not a Kubernetes quantity"):
        PoolConfig(total_gpus=8, nodes=[{"gpus": 8, "memory": "lots"}])


# ----------------------------------------------------------------- the controller's node view



class FreshSignals(Signals):
    def read(self, now, *, job_gpus=0):
        return ServingSignals(observed_at=now)


class NodeCluster(MemoryCluster):
    """MemoryCluster with a node view the test sets (or an error it raises)."""

    def __init__(self, view: NodeView):
        super().__init__()
        self.view = view
        self.raise_next: Exception | None = None
        self.reads = 0

    def nodes(self, now=None):
        self.reads += 1
        if self.raise_next is not None:
            exc, self.raise_next = self.raise_next, None
            raise exc
        return self.view


def _daemon(tmp_path, view):
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    cluster = NodeCluster(view)

    def forecast(now):
        return FreeProfile(T0, 300, np.full(288, 32.0), 0.9, T0)

    controller = Controller(store, cluster, FreshSignals(), forecast,
                            lambda spec: spec.runtime_estimate_s, PolicySettings())
    return store, cluster, controller


def _submit(store, name, at=T0 - timedelta(hours=1)):
    data = {**REQUEST, "name": name, "cpu": 64, "memory": "512Gi"}
    request = validate_request(data)
    store.submit(request.name, request.team, request.kind, data, expand_units(request), at)


def test_the_daemon_admits_only_where_a_node_holds_the_unit(tmp_path):
    view = NodeView((node("a", 8), node("b", 2)))
    store, cluster, controller = _daemon(tmp_path, view)
    _submit(store, "shards")  # two 8-GPU units, 64 CPUs and 512Gi each
    report = controller.reconcile_once(T0)
    admitted = report.plan.of(Action.ADMIT)
    deferred = report.plan.of(Action.DEFER)
    assert [d.node for d in admitted] == ["a"] and len(report.created) == 1
    # the second shard waits for the first's node, reserved for it
    assert deferred[0].reason == (
        "needs 8 GPUs on one node; 2 GPUs free but at most 2 on any node (2 nodes); node a "
        "reserved for it from 2026-01-28 13:10 UTC")
    assert report.nodes is not None and report.nodes_read_s is not None
    # its Job is pinned to the node admission counted on (a one-pod unit too)
    assert cluster.pinned == {report.created[0]: ("a",)}
    # the CPU and memory of the stored unit were checked: a node without them refuses it
    assert controller._requests[admitted[0].job_id] == (64.0, 512 * GI)
    # next pass, the pod not bound yet (the view unchanged): its claim keeps node a taken
    report = controller.reconcile_once(T0 + timedelta(minutes=1))
    assert report.plan.of(Action.ADMIT) == [] and report.created == []
    assert {n.name: n.free_gpus for n in report.nodes.nodes} == {"a": 0, "b": 2}
    # bound now: the view counts its pod, the claim goes (never counted twice)
    (name,) = cluster.created
    cluster.view = NodeView((node("a", 0, cpu_used=64, mem_used=512 * GI), node("b", 2)),
                            bound_jobs=frozenset({name}))
    report = controller.reconcile_once(T0 + timedelta(minutes=2))
    assert controller._claims == {}
    assert {n.name: n.gpus_requested for n in report.nodes.nodes} == {"a": 8, "b": 6}
    # another node frees up: the second unit goes there
    cluster.view = NodeView((*cluster.view.nodes, node("c", 8)), bound_jobs=frozenset({name}))
    report = controller.reconcile_once(T0 + timedelta(minutes=3))
    assert [d.node for d in report.plan.of(Action.ADMIT)] == ["c"]


def test_a_node_view_that_cannot_be_read_admits_nothing_that_pass(tmp_path):
    store, cluster, controller = _daemon(tmp_path, NodeView((node("a", 8), node("b", 8))))
    _submit(store, "shards")
    cluster.raise_next = TemporaryError("the API server is unavailable (503)")
    report = controller.reconcile_once(T0)
    assert report.created == [] and any(e.startswith("nodes: ") for e in report.errors)
    assert len(controller.reconcile_once(T0 + timedelta(minutes=1)).created) == 2


def test_a_forbidden_node_view_falls_back_to_the_pool_as_one_bin(tmp_path, caplog):
    store, cluster, controller = _daemon(tmp_path, NodeView((node("a", 2),)))
    _submit(store, "shards")
    cluster.raise_next = PermanentError("Kubernetes denied 'list' on nodes (HTTP 403)")
    report = controller.reconcile_once(T0)
    assert len(report.created) == 2 and report.nodes is None  # as before the node view
    assert "cannot read the node view" in caplog.text
    _submit(store, "more", at=T0)
    controller.reconcile_once(T0 + timedelta(minutes=1))
    assert cluster.reads == 1  # given up: not asked again


def test_no_queue_no_node_view_read(tmp_path):
    _, cluster, controller = _daemon(tmp_path, NodeView((node("a", 8),)))
    report = controller.reconcile_once(T0)
    assert cluster.reads == 0 and report.nodes is None


def test_taints_our_jobs_do_not_tolerate_keep_a_node_out():
    from idlegpu.scheduler.adapters.kubernetes import _tolerated

    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert not _tolerated(gpu, [])
    assert _tolerated(gpu, [{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert _tolerated(gpu, [{"key": "nvidia.com/gpu", "value": "present",
                             "effect": "NoSchedule"}])
    assert not _tolerated(gpu, [{"key": "nvidia.com/gpu", "value": "absent"}])
    assert not _tolerated(gpu, [{"key": "nvidia.com/gpu", "operator": "Exists",
                                 "effect": "NoExecute"}])
    assert _tolerated(gpu, [{"operator": "Exists"}])
    assert _tolerated({"key": "x", "effect": "PreferNoSchedule"}, [])


def test_the_adapter_counts_requests_as_the_scheduler_does():
    from idlegpu.scheduler.adapters.kubernetes import _pod_requests, _quantity

    assert _quantity("500m") == 0.5 and _quantity("1Ti") == 2**40 and _quantity("1e3") == 1000
    assert _quantity("1056276Ki") == 1056276 * 1024 and _quantity("junk") == 0
    spec = {"containers": [
        {"resources": {"limits": {"nvidia.com/gpu": "4"}, "requests": {"cpu": "8"}}},
        {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}],
        "initContainers": [{"resources": {"requests": {"cpu": "16"}}}],
        "overhead": {"memory": "128Mi"}}
    assert _pod_requests(spec) == {"nvidia.com/gpu": 4, "cpu": 16, "memory": 2**30 + 2**27}


def test_no_usable_node_says_so():
    got = by_id(plan([job("x", 2)], NodeView((node("down", 8, ready=False),))))
    assert got["x"].reason == ("needs 2 GPUs on one node; no node of the pool is ready and "
                               "schedulable (0 nodes, 1 more not ready or cordoned)")
    got = by_id(plan([job("x", 2)], NodeView(())))
    assert got["x"].reason == ("needs 2 GPUs on one node; no node of the pool is ready and "
                               "schedulable (0 nodes)")


def test_a_dry_run_without_a_cluster_has_no_node_view(tmp_path):
    from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster

    assert KubernetesCluster(None, namespace="research", dry_run=True).nodes() is None
    store, cluster, controller = _daemon(tmp_path, NodeView(()))
    cluster.view = None
    _submit(store, "shards")
    report = controller.reconcile_once(T0)
    assert len(report.created) == 2 and report.nodes is None  # the pool as one bin


def test_the_daemon_tells_decide_where_running_units_sit(tmp_path):
    # shard 1 runs on node a (its pod bound there); shard 2 waits with node a reserved for
    # it, counted from shard 1's end: decide() learnt shard 1's node from the view
    store, cluster, controller = _daemon(tmp_path, NodeView((node("a", 8), node("b", 2))))
    _submit(store, "shards")
    report = controller.reconcile_once(T0)
    (name,) = report.created
    (first,) = report.plan.of(Action.ADMIT)
    cluster.view = NodeView((node("a", 0, cpu_used=64, mem_used=512 * GI), node("b", 2)),
                            bound_jobs=frozenset({name}), bound_at=frozenset({(name, "a")}))
    running = store.running(T0 + timedelta(minutes=5), lambda row: 7200.0)
    placed = controller._placed(running, cluster.view)
    assert [(j.id, j.nodes, j.cpu, j.memory) for j in placed] == [
        (first.job_id, ("a",), 64.0, 512 * GI)]
    report = controller.reconcile_once(T0 + timedelta(minutes=5))
    (waiting,) = report.plan.of(Action.DEFER)
    # (not started yet: its 2 h counted from now, 11:05)
    assert waiting.reason.endswith("node a reserved for it from 2026-01-28 13:05 UTC")
    # a view without per-pod bindings says nothing of where it runs: no reservation
    cluster.view = NodeView(cluster.view.nodes, bound_jobs=frozenset({name}))
    report = controller.reconcile_once(T0 + timedelta(minutes=6))
    assert report.plan.of(Action.DEFER)[0].start_at is None
