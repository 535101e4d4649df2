"""decide() with multi-node (gang) units: N pods of G GPUs on N distinct nodes, all or none,
best fit, taken from the view for the rest of the pass (policy.py, section 6); and the
controller's gang timeout with the Cluster port in memory."""

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest
from test_nodes import FRESH, GI, SETTINGS, T0, H, profile  # the node tests' pool and clock

from idlegpu.scheduler.policy import decide
from idlegpu.scheduler.types import (
    Action,
    FreeProfile,
    NodeState,
    NodeView,
    RunningJob,
    WaitingJob,
)


def gang(id, nodes=4, per_node=8, hours=2.0, priority=0, **kw) -> WaitingJob:
    return WaitingJob(id=id, team="a", gpus=nodes * per_node, runtime_s=hours * H,
                      checkpointable=True, priority=priority,
                      submitted_at=T0 - timedelta(hours=1), nodes=nodes, **kw)


def single(id, gpus=8, priority=0, **kw) -> WaitingJob:
    return WaitingJob(id=id, team="a", gpus=gpus, runtime_s=2 * H, checkpointable=True,
                      priority=priority, submitted_at=T0 - timedelta(hours=1), **kw)


def node(name, free, gpus=8, cpu=96.0, memory=1024 * GI, cpu_used=0.0, **kw):
    return NodeState(name=name, gpus=gpus, cpu=cpu, memory=memory, gpus_requested=gpus - free,
                     cpu_requested=cpu_used, **kw)


def plan(queue, nodes, free=64):
    result = decide(T0, profile(free), [], list(queue), FRESH, {}, SETTINGS, nodes)
    return {d.job_id: d for d in result.decisions}


def test_a_4_node_gang_takes_4_distinct_whole_nodes_best_fit():
    # a node with more free GPUs than the pods need: best fit keeps it for last
    view = NodeView((node("a", 8), node("b", 10, gpus=16), node("c", 8), node("d", 8),
                     node("e", 8), node("f", 3)))
    got = plan([gang("g", 4)], view)["g"]
    assert got.action is Action.ADMIT and got.gpus == 32
    assert got.nodes == ("a", "c", "d", "e") and got.node == "a"
    assert len(set(got.nodes)) == 4


def test_with_only_3_whole_nodes_free_it_is_not_admitted_and_says_why():
    view = NodeView(tuple(node(f"w{i}", 8) for i in range(3))
                    + tuple(node(f"f{i}", 2) for i in range(5)))
    got = plan([gang("g", 4)], view, free=64)["g"]
    assert got.action is Action.DEFER and got.nodes == () and got.start_at is None
    assert got.reason == "needs 4 whole 8-GPU nodes; 3 free now (2 free GPUs on each of 5 others)"


def test_fragmented_free_gpus_are_not_offered_to_a_gang():
    view = NodeView(tuple(node(f"n{i}", 2) for i in range(8)))  # 16 free, 2 on each
    got = plan([gang("g", 2, per_node=8)], view, free=16)["g"]
    assert got.action is Action.DEFER
    assert got.reason == "needs 2 whole 8-GPU nodes; 0 free now (2 free GPUs on each of 8 others)"


def test_pods_smaller_than_the_nodes_and_cpu_short_nodes():
    view = NodeView((node("a", 4, cpu_used=90.0), node("b", 6), node("c", 1)))
    got = plan([gang("g", 2, per_node=4, cpu=32.0)], view)["g"]
    assert got.action is Action.DEFER
    assert got.reason == ("needs 2 nodes with 4 GPUs free each; 1 have them now (2 have 4 GPUs "
                          "free, 1 of them without 32 CPUs beside them; 1 free GPUs on 1 other)")
    got = plan([gang("g", 2, per_node=4, cpu=4.0)], view)["g"]
    assert got.action is Action.ADMIT and got.nodes == ("a", "b")


