"""Multi-node requests: ``nodes`` x ``gpus_per_node`` (or a total split into whole nodes of the
pool's node shape), what the expanded unit holds, and the one-line errors at submit."""

from pathlib import Path

import pytest

from idlegpu.forecast.config import NodeShape
from idlegpu.scheduler.adapters.store import spec_from_json, spec_to_json
from idlegpu.scheduler.config import AdmissionConfig
from idlegpu.scheduler.specs import (
    SpecError,
    expand_units,
    load_request,
    memory_per_node,
    recheck_unit,
    validate_request,
)

REPO = Path(__file__).resolve().parents[1]
EIGHT = [NodeShape(gpus=8, cpu=96, memory="1Ti", count=16)]
BASE = {"name": "pretrain", "team": "nlp", "kind": "training",
        "image": "registry.example.com/research/train:1.0", "command": ["torchrun"],
        "args": ["--nproc-per-node={gpus}", "train.py"],
        "checkpoint": {"interval": "30m", "resume_args": ["--resume"]}}


def unit(_shapes=EIGHT, **fields):
    (only,) = expand_units(validate_request({**BASE, **fields}, source="req.yaml",
                                            nodes=_shapes))
    return only


def refused(_shapes=EIGHT, **fields) -> str:
    with pytest.raises(SpecError) as info:
        validate_request({**BASE, **fields}, source="req.yaml", nodes=_shapes)
    message = str(info.value)
    assert "\n" not in message and message.startswith("req.yaml: ")
    return message


def test_nodes_times_gpus_per_node_is_one_gang_with_per_node_cpu_and_memory():
    u = unit(nodes=4, gpus_per_node=8, cpu=96, memory="1Ti")
    assert (u.gpus, u.nodes, u.gpus_per_node) == (32, 4, 8)
    assert (u.cpu, u.memory) == (384.0, "4Ti")  # the unit's totals
    assert (u.cpu_per_node, memory_per_node(u)) == (96.0, "1Ti")  # one pod's
    env = dict(u.env)
    assert env["IDLEGPU_GPUS"] == "8" and env["IDLEGPU_NODES"] == "4"
    assert u.args == ("--nproc-per-node=8", "train.py")  # {gpus}: one pod's GPUs


def test_a_plain_total_above_the_node_is_split_into_whole_nodes():
    u = unit(gpus=32, cpu=256, memory="2Ti")
    assert (u.gpus, u.nodes, u.gpus_per_node) == (32, 4, 8)
    assert (u.cpu_per_node, memory_per_node(u)) == (64.0, "512Gi")  # shared evenly
    assert dict(u.env)["IDLEGPU_NODES"] == "4"
    # no node shapes described: counted as one pod, as before
    assert unit(_shapes=(), gpus=32).nodes == 1
    # a total of the node size or less is one pod
    assert unit(gpus=8).nodes == 1 and unit(gpus=4).nodes == 1
    # nodes with the total
    u = unit(nodes=2, gpus=16)
    assert (u.nodes, u.gpus_per_node, u.cpu_per_node) == (2, 8, 64.0)


def test_the_stored_spec_keeps_the_gang():
    u = unit(nodes=4, gpus_per_node=8)
    back = spec_from_json(spec_to_json(u))
    assert back == u and back.nodes == 4
    legacy = spec_to_json(unit(gpus=8))
    del legacy["nodes"]  # written before multi-node units
    assert spec_from_json(legacy).nodes == 1


def test_bad_multi_node_requests_are_one_line_errors_naming_the_field_and_the_fix():
    assert refused(nodes=0, gpus_per_node=8) == (
        "req.yaml: nodes: nodes must be at least 1 (got 0); ask for the number of nodes the "
        "unit spans (e.g. nodes: 4 with gpus_per_node: 8), or leave nodes out for one pod")
    assert refused(nodes=2, gpus_per_node=16) == (
        "req.yaml: gpus_per_node: 16 GPUs per node is above the pool's largest node (8 GPUs, "
        "pool.nodes); ask for at most 8 GPUs per node and more nodes (e.g. nodes: 4 with "
        "gpus_per_node: 8)")
    assert refused(gpus=20) == (
        "req.yaml: gpus: 20 GPUs do not fit one node of this pool (at most 8 GPUs, pool.nodes) "
        "and are not a multiple of 8, so they cannot be split into whole nodes; ask for 16 or "
        "24 GPUs, or set nodes and gpus_per_node")
    assert "nodes: 30 GPUs do not split evenly over 4 nodes" in refused(nodes=4, gpus=30)
    assert "gpus: gpus 16 is not nodes x gpus_per_node (4 x 8 = 32)" in refused(
        nodes=4, gpus_per_node=8, gpus=16)
    assert "above this pool's limit of 64 per job" in refused(
        nodes=16, gpus_per_node=8)
    assert refused(gpus=32, min_gpus=8) == (
        "req.yaml: min_gpus: a multi-node unit (4 nodes of 8 GPUs) starts and stops as one "
        "gang and is not elastic; remove min_gpus (or run it on one node)")
    # in a step, the path names the step
    message = refused(steps=[{"name": "train", "nodes": 0, "gpus_per_node": 8}])
    assert message.startswith("req.yaml: steps.0.nodes: nodes must be at least 1")


