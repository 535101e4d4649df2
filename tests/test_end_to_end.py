"""End to end: the real controller, the Kubernetes adapter (through the official client) and a
SQLite store.

On the REAL control plane (kube-apiserver, controller-manager, scheduler) with simulated GPU
nodes playing the kubelet (tests/node_sim.py), the daemon holding nothing but the Role of
deploy/role.yaml (a real ServiceAccount token, real RBAC): traffic rises in the live signals ->
within one backstop pass the job that loses the least work is suspended -> its pod exits 143 ->
the unit goes back to the queue with its checkpointed work -> traffic falls -> it resumes as
attempt 2, and the attempt-2 pod carries the resume hint.

On the fake API server (tests/fake_kube.py) only what a real server cannot do on demand: an
outage of the API.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kube_harness
import kubernetes
import numpy as np
import pytest
import yaml
from fake_kube import FakeKube
from kube_harness import record_requests, submit
from kubernetes.client.exceptions import ApiException

from idlegpu.scheduler.adapters.kubernetes import KubernetesCluster
from idlegpu.scheduler.adapters.store import JobStore
from idlegpu.scheduler.controller import Controller
from idlegpu.scheduler.specs import expand_units, validate_request
from idlegpu.scheduler.types import FreeProfile, JobState, PolicySettings, ServingSignals

# the daemon on simulated GPU nodes of each test (fixtures of tests/kube_harness.py)
pool, priority_classes = kube_harness.pool, kube_harness.priority_classes

T0 = datetime(2026, 1, 28, 11, 0, tzinfo=UTC)  # 20:00 in Seoul
NS = "idlegpu-jobs"
ROLE = Path(__file__).parents[1] / "deploy" / "role.yaml"


def request(name, checkpoint):
    data = {
        "name": name, "team": "research", "kind": "training" if checkpoint else "eval",
        "image": "registry.example.com/research/train:1.0", "command": ["python", "run.py"],
        "gpus": 8, "runtime_estimate": "6h", "output": "s3://runs/{name}",
    }
    if checkpoint:
        data["checkpoint"] = {"interval": "30m", "resume_args": ["--resume", "{output}/ckpt"]}
    return data


# --------------------------------------------------------------------------- the real server


def the_deployed_role(kind: str = "Role", name: str = "idlegpu") -> dict:
    """The Role of deploy/role.yaml the daemon holds in its jobs namespace (or, with
    ``kind="ClusterRole", name="idlegpu-node-view"``, its node view's cluster-wide rules)."""
    return next(doc for doc in yaml.safe_load_all(ROLE.read_text())
                if doc and doc["kind"] == kind and doc["metadata"]["name"] == name)


@pytest.fixture
def daemon_credentials(kube_control_plane, kube_namespace):
    """A client authenticated by a REAL token of a ServiceAccount that holds only the deployed
    Role in the test's namespace and the node view's ClusterRole: any call they do not grant
    is refused (403)."""
    admin = kube_control_plane.api_client()
    core = kubernetes.client.CoreV1Api(admin)
    rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
    role = the_deployed_role()
    role["metadata"] = {"name": "idlegpu", "namespace": kube_namespace}
    core.create_namespaced_service_account(kube_namespace, {"metadata": {"name": "idlegpu"}})
    rbac.create_namespaced_role(kube_namespace, role)
    rbac.create_namespaced_role_binding(kube_namespace, {
        "metadata": {"name": "idlegpu"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "idlegpu"},
        "subjects": [{"kind": "ServiceAccount", "name": "idlegpu",
                      "namespace": kube_namespace}]})
    node_view = the_deployed_role("ClusterRole", "idlegpu-node-view")
    node_view["metadata"] = {"name": f"idlegpu-node-view-{kube_namespace}"}
    rbac.create_cluster_role(node_view)
    rbac.create_cluster_role_binding({
        "metadata": {"name": node_view["metadata"]["name"]},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": node_view["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": "idlegpu",
                      "namespace": kube_namespace}]})
    token = core.create_namespaced_service_account_token(
        "idlegpu", kube_namespace, {"spec": {"expirationSeconds": 600}}).status.token
    (cluster,) = json.loads(Path(kube_control_plane.kubeconfig).read_text())["clusters"]
    configuration = kubernetes.client.Configuration()
    configuration.host = cluster["cluster"]["server"]
    configuration.ssl_ca_cert = cluster["cluster"]["certificate-authority"]
    configuration.api_key = {"authorization": f"Bearer {token}"}
    client = kubernetes.client.ApiClient(configuration)
    jobs = kubernetes.client.BatchV1Api(client)
    deadline = time.monotonic() + 10
    while True:  # the authorizer's cache has the binding
        try:
            jobs.list_namespaced_job(kube_namespace)
            break
        except ApiException as exc:
            if exc.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    yield client
    client.close()
    rbac.delete_cluster_role_binding(node_view["metadata"]["name"])
    rbac.delete_cluster_role(node_view["metadata"]["name"])
    admin.close()


