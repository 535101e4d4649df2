"""The placement model (idlegpu.forecast.nodes) and the simulator on nodes (spread vs bin-pack)."""

import numpy as np
import pandas as pd
import pytest
from test_simulate import TZ, at
from test_simulate import pool as small_pool

from idlegpu.forecast.nodes import (
    BINPACK,
    SPREAD,
    ServicePlacement,
    place_services,
    usable_gpus,
    whole_free_nodes,
)
from idlegpu.scheduler.simulate import SimJob, simulate

# --- the pure model -------------------------------------------------------------------------

def test_spread_puts_each_replica_on_the_least_allocated_node_and_binpack_fills_nodes():
    spread = ServicePlacement([8] * 4, [4], SPREAD)
    spread.scale(0, [3])
    assert sorted(spread.service_gpus) == [0, 4, 4, 4]
    binpack = ServicePlacement([8] * 4, [4], BINPACK)
    binpack.scale(0, [3])
    assert sorted(binpack.service_gpus) == [0, 0, 4, 8]
    # jobs count as requested: spread avoids the node a job half fills, bin-pack seeks it
    held = np.array([0, 4, 0, 0])
    spread = ServicePlacement([8] * 4, [4], SPREAD)
    spread.scale(0, [3], held=held)
    assert spread.service_gpus[1] == 0
    binpack = ServicePlacement([8] * 4, [4], BINPACK)
    binpack.scale(0, [1], held=held)
    assert list(binpack.service_gpus) == [0, 4, 0, 0]


def test_replicas_stay_where_they_are_from_step_to_step():
    placement = ServicePlacement([8] * 4, [4, 1], SPREAD)
    placement.scale(0, [3, 0])
    before = placement.per_node(0).copy()
    placement.scale(300, [3, 2])  # another service scales: the first one's replicas stay
    assert list(placement.per_node(0)) == list(before)
    assert placement.service_gpus.sum() == 14


def test_scale_down_deletes_doubled_up_replicas_first_then_the_newest():
    placement = ServicePlacement([8] * 3, [4], BINPACK)
    placement.scale(0, [2])  # both on one node
    placement.scale(3600, [3])  # the third joins a new node (the first is full)
    assert sorted(placement.per_node(0)) == [0, 1, 2]
    placement.scale(7200, [2])
    # the doubled-up node loses one, although the lone replica is the newest
    assert sorted(placement.per_node(0)) == [0, 1, 1]
    # equal ranks: the more recently ready goes (log2 buckets of age: 1 h vs 10 h here)
    placement = ServicePlacement([8] * 3, [4], SPREAD)
    placement.scale(0, [1])
    old = int(np.flatnonzero(placement.per_node(0))[0])
    placement.scale(9 * 3600, [2])
    placement.scale(10 * 3600, [1])
    assert placement.per_node(0)[old] == 1


def test_a_pending_replica_is_deleted_before_any_bound_one():
    placement = ServicePlacement([8], [4], SPREAD)
    placement.scale(0, [2], held=np.array([4]))  # room for one: the other waits
    assert placement.service_gpus[0] == 4 and placement.pending_gpus() == 4
    assert placement.unplaced_gpus == 4  # no job to evict: nothing could give it room
    bound = [r.serial for r in placement.replicas[0] if r.node == 0]
    placement.scale(300, [1], held=np.array([4]))
    assert placement.pending_gpus() == 0
    assert [r.serial for r in placement.replicas[0]] == bound  # the bound one stays


def test_deletion_cost_empties_the_least_used_nodes_first():
    # 5 replicas bin-packed: 2, 2, 1; scaling to 2 by the ReplicaSet's own ranking takes the
    # doubled-up ones (two half nodes remain), the deletion cost takes the lone one first
    plain = ServicePlacement([8] * 3, [4], BINPACK)
    costed = ServicePlacement([8] * 3, [4], BINPACK, deletion_cost=True)
    for p in (plain, costed):
        p.scale(0, [5])
        p.scale(3600, [2])
    assert whole_free_nodes(8 - costed.service_gpus[None, :], [8] * 3)[0] == 2
    assert whole_free_nodes(8 - plain.service_gpus[None, :], [8] * 3)[0] < 2