def test_what_a_gang_takes_is_gone_for_the_rest_of_the_pass():
    view = NodeView(tuple(node(f"n{i}", 8) for i in range(5)))
    got = plan([gang("first", 4, priority=2), gang("second", 2, priority=1),
                single("one", 8)], view, free=64)
    assert got["first"].action is Action.ADMIT
    assert got["second"].action is Action.DEFER  # 1 whole node left, not 2
    assert got["second"].reason.startswith("needs 2 whole 8-GPU nodes; 1 free now")
    assert got["one"].action is Action.ADMIT  # the one node left still holds a single unit
    (left,) = {f"n{i}" for i in range(5)} - set(got["first"].nodes)
    assert got["one"].nodes == (left,) and got["one"].node == left


def test_without_a_node_view_a_gang_counts_by_its_gpus():
    got = decide(T0, profile(32), [], [gang("g", 4)], FRESH, {}, SETTINGS, None).decisions
    assert got[0].action is Action.ADMIT and got[0].gpus == 32 and got[0].nodes == ()
    got = decide(T0, profile(31), [], [gang("g", 4)], FRESH, {}, SETTINGS, None).decisions
    assert got[0].action is Action.DEFER


def test_the_forecast_still_decides_for_how_long():
    view = NodeView(tuple(node(f"n{i}", 8) for i in range(4)))
    short = FreeProfile(T0, 300, np.array([32.0] * 6 + [0.0] * 138), 0.9, T0)  # 30 min
    result = decide(T0, short, [], [gang("g", 4, hours=5)], FRESH, {}, SETTINGS, view)
    (got,) = result.decisions
    assert got.action is Action.DEFER and got.nodes == ()
    assert "do not stay free" in got.reason


def test_a_gang_needs_gpus_in_whole_pods():
    with pytest.raises(ValueError, match="do not split into 3 equal nodes"):
        WaitingJob(id="x", team="a", gpus=32, runtime_s=H, checkpointable=True, priority=0,
                   submitted_at=T0, nodes=3)


# --- the controller's gang rules, with the Cluster port in memory (tests/test_controller.py) --


def test_the_controller_rolls_back_a_gang_not_all_bound_and_fails_it_after_the_attempts(
        tmp_path):
    from dataclasses import replace

    from test_controller import MemoryCluster, Signals

    from idlegpu.forecast.config import NodeShape
    from idlegpu.scheduler.adapters.store import JobStore
    from idlegpu.scheduler.controller import Controller
    from idlegpu.scheduler.ports import JobPhase
    from idlegpu.scheduler.specs import expand_units, validate_request
    from idlegpu.scheduler.types import JobState

    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    data = {"name": "pretrain", "team": "nlp", "kind": "training",
            "image": "registry.example.com/research/train:1.0", "gpus": 32,
            "runtime_estimate": "2h"}
    request = validate_request(data, nodes=[NodeShape(gpus=8, count=8)])
    store.submit(request.name, request.team, request.kind, data, expand_units(request),
                 T0 - timedelta(hours=1))
    (unit,) = [row.id for row in store.queue()]
    cluster = MemoryCluster()
    controller = Controller(store, cluster, Signals(),
                            lambda now: FreeProfile(T0, 300, np.full(288, 64.0), 0.9, T0),
                            lambda spec: spec.runtime_estimate_s, SETTINGS, gang_timeout_s=60,
                            max_unscheduled_attempts=2)
    s = timedelta(seconds=1)

    def created_with(bound: int, at):
        report = controller.reconcile_once(at)
        (name,) = report.created
        cluster.jobs[name] = replace(cluster.jobs[name], pods=4, pods_bound=bound, created_at=at)
        return name

    # all 4 bound but not yet running (a large image): no rollback, whatever the time
    name = created_with(4, T0)
    assert not controller.reconcile_once(T0 + 300 * s).stopped
    cluster.set_phase(name, JobPhase.SUCCEEDED, T0 + 301 * s)  # (it did run, and finished)
    controller.reconcile_once(T0 + 302 * s)
    assert store.unit(unit).state is JobState.SUCCEEDED

    store2 = JobStore(f"sqlite:///{tmp_path / 'jobs2.db'}")
    store2.submit(request.name, request.team, request.kind, data, expand_units(request),
                  T0 - timedelta(hours=1))
    (unit,) = [row.id for row in store2.queue()]
    controller.store, cluster.jobs = store2, {}
    # 3 of 4 bound: within the gang timeout it waits, past it the gang is rolled back
    name = created_with(3, T0)
    assert not controller.reconcile_once(T0 + 59 * s).stopped
    report = controller.reconcile_once(T0 + 61 * s)
    assert report.stopped == [name]
    (_, reason), = cluster.stops
    assert reason.startswith("gang not placed whole: 3 of 4 pods on a node within 60 s")
    # suspended: released to the queue (no preemption) and, the nodes free, admitted again
    name = created_with(3, T0 + 62 * s)
    row = store2.unit(unit)
    assert row.attempts == 2 and row.preemptions == 0
    assert store2.attempts(unit)[0].outcome == "requeued"
    # rolled back once more, and it is given up on with a reason about its pods
    controller.reconcile_once(T0 + 130 * s)
    controller.reconcile_once(T0 + 131 * s)
    row = store2.unit(unit)
    assert row.state is JobState.FAILED
    assert row.reason.startswith("its 4 pods were never all placed in 2 attempts in a row "
                                 "(each pod asks 8 GPUs, cpu 64, memory 512Gi)")
    store.close()
    store2.close()