def test_the_daemon_recheck_refuses_a_stored_gang_that_is_not_one():
    from dataclasses import replace

    u = unit(nodes=4, gpus_per_node=8)
    recheck_unit(u, "nlp", AdmissionConfig())  # fine as it is
    with pytest.raises(SpecError, match="nodes: 30 GPUs on 4 nodes is no multi-node unit"):
        recheck_unit(replace(u, gpus=30), "nlp", AdmissionConfig())


def test_the_pretrain_examples_fit_8_gpu_nodes():
    split = load_request(REPO / "examples/jobs/pretrain.yaml", nodes=EIGHT)
    (u,) = expand_units(split)
    assert (u.nodes, u.gpus_per_node) == (4, 8)
    assert u.cpu_per_node <= 96 and memory_per_node(u) == "512Gi"


def test_submit_refuses_a_node_larger_than_the_pools_in_one_line(tmp_path, cli):
    config = tmp_path / "pool.yaml"
    text = (REPO / "idlegpu.yaml").read_text()
    config.write_text(text.replace(
        "  total_gpus: 88 ", "  nodes: [{gpus: 8, cpu: 96, memory: 1Ti, count: 11}]\n"
        "  total_gpus: 88 ", 1))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: big\nteam: nlp\nkind: training\n"
                   "image: registry.example.com/research/train:1.0\n"
                   "nodes: 2\ngpus_per_node: 16\n")
    store = f"sqlite:///{tmp_path / 'jobs.db'}"
    code, _, err = cli(["submit", str(bad), "--config", str(config), "--store", store])
    assert code == 2 and "Traceback" not in err
    line = " ".join(err.split())
    assert "gpus_per_node: 16 GPUs per node is above the pool's largest node (8 GPUs" in line
    code, _, err = cli(["submit", str(REPO / "examples/jobs/pretrain.yaml"), "--config",
                          str(config), "--store", store])
    assert code == 0, err


def test_the_job_api_checks_and_splits_against_the_pools_node_shapes(tmp_path):
    """The job API (a real uvicorn server) validates with the server's pool.nodes."""
    from api_server import ApiServer, Client, MovableClock

    from idlegpu.scheduler.adapters.store import AuditEntry, JobStore
    from idlegpu.scheduler.api.auth import new_token, token_sha256
    from idlegpu.scheduler.config import load_config
    from idlegpu.scheduler.server import create_server

    settings = load_config(data={
        "pool": {"name": "test-pool", "total_gpus": 64, "timezone": "UTC",
                 "nodes": [{"gpus": 8, "cpu": 96, "memory": "1Ti", "count": 8}]},
        "query_templates": {"replicas": 'kube_deployment_status_replicas{deployment="$service"}'},
        "services": [{"name": "chat", "gpus_per_replica": 4, "min_replicas": 0,
                      "max_replicas": 10}],
        "admission": {"allowed_registries": ["registry.example.com/"]}})
    store = JobStore(f"sqlite:///{tmp_path / 'api.db'}")
    clock = MovableClock()
    token = new_token()
    store.create_api_token("alice", "nlp", "member", token_sha256(token), clock.at, None,
                           AuditEntry(at=clock.at, actor="test", auth="cli", role="operator",
                                      team=None, action="token.create", target="alice"))
    server = ApiServer(create_server(settings, store, clock=clock)).start()
    client = Client(server.url, token, {})
    try:
        bad = client.post("/v1/requests", json={**BASE, "nodes": 2, "gpus_per_node": 16})
        assert bad.status_code == 422
        assert bad.json()["error"]["field"] == "gpus_per_node"
        assert "16 GPUs per node is above the pool's largest node (8 GPUs" in (
            bad.json()["error"]["message"])
        good = client.post("/v1/requests", json={**BASE, "gpus": 16})
        assert good.status_code == 201, good.text
        (unit,) = store.find_units()
        assert (unit.spec.nodes, unit.spec.gpus_per_node, unit.gpus) == (2, 8, 16)
    finally:
        client.close()
        server.stop()
        store.close()


def test_a_gang_name_too_long_for_its_pods_names_is_refused_at_submit():
    name = "a" * 36
    message = refused(name=name, nodes=4, gpus_per_node=8)
    assert message == (
        "req.yaml: name: a multi-node unit's pods are named after its Kubernetes Job and their "
        "rank (63 characters at most), which leaves this request's name at most 35 characters "
        "(it has 36); shorten it")
    (u,) = expand_units(validate_request({**BASE, "name": name[:35], "nodes": 4,
                                          "gpus_per_node": 8}, nodes=EIGHT))
    assert u.nodes == 4
    unit(name=name, gpus=8)  # one pod: no such limit