def verbs_used(sent) -> dict[str, set[str]]:
    """Resource -> the RBAC verbs of the requests sent."""
    used: dict[str, set[str]] = {}
    for request in sent:
        parts = request.path.rstrip("/").split("/")
        subresource = parts[-1] == "status"  # .../pods/NAME/status
        if subresource:
            parts = parts[:-1]
        collection = parts[-1] in ("jobs", "pods", "nodes")
        resource = (parts[-1] if collection else parts[-2]) + ("/status" if subresource else "")
        verb = {("GET", True): "list", ("GET", False): "get", ("POST", True): "create",
                ("PATCH", False): "patch", ("DELETE", False): "delete"}[(request.method,
                                                                          collection)]
        used.setdefault(resource, set()).add(verb)
    return used


def test_traffic_rises_the_cheapest_job_stops_and_resumes_later(pool, daemon_credentials):
    # every request the daemon sends, recorded on its client (the server is real)
    sent = record_requests(daemon_credentials)
    # GPU nodes of 8 H100s with the CPUs and memory that go with them (8 and 64Gi per GPU)
    daemon, sim = pool(nodes=2, gpus=8, cpu="96", memory="1Ti", start_delay=0.5,
                       shutdown_seconds=2.0, harness={"api_client": daemon_credentials})
    passes = []  # the report of every pass, whoever ran it
    for kind in ("reconcile_once", "backstop_once"):
        run = getattr(daemon.controller, kind)
        setattr(daemon.controller, kind,
                lambda now, run=run: passes.append(run(now)) or passes[-1])
    ids = {name: submit(daemon.store, request(name, ckpt))
           for name, ckpt in (("train", True), ("evaluate", False))}
    names = {name: daemon.cluster.job_name(unit, 1) for name, unit in ids.items()}
    # 20:00: both start (16 GPUs free), one on each node
    report = daemon.reconcile()
    assert sorted(report.created) == sorted(names.values())
    started: set[str] = set()
    daemon.until(lambda r: started.update(r.started) or started == set(ids.values()),
                 what="both pods running")
    assert {row.state for row in daemon.store.queue()} == {JobState.RUNNING}
    pods = {name: sim.wait_for(lambda records, job=job: next(
        (p for p in records if p.name.startswith(f"{job}-") and p.state == "running"), None),
        what=f"the pod of {job}") for name, job in names.items()}
    assert pods["train"].node != pods["evaluate"].node
    assert "IDLEGPU_RESUME" not in pods["train"].env["job"]  # a first attempt
    # the training job checkpoints now; the evaluation cannot checkpoint: everything it did
    # since it started would be lost
    time.sleep(1.5)
    train = daemon.store.unit(ids["train"])
    work = (daemon.now() - train.started_at).total_seconds()
    daemon.store.checkpointed(train.id, daemon.now(), work)

    # the service suddenly needs 8 GPUs; one backstop pass later a Job is suspended
    daemon.signals.gpus_short = 8
    report = daemon.controller.backstop_once(daemon.now())
    assert report.stopped == [names["train"]]  # nothing unsaved, not the eval's seconds
    stopped = daemon.job(names["train"])
    assert stopped["spec"]["suspend"] is True
    annotations = stopped["metadata"]["annotations"]
    assert annotations["idlegpu.io/stop-kind"] == "preempt"
    assert annotations["idlegpu.io/stop-reason"] == "the services want 8 GPUs they cannot get"
    assert daemon.job(names["evaluate"])["spec"]["suspend"] is not True
    # a moment later the service still waits (its pod checkpoints, the grace period): those
    # GPUs are on their way, so nobody else is stopped for the same need, and the unit still
    # holds them
    report = daemon.controller.backstop_once(daemon.now())
    assert report.stopped == []
    assert ids["train"] not in daemon.reconcile().released
    exited = sim.wait_pod(daemon.namespace, pods["train"].name, "exited")
    assert exited.exit_code == 143  # SIGTERM, the checkpoint, the exit

    # the next pass sees the Job suspended and puts the unit back in the queue; the service
    # has taken those GPUs, none is idle
    daemon.signals.gpus_short, daemon.signals.idle_gpus = 0, 0
    report = daemon.until(lambda r: ids["train"] in r.released, what="the release")
    assert report.released == [ids["train"]]
    row = daemon.store.unit(ids["train"])
    assert row.state is JobState.QUEUED and row.preemptions == 1
    assert row.work_done_s == work  # the checkpointed work is kept
    assert daemon.store.unit(ids["evaluate"]).state is JobState.RUNNING  # untouched
    # once recorded, the suspended Job is deleted (a suspended Job never expires by TTL), with
    # its pods: the API's default for a Job would orphan them
    assert report.deleted == [names["train"]]
    deadline = time.monotonic() + 10
    while daemon.job(names["train"]) is not None:
        assert time.monotonic() < deadline, "the stopped Job was not deleted"
        time.sleep(0.2)
    (delete,) = [r for r in sent if r.method == "DELETE"]
    assert delete.query.get("propagationPolicy") == "Background"
    sim.wait_pod(daemon.namespace, pods["train"].name, "gone")

    # traffic is back to normal: the unit resumes as attempt 2 with a resume hint
    daemon.signals.idle_gpus = 8
    report = daemon.reconcile()
    second = daemon.cluster.job_name(ids["train"], 2)
    assert report.created == [second]
    resumed = sim.wait_for(lambda records: next(
        (p for p in records if p.name.startswith(f"{second}-") and p.state == "running"), None),
        what="the attempt-2 pod running")
    env = resumed.env["job"]  # what the kubelet got, through the Job controller
    assert env["IDLEGPU_RESUME"] == "--resume s3://runs/train/ckpt"
    assert env["IDLEGPU_ATTEMPT"] == "2" and env["IDLEGPU_UNIT"] == ids["train"]
    daemon.until(lambda r: ids["train"] in r.started, what="attempt 2 running")
    row = daemon.store.unit(ids["train"])
    assert row.state is JobState.RUNNING and row.attempts == 2 and row.work_done_s == work
    # three Jobs created in all, never a duplicate; each ran exactly one pod
    created = [r.body["metadata"]["name"] for r in sent if r.method == "POST"]
    assert sorted(created) == sorted([*names.values(), second])
    jobs = daemon.batch.list_namespaced_job(daemon.namespace).items
    assert sorted(j.metadata.name for j in jobs) == sorted([names["evaluate"], second])
    ran = sorted(p.name.rsplit("-", 1)[0] for p in sim.pods())
    assert ran == sorted([*names.values(), second])
    assert sorted(n for r in passes for n in r.created + r.recreated) == sorted(created)
    # every call of the whole story is one the deployed Role grants (real RBAC: a refused
    # one would be an error of its pass), and every Jobs permission it grants is used
    assert [e for r in passes for e in r.errors] == []
    granted = {rule["resources"][0]: set(rule["verbs"]) for rule in the_deployed_role()["rules"]}
    used = verbs_used(sent)
    assert used["jobs"] == granted["jobs"]
    assert used["pods"] == {"list"} <= granted["pods"]
    # the stop marked the pod DisruptionTarget before the suspend, with the grant for it
    assert used["pods/status"] == {"patch"} == granted["pods/status"]
    # the node view: the GPU nodes and the pods bound to them, cluster-wide
    viewed = {rule["resources"][0]: set(rule["verbs"])
              for rule in the_deployed_role("ClusterRole", "idlegpu-node-view")["rules"]}
    assert used["nodes"] == {"list"} <= viewed["nodes"] and {"list"} <= viewed["pods"]
    assert set(used) == {"jobs", "pods", "pods/status", "nodes"}