# --- reservations of whole nodes (EASY backfilling on nodes) -------------------------------


def running_on(id, node_name, hours_left, gpus=8, **kw):
    return RunningJob(id=id, team="a", gpus=gpus, priority=0, started_at=T0 - timedelta(hours=1),
                      checkpointable=True, remaining_s=hours_left * H, nodes=(node_name,), **kw)


def busy_pool():
    # four 8-GPU nodes: a and b each held by an 8-GPU unit (ending in 1 h and 3 h), c and d
    # free; a 3-node gang waits first in the queue, 10-hour single-node units behind it
    view = NodeView((node("a", 0), node("b", 0), node("c", 8), node("d", 8)))
    running = [running_on("on-a", "a", 1.0), running_on("on-b", "b", 3.0)]
    return view, running


def decide_on(view, running, queue, free=32):
    result = decide(T0, profile(free), running, list(queue), FRESH, {}, SETTINGS, view)
    return {d.job_id: d for d in result.decisions}


def long_single(id, hours=10.0, age_h=0.0):
    return WaitingJob(id=id, team="a", gpus=8, runtime_s=hours * H, checkpointable=True,
                      priority=0, submitted_at=T0 - timedelta(minutes=30, hours=age_h))


def test_a_gang_the_nodes_refuse_gets_whole_nodes_reserved_where_they_free_up_first():
    view, running = busy_pool()
    # the pool's forecast holds 40 GPUs for jobs: 24 after the 16 held, enough for the gang;
    # the nodes are not: two whole nodes free now
    got = decide_on(view, running, [gang("g", 3), long_single("s1"), long_single("s2")], 40)
    g = got["g"]
    # node a's unit ends in 1 h: the gang's nodes are a, c and d from then
    assert g.action is Action.DEFER and g.start_at == T0 + timedelta(hours=1)
    assert g.reason == ("needs 3 whole 8-GPU nodes; 2 free now (0 free GPUs on each of 2 "
                        "others); nodes a, c, d reserved for it from 2026-01-28 12:00 UTC")
    # the 10-hour single-node units would hold c and d past then: they wait, so the gang
    # does not starve behind them (before reservations they took c and d at once)
    assert got["s1"].action is Action.DEFER and got["s2"].action is Action.DEFER
    assert got["s1"].reason.startswith("needs 8 GPUs on one node")