def test_a_replica_no_node_holds_evicts_the_fewest_jobs_and_waits_nominated():
    placement = ServicePlacement([8, 8], [4], SPREAD)
    placement.scale(0, [2])  # one on each node: 4 free on each
    held = np.array([4, 4])
    # node 0 holds two 2-GPU jobs, node 1 one 4-GPU job: one victim beats two
    evictions = placement.scale(60, [3], held=held, victims=[[2, 2], [4]])
    assert [(e.node, e.victims) for e in evictions] == [(1, 1)]
    assert list(placement.nominated) == [0, 4]
    # next step the victim is in its grace period: no new victim, still nominated
    evictions = placement.scale(120, [3], held=held, releasing=np.array([0, 4]),
                                victims=[[2, 2], []])
    assert evictions == [] and list(placement.nominated) == [0, 4]
    # it is gone: the replica binds there
    placement.scale(180, [3], held=np.array([4, 0]), victims=[[2, 2], []])
    assert list(placement.service_gpus) == [4, 8] and placement.pending_gpus() == 0
    # with no job anywhere to evict, a replica with no room is unplaced, not nominated
    placement.scale(240, [4], held=np.array([4, 0]), releasing=np.array([4, 0]))
    assert placement.nominated[0] == 4  # waits for the releasing 4 on node 0
    placement.scale(300, [5], held=np.array([4, 0]), releasing=np.array([4, 0]))
    assert placement.unplaced_gpus == 4


def test_usable_gpus_by_job_size_and_whole_free_nodes():
    free = np.array([[2] * 8, [8, 8, 4, 0, 0, 0, 0, 0]])
    nodes = [8] * 8
    assert list(usable_gpus(free, nodes, 1)) == [16, 20]
    assert list(usable_gpus(free, nodes, 4)) == [0, 20]
    assert list(usable_gpus(free, nodes, 8)) == [0, 16]  # 16 free, none for an 8-GPU job
    assert list(usable_gpus(free, nodes, 16)) == [0, 0]  # bigger than a node
    assert list(usable_gpus(free, nodes, 4, cap=np.array([16.0, 10.0]))) == [0, 8]
    assert list(whole_free_nodes(free, nodes)) == [0, 2]


def test_place_services_follows_the_replicas_and_holds_through_unknown_steps():
    replicas = np.array([[3.0], [3.0], [np.nan], [1.0]])
    out = place_services([8] * 3, [4], replicas, 300, SPREAD)
    assert list(out.sum(axis=1)) == [12, 12, 12, 4]
    assert (out <= 8).all()


# --- the simulator on nodes -----------------------------------------------------------------

def nodes_pool(**pool):
    """One service of 4-GPU replicas on 5 nodes of 8 GPUs: 9 replicas by day, 2 at night
    (20:00-08:00): 32 GPUs free for the pool view, but after the day's 9 (spread 2, 2, 2, 2, 1)
    the ReplicaSet's night scale-down leaves the 2 on two nodes: 3 whole nodes free."""
    return small_pool(days=10, nodes=[{"gpus": 8, "count": 5}], **pool)


def job(id, gpus, hours, ckpt=False, submit=(7, 19), **kw):
    return SimJob(id=id, team="t", kind="x", gpus=gpus, submit_at=at(*submit),
                  work_s=hours * 3600, estimate_s=hours * 3600, checkpointable=ckpt,
                  checkpoint_interval_s=3600, **kw)


@pytest.fixture(scope="module")
def pool():
    return nodes_pool()


def run(pool, policy, jobs, placement, days=(7, 9)):
    settings, history = pool
    return simulate(history, settings, jobs, policy, start=at(days[0], 0), end=at(days[1], 0),
                    placement=placement)


def concurrent(runs: pd.DataFrame) -> int:
    """The most runs of the frame at once."""
    edges = sorted([(s, 1) for s in runs["start"]] + [(e, -1) for e in runs["end"]])
    level = best = 0
    for _, d in edges:
        level += d
        best = max(best, level)
    return best


