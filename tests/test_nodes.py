"""decide() with a node view: a unit is admitted now only where one real node holds it
(per-node free GPUs, CPU, memory), best fit, taken node by node within the pass."""

from datetime import UTC, datetime, timedelta

import numpy as np

from scheduler.policy import decide
from scheduler.types import (
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
    assert got["z"].reason == (
        "needs 4 GPUs on one node; 2 GPUs free but at most 2 on any node (2 nodes)")


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

    from forecast.config import PoolConfig

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