# --------------------------------------------------------------------------- the fake server


class Signals:
    def __init__(self):
        self.short = 0
        self.idle = None  # GPUs nobody holds, when the test says

    def read(self, now, *, job_gpus=0):
        return ServingSignals(observed_at=now, gpus_short=self.short, idle_gpus=self.idle)


@pytest.fixture
def world(tmp_path):
    with FakeKube() as kube:
        store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
        for name, ckpt in (("train", True), ("evaluate", False)):
            req = validate_request(request(name, ckpt))
            store.submit(req.name, req.team, req.kind, request(name, ckpt),
                         expand_units(req), T0 - timedelta(hours=1))
        cluster = KubernetesCluster(kube.api_client(), namespace=NS, node_selector={},
                                    tolerations=[], retries=2, sleep=lambda s: None)
        signals = Signals()
        profile = FreeProfile(T0, 300, np.full(12 * 24, 16.0), 0.9, T0)
        controller = Controller(store, cluster, signals, lambda now: profile,
                                lambda spec: spec.runtime_estimate_s, PolicySettings())
        yield kube, store, cluster, signals, controller
        store.close()


def test_an_api_outage_never_duplicates_nor_loses_a_job(world):
    """fake API server: the API answering 503 to every request of a pass (an outage on
    demand, which a real server cannot be made to have)."""
    kube, store, cluster, _, controller = world
    kube.fail_next(3, 503)  # the API is down when the pass starts: it cannot see the cluster
    report = controller.reconcile_once(T0)
    assert not report.created and any("cluster:" in e for e in report.errors)
    assert {row.state for row in store.queue()} == {JobState.QUEUED}  # nothing admitted blind
    report = controller.reconcile_once(T0 + timedelta(minutes=1))  # the API is back
    assert len(report.created) == 2
    controller.reconcile_once(T0 + timedelta(minutes=2))
    jobs = [j for j in cluster.observe()]
    assert len(jobs) == 2 and len({j.name for j in jobs}) == 2