def test_fragmented_free_gpus_are_not_offered_to_an_8_gpu_job(pool):
    eights = [job(f"e{i}", 8, 6) for i in range(4)]
    flat = run(pool, "oracle", eights, "pool")
    assert flat.metrics["jobs_finished"] == 4 and concurrent(flat.runs) == 4  # 32 free
    for placement in (SPREAD, BINPACK):
        result = run(pool, "oracle", eights, placement)
        night = result.runs[pd.to_datetime(result.runs["start"]).dt.tz_convert(TZ).dt.hour >= 20]
        # 32 GPUs free, but only 3 whole nodes: the 4th waits, never shares a node
        assert concurrent(night) == 3, placement
        assert night["nodes"].str.count(",").eq(0).all()
        assert result.metrics["useful_gpu_hours"] < flat.metrics["useful_gpu_hours"]


def test_jobs_run_only_where_a_node_really_has_the_gpus(pool):
    # 4-GPU jobs fit the half-used nodes; the 8-GPU ones only whole nodes
    jobs = [job(f"f{i}", 4, 5) for i in range(4)] + [job(f"e{i}", 8, 5) for i in range(3)]
    result = run(pool, "oracle", jobs, SPREAD)
    runs = result.runs
    assert result.metrics["jobs_finished"] == 7
    # at every start, the jobs on each node hold at most what the service leaves there: the
    # two half nodes take a 4-GPU job each, the whole nodes the rest
    for _, row in runs.iterrows():
        here = runs[(runs["start"] <= row["start"]) & (runs["end"] > row["start"])]
        per_node = here.groupby("nodes")["gpus"].sum()
        assert (per_node <= 8).all()
    night = runs[pd.to_datetime(runs["start"]).dt.tz_convert(TZ).dt.hour >= 20]
    half_nodes = night[night["gpus"] == 4]["nodes"].value_counts()
    assert (half_nodes <= 2).all()


def test_a_morning_scale_up_evicts_jobs_on_the_nodes_it_needs(pool):
    # reactive runs into the morning: the 08:00 scale-up evicts, and waits the grace period
    late = [job(f"late{i}", 8, 6, ckpt=True, submit=(7, 5)) for i in range(3)]
    result = run(pool, "reactive", late, SPREAD, days=(7, 8))
    m = result.metrics
    assert m["preemptions"] >= 1 and m["service_delay_gpu_minutes"] > 0
    # the replicas' wait on record, step by step (15-minute steps), adding up
    assert len(result.delays) >= 1
    assert result.delays["gpus_short"].sum() * 15 == pytest.approx(
        m["service_delay_gpu_minutes"])
    assert m["service_unplaced_gpu_hours"] == 0  # the pool holds the service without jobs
    assert (result.runs["outcome"] == "preempted").sum() >= 1


def test_a_unit_bigger_than_a_node_runs_on_whole_nodes_as_one_gang(pool):
    gang = job("pretrain", 24, 4)  # 3 whole nodes of 8
    result = run(pool, "oracle", [gang], BINPACK)
    assert result.metrics["jobs_finished"] == 1
    assert result.runs["nodes"].iloc[0].count(",") == 2  # three nodes
    too_big = run(pool, "oracle", [job("huge", 32, 4)], BINPACK)  # 4 whole nodes: never free
    assert too_big.metrics["jobs_finished"] == 0