def test_what_ends_before_the_reservation_backfills_the_reserved_nodes():
    view, running = busy_pool()
    short = long_single("short", hours=0.5)  # 30 min + the grace period: gone by 12:00
    got = decide_on(view, running, [gang("g", 3), long_single("s1"), short], 40)
    assert got["g"].start_at == T0 + timedelta(hours=1)
    assert got["short"].action is Action.ADMIT and got["short"].node in {"c", "d"}
    assert got["s1"].action is Action.DEFER


def test_a_gang_that_fits_now_is_admitted_on_the_free_nodes():
    view, running = busy_pool()
    view = NodeView((*view.nodes, node("e", 8)))
    got = decide_on(view, running, [gang("g", 3), long_single("s1")], 48)
    assert got["g"].action is Action.ADMIT and got["g"].nodes == ("c", "d", "e")
    assert got["s1"].action is Action.DEFER  # no node left


def test_a_reservation_by_the_pools_forecast_holds_gpus_not_nodes():
    # five nodes, 44 GPUs for jobs: 28 now (< the gang's 32), 36 once node a's unit ends; a
    # 4-GPU unit the pool still holds for 10 h may take a node now (measured: holding the
    # nodes as well cost harvest and no gang finished sooner); should the nodes refuse the
    # gang at 12:00, it gets whole nodes reserved then
    view, running = busy_pool()
    view = NodeView((*view.nodes, node("e", 8)))
    small = WaitingJob(id="small", team="a", gpus=4, runtime_s=10 * H, checkpointable=True,
                       priority=0, submitted_at=T0)
    got = decide_on(view, running, [gang("g", 4), small], 44)
    assert got["g"].start_at == T0 + timedelta(hours=1)
    assert got["g"].reason.startswith("does not fit for a worthwhile segment now; 32 GPUs")
    assert got["small"].action is Action.ADMIT


def test_without_the_units_nodes_nothing_is_counted_back_and_nothing_is_reserved():
    view, running = busy_pool()
    running = [replace(job, nodes=()) for job in running]
    got = decide_on(view, running, [gang("g", 3), long_single("s1")], 40)
    assert got["g"].start_at is None
    assert got["s1"].action is Action.ADMIT  # as before reservations: it takes a free node


def test_a_gang_never_reserves_nodes_held_by_the_service():
    # nodes held by replicas (no unit on them gives GPUs back): no reservation, no blocking
    view = NodeView((node("a", 0), node("b", 0), node("c", 8), node("d", 8)))
    got = decide_on(view, [], [gang("g", 3), long_single("s1")], free=32)
    assert got["g"].start_at is None and got["s1"].action is Action.ADMIT


def test_nodes_are_reserved_only_where_they_free_up_soon_enough():
    # node a's unit ends in 5 h: beyond the 4-hour default, nothing is reserved and the
    # single-node unit takes a free node (a far promise would idle two nodes for hours)
    view = NodeView((node("a", 0), node("b", 0), node("c", 8), node("d", 8)))
    running = [running_on("on-a", "a", 5.0), running_on("on-b", "b", 6.0)]
    got = decide_on(view, running, [gang("g", 3), long_single("s1")], 40)
    assert got["g"].start_at is None and got["s1"].action is Action.ADMIT
    longer = replace(SETTINGS, node_reservation_s=6 * H)
    result = decide(T0, profile(40), running, [gang("g", 3), long_single("s1")], FRESH, {},
                    longer, view)
    got = {d.job_id: d for d in result.decisions}
    assert got["g"].start_at == T0 + timedelta(hours=5)
    assert got["s1"].action is Action.DEFER
    off = replace(SETTINGS, node_reservation_s=0)
    view, running = busy_pool()
    result = decide(T0, profile(40), running, [gang("g", 3), long_single("s1")], FRESH, {},
                    off, view)
    assert {d.job_id: d.action for d in result.decisions}["s1"] is Action.ADMIT