def test_the_oracle_bounds_every_policy_on_a_small_node_pool(pool):
    """Here it does; on nodes it is no guarantee (it knows the pool's future, not where units
    and replicas will sit: on the sample with plain bin-packing the forecast policy beats it,
    README "Simulation on nodes"). The physical limit bounds every run."""
    jobs = ([job(f"e{i}", 8, 3 + i, ckpt=True) for i in range(4)]
            + [job(f"f{i}", 4, 2 + i, ckpt=i % 2 == 0, submit=(7, 20 + i)) for i in range(4)])
    for placement in (SPREAD, BINPACK):
        useful = {p: run(pool, p, jobs, placement).metrics
                  for p in ("night", "reactive", "forecast", "oracle")}
        # the clairvoyant, never below the oracle in work done, bounds them too; on useful
        # (held minus lost) not always here: the trace runs dry, and stops' grace periods
        # count as held
        clairvoyant = run(pool, "clairvoyant", jobs, placement).metrics
        assert clairvoyant["work_gpu_hours"] >= useful["oracle"]["work_gpu_hours"]
        assert clairvoyant["work_gpu_hours"] <= clairvoyant["physical_limit_gpu_hours"] + 1e-9
        oracle = useful["oracle"]["useful_gpu_hours"]
        assert oracle <= useful["oracle"]["physical_limit_gpu_hours"] + 1e-9
        for policy, m in useful.items():
            assert m["useful_gpu_hours"] <= oracle + 1e-9, (placement, policy)
            assert m["useful_gpu_hours"] <= m["physical_limit_gpu_hours"] + 1e-9


def test_placement_on_nodes_needs_the_node_shapes():
    settings, history = nodes_pool()
    flat = settings.model_copy(update={"pool": settings.pool.model_copy(update={"nodes": []})})
    with pytest.raises(ValueError, match="pool.nodes"):
        simulate(history, flat, [], "oracle", start=at(7, 0), end=at(8, 0), placement=SPREAD)
    with pytest.raises(ValueError, match="placement"):
        simulate(history, settings, [], "oracle", start=at(7, 0), end=at(8, 0),
                 placement="random")


# --- analyze and the report: idle capacity by job size -------------------------------------

def write_pool(tmp_path, nodes=True):
    """The 5-node pool of ``nodes_pool`` as a config file and a history file."""
    import yaml

    settings, history = nodes_pool()
    data = {"pool": {"total_gpus": 40, "headroom_gpus": 0, "timezone": TZ},
            "query_templates": {"replicas": "r"},
            "services": [{"name": "svc", "gpus_per_replica": 4, "min_replicas": 2,
                          "max_replicas": 10}]}
    if nodes:
        data["pool"]["nodes"] = [{"gpus": 8, "count": 5}]
    config = tmp_path / "pool.yaml"
    config.write_text(yaml.safe_dump(data))
    path = tmp_path / "history.csv"
    history.to_csv(path, index=False)
    return config, path, history


def test_analyze_shows_what_each_job_size_can_use_on_the_nodes(tmp_path, cli):
    config, history, _ = write_pool(tmp_path)
    code, out, err = cli(["analyze", "--config", str(config), "--history", str(history),
                          "--out", str(tmp_path / "out")])
    assert code == 0, err
    assert "Idle GPU-hours by job size on 5 nodes (services placed spread)" in out
    table = pd.read_csv(tmp_path / "out" / "idle_by_job_size.csv", index_col=0)
    # 1-GPU jobs use every idle GPU; at night 32 GPUs are free but only 3 whole nodes (24 GPUs)
    # carry 8-GPU jobs, and by day no 8 are free anywhere: 24 / 32 of the pool view
    assert table.loc["1", "share"] == pytest.approx(1.0)
    assert table.loc["8", "share"] == pytest.approx(24 / 32)
    assert table.loc["multi-node", "on_nodes_gpu_hours"] == pytest.approx(
        table.loc["8", "on_nodes_gpu_hours"])  # every 8 here is a whole node, 3 at a time
    assert "really usable by them (75%)" in " ".join(out.split())


def test_analyze_without_node_shapes_says_so_and_keeps_its_output(tmp_path, cli):
    config, history, _ = write_pool(tmp_path, nodes=False)
    code, out, err = cli(["analyze", "--config", str(config), "--history", str(history),
                          "--out", str(tmp_path / "out")])
    assert code == 0, err
    assert "No pool.nodes in the config" in " ".join(out.split())
    assert "Idle GPU-hours by job size" not in out
    assert not (tmp_path / "out" / "idle_by_job_size.csv").exists()
    assert (tmp_path / "out" / "idle_depth.csv").exists()


def test_the_report_has_the_idle_capacity_by_job_size(tmp_path, pool):
    from idlegpu.scheduler.reports import build_report, job_size_idle, render_markdown

    settings, history = pool
    runs = run(pool, "oracle", [job(f"e{i}", 8, 6) for i in range(4)], SPREAD).runs
    sizes = job_size_idle(history, settings, "2026-01")
    report = build_report(runs, "2026-01", tz=TZ, job_sizes=sizes)
    text = render_markdown(report, {})
    assert "## Idle capacity by job size, 2026-01" in text
    row = next(line for line in text.splitlines() if line.startswith("| 8 GPUs"))
    assert row.endswith("| 75.0% |")
    assert "placed spread (pool.placement" in text
    flat = settings.model_copy(update={"pool": settings.pool.model_copy(update={"nodes": []})})
    text = render_markdown(build_report(runs, "2026-01", tz=TZ,
                                        job_sizes=job_size_idle(history, flat, "2026-01")), {})
    assert "The pool has no node shapes (pool.nodes)" in text
    assert "| 8 GPUs" not in text


def test_simulate_cli_places_on_nodes_and_refuses_a_pool_without_node_shapes(tmp_path, cli):
    config, history, _ = write_pool(tmp_path)
    trace = tmp_path / "jobs.yaml"
    trace.write_text(
        "jobs:\n"
        "- name: eval-big\n"
        "  submit_at: 2026-01-12T19:00:00+09:00\n"
        "  actual_runtime: 5h\n"
        "  team: evaluation\n"
        "  kind: eval\n"
        "  image: registry.example.com/research/lm-eval:0.4.4\n"
        "  command: [lm_eval]\n"
        "  gpus: 8\n"
        "  runtime_estimate: 5h\n"
    )
    args = ["simulate", "--config", str(config), "--history", str(history), "--jobs",
            str(trace), "--policies", "oracle", "--warmup-days", "7", "--days", "1",
            "--out", str(tmp_path / "sim")]
    code, out, err = cli([*args, "--placement", "spread"])
    assert code == 0, err
    assert "services placed spread on pool.nodes" in " ".join(out.split())
    runs = pd.read_csv(tmp_path / "sim" / "runs_oracle.csv")
    assert runs["nodes"].str.fullmatch(r"node-\d").all()  # one whole node
    (tmp_path / "flat").mkdir()
    flat, _, _ = write_pool(tmp_path / "flat", nodes=False)
    code, out, err = cli([*args[:2], str(flat), *args[3:], "--placement", "binpack"])
    assert code == 2
    assert "--placement" in err and "pool.nodes" in err
    code, out, err = cli([*args, "--placement", "random"])
    assert code == 2 and "choose from pool, spread, binpack" in err


def test_a_one_pod_unit_is_pinned_to_the_node_decide_counted_on(pool):
    # at 20:00 two nodes hold one replica each, three are empty; admission counts the 4-GPU
    # unit on a half node (best fit) and its Job pins that node: under spread too (whose
    # scoring would bind the pod to an empty node) the 3 8-GPU units each find a whole node
    jobs = [job("a-four", 4, 6, submit=(7, 20))] + [job(f"e{i}", 8, 6, submit=(7, 20))
                                                     for i in range(3)]
    spread = run(pool, "oracle", jobs, SPREAD)
    binpack = run(pool, "oracle", jobs, BINPACK)
    first = {name: r.runs.sort_values("start").groupby("job_id").first()
             for name, r in (("spread", spread), ("binpack", binpack))}
    whole_nodes_at_20 = {name: (f["gpus"].eq(8) & f["start"].eq(f["start"].min())).sum()
                         for name, f in first.items()}
    assert whole_nodes_at_20 == {"spread": 3, "binpack": 3}
    # the 4-GPU unit shares a node with a replica, not an 8-GPU unit's node
    for f in first.values():
        assert f.loc["a-four", "nodes"] not in set(f.loc[[f"e{i}" for i in range(3)], "nodes"])
    assert spread.metrics["admissions_unbound"] == 0
    assert binpack.metrics["admissions_unbound"] == 0
